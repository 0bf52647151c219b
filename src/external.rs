//! The external signal's runner: a program of the operator's (`[[groups.NAME.external]]`)
//! that prints one number, the load a group scales on.
//!
//! [`check_program`] is the config parser's rule for the program (root's file, in root's
//! directories, like the desired-state file itself, and a script's interpreter likewise);
//! [`read`] checks it again and runs it once, by the descriptor it checked (`run`), bounded in
//! time and output, leaving nothing behind (`reap`), and returns its number or an
//! [`ExternalError`]; [`Said`] remembers which errors were logged so that each is logged once,
//! and [`Cache`] holds the last reading of each signal so that a program runs at most once per
//! interval. The reconciler runs the programs in the background, one run of each signal at a
//! time (`crate::reconciler`). Nothing here decides: `decide` turns the value into a count.

mod reap;
mod run;

use std::collections::HashMap;
use std::fmt;
use std::io;
use std::os::unix::process::ExitStatusExt;
use std::time::Duration;

use tokio::time::Instant;

use crate::model::{ExternalSpec, GroupName};
use crate::text::printable;

/// The whole environment a program gets: nothing of the daemon's is inherited.
pub const ENVIRONMENT: [(&str, &str); 2] = [
    ("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
    ("LANG", "C.UTF-8"),
];

/// Bytes kept of stdout and of stderr each; the rest is read and thrown away, so that the
/// program never blocks on a full pipe.
pub const KEPT: usize = 4096;

/// Characters of stdout quoted in [`ExternalError::NotANumber`].
const STDOUT_EXCERPT: usize = 64;
/// Characters of stderr quoted in [`ExternalError::Exit`].
const STDERR_EXCERPT: usize = 200;
/// Lines of stderr quoted in [`ExternalError::Exit`] (the first non-empty ones).
const STDERR_LINES: usize = 3;

pub use crate::config::signals::check_program;

/// How a program ended when it did not exit with 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// It exited with this code.
    Code(i32),
    /// A signal killed it.
    Signal(i32),
}

impl fmt::Display for Ended {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Ended::Code(code) => write!(f, "exited with code {code}"),
            Ended::Signal(signal) => write!(f, "was killed by signal {signal}"),
        }
    }
}

/// What the journal (and `plan`) says when external signal `i` (from 0) of `group`, run as
/// `program`, has no reading.
pub fn no_reading(group: &str, i: usize, program: &str, e: &ExternalError) -> String {
    format!(
        "external signal {} of {group} ({program}) has no reading: {e}; it holds the count \
         (never lowers it) until the program answers",
        i + 1
    )
}

/// Why an external signal has no reading this time. The messages are for the journal, after
/// "external signal N of group G: ".
#[derive(Debug, thiserror::Error)]
pub enum ExternalError {
    /// The program, or a script's interpreter, is not one the daemon runs (missing, or others
    /// could change it: see [`check_program`]), checked again before every run.
    #[error("cannot run {program}: {why}")]
    Unusable { program: String, why: String },
    /// The program could not be started (not executable, no memory...).
    #[error("cannot run {program}: {source}")]
    Spawn {
        program: String,
        #[source]
        source: io::Error,
    },
    /// It did not finish (and close its output) in time: it and everything it started were
    /// killed.
    #[error(
        "no answer within {}: killed it and every process it started",
        humantime::format_duration(*after)
    )]
    Timeout { after: Duration },
    /// It ended otherwise than by exiting with 0 (whatever it printed).
    #[error("{ended}{}", said(stderr))]
    Exit {
        ended: Ended,
        /// The first lines of its stderr, made printable and cut short (empty: nothing).
        stderr: String,
    },
    /// Its stdout, trimmed, is not one finite number (see [`read`]).
    #[error("printed {}, not one number", quoted(stdout))]
    NotANumber {
        /// The start of its stdout, trimmed, made printable and cut short.
        stdout: String,
    },
    /// It printed a number below 0.
    #[error("printed {value}, a negative number (a load is 0 or more)")]
    Negative { value: f64 },
}

