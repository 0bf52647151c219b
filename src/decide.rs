//! The decision core: what a group should look like, given what was observed. Pure: no IO, no
//! clock, no environment; time comes in as an argument, so every case is a unit test.
//!
//! - **Ownership** ([`ownership`]): only instances the daemon created for the group count.
//! - **Health** (`health`): healthy instances (Running, Ready) serve; stopped ones are restarted
//!   in place (with a backoff when they crash-loop or fail to start); unhealthy ones (in error, or
//!   frozen or in a transition for more than a moment) are replaced and removed after a grace
//!   period. With a `[groups.NAME.ready]` check, a running instance serves once its check
//!   passed: until then it is starting (counted, not measured); one whose checks fail after it
//!   was ready is unhealthy; one never ready within `start_timeout` is removed and replaced.
//! - **The desired count**, with `policy = "kubernetes"`, follows the Kubernetes HPA rule:
//!   `ceil(n × utilization / threshold)` over the n measured healthy instances, where
//!   utilization is their total usage over their total limits; no change while
//!   `1 − tolerance ≤ utilization / threshold ≤ 1 + tolerance`; clamped to `[min, max]`;
//!   scale-down goes only as low as the highest
//!   recommendation of its stabilization window, scale-up only as high as the lowest of its own.
//!   Missing metrics never lead to a scale-down: on the way up they count as 0 %, and if that
//!   lands within tolerance, the count is kept. Optional step limits cap how many instances
//!   are added or removed per `interval`, however many passes run (never when restoring min,
//!   or a max lowered in the file; every removal but the warm pool's counts all the same):
//!   the desired count moves at most a step away from the capacity there is, so a count that
//!   moved while nothing could be done (a pause, a standby, failed deletes) never turns into a
//!   burst of actions later; without them, scale-up is capped as Kubernetes caps it by
//!   default. With `policy = "adaptive"` (the default) the recommendation comes from
//!   [`adaptive`] instead, inside the same bounds, missing-metric guard and windows.
//! - **Schedule windows** replace min and max while open. A window's lower max is reached
//!   within the step limits; after a window that allowed more than max closes, the count
//!   winds down to max through the scale-down stabilization window and the step limits. The
//!   history tells that from a max lowered in the file (`History::allowed`).
//! - **Actions** bring the capacity (healthy and restarting instances) to the desired count.
//! - **Host headroom** (`headroom`): when the pass read the hosts' memory, the additions
//!   that would take a host below `[daemon] host_reserve` are held back (`host-headroom`), and
//!   on a cluster each new instance is placed on a member with room.

pub mod adaptive;
mod bounds;
mod forecast;
mod headroom;
mod health;
mod history;
mod hold;
mod ownership;
pub mod saved;
pub mod signals;
mod windows;

use std::cmp::Ordering;
use std::collections::HashMap;

use tokio::time::Instant;

use crate::model::{
    Action, Cause, GroupSpec, Memory, Observation, ObservedInstance, Plan, Policy, Reason,
    ScaleDownOrder, SignalState,
};
use bounds::{scheduled, Way};
use health::{out_of_service, Class};
pub use health::{
    CRASH_LIMIT, CRASH_RESET, CRASH_WINDOW, CREATING_MAX, START_FAILURE_LIMIT, UNHEALTHY_CONFIRM,
};
pub use history::History;
pub use ownership::{owner_value, ownership, Ownership};
pub use saved::Saved;
pub use windows::K8S_RATE_PERIOD;
use windows::{limit_step, stabilize};

