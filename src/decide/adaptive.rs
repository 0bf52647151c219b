//! The `adaptive` policy: sizes a group from an estimate of its demand, where the Kubernetes
//! rule scales the count by the ratio of utilization to target. Memory breaks that rule's
//! assumptions in three ways, and each has its answer here:
//!
//! - **A base use that does not move with load** (runtime, page tables, caches): the demand is
//!   what instances use above their base, `D = Σ (usage − base)`, and the count that holds it
//!   at the threshold is `ceil(D / (threshold × limit − base))`. The base is learned from
//!   instances seen shortly after they started (before they take their share of the load);
//!   until one is seen it is taken as 0, which is the Kubernetes rule.
//! - **Readings capped at the limit**: when an instance is at its limit, or the OOM killer
//!   killed in it since the last pass (its cgroup's counter, which a reading taken after the
//!   kill no longer shows), the demand is only a lower bound; the count then at least
//!   doubles, where the ratio would cap the step at `100 / threshold`; and when the limit
//!   holds a reading down or the killer killed, how far beyond the limit the demand goes is
//!   unknown, and the count grows by at least 4, or triples if that is less (one instance
//!   may be just over; the watch wakes the next pass when the ones added reach their limit
//!   too: [`Strain::NewAtLimit`]).
//! - **Load that keeps growing**: the demand's trend over the last minute (the slowest growth
//!   between passes, when it grew between most and fell between none) is carried one interval
//!   ahead, so that new instances are ready when the load arrives rather than one pass after it.
//!   A rise through noise (falls between passes, but a least-squares slope over the last five
//!   minutes well above 0) has no such trend: there the count is kept only while the last
//!   minute's demand stays within tolerance by half the median change between passes, since
//!   the noise would take it above before the next pass.
//! - **Load that comes in surges**: a surge lands between passes, and only instances already
//!   there take it. Readings that reach the limit, or take the group above its tolerance,
//!   between passes wake the pass at once ([`wakes`]), so a surge is met within a second or
//!   two, not an `interval` later. No room is kept ahead of surges: room for the largest rise
//!   of the scale-down window, and for an hour for one that came again, cost more
//!   instance-minutes than the seconds at the limit it spared, on every family of generated
//!   traces but one (see docs/decisions.md).
//! - **Load that holds a level**: noise around a level has rises between passes as large as
//!   its range, and holding every one within tolerance would keep the group above what it
//!   needs. When the last hour's demand holds a level, the count is at most the one that would
//!   have cost least over its readings, and never fewer than holds the demand now within
//!   tolerance and the hour's highest reading short of the limit.
//! - **Load that repeats** (a sawtooth, a wave, a batch every ten minutes): where the last
//!   hour's demand has a period ([`super::forecast`]), the count holds what came one period
//!   ago over the next pass and the time new instances take, so that they are there before the
//!   rise comes again, and keeps the instances it says are needed within [`KEEP`]; that
//!   replaces the learned hold while it lasts.
//!
//! How long a drop is held is learned from how the group's drops came back ([`super::hold`]),
//! within its `scale_down_stabilization`; `status` and the journal name the window, the level's
//! count and why. A missing metric still never scales down; see [`super::decide`].

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use tokio::time::Instant;

use super::hold::{Hold, Learned};
use crate::model::{GroupSpec, Memory, Reason};

/// A reading at or above this fraction of its limit is at the limit.
pub const AT_LIMIT: f64 = 0.97;
/// A reading at or above this fraction of its limit is held down by it (see [`held_down`]).
const HELD_DOWN: f64 = 0.99;
/// A reading that reached the limit between passes wakes the group's pass at once, at least
/// this long after the last one ended (see [`wakes`]).
pub const WAKE_GAP: Duration = Duration::from_secs(2);
/// An instance started less than this long ago shows its base use.
const FRESH: Duration = Duration::from_secs(30);
/// How long a base reading stands (the lowest of this period is the base).
const BASE_MEMORY: Duration = Duration::from_secs(3600);
/// The demand samples the trend is fitted over.
const TREND_WINDOW: Duration = Duration::from_secs(60);

/// How long the demand is remembered, for a level ([`Estimates::level`]) and a period.
const PAST_MEMORY: Duration = Duration::from_secs(3600);
/// The most demand samples kept over [`PAST_MEMORY`] (the oldest are forgotten first).
const MOST_SAMPLES: usize = 4096;

