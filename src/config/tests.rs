//! Desired-state parsing: the documented contract, and located errors for every bad input.

use std::path::Path;

use super::*;

fn ok(text: &str) -> Loaded {
    parse(Path::new("t.toml"), text).unwrap_or_else(|e| panic!("{:#?}", e.diagnostics))
}

/// Every error as "LINE:COL key: message".
fn errors(text: &str) -> Vec<String> {
    let e = parse(Path::new("t.toml"), text).expect_err("should be rejected");
    e.diagnostics
        .iter()
        .filter(|d| d.severity == Severity::Error)
        .map(|d| format!("{}:{} {}: {}", d.line, d.column, d.key, d.message))
        .collect()
}

const CONTRACT: &str = r#"
[daemon]
interval = "5s"

[groups.web]
min = 1
max = 5
memory_threshold = 70
image = "busybox"
instance_prefix = "web-"
profiles = ["default"]
scale_down_stabilization = "5m"
project = "default"

[groups.web.config]
"limits.memory" = "256MiB"
"#;

#[test]
fn the_documented_example_parses() {
    let l = ok(CONTRACT);
    assert!(l.warnings.is_empty(), "{:?}", l.warnings);
    assert_eq!(l.state.daemon.interval, Duration::from_secs(5));
    let g = &l.state.groups[&GroupName::parse("web").unwrap()];
    assert_eq!((g.min, g.max, g.memory_threshold), (1, 5, Some(70.0)));
    assert_eq!(g.image, "busybox");
    assert_eq!(g.instance_prefix, "web-");
    assert_eq!(g.scale_down_stabilization, Duration::from_secs(300));
    assert_eq!(g.scale_up_stabilization, Duration::ZERO);
    assert_eq!(g.config["limits.memory"], "256MiB");
}

#[test]
fn defaults_apply() {
    let l = ok("[groups.db]\nmax = 3\nmemory_threshold = 50.5\nimage = \"x\"\n");
    let g = &l.state.groups[&GroupName::parse("db").unwrap()];
    assert_eq!(g.min, 1);
    assert_eq!(g.instance_prefix, "db-");
    assert_eq!(g.profiles, vec!["default"]);
    assert_eq!(g.project, "default");
    assert_eq!((g.tolerance_up, g.tolerance_down), (0.1, 0.1));
    assert_eq!((g.max_scale_up_step, g.max_scale_down_step), (None, None));
    assert_eq!(l.state.daemon.interval, Duration::from_secs(15));
    // No memory limit: a warning, not an error.
    assert_eq!(l.warnings.len(), 1);
    assert!(l.warnings[0].message.contains("host's total memory"));
    assert_eq!(l.warnings[0].key, "groups.db.config");
}

#[test]
fn every_problem_is_reported_at_once_with_its_place() {
    let text = r#"[daemon]
interval = "often"
colour = 1

[groups.web]
min = 6
max = 5
memory_threshold = 170
image = "busybox"
typo = true

[groups.Bad_Name]
max = 0

[groups.zero]
max = 0
memory_threshold = 50
image = "busybox"
"#;
    let errs = errors(text);
    let expect = [
        "2:12 daemon.interval: \"often\" is not a duration",
        "3:1 daemon.colour: unknown key",
        "6:7 groups.web.min: min (6) is greater than max (5)",
        "8:20 groups.web.memory_threshold: 170 is outside 1–100",
        "10:1 groups.web.typo: unknown key",
        "12:9 groups.Bad_Name: a group name",
        "16:7 groups.zero.max: must be at least 1",
    ];
    for e in expect {
        assert!(
            errs.iter().any(|x| x.starts_with(e)),
            "missing {e:?} in {errs:#?}"
        );
    }
    assert_eq!(errs.len(), expect.len(), "{errs:#?}");
}

