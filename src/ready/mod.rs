//! Readiness checks: the prober that checks each running instance of every group with a
//! `[groups.NAME.ready]` table every `period`, and publishes what it finds on the [`Board`]
//! that `observe` reads.
//!
//! - One task per checked group ([`Prober`] starts and stops them as the desired state
//!   changes); a group's round takes its running instances from the informer's cache (no
//!   request: a project not listed yet is skipped until a pass lists it), reads the address of
//!   each on the group's interface once per start (again when the instance starts again, or
//!   while it has none), and runs the checks at once, [`CHECKS_AT_ONCE`] at most. An
//!   instance a removal marked as leaving ([`Board::set_leaving`]) is not checked.
//! - Each instance's readiness is followed by a [`track::Tracker`] (pure); the checks
//!   themselves are [`probe`]'s. Instances no longer running are forgotten, but for frozen
//!   ones: a frozen instance answers nothing, so while it is ready each of its checks fails
//!   without being sent ([`FROZEN`]). An `incus copy` or snapshot freezes its source for a
//!   moment: shorter than `failures` checks, the freeze leaves the instance in service;
//!   longer, it takes it out as any failing check does. One frozen before it was ready is left
//!   as it was until it runs again (a freeze is not a failed start).
//! - The log has one line when an instance becomes ready, when it is taken out of service,
//!   and when it was never ready.
//!
//! Every daemon checks, the lease holder and the standbys alike: only the holder acts on what
//! it finds.
//!
//! A group with `[groups.NAME.endpoints]` but no `ready` table is not checked: its running
//! instances' addresses are read all the same ([`addresses`]), every [`ADDRESS_PERIOD`], and
//! put on the board with their readiness [`Readiness::Unchecked`](crate::model::Readiness).

mod addresses;
pub mod board;
pub mod probe;
pub mod track;

pub use board::{Board, Seen};

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures_util::stream::{self, StreamExt};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::{sleep_until, Instant};

use crate::decide::{ownership, Ownership};
use crate::incus::{Incus, Instance};
use crate::informer::Store;
use crate::model::{DesiredState, GroupName, GroupSpec, InstanceStatus, Readiness, ReadySpec};
use probe::{Checker, Target};
use track::{Change, Outcome, Start, Tracker};

/// How many checks of one group run at once, at most.
pub const CHECKS_AT_ONCE: usize = 16;

/// Why a check of a frozen instance failed (it is not sent).
pub const FROZEN: &str = "frozen";

/// How long reading an instance's address from Incus may take.
const ADDRESS_WAIT: Duration = Duration::from_secs(10);

/// The prober: a task that runs the checks of every group with a `ready` table, following
/// the desired state. Dropping it stops every check.
pub struct Prober {
    desired: watch::Sender<Vec<GroupSpec>>,
    task: JoinHandle<()>,
}

/// How often the addresses of a group with endpoints but no checks are looked at.
pub const ADDRESS_PERIOD: Duration = Duration::from_secs(2);

/// The groups of `state` that have checks, or endpoints (whose addresses are read).
fn checked(state: &DesiredState) -> Vec<GroupSpec> {
    state
        .groups
        .values()
        .filter(|g| g.ready.is_some() || g.endpoints.is_some())
        .cloned()
        .collect()
}

impl Prober {
    /// Starts checking the groups of `state` that have a `ready` table, writing to `board`.
    pub fn start(
        incus: Arc<dyn Incus>,
        store: Arc<Store>,
        board: Arc<Board>,
        state: &DesiredState,
    ) -> Self {
        let (desired, rx) = watch::channel(checked(state));
        let task = tokio::spawn(run(incus, store, board, rx));
        Self { desired, task }
    }

    /// Follows a new desired state: new groups are checked, removed ones no longer, changed
    /// ones with their new table (what was found of their instances is kept).
    pub fn set_desired(&self, state: &DesiredState) {
        let groups = checked(state);
        self.desired.send_if_modified(|was| {
            let changed = *was != groups;
            if changed {
                *was = groups;
            }
            changed
        });
    }
}

