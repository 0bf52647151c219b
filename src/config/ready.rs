//! `[groups.NAME.ready]` → a [`ReadySpec`]: how an instance of the group is checked (a port
//! from the daemon's host, or a command inside the instance) and how often, every problem
//! reported at its key.

use std::ops::Range;
use std::time::Duration;

use super::diag::{Collector, Severity};
use super::fields::{human, At, Fields};
use super::keys::{self, Table};
use crate::model::{Probe, ReadySpec};

/// The shortest `period` accepted: a check more often than this only loads the instance.
pub const PERIOD_MIN: Duration = Duration::from_millis(100);

/// The longest `period` accepted (and the longest `start_timeout`).
pub const PERIOD_MAX: Duration = Duration::from_secs(3600);

/// The most consecutive failed checks `failures` may ask for.
pub const FAILURES_MAX: u32 = 100;

/// The longest interface name Linux accepts (`IFNAMSIZ` less its terminating NUL).
pub const INTERFACE_MAX_LEN: usize = 15;

/// Reads the `ready` table of the group `t`, if it has one. `None` when it has none, and when
/// it has errors (they are in `c`, which rejects the file).
pub(super) fn read(c: &mut Collector, t: &mut Fields) -> Option<ReadySpec> {
    let r = t.table(c, "ready")?;
    table(c, r)
}

fn table(c: &mut Collector, mut t: Fields) -> Option<ReadySpec> {
    let before = c.diagnostics.len();
    let port = t.count(c, "port");
    let path = t.string(c, "path");
    let command = t.strings(c, "command");
    let period = t.duration(c, "period");
    let timeout = t.duration(c, "timeout");
    let failures = t.count(c, "failures");
    let start_timeout = t.duration(c, "start_timeout");
    let interface = t.string(c, "interface");
    let keys = Keys {
        port: t.key("port"),
        path: t.key("path"),
        command: t.key("command"),
        period: t.key("period"),
        timeout: t.key("timeout"),
        failures: t.key("failures"),
        start_timeout: t.key("start_timeout"),
        interface: t.key("interface"),
    };
    let span = t.span();
    let (has_port, has_command, has_period) = (t.has("port"), t.has("command"), t.has("period"));

    // The defaults of the keys but the probe (which is any here).
    let defaults = ReadySpec::with_probe(Probe::Tcp { port: 1 });
    let probe = probe(
        c,
        &keys,
        span,
        (port, has_port),
        path,
        (command, has_command),
    );
    let period = period.and_then(|(d, span)| {
        within(c, &keys.period, (d, span), (PERIOD_MIN, None), PERIOD_MAX).then_some(d)
    });
    // What timeout and start_timeout are held to: the file's period, else the default one;
    // nothing when the file's period is wrong (that is reported already).
    let bound = match (period, has_period) {
        (Some(p), _) => Some((p, "the period")),
        (None, false) => Some((defaults.period, "the default period")),
        (None, true) => None,
    };
    let timeout = timeout.and_then(|(d, span)| {
        let ok = !d.is_zero() && bound.is_none_or(|(p, _)| d < p);
        if !ok {
            let below = bound.map_or_else(String::new, |(p, said)| {
                format!(
                    " and below {} ({said}: a check lasting a whole period would run into \
                     the next)",
                    human(p)
                )
            });
            c.error(
                Some(span),
                &keys.timeout,
                format!("{} is out of range: must be above 0{below}", human(d)),
            );
        }
        ok.then_some(d)
    });
    let failures = failures.and_then(|(n, span)| {
        let ok = (1..=FAILURES_MAX).contains(&n);
        if !ok {
            c.error(
                Some(span),
                &keys.failures,
                format!("{n} is out of range: must be from 1 to {FAILURES_MAX}"),
            );
        }
        ok.then_some(n)
    });
    let start_timeout = start_timeout.and_then(|(d, span)| {
        let min = bound.map_or((PERIOD_MIN, None), |(p, said)| (p, Some(said)));
        within(c, &keys.start_timeout, (d, span), min, PERIOD_MAX).then_some(d)
    });
    let interface = interface.and_then(|(name, span)| match check_interface(&name) {
        Ok(()) => Some(name),
        Err(e) => {
            c.error(Some(span), &keys.interface, e);
            None
        }
    });

    t.finish(c, &keys::names(Table::Ready));

    if c.diagnostics[before..]
        .iter()
        .any(|d| d.severity == Severity::Error)
    {
        return None;
    }
    let mut spec = ReadySpec::with_probe(probe?);
    if let Some(d) = period {
        spec.period = d;
    }
    if let Some(d) = timeout {
        spec.timeout = d;
    }
    if let Some(n) = failures {
        spec.failures = n;
    }
    if let Some(d) = start_timeout {
        spec.start_timeout = d;
    }
    if let Some(name) = interface {
        spec.interface = name;
    }
    Some(spec)
}