#[test]
fn missing_required_keys_and_wrong_types() {
    let errs = errors("[groups.web]\nmin = \"one\"\nprofiles = [\"a\", 2]\n");
    let has = |s: &str| errs.iter().any(|e| e.contains(s));
    assert!(
        has("groups.web.min: expected a whole number, found a string"),
        "{errs:#?}"
    );
    assert!(has(
        "groups.web.profiles[1]: expected a string, found an integer"
    ));
    assert!(has("groups.web.max: missing"));
    assert!(has("groups.web.memory_threshold: missing"));
    assert!(has("groups.web.image: missing"));
}

#[test]
fn invalid_toml_is_located() {
    let errs = errors("[groups.web]\nmax = = 3\n");
    assert!(errs[0].starts_with("2:"), "{errs:#?}");
    assert!(errs[0].contains("invalid TOML"));
}

#[test]
fn bad_prefixes_and_reserved_keys() {
    let base = "[groups.web]\nmax = 3\nmemory_threshold = 50\nimage = \"busybox\"\n";
    for (extra, msg) in [
        ("instance_prefix = \"9web\"\n", "must start with a letter"),
        ("instance_prefix = \"web_\"\n", "only letters, digits"),
        (
            "[groups.web.config]\n\"user.incus-hpa.group\" = \"x\"\n",
            "daemon's own",
        ),
        (
            "[groups.web.config]\n\"volatile.idmap\" = \"x\"\n",
            "Incus manages",
        ),
        (
            "[groups.web.config]\n\"security.privileged\" = \"true\"\n",
            "allow_privileged",
        ),
        (
            "[groups.web.config]\n\"raw.lxc\" = \"x\"\n",
            "allow_privileged",
        ),
        ("tolerance = 1.5\n", "tolerance"),
        ("max_scale_down_step = 0\n", "leave it out for no limit"),
        ("[daemon]\nmemory_source = \"magic\"\n", "not one of"),
        (
            "scale_down_order = \"random\"\n",
            "groups.web.scale_down_order",
        ),
        ("paused = \"yes\"\n", "groups.web.paused"),
    ] {
        let errs = errors(&format!("{base}{extra}"));
        assert!(errs.iter().any(|e| e.contains(msg)), "{extra}: {errs:#?}");
    }
}

#[test]
fn allow_privileged_accepts_root_granting_keys() {
    let l = ok("[groups.web]\nmax = 3\nmemory_threshold = 50\nimage = \"b\"\nallow_privileged = true\n\
                [groups.web.config]\n\"security.privileged\" = true\n\"limits.memory\" = \"64MiB\"\n");
    let g = l.state.groups.values().next().unwrap();
    assert_eq!(g.config["security.privileged"], "true");
}

#[test]
fn paused_and_scale_down_order_are_read() {
    let l = ok("[groups.web]\nmax = 3\nmemory_threshold = 50\nimage = \"b\"\npaused = true\n\
                scale_down_order = \"least-memory\"\n[groups.web.config]\n\"limits.memory\" = \"64MiB\"\n");
    let g = l.state.groups.values().next().unwrap();
    assert!(g.paused);
    assert_eq!(
        g.scale_down_order,
        crate::model::ScaleDownOrder::LeastMemory
    );
    let l = ok("[groups.web]\nmax = 3\nmemory_threshold = 50\nimage = \"b\"\n[groups.web.config]\n\"limits.memory\" = \"64MiB\"\n");
    let g = l.state.groups.values().next().unwrap();
    assert!(!g.paused);
    assert_eq!(g.scale_down_order, crate::model::ScaleDownOrder::Newest);
}

#[test]
fn an_empty_file_is_valid_and_says_nothing_is_managed() {
    let l = ok("");
    assert!(l.state.groups.is_empty());
    assert!(l.warnings[0].message.contains("nothing will be managed"));
}

#[test]
fn diagnostics_print_as_path_line_column_key() {
    let e = parse(
        Path::new("/etc/x.toml"),
        "[groups.web]\nmax = 0\nmemory_threshold = 5\nimage = \"b\"\n",
    )
    .unwrap_err();
    let first = e
        .diagnostics
        .iter()
        .find(|d| d.severity == Severity::Error)
        .unwrap();
    assert_eq!(
        first.to_string(),
        "/etc/x.toml:2:7: error: groups.web.max: must be at least 1"
    );
}

