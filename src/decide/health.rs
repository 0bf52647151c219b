//! Health: what each of the group's instances is worth now, and what it needs.
//!
//! - **Healthy** (Running or Ready): capacity, measured. With a `[groups.NAME.ready]` check,
//!   only once its check passed (its readiness is `ready`):
//!   - **Starting** (running, its check has not passed since its start): capacity (so no
//!     instance is created for it), not measured (a missing reading: 0 % on the way up, no
//!     scale-down meanwhile), the first a scale-down removes;
//!   - **not ready** (its checks failed `failures` times in a row after it was ready): as an
//!     unhealthy one (below), from when it was first seen not ready; no confirmation wait;
//!   - **never ready** (not ready within `start_timeout` of its start): a failed start,
//!     removed and replaced at once (`never-ready`), unless protected.
//! - **Stopped**: repaired in place, and counted as capacity meanwhile (a replacement would meet
//!   whatever stopped it): started again at once, unless it is crash-looping or its start
//!   failed, in which case it waits for its backoff. A stop less than [`CRASH_WINDOW`] after its
//!   start is a crash; the first is restarted at once, the next ones after `restart_backoff`,
//!   doubling up to [`RESTART_BACKOFF_MAX`]; the [`CRASH_LIMIT`]th crash in a row replaces it. A
//!   failed start is retried with the same backoff and never removes the instance; after
//!   [`START_FAILURE_LIMIT`] failed starts in a row it is **failing**: no longer capacity (so a
//!   replacement is made, within `max`, and it never holds a scale-down back as a missing
//!   reading), left in place and still retried, named in the journal, `status` and the metrics.
//! - **Creating**: an instance whose creation Incus did not say the end of (a slow image
//!   unpack) counts as capacity and is neither started nor removed for [`CREATING_MAX`], or
//!   until it is seen running.
//! - **Unhealthy** (in Error at once; Frozen or in a transition once it has stayed so for
//!   [`UNHEALTHY_CONFIRM`], since `incus copy` freezes its source for a moment): not capacity, so
//!   a replacement is created (the group may surge above `max` by its unhealthy instances);
//!   removed once it has been unhealthy for `unhealthy_grace`. Until it is confirmed it still
//!   counts, unmeasured (so no scale-down), and is never chosen for removal, however short
//!   `unhealthy_grace` is (an instance seen once during an `incus restart` is not removed).
//! - **Unreachable** (on a cluster member that does not answer): nothing can be read of it or
//!   done to it. It still counts, unmeasured (so no scale-down), for `unhealthy_grace`; then
//!   it is **lost**: no longer capacity, so a replacement is created (the group's count stays
//!   within `max`), and it is left where it is (it cannot be deleted there). When its member
//!   comes back it is an ordinary instance again, and a surplus is removed as usual.
//!
//! What is remembered per instance ([`Tracked`]) lives in the group's `History`: losing it (a
//! restart of the daemon) only restarts the counts.

use std::time::Duration;

use tokio::time::Instant;

use crate::model::{
    Cause, GroupSpec, InstanceStatus, Note, ObservedInstance, Readiness, RESTART_BACKOFF_MAX,
};

/// A stop this soon after the instance's start is a crash.
pub const CRASH_WINDOW: Duration = Duration::from_secs(60);
/// Running this long forgives earlier crashes.
pub const CRASH_RESET: Duration = Duration::from_secs(600);
/// The crash, in a row, that makes the instance be replaced instead of restarted.
pub const CRASH_LIMIT: u32 = 5;
/// How long an instance must stay frozen or in a transition before it counts as unhealthy.
pub const UNHEALTHY_CONFIRM: Duration = Duration::from_secs(5);
/// Failed starts in a row after which an instance no longer counts as capacity.
pub const START_FAILURE_LIMIT: u32 = 3;
/// How long an instance whose creation Incus did not say the end of is left to Incus.
pub const CREATING_MAX: Duration = Duration::from_secs(600);