/// The demand samples a rise is fitted over (see [`Estimates::rising`]).
const RISE_WINDOW: Duration = Duration::from_secs(300);
/// A rise is a least-squares slope at least this many standard errors above 0.
const RISE_T: f64 = 3.0;

/// A level needs at least this many demand samples (see [`Estimates::level`]).
const LEVEL_SAMPLES: usize = 20;
/// A level's least-squares slope is within this many standard errors of 0: as many as tell a
/// rise ([`RISE_T`]), over the hour.
const LEVEL_T: f64 = 3.0;

/// How often the period of the demand is looked for again.
const PERIOD_AGAIN: Duration = Duration::from_secs(180);
/// What new instances take to serve, beyond the next pass (see [`super::forecast`]).
const LEAD: Duration = Duration::from_secs(5);
/// An instance the forecast says is needed again within this long is kept: a removal and a
/// creation weigh as much as 4 instance-minutes (the simulator's `2 × churn` each, against
/// a wasted instance-minute).
const KEEP: Duration = Duration::from_secs(240);

/// What a second at the limit costs against a second overloaded (the simulator's `10 ×
/// oom_s`, on top of the second overloaded).
const AT_LIMIT_WEIGHT: f64 = 11.0;

/// What the policy learns across passes.
#[derive(Debug, Clone, Default)]
pub struct Estimates {
    /// How long to hold instances after a drop, learned from the drops of the last hour.
    pub(super) hold: Hold,
    /// (when, estimated demand), bytes, over [`PAST_MEMORY`], at most [`MOST_SAMPLES`].
    pub(super) past: VecDeque<(Instant, f64)>,
    /// The count a level of the last hour held the group to at the last pass, if it did.
    pub(super) level: Option<u32>,
    /// (when, lowest usage of a fresh instance then), bytes.
    pub(super) bases: VecDeque<(Instant, u64)>,
    /// (when, estimated demand), bytes.
    pub(super) demand: VecDeque<(Instant, f64)>,
    /// The OOM killer's count per instance at the last pass.
    pub(super) oom_kills: BTreeMap<String, u64>,
    /// The period of the demand found at `period_at` (see [`super::forecast`]).
    pub(super) period: Option<super::forecast::Period>,
    pub(super) period_at: Option<Instant>,
    /// What the forecast did at the last pass, for `status` and the journal.
    pub(super) forecast: Option<crate::model::Forecast>,
}

impl Estimates {
    /// The base use: the lowest reading of a fresh instance within the last hour (or the
    /// latest one ever seen), 0 before any.
    pub fn base(&self) -> u64 {
        self.bases.iter().map(|(_, b)| *b).min().unwrap_or(0)
    }

    /// The scale-down window in force, learned from how the drops of the last hour came back
    /// ([`super::hold`]), within the group's `scale_down_stabilization`.
    pub fn window(&self, spec: &GroupSpec) -> Duration {
        self.learned(spec).window
    }

    /// The scale-down window in force and what it was learned from, with the level and the
    /// forecast of the last pass.
    pub fn learned(&self, spec: &GroupSpec) -> Learned {
        let hold = self.hold.learned(spec);
        Learned {
            // Where the demand repeats, the forecast keeps what comes back within [`KEEP`]:
            // no window holds drops beyond it.
            window: if self.forecast.is_some() {
                Duration::ZERO
            } else {
                hold.window
            },
            level: self.level,
            forecast: self.forecast,
            ..hold
        }
    }

