//! Trust against a real incusd: what people do with the ordinary `incus` commands (copy,
//! export and import, rename, move, detach, pause), instances whose workload crashes, instances
//! that cannot start, and the daemon's own events. Ignored by a plain `cargo test`; CI runs
//! them.

use std::time::Duration;

use crate::lab::*;

/// A project the test creates, removed with every instance in it at the end.
struct Project(String);

impl Project {
    fn new(name: &str) -> Self {
        incus_ok(&[
            "project",
            "create",
            name,
            "-c",
            "features.images=false",
            "-c",
            "features.profiles=false",
        ]);
        Self(name.to_owned())
    }
}

impl Drop for Project {
    fn drop(&mut self) {
        for i in instances(&self.0) {
            if let Some(n) = i["name"].as_str() {
                let _ = incus(&["delete", "--force", "--project", &self.0, n]);
            }
        }
        let _ = incus(&["project", "delete", &self.0]);
    }
}

fn status(name: &str) -> String {
    status_in("default", name)
}

/// The instances of the group that the daemon itself created: those whose name has its
/// `-xxxxxx` suffix and that are not one of `others`.
fn own(group: &str, others: &[&str]) -> Vec<(String, String)> {
    managed(group)
        .into_iter()
        .filter(|(n, _)| !others.contains(&n.as_str()) && n.len() == group.len() + 7)
        .collect()
}

#[test]
#[ignore = "needs a real Incus with the busybox image (scripts/test.sh runs it)"]
fn real_copies_imports_renames_moves_and_detached_instances_are_never_touched() {
    let mut lab = Lab::new("own");
    let g = lab.group.clone();
    let project = Project::new(&format!("{g}-p"));
    lab.start(&config(&g, 2, 2, ""));
    eventually(&lab, "min (2) running", Duration::from_secs(60), || {
        running(&g) == 2
    });
    let (a, b) = {
        let m = managed(&g);
        (m[0].0.clone(), m[1].0.clone())
    };
    let (copy, restored, renamed) = (
        format!("{g}-debug"),
        format!("{g}-restored"),
        format!("{g}-renamed"),
    );
    // What people do while the daemon runs: a copy, and an export imported under a new name.
    incus_ok(&["copy", &a, &copy]);
    let export = lab.dir.path().join("b.tar.gz");
    let export = export.to_str().unwrap();
    incus_ok(&["export", &b, export, "--instance-only"]);
    incus_ok(&["import", export, &restored]);
    // And with the daemon stopped (a rename or a move needs the instance stopped, which the
    // daemon would repair): ownership is checked afresh when it starts again.
    assert_eq!(lab.terminate(), Some(0), "{}", lab.log());
    incus_ok(&["stop", "--force", &a]);
    incus_ok(&["rename", &a, &renamed]);
    incus_ok(&["stop", "--force", &b]);
    incus_ok(&["move", &b, "--target-project", &project.0]);
    lab.start(&config(&g, 2, 2, ""));
    let foreign = [copy.as_str(), restored.as_str(), renamed.as_str()];
    eventually(&lab, "two new instances", Duration::from_secs(60), || {
        own(&g, &foreign)
            .iter()
            .filter(|(_, s)| s == "Running")
            .count()
            == 2
    });
    // Detached by the documented command: left alone, replaced.
    let detached = own(&g, &foreign)[0].0.clone();
    lab.extra.push(detached.clone());
    incus_ok(&["config", "unset", &detached, KEY]);
    eventually(
        &lab,
        "the detached one replaced",
        Duration::from_secs(60),
        || {
            own(&g, &foreign)
                .iter()
                .filter(|(_, s)| s == "Running")
                .count()
                == 2
        },
    );
    // A scale-down to one removes only the daemon's own.
    lab.reload(&config(&g, 1, 1, ""));
    eventually(&lab, "scaled down to 1", Duration::from_secs(60), || {
        own(&g, &foreign).len() == 1
    });
    let run = lab.last_run_log();
    for name in foreign {
        assert_eq!(status(name), "STOPPED", "{name} was touched\n{}", lab.log());
        assert_eq!(
            count_lines(&run, &["reason=\"foreign\"", &format!("instance={name} ")]),
            1,
            "{name} reported once\n{run}"
        );
    }
    assert_eq!(status(&detached), "RUNNING", "{}", lab.log());
    assert_eq!(status_in(&project.0, &b), "STOPPED", "{}", lab.log());
    let log = lab.log();
    assert!(log.contains(&format!("it is a copy of {a}")), "{log}");
    assert!(
        log.contains(&format!("it was renamed (or imported) from {b}")),
        "{log}"
    );
    assert!(
        log.contains(&format!("it was renamed (or imported) from {a}")),
        "{log}"
    );
    assert!(log.contains("user.incus-hpa.owner=default/"), "{log}");
    assert_eq!(lab.terminate(), Some(0), "{}", lab.log());
}

