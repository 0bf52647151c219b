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
//!   kill no longer shows), the demand is unknown and only a lower bound; the count then at
//!   least doubles (and grows by at least 4), where the ratio would cap the step at
//!   `100 / threshold`.
//! - **Load that keeps growing**: the demand's trend over the last minute (least squares,
//!   growth only) is carried one interval ahead, so that new instances are ready when the load
//!   arrives rather than one pass after it.
//!
//! Scale-down still goes through the group's stabilization window, and a missing metric still
//! never scales down; see [`super::decide`].

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use tokio::time::Instant;

use crate::model::{GroupSpec, Memory, Reason};

/// A reading at or above this fraction of its limit is at the limit.
const AT_LIMIT: f64 = 0.97;
/// An instance started less than this long ago shows its base use.
const FRESH: Duration = Duration::from_secs(30);
/// How long a base reading stands (the lowest of this period is the base).
const BASE_MEMORY: Duration = Duration::from_secs(3600);
/// The demand samples the trend is fitted over.
const TREND_WINDOW: Duration = Duration::from_secs(60);

/// The scale-down window while the load has not been seen to come back after a scale-down.
const SHORT_WINDOW: Duration = Duration::from_secs(60);
/// How long a load that came back keeps the group's full window in force.
const OSCILLATION_MEMORY: Duration = Duration::from_secs(3600);

/// What the policy learns across passes.
#[derive(Debug, Clone, Default)]
pub struct Estimates {
    /// The last scale-down: when, from and to what count.
    last_down: Option<(Instant, u32, u32)>,
    /// The last scale-up that, within a window of a scale-down, took back at least half of it:
    /// the load oscillates.
    last_flip: Option<Instant>,
    /// (when, lowest usage of a fresh instance then), bytes.
    bases: VecDeque<(Instant, u64)>,
    /// (when, estimated demand), bytes.
    demand: VecDeque<(Instant, f64)>,
    /// The OOM killer's count per instance at the last pass.
    oom_kills: BTreeMap<String, u64>,
}

impl Estimates {
    /// The base use: the lowest reading of a fresh instance within the last hour (or the
    /// latest one ever seen), 0 before any.
    pub fn base(&self) -> u64 {
        self.bases.iter().map(|(_, b)| *b).min().unwrap_or(0)
    }

    /// The scale-down window in force: the group's `scale_down_stabilization` once the load
    /// has come back within it after a scale-down (in the last hour), else at most a minute.
    /// A load that drops and stays down is let go of quickly; one that oscillates faster than
    /// the window is held, as Kubernetes holds it.
    pub fn window(&self, spec: &GroupSpec, now: Instant) -> Duration {
        let full = spec.scale_down_stabilization;
        let oscillating = self
            .last_flip
            .is_some_and(|t| now.saturating_duration_since(t) <= OSCILLATION_MEMORY);
        if oscillating {
            full
        } else {
            full.min(SHORT_WINDOW)
        }
    }

    /// Remembers a pass that moved the desired count from `before` to `after`.
    pub fn scaled(&mut self, spec: &GroupSpec, now: Instant, before: u32, after: u32) {
        if after < before {
            self.last_down = Some((now, before, after));
        } else if after > before
            && self.last_down.is_some_and(|(t, from, to)| {
                now.saturating_duration_since(t) <= spec.scale_down_stabilization
                    && after >= to + (from - to).div_ceil(2)
            })
        {
            self.last_flip = Some(now);
        }
    }

    /// Takes in the OOM killer's counts of this pass (by instance name) and returns the
    /// instances it killed in since the last pass.
    pub fn oom_killed<'a>(
        &mut self,
        counts: impl IntoIterator<Item = (&'a str, Option<u64>)>,
    ) -> Vec<&'a str> {
        let mut killed = Vec::new();
        let mut seen = BTreeMap::new();
        for (name, count) in counts {
            let Some(count) = count else { continue };
            if self
                .oom_kills
                .get(name)
                .is_some_and(|before| count > *before)
            {
                killed.push(name);
            }
            seen.insert(name.to_owned(), count);
        }
        self.oom_kills = seen;
        killed
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

    /// Records `demand` and returns its growth rate, bytes per second (0 when falling or
    /// unknown).
    fn trend(&mut self, now: Instant, demand: f64) -> f64 {
        self.demand.push_back((now, demand));
        while self
            .demand
            .front()
            .is_some_and(|(t, _)| now.saturating_duration_since(*t) > TREND_WINDOW)
        {
            self.demand.pop_front();
        }
        // A trend needs three samples over half the window: two close ones would read a step
        // of the load as a steep ramp.
        let n = self.demand.len() as f64;
        let span = self
            .demand
            .front()
            .map_or(Duration::ZERO, |(t, _)| now.saturating_duration_since(*t));
        if n < 3.0 || span < TREND_WINDOW / 2 {
            return 0.0;
        }
        let xs: Vec<f64> = self
            .demand
            .iter()
            .map(|(t, _)| -(now.saturating_duration_since(*t).as_secs_f64()))
            .collect();
        let mx = xs.iter().sum::<f64>() / n;
        let my = self.demand.iter().map(|(_, d)| d).sum::<f64>() / n;
        let sxx: f64 = xs.iter().map(|x| (x - mx).powi(2)).sum();
        let sxy: f64 = xs
            .iter()
            .zip(&self.demand)
            .map(|(x, (_, d))| (x - mx) * (d - my))
            .sum();
        if sxx < 1.0 {
            return 0.0;
        }
        (sxy / sxx).max(0.0)
    }
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
    // What one instance holds at the threshold; a base at or above it leaves the ratio.
    let per_instance = threshold / 100.0 * mean_limit - base;
    let needed = if per_instance > 0.0 {
        (predicted / per_instance - 1e-9).ceil().max(0.0)
    } else {
        (n * utilization / threshold - 1e-9).ceil()
    };
    let mut needed = needed.min(f64::from(u32::MAX)) as u32;
    // An OOM kill says the same as a reading at the limit, even when the kill freed memory.
    let at_limit = readings
        .iter()
        .any(|r| r.oom_killed || r.memory.usage as f64 >= AT_LIMIT * r.memory.limit as f64);
    if at_limit {
        let m = readings.len() as u32;
        needed = needed.max(2 * m).max(m + 4);
    }
    let needed = needed.clamp(spec.min, spec.max);
    let reason = match needed.cmp(&base_count) {
        std::cmp::Ordering::Greater if at_limit => Reason::AtLimit,
        std::cmp::Ordering::Greater => Reason::AboveThreshold,
        std::cmp::Ordering::Less => Reason::BelowThreshold,
        std::cmp::Ordering::Equal => Reason::WithinTolerance,
    };
    (needed, reason)
}
