//! The desired-state file: TOML text → validated [`DesiredState`], or every problem at once.
//!
//! Parsing keeps each value's place, so an error reads `PATH:LINE:COLUMN: error: groups.web.max: …`.
//! `parse` takes text (tests never touch files); `load` reads a file as it is (`load_content`
//! the same, without checking the TLS files it names), `load_checked` only if nobody but root
//! and the daemon's user can have written it (see [`open_checked`]).

mod diag;
mod endpoints;
mod fields;
mod group;
pub mod keys;
mod program;
mod ready;
mod remote;
mod safe_open;
mod security;
pub mod signals;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use toml::de::{DeTable, DeValue};

use diag::Collector;
pub use diag::{Diagnostic, Severity};
use fields::Fields;
pub use program::{open_program, Program, Script};
pub use security::{check_permissions, open_checked};

use crate::model::{DaemonSpec, DesiredState, GroupName, HostReserve, MemorySourceKind};

/// Where the daemon looks for its desired state unless told otherwise.
pub const DEFAULT_PATH: &str = "/etc/incus-hpa/desired-state.toml";

/// Longest random suffix appended to the instance prefix.
pub const SUFFIX_LEN: usize = 6;

/// A file that could not be used: every problem found, errors and warnings.
#[derive(Debug, thiserror::Error)]
#[error("{} has {} error(s)", .file.display(), .diagnostics.iter().filter(|d| d.severity == Severity::Error).count())]
pub struct ConfigError {
    pub file: PathBuf,
    pub diagnostics: Vec<Diagnostic>,
}

/// A valid desired state and the warnings found on the way.
#[derive(Debug, Clone)]
pub struct Loaded {
    pub state: DesiredState,
    pub warnings: Vec<Diagnostic>,
}

/// Reads and parses a desired-state file, whoever may have written it (`plan`, `simulate`,
/// tests); the daemon and `validate` use [`load_checked`].
pub fn load(path: &Path) -> Result<Loaded, ConfigError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| unreadable(path, format!("cannot read the file: {e}")))?;
    parse_with(path, &text, true)
}

/// Reads and parses a desired-state file for its content alone: neither its ownership and
/// modes nor the files it names are checked (`validate --syntax-only`, on a copy that is not
/// installed).
pub fn load_content(path: &Path) -> Result<Loaded, ConfigError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| unreadable(path, format!("cannot read the file: {e}")))?;
    parse(path, &text)
}

/// Reads a desired-state file through [`open_checked`] (refusing it unless only root and
/// `allowed_uid` can have written it, with one error saying why) and parses it.
pub fn load_checked(path: &Path, allowed_uid: u32) -> Result<Loaded, ConfigError> {
    let text = open_checked(path, allowed_uid).map_err(|message| unreadable(path, message))?;
    parse_with(path, &text, true)
}

/// A file that could not be read: one error with no place in it.
fn unreadable(path: &Path, message: String) -> ConfigError {
    ConfigError {
        file: path.to_path_buf(),
        diagnostics: vec![Diagnostic {
            severity: Severity::Error,
            file: path.to_path_buf(),
            line: 0,
            column: 0,
            key: String::new(),
            message,
        }],
    }
}

const TOP_KEYS: &[&str] = &["daemon", "groups"];

/// The longest `drain_timeout` accepted.
pub const DRAIN_TIMEOUT_MAX: Duration = Duration::from_secs(300);

/// The longest an external program may run.
pub const EXTERNAL_TIMEOUT_MAX: Duration = Duration::from_secs(60);

/// The longest a schedule window may stay open.
pub const WINDOW_MAX: Duration = Duration::from_secs(31 * 24 * 3600);

/// The largest warm pool accepted per group.
pub const WARM_POOL_MAX: u32 = 100;

/// The most actions of one pass that may run at once.
pub const PARALLEL_MAX: u32 = 64;

/// The longest interval, stabilization window and grace period accepted: beyond a day a value
/// is a typo, and far beyond it would overflow the clock.
pub const DURATION_MAX: Duration = Duration::from_secs(24 * 3600);
/// Every key a `[groups.NAME]` table accepts.
pub fn group_keys() -> Vec<&'static str> {
    keys::names(keys::Table::Group)
}

/// Parses desired-state text; `file` is only used to name places in messages, and the files
/// it names (the TLS certificates) are not looked at.
pub fn parse(file: &Path, text: &str) -> Result<Loaded, ConfigError> {
    parse_with(file, text, false)
}

