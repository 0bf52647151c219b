//! Each group's history on disk, under the state directory (`[daemon] state_directory`, else
//! the unit's `StateDirectory`, `/var/lib/incus-hpa`): below the reconciler, which hands it
//! every pass and, once a minute per group, what the group's decisions have learned.
//!
//! ```text
//! STATE/groups/NAME/passes.csv    one row per pass, the last day (see `record`)
//! STATE/groups/NAME/minutes.csv   one row per minute, the six days before
//! STATE/groups/NAME/learned.json  what decide had learned at the last save (`decide::Saved`)
//! ```
//!
//! A pass' row is kept in memory and the rows of every group are written every
//! [`ROWS_EVERY`] in one job; each group is saved every [`SAVE_EVERY`], at an offset of its
//! own; every row and save is written when the daemon stops: a crash or a full disk loses at
//! most the last minute, and neither stops the daemon (a write that fails is said in
//! the journal, at most once per group an hour). The writing happens on a thread of its own;
//! the loop only hands it what to write, and drops it when the thread is that far behind. A
//! save is written beside the last and renamed over it, so a crash mid-write leaves the last
//! one. A `learned.json` that cannot be read is set aside as `learned.json.damaged` with one
//! journal line, and the group starts fresh. A group taken out of the desired-state file keeps
//! its directory for [`GRACE`], then it is removed.

pub mod advisor;
mod disk;
pub mod record;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use crate::decide::History;
use crate::model::GroupSpec;
pub use advisor::Advised;
pub use disk::{read, Loaded};
pub use record::{at_unix_ms, unix_ms, Record};

/// How often a group's rows and what it learned are written, at most.
pub const SAVE_EVERY: Duration = Duration::from_secs(60);
/// How long a group taken out of the desired-state file keeps its history.
pub const GRACE: Duration = Duration::from_secs(7 * 24 * 3600);
/// How often the rows of every group are handed to the writer, together.
pub const ROWS_EVERY: Duration = Duration::from_secs(10);
/// The most rows kept in memory for one group between writes (the oldest go first).
const MOST_ROWS: usize = 4096;

/// The history of every group, or none when there is no state directory.
pub struct Store {
    inner: Option<Inner>,
}

struct Inner {
    dir: PathBuf,
    writer: disk::Writer,
    advisor: advisor::Advisor,
    books: HashMap<String, Book>,
    /// When the rows of every group are next handed to the writer.
    rows_next: Option<Instant>,
}

/// What one group has not written yet.
struct Book {
    rows: String,
    count: usize,
    /// When the group is next saved.
    next: Instant,
    /// When the group is next advised on (see [`advisor`]): first at its first pass.
    advise_next: Instant,
    /// The size (`limits.memory`, MiB) it was last advised on for.
    advised_size: Option<f64>,
}

impl Book {
    /// A group first seen at `now`: saved first within [`SAVE_EVERY`], at a time of its own,
    /// so that a thousand groups that start together are not all saved at once.
    fn new(group: &str, now: Instant) -> Book {
        // FNV-1a: the same offset for the same group at every start.
        let hash = group.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
        let offset = Duration::from_millis(hash % SAVE_EVERY.as_millis() as u64);
        Book {
            rows: String::new(),
            count: 0,
            next: now + offset,
            advise_next: now,
            advised_size: None,
        }
    }

    /// The rows not handed to the writer yet, taken.
    fn take_rows(&mut self) -> String {
        self.count = 0;
        std::mem::take(&mut self.rows)
    }
}

impl Inner {
    /// `group`'s book, begun at `now` for a group not seen before.
    fn book(&mut self, group: &str, now: Instant) -> &mut Book {
        book(&mut self.books, group, now)
    }
}

/// `group`'s book in `books`, begun at `now` for a group not seen before.
fn book<'b>(books: &'b mut HashMap<String, Book>, group: &str, now: Instant) -> &'b mut Book {
    books
        .entry(group.to_owned())
        .or_insert_with(|| Book::new(group, now))
}

impl Store {
    /// A store that keeps nothing (no state directory).
    pub fn none() -> Store {
        Store { inner: None }
    }

    /// The store under `dir`, its writer started. Nothing is read or written before a group
    /// asks.
    pub fn open(dir: &Path) -> Store {
        Store {
            inner: Some(Inner {
                dir: dir.to_owned(),
                writer: disk::Writer::start(dir.to_owned()),
                advisor: advisor::Advisor::start(dir.to_owned()),
                books: HashMap::new(),
                rows_next: None,
            }),
        }
    }

    /// The directory, if any.
    pub fn dir(&self) -> Option<&Path> {
        self.inner.as_ref().map(|i| i.dir.as_path())
    }

    /// The history `spec`'s group resumes from at `now`: what its last save says, read back
    /// on this clock (see [`History::resume`]); a new history when there is none, or when it
    /// cannot be read (set aside, said once).
    pub fn resume(&mut self, spec: &GroupSpec, now: Instant) -> History {
        let Some(inner) = &mut self.inner else {
            return History::default();
        };
        let group = spec.name.as_str();
        match disk::load(&inner.dir, group) {
            Loaded::Nothing => History::default(),
            Loaded::Damaged(why) => {
                tracing::warn!(group, "{why}: the group starts with a new history");
                History::default()
            }
            Loaded::Saved(saved, at) => {
                let gone = SystemTime::now().duration_since(at).unwrap_or_default();
                let history = History::resume(spec, &saved, gone, now);
                tracing::info!(
                    group,
                    "{group} resumes from its history saved {} ago ({} demand samples{})",
                    humantime::format_duration(Duration::from_secs(gone.as_secs())),
                    saved.samples(),
                    if history.desired().is_some() {
                        ""
                    } else {
                        "; older than its scale-down window: from the count it finds"
                    }
                );
                history
            }
        }
    }

