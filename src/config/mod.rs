//! The desired-state file: TOML text → validated [`DesiredState`], or every problem at once.
//!
//! Parsing keeps each value's place, so an error reads `PATH:LINE:COLUMN: error: groups.web.max: …`.
//! `parse` takes text (tests never touch files); `load` reads a file as it is (`load_content`
//! the same, without checking the TLS files it names), `load_checked` only if nobody but root
//! and the daemon's user can have written it (see [`open_checked`]).

mod diag;
mod fields;
mod remote;
mod safe_open;
mod security;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use toml::de::{DeTable, DeValue};

use diag::Collector;
pub use diag::{Diagnostic, Severity};
use fields::Fields;
pub use security::{check_permissions, open_checked};

use crate::model::{
    DaemonSpec, DesiredState, GroupName, GroupSpec, MemorySourceKind, Policy, ScaleDownOrder,
    GROUP_KEY, MAX_INSTANCES, RESTART_BACKOFF_MAX, STOP_TIMEOUT_MAX,
};

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
const DAEMON_KEYS: &[&str] = &[
    "interval",
    "memory_source",
    "resync",
    "max_parallel_actions",
    "control_socket",
    "metrics_address",
    "lease",
    "incus",
    "tls_client_cert",
    "tls_client_key",
    "tls_server_cert",
];

/// The longest `drain_timeout` accepted.
pub const DRAIN_TIMEOUT_MAX: Duration = Duration::from_secs(300);

/// The largest warm pool accepted per group.
pub const WARM_POOL_MAX: u32 = 100;

/// The most actions of one pass that may run at once.
pub const PARALLEL_MAX: u32 = 64;

/// The longest interval, stabilization window and grace period accepted: beyond a day a value
/// is a typo, and far beyond it would overflow the clock.
pub const DURATION_MAX: Duration = Duration::from_secs(24 * 3600);
/// Every key a `[groups.NAME]` table accepts.
pub const GROUP_KEYS: &[&str] = &[
    "min",
    "max",
    "memory_threshold",
    "tolerance",
    "image",
    "instance_prefix",
    "profiles",
    "project",
    "config",
    "scale_down_stabilization",
    "scale_up_stabilization",
    "max_scale_up_step",
    "max_scale_down_step",
    "stop_timeout",
    "unhealthy_grace",
    "restart_backoff",
    "warm_pool",
    "paused",
    "scale_down_order",
    "policy",
    "drain_command",
    "drain_timeout",
    "allow_privileged",
    "target",
];

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
                    if let Some(spec) = group(&mut c, g.clone(), fields, daemon.interval) {
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
    t.finish(c, DAEMON_KEYS);
    d
}

