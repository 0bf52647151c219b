//! Leader leases: however many daemons watch a group (two hosts with the same package and
//! config, a second `incus-hpa run` by hand), one acts on it at a time; the others observe,
//! decide and report `standby`. No extra service: the lease lives in Incus itself, a config
//! key of the lease store of the group's project, a profile named [`LEASE_PROFILE`] that the
//! daemon makes (marked [`STORE_KEY`](crate::incus::STORE_KEY)` = leases`, used by no
//! instance; a certificate restricted to the project may write it, not the project's own
//! config):
//! `user.incus-hpa.lease.GROUP = "HOLDER lease=MS until=UNIX_MS"` ([`Record`]), written by
//! compare-and-swap on the profile's ETag (`PUT` with `If-Match`; a 412 means another daemon
//! wrote first).
//!
//! - **The store touches only its own keys.** Every write sends back everything else it read
//!   (devices, other keys, description) as it was. A profile of that name that the daemon did
//!   not make, or that an instance uses, is refused: nothing is written, the groups of the
//!   project stand by, and the journal says why ([`StoreProblem`]).
//! - **One store, several projects.** A project made with `features.profiles=false` uses the
//!   default project's profiles, so its store is the default project's: there the key names
//!   the project too, `user.incus-hpa.lease.PROJECT.GROUP` ([`key`]). An older daemon wrote
//!   the group's name alone there; while such a lease runs, a group of that name in any
//!   project of the store stands by for it, as the older daemons did.
//! - A daemon takes a lease that is free, its own, expired (its end plus a drift margin is past
//!   by the wall clock), or whose holder is **proven dead** ([`holder`]: same kernel boot and
//!   PID namespace, and the PID no longer runs that process). Anything short of proof waits
//!   the lease out. It renews every third of the lease's length.
//! - **A new lease is confirmed before it is acted on** ([`Standing::Confirming`]): Incus'
//!   ETag check and write are two steps, and two writers at the same instant can both be
//!   answered 200. It is acted on once a round at least a third of a lease (5 s at most)
//!   after the write that took it ([`Leases::confirm_after`]) still reads it as its own; a round woken sooner
//!   leaves it as it is. Only a lease this daemon still holds by its own clock is renewed
//!   and acted on at once: its own record found after its lease ran out here (renewals that
//!   failed, a host that slept) is taken anew, and confirmed anew.
//! - **Fencing by time**: it acts only until its lease's end less the margin, measured on a
//!   clock that counts suspend (`CLOCK_BOOTTIME`) from before the read that led to the write.
//!   A holder that cannot renew (Incus away, the process stopped, the host suspended) stops
//!   acting before anyone else may start. The actor asks again before every step that changes
//!   something ([`Leases::holds`]).
//! - **Each lease says its length** (`lease=MS`), and is judged by it: daemons given different
//!   `[daemon] lease` values wait each other's leases out. A value an older daemon wrote says
//!   none, and is judged by the reader's own length.
//! - A lease whose end lies beyond `now` plus its length and the margin was written by a clock
//!   running ahead: it is trusted for its length (and the margin) at most, counted on this
//!   daemon's own clock from when it first read that very value; logged once.
//! - A holder that dies is replaced within its lease and the margin plus two renewals (one to
//!   take the lease, one to confirm it); on a clean shutdown it gives its leases up, so
//!   another daemon takes them at its next renewal.
//! - A lease nobody renewed for a day (a group no longer declared anywhere) is removed by the
//!   next daemon that writes leases in the store.

mod clocks;
pub mod holder;
pub mod learned;
mod record;
mod round;
mod store;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::incus::{Incus, LEASE_PROFILE};
pub use clocks::{wall_ms, Clocks};
pub use record::{
    claim, forget_stale, key, shares_store, Claim, Record, KEY_PREFIX, LONGEST, STALE_AFTER,
};
pub use store::{LeaseError, StoreProblem};

