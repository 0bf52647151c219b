//! Right-sizing advice: for a group scaled on memory, the per-instance `limits.memory` that
//! would have cost least on its own recorded history, found by replaying its demand through the
//! decision code (under the group's own policy and settings) at candidate sizes around the one
//! it has. Pure: the rows come in, the advice goes out; nothing is applied.
//!
//! Sizing and counting fight when both follow the same signal (the VPA and the HPA on one
//! metric): a larger size lowers the utilization the count follows, the count drops, the
//! utilization rises, and each undoes the other. Here the count stays the daemon's, and a size
//! is judged by what the count would have done with it over the whole history: the least
//! memory reserved (instances × limit, over time) among the sizes under which the group would
//! have been at its limit and overloaded no longer than under the size it has.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{recorded, simulate_each, Clock, LoadModel, SimPolicy, Trace};
use crate::history::Record;
use crate::model::size::mib;
use crate::model::GroupSpec;

/// Each instance's base memory use, MiB, unless told (it does not move with load).
pub const BASE_MIB: f64 = 4.0;
/// From an instance's creation to its readiness, unless told.
pub const WARMUP: Duration = Duration::from_secs(2);

/// The sizes tried, as fractions of the group's own.
pub const SIZES: [f64; 7] = [0.5, 0.625, 0.75, 0.875, 1.0, 1.25, 1.5];
/// Sizes are rounded to this many MiB.
const STEP_MIB: f64 = 8.0;

/// What the group's history would have been like at one size.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Candidate {
    pub limit_mib: f64,
    pub instance_hours: f64,
    /// Instance-hours times the limit: the memory the group would have reserved.
    pub memory_gib_hours: f64,
    pub oom_s: u64,
    pub overload_s: u64,
    pub churn: u64,
    /// The lowest and highest count of the replay.
    pub fewest: u32,
    pub most: u32,
}

/// The advice for one group.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Advice {
    pub group: String,
    /// How long the history replayed lasts.
    pub hours: f64,
    /// The size the group has, replayed.
    pub current: Candidate,
    /// The size that would have cost least: `current` when no other did.
    pub advised: Candidate,
    /// Every size replayed, smallest first.
    pub candidates: Vec<Candidate>,
}

/// `spec`'s replay of `trace` at `model`'s size, its seconds summed as they come rather than
/// kept.
fn candidate(spec: &GroupSpec, trace: &Trace, model: &LoadModel, clock: &Clock) -> Candidate {
    let (mut instance_s, mut fewest, mut most) = (0u64, None::<u32>, 0u32);
    let scores = simulate_each(
        spec,
        trace,
        model,
        SimPolicy::Default,
        clock,
        &mut |_, _, _| {},
        &mut |s| {
            instance_s += u64::from(s.instances);
            fewest = Some(fewest.map_or(s.instances, |f| f.min(s.instances)));
            most = most.max(s.instances);
        },
    );
    let instance_hours = instance_s as f64 / 3600.0;
    Candidate {
        limit_mib: model.limit_mib,
        instance_hours,
        memory_gib_hours: instance_hours * model.limit_mib / 1024.0,
        oom_s: scores.oom_s,
        overload_s: scores.overload_s,
        churn: scores.churn,
        fewest: fewest.unwrap_or(0),
        most,
    }
}

/// Why a group gets no advice.
#[derive(Debug, Clone, PartialEq)]
pub enum NoAdvice {
    /// Its `schedule` cannot be read (a fault of the desired-state file).
    Schedule(String),
    /// It has nothing to size, or its history cannot be replayed.
    Group(String),
}

impl std::fmt::Display for NoAdvice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NoAdvice::Schedule(e) | NoAdvice::Group(e) => f.write_str(e),
        }
    }
}

/// The size `spec`'s instances have, MiB: its `limits.memory`; `None` without one to size.
pub fn own_size(spec: &GroupSpec) -> Option<f64> {
    spec.config.get("limits.memory").and_then(|v| mib(v))
}

/// The advice for the group `spec` (scaled on memory, with a `limits.memory`) from its
/// recorded `rows` (oldest first, at least two), each instance using `base_mib` at rest and
/// ready `warmup` after its creation.
pub fn for_group(
    spec: &GroupSpec,
    rows: &[Record],
    base_mib: f64,
    warmup: Duration,
) -> Result<Advice, NoAdvice> {
    let group = |e: &str| NoAdvice::Group(e.to_owned());
    let limit_mib = own_size(spec).ok_or_else(|| group("no limits.memory to size"))?;
    let first = rows.first().ok_or_else(|| group("no pass recorded"))?;
    let clock = Clock::new(&spec.schedule, crate::history::at_unix_ms(first.unix_ms))
        .map_err(NoAdvice::Schedule)?;
    let model = LoadModel {
        limit_mib,
        base_mib,
        warmup,
    };
    advise(spec, rows, &model, &clock).map_err(NoAdvice::Group)
}

/// The advice for the group `spec` (scaled on memory, each instance's limit `model.limit_mib`)
/// from its recorded `rows` (oldest first), the schedule windows on `clock`.
pub fn advise(
    spec: &GroupSpec,
    rows: &[Record],
    model: &LoadModel,
    clock: &Clock,
) -> Result<Advice, String> {
    if spec.memory_threshold.is_none() {
        return Err("advice sizes memory, and the group has no memory_threshold".into());
    }
    let csv = recorded::trace_csv(spec, rows, model.base_mib)?;
    let trace =
        Trace::parse(std::path::Path::new("history.csv"), &csv).map_err(|e| e.to_string())?;
    let mut sizes: Vec<f64> = SIZES
        .iter()
        .map(|f| ((model.limit_mib * f) / STEP_MIB).round() * STEP_MIB)
        .filter(|l| *l > model.base_mib + STEP_MIB)
        .collect();
    sizes.push(model.limit_mib);
    sizes.sort_by(f64::total_cmp);
    sizes.dedup();
    let candidates: Vec<Candidate> = sizes
        .iter()
        .map(|&limit_mib| {
            let m = LoadModel {
                limit_mib,
                ..*model
            };
            candidate(spec, &trace, &m, clock)
        })
        .collect();
    let current = candidates
        .iter()
        .find(|c| c.limit_mib == model.limit_mib)
        .cloned()
        .ok_or("the group's own size was not replayed")?;
    let advised = candidates
        .iter()
        .filter(|c| c.oom_s <= current.oom_s && c.overload_s <= current.overload_s)
        .min_by(|a, b| a.memory_gib_hours.total_cmp(&b.memory_gib_hours))
        .filter(|c| c.memory_gib_hours < current.memory_gib_hours * 0.99)
        .cloned()
        .unwrap_or_else(|| current.clone());
    Ok(Advice {
        group: spec.name.to_string(),
        hours: trace.seconds() as f64 / 3600.0,
        current,
        advised,
        candidates,
    })
}

#[cfg(test)]
#[path = "advise_tests.rs"]
mod tests;
