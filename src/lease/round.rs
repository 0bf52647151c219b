//! One round of a project's leases ([`Leases::renew`]): read the store, judge every group's
//! lease ([`claim`]), write what this daemon takes or renews in one compare-and-swap, and say
//! where it stands; and the release of a clean shutdown ([`Leases::release`]).

use std::collections::BTreeMap;
use std::time::Duration;

use super::{
    claim, forget_stale, holder, key, lock, shares_store, Claim, LeaseError, Leases, Record,
    Standing, Step, StoreProblem, Take, KEY_PREFIX,
};
use crate::incus::Incus;

impl Leases {
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
        // Not beside this daemon's own creations and starts (see `Leases::quiet`); past the bound,
        // the round goes on: the lease matters more.
        let _quiet = tokio::time::timeout(self.lease / 6, self.quiet.write())
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
            let shared = shares_store(project, &current.project);
            let mut taken = Vec::new();
            let mut others = BTreeMap::new();
            for g in groups {
                if shared {
                    if let Some(h) = self.older_holder(project, g, &current.config, started, now_ms)
                    {
                        others.insert(g.clone(), h);
                        continue;
                    }
                }
                let key = key(project, g, &current.project);
                let raw = current.config.get(&key).cloned().unwrap_or_default();
                let (stored, verdict) = self.judge(project, g, false, &raw, started, now_ms);
                match verdict {
                    Claim::Take(r) => {
                        let step = self.step(project, g, stored.as_ref(), started);
                        if step != Step::Early {
                            current.config.insert(key, r.value());
                            taken.push((g.clone(), step));
                        }
                    }
                    Claim::Wait | Claim::Skewed => {
                        let holder = stored.map(|r| r.holder).unwrap_or_default();
                        others.insert(g.clone(), holder);
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
            let wrote = (self.clocks.mono)();
            let mut map = lock(&self.standing);
            let mut fresh = lock(&self.taken);
            let until = started + self.lease.saturating_sub(self.drift());
            for (g, step) in taken {
                let at = (project.to_owned(), g);
                let standing = if step == Step::New {
                    let read = started;
                    fresh.insert(at.clone(), Take { read, wrote });
                    Standing::Confirming
                } else {
                    fresh.remove(&at);
                    Standing::Held { until }
                };
                map.insert(at, standing);
            }
            for (g, holder) in others {
                let at = (project.to_owned(), g);
                fresh.remove(&at);
                map.insert(at, Standing::Standby { holder });
            }
            return Ok(());
        }
        // Still losing the race: the standings stay as they were, for the next round.
        Ok(())
    }

    /// The record in the value `raw` under the key of `group` of `project` (`older`: the one
    /// an older daemon used in a store shared by projects), and what [`claim`] says of it.
    fn judge(
        &self,
        project: &str,
        group: &str,
        older: bool,
        raw: &str,
        started: Duration,
        now_ms: i64,
    ) -> (Option<Record>, Claim) {
        let stored = Record::parse(raw);
        let unchanged_for = self.unchanged_for(project, group, older, raw, started);
        let verdict = claim(
            stored.as_ref(),
            &self.me,
            now_ms,
            self.lease,
            self.drift(),
            unchanged_for,
            |h| holder::proven_dead(h, self.identity.as_ref(), &holder::Proc),
        );
        if let (Claim::Skewed, Some(r)) = (&verdict, &stored) {
            self.say_skew(project, group, r, now_ms);
        }
        (stored, verdict)
    }

    /// In a store shared by projects, the holder of a running lease that an older daemon wrote
    /// under the name of `group` alone: it may be this group's, or one of that name in another
    /// project of the store (the older daemons could not tell them apart either), and is
    /// waited out. A value that says its length is a newer daemon's, of the store's own
    /// project, and none of this group's business.
    fn older_holder(
        &self,
        project: &str,
        group: &str,
        config: &BTreeMap<String, String>,
        started: Duration,
        now_ms: i64,
    ) -> Option<String> {
        let raw = config
            .get(&format!("{KEY_PREFIX}{group}"))
            .map_or("", String::as_str);
        let old = Record::parse(raw).filter(|r| r.lease.is_none())?;
        let (_, verdict) = self.judge(project, group, true, raw, started, now_ms);
        (!matches!(verdict, Claim::Take(_))).then_some(old.holder)
    }

    /// What a round that may write this daemon's record of `group` does, `stored` being the
    /// record it read (see [`Step`]).
    fn step(&self, project: &str, group: &str, stored: Option<&Record>, started: Duration) -> Step {
        if stored.is_none_or(|s| s.holder != self.me) {
            return Step::New;
        }
        match self.standing(project, group) {
            Standing::Held { .. } => Step::Renew,
            Standing::Confirming => {
                let at = (project.to_owned(), group.to_owned());
                match lock(&self.taken).get(&at) {
                    Some(t) if started < t.wrote + self.confirm_after() => Step::Early,
                    // Within what the take would have held: nobody else may have taken it.
                    Some(t) if started < t.read + self.lease.saturating_sub(self.drift()) => {
                        Step::Confirm
                    }
                    _ => Step::New,
                }
            }
            _ => Step::New,
        }
    }

    /// How long (own clock) `value` has been read unchanged for the lease of `group`.
    pub(super) fn unchanged_for(
        &self,
        project: &str,
        group: &str,
        older: bool,
        value: &str,
        now: Duration,
    ) -> Duration {
        let mut seen = lock(&self.seen);
        let entry = seen
            .entry((project.to_owned(), group.to_owned(), older))
            .or_insert_with(|| (value.to_owned(), now));
        if entry.0 != value {
            *entry = (value.to_owned(), now);
        }
        now.saturating_sub(entry.1)
    }

    /// Logs once per holder that the lease `r` of `group` ends too far ahead to be believed.
    pub(super) fn say_skew(&self, project: &str, group: &str, r: &Record, now_ms: i64) {
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
            let key = key(project, g, &current.project);
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
        lock(&self.taken).retain(|(p, _), _| p != project);
        Ok(())
    }
}
