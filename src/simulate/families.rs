//! A family of generated traces ([`super::generate`]) replayed with the group's own policy and
//! the two baselines, and the distribution of how it did: per trace, the **ratio** of its cost
//! to the better baseline's (the lower cost of `kubernetes` and `step`), and whether it was
//! OOM longer than that baseline; per family, the median, 95th percentile and worst ratio
//! (with its seed, to replay it), the **total**: the sum of its costs over the sum of the
//! better baselines', and the **floor**: the same sum for [`super::hindsight`], which no
//! policy's total can go below. Pure: the replays are [`super::simulate`] runs.

use serde::Serialize;

use super::generate::{self, Family};
use super::{hindsight, simulate, Clock, LoadModel, Scores, SimPolicy, Trace};
use crate::model::GroupSpec;

/// On every generated trace, the default policy's cost is at most this times the better
/// baseline's.
pub const RATIO_BOUND: f64 = 1.25;
/// Over a family, the default policy's total cost is at most this times the better baselines'.
pub const TOTAL_BOUND: f64 = 0.7;

/// One generated trace, replayed three ways.
#[derive(Debug, Clone, Serialize)]
pub struct Outcome {
    pub family: &'static str,
    pub seed: u64,
    pub default: Scores,
    pub kubernetes: Scores,
    pub step: Scores,
    /// The floor under any policy's cost on the trace ([`hindsight::floor`]; `None` for a group
    /// too large to compute it for).
    pub floor: Option<f64>,
}

impl Outcome {
    /// The baseline that cost less (`kubernetes` on a tie).
    pub fn better(&self) -> &Scores {
        if self.step.cost < self.kubernetes.cost {
            &self.step
        } else {
            &self.kubernetes
        }
    }

    /// The default policy's cost over the better baseline's (1 when both are 0).
    pub fn ratio(&self) -> f64 {
        let better = self.better().cost;
        if better > 0.0 {
            self.default.cost / better
        } else if self.default.cost > 0.0 {
            f64::INFINITY
        } else {
            1.0
        }
    }

    /// Whether the default policy was OOM longer than the better baseline.
    pub fn oom_above(&self) -> bool {
        self.default.oom_s > self.better().oom_s
    }

    /// What this trace breaks of the per-trace bounds, one sentence each (none: it holds).
    pub fn violations(&self) -> Vec<String> {
        let mut out = Vec::new();
        let better = self.better();
        if self.ratio() > RATIO_BOUND {
            out.push(format!(
                "cost {:.1} is {:.2}× the better baseline's ({} {:.1})",
                self.default.cost,
                self.ratio(),
                better.policy,
                better.cost
            ));
        }
        if self.oom_above() {
            out.push(format!(
                "{} s OOM against {} s ({})",
                self.default.oom_s, better.oom_s, better.policy
            ));
        }
        out
    }
}

/// The trace `seed` of `family` for the group `spec` under `model` (`None` for a group without
/// a memory threshold, which generated memory demand cannot drive).
pub fn trace(spec: &GroupSpec, model: &LoadModel, family: Family, seed: u64) -> Option<Vec<f64>> {
    let peak = generate::peak_mib(spec, model)?;
    Some(generate::demand(family, seed, peak))
}

/// Replays seed `seed` of `family` with the default policy and both baselines.
pub fn replay(spec: &GroupSpec, model: &LoadModel, family: Family, seed: u64) -> Option<Outcome> {
    let trace = Trace::from_demand(&trace(spec, model, family, seed)?);
    let run = |p| simulate(spec, &trace, model, p).scores;
    Some(Outcome {
        family: family.name(),
        seed,
        default: run(SimPolicy::Default),
        kubernetes: run(SimPolicy::Kubernetes),
        step: run(SimPolicy::Step),
        floor: hindsight::floor(
            spec,
            &trace,
            model,
            &Clock::new(&spec.schedule, super::start())
                .unwrap_or_else(|_| Clock::without_windows(super::start())),
        ),
    })
}

/// How the default policy did over a set of traces.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Distribution {
    /// The family's name, or `all`.
    pub family: String,
    pub traces: usize,
    pub median: f64,
    pub p95: f64,
    pub worst: f64,
    pub worst_family: String,
    pub worst_seed: u64,
    /// Σ default cost / Σ better baseline cost.
    pub total: f64,
    /// Traces on which the default policy cost more than [`RATIO_BOUND`] times the better
    /// baseline.
    pub above_bound: usize,
    /// Traces on which the default policy was OOM longer than the better baseline.
    pub oom_above: usize,
    /// Σ floor / Σ better baseline cost: no policy's `total` can be below it (`None` when a
    /// trace has no floor).
    pub floor: Option<f64>,
}

