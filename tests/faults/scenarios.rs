//! The fault scenarios, against the real incusd: faults injected by the proxy while the daemon
//! has something to do, SIGKILL of the daemon mid-action, incusd stopped under it, instances
//! changed behind its back (once while its event stream is silent), a crash loop, and bad edits
//! of its file. Each ends with the same
//! checks (sentinels untouched, no orphans, no scale-down on missing data, no panic) and adds
//! its row to the report. They share one incusd and one of them stops it: run them one at a
//! time (`--test-threads=1`), as `scripts/test.sh` does.

use std::time::{Duration, Instant};

use crate::lab::*;
use crate::proxy::{Fault, Rule, Times};
use crate::world::{desired, hold, World, INCUS_SOCKET};

const MINUTE: Duration = Duration::from_secs(60);
/// How long a proxy fault lasts while the daemon has a creation to make: three tries fail (at
/// once, then 1 and 2 s later, as the daemon backs off); the fourth, 4 s after the third, finds
/// the faults gone.
const FAULT_WINDOW: Duration = Duration::from_secs(4);

/// Decisions that lowered the desired count, in `log`.
fn scale_downs(log: &str) -> usize {
    count_lines(log, &["scaling down from"])
}

/// A group at 2 is asked for 3 while `rules` hold for [`FAULT_WINDOW`]; then the faults stop.
/// With `relist`, the connections are cut first (an incusd restart, as the daemon sees it), so
/// the daemon must list again, through the faults.
fn proxied(name: &'static str, tag: &str, rules: Vec<Rule>, relist: bool) {
    let mut w = World::new(name, tag, true);
    let g = w.lab.group.clone();
    w.start(&desired(&g, 2, 4, ""));
    w.converge(2, MINUTE);
    w.add_sentinels();
    for r in rules {
        w.faults().add(r);
    }
    if relist {
        let rules: Vec<Rule> = w.faults().rules();
        w.cut_connections();
        for r in rules {
            w.faults().add(r);
        }
    }
    w.lab.reload(&desired(&g, 3, 4, ""));
    hold(FAULT_WINDOW);
    let injected: u64 = w.faults().counts().injected.iter().sum();
    assert!(injected > 0, "{name}: no fault was injected");
    w.faults().clear();
    let t = w.converge(3, MINUTE);
    let downs = scale_downs(&w.lab.log());
    w.finish(t, downs);
}

#[test]
#[ignore = "needs a real Incus (scripts/test.sh runs the fault suite)"]
fn http_500_on_every_list() {
    proxied(
        "HTTP 500 on every list",
        "f500",
        vec![Rule::new("/1.0/instances?", Fault::Status(500)).method("GET")],
        true,
    );
}

#[test]
#[ignore = "needs a real Incus (scripts/test.sh runs the fault suite)"]
fn http_503_on_every_create() {
    proxied(
        "HTTP 503 on every create",
        "f503",
        vec![Rule::new("/1.0/instances", Fault::Status(503)).method("POST")],
        false,
    );
}

#[test]
#[ignore = "needs a real Incus (scripts/test.sh runs the fault suite)"]
fn http_423_on_every_third_request() {
    proxied(
        "423 Locked on every 3rd request",
        "f423",
        vec![Rule::new("/1.0", Fault::Status(423)).times(Times::Every(3))],
        true,
    );
}

#[test]
#[ignore = "needs a real Incus (scripts/test.sh runs the fault suite)"]
fn connection_reset_on_every_second_request() {
    proxied(
        "connection reset on every 2nd request",
        "freset",
        vec![Rule::new("/1.0", Fault::Reset).times(Times::Every(2))],
        true,
    );
}

#[test]
#[ignore = "needs a real Incus (scripts/test.sh runs the fault suite)"]
fn lists_slower_than_the_client_timeout() {
    proxied(
        "lists slower than the 1 s client timeout",
        "fslow",
        vec![Rule::new("/1.0/instances?", Fault::Delay(Duration::from_secs(3))).method("GET")],
        true,
    );
}

#[test]
#[ignore = "needs a real Incus (scripts/test.sh runs the fault suite)"]
fn truncated_list_answers() {
    proxied(
        "truncated JSON on every list",
        "ftrunc",
        vec![Rule::new("/1.0/instances?", Fault::TruncateUpstream).method("GET")],
        true,
    );
}

#[test]
#[ignore = "needs a real Incus (scripts/test.sh runs the fault suite)"]
fn invalid_json_on_instance_reads() {
    proxied(
        "invalid JSON on every instance read",
        "fjson",
        vec![Rule::new("/1.0/instances/", Fault::Body("not json at all".into())).method("GET")],
        false,
    );
}