/// What the daemon remembers about one instance between passes.
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct Tracked {
    /// Seen healthy (or started by the daemon) since its last stop was accounted for.
    pub(super) ran: bool,
    /// Crashes in a row.
    pub(super) crashes: u32,
    /// Failed starts in a row.
    pub(super) start_failures: u32,
    /// No start before this.
    pub(super) retry_at: Option<Instant>,
    /// First seen unhealthy (frozen, in error, in a transition).
    pub(super) unhealthy_since: Option<Instant>,
    /// Its being unhealthy was reported.
    pub(super) reported: bool,
    /// Its creation's end was not told: left to Incus until then.
    pub(super) creating_until: Option<Instant>,
    /// Its failing to start was reported.
    pub(super) failing_said: bool,
    /// First seen running and not ready by its checks (since it was ready).
    pub(super) not_ready_since: Option<Instant>,
    /// Its being not ready (or never ready) was reported.
    pub(super) not_ready_said: bool,
}

/// What one instance is worth in this pass.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Class {
    Healthy,
    /// Running, and its check has not passed yet since its start: counted, not measured, the
    /// first chosen by a scale-down.
    Starting,
    /// Running, and not ready within its check's `start_timeout`: removed and replaced now.
    NeverReady,
    /// Stopped: started in this pass, for this cause.
    StartNow(Cause),
    /// Stopped: started once its backoff has passed.
    Waiting {
        until: Instant,
        start_failed: bool,
    },
    /// Crashed [`CRASH_LIMIT`] times in a row: removed and replaced.
    Retire,
    /// Frozen or in a transition for less than [`UNHEALTHY_CONFIRM`]: still counted, never
    /// removed, looked at again when it would be confirmed.
    Suspect {
        since: Instant,
    },
    /// Not capacity; removed once the grace period has passed.
    Unhealthy {
        since: Instant,
    },
    /// Unhealthy past the grace period: removed.
    Expired,
    /// Stopped in the warm pool: neither capacity nor unhealthy.
    Warm,
    /// Stopped while Incus may still be creating it: capacity, left alone until then.
    Creating {
        until: Instant,
    },
    /// Failed to start [`START_FAILURE_LIMIT`] times in a row: not capacity, never removed;
    /// its start is tried again at `retry` (`None`: now).
    Failing {
        retry: Option<Instant>,
    },
    /// On a member that does not answer, for less than the grace period: still counted,
    /// unmeasured, never removed.
    Unreachable {
        since: Instant,
    },
    /// On a member that has not answered for the grace period: replaced, left alone.
    Lost,
}

impl Class {
    /// Counts as capacity (serves, or is being brought back in place).
    pub(super) fn is_capacity(self) -> bool {
        matches!(
            self,
            Class::Healthy
                | Class::Starting
                | Class::StartNow(_)
                | Class::Waiting { .. }
                | Class::Suspect { .. }
                | Class::Unreachable { .. }
                | Class::Creating { .. }
        )
    }

    /// Never chosen to shrink the group: a failed start is not a reason to lose an instance,
    /// and an instance frozen for a moment may be the source of someone's `incus copy`.
    pub(super) fn keep(self) -> bool {
        matches!(
            self,
            Class::StartNow(Cause::StartRetry)
                | Class::Waiting {
                    start_failed: true,
                    ..
                }
                | Class::Suspect { .. }
                | Class::Unreachable { .. }
                | Class::Creating { .. }
        )
    }

    /// Does not count as capacity because something is wrong with it.
    pub(super) fn is_unhealthy(self) -> bool {
        matches!(
            self,
            Class::Retire
                | Class::Unhealthy { .. }
                | Class::Expired
                | Class::Lost
                | Class::NeverReady
        )
    }
}

/// The delay before restarting an instance after its `crashes`-th crash in a row: none after
/// the first, then `base`, doubling, capped.
pub(super) fn restart_delay(base: Duration, crashes: u32) -> Duration {
    if crashes <= 1 {
        return Duration::ZERO;
    }
    doubled(base, crashes - 2)
}

/// The delay before retrying a start after `failures` failed starts in a row.
pub(super) fn retry_delay(base: Duration, failures: u32) -> Duration {
    doubled(base, failures.saturating_sub(1))
}

