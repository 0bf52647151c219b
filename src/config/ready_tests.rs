//! `[groups.NAME.ready]` through the whole parser: a table read with its defaults, and every
//! bad value reported at its line under its key.

use std::path::Path;
use std::time::Duration;

use crate::config::{parse, Severity};
use crate::model::{GroupName, Probe, ReadySpec};

/// A valid group, its ready table's lines after it (the table starts on line 8).
fn group(ready: &str) -> String {
    format!(
        "[groups.web]\nmax = 3\nmemory_threshold = 70\nimage = \"busybox\"\n\
         config = {{ \"limits.memory\" = \"64MiB\" }}\n\n[groups.web.ready]\n{ready}"
    )
}

/// The group's ready spec, the file being valid and without warnings.
fn ready(text: &str) -> Option<ReadySpec> {
    let loaded =
        parse(Path::new("t.toml"), text).unwrap_or_else(|e| panic!("{:#?}", e.diagnostics));
    assert!(loaded.warnings.is_empty(), "{:#?}", loaded.warnings);
    loaded.state.groups[&GroupName::parse("web").unwrap()]
        .ready
        .clone()
}

/// Every error as "LINE key: message" (the endpoints tests use it too).
pub(in crate::config) fn errors(text: &str) -> Vec<String> {
    let e = parse(Path::new("t.toml"), text).expect_err("should be rejected");
    e.diagnostics
        .iter()
        .filter(|d| d.severity == Severity::Error)
        .map(|d| format!("{} {}: {}", d.line, d.key, d.message))
        .collect()
}

/// Asserts that `text` has one error, at `line`, under `groups.web.TABLE.KEY`, whose message
/// contains `says` (the endpoints tests use it too).
pub(in crate::config) fn one_error_in(table: &str, text: &str, line: usize, key: &str, says: &str) {
    let found = errors(text);
    assert_eq!(found.len(), 1, "{text}\n{found:#?}");
    let prefix = format!("{line} groups.web.{table}.{key}: ");
    assert!(
        found[0].starts_with(&prefix) && found[0].contains(says),
        "expected {prefix}…{says}…, found {:?}",
        found[0]
    );
}

/// Asserts one error of the ready table `ready`, at `line`, under `key`.
fn one_error(ready: &str, line: usize, key: &str, says: &str) {
    one_error_in("ready", &group(ready), line, key, says);
}

#[test]
fn a_full_table_is_read() {
    let spec = ready(&group(
        "port = 8080\npath = \"/healthz\"\nperiod = \"5s\"\ntimeout = \"500ms\"\n\
         failures = 5\nstart_timeout = \"10m\"\ninterface = \"enp5s0\"\n",
    ))
    .unwrap();
    assert_eq!(
        spec,
        ReadySpec {
            probe: Probe::Http {
                port: 8080,
                path: "/healthz".into(),
            },
            period: Duration::from_secs(5),
            timeout: Duration::from_millis(500),
            failures: 5,
            start_timeout: Duration::from_secs(600),
            interface: "enp5s0".into(),
        }
    );
}

#[test]
fn defaults_fill_in_what_the_table_leaves_out() {
    let tcp = ready(&group("port = 5432\n")).unwrap();
    assert_eq!(tcp, ReadySpec::with_probe(Probe::Tcp { port: 5432 }));
    assert_eq!(
        (tcp.period, tcp.timeout, tcp.failures, tcp.start_timeout),
        (
            Duration::from_secs(2),
            Duration::from_secs(1),
            3,
            Duration::from_secs(120)
        )
    );
    assert_eq!(tcp.interface, "eth0");
    let command = ready(&group("command = [\"/usr/bin/pg_isready\", \"-q\"]\n")).unwrap();
    assert_eq!(
        command.probe,
        Probe::Command(vec!["/usr/bin/pg_isready".into(), "-q".into()])
    );
    // Inline, as the key table's example writes it.
    let inline = "[groups.web]\nmax = 3\nmemory_threshold = 70\nimage = \"busybox\"\n\
                  config = { \"limits.memory\" = \"64MiB\" }\n\
                  ready = { port = 80, path = \"/\" }\n";
    assert_eq!(
        ready(inline).unwrap().probe,
        Probe::Http {
            port: 80,
            path: "/".into()
        }
    );
}

#[test]
fn a_group_without_the_table_is_unchecked() {
    let text = group("").replace("\n[groups.web.ready]\n", "");
    assert_eq!(ready(&text), None);
}

#[test]
fn a_command_runs_in_the_instance_and_is_not_looked_for_on_this_host() {
    let spec = ready(&group("command = [\"/no/such/program/here\"]\n")).unwrap();
    assert_eq!(
        spec.probe,
        Probe::Command(vec!["/no/such/program/here".into()])
    );
}

#[test]
fn the_check_is_port_or_command() {
    one_error("period = \"5s\"\n", 7, "port", "missing");
    one_error(
        "port = 80\ncommand = [\"/bin/true\"]\n",
        9,
        "command",
        "set one",
    );
    one_error(
        "command = [\"/bin/true\"]\npath = \"/healthz\"\n",
        9,
        "path",
        "only goes with port",
    );
}