impl Drop for Prober {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A task aborted when dropped.
struct Aborting(JoinHandle<()>);

impl Drop for Aborting {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Runs one task per checked group until the desired state's sender is dropped.
async fn run(
    incus: Arc<dyn Incus>,
    store: Arc<Store>,
    board: Arc<Board>,
    mut desired: watch::Receiver<Vec<GroupSpec>>,
) {
    // Made when a first group has checks.
    let mut checker: Option<Arc<Checker>> = None;
    let mut groups: HashMap<(String, GroupName), (watch::Sender<GroupSpec>, Aborting)> =
        HashMap::new();
    loop {
        let specs = desired.borrow_and_update().clone();
        groups.retain(|(project, name), _| {
            let kept = specs
                .iter()
                .any(|s| &s.project == project && &s.name == name);
            if !kept {
                board.forget_group(project, name.as_str());
            }
            kept
        });
        for spec in specs {
            let key = (spec.project.clone(), spec.name.clone());
            if let Some((tx, _)) = groups.get(&key) {
                // Checked before and now, or read for its addresses before and now: the
                // task follows the new table; else another task takes over.
                if tx.borrow().ready.is_some() == spec.ready.is_some() {
                    tx.send_if_modified(|was| {
                        let changed = *was != spec;
                        if changed {
                            *was = spec;
                        }
                        changed
                    });
                    continue;
                }
                groups.remove(&key);
            }
            if spec.ready.is_none() {
                let (tx, rx) = watch::channel(spec);
                let task = tokio::spawn(addresses::follow(
                    incus.clone(),
                    store.clone(),
                    board.clone(),
                    rx,
                ));
                groups.insert(key, (tx, Aborting(task)));
                continue;
            }
            let checker = match &checker {
                Some(c) => c.clone(),
                None => match Checker::new() {
                    Ok(c) => checker.insert(Arc::new(c)).clone(),
                    Err(e) => {
                        tracing::error!("{e}: no instance is checked; every one stays starting");
                        return;
                    }
                },
            };
            let (tx, rx) = watch::channel(spec);
            let task = tokio::spawn(check_group(
                incus.clone(),
                store.clone(),
                board.clone(),
                checker,
                rx,
            ));
            groups.insert(key, (tx, Aborting(task)));
        }
        if desired.changed().await.is_err() {
            return;
        }
    }
}

/// One round of checks of a group's running instances, written to `board`, for a look taken
/// once (`incus-hpa plan`): an instance that passes is ready, one that fails is starting. The
/// project is listed through `store` when not fresh; nothing is checked when that fails (the
/// observation that follows says why).
pub async fn check_once(
    incus: &dyn Incus,
    store: &Store,
    board: &Board,
    spec: &GroupSpec,
    resync: Duration,
) {
    let Some(ready) = &spec.ready else {
        return;
    };
    let group = spec.name.as_str();
    if store
        .list_group(incus, &spec.project, group, Instant::now(), resync)
        .await
        .is_err()
    {
        return;
    }
    let checker = match Checker::new() {
        Ok(c) => c,
        Err(e) => {
            tracing::error!("{e}");
            return;
        }
    };
    let round = Round {
        incus,
        checker: &checker,
        spec,
        ready,
        tell: false,
    };
    round.run(store, board, &mut HashMap::new()).await;
}

/// What the prober keeps of one instance.
struct Probed {
    tracker: Tracker,
    /// Its address for the start the tracker follows, once read.
    address: Option<IpAddr>,
}

/// Checks one group's instances every `period`, with the group's table as it changes.
async fn check_group(
    incus: Arc<dyn Incus>,
    store: Arc<Store>,
    board: Arc<Board>,
    checker: Arc<Checker>,
    mut spec: watch::Receiver<GroupSpec>,
) {
    let mut known: HashMap<String, Probed> = HashMap::new();
    let mut next = Instant::now();
    loop {
        tokio::select! {
            _ = sleep_until(next) => {}
            changed = spec.changed() => {
                if changed.is_err() {
                    return;
                }
                spec.borrow_and_update();
                continue;
            }
        }
        let group = spec.borrow_and_update().clone();
        let Some(ready) = group.ready.clone() else {
            return;
        };
        let round = Round {
            incus: incus.as_ref(),
            checker: &checker,
            spec: &group,
            ready: &ready,
            tell: true,
        };
        round.run(&store, &board, &mut known).await;
        next = (next + ready.period).max(Instant::now());
    }
}

/// One round of checks of one group.
struct Round<'a> {
    incus: &'a dyn Incus,
    checker: &'a Checker,
    spec: &'a GroupSpec,
    ready: &'a ReadySpec,
    /// Changes are logged.
    tell: bool,
}

impl Round<'_> {
    async fn run(&self, store: &Store, board: &Board, known: &mut HashMap<String, Probed>) {
        let (project, group) = (self.spec.project.as_str(), self.spec.name.as_str());
        let now = Instant::now();
        let Some(listed) = store.group_instances(project, group, now, Duration::MAX) else {
            return;
        };
        let running: Vec<Arc<Instance>> = listed
            .into_iter()
            .filter(|i| i.status().is_healthy() || i.status() == InstanceStatus::Frozen)
            .filter(|i| ownership(group, project, &i.name, &i.config) == Ownership::Owned)
            .collect();
        known.retain(|name, _| running.iter().any(|i| &i.name == name));
        board.retain_instances(project, group, |name| known.contains_key(name));
        board.retain_leaving(project, group, |name| {
            running.iter().any(|i| i.name == name)
        });
        let wall = SystemTime::now();
        let mut targets = Vec::with_capacity(running.len());
        // A removal is draining and stopping those: what was found of them last stands.
        let checked = running
            .iter()
            .filter(|i| !board.is_leaving(project, group, &i.name));
        for i in checked {
            let since = i.since_start(wall).unwrap_or_default();
            let start = Start {
                id: i.last_used_at.clone(),
                at: now.checked_sub(since).unwrap_or(now),
            };
            let p = known.entry(i.name.clone()).or_insert_with(|| Probed {
                tracker: Tracker::new(start.clone()),
                address: None,
            });
            if p.tracker.restart(&start) {
                p.address = None;
            }
            let frozen = i.status() == InstanceStatus::Frozen;
            if frozen && *p.tracker.readiness() != Readiness::Ready {
                continue;
            }
            targets.push((i.name.clone(), p.address, start, frozen));
        }
        let found: Vec<(String, Option<IpAddr>, Start, Outcome)> = stream::iter(targets)
            .map(|(name, address, start, frozen)| async move {
                let (address, outcome) = if frozen {
                    (address, Err(FROZEN.to_owned()))
                } else {
                    self.check(&name, address).await
                };
                (name, address, start, outcome)
            })
            .buffer_unordered(CHECKS_AT_ONCE)
            .collect()
            .await;
        let now = Instant::now();
        for (name, address, start, outcome) in found {
            let Some(p) = known.get_mut(&name) else {
                continue;
            };
            p.address = address;
            let change = p.tracker.feed(&start, &outcome, self.ready, now);
            if let Some(change) = change.filter(|_| self.tell) {
                tell(group, &name, &change);
            }
            let seen = Seen {
                start: start.id,
                readiness: p.tracker.readiness().clone(),
                address,
            };
            board.set(project, group, &name, seen);
        }
    }

