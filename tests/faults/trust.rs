//! Fault scenarios for what the newest machinery must never do (leases, removals, listeners),
//! one per finding, against the real incusd: a person's profiles named like the lease store,
//! two daemons with one host name in two PID namespaces, a pause while `min` drops, a creation
//! whose wait outlasts the client, a start that always fails, 2,000 idle connections to
//! `/metrics`, and the lease holder stopped (SIGSTOP) in the middle of a removal. Each ends
//! with the checks and the report row every scenario has (see `world`).

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::lab::*;
use crate::proxy::{Fault, Rule, Times};
use crate::world::{desired, hold, status, World};

pub(crate) const MINUTE: Duration = Duration::from_secs(60);

/// `toml` with `lines` added to its `[daemon]` table.
pub(crate) fn daemon(toml: &str, lines: &str) -> String {
    toml.replace("[daemon]", &format!("[daemon]\n{lines}"))
}

/// A control socket of `lab`'s own, as a `[daemon]` line, and its path.
pub(crate) fn control(lab: &Lab) -> (String, std::path::PathBuf) {
    let path = lab.dir.path().join("control.sock");
    (format!("control_socket = \"{}\"", path.display()), path)
}

/// Whether the daemon answering on `socket` acts on `group` (its `status --json` has no
/// `standby`), or stands by; `None` while it does not answer or has not decided yet.
pub(crate) fn acting(socket: &Path, group: &str) -> Option<bool> {
    let out = Command::new(env!("CARGO_BIN_EXE_incus-hpa"))
        .args(["status", "--json", "--control-socket"])
        .arg(socket)
        .output()
        .unwrap();
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    let g = doc["groups"]
        .as_array()?
        .iter()
        .find(|g| g["name"] == group)?;
    (g["reason"] != "pending").then(|| g["standby"].is_null())
}

fn signal(pid: u32, sig: &str) {
    assert!(Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .unwrap()
        .success());
}

/// A profile as `incus profile show` prints it (description, config, devices, used_by).
fn profile(name: &str) -> String {
    incus_ok(&["profile", "show", name])
}

#[test]
#[ignore = "needs a real Incus (scripts/test.sh runs the fault suite)"]
fn a_persons_profiles_named_like_the_lease_store() {
    let mut w = World::new(
        "a person's profiles named like the lease store",
        "fprof",
        false,
    );
    let g = w.lab.group.clone();
    // The name incus-hpa 0.2 used for its store, now a person's profile with a device that
    // an instance of theirs uses; and a person's profile with the store's name now.
    let data = w.lab.dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    let _ = incus(&["profile", "delete", "incus-hpa"]);
    incus_ok(&["profile", "create", "incus-hpa"]);
    incus_ok(&[
        "profile",
        "device",
        "add",
        "incus-hpa",
        "data",
        "disk",
        &format!("source={}", data.display()),
        "path=/mnt/data",
    ]);
    let theirs = format!("{g}-person-1");
    incus_ok(&[
        "launch",
        "busybox",
        &theirs,
        "-p",
        "default",
        "-p",
        "incus-hpa",
        "-c",
        "limits.memory=64MiB",
    ]);
    w.lab.extra.push(theirs.clone());
    let _ = incus(&["profile", "delete", "incus-hpa.leases"]);
    incus_ok(&["profile", "create", "incus-hpa.leases"]);
    incus_ok(&["profile", "set", "incus-hpa.leases", "user.owner-team=web"]);
    incus_ok(&[
        "profile",
        "device",
        "add",
        "incus-hpa.leases",
        "data",
        "disk",
        &format!("source={}", data.display()),
        "path=/mnt/data",
    ]);
    let (old, store) = (profile("incus-hpa"), profile("incus-hpa.leases"));
    w.start(&desired(&g, 2, 4, ""));
    // It says why it cannot use the store, writes nothing and acts on nothing.
    let refused = |w: &World| {
        w.lab
            .log_count(&["cannot take the leases", "not made by incus-hpa"])
    };
    eventually(&w.lab, "the refusal in the journal", MINUTE, || {
        refused(&w) > 0
    });
    hold(Duration::from_secs(3));
    assert_eq!(refused(&w), 1, "said once\n{}", w.lab.log());
    assert!(w.own().is_empty(), "acted without a lease: {:?}", w.own());
    assert_eq!(
        profile("incus-hpa.leases"),
        store,
        "the person's profile was written"
    );
    // Renamed out of the way: the daemon makes its own store and the group comes up.
    let t0 = Instant::now();
    incus_ok(&[
        "profile",
        "rename",
        "incus-hpa.leases",
        &format!("{g}-mine"),
    ]);
    w.converge(2, MINUTE);
    let t = t0.elapsed();
    w.add_sentinels();
    hold(Duration::from_secs(3));
    assert_eq!(
        profile("incus-hpa"),
        old,
        "incus-hpa 0.2's profile name, a person's now"
    );
    let store = profile("incus-hpa.leases");
    assert!(store.contains("user.incus-hpa.store: leases"), "{store}");
    assert!(profile(&format!("{g}-mine")).contains("source:"), "kept");
    assert_eq!(status(&theirs), "RUNNING");
    let downs = count_lines(&w.lab.log(), &["scaling down from"]);
    // (Finishing removes the person's instance with the test's others.)
    w.finish(t, downs);
    incus_ok(&["profile", "delete", "incus-hpa"]);
    incus_ok(&["profile", "delete", &format!("{g}-mine")]);
}