/// Decides the plan for one group, and remembers what it needs to in `history`.
pub fn decide(spec: &GroupSpec, obs: &Observation, history: &mut History, now: Instant) -> Plan {
    let notes = history.track(spec, obs, now);
    let classes: Vec<(&ObservedInstance, Class)> = obs
        .instances
        .iter()
        .map(|i| (i, history.tracked(&i.name).class(spec, i, now)))
        .collect();
    let capacity = count(&classes, |c| c.is_capacity());
    let healthy = count(&classes, |c| c == Class::Healthy);

    // The measured healthy instances and their readings.
    let measured: Vec<(&ObservedInstance, Memory)> = classes
        .iter()
        .filter(|(_, c)| *c == Class::Healthy)
        .filter_map(|(i, _)| i.memory.filter(|m| m.limit > 0).map(|m| (*i, m)))
        .collect();
    let missing = capacity as usize - measured.len();
    let utilization = utilization(measured.iter().map(|(_, m)| m));

    let base = history.desired().unwrap_or(capacity);
    // What schedule windows let the group grow to above its own max, and it winds down from.
    let file_max = spec.max;
    let allowed = history.allowed(file_max);
    // An open schedule window replaces min (and max) for as long as it is open.
    let scheduled = scheduled(spec, obs.window);
    let spec = scheduled.as_ref().unwrap_or(spec);
    let mut votes = Vec::new();
    if let Some(threshold) = spec.memory_threshold {
        let k8s = recommend(spec, threshold, base, utilization, measured.len(), missing);
        let (wants, reason) = match spec.policy {
            Policy::Kubernetes => k8s,
            Policy::Adaptive => recommend_adaptive(
                spec,
                threshold,
                obs,
                &measured,
                utilization,
                base,
                k8s,
                missing,
                history,
                now,
            ),
        };
        votes.push(signals::Vote {
            state: SignalState {
                name: "memory".into(),
                value: utilization,
                target: threshold,
                wants: (reason != Reason::NoMetrics).then_some(wants),
            },
            reason,
            missing: matches!(reason, Reason::NoMetrics | Reason::MetricsMissing),
        });
    }
    let rates = history
        .cpu
        .rates(&measured, spec.cpu_limit.unwrap_or(0.0), now);
    votes.extend(signals::cpu(spec, base, &rates, missing));
    votes.extend(signals::pressure(spec, base, &measured, missing));
    votes.extend(signals::external(spec, base, &obs.external));
    // Outside the bounds in force, the bound is the recommendation, whatever the signals.
    let window_min = scheduled.is_some() && obs.window.and_then(|w| w.min).is_some();
    let (recommendation, reason, way) = bounds::outside(spec, file_max, allowed, base, window_min)
        .unwrap_or_else(|| {
            let (wants, reason) = signals::combine(&votes, base);
            (wants.clamp(spec.min, spec.max), reason, Way::Signals)
        });
    let signals: Vec<SignalState> = votes.into_iter().map(|v| v.state).collect();
    // What this pass removes whatever the count: its removals count in the step
    // (crash-looping and expired unhealthy instances, as `actions` removes them).
    let leaving = classes
        .iter()
        .filter(|(i, c)| {
            !i.protected && matches!(c, Class::Retire | Class::Expired | Class::NeverReady)
        })
        .count() as u32;
    let step = |desired| limit_step(spec, base, capacity, leaving, desired, history, now);
    let (desired, reason, step_limited) = match way {
        Way::AtOnce => (recommendation, reason, false),
        Way::Stepped => {
            let (desired, limited) = step(recommendation);
            (desired, reason, limited)
        }
        Way::WindDown => {
            let (held, _) = stabilize(spec, base, base, recommendation, reason, history, now);
            let (desired, limited) = step(held);
            (desired, reason, limited)
        }
        Way::Signals => {
            let (desired, reason) =
                stabilize(spec, base, spec.max, recommendation, reason, history, now);
            let (desired, limited) = step(desired);
            (desired, reason, limited)
        }
    };
    history.record(spec, now, base, recommendation, desired);
    history.bounded(file_max, spec.max, allowed, base.max(desired));
    let (actions, protected) = actions(spec, &classes, base, capacity, desired, reason);
    let (actions, headroom) = headroom::cap(spec, obs, actions, healthy);
    if !spec.paused {
        // What step limits count: instances brought in (replacements too: a step is about
        // how fast the group changes) and every removal but the warm pool's, whatever its
        // reason (one that restores a max lowered in the file too, though no step holds it).
        let added = actions
            .iter()
            .filter(|a| matches!(a, Action::Create { .. } | Action::Promote { .. }))
            .count() as u32;
        let removed = actions
            .iter()
            .filter(|a| matches!(a, Action::Remove { .. }) && a.cause() != Cause::WarmPool)
            .count() as u32;
        history.acted(spec, now, added, removed);
    }
    // A scale-down that protected instances cut short says so.
    let reason = if protected > 0 {
        Reason::Protected
    } else {
        reason
    };
    // So does one the hosts' memory held back.
    let reason = if headroom.as_ref().is_some_and(|h| h.held > 0) {
        Reason::HostHeadroom
    } else {
        reason
    };
    // A paused group is decided and reported as usual, and nothing is done.
    let actions = if spec.paused { Vec::new() } else { actions };

    let requeue_in = classes
        .iter()
        .filter_map(|(_, c)| match c {
            Class::Waiting { until, .. } => Some(*until),
            Class::Unhealthy { since } => since.checked_add(spec.unhealthy_grace),
            Class::Suspect { since } => since.checked_add(UNHEALTHY_CONFIRM),
            Class::Unreachable { since } => since.checked_add(spec.unhealthy_grace),
            Class::Creating { until } => Some(*until),
            Class::Failing { retry } => *retry,
            _ => None,
        })
        .min()
        .map(|t| t.saturating_duration_since(now));
    // Instances their checks took out of service are counted apart from the unhealthy ones.
    let not_ready = classes
        .iter()
        .filter(|(i, c)| c.is_unhealthy() && out_of_service(i))
        .count() as u32;
    Plan {
        current: capacity,
        healthy,
        unhealthy: count(&classes, |c| c.is_unhealthy()) - not_ready,
        starting: count(&classes, |c| c == Class::Starting),
        not_ready,
        instances: obs.instances.iter().map(Into::into).collect(),
        warm: count(&classes, |c| c == Class::Warm),
        failing: classes
            .iter()
            .filter(|(_, c)| matches!(c, Class::Failing { .. }))
            .map(|(i, _)| i.name.clone())
            .collect(),
        previous: base,
        desired,
        utilization,
        signals,
        recommendation,
        reason,
        step_limited,
        actions,
        protected,
        paused: spec.paused,
        notes,
        requeue_in,
        headroom,
        hold: (spec.policy == Policy::Adaptive).then(|| history.estimates.learned(spec)),
    }
}

