//! The daemon's own right-sizing advice: each group scaled on memory with a `limits.memory`
//! has its history replayed at candidate sizes ([`crate::simulate::advise`], what
//! `incus-hpa advise` does) every [`ADVISE_EVERY`] (and at once when its size changes), on a
//! thread of its own at the lowest CPU priority that replays at most 2 % of the time (with
//! many groups, each is advised on less often), so that `status` and the metrics show it. The replay covers the last [`SPAN`] at a
//! minute's resolution (each minute's highest readings): a week is at most 10,080 rows
//! whatever the interval, read a line at a time, and replayed every minute. A change of the
//! advised size is said in the journal once.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use super::disk;
use crate::model::GroupSpec;
use crate::simulate::advise::{self, Candidate};

/// How often a group's advice is found again.
pub const ADVISE_EVERY: Duration = Duration::from_secs(3600);
/// How far back the history replayed goes.
pub const SPAN: Duration = Duration::from_secs(7 * 24 * 3600);
/// The replay decides once a minute, whatever the group's interval (its rows are minutes).
const STEP: Duration = Duration::from_secs(60);
/// The groups waiting for advice before the next are refused (and asked again at their next
/// pass).
const QUEUE: usize = 1024;
/// The thread replays at most one second in this many.
const DUTY: u32 = 50;

/// The advice the daemon last found for a group, as `status --json` prints it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Advised {
    /// RFC 3339, UTC: when the history was replayed.
    pub at: String,
    /// How long the history replayed lasts, hours.
    pub hours: f64,
    /// The size the group has, replayed.
    pub current: Candidate,
    /// The size that would have reserved least memory without more time at the limit or
    /// overloaded: `current` when no other would have.
    pub advised: Candidate,
}

impl Advised {
    /// How long the history replayed lasts, to the minute: `2m`, `6h`, `6days 23h`.
    pub fn span(&self) -> String {
        let minutes = (self.hours * 60.0).round().max(0.0) as u64;
        humantime::format_duration(Duration::from_secs(minutes * 60)).to_string()
    }

    /// The share of the memory the group reserved (instances × limit, over the history) that
    /// the advised size would have saved: 0 when it is the group's own.
    pub fn saving(&self) -> f64 {
        let reserved = self.current.memory_gib_hours;
        if reserved > 0.0 {
            (1.0 - self.advised.memory_gib_hours / reserved).max(0.0)
        } else {
            0.0
        }
    }
}

/// The handle on the advising thread and what it found.
pub(super) struct Advisor {
    jobs: SyncSender<GroupSpec>,
    found: Arc<Mutex<HashMap<String, Advised>>>,
}

impl Advisor {
    pub(super) fn start(dir: PathBuf) -> Advisor {
        let (jobs, rx) = mpsc::sync_channel(QUEUE);
        let found = Arc::new(Mutex::new(HashMap::new()));
        let kept = found.clone();
        let spawned = std::thread::Builder::new()
            .name("advice".into())
            .spawn(move || advise_all(&dir, &rx, &kept));
        if let Err(e) = spawned {
            tracing::error!("the advice's thread could not start ({e}): no group is advised on");
        }
        Advisor { jobs, found }
    }

    /// Asks for `spec`'s advice; `false` when the thread is [`QUEUE`] groups behind.
    pub(super) fn ask(&self, spec: &GroupSpec) -> bool {
        self.jobs.try_send(spec.clone()).is_ok()
    }

    /// `group`'s last advice, while it was found for the size the group has now.
    pub(super) fn advice(&self, spec: &GroupSpec) -> Option<Advised> {
        let found = lock(&self.found);
        let a = found.get(spec.name.as_str())?;
        (advise::own_size(spec) == Some(a.current.limit_mib)).then(|| a.clone())
    }

    /// Forgets the advice of the groups not declared.
    pub(super) fn retain(&self, declared: &[String]) {
        lock(&self.found).retain(|g, _| declared.contains(g));
    }
}

/// Whether the daemon advises on `spec`: scaled on memory, with a size to advise from.
pub(super) fn applies(spec: &GroupSpec) -> bool {
    spec.memory_threshold.is_some() && advise::own_size(spec).is_some()
}

fn advise_all(dir: &Path, jobs: &Receiver<GroupSpec>, found: &Mutex<HashMap<String, Advised>>) {
    lower_priority();
    for spec in jobs {
        let group = spec.name.as_str();
        let started = std::time::Instant::now();
        match one(dir, &spec) {
            Ok(advised) => {
                let before = lock(found).insert(group.to_owned(), advised.clone());
                let was = before.map(|b| b.advised.limit_mib);
                if was != Some(advised.advised.limit_mib) {
                    say(group, &advised);
                }
            }
            Err(why) => {
                tracing::debug!(group, "no advice for {group}: {why}");
                lock(found).remove(group);
            }
        }
        // At most 1/DUTY of a core: a replay of a week takes about half a second here, so a
        // thousand groups are advised on every few hours rather than every hour.
        std::thread::sleep(started.elapsed() * (DUTY - 1));
    }
}

/// `spec`'s advice from its history of the last [`SPAN`].
fn one(dir: &Path, spec: &GroupSpec) -> Result<Advised, String> {
    let now = SystemTime::now();
    let since = super::unix_ms(now.checked_sub(SPAN).unwrap_or(SystemTime::UNIX_EPOCH));
    let rows = disk::read_minutes(dir, spec.name.as_str(), since).map_err(|e| e.to_string())?;
    let replayed = GroupSpec {
        interval: spec.interval.max(STEP),
        ..spec.clone()
    };
    let a = advise::for_group(&replayed, &rows, advise::BASE_MIB, advise::WARMUP)
        .map_err(|e| e.to_string())?;
    Ok(Advised {
        at: humantime::format_rfc3339_seconds(now).to_string(),
        hours: a.hours,
        current: a.current,
        advised: a.advised,
    })
}

/// Says a new advice in the journal.
fn say(group: &str, a: &Advised) {
    let (c, d) = (&a.current, &a.advised);
    if c.limit_mib == d.limit_mib {
        tracing::info!(
            group,
            "{group}: its limits.memory ({} MiB) is the size that would have reserved least \
             memory over the last {} of its history (incus-hpa advise {group} shows each size)",
            c.limit_mib,
            a.span()
        );
    } else {
        tracing::info!(
            group,
            "{group}: limits.memory {} MiB instead of {} MiB would have reserved {:.0}% less \
             memory over the last {} of its history, {}-{} instances, no longer at the \
             limit nor overloaded (advice only: nothing is changed; incus-hpa advise {group} \
             shows each size)",
            d.limit_mib,
            c.limit_mib,
            a.saving() * 100.0,
            a.span(),
            d.fewest,
            d.most
        );
    }
}

/// This thread at the lowest CPU priority: advice may wait, the passes may not.
fn lower_priority() {
    #[cfg(target_os = "linux")]
    // SAFETY: setpriority on this thread's own id; it takes no pointer.
    unsafe {
        let tid = libc::gettid();
        libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, 19);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