fn doubled(base: Duration, times: u32) -> Duration {
    let factor = 1u32.checked_shl(times.min(20)).unwrap_or(u32::MAX);
    base.checked_mul(factor)
        .unwrap_or(RESTART_BACKOFF_MAX)
        .min(RESTART_BACKOFF_MAX)
}

/// A stopped member of the warm pool (one found running was started by someone: it serves).
fn is_warm(inst: &ObservedInstance) -> bool {
    inst.warm && inst.status == InstanceStatus::Stopped
}

/// A running instance its checks took out of service (not ready, or never ready).
pub(super) fn out_of_service(inst: &ObservedInstance) -> bool {
    inst.status.is_healthy()
        && matches!(
            inst.readiness,
            Readiness::NotReady { .. } | Readiness::NeverReady { .. }
        )
}

/// An instance in `status` since `since` counts as unhealthy: in Error at once, frozen or in a
/// transition after [`UNHEALTHY_CONFIRM`].
fn confirmed(status: InstanceStatus, since: Instant, now: Instant) -> bool {
    status == InstanceStatus::Error || now.saturating_duration_since(since) >= UNHEALTHY_CONFIRM
}

impl Tracked {
    /// Takes in one observation of the instance; returns a note when something new happened.
    pub(super) fn observe(
        &mut self,
        spec: &GroupSpec,
        inst: &ObservedInstance,
        now: Instant,
    ) -> Option<Note> {
        if is_warm(inst) {
            return None;
        }
        if !out_of_service(inst) {
            self.not_ready_since = None;
            self.not_ready_said = false;
        }
        match inst.status {
            s if s.is_healthy() => {
                self.ran = true;
                self.unhealthy_since = None;
                self.reported = false;
                self.start_failures = 0;
                self.retry_at = None;
                self.creating_until = None;
                self.failing_said = false;
                if inst.since_start.is_some_and(|d| d >= CRASH_RESET) {
                    self.crashes = 0;
                }
                self.checks(spec, inst, now)
            }
            InstanceStatus::Unreachable => {
                let since = *self.unhealthy_since.get_or_insert(now);
                if std::mem::replace(&mut self.reported, true) {
                    return None;
                }
                Some(Note::Unreachable {
                    instance: inst.name.clone(),
                    member: inst.location.clone(),
                    grace: spec
                        .unhealthy_grace
                        .saturating_sub(now.saturating_duration_since(since)),
                })
            }
            InstanceStatus::Stopped => {
                self.unhealthy_since = None;
                self.reported = false;
                if self.start_failures >= START_FAILURE_LIMIT
                    && !std::mem::replace(&mut self.failing_said, true)
                {
                    return Some(Note::FailingStart {
                        instance: inst.name.clone(),
                        failures: self.start_failures,
                        retry_in: self
                            .retry_at
                            .map_or(Duration::ZERO, |t| t.saturating_duration_since(now)),
                    });
                }
                if self.creating_until.is_some() {
                    // Not started by the daemon yet: no crash to account for.
                    return None;
                }
                if !std::mem::take(&mut self.ran) {
                    // This stop was accounted for already (or it was never seen running).
                    return None;
                }
                let Some(ran) = inst.since_start.filter(|d| *d < CRASH_WINDOW) else {
                    // It ran long enough: a plain stop, which forgives earlier crashes.
                    self.crashes = 0;
                    self.retry_at = None;
                    return None;
                };
                self.crashes = self.crashes.saturating_add(1);
                let delay = restart_delay(spec.restart_backoff, self.crashes);
                self.retry_at = Some(now.checked_add(delay).unwrap_or(now));
                Some(Note::CrashLoop {
                    instance: inst.name.clone(),
                    crashes: self.crashes,
                    ran,
                    restart_in: (self.crashes < CRASH_LIMIT).then_some(delay),
                })
            }
            status => {
                let since = *self.unhealthy_since.get_or_insert(now);
                if self.reported || !confirmed(status, since, now) {
                    return None;
                }
                self.reported = true;
                let gone = now.saturating_duration_since(since);
                Some(Note::Unhealthy {
                    instance: inst.name.clone(),
                    status,
                    grace: spec.unhealthy_grace.saturating_sub(gone),
                })
            }
        }
    }

