//! The informer: a local copy of the instances that carry a group key, per project, kept up to
//! date by Incus' lifecycle events, so that a steady pass asks nothing of incusd. It is the
//! Kubernetes informer pattern (the first seed): list once, then watch, resync rarely.
//!
//! - A project is listed (one filtered `recursion=1` request) the first time a group of it is
//!   observed, again whenever the event stream (re)connects (events may have been missed), and
//!   again every `[daemon] resync` as a guard against anything missed. One listing of a project
//!   is in flight at a time: the passes that find it stale together take what the first one
//!   lists (a thousand groups starting at once make one listing, not a thousand copies of it).
//! - A project no group observes any more is dropped ([`Store::retain_projects`], on every
//!   change of the desired state): its instances leave the cache and its events are not read.
//! - Each lifecycle event about an instance of a listed project reads that one instance again
//!   (`instance-deleted` drops it); the daemon's own actions write their result in at once.
//! - Reads for events are coalesced per instance: at most one is queued or in flight for an
//!   instance. An event that comes while its read is queued is covered by it (it is sent after
//!   the event); one that came before the read in flight was sent is covered by it too; one
//!   that came after has the instance read once more after it, however many come, so the
//!   newest state is always read. Every event is taken in (and its groups woken) once the
//!   read that covers it is done. Across instances, at most [`READS_AT_ONCE`] such reads are
//!   in flight: a mass stop of many instances opens no more connections to incusd than that.
//! - Instances coming up (`instance-created`, `instance-started`) are the exception. On Incus
//!   6.0, reading instances while others start slows the starts down (a burst of 50 at 4 at a
//!   time: 0.90× the sequential time with those reads, 0.59× without, as fast as the bare API)
//!   and now and then stalls one until the 90 s start timeout (`forkstart` hangs). So they are
//!   not read at once: not at all when the cache already shows them so (the daemon's own
//!   creations and starts write their result), otherwise [`SETTLE`] later, unless something
//!   newer was written by then.
//! - The event follower ([`crate::events`]) takes each event in with [`Store::intake`] (what
//!   needs no read: deletions, renames' old names) and queues the reads it asks for, one per
//!   instance however many events came ([`crate::events::queue`]), which it makes with
//!   [`Store::read_event`] (see `reads`).
//! - While the daemon acts on an instance, events about it are not read: the action reads its
//!   result itself, and an event that came after that read is read when the action ends.
//! - Every read takes a [`Ticket`] before it is sent; a write with an older ticket than the
//!   entry's loses, and a removal leaves a tombstone, so a slow read can never bring back an
//!   instance that a later one saw gone. A tombstone is kept only while a read sent before it
//!   may still write (its ticket is held): once none can, it has served, and the project's
//!   next write drops it. The cache holds the instances there are, not every name an event
//!   ever named (each event about an instance of no group leaves one, as a deletion does).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Semaphore;
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

/// A read about to be sent: its place in the order of reads. While it is held, what the read
/// finds may still be written ([`Store::put`], [`Store::listed`]), so the tombstones newer than
/// it are kept; it is let go when written or dropped (the read failed or was given up).
#[derive(Debug)]
pub struct Ticket {
    number: u64,
    held: Arc<Mutex<BTreeSet<u64>>>,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        lock(&self.held).remove(&self.number);
    }
}

#[derive(Debug, Clone)]
struct Entry {
    ticket: u64,
    /// `None`: gone (or no longer in any group), kept so that older reads lose. Shared: a
    /// pass takes its group's instances without copying them.
    instance: Option<Arc<Instance>>,
}

#[derive(Debug, Default)]
struct Project {
    /// When the project was last listed; `None` until then, or after an invalidation.
    listed: Option<Instant>,
    entries: BTreeMap<String, Entry>,
    /// How many of the entries are tombstones.
    graves: usize,
    /// The live entries by the value of their group key: a group's pass reads its own, not
    /// the project's (see [`Store::group_instances`]).
    by_group: HashMap<String, BTreeSet<String>>,
}

/// What the cache keeps of an instance, shared: what a read keeps of its config
/// ([`Instance::keeps`]; an instance made otherwise, as by a test's fake, is trimmed here).
fn kept(mut i: Instance) -> Arc<Instance> {
    if i.config.keys().any(|k| !Instance::keeps(k)) {
        i.config.retain(|k, _| Instance::keeps(k));
        i.config.shrink_to_fit();
    }
    Arc::new(i)
}

/// The group key's value of an instance.
fn group_of(i: &Instance) -> Option<&str> {
    i.config.get(GROUP_KEY).map(String::as_str)
}

