//! What the holder of a group's lease learned, left in Incus for the daemon that holds the
//! group next: on another host, or in place of a host that was replaced, it starts from what
//! the last holder learned rather than from nothing.
//!
//! - **What**: the group's decision history ([`crate::decide::Saved`]) made compact
//!   ([`Saved::summary`]: nothing per instance, each series at most [`MOST`] entries, never
//!   less of what it holds the count for), with its holder and when it was left ([`Left`]),
//!   as JSON: at most a few KiB a group; one larger than [`MOST_BYTES`] is not left.
//! - **Where**: the key `user.incus-hpa.learned.PROJECT.GROUP` ([`key`]) of the project's
//!   learned store, the profile [`LEARNED_PROFILE`] (apart from the lease store, which every
//!   renewal reads and writes: its size never slows a renewal).
//! - **When**: the holder hands each group's summary over at most every [`EVERY`]; they are
//!   written with the next round of leases that is not beside this daemon's own creations,
//!   at the earliest [`EVERY`] after the daemon started (nothing is learned before) and once
//!   more when it stops, one read and one compare-and-swap per project with something new;
//!   the profile is made by the first write, never by a read. A write also removes the
//!   summaries left more than [`FORGOTTEN`] ago ([`forget_stale`]). A write that fails
//!   is tried again with the next round; nothing of it stops a pass.
//! - **Who reads it**: a daemon that takes a group over from another holder, once: it resumes
//!   from the summary when that was left at most [`FRESH`] ago by another daemon and knew the
//!   group for longer than its own history does (a daemon that stood by all along learned as
//!   much itself).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::decide::Saved;
use crate::incus::{Incus, IncusError, LeaseHome, LEARNED_PROFILE, LEARNED_VALUE, STORE_KEY};

/// How often a holder leaves each group's summary, at most.
pub const EVERY: Duration = Duration::from_secs(60);
/// The oldest summary a new holder resumes from.
pub const FRESH: Duration = Duration::from_secs(3600);
/// A summary left longer ago than this is removed by the next write of its store.
pub const FORGOTTEN: Duration = Duration::from_secs(24 * 3600);
/// The most entries of each series in a summary.
pub const MOST: usize = 32;
/// The largest summary left, bytes.
pub const MOST_BYTES: usize = 32 * 1024;
const KEY_PREFIX: &str = "user.incus-hpa.learned.";

/// The key of `group` of `project` in the learned store.
pub fn key(project: &str, group: &str) -> String {
    format!("{KEY_PREFIX}{project}.{group}")
}

/// One group's summary as the store keeps it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Left {
    /// The holder that left it.
    pub holder: String,
    /// When, milliseconds since the Unix epoch (the holder's clock).
    pub at_unix_ms: i64,
    pub saved: Saved,
}

/// The summaries handed over and not written yet, by project and group.
#[derive(Default)]
pub struct Outbox {
    pending: Mutex<BTreeMap<String, BTreeMap<String, String>>>,
}

impl Outbox {
    /// Hands over `group`'s summary (its history `saved`, left by `holder` at `at_unix_ms`),
    /// in place of one not written yet; `false` when it is larger than [`MOST_BYTES`].
    pub fn leave(
        &self,
        project: &str,
        group: &str,
        holder: &str,
        at_unix_ms: i64,
        saved: &Saved,
    ) -> bool {
        let left = Left {
            holder: holder.to_owned(),
            at_unix_ms,
            saved: saved.summary(MOST),
        };
        let Ok(text) = serde_json::to_string(&left) else {
            return false;
        };
        if text.len() > MOST_BYTES {
            return false;
        }
        lock(&self.pending)
            .entry(project.to_owned())
            .or_default()
            .insert(group.to_owned(), text);
        true
    }

    /// Whether anything waits to be written.
    pub fn is_empty(&self) -> bool {
        lock(&self.pending).is_empty()
    }

    /// Writes what waits: per project, one read of its learned store and one compare-and-swap
    /// of it with the new summaries (a store that is not the daemon's is left alone, said at
    /// debug level). What could not be written waits for the next call, unless a newer one
    /// came meanwhile.
    pub async fn write(&self, incus: &dyn Incus) {
        let all = std::mem::take(&mut *lock(&self.pending));
        for (project, groups) in all {
            if let Err(e) = write_project(incus, &project, &groups).await {
                tracing::debug!(project, error = %e,
                    "cannot leave what was learned in {LEARNED_PROFILE} of project {project}: {e}");
                let mut pending = lock(&self.pending);
                let kept = pending.entry(project).or_default();
                for (group, text) in groups {
                    kept.entry(group).or_insert(text);
                }
            }
        }
    }
}

