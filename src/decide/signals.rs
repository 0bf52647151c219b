//! The signals a group scales on besides memory, and how their wishes combine. Each signal
//! wants a count; the group takes the highest (the Kubernetes rule for several metrics), and a
//! signal without a reading never lowers the count.
//!
//! - **CPU**: each instance's CPU time between two passes over the time between them, in
//!   percent of the group's CPU limit; the Kubernetes rule on their mean, `ceil(n × mean /
//!   threshold)`, with the tolerance band. An instance counts from its second reading.
//! - **Pressure** (PSI "some avg10", the higher of an instance's cpu and memory pressure):
//!   pressure does not fall as instances are added the way utilization does, so it only asks
//!   for growth. Above the threshold the group grows in proportion, `ceil(n × mean /
//!   threshold)`; from half the threshold up to it, the count is held; below half, pressure
//!   asks for nothing and the other signals decide (alone, it lets the group shrink).
//! - **External**: a number a program prints; it wants `ceil(value / target)`, with the
//!   tolerance band around the count there is.

use std::collections::BTreeMap;

use tokio::time::Instant;

use crate::model::{GroupSpec, Memory, ObservedInstance, Reason, SignalState};

/// One signal's wish in one pass.
#[derive(Debug, Clone, PartialEq)]
pub struct Vote {
    pub state: SignalState,
    /// Why it wants its count.
    pub reason: Reason,
    /// Some of its readings are missing: it may hold the count, never lower it.
    pub missing: bool,
}

/// The previous CPU counter of each instance, to turn counters into rates.
#[derive(Debug, Clone, Default)]
pub struct CpuCounters {
    pub(super) last: BTreeMap<String, (u64, Instant)>,
}

impl CpuCounters {
    /// Each measured instance's CPU use since its previous reading, percent of `limit` CPUs
    /// (`None` for a first reading, or a counter that went back: a restart); remembers the
    /// readings and forgets instances no longer measured.
    pub fn rates(
        &mut self,
        readings: &[(&ObservedInstance, Memory)],
        limit: f64,
        now: Instant,
    ) -> Vec<Option<f64>> {
        let rates = readings
            .iter()
            .map(|(i, m)| {
                let (ns, (before, then)) = (m.cpu_ns?, *self.last.get(&i.name)?);
                let elapsed = now.saturating_duration_since(then).as_nanos() as f64;
                (ns >= before && elapsed > 0.0 && limit > 0.0)
                    .then(|| (ns - before) as f64 / elapsed / limit * 100.0)
            })
            .collect();
        self.last = readings
            .iter()
            .filter_map(|(i, m)| Some((i.name.clone(), (m.cpu_ns?, now))))
            .collect();
        rates
    }
}

/// The Kubernetes rule for a utilization signal: `values` are the measured instances'
/// percentages, `missing` the instances without one; the count there is `base`.
fn proportional(
    spec: &GroupSpec,
    base: u32,
    values: &[f64],
    missing: usize,
    threshold: f64,
) -> (Option<u32>, Option<f64>, bool, std::cmp::Ordering) {
    use std::cmp::Ordering;
    if values.is_empty() {
        return (None, None, missing > 0, Ordering::Equal);
    }
    let sum: f64 = values.iter().sum();
    let mean = sum / values.len() as f64;
    let ratio = mean / threshold;
    if 1.0 - spec.tolerance_down <= ratio && ratio <= 1.0 + spec.tolerance_up {
        return (Some(base), Some(mean), missing > 0, Ordering::Equal);
    }
    if missing > 0 {
        // Going down, or up only because unmeasured instances are left out: hold.
        let all = sum / (values.len() + missing) as f64 / threshold;
        if ratio < 1.0 || all <= 1.0 + spec.tolerance_up {
            return (Some(base), Some(mean), true, Ordering::Equal);
        }
    }
    let wants = count(sum / threshold);
    (Some(wants), Some(mean), missing > 0, wants.cmp(&base))
}

/// `ceil(x)` as a count, tolerant of rounding (5.0000000001 is 5).
fn count(x: f64) -> u32 {
    let c = (x - 1e-9).ceil().max(0.0);
    if c > f64::from(u32::MAX) {
        u32::MAX
    } else {
        c as u32
    }
}