/// Parses desired-state text, checking the files it names when `check_files`.
fn parse_with(file: &Path, text: &str, check_files: bool) -> Result<Loaded, ConfigError> {
    let mut c = Collector::new(file, text);
    let (doc, errors) = DeTable::parse_recoverable(text);
    for e in errors {
        c.error(
            e.span(),
            "",
            format!("invalid TOML: {}", e.message().trim()),
        );
    }
    let state = if c.has_errors() {
        None
    } else {
        let span = doc.span();
        let mut top = Fields::new(doc.get_ref(), "", span);
        let daemon = match top.table(&mut c, "daemon") {
            Some(t) => daemon(&mut c, t, check_files),
            None => DaemonSpec::default(),
        };
        let mut groups = BTreeMap::new();
        match top.table(&mut c, "groups") {
            Some(mut t) => {
                for (name, value) in t.entries() {
                    let key = format!("groups.{}", name.get_ref());
                    let g = match GroupName::parse(name.get_ref()) {
                        Ok(g) => g,
                        Err(e) => {
                            c.error(Some(name.span()), &key, e);
                            continue;
                        }
                    };
                    let DeValue::Table(table) = value.get_ref() else {
                        c.error(Some(value.span()), &key, "expected a table ([groups.NAME])");
                        continue;
                    };
                    let fields = Fields::new(table, &key, name.span());
                    if let Some(spec) =
                        group::group(&mut c, g.clone(), fields, daemon.interval, check_files)
                    {
                        groups.insert(g, spec);
                    }
                }
                if groups.is_empty() && !c.has_errors() {
                    c.warning(
                        Some(t.span()),
                        "groups",
                        "no groups: nothing will be managed",
                    );
                }
            }
            None => c.warning(
                None,
                "groups",
                "no [groups.NAME] table: nothing will be managed until one is added",
            ),
        }
        top.finish(&mut c, TOP_KEYS);
        Some(DesiredState { daemon, groups })
    };
    match state {
        Some(state) if !c.has_errors() => Ok(Loaded {
            state,
            warnings: c.diagnostics,
        }),
        _ => Err(ConfigError {
            file: file.to_path_buf(),
            diagnostics: c.diagnostics,
        }),
    }
}

fn daemon(c: &mut Collector, mut t: Fields, check_files: bool) -> DaemonSpec {
    let mut d = DaemonSpec::default();
    remote::read(c, &mut t, &mut d, check_files);
    if let Some(interval) =
        t.duration_within(c, "interval", Duration::from_millis(100), DURATION_MAX)
    {
        d.interval = interval;
    }
    if let Some(resync) = t.duration_within(c, "resync", Duration::from_secs(10), DURATION_MAX) {
        d.resync = resync;
    }
    if let Some((p, span)) = t.string(c, "control_socket") {
        if p.starts_with('/') {
            d.control_socket = p.into();
        } else {
            c.error(
                Some(span),
                &t.key("control_socket"),
                format!("{p:?} is not an absolute path"),
            );
        }
    }
    if let Some((p, span)) = t.string(c, "state_directory") {
        if p.starts_with('/') {
            d.state_directory = Some(p.into());
        } else {
            c.error(
                Some(span),
                &t.key("state_directory"),
                format!("{p:?} is not an absolute path"),
            );
        }
    }
    if let Some(lease) =
        t.duration_within(c, "lease", Duration::from_secs(3), Duration::from_secs(600))
    {
        d.lease = lease;
    }
    if let Some((a, span)) = t.string(c, "metrics_address") {
        match a.parse() {
            Ok(addr) => d.metrics_address = Some(addr),
            Err(_) => c.error(
                Some(span),
                &t.key("metrics_address"),
                format!(
                    "{a:?} is not an IP address and port: write it like \"127.0.0.1:9750\" or \"[::1]:9750\""
                ),
            ),
        }
    }
    if let Some((n, span)) = t.count(c, "max_parallel_actions") {
        if (1..=PARALLEL_MAX).contains(&n) {
            d.max_parallel_actions = n as usize;
        } else {
            c.error(
                Some(span),
                &t.key("max_parallel_actions"),
                format!("{n} is out of range: must be from 1 to {PARALLEL_MAX}"),
            );
        }
    }
    if let Some(kind) = t.choice(
        c,
        "memory_source",
        &[
            ("auto", MemorySourceKind::Auto),
            ("cgroup", MemorySourceKind::Cgroup),
            ("api", MemorySourceKind::Api),
        ],
    ) {
        d.memory_source = kind;
    }
    if let Some((r, span)) = t.string_or_integer(c, "host_reserve") {
        match HostReserve::parse(&r) {
            Ok(r) => d.host_reserve = r,
            Err(e) => c.error(Some(span), &t.key("host_reserve"), e),
        }
    }
    t.finish(c, &keys::names(keys::Table::Daemon));
    d
}

#[cfg(test)]
mod tests;
