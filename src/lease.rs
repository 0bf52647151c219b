//! Leader leases: however many daemons watch a group (two hosts with the same package and
//! config, a second `incus-hpa run` by hand), one acts on it at a time; the others observe,
//! decide and report `standby`. No extra service: the lease lives in Incus itself, a config
//! key of the profile `incus-hpa` of the group's project (made when missing, used by no
//! instance; a certificate restricted to the project may write it, not the project's own
//! config), `user.incus-hpa.lease.GROUP = "HOLDER until=UNIX_MS"`, written by compare-and-swap
//! on the profile's ETag (`PUT` with `If-Match`; a 412 means another daemon wrote first).
//!
//! - A daemon takes a lease that is free, expired (its end plus a drift margin is past by the
//!   wall clock) or its own, and renews it every third of its length.
//! - It acts only until its lease's end less the margin, measured on its own monotonic clock
//!   from before the read that led to the write: a holder that cannot renew (Incus away, the
//!   process stopped) stops acting before anyone else may start (fencing by time, with margin
//!   for clock drift between hosts).
//! - A holder that dies is replaced within one lease period plus one renewal.
//! - On a clean shutdown it gives its leases up, so another daemon takes over at once.
//! - A lease nobody renewed for a day (a group no longer declared anywhere) is removed by the
//!   next daemon that writes leases in the project.
//!
//! [`claim`] is the pure rule; [`Leases`] keeps what this daemon holds.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use crate::incus::{Incus, IncusError};

/// The config key of a group's lease (in the project's lease profile) is this prefix plus the
/// group's name.
pub const KEY_PREFIX: &str = "user.incus-hpa.lease.";

/// A stored lease: who holds it, until when (milliseconds since the Unix epoch).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub holder: String,
    pub until_ms: i64,
}

impl Record {
    /// Reads `HOLDER until=MS`; anything else is no lease.
    pub fn parse(value: &str) -> Option<Record> {
        let (holder, until) = value.trim().rsplit_once(" until=")?;
        Some(Record {
            holder: holder.to_owned(),
            until_ms: until.parse().ok()?,
        })
    }

    pub fn value(&self) -> String {
        format!("{} until={}", self.holder, self.until_ms)
    }
}

/// The record `me` writes, if it may take or renew the lease now; `None` while another holds
/// it (until its end plus `drift`).
///
/// `gone` says whether a holder is known to be dead (a process of this host that no longer
/// runs): its lease is free at once, so a daemon restarted after a crash does not wait for
/// the lease of the one it replaces.
pub fn claim(
    stored: Option<&Record>,
    me: &str,
    now_ms: i64,
    lease: Duration,
    drift: Duration,
    gone: impl Fn(&str) -> bool,
) -> Option<Record> {
    let free = match stored {
        None => true,
        Some(r) => {
            r.holder == me || r.until_ms.saturating_add(ms(drift)) <= now_ms || gone(&r.holder)
        }
    };
    free.then(|| Record {
        holder: me.to_owned(),
        until_ms: now_ms.saturating_add(ms(lease)),
    })
}

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// This daemon's standing on one group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Standing {
    /// Held: it may act until this instant (its own clock).
    Held { until: Instant },
    /// Another daemon holds it.
    Standby { holder: String },
    /// Not known yet (not read, or Incus did not answer).
    Unknown,
}

/// The leases of one daemon.
/// Milliseconds since the Unix epoch: the clock leases are written in.
pub type WallClock = std::sync::Arc<dyn Fn() -> i64 + Send + Sync>;

pub struct Leases {
    me: String,
    lease: Duration,
    wall: WallClock,
    standing: Mutex<HashMap<(String, String), Standing>>,
    /// The groups to hold, by project (the desired state's).
    groups: Mutex<BTreeMap<String, Vec<String>>>,
    /// Renewals and releases one at a time, and none after the release: a renewal in flight
    /// must not write a lease back after the shutdown gave it up.
    writes: tokio::sync::Mutex<bool>,
    /// The refusal last logged per project, so that it is logged once, not every renewal.
    refused: Mutex<HashMap<String, String>>,
}

impl Leases {
    pub fn new(me: String, lease: Duration) -> Self {
        Self::with_clock(me, lease, std::sync::Arc::new(wall_ms))
    }