fn vote(
    name: &str,
    target: f64,
    (wants, value, missing, direction): (Option<u32>, Option<f64>, bool, std::cmp::Ordering),
    up: Reason,
    down: Reason,
) -> Vote {
    use std::cmp::Ordering;
    let reason = match (wants, direction) {
        (None, _) => Reason::NoMetrics,
        (Some(_), Ordering::Greater) => up,
        (Some(_), Ordering::Less) => down,
        (Some(_), Ordering::Equal) if missing => Reason::MetricsMissing,
        (Some(_), Ordering::Equal) => Reason::WithinTolerance,
    };
    Vote {
        state: SignalState {
            name: name.to_owned(),
            value,
            target,
            wants,
        },
        reason,
        missing: missing || wants.is_none(),
    }
}

/// The CPU signal, from the measured instances' rates (`None`: no rate yet).
pub fn cpu(spec: &GroupSpec, base: u32, rates: &[Option<f64>], missing: usize) -> Option<Vote> {
    let threshold = spec.cpu_threshold?;
    let values: Vec<f64> = rates.iter().flatten().copied().collect();
    let missing = missing + rates.len() - values.len();
    Some(vote(
        "cpu",
        threshold,
        proportional(spec, base, &values, missing, threshold),
        Reason::CpuAboveThreshold,
        Reason::CpuBelowThreshold,
    ))
}

/// The pressure signal, from the measured instances' readings.
pub fn pressure(
    spec: &GroupSpec,
    base: u32,
    readings: &[(&ObservedInstance, Memory)],
    missing: usize,
) -> Option<Vote> {
    use std::cmp::Ordering;
    let threshold = spec.pressure_threshold?;
    let values: Vec<f64> = readings.iter().filter_map(|(_, m)| m.pressure).collect();
    let missing = missing + readings.len() - values.len();
    if values.is_empty() {
        return Some(vote(
            "pressure",
            threshold,
            (None, None, true, Ordering::Equal),
            Reason::PressureAboveThreshold,
            Reason::PressureBelowThreshold,
        ));
    }
    let mean = values.iter().sum::<f64>() / values.len() as f64;
    let (wants, direction) = if mean > threshold * (1.0 + spec.tolerance_up) {
        let wants = count(f64::from(base.max(1)) * mean / threshold);
        (wants, wants.cmp(&base))
    } else if mean >= threshold / 2.0 {
        (base, Ordering::Equal)
    } else {
        (0, 0.cmp(&base))
    };
    // A missing reading never lowers the count.
    let (wants, direction) = if missing > 0 && wants < base {
        (base, Ordering::Equal)
    } else {
        (wants, direction)
    };
    Some(vote(
        "pressure",
        threshold,
        (Some(wants), Some(mean), missing > 0, direction),
        Reason::PressureAboveThreshold,
        Reason::PressureBelowThreshold,
    ))
}

/// The external signals, from their values in the group's order.
pub fn external(spec: &GroupSpec, base: u32, values: &[Option<f64>]) -> Vec<Vote> {
    use std::cmp::Ordering;
    spec.external
        .iter()
        .enumerate()
        .map(|(i, e)| {
            let value = values.get(i).copied().flatten();
            let judged = match value {
                None => (None, None, true, Ordering::Equal),
                Some(v) => {
                    let ratio = v / (e.target * f64::from(base.max(1)));
                    let wants = if base > 0
                        && 1.0 - spec.tolerance_down <= ratio
                        && ratio <= 1.0 + spec.tolerance_up
                    {
                        base
                    } else {
                        count(v / e.target)
                    };
                    (Some(wants), Some(v), false, wants.cmp(&base))
                }
            };
            vote(
                &format!("external {}", i + 1),
                e.target,
                judged,
                Reason::ExternalAboveTarget,
                Reason::ExternalBelowTarget,
            )
        })
        .collect()
}

/// The group's wish from every signal's: the highest count wanted, with its reason; the count
/// there is (`base`) when a signal without a reading would let it fall, and when no signal has
/// a reading at all.
pub fn combine(votes: &[Vote], base: u32) -> (u32, Reason) {
    let best = votes
        .iter()
        .filter_map(|v| v.state.wants.map(|w| (w, v.reason)))
        .fold(None, |best: Option<(u32, Reason)>, (w, r)| match best {
            Some((b, _)) if b >= w => best,
            _ => Some((w, r)),
        });
    let Some((wants, reason)) = best else {
        return (base, Reason::NoMetrics);
    };
    if wants < base && votes.iter().any(|v| v.missing) {
        return (base, Reason::MetricsMissing);
    }
    (wants, reason)
}

#[cfg(test)]
#[path = "signals_tests.rs"]
mod tests;