#[test]
#[ignore = "needs a real Incus (scripts/test.sh runs the fault suite)"]
fn two_daemons_with_one_host_name_in_two_pid_namespaces() {
    let mut w = World::new(
        "two daemons, one host name, two PID namespaces",
        "fpidns",
        false,
    );
    let g = w.lab.group.clone();
    let base = daemon(&desired(&g, 2, 3, ""), "lease = \"3s\"");
    // The first one in a PID namespace of its own (`unshare --pid`): its PIDs mean nothing
    // to the other, whose host name is the same.
    let mut inner = w.lab.beside();
    let (line, inner_socket) = control(&inner);
    let file = inner.config_path();
    std::fs::write(&file, daemon(&base, &line)).unwrap();
    let log = std::fs::File::create(inner.log_path()).unwrap();
    let child = Command::new("unshare")
        .args(["--pid", "--fork", "--kill-child", "--mount-proc"])
        .arg(env!("CARGO_BIN_EXE_incus-hpa"))
        .args(["run", "--config"])
        .arg(&file)
        .env("RUST_LOG", "incus_hpa=debug")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    inner.daemon = Some(child);
    eventually(&inner, "the namespaced daemon acts", MINUTE, || {
        acting(&inner_socket, &g) == Some(true)
    });
    w.converge(2, MINUTE);
    let (line, outer_socket) = control(&w.lab);
    w.start(&daemon(&base, &line));
    eventually(&w.lab, "the second daemon answers", MINUTE, || {
        acting(&outer_socket, &g).is_some()
    });
    w.add_sentinels();
    // Sampled every second through their `status --json`: never both acting.
    let mut both = 0;
    for _ in 0..20 {
        let (a, b) = (acting(&inner_socket, &g), acting(&outer_socket, &g));
        both += usize::from(a == Some(true) && b == Some(true));
        hold(Duration::from_secs(1));
    }
    assert_eq!(
        both,
        0,
        "both acted in {both} of 20 samples\n{}\n{}",
        inner.log(),
        w.lab.log()
    );
    // The namespaced one killed: the other cannot prove it dead, waits its lease out, and
    // takes over.
    let t0 = Instant::now();
    let mut child = inner.daemon.take().unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    let victim = w.own()[0].0.clone();
    incus_ok(&["delete", "--force", &victim]);
    w.converge(2, MINUTE);
    let t = t0.elapsed();
    assert_eq!(acting(&outer_socket, &g), Some(true), "{}", w.lab.log());
    w.finish(t, 0);
}

/// The times (seconds since the epoch) of the daemon's completed deletes, from its log.
pub(crate) fn delete_times(log: &str) -> Vec<f64> {
    log.lines()
        .filter(|l| l.contains("action=\"delete\"") && l.contains("outcome=\"ok\""))
        .filter_map(|l| {
            let stamp = l.split_whitespace().next()?;
            let t = humantime::parse_rfc3339_weak(stamp.trim_end_matches('Z')).ok()?;
            Some(t.duration_since(std::time::UNIX_EPOCH).ok()?.as_secs_f64())
        })
        .collect()
}

#[test]
#[ignore = "needs a real Incus (scripts/test.sh runs the fault suite)"]
fn paused_while_min_drops_then_resumed_with_a_step_limit() {
    let mut w = World::new(
        "paused while min drops, resumed (max_scale_down_step = 1)",
        "fpause",
        false,
    );
    let g = w.lab.group.clone();
    let toml = |min: u32, paused: bool| {
        desired(
            &g,
            min,
            4,
            &format!("max_scale_down_step = 1\npaused = {paused}\n"),
        )
        .replace("interval = \"1s\"", "interval = \"4s\"")
    };
    w.start(&toml(4, false));
    w.converge(4, MINUTE);
    w.add_sentinels();
    // Paused while min drops to 1, for several intervals: nothing is removed meanwhile.
    w.lab.reload(&toml(1, true));
    hold(Duration::from_secs(14));
    assert_eq!(w.own().len(), 4, "{}", w.lab.log());
    let before = delete_times(&w.lab.log()).len();
    let t0 = Instant::now();
    w.lab.reload(&toml(1, false));
    w.converge(1, MINUTE);
    let t = t0.elapsed();
    // One removal per interval: three deletes, each completed at least most of an interval
    // after the one before (a burst would finish them within the same second or two).
    let times = delete_times(&w.lab.log())[before..].to_vec();
    assert_eq!(times.len(), 3, "{}", w.lab.log());
    for pair in times.windows(2) {
        assert!(pair[1] - pair[0] >= 2.5, "{times:?}\n{}", w.lab.log());
    }
    w.finish(t, 0);
}