    /// Like [`Leases::new`], with the wall clock given (tests run on a paused clock).
    pub fn with_clock(me: String, lease: Duration, wall: WallClock) -> Self {
        Self {
            me,
            lease,
            wall,
            standing: Mutex::new(HashMap::new()),
            groups: Mutex::new(BTreeMap::new()),
            writes: tokio::sync::Mutex::new(false),
            refused: Mutex::new(HashMap::new()),
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
        *self.groups.lock().unwrap_or_else(|e| e.into_inner()) = by_project;
    }

    /// The groups to hold, by project.
    pub fn groups(&self) -> BTreeMap<String, Vec<String>> {
        self.groups
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Renews every lease of every project now; a project Incus does not answer for keeps
    /// its standings (they run out by themselves).
    pub async fn renew_all(&self, incus: &dyn Incus) {
        for (project, groups) in self.groups() {
            let result = self.renew(incus, &project, &groups).await;
            let mut refused = self.refused.lock().unwrap_or_else(|e| e.into_inner());
            match result {
                Ok(()) => {
                    refused.remove(&project);
                }
                // Incus away: said by the passes already.
                Err(e) if e.is_transport() => {
                    tracing::debug!(project, error = %e, "cannot renew the leases of project {project}: {e}");
                }
                // Refused (a certificate that may not write the project's profile
                // `incus-hpa`): nothing is done in the project until it can; said once.
                Err(e) => {
                    let message = e.to_string();
                    if refused.get(&project) != Some(&message) {
                        tracing::warn!(project, error = %e,
                            "cannot take the leases of project {project}: {e}. Nothing is done \
                             in {project} until this daemon may write the profile {} there",
                            crate::incus::LEASE_PROFILE);
                        refused.insert(project, message);
                    }
                }
            }
        }
    }

    /// Keeps the leases renewed, every third of their length, until the process ends.
    pub async fn keep(self: std::sync::Arc<Self>, incus: std::sync::Arc<dyn Incus>) {
        loop {
            tokio::time::sleep(self.lease / 3).await;
            self.renew_all(incus.as_ref()).await;
        }
    }

    /// Gives up every lease held (a clean shutdown); no renewal writes after it.
    pub async fn release_all(&self, incus: &dyn Incus) {
        *self.writes.lock().await = true;
        for (project, groups) in self.groups() {
            if let Err(e) = self.release(incus, &project, &groups).await {
                tracing::debug!(project, error = %e, "cannot release the leases of project {project}: {e}");
            }
        }
    }

    /// A holder id naming this host and process: `HOST:PID:RANDOM`.
    pub fn holder_id() -> String {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_owned())
            .unwrap_or_else(|_| "host".into());
        let tag: String = (0..4).map(|_| fastrand::alphanumeric()).collect();
        format!("{host}:{}:{tag}", std::process::id())
    }

    /// A holder of this host (`HOST:PID:TAG`, the same `HOST` as this daemon's) whose process
    /// is no longer an incus-hpa: it died, and its lease need not be waited for.
    fn gone(&self, holder: &str) -> bool {
        let mut parts = holder.rsplitn(3, ':');
        let (_tag, pid, host) = (parts.next(), parts.next(), parts.next());
        let my_host = self.me.rsplitn(3, ':').nth(2);
        match (host, pid.and_then(|p| p.parse::<u32>().ok())) {
            (Some(h), Some(pid)) if Some(h) == my_host && pid != std::process::id() => {
                !std::fs::read_to_string(format!("/proc/{pid}/comm"))
                    .is_ok_and(|c| c.trim_end().starts_with("incus-hpa"))
            }
            _ => false,
        }
    }

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

    /// Whether this daemon may act on `group` of `project` at `now`.
    pub fn standing(&self, project: &str, group: &str, now: Instant) -> Standing {
        let map = self.standing.lock().unwrap_or_else(|e| e.into_inner());
        match map.get(&(project.to_owned(), group.to_owned())) {
            Some(Standing::Held { until }) if *until > now => Standing::Held { until: *until },
            Some(Standing::Held { .. }) | None => Standing::Unknown,
            Some(other) => other.clone(),
        }
    }

    /// One round for `project`: reads its lease profile once, takes or renews the lease of every
    /// group in `groups` it may, and writes them in one compare-and-swap. A race lost three
    /// times in a row (412) leaves the standings as they were, for the next round.
    pub async fn renew(
        &self,
        incus: &dyn Incus,
        project: &str,
        groups: &[String],
    ) -> Result<(), IncusError> {
        let released = self.writes.lock().await;
        if *released {
            return Ok(());
        }
        // Another daemon writing the same project (its own groups' leases) between the read
        // and the write makes the write fail (412): read again, a few times.
        for _ in 0..3 {
            let started = Instant::now();
            let mut current = incus.leases(project).await?;
            let now_ms = (self.wall)();
            let mut taken = Vec::new();
            let mut others = BTreeMap::new();
            for g in groups {
                let key = format!("{KEY_PREFIX}{g}");
                let stored = current.config.get(&key).and_then(|v| Record::parse(v));
                match claim(
                    stored.as_ref(),
                    &self.me,
                    now_ms,
                    self.lease,
                    self.drift(),
                    |h| self.gone(h),
                ) {
                    Some(r) => {
                        current.config.insert(key, r.value());
                        taken.push(g.clone());
                    }
                    None => {
                        others.insert(g.clone(), stored.map(|r| r.holder).unwrap_or_default());
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
            let mut map = self.standing.lock().unwrap_or_else(|e| e.into_inner());
            let until = started + self.lease.saturating_sub(self.drift());
            for g in taken {
                map.insert((project.to_owned(), g), Standing::Held { until });
            }
            for (g, holder) in others {
                map.insert((project.to_owned(), g), Standing::Standby { holder });
            }
            return Ok(());
        }
        // Still losing the race: the standings stay as they were, for the next round.
        Ok(())
    }

    /// Gives up the leases this daemon holds in `project` (a clean shutdown), so another daemon
    /// takes over at once.
    pub async fn release(
        &self,
        incus: &dyn Incus,
        project: &str,
        groups: &[String],
    ) -> Result<(), IncusError> {
        let mut current = incus.leases(project).await?;
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
        let mut map = self.standing.lock().unwrap_or_else(|e| e.into_inner());
        map.retain(|(p, _), _| p != project);
        Ok(())
    }
}

/// How long after its end a lease nobody renewed is removed (by any daemon writing leases in
/// the same project): the key of a group that is no longer declared anywhere goes away.
pub const STALE_AFTER: Duration = Duration::from_secs(24 * 3600);

/// Removes the lease keys of `config` that ended more than [`STALE_AFTER`] before `now_ms`.
pub fn forget_stale(config: &mut BTreeMap<String, String>, now_ms: i64) {
    let limit = now_ms - ms(STALE_AFTER);
    config.retain(|k, v| {
        !k.starts_with(KEY_PREFIX) || Record::parse(v).is_none_or(|r| r.until_ms >= limit)
    });
}

/// Milliseconds since the Unix epoch, by the system's clock.
pub fn wall_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEASE: Duration = Duration::from_secs(15);
    const DRIFT: Duration = Duration::from_secs(3);

    #[test]
    fn leases_ended_a_day_ago_are_forgotten_and_nothing_else() {
        let day = ms(STALE_AFTER);
        let mut config: BTreeMap<String, String> = [
            ("user.incus-hpa.lease.old", held("h:1:a", 1_000).value()),
            (
                "user.incus-hpa.lease.recent",
                held("h:2:b", 2 * day).value(),
            ),
            ("user.incus-hpa.lease.odd", "not a record".to_owned()),
            ("user.other", "1".to_owned()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        forget_stale(&mut config, 1_000 + day + 1);
        let keys: Vec<&str> = config.keys().map(String::as_str).collect();
        assert_eq!(
            keys,
            [
                "user.incus-hpa.lease.odd",
                "user.incus-hpa.lease.recent",
                "user.other"
            ]
        );
    }

    fn held(by: &str, until_ms: i64) -> Record {
        Record {
            holder: by.into(),
            until_ms,
        }
    }

    #[test]
    fn a_holder_of_this_host_whose_process_is_gone_is_dead() {
        let l = Leases::new("web-1:100:aaaa".into(), LEASE);
        // Not this host: never judged.
        assert!(!l.gone("other-host:1:zzzz"));
        // This host: a pid that is not running is gone; this very process is not.
        assert!(l.gone(&format!("web-1:{}:bbbb", u32::MAX - 1)));
        let me = Leases::new(format!("web-1:{}:aaaa", std::process::id()), LEASE);
        assert!(!me.gone(&format!("web-1:{}:cccc", std::process::id())));
        assert!(!l.gone("garbage"));
    }

    #[test]
    fn records_read_back_what_they_write() {
        let r = held("web-1:42:ab12", 1_700_000_000_000);
        assert_eq!(Record::parse(&r.value()), Some(r));
        assert_eq!(Record::parse("garbage"), None);
        assert_eq!(Record::parse("h until=soon"), None);
    }

    #[test]
    fn a_lease_is_taken_when_free_expired_past_the_margin_or_ours() {
        let now = 100_000;
        let mine = Some(held("me", now + 15_000));
        let take = |stored: Option<Record>| {
            claim(stored.as_ref(), "me", now, LEASE, DRIFT, |h| h == "dead")
        };
        assert_eq!(take(None), mine);
        assert_eq!(take(Some(held("me", now + 1))), mine);
        // Another's, still running or within the drift margin after its end: not ours.
        assert_eq!(take(Some(held("b", now + 1))), None);
        assert_eq!(take(Some(held("b", now - 2_999))), None);
        // Past its end and the margin: ours.
        assert_eq!(take(Some(held("b", now - 3_000))), mine);
        // A holder known dead: ours at once.
        assert_eq!(take(Some(held("dead", now + 9_000))), mine);
    }
}