    /// Whether passes are kept (there is a state directory).
    pub fn keeps(&self) -> bool {
        self.inner.is_some()
    }

    /// Takes in one pass of `group` at `now` (see [`Record::of`]).
    pub fn pass(&mut self, group: &str, row: &Record, now: Instant) {
        let Some(inner) = &mut self.inner else { return };
        let book = inner.book(group, now);
        if book.count >= MOST_ROWS {
            // The writer is far behind or failing: the oldest rows go.
            if let Some(end) = book.rows.find('\n') {
                book.rows.drain(..=end);
                book.count -= 1;
            }
        }
        book.rows.push_str(&row.line());
        book.count += 1;
    }

    /// Whether `group` is due a save at `now`: every [`SAVE_EVERY`], the first time at an
    /// offset of its own from its first pass.
    pub fn due(&self, group: &str, now: Instant) -> bool {
        self.inner
            .as_ref()
            .is_some_and(|i| i.books.get(group).is_some_and(|b| now >= b.next))
    }

    /// Hands the rows of every group to the writer, in one job, when [`ROWS_EVERY`] has
    /// passed since the last time (so that a minute of a thousand groups' rows is not all
    /// in memory at once).
    pub fn write_rows(&mut self, now: Instant) {
        let Some(inner) = &mut self.inner else { return };
        let next = *inner.rows_next.get_or_insert(now + ROWS_EVERY);
        if now < next {
            return;
        }
        inner.rows_next = Some(now + ROWS_EVERY);
        let rows: Vec<(String, String)> = inner
            .books
            .iter_mut()
            .filter(|(_, b)| !b.rows.is_empty())
            .map(|(g, b)| (g.clone(), b.take_rows()))
            .collect();
        if !rows.is_empty() {
            inner.writer.send(disk::Job::Rows {
                rows,
                at: SystemTime::now(),
            });
        }
    }

    /// Writes `group`'s rows and `history`, as learned at `now`.
    pub fn save(&mut self, group: &str, history: &History, now: Instant) {
        let Some(inner) = &mut self.inner else { return };
        let book = inner.book(group, now);
        book.next = now + SAVE_EVERY;
        let rows = book.take_rows();
        inner.writer.send(disk::Job::Save {
            group: group.to_owned(),
            rows,
            saved: Box::new(history.save(now)),
            at: SystemTime::now(),
        });
    }

    /// Asks for `spec`'s right-sizing advice when it is due at `now` (every
    /// [`advisor::ADVISE_EVERY`], first at its first pass, and at once when its size changed),
    /// for a group it applies to.
    pub fn advise(&mut self, spec: &GroupSpec, now: Instant) {
        let Some(inner) = &mut self.inner else { return };
        if !advisor::applies(spec) {
            return;
        }
        let size = crate::simulate::advise::own_size(spec);
        let book = book(&mut inner.books, spec.name.as_str(), now);
        if now < book.advise_next && book.advised_size == size {
            return;
        }
        // A thread behind is asked again at the next pass.
        if inner.advisor.ask(spec) {
            book.advise_next = now + advisor::ADVISE_EVERY;
            book.advised_size = size;
        }
    }

    /// `spec`'s last advice, while it is for the size the group has now.
    pub fn advice(&self, spec: &GroupSpec) -> Option<Advised> {
        self.inner.as_ref()?.advisor.advice(spec)
    }

    /// The groups declared now: the history of a group no longer declared is removed once it
    /// has not been written for [`GRACE`].
    pub fn declared(&mut self, groups: impl IntoIterator<Item = String>) {
        let Some(inner) = &mut self.inner else { return };
        let groups: Vec<String> = groups.into_iter().collect();
        inner.books.retain(|g, _| groups.contains(g));
        inner.advisor.retain(&groups);
        inner.writer.send(disk::Job::Prune { declared: groups });
    }

    /// Waits until everything handed to the writer is on disk (or failed), at most `within`.
    pub fn flush(&mut self, within: Duration) {
        if let Some(inner) = &mut self.inner {
            inner.writer.flush(within);
        }
    }
}

/// Where the packaged unit keeps the history (its `StateDirectory`).
pub const PACKAGED_DIRECTORY: &str = "/var/lib/incus-hpa";

/// The state directory a command reads the history from: [`directory`] with this process'
/// `STATE_DIRECTORY`, else the packaged unit's.
pub fn read_from(key: Option<&Path>) -> PathBuf {
    directory(key, std::env::var_os("STATE_DIRECTORY").as_deref())
        .unwrap_or_else(|| PathBuf::from(PACKAGED_DIRECTORY))
}

/// The state directory in force: `[daemon] state_directory` when set, else the first of
/// `STATE_DIRECTORY` (set by systemd from the unit's `StateDirectory=`), else none.
pub fn directory(key: Option<&Path>, env: Option<&std::ffi::OsStr>) -> Option<PathBuf> {
    key.map(Path::to_owned).or_else(|| {
        let env = env?.to_str()?;
        env.split(':')
            .find(|p| p.starts_with('/'))
            .map(PathBuf::from)
    })
}
