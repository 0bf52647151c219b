//! `[groups.NAME.endpoints]` through the whole parser: a table read with its defaults, the
//! port taken from the ready table, and every bad value reported at its line under its key.

use std::path::Path;
use std::time::Duration;

use crate::config::parse;
use crate::config::ready::tests::{errors, one_error_in};
use crate::model::{EndpointsSpec, GroupName};

/// A valid group with `more` after its lines (a table starts on line 7).
fn group(more: &str) -> String {
    format!(
        "[groups.web]\nmax = 3\nmemory_threshold = 70\nimage = \"busybox\"\n\
         config = {{ \"limits.memory\" = \"64MiB\" }}\n\n{more}"
    )
}

/// The group's endpoints spec, the file being valid and without warnings.
fn endpoints(text: &str) -> Option<EndpointsSpec> {
    let loaded =
        parse(Path::new("t.toml"), text).unwrap_or_else(|e| panic!("{:#?}", e.diagnostics));
    assert!(loaded.warnings.is_empty(), "{:#?}", loaded.warnings);
    loaded.state.groups[&GroupName::parse("web").unwrap()]
        .endpoints
        .clone()
}

/// Asserts one error of the group with `more`, at `line`, under `endpoints.KEY`.
fn one_error(more: &str, line: usize, key: &str, says: &str) {
    one_error_in("endpoints", &group(more), line, key, says);
}

#[test]
fn a_full_table_is_read() {
    let spec = endpoints(&group(
        "[groups.web.endpoints]\nport = 8080\ncommand = [\"/usr/bin/hook\", \"-b\", \"web\"]\n\
         timeout = \"3s\"\nderegistration_delay = \"0s\"\n",
    ));
    assert_eq!(
        spec,
        Some(EndpointsSpec {
            port: 8080,
            command: vec!["/usr/bin/hook".into(), "-b".into(), "web".into()],
            timeout: Duration::from_secs(3),
            deregistration_delay: Duration::ZERO,
        })
    );
}

#[test]
fn the_port_defaults_to_the_ready_table_s() {
    let spec = endpoints(&group(
        "[groups.web.ready]\nport = 80\npath = \"/healthz\"\n\n\
         [groups.web.endpoints]\ncommand = [\"/usr/bin/hook\"]\n",
    ))
    .unwrap();
    assert_eq!(spec.port, 80);
    assert_eq!(spec.timeout, Duration::from_secs(10));
    assert_eq!(spec.deregistration_delay, Duration::from_secs(10));
    assert_eq!(endpoints(&group("")), None);
}

#[test]
fn a_port_is_needed_without_a_ready_port() {
    one_error(
        "[groups.web.endpoints]\ncommand = [\"/usr/bin/hook\"]\n",
        7,
        "port",
        "missing",
    );
    let with_command_check = group(
        "[groups.web.ready]\ncommand = [\"/bin/true\"]\n\n\
         [groups.web.endpoints]\ncommand = [\"/usr/bin/hook\"]\n",
    );
    let found = errors(&with_command_check);
    assert_eq!(found.len(), 1, "{found:#?}");
    assert!(
        found[0].contains("groups.web.endpoints.port: missing"),
        "{found:?}"
    );
}

#[test]
fn bad_values_are_reported_at_their_key() {
    let t = "[groups.web.endpoints]\nport = 80\n";
    one_error(t, 7, "command", "missing");
    one_error(
        "[groups.web.endpoints]\nport = 80\ncommand = [\"hook\"]\n",
        9,
        "command",
        "not an absolute path",
    );
    one_error(
        "[groups.web.endpoints]\nport = 80\ncommand = []\n",
        9,
        "command",
        "must name a program",
    );
    one_error(
        "[groups.web.endpoints]\nport = 0\ncommand = [\"/usr/bin/hook\"]\n",
        8,
        "port",
        "out of range",
    );
    one_error(
        "[groups.web.endpoints]\nport = 80\ncommand = [\"/usr/bin/hook\"]\ntimeout = \"10m\"\n",
        10,
        "timeout",
        "5m",
    );
    one_error(
        "[groups.web.endpoints]\nport = 80\ncommand = [\"/usr/bin/hook\"]\n\
         deregistration_delay = \"2h\"\n",
        10,
        "deregistration_delay",
        "1h",
    );
    one_error(
        "[groups.web.endpoints]\nport = 80\ncommand = [\"/usr/bin/hook\"]\nnope = 1\n",
        10,
        "nope",
        "",
    );
}