fn said(stderr: &str) -> String {
    if stderr.is_empty() {
        " (nothing on stderr)".into()
    } else {
        format!(": {stderr}")
    }
}

fn quoted(stdout: &str) -> String {
    if stdout.is_empty() {
        "nothing".into()
    } else {
        format!("\"{stdout}\"")
    }
}

/// Runs `spec.command` once and returns the number it printed.
///
/// The program, and a script's interpreter, are opened and checked first, as the config
/// parser checks them ([`check_program`]), and what was checked is what is executed: a file put
/// in its place since is refused ([`ExternalError::Unusable`]), never run. It is run directly
/// (no shell), as the daemon's user, from `/`, with stdin from `/dev/null` and only
/// [`ENVIRONMENT`], in a session of its own. The run ends when the program exits, or at
/// `spec.timeout` ([`ExternalError::Timeout`]): then whatever it started is killed, its process
/// group and the processes that left it, and what they wrote before is still read. When the
/// returned future is dropped before, its process group is killed at once, and what left it
/// at the next run's end (a drop cannot wait for the leader to die). At most [`KEPT`] bytes of
/// each of stdout and stderr are kept. When it exits with 0, the answer is its stdout without leading and trailing
/// whitespace: one finite number, 0 or more, as Rust's `f64` parser reads it (`42`, `3.5`,
/// `.5`, `+7`, `1e3`); not `inf`, `nan`, units, `1_000`, `1,5` or two numbers.
pub async fn read(spec: &ExternalSpec) -> Result<f64, ExternalError> {
    let (status, stdout, stderr) = run::run(&spec.command, spec.timeout, None).await?;
    exited(status, &stderr)?;
    parse(&stdout)
}

/// Runs `command` once, as [`read`] runs a signal's program, with `input` on its standard
/// input (then closed): `Ok` when it exits with 0, whatever it printed.
pub async fn run_with_input(
    command: &[String],
    timeout: Duration,
    input: &[u8],
) -> Result<(), ExternalError> {
    let (status, _, stderr) = run::run(command, timeout, Some(input)).await?;
    exited(status, &stderr)
}

/// `Ok` when the program exited with 0, else how it ended with the start of its stderr.
fn exited(status: std::process::ExitStatus, stderr: &Captured) -> Result<(), ExternalError> {
    let ended = match (status.code(), status.signal()) {
        (Some(0), _) => return Ok(()),
        (Some(code), _) => Ended::Code(code),
        (None, Some(signal)) => Ended::Signal(signal),
        // Neither: not on Linux (stopped or continued are not reported by wait).
        (None, None) => Ended::Code(-1),
    };
    Err(ExternalError::Exit {
        ended,
        stderr: stderr_excerpt(&stderr.kept),
    })
}

/// What was read of one of the program's pipes.
#[derive(Debug, Default)]
struct Captured {
    /// The first [`KEPT`] bytes.
    kept: Vec<u8>,
    /// Whether more came after them (read and thrown away).
    more: bool,
}

/// The number a program printed: its stdout without leading and trailing whitespace must be one
/// finite number as Rust's `f64` parser reads it (`42`, `3.5`, `.5`, `+7`, `1e3`, `2.5E-1`),
/// 0 or more. Refused: nothing, two numbers, units (`42ms`), `1_000`, `1,5`, hexadecimal,
/// `inf`, `nan`, and any stdout longer than [`KEPT`] bytes. `-0` reads as 0.
fn parse(stdout: &Captured) -> Result<f64, ExternalError> {
    let text = String::from_utf8_lossy(&stdout.kept);
    let trimmed = text.trim();
    let value = match trimmed.parse::<f64>() {
        Ok(v) if v.is_finite() && !stdout.more => v,
        _ => {
            let mut excerpt = cut(trimmed, STDOUT_EXCERPT);
            if stdout.more && excerpt.len() == trimmed.len() {
                excerpt.push('…');
            }
            return Err(ExternalError::NotANumber {
                stdout: printable(&excerpt).into_owned(),
            });
        }
    };
    if value < 0.0 {
        return Err(ExternalError::Negative { value });
    }
    // -0 + 0 is 0.
    Ok(value + 0.0)
}