#[test]
fn health_keys_have_defaults_and_take_values() {
    let g = |text: &str| {
        ok(text)
            .state
            .groups
            .into_values()
            .next()
            .expect("one group")
    };
    let base = "[groups.web]\nmax = 3\nmemory_threshold = 50\nimage = \"b\"\n";
    let d = g(base);
    assert_eq!(d.unhealthy_grace, Duration::from_secs(300));
    assert_eq!(d.restart_backoff, Duration::from_secs(10));
    assert_eq!(d.interval, Duration::from_secs(15), "the daemon's interval");
    let s = g(&format!(
        "[daemon]\ninterval = \"2s\"\n{base}unhealthy_grace = \"1m\"\nrestart_backoff = \"1s\"\n"
    ));
    assert_eq!(s.unhealthy_grace, Duration::from_secs(60));
    assert_eq!(s.restart_backoff, Duration::from_secs(1));
    assert_eq!(s.interval, Duration::from_secs(2));
}

#[test]
fn absurd_durations_are_rejected_with_their_range() {
    let base = "[groups.web]\nmax = 3\nmemory_threshold = 50\nimage = \"b\"\n";
    for (extra, msg) in [
        (
            "[daemon]\ninterval = \"50ms\"\n",
            "daemon.interval: 50ms is out of range: must be from 100ms to 1day",
        ),
        (
            "[daemon]\ninterval = \"100000years\"\n",
            "daemon.interval: 100000years is out of range",
        ),
        (
            "[daemon]\ninterval = \"99999999999999999999s\"\n",
            "daemon.interval: \"99999999999999999999s\" is not a duration",
        ),
        (
            "scale_down_stabilization = \"2days\"\n",
            "groups.web.scale_down_stabilization: 2days is out of range: must be at most 1day",
        ),
        (
            "scale_up_stabilization = \"25h\"\n",
            "groups.web.scale_up_stabilization: 1day 1h is out of range",
        ),
        (
            "stop_timeout = \"10m\"\n",
            "groups.web.stop_timeout: 10m is out of range: must be at most 2m",
        ),
        (
            "unhealthy_grace = \"3days\"\n",
            "groups.web.unhealthy_grace: 3days",
        ),
        (
            "restart_backoff = \"1h\"\n",
            "groups.web.restart_backoff: 1h is out of range: must be from 100ms to 5m",
        ),
    ] {
        let text = if extra.starts_with("[daemon]") {
            format!("{extra}{base}")
        } else {
            format!("{base}{extra}")
        };
        let errs = errors(&text);
        assert!(errs.iter().any(|e| e.contains(msg)), "{extra}: {errs:#?}");
    }
}

#[test]
fn metrics_address_is_an_ip_and_port_and_off_unless_set() {
    let base = "[groups.web]\nmax = 3\nmemory_threshold = 50\nimage = \"b\"\n";
    assert_eq!(ok(base).state.daemon.metrics_address, None);
    for addr in ["127.0.0.1:9750", "[::1]:9750"] {
        let d = ok(&format!("[daemon]\nmetrics_address = \"{addr}\"\n{base}"))
            .state
            .daemon;
        assert_eq!(d.metrics_address, Some(addr.parse().unwrap()));
    }
    for bad in ["localhost:9750", "127.0.0.1", "9750"] {
        assert_eq!(
            errors(&format!("[daemon]\nmetrics_address = \"{bad}\"\n{base}")),
            [format!(
                "2:19 daemon.metrics_address: \"{bad}\" is not an IP address and port: \
                 write it like \"127.0.0.1:9750\" or \"[::1]:9750\""
            )]
        );
    }
}