    /// Reads the instance's address when not known yet, then checks it.
    async fn check(&self, name: &str, known: Option<IpAddr>) -> (Option<IpAddr>, Outcome) {
        let project = self.spec.project.as_str();
        let address = match known {
            Some(a) => Ok(Some(a)),
            None => self.address(name).await,
        };
        let address = match address {
            Ok(a) => a,
            Err(why) if self.ready.probe.needs_address() => return (None, Err(why)),
            Err(_) => None,
        };
        let target = Target {
            project,
            name,
            address,
        };
        let outcome = self.checker.check(self.incus, target, self.ready).await;
        (address, outcome)
    }

    /// The instance's address on the group's interface: the first global IPv4, else the first
    /// global IPv6; `None` when it has none yet.
    async fn address(&self, name: &str) -> Result<Option<IpAddr>, String> {
        let project = self.spec.project.as_str();
        let read = self.incus.addresses(project, name, &self.ready.interface);
        match tokio::time::timeout(ADDRESS_WAIT, read).await {
            Ok(Ok(addresses)) => Ok(addresses.first().copied()),
            Ok(Err(e)) => Err(format!("could not read its address: {e}")),
            Err(_) => Err(format!(
                "could not read its address: Incus did not answer within {}",
                humantime::format_duration(ADDRESS_WAIT)
            )),
        }
    }
}

/// One line in the log for a change of readiness.
fn tell(group: &str, name: &str, change: &Change) {
    let line = describe(name, change);
    match change {
        Change::Ready { .. } => tracing::info!(group, instance = name, "{line}"),
        Change::NotReady { .. } | Change::NeverReady { .. } => {
            tracing::warn!(group, instance = name, "{line}")
        }
    }
}

/// What the log says of a change of readiness of `name`.
fn describe(name: &str, change: &Change) -> String {
    match change {
        Change::Ready {
            detail,
            after,
            again: false,
        } => format!(
            "{name} is ready ({detail} after {:.1}s)",
            after.as_secs_f64()
        ),
        Change::Ready { detail, .. } => format!("{name} is ready again ({detail})"),
        Change::NotReady { why, failed } => {
            format!("{name} is not ready: {failed} checks in a row failed ({why}): out of service")
        }
        Change::NeverReady { why } => format!("{name} was never ready: {why}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_lines_say_what_changed_and_why() {
        let ready = Change::Ready {
            detail: "HTTP 200".into(),
            after: Duration::from_millis(3240),
            again: false,
        };
        assert_eq!(
            describe("web-abc123", &ready),
            "web-abc123 is ready (HTTP 200 after 3.2s)"
        );
        let again = Change::Ready {
            detail: "connected".into(),
            after: Duration::from_secs(90),
            again: true,
        };
        assert_eq!(
            describe("web-a", &again),
            "web-a is ready again (connected)"
        );
        let out = Change::NotReady {
            why: "HTTP 503".into(),
            failed: 3,
        };
        assert_eq!(
            describe("web-a", &out),
            "web-a is not ready: 3 checks in a row failed (HTTP 503): out of service"
        );
        let never = Change::NeverReady {
            why: "not ready within 2m of its start: connection refused".into(),
        };
        assert_eq!(
            describe("web-a", &never),
            "web-a was never ready: not ready within 2m of its start: connection refused"
        );
    }
}
