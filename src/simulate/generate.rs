//! Generated memory demand traces: families of load shapes with random parameters, so that a
//! policy is judged on loads it was not tuned on. Pure, no IO: a (family, seed) pair always
//! gives the same trace, which is how a failing case is replayed (`simulate --family F --seed
//! S`).
//!
//! Each trace is a demand in MiB per second (`t,demand_mib`, as in `benches/traces/`), 1 to 6
//! hours long. Shapes are drawn as fractions of the group's **peak**: the demand its `max`
//! instances hold at the threshold (`max × (threshold × limit − base)`, [`peak_mib`]); a shape
//! never goes above 1, so the group can always serve it. The families:
//!
//! | name | shape |
//! |---|---|
//! | `steps` | plateaus of 2–40 min at random levels, changing at once |
//! | `spikes` | a low base with spikes of 10–120 s, 2–30 min apart |
//! | `ramps` | linear ramps of 5–60 min between random levels, with plateaus between |
//! | `sawtooth-up` | a rise over a period of 2–30 min, then a drop at once, again and again |
//! | `sawtooth-down` | a rise at once, then a fall over a period of 2–30 min, again and again |
//! | `sines` | a sine of period 1–30 min around a random level |
//! | `noise` | a plateau with noise of one of several levels, changing every 1–30 s |
//! | `daily` | a day in the trace's length: night, morning peak, lunch dip, evening peak |
//! | `bursts` | a base with bursts of 1–15 min on top, 5–40 min apart |
//! | `sums` | the sum of two or three of the above, scaled back under the peak |

use std::f64::consts::TAU;

use fastrand::Rng;

use crate::model::GroupSpec;

use super::LoadModel;

/// A family of generated shapes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Family {
    Steps,
    Spikes,
    Ramps,
    SawtoothUp,
    SawtoothDown,
    Sines,
    Noise,
    Daily,
    Bursts,
    Sums,
}

impl Family {
    /// Every family, in the order reports list them.
    pub const ALL: [Family; 10] = [
        Family::Steps,
        Family::Spikes,
        Family::Ramps,
        Family::SawtoothUp,
        Family::SawtoothDown,
        Family::Sines,
        Family::Noise,
        Family::Daily,
        Family::Bursts,
        Family::Sums,
    ];

    /// The family's stable name (`--family NAME`).
    pub fn name(self) -> &'static str {
        match self {
            Family::Steps => "steps",
            Family::Spikes => "spikes",
            Family::Ramps => "ramps",
            Family::SawtoothUp => "sawtooth-up",
            Family::SawtoothDown => "sawtooth-down",
            Family::Sines => "sines",
            Family::Noise => "noise",
            Family::Daily => "daily",
            Family::Bursts => "bursts",
            Family::Sums => "sums",
        }
    }

    /// The family named `name`, if any.
    pub fn named(name: &str) -> Option<Family> {
        Family::ALL.into_iter().find(|f| f.name() == name)
    }

    /// The families' names, comma-separated, for messages.
    pub fn names() -> String {
        Family::ALL.map(Family::name).join(", ")
    }
}

/// The demand the group's `max` instances hold at its memory threshold, MiB (`None` for a
/// group without a memory threshold, or one whose base leaves no room under it).
pub fn peak_mib(spec: &GroupSpec, model: &LoadModel) -> Option<f64> {
    let threshold = spec.memory_threshold?;
    let each = threshold / 100.0 * model.limit_mib - model.base_mib;
    (each > 0.0).then(|| f64::from(spec.max) * each)
}

/// The demand of `family`'s trace number `seed` for a group whose peak is `peak` MiB: one
/// value per second, MiB, rounded to 0.1.
pub fn demand(family: Family, seed: u64, peak: f64) -> Vec<f64> {
    // Each family draws from its own sequence, so seed 3 of two families are unrelated.
    let mut rng = Rng::with_seed(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ family as u64);
    let n = rng.usize(60..=360) * 60;
    shape(family, &mut rng, n)
        .into_iter()
        .map(|f| (f.clamp(0.0, 1.0) * peak * 10.0).round() / 10.0)
        .collect()
}

/// `demand` as CSV, one row per change and one at the end (what `Trace::parse` reads back).
pub fn csv(family: Family, seed: u64, demand: &[f64]) -> String {
    let mut out = format!(
        "# generated: family {}, seed {seed}\nt,demand_mib\n",
        family.name()
    );
    let mut last = None;
    for (t, d) in demand.iter().enumerate() {
        if last != Some(*d) {
            out.push_str(&format!("{t},{d}\n"));
            last = Some(*d);
        }
    }
    if let Some(d) = demand.last() {
        out.push_str(&format!("{},{d}\n", demand.len()));
    }
    out
}

/// `n` seconds of `family`, as fractions of the peak (clamped by the caller).
fn shape(family: Family, rng: &mut Rng, n: usize) -> Vec<f64> {
    match family {
        Family::Steps => steps(rng, n),
        Family::Spikes => spikes(rng, n),
        Family::Ramps => ramps(rng, n),
        Family::SawtoothUp => sawtooth(rng, n, true),
        Family::SawtoothDown => sawtooth(rng, n, false),
        Family::Sines => sines(rng, n),
        Family::Noise => noise(rng, n),
        Family::Daily => daily(rng, n),
        Family::Bursts => bursts(rng, n),
        Family::Sums => sums(rng, n),
    }
}

/// A uniform draw from `[lo, hi)`.
fn between(rng: &mut Rng, lo: f64, hi: f64) -> f64 {
    lo + rng.f64() * (hi - lo)
}

/// A standard normal draw (Box–Muller).
fn normal(rng: &mut Rng) -> f64 {
    let u = rng.f64().max(f64::MIN_POSITIVE);
    (-2.0 * u.ln()).sqrt() * (TAU * rng.f64()).cos()
}