/// The distribution of `outcomes` (at least one), named `name`.
pub fn distribution(name: &str, outcomes: &[Outcome]) -> Option<Distribution> {
    let mut ratios: Vec<f64> = outcomes.iter().map(Outcome::ratio).collect();
    ratios.sort_by(f64::total_cmp);
    // Nearest rank: the smallest ratio at least p of the traces are at or under.
    let rank =
        |p: f64| ratios[((p * ratios.len() as f64).ceil() as usize).clamp(1, ratios.len()) - 1];
    let worst = outcomes
        .iter()
        .max_by(|a, b| a.ratio().total_cmp(&b.ratio()))?;
    let ours: f64 = outcomes.iter().map(|o| o.default.cost).sum();
    let better: f64 = outcomes.iter().map(|o| o.better().cost).sum();
    Some(Distribution {
        family: name.to_owned(),
        traces: outcomes.len(),
        median: rank(0.5),
        p95: rank(0.95),
        worst: worst.ratio(),
        worst_family: worst.family.to_owned(),
        worst_seed: worst.seed,
        total: if better > 0.0 { ours / better } else { 1.0 },
        above_bound: outcomes.iter().filter(|o| o.ratio() > RATIO_BOUND).count(),
        oom_above: outcomes.iter().filter(|o| o.oom_above()).count(),
        floor: outcomes
            .iter()
            .map(|o| o.floor)
            .sum::<Option<f64>>()
            .map(|f| if better > 0.0 { f / better } else { 1.0 }),
    })
}

/// Distributions as a table in the style of `incus list`.
pub fn table(rows: &[Distribution]) -> String {
    let header = [
        "FAMILY",
        "TRACES",
        "MEDIAN",
        "P95",
        "WORST",
        "WORST_SEED",
        "TOTAL",
        "ABOVE_1.25",
        "OOM_ABOVE",
        "FLOOR",
    ];
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|d| {
            let seed = if d.family == d.worst_family {
                d.worst_seed.to_string()
            } else {
                format!("{} {}", d.worst_family, d.worst_seed)
            };
            vec![
                d.family.clone(),
                d.traces.to_string(),
                format!("{:.2}", d.median),
                format!("{:.2}", d.p95),
                format!("{:.2}", d.worst),
                seed,
                format!("{:.2}", d.total),
                d.above_bound.to_string(),
                d.oom_above.to_string(),
                d.floor.map_or_else(|| "-".into(), |f| format!("{f:.2}")),
            ]
        })
        .collect();
    crate::table::render(&header, &cells)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(seed: u64, default: f64, kubernetes: f64, step: f64) -> Outcome {
        let scores = |policy: &str, cost: f64| Scores {
            policy: policy.into(),
            overload_s: 0,
            oom_s: if policy == "default" { seed % 2 } else { 0 },
            waste_instance_s: 0,
            churn: 0,
            flips: 0,
            peak: 1,
            cost,
        };
        Outcome {
            family: "steps",
            seed,
            default: scores("default", default),
            kubernetes: scores("kubernetes", kubernetes),
            step: scores("step", step),
            floor: Some(default.min(kubernetes).min(step) / 2.0),
        }
    }

    #[test]
    fn the_distribution_is_of_ratios_to_the_better_baseline() {
        // Ratios 0.5, 1, 2 (step is better there), 0.8: median 0.8, p95 and worst 2 (seed 2).
        let outcomes = [
            outcome(0, 5.0, 10.0, 20.0),
            outcome(1, 10.0, 10.0, 30.0),
            outcome(2, 20.0, 40.0, 10.0),
            outcome(3, 8.0, 10.0, 10.0),
        ];
        let d = distribution("steps", &outcomes).unwrap();
        assert_eq!((d.median, d.p95, d.worst, d.worst_seed), (0.8, 2.0, 2.0, 2));
        assert_eq!(d.total, 43.0 / 40.0);
        // Floors 2.5, 5, 5, 4.
        assert_eq!(d.floor, Some(16.5 / 40.0));
        assert_eq!((d.above_bound, d.oom_above), (1, 2));
        assert_eq!(outcomes[2].better().policy, "step");
        assert_eq!(outcomes[2].violations().len(), 1);
        assert_eq!(
            outcomes[1].violations().len(),
            1,
            "{:?}",
            outcomes[1].violations()
        );
        assert!(outcomes[0].violations().is_empty());
        assert_eq!(distribution("steps", &[]), None);
    }
}