    /// What a healthy instance's checks tell that is new: it went out of service (not
    /// ready), or it never came into service (never ready).
    fn checks(&mut self, spec: &GroupSpec, inst: &ObservedInstance, now: Instant) -> Option<Note> {
        let instance = inst.name.clone();
        match &inst.readiness {
            Readiness::NotReady { why } => {
                let since = *self.not_ready_since.get_or_insert(now);
                if std::mem::replace(&mut self.not_ready_said, true) {
                    return None;
                }
                Some(Note::NotReady {
                    instance,
                    why: why.clone(),
                    grace: spec
                        .unhealthy_grace
                        .saturating_sub(now.saturating_duration_since(since)),
                })
            }
            Readiness::NeverReady { why } => {
                if std::mem::replace(&mut self.not_ready_said, true) {
                    return None;
                }
                Some(Note::NeverReady {
                    instance,
                    why: why.clone(),
                })
            }
            Readiness::Unchecked | Readiness::Starting { .. } | Readiness::Ready => None,
        }
    }

    /// What the instance is worth now (after [`Tracked::observe`]).
    pub(super) fn class(&self, spec: &GroupSpec, inst: &ObservedInstance, now: Instant) -> Class {
        if is_warm(inst) {
            return Class::Warm;
        }
        match inst.status {
            s if s.is_healthy() => match inst.readiness {
                Readiness::Unchecked | Readiness::Ready => Class::Healthy,
                Readiness::Starting { .. } => Class::Starting,
                Readiness::NeverReady { .. } => Class::NeverReady,
                Readiness::NotReady { .. } => {
                    let since = self.not_ready_since.unwrap_or(now);
                    if now.saturating_duration_since(since) >= spec.unhealthy_grace {
                        Class::Expired
                    } else {
                        Class::Unhealthy { since }
                    }
                }
            },
            InstanceStatus::Stopped => {
                if let Some(until) = self.creating_until.filter(|t| *t > now) {
                    Class::Creating { until }
                } else if self.crashes >= CRASH_LIMIT {
                    Class::Retire
                } else if self.start_failures >= START_FAILURE_LIMIT {
                    Class::Failing {
                        retry: self.retry_at.filter(|t| *t > now),
                    }
                } else if let Some(until) = self.retry_at.filter(|t| *t > now) {
                    Class::Waiting {
                        until,
                        start_failed: self.start_failures > 0,
                    }
                } else if self.crashes > 0 {
                    Class::StartNow(Cause::CrashLoop)
                } else if self.start_failures > 0 {
                    Class::StartNow(Cause::StartRetry)
                } else {
                    Class::StartNow(Cause::Restart)
                }
            }
            InstanceStatus::Unreachable => {
                let since = self.unhealthy_since.unwrap_or(now);
                if now.saturating_duration_since(since) >= spec.unhealthy_grace {
                    Class::Lost
                } else {
                    Class::Unreachable { since }
                }
            }
            status => {
                let since = self.unhealthy_since.unwrap_or(now);
                if !confirmed(status, since, now) {
                    Class::Suspect { since }
                } else if now.saturating_duration_since(since) >= spec.unhealthy_grace {
                    Class::Expired
                } else {
                    Class::Unhealthy { since }
                }
            }
        }
    }

    /// The daemon created the instance (it was started in the same request).
    pub(super) fn created(&mut self) {
        self.ran = true;
        self.creating_until = None;
    }

    /// The daemon asked for the instance, and Incus did not say how the creation ended.
    pub(super) fn creating(&mut self, now: Instant) {
        self.creating_until = now.checked_add(CREATING_MAX);
    }

    /// The daemon tried to start the instance.
    pub(super) fn started(&mut self, spec: &GroupSpec, ok: bool, now: Instant) {
        self.creating_until = None;
        if ok {
            self.ran = true;
            self.start_failures = 0;
            self.retry_at = None;
            self.failing_said = false;
        } else {
            self.ran = false;
            self.start_failures = self.start_failures.saturating_add(1);
            let delay = retry_delay(spec.restart_backoff, self.start_failures);
            self.retry_at = Some(now.checked_add(delay).unwrap_or(now));
        }
    }
}
