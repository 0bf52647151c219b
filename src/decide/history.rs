//! What `decide` remembers about a group between passes: past recommendations (stabilization
//! windows), past changes of the desired count (step limits per interval), the desired count
//! itself, the bounds a schedule window allowed (so that its end is gradual), and what it
//! tracks per instance (crashes, failed starts, unhealthy since when).
//!
//! Losing it is safe: a new history takes the current capacity as the desired count and holds
//! scale-down for a full window, so a restarted daemon never shrinks a group on its first pass.
//! Only a count above `max` is then restored at once, even one a schedule window allowed: a
//! new history cannot tell a window that closed from a `max` lowered in the file.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use tokio::time::Instant;

use super::health::Tracked;
use crate::model::{GroupSpec, Note, Observation};

/// Everything `decide` keeps about one group.
#[derive(Debug, Clone, Default)]
pub struct History {
    /// (when, recommendation) within the longest stabilization window.
    pub(super) recommendations: VecDeque<(Instant, u32)>,
    /// (when, change of the desired count) within the last interval.
    pub(super) changes: VecDeque<(Instant, i64)>,
    /// (when, instances added, instances removed) by the scale-ups and scale-downs planned,
    /// within the last interval: what step limits bound.
    pub(super) acted: VecDeque<(Instant, u32, u32)>,
    /// The desired count decided last; `None` before the first pass.
    pub(super) desired: Option<u32>,
    /// The `max` bounds of the last pass; `None` before the first pass.
    pub(super) bounds: Option<Bounds>,
    /// Per instance, by name.
    pub(super) instances: BTreeMap<String, Tracked>,
    /// What the `adaptive` policy has learned (base use, demand trend).
    pub(super) estimates: super::adaptive::Estimates,
    /// Each instance's last CPU counter, for the CPU signal's rates.
    pub(super) cpu: super::signals::CpuCounters,
}

/// What a pass leaves for the next one to tell a schedule window that closed above `max`
/// from a `max` lowered in the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Bounds {
    /// The group's own `max`, from the file.
    pub(super) file_max: u32,
    /// The highest count the group may wind down from gradually: the `max` in force (a
    /// window's, or the file's), or, after a window that allowed more closed, the count the
    /// group has wound down to since.
    pub(super) ceiling: u32,
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
    /// recommendations, the estimates, the instances, the bounds schedule windows allowed). So
    /// the next pass that acts does not take instances that were never created for lost ones,
    /// nor count them against a step, and still winds down gradually what a window allowed.
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

    /// The highest count above the `max` in force that goes down gradually (through the
    /// scale-down stabilization window and the step limits) rather than at once: what schedule
    /// windows allowed and the group has not wound down from yet, while the file's `max`
    /// (`file_max`) has not been lowered since the last pass; else `file_max`, restored at once.
    pub(super) fn allowed(&self, file_max: u32) -> u32 {
        match self.bounds {
            Some(b) if b.file_max <= file_max => b.ceiling.max(file_max),
            _ => file_max,
        }
    }

    /// Remembers the bounds of one pass: the file's `max`, the `max` in force, what
    /// [`History::allowed`] said, and `count`, the higher of the desired counts the pass
    /// started from and went to (the higher, so that a pass nobody acted on, a standby's,
    /// never lowers the ceiling below the instances there are).
    pub(super) fn bounded(&mut self, file_max: u32, in_force: u32, allowed: u32, count: u32) {
        self.bounds = Some(Bounds {
            file_max,
            ceiling: in_force.max(allowed.min(count)),
        });
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