#[test]
fn lease_is_a_duration_within_its_bounds() {
    let base = "[groups.web]\nmax = 3\nmemory_threshold = 50\nimage = \"b\"\n";
    assert_eq!(ok(base).state.daemon.lease, Duration::from_secs(15));
    let d = ok(&format!("[daemon]\nlease = \"1m\"\n{base}"))
        .state
        .daemon;
    assert_eq!(d.lease, Duration::from_secs(60));
    for bad in ["\"1s\"", "\"11m\""] {
        let e = errors(&format!("[daemon]\nlease = {bad}\n{base}"));
        assert!(e[0].starts_with("2:9 daemon.lease:"), "{e:?}");
        assert!(
            e[0].contains("out of range: must be from 3s to 10m"),
            "{e:?}"
        );
    }
}

#[test]
fn a_choice_outside_its_names_lists_them() {
    let base = "[groups.web]\nmax = 3\nmemory_threshold = 50\nimage = \"b\"\n";
    assert_eq!(
        errors(&format!("[daemon]\nmemory_source = \"x\"\n{base}")),
        ["2:17 daemon.memory_source: \"x\" is not one of \"auto\", \"cgroup\", \"api\""]
    );
    assert_eq!(
        errors(&format!(
            "{base}scale_down_order = \"x\"\npolicy = \"hpa\"\n"
        )),
        [
            "5:20 groups.web.scale_down_order: \"x\" is not one of \"newest\", \"oldest\", \
             \"least-memory\"",
            "6:10 groups.web.policy: \"hpa\" is not one of \"adaptive\", \"kubernetes\"",
        ]
    );
}

#[test]
fn incus_is_a_socket_or_https_with_a_client_certificate() {
    let base = "[groups.web]\nmax = 3\nmemory_threshold = 50\nimage = \"b\"\n";
    assert_eq!(ok(base).state.daemon.incus, None);
    let d = ok(&format!(
        "[daemon]\nincus = \"https://10.0.0.1\"\ntls_client_cert = \"/c.crt\"\n\
         tls_client_key = \"/c.key\"\n{base}"
    ))
    .state
    .daemon;
    assert_eq!(d.incus.unwrap().to_string(), "https://10.0.0.1:8443");
    let tls = d.tls.unwrap();
    assert_eq!(
        (tls.client_cert.to_str(), tls.server_cert),
        (Some("/c.crt"), None)
    );
    // HTTPS without a certificate, a relative path, plain HTTP.
    let e = errors(&format!("[daemon]\nincus = \"https://h\"\n{base}"));
    assert_eq!(e.len(), 1);
    assert!(
        e[0].starts_with("2:9 daemon.incus: HTTPS needs a client certificate"),
        "{e:?}"
    );
    let e = errors(&format!(
        "[daemon]\nincus = \"https://h\"\ntls_client_cert = \"c.crt\"\ntls_client_key = \"/k\"\n{base}"
    ));
    assert!(
        e.contains(&"3:19 daemon.tls_client_cert: \"c.crt\" is not an absolute path".to_owned()),
        "{e:?}"
    );
    let e = errors(&format!("[daemon]\nincus = \"http://h:8443\"\n{base}"));
    assert!(e[0].contains("HTTPS only"), "{e:?}");
    // TLS files with the socket: ignored, with a warning at the key.
    let l = ok(&format!(
        "[daemon]\nincus = \"unix:///s\"\ntls_client_key = \"/k\"\n{base}"
    ));
    assert!(
        l.warnings
            .iter()
            .any(|w| w.key == "daemon.tls_client_key" && w.line == 3),
        "{:?}",
        l.warnings
    );
}

#[test]
fn a_loaded_file_refuses_a_private_key_others_can_read() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = (dir.path().join("c.crt"), dir.path().join("c.key"));
    std::fs::write(&cert, "x").unwrap();
    std::fs::write(&key, "x").unwrap();
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    let file = dir.path().join("d.toml");
    std::fs::write(
        &file,
        format!(
            "[daemon]\nincus = \"https://h\"\ntls_client_cert = \"{}\"\ntls_client_key = \"{}\"\n\
             [groups.web]\nmax = 3\nmemory_threshold = 50\nimage = \"b\"\n",
            cert.display(),
            key.display()
        ),
    )
    .unwrap();
    let e = load(&file).expect_err("a 0644 key");
    let d = &e.diagnostics[0];
    assert_eq!((d.line, d.key.as_str()), (4, "daemon.tls_client_key"));
    assert!(d.message.contains("mode 0644"), "{}", d.message);
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    load(&file).unwrap();
}

