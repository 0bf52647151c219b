//! The history's files: the thread that writes them (rows appended, saves written beside the
//! last and renamed over it, a day of rows folded into minutes, groups long gone removed),
//! and what reads them back (a save at start, the rows for a replay).

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use super::record::{at_unix_ms, by_minute, unix_ms, Record, HEADER};
use crate::decide::Saved;

/// How long rows stay at pass resolution.
const DAY_MS: i64 = 24 * 3600 * 1000;
/// How long rows are kept in all.
const WEEK_MS: i64 = 7 * DAY_MS;
/// How far past a day the oldest row may go before the rows are folded again.
const SLACK_MS: i64 = 3600 * 1000;
/// The jobs the writer may be behind by before the newest are dropped.
const QUEUE: usize = 1024;
/// The same group's failures are said at most this often.
const SAY_EVERY: Duration = Duration::from_secs(3600);

/// What the writer is handed.
pub(super) enum Job {
    Save {
        group: String,
        rows: String,
        saved: Box<Saved>,
        at: SystemTime,
    },
    /// Rows of several groups, appended to their files.
    Rows {
        rows: Vec<(String, String)>,
        at: SystemTime,
    },
    Prune {
        declared: Vec<String>,
    },
    Flush(SyncSender<()>),
}

/// `learned.json`.
#[derive(Serialize, Deserialize)]
struct LearnedFile {
    /// When it was saved, milliseconds since the Unix epoch.
    saved_at_unix_ms: i64,
    history: Saved,
}

/// The handle on the writing thread.
pub(super) struct Writer {
    jobs: SyncSender<Job>,
    /// A job was dropped since the last time that was said.
    dropped: bool,
}

impl Writer {
    pub(super) fn start(dir: PathBuf) -> Writer {
        let (jobs, rx) = mpsc::sync_channel(QUEUE);
        let spawned = std::thread::Builder::new()
            .name("history".into())
            .spawn(move || write_all(&dir, rx));
        if let Err(e) = spawned {
            tracing::error!("the history's writer could not start ({e}): nothing is written");
        }
        Writer {
            jobs,
            dropped: false,
        }
    }

    pub(super) fn send(&mut self, job: Job) {
        match self.jobs.try_send(job) {
            Ok(()) => self.dropped = false,
            Err(TrySendError::Full(_)) if !self.dropped => {
                self.dropped = true;
                tracing::warn!(
                    "the history's writer is {QUEUE} saves behind (a slow or stuck disk): the \
                     newest are dropped until it catches up"
                );
            }
            Err(_) => {}
        }
    }

    pub(super) fn flush(&mut self, within: Duration) {
        let (tx, rx) = mpsc::sync_channel(1);
        if self.jobs.send(Job::Flush(tx)).is_ok() && rx.recv_timeout(within).is_err() {
            tracing::warn!(
                "the history is not all on disk after {}: stopping without it",
                humantime::format_duration(within)
            );
        }
    }
}

/// What the writer knows of one group's files since it started.
#[derive(Default)]
struct Files {
    /// `passes.csv` was checked (its last row ended) and its first row read.
    checked: bool,
    /// The time of the oldest row of `passes.csv`.
    first_ms: Option<i64>,
    /// When a failure was last said.
    said: Option<std::time::Instant>,
}

fn write_all(dir: &Path, jobs: Receiver<Job>) {
    let mut files: HashMap<String, Files> = HashMap::new();
    for job in jobs {
        match job {
            Job::Save {
                group,
                rows,
                saved,
                at,
            } => {
                let f = files.entry(group.clone()).or_default();
                if let Err(e) = save(dir, &group, &rows, *saved, at, f) {
                    say(dir, &group, f, &e);
                }
            }
            Job::Rows { rows, at } => {
                for (group, rows) in rows {
                    let f = files.entry(group.clone()).or_default();
                    if let Err(e) = append_rows(dir, &group, &rows, at, f) {
                        say(dir, &group, f, &e);
                    }
                }
            }
            Job::Prune { declared } => {
                files.retain(|g, _| declared.contains(g));
                prune(dir, &declared);
            }
            Job::Flush(done) => {
                let _ = done.send(());
            }
        }
    }
}

/// Says that writing `group`'s history failed, at most once per [`SAY_EVERY`].
fn say(dir: &Path, group: &str, f: &mut Files, e: &io::Error) {
    if f.said.is_none_or(|t| t.elapsed() >= SAY_EVERY) {
        f.said = Some(std::time::Instant::now());
        tracing::warn!(
            group,
            "writing the history of {group} under {} failed: {e} (the daemon goes on; said \
             once an hour)",
            dir.display()
        );
    }
}