/// The `adaptive` recommendation for the `measured` instances at `utilization`. Bounds, no
/// metrics and a missing metric on the way down (`k8s`, the Kubernetes rule's verdict) decide
/// as they always do, and a missing metric never lets it scale down either.
#[allow(clippy::too_many_arguments)]
fn recommend_adaptive(
    spec: &GroupSpec,
    threshold: f64,
    obs: &Observation,
    measured: &[(&ObservedInstance, Memory)],
    utilization: Option<f64>,
    base: u32,
    k8s: (u32, Reason),
    missing: usize,
    history: &mut History,
    now: Instant,
) -> (u32, Reason) {
    let killed = history.estimates.oom_killed(
        obs.instances
            .iter()
            .map(|i| (i.name.as_str(), i.memory.and_then(|m| m.oom_kills))),
    );
    let Some(utilization) = utilization else {
        return k8s;
    };
    if let (_, Reason::BelowMin | Reason::AboveMax | Reason::NoMetrics | Reason::MetricsMissing) =
        k8s
    {
        return k8s;
    }
    let readings: Vec<adaptive::Reading> = measured
        .iter()
        .map(|(i, memory)| adaptive::Reading {
            memory: *memory,
            since_start: i.since_start,
            oom_killed: killed.contains(&i.name.as_str()),
        })
        .collect();
    let (r, why) = adaptive::recommend(
        spec,
        threshold,
        base,
        &readings,
        utilization,
        &mut history.estimates,
        now,
    );
    if missing > 0 && r < base {
        (base, Reason::MetricsMissing)
    } else {
        (r, why)
    }
}

/// Total usage over total limits, percent, as Kubernetes computes utilization: instances with
/// bigger limits weigh more (the mean of per-instance percentages would not, and the two differ
/// as soon as limits differ). A reading above its limit counts at the limit.
fn utilization<'a>(measured: impl Iterator<Item = &'a Memory>) -> Option<f64> {
    let (used, limits) = measured.fold((0u128, 0u128), |(u, l), m| {
        (
            u + u128::from(m.usage.min(m.limit)),
            l + u128::from(m.limit),
        )
    });
    (limits > 0).then(|| used as f64 * 100.0 / limits as f64)
}

fn count(classes: &[(&ObservedInstance, Class)], f: impl Fn(Class) -> bool) -> u32 {
    classes.iter().filter(|(_, c)| f(*c)).count() as u32
}

