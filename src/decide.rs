//! The decision core: what a group should look like, given what was observed. Pure: no IO, no
//! clock, no environment; time comes in as an argument, so every case is a unit test.
//!
//! The rule is the Kubernetes HPA one: `desired = ceil(current × utilization / threshold)`, no
//! change while `|utilization / threshold − 1| ≤ tolerance`, clamped to `[min, max]`; scale-down
//! takes the highest recommendation seen during the stabilization window. Missing metrics never
//! lead to a scale-down: on the way up they count as 0 %, and if that flips the direction or lands
//! within tolerance, the count is kept. Optional step limits cut how many instances one pass
//! adds or removes (never when restoring `min` or `max`).

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

use crate::model::{Action, GroupSpec, InstanceStatus, Observation, Plan, Reason};

/// Past recommendations of one group, for stabilization. Losing it is safe: a new history is
/// seeded with the current count, so a restarted daemon waits a full window before scaling down.
#[derive(Debug, Clone, Default)]
pub struct History {
    entries: VecDeque<(Instant, u32)>,
}

impl History {
    /// Remembers a plan's recommendation at `now`, forgetting what is older than `keep`.
    pub fn record(&mut self, now: Instant, plan: &Plan, keep: Duration) {
        if self.entries.is_empty() {
            self.entries.push_back((now, plan.current));
        }
        self.entries.push_back((now, plan.recommendation));
        while let Some((t, _)) = self.entries.front() {
            if now.saturating_duration_since(*t) > keep {
                self.entries.pop_front();
            } else {
                break;
            }
        }
    }

    /// Recommendations made less than `window` before `now` (none for a zero window).
    fn within(&self, now: Instant, window: Duration) -> impl Iterator<Item = u32> + '_ {
        self.entries
            .iter()
            .filter(move |(t, _)| now.saturating_duration_since(*t) < window)
            .map(|(_, r)| *r)
    }
}

/// Decides the plan for one group. `history` holds earlier recommendations (see [`History`]).
pub fn decide(spec: &GroupSpec, obs: &Observation, history: &History, now: Instant) -> Plan {
    let current = obs.instances.len() as u32;
    let measured: Vec<f64> = obs
        .instances
        .iter()
        .filter(|i| i.status == InstanceStatus::Running)
        .filter_map(|i| i.memory.and_then(|m| m.percent()))
        .collect();
    let missing = obs.instances.len() - measured.len();
    let sum: f64 = measured.iter().sum();
    let utilization = (!measured.is_empty()).then(|| sum / measured.len() as f64);

    let (recommendation, reason) = recommend(spec, current, utilization, sum, missing);

    let (desired, reason, step_limited) = match reason {
        // Bounds are restored at once; only metric-driven changes are stabilized and stepped.
        Reason::BelowMin | Reason::AboveMax => (recommendation, reason, false),
        _ => {
            let (desired, reason) = stabilize(spec, current, recommendation, reason, history, now);
            let (desired, step_limited) = limit_step(spec, current, desired);
            (desired, reason, step_limited)
        }
    };

    Plan {
        current,
        desired,
        utilization,
        recommendation,
        reason,
        step_limited,
        actions: actions(obs, current, desired),
    }
}

/// Cuts a change to the group's step limits; says whether it did.
fn limit_step(spec: &GroupSpec, current: u32, desired: u32) -> (u32, bool) {
    let limited = if desired > current {
        spec.max_scale_up_step
            .map_or(desired, |s| desired.min(current.saturating_add(s)))
    } else {
        spec.max_scale_down_step
            .map_or(desired, |s| desired.max(current.saturating_sub(s)))
    };
    (limited, limited != desired)
}

/// The recommendation before stabilization, and why.
fn recommend(
    spec: &GroupSpec,
    current: u32,
    utilization: Option<f64>,
    sum: f64,
    missing: usize,
) -> (u32, Reason) {
    if current < spec.min {
        return (spec.min, Reason::BelowMin);
    }
    if current > spec.max {
        return (spec.max, Reason::AboveMax);
    }
    let Some(utilization) = utilization else {
        return (current, Reason::NoMetrics);
    };
    let ratio = utilization / spec.memory_threshold;
    if (ratio - 1.0).abs() <= spec.tolerance {
        return (current, Reason::WithinTolerance);
    }
    if missing > 0 {
        if ratio < 1.0 {
            return (current, Reason::MetricsMissing);
        }
        // Count every unmeasured instance as 0 % and check the direction again.
        let ratio_all = sum / f64::from(current) / spec.memory_threshold;
        if ratio_all <= 1.0 + spec.tolerance {
            return (current, Reason::MetricsMissing);
        }
    }
    // ceil(current × mean / threshold) == ceil(sum / threshold); the epsilon keeps 5.0000000001 at 5.
    let raw = (sum / spec.memory_threshold - 1e-9).ceil().max(0.0);
    let raw = if raw > f64::from(u32::MAX) {
        u32::MAX
    } else {
        raw as u32
    };
    let reason = if ratio > 1.0 {
        Reason::AboveThreshold
    } else {
        Reason::BelowThreshold
    };
    (raw.clamp(spec.min, spec.max), reason)
}

/// Applies the stabilization windows: scale-up to the lowest, scale-down to the highest
/// recommendation seen within its window (the new one included).
fn stabilize(
    spec: &GroupSpec,
    current: u32,
    recommendation: u32,
    reason: Reason,
    history: &History,
    now: Instant,
) -> (u32, Reason) {
    // An empty history is seeded with the current count (see `History`): it holds back
    // scale-down only.
    let seed = history.entries.is_empty().then_some(current);
    let up = history
        .within(now, spec.scale_up_stabilization)
        .chain([recommendation])
        .min()
        .unwrap_or(recommendation);
    let down = history
        .within(now, spec.scale_down_stabilization)
        .chain(seed)
        .chain([recommendation])
        .max()
        .unwrap_or(recommendation);
    let desired = if current < up {
        up
    } else if current > down {
        down
    } else {
        current
    };
    let desired = desired.clamp(spec.min, spec.max);
    let reason = if desired == current && recommendation < current {
        Reason::Stabilizing
    } else if desired == current && recommendation > current {
        Reason::StabilizingUp
    } else {
        reason
    };
    (desired, reason)
}

/// Turns a count into steps: creations, restarts of stopped instances, removals (stopped ones
/// first, then the newest).
fn actions(obs: &Observation, current: u32, desired: u32) -> Vec<Action> {
    let mut actions = Vec::new();
    let mut removed = Vec::new();
    if desired < current {
        let mut order: Vec<_> = obs.instances.iter().collect();
        order.sort_by(|a, b| {
            let rank = |s: InstanceStatus| match s {
                InstanceStatus::Stopped => 0,
                InstanceStatus::Other => 1,
                InstanceStatus::Running => 2,
            };
            rank(a.status)
                .cmp(&rank(b.status))
                .then(b.created_at.cmp(&a.created_at))
                .then(b.name.cmp(&a.name))
        });
        for inst in order.into_iter().take((current - desired) as usize) {
            removed.push(inst.name.as_str());
            actions.push(Action::Remove {
                name: inst.name.clone(),
            });
        }
    }
    for inst in &obs.instances {
        if inst.status == InstanceStatus::Stopped && !removed.contains(&inst.name.as_str()) {
            actions.push(Action::Start {
                name: inst.name.clone(),
            });
        }
    }
    for _ in current..desired {
        actions.push(Action::Create);
    }
    actions
}

#[cfg(test)]
mod tests;