#[test]
#[ignore = "needs a real Incus with the busybox image (scripts/test.sh runs it)"]
fn real_frozen_instance_is_replaced_and_a_ready_one_is_measured() {
    let mut lab = Lab::new("health");
    let g = lab.group.clone();
    let toml = |max: u32| config(&g, 1, max, "unhealthy_grace = \"8s\"\n");
    lab.start(&toml(1));
    eventually(&lab, "1 running", Duration::from_secs(60), || {
        running(&g) == 1
    });
    let frozen = managed(&g)[0].0.clone();
    incus_ok(&["pause", &frozen]);
    let t = eventually(&lab, "a replacement", Duration::from_secs(30), || {
        running(&g) == 1 && managed(&g).len() == 2
    });
    eprintln!("paused -> replacement running: {:.1} s", t.as_secs_f64());
    eventually(
        &lab,
        "the frozen one removed",
        Duration::from_secs(60),
        || !exists(&frozen),
    );
    let removal = [
        "action=\"delete\"",
        "reason=\"unhealthy\"",
        "outcome=\"ok\"",
    ];
    eventually(&lab, "the removal logged", Duration::from_secs(10), || {
        lab.log_count(&removal) == 1
    });
    assert_eq!(lab.log_count(&["reason=\"unhealthy\"", "is frozen"]), 1);
    // Incus 6.0 reports `Ready` for a workload that said so through /dev/incus (which sets
    // volatile.last_state.ready): still measured, so the group still scales.
    lab.reload(&toml(3));
    let ready = managed(&g)[0].0.clone();
    incus_ok(&["config", "set", &ready, "volatile.last_state.ready=true"]);
    assert_eq!(status(&ready), "READY");
    lab.exec(&ready, FILL);
    eventually(
        &lab,
        "scale-up from a Ready instance",
        Duration::from_secs(60),
        || running(&g) >= 2,
    );
    assert_eq!(lab.terminate(), Some(0), "{}", lab.log());
}

#[test]
#[ignore = "needs a real Incus with the busybox image (scripts/test.sh runs it)"]
fn real_crash_loop_backs_off_and_is_replaced() {
    let mut lab = Lab::new("crash");
    let g = lab.group.clone();
    lab.start(&config(&g, 1, 1, "restart_backoff = \"1s\"\n"));
    eventually(&lab, "1 running", Duration::from_secs(60), || {
        running(&g) == 1
    });
    let crashy = managed(&g)[0].0.clone();
    // Its workload now dies a second after every start.
    lab.exec(
        &crashy,
        "rm /sbin/init; printf '#!/bin/sh\\nsleep 1\\nexit 1\\n' > /sbin/init; chmod +x /sbin/init",
    );
    // Stopped by hand: the daemon restarts it, and it starts crashing.
    incus_ok(&["stop", "--force", &crashy]);
    let t = eventually(&lab, "replaced", Duration::from_secs(90), || {
        !exists(&crashy) && running(&g) == 1
    });
    eprintln!("crash loop -> replaced: {:.1} s", t.as_secs_f64());
    let starts = lab.log_count(&["action=\"start\"", &format!("instance={crashy} ")]);
    assert!(starts <= 4, "{starts} restarts\n{}", lab.log());
    assert!(
        lab.log_count(&["reason=\"crash-loop\"", "crash 5 in a row", "replacing it"]) == 1,
        "{}",
        lab.log()
    );
    let removal = [
        "action=\"delete\"",
        "reason=\"crash-loop\"",
        "outcome=\"ok\"",
    ];
    eventually(&lab, "the removal logged", Duration::from_secs(10), || {
        lab.log_count(&removal) == 1
    });
    assert_eq!(lab.terminate(), Some(0), "{}", lab.log());
}