#[test]
fn host_reserve_is_a_size_or_a_percentage_of_the_host() {
    use crate::model::HostReserve;
    let reserve = |v: &str| {
        ok(&format!("[daemon]\nhost_reserve = {v}\n"))
            .state
            .daemon
            .host_reserve
    };
    assert_eq!(ok("").state.daemon.host_reserve, HostReserve::Percent(5.0));
    assert_eq!(reserve("\"2GiB\""), HostReserve::Bytes(2 << 30));
    assert_eq!(reserve("\"512MiB\""), HostReserve::Bytes(512 << 20));
    assert_eq!(reserve("\"0\""), HostReserve::Bytes(0));
    assert_eq!(reserve("1073741824"), HostReserve::Bytes(1 << 30));
    assert_eq!(reserve("\"10%\""), HostReserve::Percent(10.0));
    assert_eq!(reserve("\"90%\""), HostReserve::Percent(90.0));
    for (v, message) in [
        (
            "\"91%\"",
            "91% is out of range: a percentage must be from 0 to 90",
        ),
        ("\"2 gigs\"", "\"2 gigs\" is not a size or a percentage"),
        ("-5", "\"-5\" is not a size or a percentage"),
        (
            "true",
            "expected a string or a whole number, found a boolean",
        ),
    ] {
        let e = errors(&format!(
            "[daemon]\ninterval = \"5s\"\nhost_reserve = {v}\n"
        ));
        assert_eq!(e.len(), 1, "{v}: {e:?}");
        assert!(
            e[0].starts_with("3:16 daemon.host_reserve: ") && e[0].contains(message),
            "{v}: {e:?}"
        );
    }
}

/// A group on CPU whose `limits.cpu` is `cpu`.
fn cpu_group(cpu: &str) -> String {
    format!(
        "[groups.web]\nmax = 3\ncpu_threshold = 50\nimage = \"busybox\"\n\n\
         [groups.web.config]\n\"limits.memory\" = \"256MiB\"\n\"limits.cpu\" = \"{cpu}\"\n"
    )
}

#[test]
fn an_absurd_cpu_set_is_a_located_error_not_an_overflow() {
    // More CPUs than a count holds: an error at the value, not a panic or a wrapped count.
    for (v, message) in [
        ("0-4294967295", "more than 4294967295 CPUs"),
        ("0-4294967294,4294967295", "more than 4294967295 CPUs"),
        ("3-1", "is not a number of CPUs or a set of them"),
        ("0-", "is not a number of CPUs or a set of them"),
    ] {
        let e = errors(&cpu_group(v));
        assert_eq!(e.len(), 1, "{v}: {e:?}");
        assert!(
            e[0].starts_with("8:16 groups.web.config.\"limits.cpu\": ") && e[0].contains(message),
            "{v}: {e:?}"
        );
    }
    // An allowance is located at its own key.
    let e = errors(&cpu_group("1").replace(
        "\"limits.cpu\" = \"1\"",
        "\"limits.cpu.allowance\" = \"50%\"",
    ));
    assert_eq!(e.len(), 1, "{e:?}");
    assert!(
        e[0].starts_with("8:26 groups.web.config.\"limits.cpu.allowance\": "),
        "{e:?}"
    );
}

#[test]
fn a_cpu_set_counts_each_cpu_once() {
    let cpus = |v: &str| {
        ok(&cpu_group(v)).state.groups[&GroupName::parse("web").unwrap()]
            .cpu_limit
            .unwrap()
    };
    assert_eq!(cpus("2"), 2.0);
    assert_eq!(cpus("0-1,4"), 3.0);
    assert_eq!(cpus("0-4294967294"), 4294967295.0);
    // A set: a CPU named twice is one CPU.
    assert_eq!(cpus("0-3,2"), 4.0);
    assert_eq!(cpus("1,1"), 1.0);
    assert_eq!(cpus("4-7,0-5"), 8.0);
}