#[test]
#[ignore = "needs a real Incus (scripts/test.sh runs the fault suite)"]
fn operations_reported_failed_after_they_happened() {
    proxied(
        "operations done, but /wait says Failure",
        "fop",
        vec![Rule::new("/wait", Fault::OperationFailure)],
        false,
    );
}

#[test]
#[ignore = "needs a real Incus (scripts/test.sh runs the fault suite)"]
fn memory_readings_fail_while_a_scale_down_is_due() {
    let mut w = World::new("memory readings fail (scale-down due)", "fmem", true);
    let g = w.lab.group.clone();
    w.start(&desired(&g, 3, 4, ""));
    w.converge(3, MINUTE);
    w.add_sentinels();
    // Every way the daemon reads memory over the API fails.
    w.faults()
        .add(Rule::new("/state", Fault::Status(500)).method("GET"));
    w.faults()
        .add(Rule::new("/1.0/metrics", Fault::Status(500)).method("GET"));
    let before = scale_downs(&w.lab.log());
    // Idle instances, min 1: only the missing readings hold the group at 3.
    w.lab.reload(&desired(&g, 1, 4, ""));
    hold(FAULT_WINDOW);
    let downs = scale_downs(&w.lab.log()) - before;
    assert_eq!(w.own().len(), 3, "{}", w.lab.log());
    w.faults().clear();
    let t = w.converge(1, MINUTE);
    w.finish(t, downs);
}

#[test]
#[ignore = "needs a real Incus (scripts/test.sh runs the fault suite)"]
fn sigkill_during_a_burst_of_creations() {
    let mut w = World::new("SIGKILL during a burst of creations", "fkillup", false);
    let g = w.lab.group.clone();
    w.start(&desired(&g, 1, 6, ""));
    w.converge(1, MINUTE);
    w.add_sentinels();
    w.lab.reload(&desired(&g, 6, 6, ""));
    let created = w.lab.log_count(&["action=\"create\"", "outcome=\"ok\""]);
    eventually(&w.lab, "two more creations", MINUTE, || {
        w.lab.log_count(&["action=\"create\"", "outcome=\"ok\""]) >= created + 2
    });
    kill_daemon(&mut w);
    w.start(&desired(&g, 6, 6, ""));
    let t = w.converge(6, MINUTE);
    let downs = scale_downs(&w.lab.log());
    w.finish(t, downs);
}

#[test]
#[ignore = "needs a real Incus (scripts/test.sh runs the fault suite)"]
fn sigkill_during_a_scale_down() {
    let mut w = World::new("SIGKILL during a scale-down", "fkilldown", false);
    let g = w.lab.group.clone();
    w.start(&desired(&g, 5, 5, ""));
    w.converge(5, MINUTE);
    w.add_sentinels();
    w.lab.reload(&desired(&g, 1, 5, ""));
    eventually(&w.lab, "the first removal", MINUTE, || {
        w.lab.log_count(&["action=\"delete\"", "outcome=\"ok\""]) >= 1
    });
    // The next removal's graceful stop (1 s) is under way.
    hold(Duration::from_millis(500));
    kill_daemon(&mut w);
    w.start(&desired(&g, 1, 5, ""));
    let t = w.converge(1, MINUTE);
    w.finish(t, 0);
}

/// SIGKILL, and wait for the process to be gone.
fn kill_daemon(w: &mut World) {
    let mut child = w.lab.daemon.take().expect("a daemon");
    child.kill().unwrap();
    child.wait().unwrap();
}

#[test]
#[ignore = "needs a real Incus (scripts/test.sh runs the fault suite)"]
fn incusd_stopped_for_30_seconds() {
    let mut w = World::new("incusd stopped for 30 s", "fincusd", false);
    let g = w.lab.group.clone();
    w.start(&desired(&g, 2, 4, ""));
    w.converge(2, MINUTE);
    w.add_sentinels();
    let incusd = Incusd::stop();
    // Asked for more while Incus is away: the group fails and backs off meanwhile.
    w.lab.reload(&desired(&g, 3, 4, ""));
    hold(Duration::from_secs(30));
    incusd.start();
    let t = w.converge(3, MINUTE);
    let downs = scale_downs(&w.lab.log());
    w.finish(t, downs);
}

/// The real incusd, stopped and started again the way it was started (CI: in the background,
/// by `scripts/setup-incus.sh`; elsewhere by systemd). Its instances keep running meanwhile.
struct Incusd {
    cmdline: Vec<String>,
    systemd: bool,
}