fn group(
    c: &mut Collector,
    name: GroupName,
    mut t: Fields,
    interval: Duration,
) -> Option<GroupSpec> {
    let before = c.diagnostics.len();
    let min = t.count(c, "min");
    let max = t.count(c, "max");
    let max = t.required(c, "max", max);
    let threshold = t.number(c, "memory_threshold");
    let threshold = t.required(c, "memory_threshold", threshold);
    let tolerance = t.number(c, "tolerance");
    let image = t.string(c, "image");
    let image = t.required(c, "image", image);
    let prefix = t.string(c, "instance_prefix");
    let profiles = t.strings(c, "profiles");
    let project = t.string(c, "project");
    let down = t.duration_within(c, "scale_down_stabilization", Duration::ZERO, DURATION_MAX);
    let up = t.duration_within(c, "scale_up_stabilization", Duration::ZERO, DURATION_MAX);
    let up_step = t.count(c, "max_scale_up_step");
    let down_step = t.count(c, "max_scale_down_step");
    for (key, step) in [
        ("max_scale_up_step", &up_step),
        ("max_scale_down_step", &down_step),
    ] {
        if let Some((0, span)) = step {
            c.error(
                Some(span.clone()),
                &t.key(key),
                "must be at least 1 (leave it out for no limit)",
            );
        }
    }
    let warm_pool = t.count(c, "warm_pool");
    if let Some((n, span)) = &warm_pool {
        if *n > WARM_POOL_MAX {
            c.error(
                Some(span.clone()),
                &t.key("warm_pool"),
                format!("{n} is out of range: must be at most {WARM_POOL_MAX}"),
            );
        }
    }
    let stop_timeout = t.duration_within(c, "stop_timeout", Duration::ZERO, STOP_TIMEOUT_MAX);
    let grace = t.duration_within(c, "unhealthy_grace", Duration::ZERO, DURATION_MAX);
    let restart_backoff = t.duration_within(
        c,
        "restart_backoff",
        Duration::from_millis(100),
        RESTART_BACKOFF_MAX,
    );
    let allow_privileged = t.boolean(c, "allow_privileged").is_some_and(|(b, _)| b);
    let paused = t.boolean(c, "paused").is_some_and(|(b, _)| b);
    let scale_down_order = t
        .choice(
            c,
            "scale_down_order",
            &[
                ("newest", ScaleDownOrder::Newest),
                ("oldest", ScaleDownOrder::Oldest),
                ("least-memory", ScaleDownOrder::LeastMemory),
            ],
        )
        .unwrap_or_default();
    let policy = t
        .choice(
            c,
            "policy",
            &[
                ("adaptive", Policy::Adaptive),
                ("kubernetes", Policy::Kubernetes),
            ],
        )
        .unwrap_or_default();
    let drain_command = t
        .strings(c, "drain_command")
        .map_or_else(Vec::new, |(v, span)| {
            if v.is_empty() || v[0].is_empty() {
                c.error(
                    Some(span),
                    &t.key("drain_command"),
                    "must name a program, e.g. [\"/bin/sh\", \"-c\", \"…\"]",
                );
            }
            v
        });
    let drain_timeout = t.duration_within(
        c,
        "drain_timeout",
        Duration::from_secs(1),
        DRAIN_TIMEOUT_MAX,
    );
    let config = t
        .table(c, "config")
        .map(|ct| instance_config(c, ct, allow_privileged));
    let target = t.string(c, "target").and_then(|(v, span)| {
        let name = v.strip_prefix('@').unwrap_or(&v);
        let ok = !name.is_empty()
            && name
                .chars()
                .all(|ch| ch.is_ascii_alphanumeric() || matches!(ch, '-' | '_' | '.'));
        if !ok {
            c.error(
                Some(span),
                &t.key("target"),
                format!(
                    "{v:?} is not a cluster member or @cluster-group name (letters, digits, \
                     '-', '_', '.'), as in \"node2\" or \"@web-nodes\""
                ),
            );
        }
        ok.then_some(v)
    });

    if let Some((max, span)) = &max {
        if *max == 0 {
            c.error(Some(span.clone()), &t.key("max"), "must be at least 1");
        } else if *max > MAX_INSTANCES {
            c.error(
                Some(span.clone()),
                &t.key("max"),
                format!("must be at most {}", MAX_INSTANCES),
            );
        }
        if let Some((min, min_span)) = &min {
            if min > max {
                c.error(
                    Some(min_span.clone()),
                    &t.key("min"),
                    format!("min ({min}) is greater than max ({max})"),
                );
            }
        }
    }
    if let Some((th, span)) = &threshold {
        if !(1.0..=100.0).contains(th) {
            c.error(
                Some(span.clone()),
                &t.key("memory_threshold"),
                format!("{th} is outside 1–100 (percent of each instance's memory limit)"),
            );
        }
    }
    if let Some((tol, span)) = &tolerance {
        if !(0.0..1.0).contains(tol) {
            c.error(
                Some(span.clone()),
                &t.key("tolerance"),
                "must be from 0 up to (not including) 1",
            );
        }
    }
    if let Some((img, span)) = &image {
        if img.trim().is_empty() {
            c.error(
                Some(span.clone()),
                &t.key("image"),
                "must name an image alias or fingerprint",
            );
        }
    }
    if let Some((p, span)) = &prefix {
        if let Err(e) = check_prefix(p) {
            c.error(Some(span.clone()), &t.key("instance_prefix"), e);
        }
    }
    if let Some((profiles, span)) = &profiles {
        if profiles.iter().any(|p| p.trim().is_empty()) {
            c.error(
                Some(span.clone()),
                &t.key("profiles"),
                "a profile name cannot be empty",
            );
        }
    }
    if let Some((p, span)) = &project {
        if p.trim().is_empty() || p.contains(['/', '?', '&', '#', ' ']) {
            c.error(
                Some(span.clone()),
                &t.key("project"),
                format!("{p:?} is not a valid project name"),
            );
        }
    }
    let config = config.unwrap_or_default();
    let profiles = profiles.map_or_else(|| vec!["default".to_owned()], |(p, _)| p);
    if !config.contains_key("limits.memory") {
        c.warning(
            Some(t.span()),
            &t.key("config"),
            format!(
                "no \"limits.memory\": unless profile(s) {} set it, each instance's memory is measured \
                 against the host's total memory",
                profiles.join(", ")
            ),
        );
    }
    t.finish(c, GROUP_KEYS);

    if c.diagnostics[before..]
        .iter()
        .any(|d| d.severity == Severity::Error)
    {
        return None;
    }
    let secs = |d: Option<Duration>, default: u64| d.unwrap_or(Duration::from_secs(default));
    Some(GroupSpec {
        instance_prefix: prefix.map_or_else(|| format!("{name}-"), |(p, _)| p),
        min: min.map_or(1, |(m, _)| m),
        max: max?.0,
        memory_threshold: threshold?.0,
        tolerance: tolerance.map_or(0.1, |(t, _)| t),
        image: image?.0,
        profiles,
        project: project.map_or_else(|| "default".to_owned(), |(p, _)| p),
        config,
        scale_down_stabilization: secs(down, 300),
        scale_up_stabilization: secs(up, 0),
        max_scale_up_step: up_step.map(|(s, _)| s),
        max_scale_down_step: down_step.map(|(s, _)| s),
        stop_timeout: secs(stop_timeout, 30),
        unhealthy_grace: secs(grace, 300),
        restart_backoff: secs(restart_backoff, 10),
        interval,
        warm_pool: warm_pool.map_or(0, |(n, _)| n),
        paused,
        scale_down_order,
        policy,
        drain_command,
        drain_timeout: secs(drain_timeout, 30),
        target,
        name,
    })
}