/// This daemon's standing on one group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Standing {
    /// Held: it may act until this reading of its own clock ([`Clocks::mono`]).
    Held { until: Duration },
    /// Another daemon holds it.
    Standby { holder: String },
    /// The project's lease store cannot be used: nothing is done.
    Refused { why: String },
    /// Not known yet (not read, or Incus did not answer).
    Unknown,
    /// It wrote itself into a lease that was free, expired or a dead holder's (or its own,
    /// found after its lease ran out here), and acts once a read at least
    /// [`Leases::confirm_after`] after that write still finds it there. Incus checks a
    /// profile's ETag and writes it in two steps, so two daemons writing at the same instant
    /// can both be told they won; a read that much later shows whose write stayed.
    Confirming,
}

impl Standing {
    /// Whether a daemon is known to act on the group: this one, or the holder it stands by for
    /// (on the same file and rule). Not while this daemon's new lease is not confirmed yet, its
    /// store is refused, or the lease is not known yet.
    pub fn someone_acts(&self) -> bool {
        matches!(self, Standing::Held { .. } | Standing::Standby { .. })
    }

    /// Who acts instead of this daemon, or why nobody does, for `status` and the journal;
    /// `None` when this daemon acts.
    pub fn standby(&self) -> Option<String> {
        match self {
            Standing::Held { .. } => None,
            Standing::Standby { holder } => Some(holder::short(holder).to_owned()),
            Standing::Refused { why } => Some(format!("nobody: {why}")),
            Standing::Unknown => Some("another daemon (not known yet)".to_owned()),
            Standing::Confirming => Some("this daemon, once its new lease is confirmed".to_owned()),
        }
    }
}

/// A (project, group).
type Group = (String, String);

/// Per (project, group) and key (`true`: an older daemon's under the group's name alone in a
/// store shared by projects), the value last read and when (own clock) it was first read so.
type Seen = HashMap<(String, String, bool), (String, Duration)>;

/// A lease this daemon has just taken, on its own clock: when the round that took it read the
/// store (its fence counts from there), and when the write was answered (its confirmation
/// counts from there).
#[derive(Debug, Clone, Copy)]
struct Take {
    read: Duration,
    wrote: Duration,
}

/// What a round does with a lease [`claim`] lets this daemon write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    /// Its own, held by its own clock: renewed, held.
    Renew,
    /// Its own, taken at least [`Leases::confirm_after`] ago and read back now: held.
    Confirm,
    /// Its own, taken less than [`Leases::confirm_after`] ago: left as it is, confirming.
    Early,
    /// Free, expired, a dead holder's, or its own found after its lease ran out here: taken,
    /// to be confirmed.
    New,
}

/// The leases of one daemon.
pub struct Leases {
    me: String,
    /// This process's identity, to prove other holders dead.
    identity: Option<holder::Identity>,
    lease: Duration,
    clocks: Clocks,
    standing: Mutex<HashMap<Group, Standing>>,
    /// The leases taken and not confirmed yet.
    taken: Mutex<HashMap<Group, Take>>,
    /// The values read and since when.
    seen: Mutex<Seen>,
    /// The groups to hold, by project (the desired state's).
    groups: Mutex<BTreeMap<String, Vec<String>>>,
    /// Renewals and releases one at a time, and none after the release: a renewal in flight
    /// must not write a lease back after the shutdown gave it up.
    writes: tokio::sync::Mutex<bool>,
    /// Held (shared) by each of this daemon's actions that creates, starts or promotes an
    /// instance while it runs ([`Leases::quiet`]); a round that writes waits for them, at most
    /// a sixth of the lease, and the actions not begun yet wait for the round (the lock is
    /// fair: a waiting writer goes before later readers). On Incus 6.0 a profile written
    /// in the same instant as a container is created can hold the start in `forkstart` until
    /// it fails 90 s later, and every write of a lease is a profile's (seen on the test
    /// machine in 3 tries of 4 when the renewal fell on the creations; never with this).
    quiet: tokio::sync::RwLock<()>,
    /// The refusal last logged per project, so that it is logged once, not every renewal.
    refused: Mutex<HashMap<String, String>>,
    /// What this daemon learned of the groups it holds, for the next holder (see [`learned`]).
    learned: learned::Outbox,
    /// What the holders before it left, read when it takes groups over.
    left: learned::Reads,
    /// Per (project, group), the holder last said to write with a clock running ahead: a live
    /// one rewrites its lease every renewal, and is said once, not at every new value.
    skew_said: Mutex<HashMap<Group, String>>,
}

