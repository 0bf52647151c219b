//! Periods found where the demand repeats, at the period it repeats with, and none in a trend,
//! a level, noise, random steps, two look-alike bursts, or a load seen for less than two
//! periods; what comes is what came one period ago.

use std::f64::consts::TAU;

use super::*;

const STEP: Duration = Duration::from_secs(15);

/// `f(second)` sampled every 15 s for `span`, ending at the returned `now`.
fn sampled(span: Duration, f: impl Fn(f64) -> f64) -> (VecDeque<(Instant, f64)>, Instant) {
    let start = Instant::now();
    let n = span.as_secs() / STEP.as_secs();
    let samples = (0..=n)
        .map(|k| {
            let t = STEP * k as u32;
            (start + t, f(t.as_secs_f64()))
        })
        .collect();
    (samples, start + STEP * n as u32)
}

fn minutes(m: u64) -> Duration {
    Duration::from_secs(60 * m)
}

#[tokio::test(start_paused = true)]
async fn a_wave_and_a_sawtooth_have_their_period() {
    let (wave, now) = sampled(minutes(50), |t| 100.0 + 50.0 * (TAU * t / 600.0).sin());
    let p = period(&wave, now, STEP).expect("a wave of 10 minutes");
    assert!(p.every.abs_diff(minutes(10)) <= STEP, "{p:?}");
    assert!(p.fit >= FIT, "{p:?}");

    // Up for 7 minutes, down at once.
    let (saw, now) = sampled(minutes(45), |t| 20.0 + 10.0 * (t % 420.0) / 60.0);
    let p = period(&saw, now, STEP).expect("a sawtooth of 7 minutes");
    assert!(p.every.abs_diff(Duration::from_secs(420)) <= STEP, "{p:?}");
}

#[tokio::test(start_paused = true)]
async fn a_trend_a_level_noise_and_random_steps_have_none() {
    let (ramp, now) = sampled(minutes(60), |t| 10.0 + t / 10.0);
    assert_eq!(period(&ramp, now, STEP), None, "a ramp");
    let (level, now) = sampled(minutes(60), |_| 42.0);
    assert_eq!(period(&level, now, STEP), None, "a level");
    for seed in 0..20 {
        let mut rng = fastrand::Rng::with_seed(seed);
        let noise: Vec<f64> = (0..=240).map(|_| 100.0 + 20.0 * rng.f64()).collect();
        let (samples, now) = sampled(minutes(60), |t| noise[t as usize / 15]);
        assert_eq!(period(&samples, now, STEP), None, "noise, seed {seed}");
        // Plateaus of 2 to 20 minutes at random levels.
        let mut steps = Vec::new();
        while steps.len() <= 240 {
            let level = 100.0 * rng.f64();
            steps.extend(std::iter::repeat_n(level, rng.usize(8..=80)));
        }
        let (samples, now) = sampled(minutes(60), |t| steps[t as usize / 15]);
        assert_eq!(period(&samples, now, STEP), None, "steps, seed {seed}");
    }
}

#[tokio::test(start_paused = true)]
async fn less_than_two_periods_seen_is_none() {
    let (wave, now) = sampled(minutes(25), |t| 100.0 + 50.0 * (TAU * t / 900.0).sin());
    assert_eq!(period(&wave, now, STEP), None);
    let (wave, now) = sampled(minutes(32), |t| 100.0 + 50.0 * (TAU * t / 900.0).sin());
    assert!(period(&wave, now, STEP).is_some());
}

#[tokio::test(start_paused = true)]
async fn two_look_alike_bursts_are_not_a_period() {
    // Flat, but for two bursts of 2 minutes 15 minutes apart: the demand shifted by 15 minutes
    // matches itself, and shifted by 30 it does not.
    let burst = |t: f64| (1800.0..1920.0).contains(&t) || (2700.0..2820.0).contains(&t);
    let (two, now) = sampled(minutes(50), |t| if burst(t) { 90.0 } else { 10.0 });
    assert_eq!(period(&two, now, STEP), None);
    // Such bursts all along make one.
    let (all, now) = sampled(minutes(50), |t| if t % 900.0 < 120.0 { 90.0 } else { 10.0 });
    let p = period(&all, now, STEP).expect("bursts every 15 minutes");
    assert!(p.every.abs_diff(minutes(15)) <= STEP, "{p:?}");
}

#[tokio::test(start_paused = true)]
async fn what_comes_is_what_came_one_period_ago() {
    // A jump from 10 to 90 at the start of every 5 minutes, for a minute.
    let (jumps, now) = sampled(minutes(30) - STEP * 4, |t| {
        if t % 300.0 < 60.0 {
            90.0
        } else {
            10.0
        }
    });
    let p = period(&jumps, now, STEP).expect("jumps every 5 minutes");
    assert!(p.every.abs_diff(minutes(5)) <= STEP, "{p:?}");
    // Now is 1 minute before the next jump: within 20 s, nothing; within 2 minutes, the jump.
    assert_eq!(p.ahead(&jumps, now, Duration::from_secs(20)), Some(10.0));
    assert_eq!(p.ahead(&jumps, now, minutes(2)), Some(90.0));
}
