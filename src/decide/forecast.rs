//! Looking ahead: when the demand of the last hour repeats with a steady period (a sawtooth, a
//! wave, a batch every ten minutes), what it did one period ago says what it is about to do,
//! and the `adaptive` policy adds instances before a recurring rise rather than after it.
//!
//! - **A period** ([`period`]): the demand samples of the last hour, in at most [`POINTS`]
//!   steps, compared with themselves shifted by each lag from a minute to a little under half
//!   the span seen (so more than two periods are seen): the lag whose shifted copy correlates
//!   best, past the first lag that correlates not at all, is the period when that correlation
//!   is at least [`FIT`] and the copy shifted by twice the lag still correlates at least
//!   [`AGAIN`]. A trend (a ramp, a level) never stops correlating, noise or random steps do not
//!   correlate that well at any lag, and two look-alike bursts are not seen again a period
//!   further back: none of them has a period.
//! - **What comes** ([`Period::ahead`]): the highest demand of one period ago over the time
//!   the group needs to add instances (`lead`), and a step either side.
//!
//! Pure: samples in, a period and a forecast out.

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

/// The most steps the last hour is looked at in.
pub const POINTS: usize = 240;
/// How well the demand must correlate with itself one period earlier (Pearson's r).
pub const FIT: f64 = 0.9;
/// How well the demand must correlate with itself two periods earlier, over at least
/// [`AGAIN_OVER`] steps.
pub const AGAIN: f64 = 0.8;
/// The fewest steps the demand is compared with itself two periods earlier over.
pub const AGAIN_OVER: usize = 8;
/// How much better a longer lag must correlate to be the period rather than a shorter one.
const TIE: f64 = 0.01;
/// The shortest period looked for.
pub const SHORTEST: Duration = Duration::from_secs(60);
/// How far back periods are looked for.
pub const SPAN: Duration = Duration::from_secs(3600);

/// A period found in the demand.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Period {
    /// How long it is.
    pub every: Duration,
    /// How well the demand correlates with itself one period earlier (Pearson's r).
    pub fit: f64,
    /// The step it was found with (the resolution of the forecast).
    pub step: Duration,
}

impl Period {
    /// The highest demand of `samples` (oldest first) one period before the next `lead` after
    /// `now`, a step either side; `None` when no sample is there.
    pub fn ahead(
        &self,
        samples: &VecDeque<(Instant, f64)>,
        now: Instant,
        lead: Duration,
    ) -> Option<f64> {
        let from = now.checked_sub(self.every)?;
        let to = (now + lead + self.step).checked_sub(self.every)?;
        samples
            .iter()
            .filter(|(t, _)| *t >= from && *t <= to)
            .map(|(_, d)| *d)
            .reduce(f64::max)
    }
}

/// The period of `samples` (oldest first: when, demand) over the last [`SPAN`] before `now`,
/// looked at in steps of at least `step`; `None` when they have none (see the module's header).
pub fn period(samples: &VecDeque<(Instant, f64)>, now: Instant, step: Duration) -> Option<Period> {
    let first = samples
        .iter()
        .find(|(t, _)| now.saturating_duration_since(*t) <= SPAN)?
        .0;
    let seen = now.saturating_duration_since(first);
    let step = step.max(seen / POINTS as u32).max(Duration::from_secs(1));
    let grid = resample(samples, first, now, step);
    let n = grid.len();
    let shortest = (SHORTEST.as_secs_f64() / step.as_secs_f64()).ceil() as usize;
    // Lags whose double still leaves AGAIN_OVER steps to compare.
    let longest = n.saturating_sub(AGAIN_OVER) / 2;
    if n < 8 || shortest.max(2) > longest {
        return None;
    }
    let r = |lag: usize| correlation(&grid[..n - lag], &grid[lag..]).unwrap_or(0.0);
    let mut uncorrelated = false;
    let mut best: Option<(usize, f64)> = None;
    for lag in 1..=longest {
        let r = r(lag);
        if r <= 0.0 {
            uncorrelated = true;
        }
        // A multiple of the period correlates as well: the shortest is kept unless a longer
        // lag correlates clearly better.
        if uncorrelated && lag >= shortest && best.is_none_or(|(_, b)| r > b + TIE) {
            best = Some((lag, r));
        }
    }
    let (lag, fit) = best.filter(|(_, r)| *r >= FIT)?;
    // Seen again one period further back: two look-alike bursts an hour apart are not a period.
    if r(2 * lag) < AGAIN {
        return None;
    }
    Some(Period {
        every: step * lag as u32,
        fit,
        step,
    })
}

/// `samples` from `first` to `now` in steps of `step`: each the highest sample within it, or
/// the step before's when none is.
fn resample(
    samples: &VecDeque<(Instant, f64)>,
    first: Instant,
    now: Instant,
    step: Duration,
) -> Vec<f64> {
    let n = (now.saturating_duration_since(first).as_secs_f64() / step.as_secs_f64()) as usize + 1;
    let mut grid: Vec<Option<f64>> = vec![None; n];
    for (t, d) in samples.iter().filter(|(t, _)| *t >= first) {
        let k = (t.saturating_duration_since(first).as_secs_f64() / step.as_secs_f64()) as usize;
        if let Some(slot) = grid.get_mut(k) {
            *slot = Some(slot.map_or(*d, |s: f64| s.max(*d)));
        }
    }
    let mut last = 0.0;
    grid.into_iter()
        .map(|v| {
            last = v.unwrap_or(last);
            last
        })
        .collect()
}

/// Pearson's correlation of `a` and `b` (of one length); `None` when either does not vary.
fn correlation(a: &[f64], b: &[f64]) -> Option<f64> {
    let n = a.len() as f64;
    let (ma, mb) = (a.iter().sum::<f64>() / n, b.iter().sum::<f64>() / n);
    let (mut ab, mut aa, mut bb) = (0.0, 0.0, 0.0);
    for (x, y) in a.iter().zip(b) {
        let (x, y) = (x - ma, y - mb);
        ab += x * y;
        aa += x * x;
        bb += y * y;
    }
    (aa > 0.0 && bb > 0.0).then(|| ab / (aa * bb).sqrt())
}

#[cfg(test)]
#[path = "forecast_tests.rs"]
mod tests;