impl Leases {
    /// This process's leases: its holder id (see [`holder::holder_id`]), the system's clocks.
    pub fn new(lease: Duration) -> Self {
        let me = holder::Identity::of_this_process();
        Self::with(holder::holder_id(me.as_ref()), me, lease, Clocks::system())
    }

    /// Leases held as `me`, proving other holders dead from `identity`, on `clocks`.
    pub fn with(
        me: String,
        identity: Option<holder::Identity>,
        lease: Duration,
        clocks: Clocks,
    ) -> Self {
        Self {
            me,
            identity,
            lease,
            clocks,
            standing: Mutex::new(HashMap::new()),
            taken: Mutex::new(HashMap::new()),
            seen: Mutex::new(HashMap::new()),
            groups: Mutex::new(BTreeMap::new()),
            writes: tokio::sync::Mutex::new(false),
            quiet: tokio::sync::RwLock::new(()),
            refused: Mutex::new(HashMap::new()),
            learned: learned::Outbox::default(),
            left: learned::Reads::default(),
            skew_said: Mutex::new(HashMap::new()),
        }
    }

    /// The groups this daemon manages from now on, as (project, group). What it knew of the
    /// others (standings, values seen, what it logged) is forgotten.
    pub fn set_groups<'a>(&self, groups: impl IntoIterator<Item = (&'a str, &'a str)>) {
        let mut by_project: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (p, g) in groups {
            by_project
                .entry(p.to_owned())
                .or_default()
                .push(g.to_owned());
        }
        let managed = |p: &str, g: &str| {
            by_project
                .get(p)
                .is_some_and(|gs| gs.iter().any(|x| x == g))
        };
        lock(&self.standing).retain(|(p, g), _| managed(p, g));
        lock(&self.taken).retain(|(p, g), _| managed(p, g));
        lock(&self.seen).retain(|(p, g, _), _| managed(p, g));
        lock(&self.skew_said).retain(|(p, g), _| managed(p, g));
        lock(&self.refused).retain(|p, _| by_project.contains_key(p));
        *lock(&self.groups) = by_project;
    }

    /// The groups to hold, by project.
    pub fn groups(&self) -> BTreeMap<String, Vec<String>> {
        lock(&self.groups).clone()
    }

    /// Renews every lease of every project now; a project Incus does not answer for keeps
    /// its standings (they run out by themselves).
    pub async fn renew_all(&self, incus: &dyn Incus) {
        for (project, groups) in self.groups() {
            let result = self.renew(incus, &project, &groups).await;
            self.say(&project, result);
        }
    }

    /// Logs the outcome of a round for `project`: a refusal once, until it changes.
    pub fn say(&self, project: &str, result: Result<(), LeaseError>) {
        let mut refused = lock(&self.refused);
        match result {
            Ok(()) => {
                if refused.remove(project).is_some() {
                    tracing::info!(
                        project,
                        "the lease store of project {project} can be used again"
                    );
                }
            }
            // Incus away: said by the passes already.
            Err(e) if e.is_transport() => {
                tracing::debug!(project, error = %e, "cannot renew the leases of project {project}: {e}");
            }
            // Refused (a certificate that may not write the store, or a store that is not
            // the daemon's): nothing is done in the project until it can; said once.
            Err(e) => {
                let message = e.to_string();
                if refused.get(project) != Some(&message) {
                    tracing::error!(project, error = %e,
                        "cannot take the leases of project {project}: {e}. Nothing is done in \
                         {project} until this daemon may write its lease store, the profile \
                         {LEASE_PROFILE} there");
                    refused.insert(project.to_owned(), message);
                }
            }
        }
    }

    /// Keeps the leases renewed, every third of their length, until the process ends.
    pub async fn keep(self: Arc<Self>, incus: Arc<dyn Incus>) {
        // The first no sooner than a minute after the start: nothing is learned before, and
        // the first minute is the busiest (the first passes, their creations).
        let mut learned_at = tokio::time::Instant::now();
        loop {
            tokio::time::sleep(self.lease / 3).await;
            self.renew_all(incus.as_ref()).await;
            self.left.expire();
            // What was learned, at most every minute, and not beside this daemon's creations.
            let due = learned_at.elapsed() >= learned::EVERY;
            if due && !self.learned.is_empty() {
                if let Ok(_quiet) = self.quiet.try_write() {
                    learned_at = tokio::time::Instant::now();
                    self.learned.write(incus.as_ref()).await;
                }
            }
        }
    }

    /// What this daemon learned of the groups it holds, waiting to be left for the next
    /// holder ([`learned`]).
    pub fn learned(&self) -> &learned::Outbox {
        &self.learned
    }

    /// What the holders before this daemon left ([`learned`]).
    pub fn left(&self) -> &learned::Reads {
        &self.left
    }

    /// Gives up every lease held (a clean shutdown); no renewal writes after it. Bounded by
    /// [`RELEASE_TIMEOUT`]: a shutdown never waits long for an Incus that does not answer
    /// (the leases then run out by themselves).
    pub async fn release_all(&self, incus: &dyn Incus) {
        *self.writes.lock().await = true;
        let all = async {
            for (project, groups) in self.groups() {
                if let Err(e) = self.release(incus, &project, &groups).await {
                    tracing::debug!(project, error = %e, "cannot release the leases of project {project}: {e}");
                }
            }
        };
        if tokio::time::timeout(RELEASE_TIMEOUT, all).await.is_err() {
            tracing::debug!(
                "leases not released within {RELEASE_TIMEOUT:?}: they run out by themselves"
            );
        }
    }

    /// What this daemon's actions that bring instances up hold for reading while they run
    /// (`act::Ctx::quiet`): no lease is written meanwhile, unless they take longer than a sixth
    /// of the lease (a renewal is never late for them); a round waiting to write holds back
    /// the next one, so that a long burst of creations lets it through between two of them.
    pub fn quiet(&self) -> &tokio::sync::RwLock<()> {
        &self.quiet
    }

    /// This daemon's holder id.
    pub fn me(&self) -> &str {
        &self.me
    }

    /// How long a lease lasts.
    pub fn length(&self) -> Duration {
        self.lease
    }

    /// The margin kept for clock drift: a fifth of the lease.
    pub fn drift(&self) -> Duration {
        self.lease / 5
    }

    /// Whether this daemon may act on `group` of `project` now.
    pub fn standing(&self, project: &str, group: &str) -> Standing {
        let now = (self.clocks.mono)();
        let map = lock(&self.standing);
        match map.get(&(project.to_owned(), group.to_owned())) {
            Some(Standing::Held { until }) if *until > now => Standing::Held { until: *until },
            Some(Standing::Held { .. }) | None => Standing::Unknown,
            Some(other) => other.clone(),
        }
    }

    /// How long after the write that took a lease a read must come to confirm it: one
    /// renewal, [`CONFIRM_MAX`] at most; a round sooner leaves it [`Standing::Confirming`].
    pub fn confirm_after(&self) -> Duration {
        (self.lease / 3).min(CONFIRM_MAX)
    }

    /// How long from now until a round may confirm the lease this daemon has just taken of
    /// `group` of `project` (zero once it may); `None` when it is not confirming one.
    pub fn confirm_in(&self, project: &str, group: &str) -> Option<Duration> {
        let key = (project.to_owned(), group.to_owned());
        if lock(&self.standing).get(&key) != Some(&Standing::Confirming) {
            return None;
        }
        let wrote = lock(&self.taken).get(&key)?.wrote;
        Some((wrote + self.confirm_after()).saturating_sub((self.clocks.mono)()))
    }

    /// True while this daemon holds the lease of `group` of `project`: asked right before
    /// every step that changes something.
    pub fn holds(&self, project: &str, group: &str) -> bool {
        matches!(self.standing(project, group), Standing::Held { .. })
    }
}

/// The longest wait between the write that takes a lease and the read that confirms it. What
/// it waits out is a write racing with its own (two daemons answered 200 for one ETag): a
/// request already past Incus' check, which lands within moments. A long lease (`600s`
/// renews every 200 s) must not keep a new holder idle for a third of it.
pub const CONFIRM_MAX: Duration = Duration::from_secs(5);

/// How long a clean shutdown waits to give its leases up.
pub const RELEASE_TIMEOUT: Duration = Duration::from_secs(5);

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests;
