//! One instance's readiness, from its checks' outcomes (pure: no IO, time passed in).
//!
//! A [`Tracker`] follows one start of one instance: it is Starting until its first passing
//! check; Ready then; NotReady after `failures` failed checks in a row once it was ready (a
//! passing check makes it Ready again); NeverReady when `start_timeout` has passed since its
//! start and no check passed. NeverReady is final for that start: the instance is a failed
//! start, to be replaced. A new start of the instance (its start time changes) begins afresh.

use std::time::Duration;

use tokio::time::Instant;

use crate::model::{Readiness, ReadySpec};

/// What one check found: `Ok(what passed)`, e.g. "HTTP 200", or `Err(why it failed)`, e.g.
/// "connection refused".
pub type Outcome = Result<String, String>;

/// One start of an instance: what tells it from another start (Incus' `last_used_at`), and
/// when it was.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Start {
    pub id: String,
    pub at: Instant,
}

/// A change of readiness worth a line in the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// It became ready: `after` its start (the first time), or `again` after it was not ready.
    Ready {
        detail: String,
        after: Duration,
        again: bool,
    },
    /// It was ready, and `failed` checks in a row failed: out of service.
    NotReady { why: String, failed: u32 },
    /// No check passed within `start_timeout` of its start.
    NeverReady { why: String },
}

/// The readiness of one instance, across its checks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tracker {
    start: Start,
    readiness: Readiness,
    /// Failed checks in a row.
    failed: u32,
}

impl Tracker {
    /// An instance seen for the first time (or started again): Starting, no check ended yet.
    pub fn new(start: Start) -> Self {
        Self {
            start,
            readiness: Readiness::Starting { why: String::new() },
            failed: 0,
        }
    }

    /// What is known of it now.
    pub fn readiness(&self) -> &Readiness {
        &self.readiness
    }

    /// The start it follows.
    pub fn start(&self) -> &Start {
        &self.start
    }

    /// Takes in the start the instance is at: a start other than the one followed (another
    /// `id`) begins afresh (Starting). True when it did.
    pub fn restart(&mut self, start: &Start) -> bool {
        if start.id == self.start.id {
            return false;
        }
        *self = Self::new(start.clone());
        true
    }

    /// Takes in a check's outcome at `now` for the instance at `start` (see
    /// [`Tracker::restart`]); returns the change it made, if worth telling.
    pub fn feed(
        &mut self,
        start: &Start,
        outcome: &Outcome,
        spec: &ReadySpec,
        now: Instant,
    ) -> Option<Change> {
        self.restart(start);
        let since = now.saturating_duration_since(self.start.at);
        match (&self.readiness, outcome) {
            // A failed start stays one: the instance is to be replaced.
            (Readiness::NeverReady { .. }, _) => None,
            (Readiness::Ready, Ok(_)) => {
                self.failed = 0;
                None
            }
            (was, Ok(detail)) => {
                let again = matches!(was, Readiness::NotReady { .. });
                self.readiness = Readiness::Ready;
                self.failed = 0;
                Some(Change::Ready {
                    detail: detail.clone(),
                    after: since,
                    again,
                })
            }
            (Readiness::Starting { .. } | Readiness::Unchecked, Err(why)) => {
                self.failed = self.failed.saturating_add(1);
                if since >= spec.start_timeout {
                    let why = format!(
                        "not ready within {} of its start: {why}",
                        humantime::format_duration(spec.start_timeout)
                    );
                    self.readiness = Readiness::NeverReady { why: why.clone() };
                    return Some(Change::NeverReady { why });
                }
                self.readiness = Readiness::Starting { why: why.clone() };
                None
            }
            (Readiness::Ready, Err(why)) => {
                self.failed = self.failed.saturating_add(1);
                if self.failed >= spec.failures.max(1) {
                    self.readiness = Readiness::NotReady { why: why.clone() };
                    return Some(Change::NotReady {
                        why: why.clone(),
                        failed: self.failed,
                    });
                }
                None
            }
            (Readiness::NotReady { .. }, Err(why)) => {
                self.failed = self.failed.saturating_add(1);
                self.readiness = Readiness::NotReady { why: why.clone() };
                None
            }
        }
    }
}

#[cfg(test)]
#[path = "track_tests.rs"]
mod tests;
