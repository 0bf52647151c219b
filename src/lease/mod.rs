//! Leader leases: however many daemons watch a group (two hosts with the same package and
//! config, a second `incus-hpa run` by hand), one acts on it at a time; the others observe,
//! decide and report `standby`. No extra service: the lease lives in Incus itself, a config
//! key of the lease store of the group's project, a profile named [`LEASE_PROFILE`] that the
//! daemon makes (marked [`STORE_KEY`]` = leases`, used by no instance; a certificate
//! restricted to the project may write it, not the project's own config):
//! `user.incus-hpa.lease.GROUP = "HOLDER until=UNIX_MS"`, written by compare-and-swap on the
//! profile's ETag (`PUT` with `If-Match`; a 412 means another daemon wrote first).
//!
//! - **The store touches only its own keys.** Every write sends back everything else it read
//!   (devices, other keys, description) as it was. A profile of that name that the daemon did
//!   not make, or that an instance uses, is refused: nothing is written, the groups of the
//!   project stand by, and the journal says why ([`StoreProblem`]).
//! - A daemon takes a lease that is free, its own, expired (its end plus a drift margin is past
//!   by the wall clock), or whose holder is **proven dead** ([`holder`]: same kernel boot and
//!   PID namespace, and the PID no longer runs that process). Anything short of proof waits
//!   the lease out. It renews every third of the lease's length. A lease it has just taken is
//!   acted on only once the next round reads it back as its own ([`Standing::Confirming`]):
//!   Incus' ETag check and write are two steps, and two writers at the same instant can both
//!   be answered 200.
//! - **Fencing by time**: it acts only until its lease's end less the margin, measured on a
//!   clock that counts suspend (`CLOCK_BOOTTIME`) from before the read that led to the write.
//!   A holder that cannot renew (Incus away, the process stopped, the host suspended) stops
//!   acting before anyone else may start. The actor asks again before every step that changes
//!   something ([`Leases::holds`]).
//! - A lease whose end lies beyond `now + lease + margin` was written by a clock running
//!   ahead: it is trusted for one lease (and the margin) at most, counted on this daemon's own
//!   clock from when it first read that very value; logged once.
//! - A holder that dies is replaced within one lease period plus one renewal; on a clean
//!   shutdown it gives its leases up, so another daemon takes over at once.
//! - A lease nobody renewed for a day (a group no longer declared anywhere) is removed by the
//!   next daemon that writes leases in the project.

pub mod holder;
mod record;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::incus::{Incus, IncusError, LeaseHome, LEASE_PROFILE, STORE_KEY, STORE_VALUE};
pub use record::{claim, forget_stale, Claim, Record, KEY_PREFIX, STALE_AFTER};

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
    /// It wrote itself into a lease that was free, expired or a dead holder's, and acts once a
    /// later read still finds it there. Incus checks a profile's ETag and writes it in two
    /// steps, so two daemons writing at the same instant can both be told they won; the next
    /// read shows whose write stayed.
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

/// Why a project's lease store cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreProblem {
    /// A profile of that name exists that the daemon did not make.
    #[error(
        "the profile {LEASE_PROFILE} of project {project} was not made by incus-hpa (it has no \
         {STORE_KEY}={STORE_VALUE}): it is left as it is, and nothing is done in {project} until \
         it is renamed or removed (incus profile rename {LEASE_PROFILE} NEW-NAME --project {project})"
    )]
    NotOurs { project: String },
    /// Instances use the store profile.
    #[error(
        "the profile {LEASE_PROFILE} of project {project} is used by {used} instance(s) ({names}): \
         a lease store is attached to none, so it is left as it is, and nothing is done in \
         {project} until it is detached (incus profile remove INSTANCE {LEASE_PROFILE} --project \
         {project})"
    )]
    InUse {
        project: String,
        used: usize,
        names: String,
    },
}

