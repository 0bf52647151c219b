//! Fault scenarios for the third round of trust, one per promise, against the real incusd:
//! two daemons whose `[daemon] lease` differ never act at once; a schedule window that closes
//! above `max` removes one instance per interval when the step limit says one; a group whose
//! external program hangs never delays a group on memory; an instance protected while it is
//! drained is not removed. Each ends with the checks and the report row every scenario has
//! (see `world`); the scenario's name carries what it measured besides.

use std::os::unix::fs::PermissionsExt;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::lab::*;
use crate::trust::{acting, control, daemon, delete_times, MINUTE};
use crate::world::{desired, hold, status, World};

#[test]
#[ignore = "needs a real Incus (scripts/test.sh runs the fault suite)"]
fn two_daemons_whose_leases_differ() {
    let mut w = World::new("", "flen", false);
    let g = w.lab.group.clone();
    let base = desired(&g, 2, 3, "");
    // A holds the group with a lease of 600 s, renewed every 200 s; B comes with the default
    // 15 s (said, since the lab's daemons hold 6 s otherwise), and reads A's lease as ending
    // far beyond its own length.
    let mut a = w.lab.beside();
    let (line, a_socket) = control(&a);
    a.start(&daemon(&base, &format!("lease = \"600s\"\n{line}")));
    eventually(&a, "A acts", MINUTE, || acting(&a_socket, &g) == Some(true));
    w.converge(2, MINUTE);
    w.add_sentinels();
    let (line, b_socket) = control(&w.lab);
    w.start(&daemon(&base, &format!("lease = \"15s\"\n{line}")));
    eventually(&w.lab, "B answers", MINUTE, || {
        acting(&b_socket, &g).is_some()
    });
    // Sampled every second for a minute (four of B's lease lengths) through their `status
    // --json`: never both acting.
    let (mut both, mut samples) = (0, 0);
    for _ in 0..60 {
        let (x, y) = (acting(&a_socket, &g), acting(&b_socket, &g));
        both += usize::from(x == Some(true) && y == Some(true));
        samples += usize::from(x.is_some() && y.is_some());
        hold(Duration::from_secs(1));
    }
    assert_eq!(
        both,
        0,
        "both acted in {both} of {samples} samples\nA:\n{}\nB:\n{}",
        a.log(),
        w.lab.log()
    );
    assert_eq!(acting(&a_socket, &g), Some(true), "A acts\n{}", a.log());
    // A stops cleanly and gives its lease up: B takes over at once, and replaces what is lost.
    let t0 = Instant::now();
    assert_eq!(a.terminate(), Some(0), "{}", a.log());
    eventually(&w.lab, "B acts", MINUTE, || {
        acting(&b_socket, &g) == Some(true)
    });
    let victim = w.own()[0].0.clone();
    incus_ok(&["delete", "--force", &victim]);
    w.converge(2, MINUTE);
    let t = t0.elapsed();
    w.name = leak(format!(
        "two daemons, lease 600 s and 15 s (both acting: {both} of {samples} samples)"
    ));
    w.finish(t, 0);
}

#[test]
#[ignore = "needs a real Incus (scripts/test.sh runs the fault suite)"]
fn a_window_that_closes_above_max() {
    let mut w = World::new("", "fwin", false);
    let g = w.lab.group.clone();
    let toml = |open: bool| {
        let window = if open {
            format!(
                "[[groups.{g}.schedule]]\ncron = \"* * * * *\"\nduration = \"2m\"\nmin = 6\n\
                 timezone = \"UTC\"\n"
            )
        } else {
            String::new()
        };
        desired(&g, 1, 2, &format!("max_scale_down_step = 1\n{window}"))
            .replace("interval = \"1s\"", "interval = \"4s\"")
    };
    // A window open whenever the daemon looks raises the group to 6, above its max of 2.
    w.start(&toml(true));
    w.converge(6, 2 * MINUTE);
    w.add_sentinels();
    let before = delete_times(&w.lab.log()).len();
    // The window closes (taken out of the file; the group's own max is unchanged): one
    // removal per interval, never the four at once.
    let t0 = Instant::now();
    w.lab.reload(&toml(false));
    w.converge(2, 2 * MINUTE);
    let t = t0.elapsed();
    let times = delete_times(&w.lab.log())[before..].to_vec();
    assert_eq!(times.len(), 4, "{times:?}\n{}", w.lab.log());
    // Each completed at least most of an interval after the one before (a burst finishes
    // them within the same second or two).
    for pair in times.windows(2) {
        assert!(pair[1] - pair[0] >= 2.5, "{times:?}\n{}", w.lab.log());
    }
    let gaps: Vec<String> = times
        .windows(2)
        .map(|p| format!("{:.1}", p[1] - p[0]))
        .collect();
    w.name = leak(format!(
        "a window (min 6) closes above max = 2, max_scale_down_step = 1, interval 4 s (seconds \
         between deletes: {})",
        gaps.join(", ")
    ));
    w.finish(t, 0);
}