fn group_dir(dir: &Path, group: &str) -> PathBuf {
    dir.join("groups").join(group)
}

/// Appends `rows` to `group`'s passes (folding a day of them into minutes when due) and
/// writes `saved` over its last save.
fn save(
    dir: &Path,
    group: &str,
    rows: &str,
    saved: Saved,
    at: SystemTime,
    f: &mut Files,
) -> io::Result<()> {
    append_rows(dir, group, rows, at, f)?;
    let learned = LearnedFile {
        saved_at_unix_ms: unix_ms(at),
        history: saved,
    };
    let json = serde_json::to_vec(&learned).map_err(io::Error::other)?;
    replace(&group_dir(dir, group).join("learned.json"), &json)
}

/// Appends `rows` to `group`'s passes, folding those older than a day into minutes when the
/// oldest is an hour past it.
fn append_rows(
    dir: &Path,
    group: &str,
    rows: &str,
    at: SystemTime,
    f: &mut Files,
) -> io::Result<()> {
    let gdir = group_dir(dir, group);
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&gdir)?;
    let passes = gdir.join("passes.csv");
    if !f.checked {
        f.first_ms = end_rows(&passes)?;
        f.checked = true;
    }
    if !rows.is_empty() {
        append(&passes, rows)?;
        if f.first_ms.is_none() {
            f.first_ms = rows
                .lines()
                .next()
                .and_then(Record::parse)
                .map(|r| r.unix_ms);
        }
    }
    let now = unix_ms(at);
    if f.first_ms
        .is_some_and(|first| now - first > DAY_MS + SLACK_MS)
    {
        f.first_ms = fold(&gdir, now)?;
    }
    Ok(())
}

/// Makes sure `passes.csv` ends with a whole row (a crash may have cut the last one) and
/// returns the time of its first row.
fn end_rows(passes: &Path) -> io::Result<Option<i64>> {
    let mut file = match OpenOptions::new().read(true).append(true).open(passes) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let len = file.metadata()?.len();
    if len > 0 {
        file.seek(SeekFrom::Start(len - 1))?;
        let mut last = [0u8];
        file.read_exact(&mut last)?;
        if last[0] != b'\n' {
            file.write_all(b"\n")?;
        }
    }
    file.seek(SeekFrom::Start(0))?;
    Ok(BufReader::new(file)
        .lines()
        .map_while(Result::ok)
        .find_map(|l| Record::parse(&l))
        .map(|r| r.unix_ms))
}

/// Appends `rows` to `path`, its header first when it is new.
fn append(path: &Path, rows: &str) -> io::Result<()> {
    let mut file = OpenOptions::new().create(true).append(true).open(path)?;
    let mut out = String::new();
    if file.metadata()?.len() == 0 {
        out.push_str(HEADER);
        out.push('\n');
    }
    out.push_str(rows);
    file.write_all(out.as_bytes())
}

/// Writes `bytes` beside `path` and renames it over `path`.
fn replace(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let mut file = File::create(&tmp)?;
    file.write_all(bytes)?;
    file.sync_data()?;
    fs::rename(&tmp, path)
}

/// Folds the rows of `passes.csv` older than a day into `minutes.csv`, drops the minutes older
/// than a week, and returns the time of the oldest row left in `passes.csv`.
fn fold(gdir: &Path, now: i64) -> io::Result<Option<i64>> {
    let passes = gdir.join("passes.csv");
    let minutes = gdir.join("minutes.csv");
    let (rows, _) = rows_of(&passes)?;
    let (old, recent): (Vec<Record>, Vec<Record>) =
        rows.into_iter().partition(|r| now - r.unix_ms > DAY_MS);
    let (mut kept, _) = rows_of(&minutes)?;
    kept.extend(by_minute(old));
    kept.retain(|r| now - r.unix_ms <= WEEK_MS);
    replace(&minutes, &csv(&kept))?;
    replace(&passes, &csv(&recent))?;
    Ok(recent.first().map(|r| r.unix_ms))
}

fn csv(rows: &[Record]) -> Vec<u8> {
    let mut out = String::with_capacity(HEADER.len() + 1 + rows.len() * 64);
    out.push_str(HEADER);
    out.push('\n');
    for r in rows {
        out.push_str(&r.line());
    }
    out.into_bytes()
}

/// The rows of one file (none when it does not exist) and how many lines were not rows.
fn rows_of(path: &Path) -> io::Result<(Vec<Record>, usize)> {
    let text = match fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok((Vec::new(), 0)),
        Err(e) => return Err(e),
    };
    let mut rows = Vec::new();
    let mut bad = 0;
    for line in text.lines().filter(|l| *l != HEADER && !l.is_empty()) {
        match Record::parse(line) {
            Some(r) => rows.push(r),
            None => bad += 1,
        }
    }
    Ok((rows, bad))
}