impl StoreProblem {
    /// What is wrong with `home`, the store of `project` as read, if anything.
    pub fn of(project: &str, home: &LeaseHome) -> Option<StoreProblem> {
        if home.config.get(STORE_KEY).map(String::as_str) != Some(STORE_VALUE) {
            return Some(StoreProblem::NotOurs {
                project: project.to_owned(),
            });
        }
        if !home.used_by.is_empty() {
            let names: Vec<&str> = home
                .used_by
                .iter()
                .take(3)
                .map(|u| {
                    let path = u.split('?').next().unwrap_or(u);
                    path.rsplit('/').next().unwrap_or(path)
                })
                .collect();
            return Some(StoreProblem::InUse {
                project: project.to_owned(),
                used: home.used_by.len(),
                names: names.join(", "),
            });
        }
        None
    }
}

/// Why one round of leases did not go through.
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    #[error(transparent)]
    Incus(#[from] IncusError),
    #[error("{0}")]
    Store(StoreProblem),
}

impl LeaseError {
    /// True when Incus could not be reached.
    pub fn is_transport(&self) -> bool {
        matches!(self, LeaseError::Incus(e) if e.is_transport())
    }
}

/// The two clocks of leases: the wall clock they are written in (milliseconds since the Unix
/// epoch), and this daemon's own clock that fences its actions. The own clock must keep
/// counting while the host is suspended (`CLOCK_BOOTTIME`; tokio's clock, `CLOCK_MONOTONIC`,
/// stops), or a holder woken after a suspend would go on acting on a lease long gone.
#[derive(Clone)]
pub struct Clocks {
    pub wall: Arc<dyn Fn() -> i64 + Send + Sync>,
    pub mono: Arc<dyn Fn() -> Duration + Send + Sync>,
}

impl Clocks {
    /// The system's clocks: `CLOCK_REALTIME` and `CLOCK_BOOTTIME`.
    pub fn system() -> Self {
        Self {
            wall: Arc::new(wall_ms),
            mono: Arc::new(|| {
                let t = rustix::time::clock_gettime(rustix::time::ClockId::Boottime);
                Duration::new(
                    u64::try_from(t.tv_sec).unwrap_or(0),
                    u32::try_from(t.tv_nsec).unwrap_or(0),
                )
            }),
        }
    }

    /// Clocks that follow tokio's clock (paused, in tests), one for the whole process: every
    /// daemon of a test reads the same wall clock, which starts at the system's time when it
    /// is first asked for.
    pub fn tokio() -> Self {
        static START: std::sync::OnceLock<(tokio::time::Instant, i64)> = std::sync::OnceLock::new();
        let (t0, w0) = *START.get_or_init(|| (tokio::time::Instant::now(), wall_ms()));
        Self {
            wall: Arc::new(move || {
                w0 + record::ms(tokio::time::Instant::now().saturating_duration_since(t0))
            }),
            mono: Arc::new(move || tokio::time::Instant::now().saturating_duration_since(t0)),
        }
    }
}