    /// Takes in the OOM killer's counts of this pass (by instance name) and returns the
    /// instances it killed in since the last pass.
    pub fn oom_killed<'a>(
        &mut self,
        counts: impl IntoIterator<Item = (&'a str, Option<u64>)>,
    ) -> Vec<&'a str> {
        new_kills(&mut self.oom_kills, counts)
    }

    fn learn_base(&mut self, now: Instant, fresh_low: Option<u64>) {
        if let Some(b) = fresh_low {
            self.bases.push_back((now, b));
        }
        while self.bases.len() > 1
            && self
                .bases
                .front()
                .is_some_and(|(t, _)| now.saturating_duration_since(*t) > BASE_MEMORY)
        {
            self.bases.pop_front();
        }
    }

    /// Records `demand` over the last [`PAST_MEMORY`], at most [`MOST_SAMPLES`] samples.
    fn remember(&mut self, now: Instant, demand: f64) {
        self.past.push_back((now, demand));
        forget(&mut self.past, now, PAST_MEMORY);
        while self.past.len() > MOST_SAMPLES {
            self.past.pop_front();
        }
    }

    /// Whether the demand rises through its noise: the least-squares slope of the samples of
    /// the last [`RISE_WINDOW`] (at least six) is at least [`RISE_T`] standard errors above 0.
    /// Unlike [`Estimates::trend`], a rise with falls between passes.
    fn rising(&self, now: Instant) -> bool {
        let recent = self.demand_since(now, RISE_WINDOW);
        recent.len() >= 6
            && slope(&recent).is_some_and(|(slope, error)| slope > 0.0 && slope > RISE_T * error)
    }

    /// The demand samples of the last hour (at least [`LEVEL_SAMPLES`]) when they hold a
    /// level: their least-squares slope is within [`LEVEL_T`] standard errors of 0.
    fn level(&self, now: Instant) -> Option<Vec<f64>> {
        let points = self.demand_since(now, PAST_MEMORY);
        if points.len() < LEVEL_SAMPLES {
            return None;
        }
        let (slope, error) = slope(&points)?;
        (slope.abs() <= LEVEL_T * error).then(|| points.into_iter().map(|(_, d)| d).collect())
    }

    /// The demand samples of the last `span`, newest first, as (seconds before `now`, negative;
    /// demand), for [`slope`].
    fn demand_since(&self, now: Instant, span: Duration) -> Vec<(f64, f64)> {
        self.past
            .iter()
            .rev()
            .map(|(at, d)| (now.saturating_duration_since(*at), *d))
            .take_while(|(ago, _)| *ago <= span)
            .map(|(ago, d)| (-ago.as_secs_f64(), d))
            .collect()
    }

    /// The median change of the demand between successive passes of the last hour, bytes (0
    /// before two samples).
    fn typical_change(&self) -> f64 {
        let mut changes: Vec<f64> = self
            .past
            .iter()
            .zip(self.past.iter().skip(1))
            .map(|((_, a), (_, b))| (b - a).abs())
            .collect();
        if changes.is_empty() {
            return 0.0;
        }
        let middle = changes.len() / 2;
        *changes.select_nth_unstable_by(middle, f64::total_cmp).1
    }

    /// Where the demand of the last hour repeats (found again at most every
    /// [`PERIOD_AGAIN`]): its period, and the highest demand of one period ago over the next
    /// `interval` + [`LEAD`] and over the next [`KEEP`].
    fn look_ahead(&mut self, now: Instant, interval: Duration) -> Option<(Duration, f64, f64)> {
        if self
            .period_at
            .is_none_or(|t| now.saturating_duration_since(t) >= PERIOD_AGAIN)
        {
            self.period = super::forecast::period(&self.past, now, interval);
            self.period_at = Some(now);
        }
        let p = self.period?;
        let soon = p.ahead(&self.past, now, interval + LEAD)?;
        let kept = p.ahead(&self.past, now, KEEP).unwrap_or(soon);
        Some((p.every, soon, kept))
    }

    /// Records `demand` and returns its growth rate, bytes per second: the slowest growth
    /// between successive passes of the last minute, when it grew between most of them and
    /// fell between none; so a step of the load, or noise, is not a trend. 0 otherwise.
    fn trend(&mut self, now: Instant, demand: f64) -> f64 {
        self.demand.push_back((now, demand));
        forget(&mut self.demand, now, TREND_WINDOW);
        // A trend needs three samples over half the window.
        let span = self
            .demand
            .front()
            .map_or(Duration::ZERO, |(t, _)| now.saturating_duration_since(*t));
        if self.demand.len() < 3 || span < TREND_WINDOW / 2 {
            return 0.0;
        }
        let rates: Vec<f64> = self
            .demand
            .iter()
            .zip(self.demand.iter().skip(1))
            .map(|((t0, d0), (t1, d1))| {
                let dt = t1.saturating_duration_since(*t0).as_secs_f64();
                if dt > 0.0 {
                    (d1 - d0) / dt
                } else {
                    0.0
                }
            })
            .collect();
        // Growth between most passes and a fall between none; passes with no change (a load
        // that moves in steps longer than the interval) neither count nor break it.
        let rising: Vec<f64> = rates.iter().copied().filter(|r| *r > 0.0).collect();
        if rates.iter().any(|r| *r < 0.0) || 2 * rising.len() <= rates.len() {
            return 0.0;
        }
        rising.into_iter().fold(f64::INFINITY, f64::min)
    }
}