impl Project {
    /// Makes the index by group anew from the entries (after a listing).
    fn reindex(&mut self) {
        self.by_group.clear();
        for (name, e) in &self.entries {
            if let Some(g) = e.instance.as_deref().and_then(group_of) {
                self.by_group
                    .entry(g.to_owned())
                    .or_default()
                    .insert(name.clone());
            }
        }
    }

    /// Follows one entry's change in the index: `name` was in the group `from` and is in `to`.
    fn moved(&mut self, name: &str, from: Option<&str>, to: Option<&str>) {
        if from == to {
            return;
        }
        if let Some(g) = from {
            if let Some(names) = self.by_group.get_mut(g) {
                names.remove(name);
                if names.is_empty() {
                    self.by_group.remove(g);
                }
            }
        }
        if let Some(g) = to {
            self.by_group
                .entry(g.to_owned())
                .or_default()
                .insert(name.to_owned());
        }
    }

    /// Drops the tombstones no read in flight is older than (`oldest`: the oldest ticket
    /// held, if any): nothing they stand against can come any more.
    fn bury(&mut self, oldest: Option<u64>) {
        if self.graves == 0 {
            return;
        }
        let oldest = oldest.unwrap_or(u64::MAX);
        self.entries
            .retain(|_, e| e.instance.is_some() || e.ticket > oldest);
        self.graves = self.count_graves();
    }

    fn count_graves(&self) -> usize {
        self.entries
            .values()
            .filter(|e| e.instance.is_none())
            .count()
    }
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
    /// The tickets held (reads in flight that may still write).
    held: Arc<Mutex<BTreeSet<u64>>>,
    /// Instances with a read for events queued or in flight.
    reads: Mutex<HashMap<Key, Reading>>,
    /// At most [`READS_AT_ONCE`] reads for events in flight.
    gate: Semaphore,
    /// One listing per project at a time ([`Store::read_through`]).
    listing: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

impl Default for Store {
    fn default() -> Self {
        Self {
            projects: Mutex::default(),
            busy: Mutex::default(),
            tickets: AtomicU64::default(),
            held: Arc::default(),
            reads: Mutex::default(),
            gate: Semaphore::new(READS_AT_ONCE),
            listing: Mutex::default(),
        }
    }
}

/// A mutex's contents, even after a panic while it was held.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Store {
    /// A ticket for a read about to be sent; give it to [`Store::put`] with what the read
    /// found.
    pub fn ticket(&self) -> Ticket {
        // Taken and held at once: a tombstone newer than it is never dropped in between.
        let mut held = lock(&self.held);
        let number = self.stamp();
        held.insert(number);
        Ticket {
            number,
            held: Arc::clone(&self.held),
        }
    }

    /// The next number in the order of reads, for comparisons (a ticket not held).
    fn stamp(&self) -> u64 {
        self.tickets.fetch_add(1, Ordering::SeqCst) + 1
    }

    /// The oldest ticket held, if any.
    fn oldest_held(&self) -> Option<u64> {
        lock(&self.held).first().copied()
    }

    fn with<T>(&self, f: impl FnOnce(&mut HashMap<String, Project>) -> T) -> T {
        f(&mut lock(&self.projects))
    }

    /// What `f` reads of the project, when its listing is fresh (less than `resync` old);
    /// `None` when it must be listed.
    fn fresh<T>(
        &self,
        project: &str,
        now: Instant,
        resync: Duration,
        f: impl FnOnce(&Project) -> T,
    ) -> Option<T> {
        self.with(|p| {
            let p = p.get(project)?;
            let listed = p.listed?;
            (now.saturating_duration_since(listed) < resync).then(|| f(p))
        })
    }

    /// The project's instances carrying a group key, when its listing is fresh (less than
    /// `resync` old); `None` when it must be listed.
    pub fn instances(
        &self,
        project: &str,
        now: Instant,
        resync: Duration,
    ) -> Option<Vec<Instance>> {
        self.fresh(project, now, resync, |p| {
            p.entries
                .values()
                .filter_map(|e| e.instance.as_deref().cloned())
                .collect()
        })
    }

    /// The project's instances whose group key is `group` (the group's own, and those that
    /// carry its name without being its own), when its listing is fresh (less than `resync`
    /// old); `None` when it must be listed. Only those are looked at: a group's pass costs
    /// what the group holds, however many groups the project has.
    pub fn group_instances(
        &self,
        project: &str,
        group: &str,
        now: Instant,
        resync: Duration,
    ) -> Option<Vec<Arc<Instance>>> {
        self.fresh(project, now, resync, |p| {
            p.by_group.get(group).map_or_else(Vec::new, |names| {
                names
                    .iter()
                    .filter_map(|n| p.entries.get(n)?.instance.clone())
                    .collect()
            })
        })
    }