/// `len` seconds at `level`, appended.
fn hold(out: &mut Vec<f64>, level: f64, len: usize) {
    out.extend(std::iter::repeat_n(level, len));
}

/// `len` seconds from `from` to `to` in a straight line, appended.
fn ramp(out: &mut Vec<f64>, from: f64, to: f64, len: usize) {
    let len = len.max(1);
    out.extend((0..len).map(|s| from + (to - from) * s as f64 / len as f64));
}

fn steps(rng: &mut Rng, n: usize) -> Vec<f64> {
    let mut out = Vec::with_capacity(n);
    let mut level = between(rng, 0.03, 0.3);
    while out.len() < n {
        hold(&mut out, level, rng.usize(120..=2400));
        level = between(rng, 0.03, 0.95);
    }
    out.truncate(n);
    out
}

fn spikes(rng: &mut Rng, n: usize) -> Vec<f64> {
    let base = between(rng, 0.03, 0.3);
    pulses(rng, n, base, 120..=1800, (0.2, 0.9), 10..=120)
}

/// `base` for a random while in `quiet`, then `base` plus a random height in `height` for a
/// random while in `pulse`, again and again.
fn pulses(
    rng: &mut Rng,
    n: usize,
    base: f64,
    quiet: std::ops::RangeInclusive<usize>,
    height: (f64, f64),
    pulse: std::ops::RangeInclusive<usize>,
) -> Vec<f64> {
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        hold(&mut out, base, rng.usize(quiet.clone()));
        hold(
            &mut out,
            base + between(rng, height.0, height.1),
            rng.usize(pulse.clone()),
        );
    }
    out.truncate(n);
    out
}

fn ramps(rng: &mut Rng, n: usize) -> Vec<f64> {
    let mut out = Vec::with_capacity(n);
    let mut level = between(rng, 0.03, 0.3);
    while out.len() < n {
        let to = between(rng, 0.03, 0.95);
        ramp(&mut out, level, to, rng.usize(300..=3600));
        level = to;
        hold(&mut out, level, rng.usize(120..=1800));
    }
    out.truncate(n);
    out
}

/// Up: a rise over each period, then a drop at once; down: a rise at once, then a fall. The
/// top of each period varies by up to 10 %.
fn sawtooth(rng: &mut Rng, n: usize, up: bool) -> Vec<f64> {
    let period = rng.usize(120..=1800);
    let low = between(rng, 0.03, 0.3);
    let high = between(rng, 0.45, 0.95);
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        let top = (high * between(rng, 0.9, 1.1)).min(1.0);
        if up {
            ramp(&mut out, low, top, period);
        } else {
            ramp(&mut out, top, low, period);
        }
    }
    out.truncate(n);
    out
}

fn sines(rng: &mut Rng, n: usize) -> Vec<f64> {
    let period = between(rng, 60.0, 1800.0);
    let mean = between(rng, 0.2, 0.6);
    let amplitude = between(rng, 0.1, mean.min(0.95 - mean));
    let phase = between(rng, 0.0, TAU);
    (0..n)
        .map(|t| mean + amplitude * (TAU * t as f64 / period + phase).sin())
        .collect()
}

fn noise(rng: &mut Rng, n: usize) -> Vec<f64> {
    const LEVELS: [f64; 4] = [0.02, 0.05, 0.1, 0.2];
    let mean = between(rng, 0.1, 0.8);
    let sigma = LEVELS[rng.usize(..LEVELS.len())];
    let every = rng.usize(1..=30);
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        hold(&mut out, mean + sigma * normal(rng), every);
    }
    out.truncate(n);
    out
}

/// A day in `n` seconds: a night level, a morning and an evening peak (gaussian bumps) with a
/// lunch dip between, and a little noise every 20 s.
fn daily(rng: &mut Rng, n: usize) -> Vec<f64> {
    let night = between(rng, 0.03, 0.15);
    let bumps = [
        (
            between(rng, 0.3, 0.4),
            between(rng, 0.04, 0.1),
            between(rng, 0.4, 0.85),
        ),
        (
            between(rng, 0.45, 0.52),
            between(rng, 0.02, 0.04),
            -between(rng, 0.05, 0.2),
        ),
        (
            between(rng, 0.65, 0.8),
            between(rng, 0.04, 0.1),
            between(rng, 0.3, 0.8),
        ),
    ];
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        let x = out.len() as f64 / n as f64;
        let level = bumps.iter().fold(night, |v, (at, width, height)| {
            v + height * (-((x - at) / width).powi(2) / 2.0).exp()
        });
        hold(&mut out, level + 0.02 * normal(rng), 20);
    }
    out.truncate(n);
    out
}

fn bursts(rng: &mut Rng, n: usize) -> Vec<f64> {
    let base = between(rng, 0.05, 0.4);
    pulses(rng, n, base, 300..=2400, (0.1, 0.6), 60..=900)
}

/// Two or three shapes of the other families, added and scaled so that the sum's highest
/// point is 60–95 % of the peak.
fn sums(rng: &mut Rng, n: usize) -> Vec<f64> {
    let parts = rng.usize(2..=3);
    let mut total = vec![0.0; n];
    for _ in 0..parts {
        let family = Family::ALL[rng.usize(..Family::ALL.len() - 1)];
        for (t, v) in total.iter_mut().zip(shape(family, rng, n)) {
            *t += v.max(0.0);
        }
    }
    let top = total.iter().copied().fold(0.0, f64::max);
    let scale = if top > 0.0 {
        between(rng, 0.6, 0.95) / top
    } else {
        0.0
    };
    total.iter().map(|v| v * scale).collect()
}

#[cfg(test)]
#[path = "generate_tests.rs"]
mod tests;
