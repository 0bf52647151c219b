//! What `decide` remembers about a group between passes: past recommendations (stabilization
//! windows), past changes of the desired count (step limits per interval), the desired count
//! itself, and what it tracks per instance (crashes, failed starts, unhealthy since when).
//!
//! Losing it is safe: a new history takes the current capacity as the desired count and holds
//! scale-down for a full window, so a restarted daemon never shrinks a group on its first pass.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use tokio::time::Instant;

use super::health::Tracked;
use crate::model::{GroupSpec, Note, Observation};

/// Everything `decide` keeps about one group.
#[derive(Debug, Clone, Default)]
pub struct History {
    /// (when, recommendation) within the longest stabilization window.
    recommendations: VecDeque<(Instant, u32)>,
    /// (when, change of the desired count) within the last interval.
    changes: VecDeque<(Instant, i64)>,
    /// (when, instances added, instances removed) by the scale-ups and scale-downs planned,
    /// within the last interval: what step limits bound.
    acted: VecDeque<(Instant, u32, u32)>,
    /// The desired count decided last; `None` before the first pass.
    desired: Option<u32>,
    /// Per instance, by name.
    instances: BTreeMap<String, Tracked>,
    /// What the `adaptive` policy has learned (base use, demand trend).
    pub(super) estimates: super::adaptive::Estimates,
    /// Each instance's last CPU counter, for the CPU signal's rates.
    pub(super) cpu: super::signals::CpuCounters,
}

impl History {
    /// The desired count decided last, if any.
    pub fn desired(&self) -> Option<u32> {
        self.desired
    }

    /// Nobody acted on the plan of the pass that turned `before` into this history (this
    /// daemon's lease of the group is not confirmed or not known yet, or its store is
    /// refused): what it decided is forgotten (the desired count, its changes, and the
    /// additions and removals that step limits bound), what it saw is kept (the
    /// recommendations, the estimates, the instances). So the next pass that acts does not take
    /// instances that were never created for lost ones, nor count them against a step.
    pub fn not_acted(&mut self, before: &History) {
        self.desired = before.desired;
        self.changes = before.changes.clone();
        self.acted = before.acted.clone();
    }

    /// The daemon created `name` (and started it in the same request).
    pub fn created(&mut self, name: &str) {
        self.instances.entry(name.to_owned()).or_default().created();
    }

    /// The daemon asked for `name`, and Incus did not say how its creation ended.
    pub fn creating(&mut self, name: &str, now: Instant) {
        self.instances
            .entry(name.to_owned())
            .or_default()
            .creating(now);
    }

    /// The daemon tried to start `name`; `ok` says whether it started.
    pub fn started(&mut self, spec: &GroupSpec, name: &str, ok: bool, now: Instant) {
        self.instances
            .entry(name.to_owned())
            .or_default()
            .started(spec, ok, now);
    }

    /// Takes in an observation: updates what is tracked per instance (forgetting instances that
    /// are gone) and returns what is new.
    pub(super) fn track(&mut self, spec: &GroupSpec, obs: &Observation, now: Instant) -> Vec<Note> {
        self.instances
            .retain(|name, _| obs.instances.iter().any(|i| &i.name == name));
        obs.instances
            .iter()
            .filter_map(|i| {
                self.instances
                    .entry(i.name.clone())
                    .or_default()
                    .observe(spec, i, now)
            })
            .collect()
    }

    /// What is tracked about `name` (a default for an instance seen for the first time).
    pub(super) fn tracked(&self, name: &str) -> Tracked {
        self.instances.get(name).cloned().unwrap_or_default()
    }

    /// True before the first recommendation.
    pub(super) fn is_fresh(&self) -> bool {
        self.recommendations.is_empty()
    }

    /// Recommendations made less than `window` before `now` (none for a zero window).
    pub(super) fn within(&self, now: Instant, window: Duration) -> impl Iterator<Item = u32> + '_ {
        self.recommendations
            .iter()
            .filter(move |(t, _)| now.saturating_duration_since(*t) < window)
            .map(|(_, r)| *r)
    }

    /// Instances added to and removed from the desired count less than `period` before `now`.
    pub(super) fn changed_within(&self, now: Instant, period: Duration) -> (i64, i64) {
        self.changes
            .iter()
            .filter(|(t, _)| now.saturating_duration_since(*t) < period)
            .fold((0, 0), |(up, down), (_, d)| {
                (up + d.max(&0), down + (-d).max(0))
            })
    }

    /// Instances added and removed by the scale-ups and scale-downs planned less than `period`
    /// before `now`.
    pub(super) fn acted_within(&self, now: Instant, period: Duration) -> (i64, i64) {
        self.acted
            .iter()
            .filter(|(t, _, _)| now.saturating_duration_since(*t) < period)
            .fold((0, 0), |(up, down), (_, a, r)| {
                (up + i64::from(*a), down + i64::from(*r))
            })
    }

    /// Remembers the scale-up additions and scale-down removals one pass planned.
    pub(super) fn acted(&mut self, spec: &GroupSpec, now: Instant, added: u32, removed: u32) {
        if added + removed > 0 {
            self.acted.push_back((now, added, removed));
        }
        while self
            .acted
            .front()
            .is_some_and(|(t, _, _)| now.saturating_duration_since(*t) > spec.interval)
        {
            self.acted.pop_front();
        }
    }

    /// Remembers one pass: its recommendation, and the desired count it moved from `base` to.
    pub(super) fn record(
        &mut self,
        spec: &GroupSpec,
        now: Instant,
        base: u32,
        recommendation: u32,
        desired: u32,
    ) {
        if self.recommendations.is_empty() {
            // The count found at start stands as a recommendation: no scale-down for a window.
            self.recommendations.push_back((now, base));
        }
        self.recommendations.push_back((now, recommendation));
        let keep = spec
            .scale_down_stabilization
            .max(spec.scale_up_stabilization);
        forget_older(&mut self.recommendations, now, keep);
        if desired != base {
            self.changes
                .push_back((now, i64::from(desired) - i64::from(base)));
        }
        forget_older(
            &mut self.changes,
            now,
            spec.interval.max(super::K8S_RATE_PERIOD),
        );
        self.desired = Some(desired);
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.recommendations.len() + self.changes.len() + self.acted.len()
    }
}

fn forget_older<T>(entries: &mut VecDeque<(Instant, T)>, now: Instant, keep: Duration) {
    while entries
        .front()
        .is_some_and(|(t, _)| now.saturating_duration_since(*t) > keep)
    {
        entries.pop_front();
    }
}