/// The recommendation before stabilization, and why. `base` is the desired count so far.
fn recommend(
    spec: &GroupSpec,
    threshold: f64,
    base: u32,
    utilization: Option<f64>,
    measured: usize,
    missing: usize,
) -> (u32, Reason) {
    if base < spec.min {
        return (spec.min, Reason::BelowMin);
    }
    if base > spec.max {
        return (spec.max, Reason::AboveMax);
    }
    let Some(utilization) = utilization else {
        return (base, Reason::NoMetrics);
    };
    let ratio = utilization / threshold;
    // Σ of per-instance percentages at that utilization.
    let sum = utilization * measured as f64;
    // The band as Kubernetes tests it: `|ratio − 1| <= tolerance` would be false at exactly
    // +10 % through rounding (55/50 − 1 is 0.10000000000000009).
    if 1.0 - spec.tolerance_down <= ratio && ratio <= 1.0 + spec.tolerance_up {
        return (base, Reason::WithinTolerance);
    }
    if missing > 0 {
        if ratio < 1.0 {
            return (base, Reason::MetricsMissing);
        }
        // Count every unmeasured instance as 0 % and check the direction again.
        let ratio_all = sum / (measured + missing) as f64 / threshold;
        if ratio_all <= 1.0 + spec.tolerance_up {
            return (base, Reason::MetricsMissing);
        }
    }
    // ceil(n × mean / threshold) == ceil(Σ / threshold); the epsilon keeps 5.0000000001 at 5.
    let raw = (sum / threshold - 1e-9).ceil().max(0.0);
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

/// Turns classes and counts into steps: starts of stopped instances; promotions of warm
/// instances, then creations, up to the desired count; removals down to it (restartable stopped
/// instances and starting ones first, as Kubernetes removes pods that are not ready first, then
/// healthy ones in the group's `scale_down_order`; never one whose start failed, never a
/// protected one); removals of instances that crashed too often, stayed unhealthy too long or
/// were never ready (unless protected); and, last, the warm pool brought back to its size.
/// Starts and creations come first: they restore service. Also returns how many removals
/// protection prevented.
fn actions(
    spec: &GroupSpec,
    classes: &[(&ObservedInstance, Class)],
    base: u32,
    capacity: u32,
    desired: u32,
    reason: Reason,
) -> (Vec<Action>, u32) {
    let mut removed: Vec<(&str, Cause)> = Vec::new();
    let mut protected = 0;
    if capacity > desired {
        let cause = match reason {
            Reason::AboveMax => Cause::AboveMax,
            _ if desired < base => Cause::ScaleDown,
            _ => Cause::Surplus,
        };
        let removable: Vec<_> = classes
            .iter()
            .filter(|(_, c)| c.is_capacity() && !c.keep())
            .collect();
        // Instances not in service yet (stopped, starting) go before those that serve.
        let rank = |c: &Class| u8::from(*c == Class::Healthy);
        let mut order: Vec<_> = removable
            .iter()
            .filter(|(i, _)| !i.protected)
            .map(|(i, c)| (*i, rank(c)))
            .collect();
        order.sort_by(|(a, ra), (b, rb)| ra.cmp(rb).then_with(|| removal_order(spec, a, b)));
        let n = (capacity - desired) as usize;
        protected = (n.min(removable.len()) - n.min(order.len())) as u32;
        let mut load: HashMap<&str, usize> = HashMap::new();
        for (i, _) in classes.iter().filter(|(_, c)| c.is_capacity()) {
            *load.entry(i.location.as_str()).or_default() += 1;
        }
        removed.extend(
            spread(order, n, load)
                .into_iter()
                .map(|i| (i.name.as_str(), cause)),
        );
    }
    for (i, c) in classes.iter().filter(|(i, _)| !i.protected) {
        match c {
            Class::Retire => removed.push((&i.name, Cause::CrashLoop)),
            Class::Expired => removed.push((&i.name, Cause::Unhealthy)),
            Class::NeverReady => removed.push((&i.name, Cause::NeverReady)),
            _ => {}
        }
    }

    let mut actions: Vec<Action> = classes
        .iter()
        .filter_map(|(i, c)| match c {
            Class::StartNow(cause) if !removed.iter().any(|(n, _)| *n == i.name) => {
                Some(Action::Start {
                    name: i.name.clone(),
                    cause: *cause,
                })
            }
            Class::Failing { retry: None } => Some(Action::Start {
                name: i.name.clone(),
                cause: Cause::StartRetry,
            }),
            _ => None,
        })
        .collect();
    // The warm pool, oldest first: a start instead of an image unpack.
    let mut warm: Vec<&ObservedInstance> = classes
        .iter()
        .filter(|(_, c)| *c == Class::Warm)
        .map(|(i, _)| *i)
        .collect();
    warm.sort_by(|a, b| a.created_at.cmp(&b.created_at).then(a.name.cmp(&b.name)));
    let mut warm = warm.into_iter();
    let missing = desired.saturating_sub(capacity);
    let replacing = base.saturating_sub(capacity).min(missing);
    for k in 0..missing {
        let cause = match reason {
            Reason::BelowMin => Cause::BelowMin,
            _ if k < replacing => Cause::Replace,
            _ => Cause::ScaleUp,
        };
        actions.push(match warm.next() {
            Some(w) => Action::Promote {
                name: w.name.clone(),
                cause,
            },
            None => Action::Create {
                cause,
                target: None,
            },
        });
    }
    actions.extend(removed.into_iter().map(|(name, cause)| Action::Remove {
        name: name.to_owned(),
        cause,
    }));
    // The pool back to its size, after everything else: the oldest extra ones go.
    let left: Vec<&ObservedInstance> = warm.collect();
    let size = spec.warm_pool as usize;
    actions.extend(
        left.iter()
            .rev()
            .skip(size)
            .filter(|w| !w.protected)
            .map(|w| Action::Remove {
                name: w.name.clone(),
                cause: Cause::WarmPool,
            }),
    );
    actions.extend((left.len()..size).map(|_| Action::CreateWarm { target: None }));
    (actions, protected)
}

/// Takes `n` of `order` (sorted by rank, then by the group's `scale_down_order`), each from
/// the cluster member that holds the most of the group's instances (`load`) among those of the
/// best rank left, ties in `order`'s order: a group scaled down stays spread over the members.
/// Without a cluster (every location empty) this is the first `n`.
fn spread<'a>(
    mut order: Vec<(&'a ObservedInstance, u8)>,
    n: usize,
    mut load: HashMap<&'a str, usize>,
) -> Vec<&'a ObservedInstance> {
    let mut out = Vec::with_capacity(n);
    while out.len() < n && !order.is_empty() {
        let at = |i: &ObservedInstance| load.get(i.location.as_str()).copied().unwrap_or(0);
        let best = (0..order.len())
            .min_by_key(|&k| (order[k].1, std::cmp::Reverse(at(order[k].0)), k))
            .expect("not empty");
        let (chosen, _) = order.remove(best);
        if let Some(l) = load.get_mut(chosen.location.as_str()) {
            *l = l.saturating_sub(1);
        }
        out.push(chosen);
    }
    out
}