#[test]
#[ignore = "needs a real Incus (scripts/test.sh runs the fault suite)"]
fn a_creation_whose_wait_outlasts_the_client() {
    let mut w = World::new("a creation whose /wait outlasts the client", "fslowc", true);
    let g = w.lab.group.clone();
    let socket = w.proxy.as_ref().unwrap().path().to_path_buf();
    let toml = desired(&g, 2, 4, "");
    // Creations are waited for 2 s (and 7 s in all): the proxy holds the answer 9 s.
    w.lab.start_with(
        &toml,
        Some(&socket),
        &[
            ("INCUS_HPA_REQUEST_TIMEOUT", "1s"),
            ("INCUS_HPA_OPERATION_TIMEOUT", "2s"),
        ],
    );
    w.converge(2, MINUTE);
    w.add_sentinels();
    w.faults().add(
        Rule::new("/wait", Fault::Delay(Duration::from_secs(9)))
            .method("GET")
            .times(Times::First(1)),
    );
    let created = w.lab.log_count(&["action=\"create\""]);
    let t0 = Instant::now();
    w.lab.reload(&desired(&g, 3, 4, ""));
    eventually(&w.lab, "the creation left to Incus", MINUTE, || {
        w.lab
            .log_count(&["action=\"create\"", "outcome=\"pending\""])
            == 1
    });
    w.faults().clear();
    w.converge(3, MINUTE);
    let t = t0.elapsed();
    // Never undone, counted at the next pass: no second creation, no delete.
    assert_eq!(
        w.lab.log_count(&["action=\"create\""]),
        created + 1,
        "{}",
        w.lab.log()
    );
    assert_eq!(
        w.lab.log_count(&["action=\"delete\""]),
        0,
        "{}",
        w.lab.log()
    );
    w.finish(t, 0);
}

#[test]
#[ignore = "needs a real Incus (scripts/test.sh runs the fault suite)"]
fn a_start_that_always_fails() {
    let mut w = World::new("a start that always fails", "ffail", false);
    let g = w.lab.group.clone();
    let toml = |min: u32| desired(&g, min, 3, "restart_backoff = \"1s\"\n");
    w.start(&toml(2));
    w.converge(2, MINUTE);
    w.add_sentinels();
    let broken = w.own()[0].0.clone();
    // No init: every start fails at once.
    w.lab.exec(&broken, "rm /sbin/init");
    let t0 = Instant::now();
    incus_ok(&["stop", "--force", &broken]);
    // Three failed starts: no longer capacity, replaced, left in place.
    eventually(&w.lab, "replaced", MINUTE, || {
        running(&g) >= 2 && w.lab.log_count(&["failed to start 3 times in a row"]) == 1
    });
    assert!(exists(&broken));
    // A later scale-down happens although it has no reading, and it stays.
    w.lab.reload(&toml(1));
    // (Waits for the daemon's decision: one running alone was seen right after the reload,
    // before any pass, in 3 of 5 runs.)
    eventually(&w.lab, "scaled down to 1 running", MINUTE, || {
        w.lab.log_count(&["scaling down from"]) > 0 && running(&g) == 1
    });
    assert!(exists(&broken), "{}", w.lab.log());
    // Its owner looks at it and removes it.
    incus_ok(&["delete", "--force", &broken]);
    w.converge(1, MINUTE);
    let t = t0.elapsed();
    w.finish(t, 0);
}

/// Raises this process's limit of open files to `n` (at most the hard limit).
fn open_files(n: u64) {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let mut l = getrlimit(Resource::Nofile);
    l.current = Some(n.min(l.maximum.unwrap_or(n)));
    setrlimit(Resource::Nofile, l).unwrap();
}

