//! The informer: a local copy of the instances that carry a group key, per project, kept up to
//! date by Incus' lifecycle events, so that a steady pass asks nothing of incusd. It is the
//! Kubernetes informer pattern (the first seed): list once, then watch, resync rarely.
//!
//! - A project is listed (one filtered `recursion=1` request) the first time a group of it is
//!   observed, again whenever the event stream (re)connects (events may have been missed), and
//!   again every `[daemon] resync` as a guard against anything missed.
//! - A project no group observes any more is dropped ([`Store::retain_projects`], on every
//!   change of the desired state): its instances leave the cache and its events are not read.
//! - Each lifecycle event about an instance of a listed project reads that one instance again
//!   (`instance-deleted` drops it); the daemon's own actions write their result in at once.
//! - Reads for events are coalesced per instance: at most one is queued or in flight for an
//!   instance. An event that comes while its read is queued is covered by it (it is sent after
//!   the event); one that comes while it is in flight has the instance read once more after it,
//!   however many come, so the newest state is always read. Every event is taken in (and its
//!   groups woken) once the read that covers it is done. Across instances, at most
//!   [`READS_AT_ONCE`] such reads are in flight: a mass stop of many instances opens no more
//!   connections to incusd than that.
//! - Instances coming up (`instance-created`, `instance-started`) are the exception. On Incus
//!   6.0, reading instances while others start slows the starts down (a burst of 50 at 4 at a
//!   time: 0.90× the sequential time with those reads, 0.59× without, as fast as the bare API)
//!   and now and then stalls one until the 90 s start timeout (`forkstart` hangs). So they are
//!   not read at once: not at all when the cache already shows them so (the daemon's own
//!   creations and starts write their result), otherwise [`SETTLE`] later, unless something
//!   newer was written by then.
//! - While the daemon acts on an instance, events about it are not read: the action reads its
//!   result itself, and an event that came after that read is read when the action ends.
//! - Every read takes a ticket before it is sent; a write with an older ticket than the entry's
//!   loses, and a removal leaves a tombstone, so a slow read can never bring back an instance
//!   that a later one saw gone.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{watch, Semaphore};
use tokio::time::Instant;

use crate::incus::{Incus, IncusError, Instance};
use crate::model::GROUP_KEY;

/// How long after its `instance-created` or `instance-started` an instance is read, when
/// nothing newer was written about it by then (the daemon's own actions write their result).
pub const SETTLE: Duration = Duration::from_secs(3);

/// How many instances are read for events at once, at most (a mass stop of many instances
/// reads them this many at a time).
pub const READS_AT_ONCE: usize = 4;

const CREATED: &str = "instance-created";
const STARTED: &str = "instance-started";

/// One lifecycle event about an instance, as the event stream reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lifecycle {
    pub project: String,
    /// `instance-started`, `instance-deleted`…
    pub action: String,
    pub name: String,
    /// The name before an `instance-renamed`.
    pub old_name: Option<String>,
}

#[derive(Debug, Clone)]
struct Entry {
    ticket: u64,
    /// `None`: gone (or no longer in any group), kept so that older reads lose.
    instance: Option<Instance>,
}

#[derive(Debug, Default)]
struct Project {
    /// When the project was last listed; `None` until then, or after an invalidation.
    listed: Option<Instant>,
    entries: BTreeMap<String, Entry>,
}

/// The reads of one instance for events, while one is queued or in flight.
#[derive(Debug)]
struct Reading {
    /// Reads begun so far, the current one included.
    round: u64,
    /// The current read was sent: an event now needs one more.
    sent: bool,
    /// One more read is due after the current one.
    again: bool,
    /// The last read done (for the events waiting on it).
    done: watch::Sender<u64>,
}

/// (project, instance).
type Key = (String, String);

/// The cache, shared by the event follower, the observer and the actor.
#[derive(Debug)]
pub struct Store {
    projects: Mutex<HashMap<String, Project>>,
    /// Instances the daemon is acting on, with the ticket of the newest event about each that
    /// was not read meanwhile (0: none).
    busy: Mutex<HashMap<Key, u64>>,
    tickets: AtomicU64,
    /// Instances with a read for events queued or in flight.
    reads: Mutex<HashMap<Key, Reading>>,
    /// At most [`READS_AT_ONCE`] reads for events in flight.
    gate: Semaphore,
}

impl Default for Store {
    fn default() -> Self {
        Self {
            projects: Mutex::default(),
            busy: Mutex::default(),
            tickets: AtomicU64::default(),
            reads: Mutex::default(),
            gate: Semaphore::new(READS_AT_ONCE),
        }
    }
}

/// A mutex's contents, even after a panic while it was held.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The reader of one instance: when it is dropped before it is done (cancelled), the instance
/// is no longer marked as being read, and whoever waits on it stops waiting.
struct Reader<'a> {
    reads: &'a Mutex<HashMap<Key, Reading>>,
    key: Option<Key>,
}

impl Drop for Reader<'_> {
    fn drop(&mut self) {
        if let Some(key) = self.key.take() {
            lock(self.reads).remove(&key);
        }
    }
}

