//! The windows around a recommendation: stabilization (scale-down only as low as the highest
//! recommendation of its window, scale-up only as high as the lowest of its own) and step
//! limits (how many instances a scale-up adds and a scale-down removes per `interval`, or
//! Kubernetes' default scale-up rate). Pure, like the rest of `decide`.

use tokio::time::Instant;

use super::History;
use crate::model::{GroupSpec, Policy, Reason};

/// The period of Kubernetes' default scale-up rate.
pub const K8S_RATE_PERIOD: std::time::Duration = std::time::Duration::from_secs(15);

/// Caps a change of the desired count to the group's step limits, counting the additions and
/// removals already planned during the last `interval` (so extra passes do not add up), and
/// the `leaving` instances this pass removes whatever the count (crash-looping ones, unhealthy
/// ones past their grace period); says whether it did. The step is taken from the nearer of the
/// desired count so far (`base`) and the `capacity` there is, so that the actions a pass plans
/// (the capacity brought to the desired count) stay within a step per interval even when the
/// desired count moved while nothing could be done. Without a `max_scale_up_step`, the
/// `kubernetes` policy caps scale-up as Kubernetes does by default: within 15 s, to the larger
/// of +4 and +100 % of the count at the period's start.
pub(super) fn limit_step(
    spec: &GroupSpec,
    base: u32,
    capacity: u32,
    leaving: u32,
    desired: u32,
    history: &History,
    now: Instant,
) -> (u32, bool) {
    let (added, removed) = history.acted_within(now, spec.interval);
    let (base_i, desired_i) = (i64::from(base), i64::from(desired));
    // Up from the lower of the two, down from the higher: never further than a step from
    // what runs (with what leaves in this pass: its removals count), nor than a step from
    // what was decided.
    let low = base.min(capacity);
    let high = base.max(capacity.saturating_add(leaving));
    let (low, high) = (i64::from(low), i64::from(high));
    let limited = if desired > base {
        match (spec.max_scale_up_step, spec.policy) {
            (Some(s), _) => desired_i.min((low - added + i64::from(s)).max(base_i)),
            (None, Policy::Kubernetes) => {
                let (added, _) = history.changed_within(now, K8S_RATE_PERIOD);
                let start = (low - added).max(0);
                desired_i.min((start + 4).max(2 * start).max(base_i))
            }
            (None, Policy::Adaptive) => desired_i,
        }
    } else {
        spec.max_scale_down_step.map_or(desired_i, |s| {
            desired_i.max((high + removed - i64::from(s)).min(base_i))
        })
    };
    let limited = u32::try_from(limited.max(0)).unwrap_or(u32::MAX);
    (limited, limited != desired)
}

/// Applies the stabilization windows: scale-up to the lowest, scale-down to the highest
/// recommendation seen within its window (the new one included), within `min` and `max`
/// (`spec.max`, or the count itself while it winds down to `spec.max` after a schedule window).
pub(super) fn stabilize(
    spec: &GroupSpec,
    base: u32,
    max: u32,
    recommendation: u32,
    reason: Reason,
    history: &History,
    now: Instant,
) -> (u32, Reason) {
    // A fresh history counts the desired count found at start as a recommendation (see
    // `History`): it holds back scale-down only, and only when there is a window.
    let window = match spec.policy {
        Policy::Kubernetes => spec.scale_down_stabilization,
        Policy::Adaptive => history.estimates.window(spec),
    };
    let seed = (history.is_fresh() && !window.is_zero()).then_some(base);
    let up = history
        .within(now, spec.scale_up_stabilization)
        .chain([recommendation])
        .min()
        .unwrap_or(recommendation);
    let down = history
        .within(now, window)
        .chain(seed)
        .chain([recommendation])
        .max()
        .unwrap_or(recommendation);
    let desired = if base < up {
        up
    } else if base > down {
        down
    } else {
        base
    };
    let desired = desired.clamp(spec.min, max.max(spec.min));
    let reason = if desired == base && recommendation < base {
        Reason::Stabilizing
    } else if desired == base && recommendation > base {
        Reason::StabilizingUp
    } else {
        reason
    };
    (desired, reason)
}