impl Incusd {
    fn stop() -> Self {
        // The daemon itself, not one of its `incusd fork…` helpers.
        let pid = crate::incusd::incusd_pid().expect("incusd runs");
        let cmdline: Vec<String> = std::fs::read_to_string(format!("/proc/{pid}/cmdline"))
            .unwrap()
            .split('\0')
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect();
        let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
        let systemd = cgroup.contains("incus.service");
        let signal = |sig: &str| {
            std::process::Command::new("kill")
                .args([sig, &pid])
                .status()
                .unwrap()
                .success()
        };
        let ok = if systemd {
            std::process::Command::new("systemctl")
                .args(["stop", "incus.service", "incus.socket"])
                .status()
                .unwrap()
                .success()
        } else {
            signal("-TERM")
        };
        assert!(ok, "could not stop incusd");
        let deadline = Instant::now() + Duration::from_secs(30);
        while pid_alive(&pid) {
            if Instant::now() > deadline {
                // Slow to shut down: a crash is as good a fault (its instances run on).
                signal("-KILL");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = std::fs::remove_file(INCUS_SOCKET);
        Self { cmdline, systemd }
    }

    fn start(self) {
        let ok = if self.systemd {
            std::process::Command::new("systemctl")
                .args(["start", "incus.socket", "incus.service"])
                .status()
                .unwrap()
                .success()
        } else {
            let log = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open("/var/log/incus-hpa-incusd.log")
                .unwrap();
            // Forked off (`-f`): incusd outlives this test and is never its zombie; from `/`,
            // so that it holds no directory of this checkout.
            std::process::Command::new("setsid")
                .arg("-f")
                .args(&self.cmdline)
                .current_dir("/")
                .stdin(std::process::Stdio::null())
                .stdout(log.try_clone().unwrap())
                .stderr(log)
                .status()
                .is_ok_and(|s| s.success())
        };
        assert!(ok, "could not start incusd again");
        let ready = std::process::Command::new("incus")
            .args(["admin", "waitready", "--timeout", "60"])
            .status()
            .unwrap();
        assert!(ready.success(), "incusd did not come back");
    }
}

fn pid_alive(pid: &str) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

#[test]
#[ignore = "needs a real Incus (scripts/test.sh runs the fault suite)"]
fn instances_deleted_stopped_and_frozen_behind_its_back() {
    let mut w = World::new("deleted, stopped, frozen behind its back", "fback", false);
    let g = w.lab.group.clone();
    let toml = desired(&g, 3, 3, "unhealthy_grace = \"6s\"\n");
    w.start(&toml);
    w.converge(3, MINUTE);
    w.add_sentinels();
    let own: Vec<String> = w.own().into_iter().map(|(n, _)| n).collect();
    let t0 = Instant::now();
    incus_ok(&["delete", "--force", &own[0]]);
    incus_ok(&["stop", "--force", &own[1]]);
    incus_ok(&["pause", &own[2]]);
    // The frozen one is replaced once confirmed, and removed after its 6 s grace.
    w.converge(3, MINUTE);
    assert!(!exists(&own[2]), "{}", w.lab.log());
    let t = t0.elapsed();
    let downs = scale_downs(&w.lab.log());
    w.finish(t, downs);
}

#[test]
#[ignore = "needs a real Incus (scripts/test.sh runs the fault suite)"]
fn an_event_stream_that_goes_silent() {
    let mut w = World::new("an event stream that goes silent", "fsilent", true);
    let g = w.lab.group.clone();
    // Nothing but the event stream can tell the daemon of a deletion: a pass reads the cache,
    // listed again only when the stream reconnects or at the (long) resync.
    let toml = desired(&g, 2, 4, "").replace("[daemon]", "[daemon]\nresync = \"10m\"");
    w.start(&toml);
    w.converge(2, MINUTE);
    w.add_sentinels();
    let own: Vec<String> = w.own().into_iter().map(|(n, _)| n).collect();
    // Half-open, as the daemon sees it: open, but nothing comes, not even pongs.
    let silenced = w.faults().silence_events();
    assert_eq!(silenced, 1, "the daemon's event stream, through the proxy");
    let t0 = Instant::now();
    incus_ok(&["delete", "--force", &own[0]]);
    // Noticed by giving the silent stream up (SILENT_MAX, 25 s), reconnecting and listing
    // again: a replacement is created.
    let noticed = eventually(&w.lab, "a replacement", MINUTE, || {
        w.own().iter().any(|(n, _)| !own.contains(n))
    });
    eprintln!("{}: the deletion noticed after {noticed:.1?}", w.name);
    let given_up = w.lab.log_count(&["no sign of life from the event stream"]);
    assert_eq!(given_up, 1, "{}", w.lab.log());
    w.converge(2, MINUTE);
    let t = t0.elapsed();
    let downs = scale_downs(&w.lab.log());
    w.finish(t, downs);
}

#[test]
#[ignore = "needs a real Incus (scripts/test.sh runs the fault suite)"]
fn a_crash_looping_instance() {
    let mut w = World::new("a crash-looping instance", "floop", false);
    let g = w.lab.group.clone();
    w.start(&desired(&g, 1, 1, "restart_backoff = \"1s\"\n"));
    w.converge(1, MINUTE);
    w.add_sentinels();
    let crashy = w.own()[0].0.clone();
    w.lab.exec(
        &crashy,
        "rm /sbin/init; printf '#!/bin/sh\\nsleep 1\\nexit 1\\n' > /sbin/init; chmod +x /sbin/init",
    );
    let t0 = Instant::now();
    // Stopped by hand: the daemon restarts it, and it starts crashing.
    incus_ok(&["stop", "--force", &crashy]);
    eventually(&w.lab, "replaced", Duration::from_secs(90), || {
        !exists(&crashy)
    });
    w.converge(1, MINUTE);
    let t = t0.elapsed();
    w.finish(t, 0);
}

/// Twenty broken versions of the file, each a different mistake.
fn broken(g: &str) -> Vec<String> {
    let good = desired(g, 2, 4, "");
    let mut v: Vec<String> = vec![
        "[groups".into(),
        format!("[groups.{g}]\nmax = 0\nmemory_threshold = 50\nimage = \"busybox\"\n"),
        good.replace("min = 2", "min = 9"),
        good.replace("memory_threshold = 40", "memory_threshold = 170"),
        good.replace("interval = \"1s\"", "interval = \"100000years\""),
        good.replace("interval = \"1s\"", "interval = \"soon\""),
        good.replace("stop_timeout = \"1s\"", "stop_timeout = \"1h\""),
        good.replace("image = \"busybox\"", "image = 7"),
        good.replace(
            "image = \"busybox\"",
            "image = \"busybox\"\ncolour = \"blue\"",
        ),
        good.replace("[daemon]", "[daemon]\nmemory_source = \"magic\""),
        good.replace(
            "\"limits.memory\"",
            "\"security.privileged\" = \"true\"\n\"limits.memory\"",
        ),
        good.replace(
            "\"limits.memory\"",
            "\"user.incus-hpa.owner\" = \"x\"\n\"limits.memory\"",
        ),
        good.replace(
            "image = \"busybox\"",
            "image = \"busybox\"\nproject = \"a/b\"",
        ),
        good.replace(
            "image = \"busybox\"",
            "image = \"busybox\"\ninstance_prefix = \"9x\"",
        ),
        good.replace("image = \"busybox\"", "image = \"busybox\"\ntolerance = 2"),
        good.replace(
            "image = \"busybox\"",
            "image = \"busybox\"\nmax_scale_down_step = 0",
        ),
        good.replace(
            "image = \"busybox\"",
            "image = \"busybox\"\nrestart_backoff = \"1d\"",
        ),
        good.replace(&format!("[groups.{g}]"), "[groups.Bad_Name]"),
        "\u{0}\u{1}binary garbage \u{fffd}".into(),
    ];
    v.push(good.replace("max = 4", "max = \"four\""));
    v
}

#[test]
#[ignore = "needs a real Incus (scripts/test.sh runs the fault suite)"]
fn twenty_bad_edits_while_it_runs() {
    let mut w = World::new("20 bad edits of the desired-state file", "fedit", false);
    let g = w.lab.group.clone();
    w.start(&desired(&g, 2, 4, ""));
    w.converge(2, MINUTE);
    w.add_sentinels();
    let before = w.own();
    let refused = |w: &World| w.lab.log_count(&["keeping the last good desired state"]);
    let edits = broken(&g);
    assert_eq!(edits.len(), 20);
    for (k, text) in edits.iter().enumerate() {
        let n = refused(&w);
        w.lab.reload(text);
        eventually(&w.lab, &format!("bad edit {k} refused"), MINUTE, || {
            refused(&w) > n
        });
    }
    assert_eq!(w.own(), before, "instances changed under bad edits");
    let t0 = Instant::now();
    w.lab.reload(&desired(&g, 3, 4, ""));
    w.converge(3, MINUTE);
    let t = t0.elapsed();
    let downs = scale_downs(&w.lab.log());
    w.finish(t, downs);
}