impl Store {
    /// A ticket for a read about to be sent.
    pub fn ticket(&self) -> u64 {
        self.tickets.fetch_add(1, Ordering::SeqCst) + 1
    }

    fn with<T>(&self, f: impl FnOnce(&mut HashMap<String, Project>) -> T) -> T {
        f(&mut lock(&self.projects))
    }

    /// The project's instances carrying a group key, when its listing is fresh (less than
    /// `resync` old); `None` when it must be listed.
    pub fn instances(
        &self,
        project: &str,
        now: Instant,
        resync: Duration,
    ) -> Option<Vec<Instance>> {
        self.with(|p| {
            let p = p.get(project)?;
            let listed = p.listed?;
            (now.saturating_duration_since(listed) < resync).then(|| {
                p.entries
                    .values()
                    .filter_map(|e| e.instance.clone())
                    .collect()
            })
        })
    }

    /// Takes in a listing of the project, read with `ticket`, at `now`: the instances carrying
    /// a group key, and those of them that are now on a member that does not answer (listed
    /// without their config): these keep what was last known of them, marked unreachable.
    /// One such instance not known before is left out: nothing says whose it is.
    pub fn listed(&self, project: &str, ticket: u64, instances: Vec<Instance>, now: Instant) {
        self.with(|p| {
            let p = p.entry(project.to_owned()).or_default();
            let before = std::mem::take(&mut p.entries);
            let instances = instances.into_iter().filter_map(|i| {
                if !i.is_unavailable() {
                    return i.config.contains_key(GROUP_KEY).then_some(i);
                }
                let known = before.get(&i.name)?.instance.clone()?;
                Some(Instance {
                    unreachable: true,
                    status: i.status,
                    location: i.location,
                    ..known
                })
            });
            let instances: Vec<Instance> = instances.collect();
            // Entries written after the listing was sent stay; everything else is replaced.
            p.entries = before
                .into_iter()
                .filter(|(_, e)| e.ticket > ticket)
                .collect();
            for i in instances {
                p.entries.entry(i.name.clone()).or_insert(Entry {
                    ticket,
                    instance: Some(i),
                });
            }
            p.listed = Some(now);
        })
    }

    /// Takes in what a read of one instance, sent with `ticket`, found (`None`: gone). Only for
    /// projects already listed; a read older than what is known loses.
    pub fn put(&self, project: &str, name: &str, ticket: u64, found: Option<Instance>) {
        let found = found.filter(|i| i.config.contains_key(GROUP_KEY));
        self.with(|p| {
            let Some(p) = p.get_mut(project) else {
                return;
            };
            match p.entries.get(name) {
                Some(e) if e.ticket > ticket => {}
                _ => {
                    p.entries.insert(
                        name.to_owned(),
                        Entry {
                            ticket,
                            instance: found,
                        },
                    );
                }
            }
        })
    }

    /// True when the project is being followed (it was listed).
    pub fn follows(&self, project: &str) -> bool {
        self.with(|p| p.contains_key(project))
    }

    /// Forgets every project but those of `keep` (no group of the others is observed any
    /// more): their instances leave the cache and their events are no longer read. A project
    /// wanted again later is listed afresh.
    pub fn retain_projects(&self, keep: &BTreeSet<String>) {
        self.with(|p| p.retain(|project, _| keep.contains(project)));
    }

    /// Every project is to be listed again before it is used (the event stream reconnected:
    /// events may have been missed).
    pub fn invalidate_all(&self) {
        self.with(|p| p.values_mut().for_each(|p| p.listed = None));
    }

    /// One project is to be listed again before it is used.
    pub fn invalidate(&self, project: &str) {
        self.with(|p| {
            if let Some(p) = p.get_mut(project) {
                p.listed = None;
            }
        })
    }

    /// Every cached instance, by project: (name, status), for comparisons and dumps.
    pub fn snapshot(&self) -> BTreeMap<String, Vec<(String, String)>> {
        self.with(|p| {
            p.iter()
                .map(|(project, p)| {
                    let live = p
                        .entries
                        .iter()
                        .filter_map(|(n, e)| Some((n.clone(), e.instance.as_ref()?.status.clone())))
                        .collect();
                    (project.clone(), live)
                })
                .collect()
        })
    }

    /// The project's instances carrying a group key: from the cache when fresh, else listed
    /// (one request) and cached.
    pub async fn list(
        &self,
        incus: &dyn Incus,
        project: &str,
        now: Instant,
        resync: Duration,
    ) -> Result<Vec<Instance>, IncusError> {
        if let Some(cached) = self.instances(project, now, resync) {
            return Ok(cached);
        }
        let ticket = self.ticket();
        let listed = incus.list(project).await?;
        self.listed(project, ticket, listed, now);
        Ok(self
            .instances(project, now, Duration::MAX)
            .unwrap_or_default())
    }