    /// Takes in a listing of the project, read with `ticket`, at `now`: the instances carrying
    /// a group key, and those of them that are now on a member that does not answer (listed
    /// without their config): these keep what was last known of them, marked unreachable.
    /// One such instance not known before is left out: nothing says whose it is.
    pub fn listed(&self, project: &str, ticket: Ticket, instances: Vec<Instance>, now: Instant) {
        self.with(|p| {
            let held = ticket;
            let ticket = held.number;
            let p = p.entry(project.to_owned()).or_default();
            let before = std::mem::take(&mut p.entries);
            let instances = instances.into_iter().filter_map(|i| {
                if !i.is_unavailable() {
                    return i.config.contains_key(GROUP_KEY).then_some(i);
                }
                let known = before.get(&i.name)?.instance.as_deref()?.clone();
                Some(Instance {
                    unreachable: true,
                    status: i.status,
                    location: i.location,
                    ..known
                })
            });
            let instances: Vec<Arc<Instance>> = instances.map(kept).collect();
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
            p.graves = p.count_graves();
            p.reindex();
            // Written: let go before the tombstones are looked at (the lock is still held).
            drop(held);
            p.bury(self.oldest_held());
        })
    }

    /// Takes in what a read of one instance, sent with `ticket`, found (`None`: gone). Only for
    /// projects already listed; a read older than what is known loses.
    pub fn put(&self, project: &str, name: &str, ticket: Ticket, found: Option<Instance>) {
        let found = found.filter(|i| i.config.contains_key(GROUP_KEY)).map(kept);
        self.with(|p| {
            let Some(p) = p.get_mut(project) else {
                return;
            };
            match p.entries.get(name) {
                Some(e) if e.ticket > ticket.number => {}
                _ => {
                    let grave = found.is_none();
                    let to = found.as_deref().and_then(group_of).map(str::to_owned);
                    let entry = Entry {
                        ticket: ticket.number,
                        instance: found,
                    };
                    let was = p.entries.insert(name.to_owned(), entry);
                    let was = was.and_then(|e| {
                        p.graves -= usize::from(e.instance.is_none());
                        e.instance
                    });
                    p.moved(name, was.as_deref().and_then(group_of), to.as_deref());
                    p.graves += usize::from(grave);
                }
            }
            // Written: let go before the tombstones are looked at (the lock is still held).
            drop(ticket);
            p.bury(self.oldest_held());
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
        lock(&self.listing).retain(|project, _| keep.contains(project));
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

    /// How many entries the project holds, tombstones included.
    #[cfg(test)]
    fn entries(&self, project: &str) -> usize {
        self.with(|p| p.get(project).map_or(0, |p| p.entries.len()))
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
        self.read_through(incus, project, now, resync, |s, fresh| {
            s.instances(project, now, fresh)
        })
        .await
    }

    /// The project's instances whose group key is `group` ([`Store::group_instances`]): from
    /// the cache when fresh, else the project is listed (one request) and cached.
    pub async fn list_group(
        &self,
        incus: &dyn Incus,
        project: &str,
        group: &str,
        now: Instant,
        resync: Duration,
    ) -> Result<Vec<Arc<Instance>>, IncusError> {
        self.read_through(incus, project, now, resync, |s, fresh| {
            s.group_instances(project, group, now, fresh)
        })
        .await
    }

    /// What `pick` reads from the cache (given how fresh it must be) when the project's
    /// listing is fresh, else after listing it (one request). A listing of the project already
    /// in flight is waited for and read from instead of sent again.
    async fn read_through<T>(
        &self,
        incus: &dyn Incus,
        project: &str,
        now: Instant,
        resync: Duration,
        pick: impl Fn(&Self, Duration) -> Option<Vec<T>>,
    ) -> Result<Vec<T>, IncusError> {
        if let Some(cached) = pick(self, resync) {
            return Ok(cached);
        }
        let one = Arc::clone(lock(&self.listing).entry(project.to_owned()).or_default());
        let _listing = one.lock().await;
        if let Some(cached) = pick(self, resync) {
            return Ok(cached);
        }
        let ticket = self.ticket();
        let listed = incus.list(project).await?;
        self.listed(project, ticket, listed, now);
        Ok(pick(self, Duration::MAX).unwrap_or_default())
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
}

mod reads;
pub use reads::Read;
use reads::Reading;

#[cfg(test)]
mod tests;