#[test]
#[ignore = "needs a real Incus (scripts/test.sh runs the fault suite)"]
fn two_thousand_idle_connections_to_metrics() {
    use std::io::{Read, Write};
    let mut w = World::new("2,000 idle connections to the TCP /metrics", "fconn", false);
    let g = w.lab.group.clone();
    w.start(&daemon(
        &desired(&g, 2, 4, ""),
        "metrics_address = \"127.0.0.1:0\"",
    ));
    w.converge(2, MINUTE);
    w.add_sentinels();
    let log = w.lab.log();
    let addr: std::net::SocketAddr = log
        .split("serving /metrics on http://")
        .nth(1)
        .and_then(|r| r.split('/').next())
        .expect("the address in the log")
        .parse()
        .unwrap();
    open_files(8192);
    let idle: Vec<std::net::TcpStream> = (0..2000)
        .filter_map(|_| std::net::TcpStream::connect(addr).ok())
        .collect();
    assert!(idle.len() >= 1000, "only {} connections opened", idle.len());
    // The groups keep reconciling: an instance deleted behind its back is replaced.
    let t0 = Instant::now();
    let victim = w.own()[0].0.clone();
    incus_ok(&["delete", "--force", &victim]);
    w.converge(2, MINUTE);
    let t = t0.elapsed();
    drop(idle);
    // Answers again once they are closed, and counted those it refused.
    let scrape = || -> Option<String> {
        let mut s = std::net::TcpStream::connect(addr).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").ok()?;
        let mut body = String::new();
        s.read_to_string(&mut body).ok()?;
        body.starts_with("HTTP/1.0 200").then_some(body)
    };
    let mut body = None;
    eventually(&w.lab, "/metrics answers again", MINUTE, || {
        body = scrape();
        body.is_some()
    });
    let body = body.unwrap();
    let refused = body
        .lines()
        .find(|l| {
            l.starts_with("incus_hpa_listener_refused_connections_total{listener=\"metrics\"}")
        })
        .and_then(|l| l.split_whitespace().last()?.parse::<f64>().ok())
        .unwrap_or(0.0);
    assert!(refused >= 900.0, "{refused} refused\n{body}");
    w.finish(t, 0);
}

#[test]
#[ignore = "needs a real Incus (scripts/test.sh runs the fault suite)"]
fn the_lease_holder_stopped_during_a_removal() {
    let mut w = World::new(
        "SIGSTOP of the lease holder during a removal",
        "fsigstop",
        true,
    );
    let g = w.lab.group.clone();
    let toml = |min: u32| {
        daemon(
            &desired(
                &g,
                min,
                3,
                "drain_command = [\"sleep\", \"6\"]\ndrain_timeout = \"30s\"\n",
            ),
            "lease = \"3s\"",
        )
    };
    // The holder (A) talks through the proxy, which counts what it sends; B talks to incusd.
    w.start(&toml(2));
    w.converge(2, MINUTE);
    w.add_sentinels();
    let mut b = w.lab.beside();
    let (line, b_socket) = control(&b);
    b.start(&daemon(&toml(2), &line));
    eventually(&b, "B stands by", MINUTE, || {
        acting(&b_socket, &g) == Some(false)
    });
    let changes = [
        Rule::new("/exec", Fault::Delay(Duration::ZERO)).method("POST"),
        Rule::new("/1.0/instances", Fault::Delay(Duration::ZERO)).method("POST"),
        Rule::new("/state", Fault::Delay(Duration::ZERO)).method("PUT"),
        Rule::new("/1.0/instances/", Fault::Delay(Duration::ZERO)).method("DELETE"),
        Rule::new("/1.0/instances/", Fault::Delay(Duration::ZERO)).method("PATCH"),
    ];
    for r in changes {
        w.faults().add(r);
    }
    let sent = |w: &World| -> u64 { w.faults().counts().matched.iter().sum() };
    // A scale-down with a drain: A starts draining, and is stopped in the middle of it.
    w.lab.reload(&toml(1));
    b.reload(&daemon(&toml(1), &line));
    eventually(&w.lab, "A drains", MINUTE, || {
        w.faults().counts().matched[0] >= 1
    });
    let a = w.lab.daemon.as_ref().unwrap().id();
    signal(a, "-STOP");
    let t0 = Instant::now();
    hold(Duration::from_secs(1));
    let at_stop = sent(&w);
    // B takes the lease once A's ran out, and removes the instance itself.
    eventually(&b, "B removes it", MINUTE, || {
        running(&g) == 1 && b.log_count(&["action=\"delete\"", "outcome=\"ok\""]) == 1
    });
    signal(a, "-CONT");
    // A's drain ends; it asks its lease before the stop, and goes no further.
    eventually(&w.lab, "A stops at its lease's end", MINUTE, || {
        w.lab.log_count(&["lease of the group ran out"]) > 0
    });
    hold(Duration::from_secs(3));
    assert_eq!(
        sent(&w),
        at_stop,
        "A changed an instance after its lease ended\n{}",
        w.lab.log()
    );
    assert_eq!(b.terminate(), Some(0), "{}", b.log());
    w.converge(1, MINUTE);
    let t = t0.elapsed();
    w.finish(t, 0);
}