async fn write_project(
    incus: &dyn Incus,
    project: &str,
    groups: &BTreeMap<String, String>,
) -> Result<(), IncusError> {
    for _ in 0..3 {
        let mut store = match incus.learned(project).await {
            // Made by this write.
            Err(e) if e.is_not_found() => LeaseHome {
                config: BTreeMap::from([(STORE_KEY.to_owned(), LEARNED_VALUE.to_owned())]),
                ..LeaseHome::default()
            },
            other => other?,
        };
        if store.config.get(STORE_KEY).map(String::as_str) != Some(LEARNED_VALUE)
            || !store.used_by.is_empty()
        {
            return Err(IncusError::Api {
                what: format!("writing profile {LEARNED_PROFILE} of project {project}"),
                status: 409,
                message: format!(
                    "the profile was not made by incus-hpa (no {STORE_KEY}={LEARNED_VALUE}), \
                     or instances use it: left as it is"
                ),
            });
        }
        forget_stale(
            &mut store.config,
            crate::history::unix_ms(std::time::SystemTime::now()),
        );
        for (group, text) in groups {
            store.config.insert(key(project, group), text.clone());
        }
        if incus.put_learned(project, &store).await? {
            return Ok(());
        }
    }
    Err(IncusError::Api {
        what: format!("writing profile {LEARNED_PROFILE} of project {project}"),
        status: 412,
        message: "another daemon wrote it first, three times".into(),
    })
}

/// Removes from a learned store's `config` the summaries left more than [`FORGOTTEN`] before
/// `now_ms` (a group taken out of every daemon's file, a test's group): no holder resumes
/// from one that old, and the store stays the size of the groups of the last day. A value
/// that does not read (another version's) is left as it is.
pub fn forget_stale(config: &mut BTreeMap<String, String>, now_ms: i64) {
    #[derive(Deserialize)]
    struct At {
        at_unix_ms: i64,
    }
    let oldest = now_ms.saturating_sub(i64::try_from(FORGOTTEN.as_millis()).unwrap_or(i64::MAX));
    config.retain(|k, v| {
        !k.starts_with(KEY_PREFIX)
            || serde_json::from_str::<At>(v).map_or(true, |a| a.at_unix_ms >= oldest)
    });
}

/// The learned stores read lately, by project: the groups of a project taken over together
/// (a daemon that starts, a holder gone) read it once, not once each.
#[derive(Default)]
pub struct Reads {
    read: tokio::sync::Mutex<BTreeMap<String, (tokio::time::Instant, Config)>>,
}

/// A learned store's config, as read.
type Config = Arc<BTreeMap<String, String>>;

/// How long a read of a learned store serves the groups of its project.
const READ_SERVES: Duration = Duration::from_secs(30);

impl Reads {
    /// What was left for `group` of `project`, if anything (a value that does not read is
    /// none).
    pub async fn left(
        &self,
        incus: &dyn Incus,
        project: &str,
        group: &str,
    ) -> Result<Option<Left>, IncusError> {
        let mut read = self.read.lock().await;
        let now = tokio::time::Instant::now();
        expire(&mut read, now);
        let config = match read.get(project) {
            Some((_, config)) => config.clone(),
            None => {
                let config = match incus.learned(project).await {
                    // Nothing was ever left in this project.
                    Err(e) if e.is_not_found() => Arc::default(),
                    other => Arc::new(other?.config),
                };
                read.insert(project.to_owned(), (now, config.clone()));
                config
            }
        };
        Ok(config
            .get(&key(project, group))
            .and_then(|v| serde_json::from_str(v).ok()))
    }

    /// Drops the reads older than [`READ_SERVES`] (the whole store of a project, up to a few
    /// MB at a thousand groups, is not kept once the takeovers it served are done).
    pub fn expire(&self) {
        if let Ok(mut read) = self.read.try_lock() {
            expire(&mut read, tokio::time::Instant::now());
        }
    }
}

/// Drops from `read` the reads older than [`READ_SERVES`] at `now`.
fn expire(read: &mut BTreeMap<String, (tokio::time::Instant, Config)>, now: tokio::time::Instant) {
    read.retain(|_, (at, _)| now.duration_since(*at) < READ_SERVES);
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summaries_older_than_a_day_are_forgotten_and_the_rest_kept() {
        let day = i64::try_from(FORGOTTEN.as_millis()).unwrap();
        let now = 10 * day;
        let left = |at: i64| format!(r#"{{"holder":"h","at_unix_ms":{at},"saved":{{}}}}"#);
        let mut config = BTreeMap::from([
            (STORE_KEY.to_owned(), LEARNED_VALUE.to_owned()),
            (key("default", "old"), left(now - day - 1)),
            (key("default", "day"), left(now - day)),
            (key("default", "new"), left(now - 1000)),
            (
                key("default", "other"),
                "a format of another version".to_owned(),
            ),
            ("user.someone.else".to_owned(), left(0)),
        ]);
        forget_stale(&mut config, now);
        let kept: Vec<&str> = config.keys().map(String::as_str).collect();
        assert_eq!(
            kept,
            [
                "user.incus-hpa.learned.default.day",
                "user.incus-hpa.learned.default.new",
                "user.incus-hpa.learned.default.other",
                STORE_KEY,
                "user.someone.else",
            ]
        );
    }
}
