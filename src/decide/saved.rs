//! A group's [`History`] as data that outlives the process: [`Saved`], which the history store
//! (`crate::history`) writes to disk and reads back when the daemon starts, so that a restarted
//! daemon decides as the one before it would have. Pure, like the rest of `decide`: every time
//! is kept as an offset from the moment of saving (nanoseconds before it; negative for a
//! deadline after it), and turned back into the clock of the process that reads it.
//!
//! What a history saved longer ago than the group's scale-down window says of the count (the
//! recommendations, the changes step limits count, the desired count) is not taken back: the
//! group starts from the count it finds, as with a new history. What the `adaptive` policy
//! learned is always taken back; each of its memories forgets its old samples as it would have.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use super::adaptive::Estimates;
use super::forecast::Period;
use super::health::Tracked;
use super::history::{Bounds, History};
use super::hold::{Gap, Hold};
use super::signals::CpuCounters;
use crate::model::{Forecast, GroupSpec};

/// The version of [`Saved`] this build writes and reads.
pub const VERSION: u32 = 1;

/// Nanoseconds before the moment of saving (negative: after it).
type Ago = i64;

/// Everything [`History`] keeps, with its times as offsets from the moment of saving.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Saved {
    pub version: u32,
    recommendations: Vec<(Ago, u32)>,
    changes: Vec<(Ago, i64)>,
    acted: Vec<(Ago, u32, u32)>,
    desired: Option<u32>,
    /// (file_max, ceiling).
    bounds: Option<(u32, u32)>,
    instances: BTreeMap<String, SavedTracked>,
    estimates: SavedEstimates,
    /// Per instance: (CPU counter, when it was read).
    cpu: BTreeMap<String, (u64, Ago)>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct SavedTracked {
    ran: bool,
    crashes: u32,
    start_failures: u32,
    retry_at: Option<Ago>,
    unhealthy_since: Option<Ago>,
    reported: bool,
    creating_until: Option<Ago>,
    failing_said: bool,
    not_ready_since: Option<Ago>,
    not_ready_said: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct SavedEstimates {
    hold_away: Vec<(u32, Ago)>,
    /// (when, how long the level stayed away in ns or `None`, cost).
    hold_gaps: Vec<(Ago, Option<u64>, f64)>,
    hold_last: Option<(Ago, u32)>,
    /// Written empty and never read: what earlier daemons kept room for surges with (the
    /// surges, the returning ones, the room in MiB), and read. A cluster upgraded one host at
    /// a time has daemons of both kinds read one summary.
    #[serde(default)]
    surges: Vec<(Ago, f64)>,
    #[serde(default)]
    returns: Vec<(Ago, f64)>,
    past: Vec<(Ago, f64)>,
    #[serde(default)]
    room: Option<f64>,
    level: Option<u32>,
    bases: Vec<(Ago, u64)>,
    demand: Vec<(Ago, f64)>,
    oom_kills: BTreeMap<String, u64>,
    /// The period of the demand found last (every, fit, step: ns, Pearson's r, ns), when it
    /// was looked for, and what the forecast did at the last pass (every in ns, raised to).
    #[serde(default)]
    period: Option<(u64, f64, u64)>,
    #[serde(default)]
    period_at: Option<Ago>,
    #[serde(default)]
    forecast: Option<(u64, Option<u32>)>,
}

impl Saved {
    /// How many demand samples the `adaptive` policy had learned from (for the journal).
    pub fn samples(&self) -> usize {
        self.estimates.past.len()
    }

    /// The history made compact, to hand a group over to another daemon: what it learned of
    /// the group, without what it knew of each instance (the next holder reads those afresh),
    /// each series at most `most` entries (see [`highest`]: the recommendations within the
    /// window and the demand seen are never less than they were; of the others,
    /// the newest).
    pub fn summary(&self, most: usize) -> Saved {
        let e = &self.estimates;
        Saved {
            version: self.version,
            recommendations: highest(&self.recommendations, most),
            changes: newest(&self.changes, most),
            acted: newest(&self.acted, most),
            desired: self.desired,
            bounds: self.bounds,
            instances: BTreeMap::new(),
            estimates: SavedEstimates {
                hold_away: newest(&e.hold_away, most),
                hold_gaps: newest(&e.hold_gaps, most),
                hold_last: e.hold_last,
                surges: Vec::new(),
                returns: Vec::new(),
                past: highest(&e.past, most),
                room: None,
                level: e.level,
                bases: newest(&e.bases, most),
                demand: highest(&e.demand, most),
                oom_kills: BTreeMap::new(),
                period: e.period,
                period_at: e.period_at,
                forecast: e.forecast,
            },
            cpu: BTreeMap::new(),
        }
    }
}

/// The last `most` of `all` (oldest first).
fn newest<T: Clone>(all: &[T], most: usize) -> Vec<T> {
    all[all.len().saturating_sub(most)..].to_vec()
}

/// `all` (oldest first) in at most `most` runs of successive entries, each the highest of
/// its run at the time of its newest: whatever a window that holds part of a run takes the
/// highest of, it is never less than it was.
fn highest<T: Copy + PartialOrd>(all: &[(Ago, T)], most: usize) -> Vec<(Ago, T)> {
    if most == 0 {
        return Vec::new();
    }
    if all.len() <= most {
        return all.to_vec();
    }
    all.chunks(all.len().div_ceil(most))
        .filter_map(|c| {
            let newest = c.last()?.0;
            let high = c
                .iter()
                .map(|(_, v)| *v)
                .reduce(|a, b| if b > a { b } else { a })?;
            Some((newest, high))
        })
        .collect()
}

/// `at` as an offset before `now`.
fn ago(now: Instant, at: Instant) -> Ago {
    if at <= now {
        i64::try_from(now.duration_since(at).as_nanos()).unwrap_or(i64::MAX)
    } else {
        -i64::try_from(at.duration_since(now).as_nanos()).unwrap_or(i64::MAX)
    }
}

/// The clock of the reader: `now` less the time since the save (`gone`) less the offset;
/// `None` when this process' clock cannot show it (before the host started).
fn at(now: Instant, gone: Duration, ago: Ago) -> Option<Instant> {
    let total = i128::try_from(gone.as_nanos()).ok()? + i128::from(ago);
    let magnitude = Duration::from_nanos(u64::try_from(total.unsigned_abs()).ok()?);
    if total >= 0 {
        now.checked_sub(magnitude)
    } else {
        now.checked_add(magnitude)
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

fn out<T: Copy>(now: Instant, samples: &VecDeque<(Instant, T)>) -> Vec<(Ago, T)> {
    samples.iter().map(|(t, v)| (ago(now, *t), *v)).collect()
}

fn back<T: Copy>(now: Instant, gone: Duration, samples: &[(Ago, T)]) -> VecDeque<(Instant, T)> {
    samples
        .iter()
        .filter_map(|(a, v)| Some((at(now, gone, *a)?, *v)))
        .collect()
}

impl History {
    /// Since when it knows the group: its oldest recommendation or demand sample.
    pub fn since(&self) -> Option<Instant> {
        let first = |t: Option<Instant>, u: Option<Instant>| match (t, u) {
            (Some(t), Some(u)) => Some(t.min(u)),
            (t, u) => t.or(u),
        };
        first(
            self.recommendations.front().map(|(t, _)| *t),
            self.estimates.past.front().map(|(t, _)| *t),
        )
    }

    /// The history as data, its times as offsets from `now`.
    pub fn save(&self, now: Instant) -> Saved {
        let e = &self.estimates;
        let h = &e.hold;
        let some = |t: Option<Instant>| t.map(|t| ago(now, t));
        Saved {
            version: VERSION,
            recommendations: out(now, &self.recommendations),
            changes: out(now, &self.changes),
            acted: self
                .acted
                .iter()
                .map(|(t, a, r)| (ago(now, *t), *a, *r))
                .collect(),
            desired: self.desired,
            bounds: self.bounds.map(|b| (b.file_max, b.ceiling)),
            instances: self
                .instances
                .iter()
                .map(|(name, t)| {
                    let saved = SavedTracked {
                        ran: t.ran,
                        crashes: t.crashes,
                        start_failures: t.start_failures,
                        retry_at: some(t.retry_at),
                        unhealthy_since: some(t.unhealthy_since),
                        reported: t.reported,
                        creating_until: some(t.creating_until),
                        failing_said: t.failing_said,
                        not_ready_since: some(t.not_ready_since),
                        not_ready_said: t.not_ready_said,
                    };
                    (name.clone(), saved)
                })
                .collect(),
            estimates: SavedEstimates {
                hold_away: h.away.iter().map(|(l, t)| (*l, ago(now, *t))).collect(),
                hold_gaps: h
                    .gaps
                    .iter()
                    .map(|g| {
                        let away = g.away.map(nanos);
                        (ago(now, g.at), away, g.cost)
                    })
                    .collect(),
                hold_last: h.last.map(|(t, r)| (ago(now, t), r)),
                surges: Vec::new(),
                returns: Vec::new(),
                past: out(now, &e.past),
                room: None,
                level: e.level,
                bases: out(now, &e.bases),
                demand: out(now, &e.demand),
                oom_kills: e.oom_kills.clone(),
                period: e.period.map(|p| (nanos(p.every), p.fit, nanos(p.step))),
                period_at: e.period_at.map(|t| ago(now, t)),
                forecast: e.forecast.map(|f| (nanos(f.every), f.raised)),
            },
            cpu: self
                .cpu
                .last
                .iter()
                .map(|(name, (counter, t))| (name.clone(), (*counter, ago(now, *t))))
                .collect(),
        }
    }

    /// The history `saved` describes, read at `now`, `gone` after it was saved (see the module
    /// header for what a history older than `spec`'s scale-down window keeps). Times this
    /// process' clock cannot show (before the host started) are left out.
    pub fn resume(spec: &GroupSpec, saved: &Saved, gone: Duration, now: Instant) -> History {
        let when = |a: Option<Ago>| a.and_then(|a| at(now, gone, a));
        let e = &saved.estimates;
        let estimates = Estimates {
            hold: Hold {
                away: e
                    .hold_away
                    .iter()
                    .filter_map(|(l, a)| Some((*l, at(now, gone, *a)?)))
                    .collect(),
                gaps: e
                    .hold_gaps
                    .iter()
                    .filter_map(|(a, away, cost)| {
                        Some(Gap {
                            at: at(now, gone, *a)?,
                            away: away.map(Duration::from_nanos),
                            cost: *cost,
                        })
                    })
                    .collect(),
                last: e.hold_last.and_then(|(a, r)| Some((at(now, gone, a)?, r))),
            },
            past: back(now, gone, &e.past),
            level: e.level,
            bases: back(now, gone, &e.bases),
            demand: back(now, gone, &e.demand),
            oom_kills: e.oom_kills.clone(),
            period: e.period.map(|(every, fit, step)| Period {
                every: Duration::from_nanos(every),
                fit,
                step: Duration::from_nanos(step),
            }),
            period_at: when(e.period_at),
            forecast: e.forecast.map(|(every, raised)| Forecast {
                every: Duration::from_nanos(every),
                raised,
            }),
        };
        let instances = saved
            .instances
            .iter()
            .map(|(name, t)| {
                let tracked = Tracked {
                    ran: t.ran,
                    crashes: t.crashes,
                    start_failures: t.start_failures,
                    retry_at: when(t.retry_at),
                    unhealthy_since: when(t.unhealthy_since),
                    reported: t.reported,
                    creating_until: when(t.creating_until),
                    failing_said: t.failing_said,
                    not_ready_since: when(t.not_ready_since),
                    not_ready_said: t.not_ready_said,
                };
                (name.clone(), tracked)
            })
            .collect();
        let cpu = CpuCounters {
            last: saved
                .cpu
                .iter()
                .filter_map(|(name, (counter, a))| {
                    Some((name.clone(), (*counter, at(now, gone, *a)?)))
                })
                .collect(),
        };
        let mut history = History {
            estimates,
            instances,
            cpu,
            bounds: saved
                .bounds
                .map(|(file_max, ceiling)| Bounds { file_max, ceiling }),
            ..History::default()
        };
        if gone <= spec.scale_down_stabilization {
            history.recommendations = back(now, gone, &saved.recommendations);
            history.changes = back(now, gone, &saved.changes);
            history.acted = saved
                .acted
                .iter()
                .filter_map(|(a, added, removed)| Some((at(now, gone, *a)?, *added, *removed)))
                .collect();
            history.desired = saved.desired;
        }
        history
    }
}

#[cfg(test)]
#[path = "saved_tests.rs"]
mod tests;