/// Takes in the OOM killer's counts of a pass (by instance name; `before` holds those of the
/// pass before, and this pass' afterwards) and returns the instances it killed in since.
pub fn new_kills<'a>(
    before: &mut BTreeMap<String, u64>,
    counts: impl IntoIterator<Item = (&'a str, Option<u64>)>,
) -> Vec<&'a str> {
    let mut killed = Vec::new();
    let mut seen = BTreeMap::new();
    for (name, count) in counts {
        let Some(count) = count else { continue };
        if before.get(name).is_some_and(|b| count > *b) {
            killed.push(name);
        }
        seen.insert(name.to_owned(), count);
    }
    *before = seen;
    killed
}

/// Forgets the samples of `samples` (oldest first) taken more than `keep` before `now`.
fn forget<T>(samples: &mut VecDeque<(Instant, T)>, now: Instant, keep: Duration) {
    while samples
        .front()
        .is_some_and(|(t, _)| now.saturating_duration_since(*t) > keep)
    {
        samples.pop_front();
    }
}

/// The instances `demand` takes at `per` each: its quotient rounded up (a hair below a whole
/// number counts as that number), at least 0.
fn count(demand: f64, per: f64) -> f64 {
    (demand / per - 1e-9).ceil().max(0.0)
}

/// The least-squares slope of `points` (t, value) and its standard error; `None` for fewer
/// than three points or points all at one t.
fn slope(points: &[(f64, f64)]) -> Option<(f64, f64)> {
    let n = points.len() as f64;
    if points.len() < 3 {
        return None;
    }
    let mean_t = points.iter().map(|(t, _)| t).sum::<f64>() / n;
    let mean_v = points.iter().map(|(_, v)| v).sum::<f64>() / n;
    let stt: f64 = points.iter().map(|(t, _)| (t - mean_t).powi(2)).sum();
    if stt <= 0.0 {
        return None;
    }
    let slope = points
        .iter()
        .map(|(t, v)| (t - mean_t) * (v - mean_v))
        .sum::<f64>()
        / stt;
    let residuals: f64 = points
        .iter()
        .map(|(t, v)| (v - mean_v - slope * (t - mean_t)).powi(2))
        .sum();
    Some((slope, (residuals / (n - 2.0) / stt).sqrt()))
}

/// Whether `memory` is at its limit.
pub fn at_limit(memory: &Memory) -> bool {
    memory.usage as f64 >= AT_LIMIT * memory.limit as f64
}

/// Whether the limit holds `memory` down: its reading is at [`HELD_DOWN`] of the limit or above,
/// and says nothing of how far beyond the limit the demand is.
fn held_down(memory: &Memory) -> bool {
    memory.usage as f64 >= HELD_DOWN * memory.limit as f64
}

/// What a group's memory readings say of its strain, from the least to the most pressing: what
/// the watch between passes compares with the last pass ([`wakes`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub enum Strain {
    /// Within the top of its tolerance.
    #[default]
    Within,
    /// The group's utilization (its instances' usage over their limits) is above `1 +
    /// tolerance_up` times its memory threshold.
    AboveTolerance,
    /// An instance is at its limit.
    AtLimit,
    /// An instance the last pass did not measure (one it created) is at its limit: the pass
    /// added too few. Only the watch between passes tells it ([`wakes`]); a pass measures them
    /// all.
    NewAtLimit,
}

/// The strain `readings` (the memory of a group's instances) show for the group `spec`.
pub fn strain(spec: &GroupSpec, readings: impl IntoIterator<Item = Memory>) -> Strain {
    let readings: Vec<Memory> = readings.into_iter().collect();
    let top = spec.memory_threshold.map(|t| t * (1.0 + spec.tolerance_up));
    if readings.iter().any(at_limit) {
        Strain::AtLimit
    } else if top.is_some_and(|top| super::utilization(readings.iter()).is_some_and(|u| u > top)) {
        Strain::AboveTolerance
    } else {
        Strain::Within
    }
}