/// The first non-empty lines of stderr, one line, printable and cut short.
fn stderr_excerpt(stderr: &[u8]) -> String {
    let text = String::from_utf8_lossy(stderr);
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .take(STDERR_LINES)
        .collect();
    printable(&cut(&lines.join(" / "), STDERR_EXCERPT)).into_owned()
}

/// `text` cut to `max` characters, with '…' when something was cut.
fn cut(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((end, _)) => format!("{}…", &text[..end]),
        None => text.to_owned(),
    }
}

/// Which external signal: its group and its index among the group's `external` entries.
pub type Key = (GroupName, usize);

/// Which errors were logged, so that each is logged once: again only when it reads
/// differently, and a recovery only after an error. The reconciler logs "external signal N of
/// group G: <error>" when [`Said::failed`] says so, and a recovery when [`Said::succeeded`] does.
#[derive(Debug, Default)]
pub struct Said {
    last: HashMap<Key, String>,
}

impl Said {
    /// Records that `key` failed with `error` (its `Display` text); `true` when that is worth
    /// logging: the first failure, or one that reads differently from the one before.
    pub fn failed(&mut self, key: &Key, error: &str) -> bool {
        match self.last.get_mut(key) {
            Some(last) if last == error => false,
            Some(last) => {
                error.clone_into(last);
                true
            }
            None => {
                self.last.insert(key.clone(), error.to_owned());
                true
            }
        }
    }

    /// Records that `key` gave a reading; `true` when that is worth logging: it had failed.
    pub fn succeeded(&mut self, key: &Key) -> bool {
        self.last.remove(key).is_some()
    }

    /// Forgets the signals `keep` says no longer exist (after a reload).
    pub fn retain(&mut self, mut keep: impl FnMut(&Key) -> bool) {
        self.last.retain(|k, _| keep(k));
    }
}

/// The last run of each signal, so that its program runs at most once per interval however
/// often its group is reconciled (events, reloads, requeues).
///
/// A run is recorded with the time it started:
/// ```ignore
/// if cache.fresh(&key, now, interval).is_none() && !running(&key) {
///     // Due: start a run in the background; when it ends (log the error through `Said`):
///     cache.put(key, started, value.as_ref().ok().copied());
/// }
/// // What a pass at `now` uses: the last value while it is fresh enough.
/// let value = cache.fresh(&key, now, interval + timeout).flatten();
/// ```
/// A failed run counts as a run (`Some(None)`): a broken program is not retried on every
/// event. The caller runs one program of a signal at a time, so two runs cannot race.
#[derive(Debug, Default)]
pub struct Cache {
    taken: HashMap<Key, (Instant, Option<f64>)>,
}

impl Cache {
    /// The last run's outcome (`Some(value)`, or `None` when it failed) if it started less
    /// than `interval` before `now`; `None` when the program is due to run.
    pub fn fresh(&self, key: &Key, now: Instant, interval: Duration) -> Option<Option<f64>> {
        let (at, value) = self.taken.get(key)?;
        (now.saturating_duration_since(*at) < interval).then_some(*value)
    }

    /// Records a run of `key` started at `now`: its value, or `None` when it failed.
    pub fn put(&mut self, key: Key, now: Instant, value: Option<f64>) {
        self.taken.insert(key, (now, value));
    }

    /// Forgets the signals `keep` says no longer exist (after a reload).
    pub fn retain(&mut self, mut keep: impl FnMut(&Key) -> bool) {
        self.taken.retain(|k, _| keep(k));
    }
}

#[cfg(test)]
#[path = "external_tests.rs"]
mod tests;

#[cfg(test)]
mod program_tests;

#[cfg(test)]
mod reap_tests;
