//! Fault rows of a group that serves (issue 29): its endpoints command hangs, or fails every
//! second run, while the group scales. Busybox web servers on a bridge of the test's own, and
//! for the second row a real HAProxy on 127.0.0.1 fed by `incus-hpa hook haproxy`, under a
//! client that never pauses: the row's name says how many of its requests failed.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use crate::hooks_common::{free_port, start_haproxy, Client};
use crate::lab::*;
use crate::third::leak;
use crate::web::{Net, PROFILE};
use crate::world::{desired, World};

const MINUTE: Duration = Duration::from_secs(60);

/// The scenario's group of busybox web servers on the test's bridge: ready once `/` answers,
/// its endpoints published by `hook` (a timeout of 2 s, a deregistration delay of 1 s).
fn serving(group: &str, min: u32, hook: &Path) -> String {
    let extra = format!(
        "ready = {{ port = 80, path = \"/\", period = \"500ms\", timeout = \"400ms\" }}\n\
         endpoints = {{ command = [{:?}], timeout = \"2s\", deregistration_delay = \"1s\" }}\n",
        hook.display().to_string()
    );
    web_servers(group, min, &extra)
}

/// The same group of web servers at `min`, neither checked nor published.
fn unserved(group: &str, min: u32) -> String {
    web_servers(group, min, "")
}

/// A group of `min` to 3 busybox web servers on the test's bridge, with `extra` keys.
fn web_servers(group: &str, min: u32, extra: &str) -> String {
    let extra = format!("{extra}profiles = [\"default\", \"{PROFILE}\"]");
    desired(group, min, 3, &extra).replace("image = \"busybox\"", "image = \"busybox-web\"")
}

/// A root-owned script (mode 0755) at `path`.
fn script(path: &Path, body: &str) {
    std::fs::write(path, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// How many processes run exactly `cmdline` (arguments joined by spaces).
fn processes(cmdline: &str) -> usize {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| std::fs::read(e.ok()?.path().join("cmdline")).ok())
        .filter(|c| {
            let args: Vec<&str> = c
                .split(|b| *b == 0)
                .filter(|a| !a.is_empty())
                .filter_map(|a| std::str::from_utf8(a).ok())
                .collect();
            args.join(" ") == cmdline
        })
        .count()
}

#[test]
#[ignore = "needs a real Incus (scripts/test.sh runs the fault suite)"]
fn an_endpoints_command_that_hangs() {
    let _net = Net::up();
    let mut w = World::new(
        "an endpoints command that hangs (timeout 2 s): removals held, none stopped",
        "fhookhang",
        false,
    );
    let g = w.lab.group.clone();
    let dir = w.lab.dir.path().to_path_buf();
    let (hangs, works) = (dir.join("hangs"), dir.join("works"));
    script(&hangs, "exec /bin/sleep 3600");
    script(&works, "exec /bin/cat >/dev/null");
    // The sentinels first, before the group is checked: `incus copy` freezes its source, and
    // a freeze longer than the checks allow takes it out of service and has it replaced, as
    // it should, which would add an instance this row does not expect.
    w.start(&unserved(&g, 2));
    w.converge(2, MINUTE);
    w.add_sentinels();
    w.lab.reload(&serving(&g, 2, &hangs));
    eventually(&w.lab, "both checked ready", MINUTE, || {
        w.lab.log_count(&["is ready"]) >= 2
    });
    // A scale-down: the leaving instance's removal waits for the command, which never ends:
    // held, again and again, and nothing is stopped; each run is killed at its timeout.
    let t0 = std::time::Instant::now();
    w.lab.reload(&serving(&g, 1, &hangs));
    eventually(&w.lab, "a removal held twice", MINUTE, || {
        w.lab.log_count(&["held the removal"]) >= 2
    });
    let own = w.own();
    assert_eq!(own.len(), 2, "{}", w.lab.log());
    assert!(own.iter().all(|(_, s)| s == "Running"), "{own:?}");
    assert!(
        processes("/bin/sleep 3600") <= 1,
        "runs of the command outlived their timeout"
    );
    // The command works again: the removal goes through.
    w.lab.reload(&serving(&g, 1, &works));
    w.converge(1, MINUTE);
    let t = t0.elapsed();
    w.finish(t, 0);
}

#[test]
#[ignore = "needs a real Incus (scripts/test.sh runs the fault suite)"]
fn an_endpoints_command_that_fails_every_second_run() {
    let _net = Net::up();
    let mut w = World::new("", "fhookflap", false);
    let g = w.lab.group.clone();
    let dir = w.lab.dir.path().to_path_buf();
    let port = free_port();
    let _haproxy = start_haproxy(&dir, port, 4);
    let (hook, count) = (dir.join("hook"), dir.join("runs"));
    script(
        &hook,
        &format!(
            "n=$(( $(cat {count} 2>/dev/null || echo 0) + 1 )); echo $n > {count}\n\
             if [ $((n % 2)) -eq 1 ]; then cat >/dev/null; echo \"run $n fails\" >&2; exit 1; fi\n\
             exec {bin} hook haproxy --socket {sock} --backend web",
            count = count.display(),
            bin = env!("CARGO_BIN_EXE_incus-hpa"),
            sock = dir.join("admin.sock").display(),
        ),
    );
    // The sentinels first, before the group serves: `incus copy` freezes its source for a
    // moment, and a freeze longer than the checks allow (3 in a row, 500 ms apart) takes the
    // source out of service, as it should, which the client would see.
    w.start(&unserved(&g, 1));
    w.converge(1, MINUTE);
    w.add_sentinels();
    w.lab.reload(&serving(&g, 1, &hook));
    eventually(&w.lab, "HAProxy serves", MINUTE, || {
        matches!(crate::hooks_common::get(port, "/"), Some((200, _)))
    });
    // Up to 3 and back to 1 under a client that never pauses.
    let client = Client::start(port);
    let t0 = std::time::Instant::now();
    w.lab.reload(&serving(&g, 3, &hook));
    w.converge(3, MINUTE);
    eventually(&w.lab, "three servers behind HAProxy", MINUTE, || {
        w.lab.log_count(&["3 endpoint(s)"]) > 0
    });
    w.lab.reload(&serving(&g, 1, &hook));
    w.converge(1, MINUTE);
    let t = t0.elapsed();
    let (sent, failed) = client.finish();
    let runs = std::fs::read_to_string(&count).unwrap_or_default();
    w.name = leak(format!(
        "an endpoints command that fails every second run ({} runs; requests failed: {failed} \
         of {sent}, through HAProxy)",
        runs.trim()
    ));
    assert!(sent > 0);
    assert_eq!(
        failed,
        0,
        "{failed} of {sent} requests failed\n{}",
        w.lab.log()
    );
    w.finish(t, 0);
}