/// Whether readings taken between passes (their strain `now`) wake the group's pass now,
/// `since_pass` after the last one (whose readings' strain was `at_last_pass`): for the
/// `adaptive` policy on memory, when the strain rose since the last pass (a group that was at
/// its limit, or above its tolerance, then is the passes' to follow, unless an instance the
/// pass added reaches its limit too: [`Strain::NewAtLimit`]), and at least [`WAKE_GAP`] after
/// it. A surge is then met in a second or so, not up to an `interval` later.
pub fn wakes(spec: &GroupSpec, at_last_pass: Strain, now: Strain, since_pass: Duration) -> bool {
    spec.policy == crate::model::Policy::Adaptive
        && spec.memory_threshold.is_some()
        && !spec.paused
        && now > at_last_pass
        && since_pass >= WAKE_GAP
}

/// One measured healthy instance: its reading, how long ago it started, and whether the OOM
/// killer killed in it since the last pass.
#[derive(Debug, Clone, Copy)]
pub struct Reading {
    pub memory: Memory,
    pub since_start: Option<Duration>,
    pub oom_killed: bool,
}

/// The recommendation for `readings` (the measured healthy instances, at `utilization`: their
/// total usage over their total limits, percent) when the group's desired count is
/// `base_count`, and why. Learns the base and the trend into `est`.
pub fn recommend(
    spec: &GroupSpec,
    threshold: f64,
    base_count: u32,
    readings: &[Reading],
    utilization: f64,
    est: &mut Estimates,
    now: Instant,
) -> (u32, Reason) {
    // A fresh instance shows its base only while it has not taken its share of the load yet:
    // its reading must be well below every other one.
    let is_fresh = |r: &Reading| r.since_start.is_some_and(|s| s <= FRESH);
    let loaded_low = readings
        .iter()
        .filter(|r| !is_fresh(r))
        .map(|r| r.memory.usage.min(r.memory.limit))
        .min();
    let fresh_low = readings
        .iter()
        .filter(|r| is_fresh(r))
        .map(|r| r.memory.usage.min(r.memory.limit))
        .min()
        .filter(|f| loaded_low.is_some_and(|l| *f <= l / 2));
    est.learn_base(now, fresh_low);
    let base = est.base() as f64;
    let n = readings.len() as f64;
    let mean_limit = readings.iter().map(|r| r.memory.limit as f64).sum::<f64>() / n;
    let demand: f64 = readings
        .iter()
        .map(|r| (r.memory.usage.min(r.memory.limit) as f64 - base).max(0.0))
        .sum();
    let growth = est.trend(now, demand);
    let predicted = demand + growth * spec.interval.as_secs_f64();
    // An OOM kill says the same as a reading at the limit, even when the kill freed memory.
    let at_limit = readings.iter().any(|r| r.oom_killed || at_limit(&r.memory));
    // What one instance holds at the threshold, and at the top of its tolerance; a base at or
    // above it leaves the ratio.
    let per_instance = threshold / 100.0 * mean_limit - base;
    let per_tolerated = threshold * (1.0 + spec.tolerance_up) / 100.0 * mean_limit - base;
    est.remember(now, demand);
    let needed = if per_instance > 0.0 {
        // The count that holds the demand at the threshold; the current one while it holds
        // every reading of the last minute (or scale-down window, if shorter) within tolerance
        // (so that noise does not take it above) and is not above the threshold's; and never
        // below the count that holds those readings.
        // Together with the window that holds a drop, never longer than the group's
        // scale-down window.
        let horizon = TREND_WINDOW.min(
            spec.scale_down_stabilization
                .saturating_sub(est.hold.learned(spec).window),
        );
        let recent = est
            .demand
            .iter()
            .filter(|(t, _)| now.saturating_duration_since(*t) <= horizon)
            .map(|(_, d)| *d)
            .fold(predicted, f64::max);
        // While the demand rises through its noise, the count is kept only while those
        // readings stay within tolerance by half a typical change between passes: such a rise
        // crosses the top of the tolerance between passes, and the group would be overloaded
        // until the next one.
        let margin = if est.rising(now) {
            est.typical_change() / 2.0
        } else {
            0.0
        };
        let (holds, at_threshold) = (
            count(recent + margin, per_tolerated),
            count(predicted, per_instance),
        );
        let current = f64::from(base_count);
        if current < holds || current > at_threshold {
            at_threshold.max(holds)
        } else {
            current
        }
    } else {
        count(n * utilization, threshold)
    };
    // What one instance holds short of its limit.
    let per_limit = AT_LIMIT * mean_limit - base;
    // Looking ahead: where the demand repeats with a period, what it did one period ago says
    // what comes (see [`super::forecast`]). The count then holds, within tolerance, what comes
    // within the time new instances take (before the recurring rise, not after it) and keeps
    // the instances needed again within [`KEEP`] (a removal and a creation cost more than
    // keeping one that long); that is the hold, while it lasts.
    let ahead = (per_instance > 0.0 && per_limit > 0.0)
        .then(|| est.look_ahead(now, spec.interval))
        .flatten();
    est.forecast = None;
    let reactive = needed;
    let (needed, forecast) = match ahead {
        Some((every, soon, kept)) => {
            let soon = count(soon, per_tolerated);
            let kept = count(kept, per_tolerated).min(f64::from(base_count));
            est.forecast = Some(crate::model::Forecast {
                every,
                raised: None,
            });
            (needed.max(soon).max(kept), soon)
        }
        None => (needed, 0.0),
    };
    // A load that held a level over the last hour needs no more than the count that would have
    // cost least over the hour's readings: overloaded, at the limit, or above the ideal count;
    // and never fewer than holds the demand now within tolerance and the hour's highest
    // reading short of the limit. Noise around a level has rises between passes as large as
    // its whole range, and holding the demand of the last minute within tolerance through
    // them would keep the group above what it needs.
    let level = est
        .level(now)
        .filter(|_| per_instance > 0.0 && per_limit > 0.0);
    est.level = None;
    let needed = match level {
        Some(samples) => {
            let top = samples.iter().copied().fold(0.0, f64::max);
            let least = count(demand, per_tolerated)
                .max(count(top, per_limit))
                .max(1.0);
            let cost = |k: f64| -> f64 {
                samples
                    .iter()
                    .map(|d| {
                        let wanting = if d / k >= per_limit {
                            AT_LIMIT_WEIGHT
                        } else if d / k > per_tolerated {
                            1.0
                        } else {
                            0.0
                        };
                        wanting + (k - (d / per_instance).ceil()).max(0.0) / 60.0
                    })
                    .sum()
            };
            // Counts above `max` are not for choosing (the count is clamped to it below).
            let most = needed.min(f64::from(spec.max.max(1)));
            let mut best = (needed, f64::INFINITY);
            let mut k = least;
            while k <= most {
                let c = cost(k);
                if c < best.1 - 1e-9 {
                    best = (k, c);
                }
                k += 1.0;
            }
            if best.0 < most {
                est.level = Some(best.0.min(f64::from(u32::MAX)) as u32);
            }
            best.0
        }
        None => needed,
    };
    let mut needed = needed.min(f64::from(u32::MAX)) as u32;
    if at_limit {
        // At the limit, the count at least doubles. A reading the limit holds down, or a kill,
        // hides how far the demand is beyond it: the count grows by at least 4 then, or
        // triples if that is less, and doubles if that is more (one instance held down may be
        // just over it; if the ones added reach their limit too, the watch wakes the next pass
        // as soon as they do: [`Strain::NewAtLimit`]). One short of it still shows the demand.
        let m = readings.len() as u32;
        let hidden = readings
            .iter()
            .any(|r| r.oom_killed || held_down(&r.memory));
        let grown = if hidden { (2 * m).min(4).max(m) } else { m };
        needed = needed.max(m + grown);
    }
    let needed = needed.clamp(spec.min, spec.max);
    // What the group goes through for want of instances, for the hold to weigh.
    let wanting = if at_limit {
        AT_LIMIT_WEIGHT
    } else if utilization > threshold * (1.0 + spec.tolerance_up) {
        1.0
    } else {
        0.0
    };
    est.hold.observe(
        spec,
        now,
        needed,
        wanting * spec.interval.as_secs_f64() / 2.0,
    );
    // The forecast raised the count: it asked for more than the rules above, and than there are.
    let by_forecast =
        !at_limit && needed > base_count && forecast > reactive && forecast >= f64::from(needed);
    if let Some(f) = est.forecast.as_mut().filter(|_| by_forecast) {
        f.raised = Some(needed);
    }
    let reason = match needed.cmp(&base_count) {
        std::cmp::Ordering::Greater if at_limit => Reason::AtLimit,
        std::cmp::Ordering::Greater if by_forecast => Reason::Forecast,
        std::cmp::Ordering::Greater => Reason::AboveThreshold,
        std::cmp::Ordering::Less => Reason::BelowThreshold,
        std::cmp::Ordering::Equal => Reason::WithinTolerance,
    };
    (needed, reason)
}