/// The leases of one daemon.
pub struct Leases {
    me: String,
    /// This process's identity, to prove other holders dead.
    identity: Option<holder::Identity>,
    lease: Duration,
    clocks: Clocks,
    standing: Mutex<HashMap<(String, String), Standing>>,
    /// Per (project, group): the value last read and when (own clock) it was first read so.
    seen: Mutex<HashMap<(String, String), (String, Duration)>>,
    /// The groups to hold, by project (the desired state's).
    groups: Mutex<BTreeMap<String, Vec<String>>>,
    /// Renewals and releases one at a time, and none after the release: a renewal in flight
    /// must not write a lease back after the shutdown gave it up.
    writes: tokio::sync::Mutex<bool>,
    /// Held (shared) by this daemon's actions while they run ([`Leases::acting`]); a round
    /// that writes waits for them, at most a sixth of the lease. On Incus 6.0 a profile written
    /// in the same instant as a container is created can hold the start in `forkstart` until
    /// it fails 90 s later, and every write of a lease is a profile's (seen on the test
    /// machine in 3 tries of 4 when the renewal fell on the creations; never with this).
    acting: tokio::sync::RwLock<()>,
    /// The refusal last logged per project, so that it is logged once, not every renewal.
    refused: Mutex<HashMap<String, String>>,
    /// Per (project, group), the holder last said to write with a clock running ahead: a live
    /// one rewrites its lease every renewal, and is said once, not at every new value.
    skew_said: Mutex<HashMap<(String, String), String>>,
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
            seen: Mutex::new(HashMap::new()),
            groups: Mutex::new(BTreeMap::new()),
            writes: tokio::sync::Mutex::new(false),
            acting: tokio::sync::RwLock::new(()),
            refused: Mutex::new(HashMap::new()),
            skew_said: Mutex::new(HashMap::new()),
        }
    }

    /// The groups this daemon manages from now on, as (project, group).
    pub fn set_groups<'a>(&self, groups: impl IntoIterator<Item = (&'a str, &'a str)>) {
        let mut by_project: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (p, g) in groups {
            by_project
                .entry(p.to_owned())
                .or_default()
                .push(g.to_owned());
        }
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
        loop {
            tokio::time::sleep(self.lease / 3).await;
            self.renew_all(incus.as_ref()).await;
        }
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

    /// Held while this daemon's actions run: no lease is written meanwhile, unless they take
    /// longer than a sixth of the lease (a renewal is never late for them).
    pub async fn acting(&self) -> tokio::sync::RwLockReadGuard<'_, ()> {
        self.acting.read().await
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

    /// How long after taking a lease the daemon reads it again to confirm it (one renewal).
    pub fn confirm_after(&self) -> Duration {
        self.lease / 3
    }

    /// True while this daemon holds the lease of `group` of `project`: asked right before
    /// every step that changes something.
    pub fn holds(&self, project: &str, group: &str) -> bool {
        matches!(self.standing(project, group), Standing::Held { .. })
    }

    /// One round for `project`: reads its lease store once, takes or renews the lease of every
    /// group in `groups` it may, and writes them in one compare-and-swap. A race lost three
    /// times in a row (412) leaves the standings as they were, for the next round. A store
    /// that cannot be used is not written, and its groups stand by.
    pub async fn renew(
        &self,
        incus: &dyn Incus,
        project: &str,
        groups: &[String],
    ) -> Result<(), LeaseError> {
        // Not beside this daemon's own creations and starts (see `acting`); past the bound,
        // the round goes on: the lease matters more.
        let _quiet = tokio::time::timeout(self.lease / 6, self.acting.write())
            .await
            .ok();
        let released = self.writes.lock().await;
        if *released {
            return Ok(());
        }
        // Another daemon writing the same project (its own groups' leases) between the read
        // and the write makes the write fail (412): read again, a few times.
        for _ in 0..3 {
            let started = (self.clocks.mono)();
            let mut current = incus.leases(project).await?;
            if let Some(problem) = StoreProblem::of(project, &current) {
                let mut map = lock(&self.standing);
                for g in groups {
                    let why = problem.to_string();
                    map.insert((project.to_owned(), g.clone()), Standing::Refused { why });
                }
                return Err(LeaseError::Store(problem));
            }
            let now_ms = (self.clocks.wall)();
            let mut taken = Vec::new();
            let mut others = BTreeMap::new();
            for g in groups {
                let key = format!("{KEY_PREFIX}{g}");
                let raw = current.config.get(&key).cloned().unwrap_or_default();
                let stored = Record::parse(&raw);
                let unchanged_for = self.unchanged_for(project, g, &raw, started);
                let verdict = claim(
                    stored.as_ref(),
                    &self.me,
                    now_ms,
                    self.lease,
                    self.drift(),
                    unchanged_for,
                    |h| holder::proven_dead(h, self.identity.as_ref(), &holder::Proc),
                );
                match verdict {
                    Claim::Take(r) => {
                        current.config.insert(key, r.value());
                        // Still its own record: a renewal. Else a new lease, to be confirmed.
                        let renewal = stored.as_ref().is_some_and(|s| s.holder == self.me);
                        taken.push((g.clone(), renewal));
                    }
                    Claim::Wait | Claim::Skewed => {
                        let r = stored.unwrap_or_else(|| Record {
                            holder: String::new(),
                            until_ms: 0,
                        });
                        if verdict == Claim::Skewed {
                            self.say_skew(project, g, &r, now_ms);
                        }
                        others.insert(g.clone(), r.holder);
                    }
                }
            }
            if !taken.is_empty() {
                forget_stale(&mut current.config, now_ms);
            }
            let written = taken.is_empty() || incus.put_leases(project, &current).await?;
            if !written {
                continue;
            }
            let mut map = lock(&self.standing);
            let until = started + self.lease.saturating_sub(self.drift());
            for (g, renewal) in taken {
                let standing = if renewal {
                    Standing::Held { until }
                } else {
                    Standing::Confirming
                };
                map.insert((project.to_owned(), g), standing);
            }
            for (g, holder) in others {
                map.insert((project.to_owned(), g), Standing::Standby { holder });
            }
            return Ok(());
        }
        // Still losing the race: the standings stay as they were, for the next round.
        Ok(())
    }

    /// How long (own clock) `value` has been read unchanged for the lease of `group`.
    fn unchanged_for(&self, project: &str, group: &str, value: &str, now: Duration) -> Duration {
        let mut seen = lock(&self.seen);
        let entry = seen
            .entry((project.to_owned(), group.to_owned()))
            .or_insert_with(|| (value.to_owned(), now));
        if entry.0 != value {
            *entry = (value.to_owned(), now);
        }
        now.saturating_sub(entry.1)
    }

    /// Logs once per holder that the lease `r` of `group` ends too far ahead to be believed.
    fn say_skew(&self, project: &str, group: &str, r: &Record, now_ms: i64) {
        let key = (project.to_owned(), group.to_owned());
        if lock(&self.skew_said).insert(key, r.holder.clone()).as_ref() != Some(&r.holder) {
            let ahead = Duration::from_millis(u64::try_from(r.until_ms - now_ms).unwrap_or(0));
            tracing::warn!(project, group, holder = %r.holder,
                "the lease of group {group} ends {} from now by its holder {}'s clock, more \
                 than one lease ahead: that clock runs ahead of this host's. It is trusted for \
                 one lease at most, unless its holder renews it",
                humantime::format_duration(Duration::from_secs(ahead.as_secs())),
                holder::short(&r.holder));
        }
    }

    /// Gives up the leases this daemon holds in `project` (a clean shutdown), so another daemon
    /// takes over at once. A store that cannot be used is left as it is.
    pub async fn release(
        &self,
        incus: &dyn Incus,
        project: &str,
        groups: &[String],
    ) -> Result<(), LeaseError> {
        let mut current = incus.leases(project).await?;
        if let Some(problem) = StoreProblem::of(project, &current) {
            return Err(LeaseError::Store(problem));
        }
        let mut changed = false;
        for g in groups {
            let key = format!("{KEY_PREFIX}{g}");
            let mine = current
                .config
                .get(&key)
                .and_then(|v| Record::parse(v))
                .is_some_and(|r| r.holder == self.me);
            if mine {
                current.config.remove(&key);
                changed = true;
            }
        }
        if changed {
            incus.put_leases(project, &current).await?;
        }
        lock(&self.standing).retain(|(p, _), _| p != project);
        Ok(())
    }
}

/// How long a clean shutdown waits to give its leases up.
pub const RELEASE_TIMEOUT: Duration = Duration::from_secs(5);

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Milliseconds since the Unix epoch, by the system's clock.
pub fn wall_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, record::ms)
}