    /// Reads `name` again and takes in what is found (after the daemon acted on it).
    pub async fn refresh(&self, incus: &dyn Incus, project: &str, name: &str) {
        if !self.follows(project) {
            return;
        }
        let ticket = self.ticket();
        match incus.get(project, name).await {
            Ok(found) => self.put(project, name, ticket, found),
            // Not known: list the project again before trusting it.
            Err(_) => self.invalidate(project),
        }
    }

    /// The daemon starts acting on `name`: events about it are not read until [`Store::end`].
    pub fn begin(&self, project: &str, name: &str) {
        lock(&self.busy).insert((project.to_owned(), name.to_owned()), 0);
    }

    /// The daemon is done with `name` (and has written what it found): an event about it that
    /// came after that read is read now.
    pub async fn end(&self, incus: &dyn Incus, project: &str, name: &str) {
        let skipped = lock(&self.busy)
            .remove(&(project.to_owned(), name.to_owned()))
            .unwrap_or(0);
        if skipped > 0 && !self.written_since(project, name, skipped) {
            self.read_coalesced(incus, project, name).await;
        }
    }

    /// Reads `name` for an event, unless the daemon is acting on it (then noted for
    /// [`Store::end`]).
    async fn read_for_event(&self, incus: &dyn Incus, project: &str, name: &str) {
        let key = (project.to_owned(), name.to_owned());
        if let Some(skipped) = lock(&self.busy).get_mut(&key) {
            *skipped = self.ticket();
            return;
        }
        self.read_coalesced(incus, project, name).await;
    }

    /// Reads `name` for an event, coalesced with the other reads of it, at most
    /// [`READS_AT_ONCE`] instances at a time (see the module's header); returns once a read
    /// sent after this call is done.
    async fn read_coalesced(&self, incus: &dyn Incus, project: &str, name: &str) {
        let key = (project.to_owned(), name.to_owned());
        let waiting = {
            let mut reads = lock(&self.reads);
            match reads.get_mut(&key) {
                Some(r) => {
                    r.again |= r.sent;
                    let covering = r.round + u64::from(r.sent);
                    Some((r.done.subscribe(), covering))
                }
                None => {
                    let r = Reading {
                        round: 1,
                        sent: false,
                        again: false,
                        done: watch::Sender::new(0),
                    };
                    reads.insert(key.clone(), r);
                    None
                }
            }
        };
        if let Some((mut done, covering)) = waiting {
            // Its reader reads it for this event too (an error: the reader is gone).
            let _ = done.wait_for(|&d| d >= covering).await;
            return;
        }
        let mut reader = Reader {
            reads: &self.reads,
            key: Some(key.clone()),
        };
        loop {
            // Never closed, so never an error.
            let permit = self.gate.acquire().await;
            if let Some(r) = lock(&self.reads).get_mut(&key) {
                r.sent = true;
            }
            self.refresh(incus, project, name).await;
            drop(permit);
            let mut reads = lock(&self.reads);
            let Some(r) = reads.get_mut(&key) else {
                break;
            };
            r.done.send_replace(r.round);
            if !std::mem::take(&mut r.again) {
                reads.remove(&key);
                break;
            }
            r.round += 1;
            r.sent = false;
        }
        reader.key = None;
    }

    /// True when something about `name` was written with a ticket newer than `ticket`.
    fn written_since(&self, project: &str, name: &str, ticket: u64) -> bool {
        self.with(|p| {
            p.get(project)
                .and_then(|p| p.entries.get(name))
                .is_some_and(|e| e.ticket > ticket)
        })
    }

    /// True when the cache already holds `name` as the event says it is now: created (any
    /// status), or started (running).
    fn already_known(&self, project: &str, ev: &Lifecycle) -> bool {
        self.with(|p| {
            let Some(i) = p
                .get(project)
                .and_then(|p| p.entries.get(&ev.name))
                .and_then(|e| e.instance.as_ref())
            else {
                return false;
            };
            ev.action == CREATED || i.status().is_healthy()
        })
    }

    /// Takes in one lifecycle event (see the module's header for instances coming up).
    pub async fn apply(self: &Arc<Self>, incus: &Arc<dyn Incus>, ev: &Lifecycle) {
        if !self.follows(&ev.project) {
            return;
        }
        if ev.action == CREATED || ev.action == STARTED {
            if self.already_known(&ev.project, ev) {
                return;
            }
            let ticket = self.ticket();
            let (store, incus) = (Arc::clone(self), Arc::clone(incus));
            let (project, name) = (ev.project.clone(), ev.name.clone());
            tokio::spawn(async move {
                tokio::time::sleep(SETTLE).await;
                if !store.written_since(&project, &name, ticket) {
                    store.read_for_event(incus.as_ref(), &project, &name).await;
                }
            });
            return;
        }
        if let Some(old) = &ev.old_name {
            let ticket = self.ticket();
            self.put(&ev.project, old, ticket, None);
        }
        if ev.action == "instance-deleted" {
            let ticket = self.ticket();
            self.put(&ev.project, &ev.name, ticket, None);
        } else {
            self.read_for_event(incus.as_ref(), &ev.project, &ev.name)
                .await;
        }
    }
}

#[cfg(test)]
mod tests;