/// A group's rows since `since_ms` (milliseconds since the Unix epoch), oldest first, at
/// minute resolution beyond a day and at pass resolution within it, and how many lines were
/// not rows (a row a crash cut, a damaged line).
pub fn read(dir: &Path, group: &str, since_ms: i64) -> io::Result<(Vec<Record>, usize)> {
    let gdir = group_dir(dir, group);
    let (mut rows, bad_minutes) = rows_of(&gdir.join("minutes.csv"))?;
    let (passes, bad_passes) = rows_of(&gdir.join("passes.csv"))?;
    if let Some(first) = passes.first() {
        rows.retain(|r| r.unix_ms < first.unix_ms);
    }
    rows.extend(passes);
    rows.retain(|r| r.unix_ms >= since_ms);
    Ok((rows, bad_minutes + bad_passes))
}

/// A group's rows since `since_ms`, oldest first, one per minute (each minute's highest
/// readings, [`Record::fold`]): read a line at a time, so that a day of passes every second
/// is never in memory at once (a week is at most 10,080 rows).
pub fn read_minutes(dir: &Path, group: &str, since_ms: i64) -> io::Result<Vec<Record>> {
    let gdir = group_dir(dir, group);
    let mut out: Vec<Record> = Vec::new();
    for name in ["minutes.csv", "passes.csv"] {
        let file = match File::open(gdir.join(name)) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        for line in BufReader::new(file).lines() {
            let Some(mut r) = Record::parse(&line?) else {
                continue;
            };
            if r.unix_ms < since_ms {
                continue;
            }
            let minute = r.unix_ms.div_euclid(60_000) * 60_000;
            match out.last_mut() {
                // A minute both files have (the fold's last), or a later pass of the minute.
                Some(last) if last.unix_ms == minute => last.fold(&r),
                Some(last) if last.unix_ms > minute => {}
                _ => {
                    r.unix_ms = minute;
                    out.push(r);
                }
            }
        }
    }
    Ok(out)
}

/// What a group's last save says.
pub enum Loaded {
    /// No save (a new group, or no state directory).
    Nothing,
    /// One that could not be read: set aside, for this reason.
    Damaged(String),
    /// The save, and when it was made.
    Saved(Box<Saved>, SystemTime),
}

/// Reads `group`'s last save; one that cannot be read is renamed `learned.json.damaged`.
pub(super) fn load(dir: &Path, group: &str) -> Loaded {
    let path = group_dir(dir, group).join("learned.json");
    let bytes = match fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Loaded::Nothing,
        Err(e) => return Loaded::Damaged(format!("{}: {e}", path.display())),
    };
    let why = match serde_json::from_slice::<LearnedFile>(&bytes) {
        Ok(f) if f.history.version == crate::decide::saved::VERSION => {
            return Loaded::Saved(Box::new(f.history), at_unix_ms(f.saved_at_unix_ms));
        }
        Ok(f) => format!(
            "version {} (this daemon reads {})",
            f.history.version,
            crate::decide::saved::VERSION
        ),
        Err(e) => e.to_string(),
    };
    let mut aside = path.as_os_str().to_owned();
    aside.push(".damaged");
    let aside = PathBuf::from(aside);
    match fs::rename(&path, &aside) {
        Ok(()) => Loaded::Damaged(format!(
            "{} cannot be read ({why}): set aside as {}",
            path.display(),
            aside.display()
        )),
        Err(e) => Loaded::Damaged(format!(
            "{} cannot be read ({why}), nor set aside ({e})",
            path.display()
        )),
    }
}

/// Removes the history of every group not in `declared` that has not been written for
/// [`super::GRACE`].
fn prune(dir: &Path, declared: &[String]) {
    let Ok(entries) = fs::read_dir(dir.join("groups")) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if declared.contains(&name) {
            continue;
        }
        let path = entry.path();
        let newest = ["passes.csv", "learned.json", "minutes.csv"]
            .iter()
            .filter_map(|f| fs::metadata(path.join(f)).and_then(|m| m.modified()).ok())
            .max();
        let idle = newest.map(|t| t.elapsed().unwrap_or_default());
        if idle.is_none_or(|i| i >= super::GRACE) {
            match fs::remove_dir_all(&path) {
                Ok(()) => tracing::info!(
                    group = name,
                    "the history of {name}, no longer declared for {}, is removed",
                    humantime::format_duration(super::GRACE)
                ),
                Err(e) => tracing::warn!(
                    group = name,
                    "removing the history of {name} ({}) failed: {e}",
                    path.display()
                ),
            }
        }
    }
}