/// The dotted paths of the table's keys, for messages.
struct Keys {
    port: String,
    path: String,
    command: String,
    period: String,
    timeout: String,
    failures: String,
    start_timeout: String,
    interface: String,
}

/// Reports a duration out of `min..=max` at its place (with what the lower bound is, when it
/// is another key's value); says whether it is within.
fn within(
    c: &mut Collector,
    key: &str,
    (d, span): At<Duration>,
    (min, min_is): (Duration, Option<&str>),
    max: Duration,
) -> bool {
    let ok = d >= min && d <= max;
    if !ok {
        let min_is = min_is.map_or_else(String::new, |m| format!(" ({m})"));
        c.error(
            Some(span),
            key,
            format!(
                "{} is out of range: must be from {}{min_is} to {}",
                human(d),
                human(min),
                human(max)
            ),
        );
    }
    ok
}

/// The check: exactly one of `port` (with `path`, HTTP; without, TCP) and `command`.
fn probe(
    c: &mut Collector,
    keys: &Keys,
    table: Range<usize>,
    (port, has_port): (Option<At<u32>>, bool),
    path: Option<At<String>>,
    (command, has_command): (Option<At<Vec<String>>>, bool),
) -> Option<Probe> {
    let port = port.and_then(|(n, span)| match u16::try_from(n) {
        Ok(p) if p > 0 => Some(p),
        _ => {
            c.error(
                Some(span),
                &keys.port,
                format!("{n} is out of range: must be from 1 to 65535"),
            );
            None
        }
    });
    let path = path.and_then(|(p, span)| match check_path(&p) {
        Ok(()) => Some((p, span)),
        Err(e) => {
            c.error(Some(span), &keys.path, e);
            None
        }
    });
    let command_at = command
        .as_ref()
        .map_or(table.clone(), |(_, span)| span.clone());
    let command = command.and_then(|(argv, span)| match check_command(&argv) {
        Ok(()) => Some((argv, span)),
        Err(e) => {
            c.error(Some(span), &keys.command, e);
            None
        }
    });
    if has_port && has_command {
        c.error(
            Some(command_at),
            &keys.command,
            "port and command are two kinds of check: set one (port, with path for HTTP, \
             checks from this host; command runs inside the instance)",
        );
        return None;
    }
    if !has_port && !has_command {
        c.error(
            Some(table),
            &keys.port,
            "missing: a ready table sets port (a TCP or, with path, HTTP check from this host) \
             or command (a program run inside the instance)",
        );
        return None;
    }
    if let (Some((_, span)), false) = (&path, has_port) {
        c.error(
            Some(span.clone()),
            &keys.path,
            "path only goes with port: it makes the check HTTP GET http://ADDRESS:PORT/PATH",
        );
        return None;
    }
    if has_command {
        return command.map(|(argv, _)| Probe::Command(argv));
    }
    let port = port?;
    Some(match path {
        Some((path, _)) => Probe::Http { port, path },
        None => Probe::Tcp { port },
    })
}

/// An HTTP path: from '/', and nothing that would break the request line.
fn check_path(p: &str) -> Result<(), String> {
    let shown = crate::text::printable(p);
    if !p.starts_with('/') {
        return Err(format!(
            "{shown:?} does not start with '/': write it as in \"/healthz\""
        ));
    }
    if p.chars().any(|ch| ch.is_whitespace() || ch.is_control()) {
        return Err(format!(
            "{shown:?} has a space or a control character: encode it (%20)"
        ));
    }
    Ok(())
}

/// A command run inside the instance: a program named by its absolute path. It is not looked
/// at on this host (it runs in the instance's file system).
fn check_command(argv: &[String]) -> Result<(), String> {
    match argv.first() {
        None => Err("must name a program, e.g. [\"/usr/bin/curl\", \"-fs\", \
                     \"http://127.0.0.1/healthz\"]"
            .to_owned()),
        Some(program) if !program.starts_with('/') => Err(format!(
            "the program {:?} is not an absolute path: name it from / as the instance sees it \
             (such as /usr/bin/pg_isready); it is not looked up in PATH",
            crate::text::printable(program)
        )),
        Some(_) => Ok(()),
    }
}

/// A Linux network interface name, as the kernel accepts it (`dev_valid_name`), in ASCII: 1
/// to 15 characters, not "." or "..", and no '/', ':' or whitespace.
fn check_interface(name: &str) -> Result<(), String> {
    let ok = (1..=INTERFACE_MAX_LEN).contains(&name.len())
        && name != "."
        && name != ".."
        && name
            .chars()
            .all(|ch| ch.is_ascii_graphic() && ch != '/' && ch != ':');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{:?} is not an interface name: 1 to {INTERFACE_MAX_LEN} ASCII characters, no \
             '/', ':' or spaces, not \".\" or \"..\"; such as \"eth0\"",
            crate::text::printable(name)
        ))
    }
}

#[cfg(test)]
#[path = "ready_tests.rs"]
pub(super) mod tests;
