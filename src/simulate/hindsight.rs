//! The floor under every policy's cost on a memory trace: the cost of the best count schedule
//! chosen with the whole trace known in advance. Pure.
//!
//! Hindsight moves the count every second, to any value within the bounds in force, and its
//! new instances are ready at once (no warmup, so they are never waste while they start); it
//! pays the run's costs otherwise ([`super::simulate`]): per second, 1 overloaded, 10 more
//! OOM, 1/60 per instance above the ideal count, and 2 per instance created or removed. No
//! policy, which knows only the past and decides at its passes, can cost less, so a family
//! whose floor is above a bound tells that the bound cannot be met there; how far a policy is
//! above the floor tells how much is left to learn. A dynamic program over (span, count), a
//! span being seconds over which nothing changes: O(rows × counts), computed for groups of at
//! most [`MOST_COUNTS`] counts.

use super::clock::Clock;
use super::{bounds, cost, memory_overloaded, utilization, LoadModel, Trace};
use crate::model::GroupSpec;

/// The widest range of counts (`max` + 1, windows' included) the floor is computed for.
pub const MOST_COUNTS: u32 = 101;

/// The floor of `trace`'s cost for the group `spec` under `model`, with the group's schedule
/// windows evaluated on `clock`; `None` for a group with more than [`MOST_COUNTS`] counts.
pub fn floor(spec: &GroupSpec, trace: &Trace, model: &LoadModel, clock: &Clock) -> Option<f64> {
    let seconds = trace.seconds();
    let (limit, base) = (model.limit_mib, model.base_mib.min(model.limit_mib));
    let threshold = spec.memory_threshold.unwrap_or(100.0);
    let per_instance = (threshold / 100.0 * limit - base).max(f64::MIN_POSITIVE);

    // The spans of seconds over which neither the demand nor the bounds in force change (as
    // the run applies them): within one, a schedule that changes the count does best to
    // change it at the span's start, so the program steps span by span.
    let mut spans: Vec<(u64, u64, (u32, u32))> = Vec::new();
    let mut rows = trace.changes().peekable();
    let (mut t, mut wake, mut range) = (0, Some(0), bounds(spec, None));
    while t < seconds {
        if wake.is_some_and(|w| t >= w) {
            let (open, next) = clock.at(t);
            (wake, range) = (next, bounds(spec, open));
        }
        while rows.next_if(|r| *r <= t).is_some() {}
        let end = [rows.peek().copied(), wake, Some(seconds)]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(seconds)
            .clamp(t + 1, seconds);
        spans.push((t, end, range));
        t = end;
    }
    let top = spans
        .iter()
        .map(|(_, _, (_, max))| *max)
        .max()
        .unwrap_or(spec.max);
    if top >= MOST_COUNTS {
        return None;
    }

    let counts = top as usize + 1;
    // least[n]: the least cost of the seconds so far, ending with n instances.
    let mut least = vec![f64::INFINITY; counts];
    least[(spec.min as usize).min(top as usize)] = 0.0;
    let change = cost(0.0, 0.0, 0.0, 1.0);
    for (start, end, (min, max)) in spans {
        // Any change, at its cost per instance created or removed.
        for n in 1..counts {
            least[n] = least[n].min(least[n - 1] + change);
        }
        for n in (0..counts - 1).rev() {
            least[n] = least[n].min(least[n + 1] + change);
        }
        let demand = trace.demand(start as f64);
        let ideal = ((demand / per_instance).ceil() as u32).clamp(min, max);
        let long = (end - start) as f64;
        for (n, c) in least.iter_mut().enumerate() {
            let count = n as u32;
            if count < min || count > max {
                *c = f64::INFINITY;
                continue;
            }
            let utilization = utilization(demand, n, limit, base);
            let overloaded = memory_overloaded(n, utilization, threshold);
            let oom = utilization >= 100.0;
            *c += cost(
                f64::from(u8::from(oom)) * long,
                f64::from(u8::from(overloaded)) * long,
                f64::from(count.saturating_sub(ideal)) * long,
                0.0,
            );
        }
    }
    least.into_iter().reduce(f64::min).filter(|c| c.is_finite())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::simulate::{simulate, SimPolicy};

    fn model() -> LoadModel {
        LoadModel {
            limit_mib: 64.0,
            base_mib: 4.0,
            warmup: Duration::from_secs(2),
        }
    }

    /// min 1, max 10, threshold 60 %: 34.4 MiB per instance at the threshold.
    fn spec() -> GroupSpec {
        GroupSpec {
            policy: crate::model::Policy::Adaptive,
            ..crate::decide::tests::spec(1, 10, 60.0)
        }
    }

    fn floor_of(trace: &Trace) -> f64 {
        floor(
            &spec(),
            trace,
            &model(),
            &Clock::without_windows(crate::simulate::start()),
        )
        .unwrap()
    }

    #[test]
    fn the_floor_pays_only_what_no_schedule_avoids() {
        // Within one instance's share for ten minutes: nothing to pay.
        assert_eq!(floor_of(&Trace::from_demand(&[20.0; 600])), 0.0);
        // A step to 3 instances' worth for ten minutes: two creations (and no removal: the
        // run ends), ready at once.
        let step: Vec<f64> = [20.0; 300].into_iter().chain([100.0; 600]).collect();
        assert_eq!(floor_of(&Trace::from_demand(&step)), 4.0);
        // A spike of 5 s to 3 instances' worth, back to 1: riding it overloaded (5 s above
        // 1.1 × the threshold, OOM too at 100 MiB on one instance: 55) costs more than two
        // creations and two removals (8).
        let spike: Vec<f64> = [20.0; 300]
            .into_iter()
            .chain([100.0; 5])
            .chain([20.0; 300])
            .collect();
        assert_eq!(floor_of(&Trace::from_demand(&spike)), 8.0);
        // A 1-second blip to just above the tolerance: cheaper to ride it (1) than to add an
        // instance and remove it (4).
        let blip: Vec<f64> = [30.0; 300]
            .into_iter()
            .chain([40.0])
            .chain([30.0; 300])
            .collect();
        assert_eq!(floor_of(&Trace::from_demand(&blip)), 1.0);
    }

    #[test]
    fn no_policy_costs_less_than_the_floor() {
        let spec = spec();
        for family in crate::simulate::generate::Family::ALL {
            for seed in 0..3 {
                let demand = super::super::families::trace(&spec, &model(), family, seed).unwrap();
                let trace = Trace::from_demand(&demand);
                let floor = floor_of(&trace);
                for policy in [SimPolicy::Default, SimPolicy::Kubernetes, SimPolicy::Step] {
                    let run = simulate(&spec, &trace, &model(), policy).scores;
                    assert!(
                        floor <= run.cost + 1e-6,
                        "{} {seed}: {policy:?} {} < floor {floor}",
                        family.name(),
                        run.cost
                    );
                }
            }
        }
    }
}