/// `[groups.NAME.config]`: Incus instance config, values as strings (numbers and booleans are
/// accepted and written as Incus expects them).
fn instance_config(
    c: &mut Collector,
    mut t: Fields,
    allow_privileged: bool,
) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for (k, v) in t.entries() {
        let key = k.get_ref().to_string();
        let path = t.key(&format!("{key:?}"));
        let value = match v.get_ref() {
            DeValue::String(s) => s.to_string(),
            DeValue::Integer(i) => i.as_str().to_owned(),
            DeValue::Boolean(b) => b.to_string(),
            other => {
                c.error(
                    Some(v.span()),
                    &path,
                    format!("expected a string, found {}", fields::type_name(other)),
                );
                continue;
            }
        };
        if key.starts_with("user.incus-hpa.") {
            c.error(
                Some(k.span()),
                &path,
                format!("keys under user.incus-hpa. are the daemon's own (it sets {GROUP_KEY})"),
            );
        } else if key.starts_with("volatile.") || key.starts_with("image.") {
            c.error(
                Some(k.span()),
                &path,
                "Incus manages this key; it cannot be set at creation",
            );
        } else if let Some(why) = security::grants_host_root(&key, &value) {
            if !allow_privileged {
                c.error(
                    Some(k.span()),
                    &path,
                    format!("{why}; set allow_privileged = true in this group to accept that"),
                );
            }
        }
        out.insert(key, value);
    }
    out
}

/// An instance name prefix: a letter first, then letters, digits and '-', leaving room for the
/// random suffix within Incus' 63 characters.
fn check_prefix(p: &str) -> Result<(), String> {
    let max = 63 - SUFFIX_LEN;
    if p.is_empty() || p.len() > max {
        return Err(format!("must have 1 to {max} characters"));
    }
    if !p.starts_with(|c: char| c.is_ascii_alphabetic()) {
        return Err("must start with a letter (instance names are host names)".into());
    }
    if !p.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
        return Err("may hold only letters, digits and '-'".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests;