/// Which of two healthy instances a scale-down removes first (`Less`: `a`), by the group's
/// `scale_down_order`; ties go to the newest, then to the name, so that it is deterministic.
fn removal_order(spec: &GroupSpec, a: &ObservedInstance, b: &ObservedInstance) -> Ordering {
    let newest = b.created_at.cmp(&a.created_at).then(b.name.cmp(&a.name));
    match spec.scale_down_order {
        ScaleDownOrder::Newest => newest,
        ScaleDownOrder::Oldest => a.created_at.cmp(&b.created_at).then(a.name.cmp(&b.name)),
        ScaleDownOrder::LeastMemory => {
            // Unmeasured instances last: nothing says they are idle.
            let used =
                |i: &ObservedInstance| i.memory.and_then(|m| m.percent()).unwrap_or(f64::INFINITY);
            used(a).total_cmp(&used(b)).then(newest)
        }
    }
}

#[cfg(test)]
mod adaptive_tests;
#[cfg(test)]
mod bounds_tests;
#[cfg(test)]
mod conformance;
#[cfg(test)]
mod headroom_tests;
#[cfg(test)]
mod health_tests;
#[cfg(test)]
mod ready_tests;
#[cfg(test)]
mod step_tests;
#[cfg(test)]
pub(crate) mod tests;