#[test]
#[ignore = "needs a real Incus (scripts/test.sh runs the fault suite)"]
fn an_external_program_that_hangs_beside_a_memory_group() {
    let mut w = World::new("", "fhang", false);
    let g = w.lab.group.clone();
    let other = format!("{g}-ext");
    // A program of root's that says when it starts (its PID) and never answers: killed after
    // 60 s.
    let started = w.lab.dir.path().join("started");
    let program = w.lab.dir.path().join("hangs");
    std::fs::write(
        &program,
        format!(
            "#!/bin/sh\necho $$ >> {}\nwhile :; do sleep 1; done\n",
            started.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).unwrap();
    let hanging = format!(
        "[groups.{other}]\nmin = 1\nmax = 1\nimage = \"busybox\"\nstop_timeout = \"1s\"\n\
         [[groups.{other}.external]]\ncommand = [\"{}\"]\ntarget = 1\ntimeout = \"60s\"\n\
         [groups.{other}.config]\n\"limits.memory\" = \"64MiB\"\n",
        program.display()
    );
    let toml = format!(
        "{}\n{hanging}",
        desired(&g, 1, 2, "").replace("interval = \"1s\"", "interval = \"2s\"")
    );
    w.start(&toml);
    w.converge(1, MINUTE);
    eventually(&w.lab, "the hanging program runs", MINUTE, || {
        std::fs::read_to_string(&started).is_ok_and(|s| !s.is_empty())
    });
    w.add_sentinels();
    // Its first run is still under way: started once, and still running (the script runs as
    // `/dev/fd/N`, not by its path: it says its PID).
    let first_run = |w: &World| {
        let pids = std::fs::read_to_string(&started).unwrap_or_default();
        let runs = pids.lines().count();
        let alive = pids
            .lines()
            .next()
            .is_some_and(|pid| std::path::Path::new(&format!("/proc/{}", pid.trim())).exists());
        assert!(
            runs == 1 && alive,
            "the program's first run ended (runs {runs}, running {alive})\n{}",
            w.lab.log()
        );
    };
    first_run(&w);
    // The memory group's instance filled while the program hangs: the group grows before the
    // program's first run is given up on (60 s after it started), not after.
    let filled = w.own()[0].0.clone();
    let t0 = Instant::now();
    w.lab.exec(&filled, FILL);
    eventually(&w.lab, "the memory group grows", 2 * MINUTE, || {
        running(&g) == 2
    });
    let reacted = t0.elapsed();
    first_run(&w);
    w.converge(2, MINUTE);
    w.name = leak(format!(
        "an external program that hangs (timeout 60 s) beside a memory group, interval 2 s \
         (grew {:.1} s after the fill)",
        reacted.as_secs_f64()
    ));
    w.finish(reacted, 0);
    // Whatever the daemon left of the program (nothing, when it kills its runs).
    for pid in std::fs::read_to_string(&started)
        .unwrap_or_default()
        .lines()
    {
        let _ = Command::new("kill").args(["-9", pid.trim()]).status();
    }
}

#[test]
#[ignore = "needs a real Incus (scripts/test.sh runs the fault suite)"]
fn protection_set_during_a_drain() {
    let mut w = World::new(
        "protection set during a drain (the instance survives)",
        "fprot",
        false,
    );
    let g = w.lab.group.clone();
    let toml = |min: u32| {
        desired(
            &g,
            min,
            3,
            "drain_command = [\"sh\", \"-c\", \"touch /tmp/draining; sleep 8\"]\n\
             drain_timeout = \"30s\"\n",
        )
    };
    w.start(&toml(2));
    w.converge(2, MINUTE);
    w.add_sentinels();
    // A scale-down: the operator protects the instance the daemon drains, while it drains.
    let t0 = Instant::now();
    w.lab.reload(&toml(1));
    let mut drained = None;
    eventually(&w.lab, "an instance drains", MINUTE, || {
        drained = w.own().into_iter().map(|(n, _)| n).find(|n| {
            incus(&["exec", n, "--", "test", "-e", "/tmp/draining"])
                .status
                .success()
        });
        drained.is_some()
    });
    let drained = drained.unwrap();
    incus_ok(&["config", "set", &drained, "user.incus-hpa.protected=true"]);
    // The other one goes instead; the protected one is left running.
    w.converge(1, 2 * MINUTE);
    let t = t0.elapsed();
    assert!(exists(&drained), "{drained} removed\n{}", w.lab.log());
    assert_eq!(status(&drained), "RUNNING", "{}", w.lab.log());
    w.finish(t, 0);
}

/// A scenario name made from what it measured (the report's rows are `&'static str`).
pub(crate) fn leak(name: String) -> &'static str {
    Box::leak(name.into_boxed_str())
}