#[test]
fn a_port_and_a_path_are_checked() {
    one_error("port = 0\n", 8, "port", "must be from 1 to 65535");
    one_error("port = 65536\n", 8, "port", "must be from 1 to 65535");
    one_error("port = \"80\"\n", 8, "port", "expected a whole number");
    one_error(
        "port = 80\npath = \"healthz\"\n",
        9,
        "path",
        "start with '/'",
    );
    one_error("port = 80\npath = \"/a b\"\n", 9, "path", "a space");
    assert_eq!(
        ready(&group("port = 65535\n")).unwrap().probe,
        Probe::Tcp { port: 65535 }
    );
}

#[test]
fn a_command_is_an_absolute_program() {
    one_error("command = []\n", 8, "command", "must name a program");
    one_error(
        "command = [\"pg_isready\"]\n",
        8,
        "command",
        "not an absolute path",
    );
    one_error(
        "command = \"/bin/true\"\n",
        8,
        "command",
        "an array of strings",
    );
}

#[test]
fn durations_and_counts_are_within_their_ranges() {
    one_error(
        "port = 80\nperiod = \"50ms\"\n",
        9,
        "period",
        "must be from 100ms to 1h",
    );
    one_error(
        "port = 80\nperiod = \"2h\"\n",
        9,
        "period",
        "must be from 100ms to 1h",
    );
    one_error("port = 80\ntimeout = \"0s\"\n", 9, "timeout", "above 0");
    // Below the period the file gives, or the default one.
    one_error(
        "port = 80\nperiod = \"1s\"\ntimeout = \"1s\"\n",
        10,
        "timeout",
        "below 1s (the period",
    );
    one_error(
        "port = 80\ntimeout = \"3s\"\n",
        9,
        "timeout",
        "below 2s (the default period",
    );
    one_error("port = 80\nfailures = 0\n", 9, "failures", "from 1 to 100");
    one_error(
        "port = 80\nfailures = 101\n",
        9,
        "failures",
        "from 1 to 100",
    );
    one_error(
        "port = 80\nperiod = \"30s\"\nstart_timeout = \"10s\"\n",
        10,
        "start_timeout",
        "must be from 30s (the period) to 1h",
    );
    one_error(
        "port = 80\nstart_timeout = \"2h\"\n",
        9,
        "start_timeout",
        "to 1h",
    );
    // The edges are accepted.
    let edges = ready(&group(
        "port = 80\nperiod = \"100ms\"\ntimeout = \"99ms\"\nfailures = 100\n\
         start_timeout = \"100ms\"\n",
    ))
    .unwrap();
    assert_eq!(edges.start_timeout, Duration::from_millis(100));
    let edges = ready(&group(
        "port = 80\nperiod = \"1h\"\nfailures = 1\nstart_timeout = \"1h\"\n",
    ))
    .unwrap();
    assert_eq!(
        (edges.period, edges.failures),
        (Duration::from_secs(3600), 1)
    );
}

#[test]
fn a_wrong_period_is_reported_once_and_not_held_against_the_others() {
    let found = errors(&group(
        "port = 80\nperiod = \"often\"\ntimeout = \"5s\"\nstart_timeout = \"3s\"\n",
    ));
    assert_eq!(found.len(), 1, "{found:#?}");
    assert!(
        found[0].starts_with("9 groups.web.ready.period: "),
        "{found:?}"
    );
}

#[test]
fn the_interface_is_a_linux_interface_name() {
    for bad in [
        "",
        "a-name-too-long-",
        "eth/0",
        "eth 0",
        "eth0:1",
        ".",
        "..",
    ] {
        one_error(
            &format!("port = 80\ninterface = {bad:?}\n"),
            9,
            "interface",
            "not an interface name",
        );
    }
    let longest = "a".repeat(15);
    let spec = ready(&group(&format!("port = 80\ninterface = \"{longest}\"\n"))).unwrap();
    assert_eq!(spec.interface, longest);
}

#[test]
fn an_unknown_key_is_reported_with_the_known_ones() {
    one_error(
        "port = 80\nhost = \"10.0.0.1\"\n",
        9,
        "host",
        "unknown key (known here: port, path, command, period, timeout, failures, \
         start_timeout, interface)",
    );
}

#[test]
fn ready_must_be_a_table() {
    let text = "[groups.web]\nmax = 3\nmemory_threshold = 70\nimage = \"busybox\"\n\
                config = { \"limits.memory\" = \"64MiB\" }\nready = 3\n";
    let found = errors(text);
    assert_eq!(
        found,
        vec!["6 groups.web.ready: expected a table, found an integer".to_owned()]
    );
}

#[test]
fn every_problem_of_the_table_is_reported_at_once() {
    let found = errors(&group(
        "port = 0\npath = \"x\"\nfailures = 0\ninterface = \"\"\nspeed = 1\n",
    ));
    let keys: Vec<&str> = found.iter().map(|e| e.split(':').next().unwrap()).collect();
    for key in ["port", "path", "failures", "interface", "speed"] {
        assert!(
            keys.iter()
                .any(|k| k.ends_with(&format!("groups.web.ready.{key}"))),
            "{key}: {found:#?}"
        );
    }
}