#[test]
#[ignore = "needs a real Incus with the busybox image (scripts/test.sh runs it)"]
fn real_instance_that_cannot_start_is_retried_and_never_deleted() {
    let mut lab = Lab::new("nostart");
    let g = lab.group.clone();
    let old = format!("{g}-old");
    // An instance of the group whose storage is not there (a pool that comes up late).
    let source = lab.dir.path().join("late-pool");
    std::fs::create_dir(&source).unwrap();
    incus_with(&["create", "busybox", &old], &owned(&g, &old));
    incus_ok(&[
        "config",
        "device",
        "add",
        &old,
        "data",
        "disk",
        &format!("source={}", source.display()),
        "path=/mnt",
    ]);
    std::fs::remove_dir(&source).unwrap();
    lab.start(&config(&g, 1, 1, "restart_backoff = \"1s\"\n"));
    let failed = [
        "action=\"start\"",
        "outcome=\"failed\"",
        &format!("instance={old} "),
    ];
    eventually(&lab, "three failed starts", Duration::from_secs(60), || {
        lab.log_count(&failed) >= 3
    });
    assert!(exists(&old), "{}", lab.log());
    // The storage comes up: started on the next try. A replacement the daemon created after
    // the third failure (it no longer counted as capacity) is its own, and goes as surplus
    // (max 1); the instance it did not create is never deleted.
    std::fs::create_dir(&source).unwrap();
    eventually(&lab, "started once it can", Duration::from_secs(60), || {
        managed(&g).len() == 1 && running(&g) == 1
    });
    assert_eq!(managed(&g)[0].0, old);
    let deleted_old = ["action=\"delete\"", &format!("instance={old} ")];
    assert_eq!(lab.log_count(&deleted_old), 0, "{}", lab.log());
    assert_eq!(lab.terminate(), Some(0), "{}", lab.log());
}

#[test]
#[ignore = "needs a real Incus with the busybox image (scripts/test.sh runs it)"]
fn real_own_events_do_not_speed_up_a_stepped_scale_down() {
    let mut lab = Lab::new("step");
    let g = lab.group.clone();
    let toml = |min: u32| {
        config(&g, min, 4, "max_scale_down_step = 1\n")
            .replace("interval = \"1s\"", "interval = \"4s\"")
            .replace(
                "scale_down_stabilization = \"6s\"",
                "scale_down_stabilization = \"0s\"",
            )
    };
    lab.start(&toml(4));
    eventually(&lab, "4 running", Duration::from_secs(60), || {
        running(&g) == 4
    });
    lab.reload(&toml(1));
    eventually(&lab, "down to 1", Duration::from_secs(90), || {
        managed(&g).len() == 1
    });
    let log = lab.log();
    let times: Vec<std::time::SystemTime> = log
        .lines()
        .filter(|l| l.contains("scaling down from"))
        .filter_map(|l| humantime::parse_rfc3339(l.split_whitespace().next()?).ok())
        .collect();
    assert_eq!(times.len(), 3, "{log}");
    for w in times.windows(2) {
        let gap = w[1].duration_since(w[0]).unwrap();
        assert!(
            gap >= Duration::from_millis(3900),
            "two scale-downs {gap:?} apart with a 4 s interval\n{log}"
        );
    }
    assert_eq!(lab.terminate(), Some(0), "{}", lab.log());
}
