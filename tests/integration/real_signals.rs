//! The signals besides memory on the real Incus, each with the daemon as it runs: an external
//! program's number, a schedule window open now, CPU and pressure.

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use crate::lab::*;

const MINUTE: Duration = Duration::from_secs(60);

#[test]
#[ignore = "needs a real Incus with the busybox image (scripts/test.sh runs it)"]
fn real_external_command_scales_to_its_quotient_and_back() {
    let mut lab = Lab::new("ext");
    let g = lab.group.clone();
    // A program of root's, in a directory of root's, that prints what a file says.
    let value = lab.dir.path().join("value");
    std::fs::write(&value, "0\n").unwrap();
    let program = lab.dir.path().join("queue-depth");
    std::fs::write(&program, format!("#!/bin/sh\ncat {}\n", value.display())).unwrap();
    std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).unwrap();
    let extra = format!(
        "[[groups.{g}.external]]\ncommand = [\"{}\"]\ntarget = 10\ntimeout = \"2s\"\n",
        program.display()
    );
    lab.start(&config(&g, 1, 4, &extra));
    eventually(&lab, "min (1) running", MINUTE, || running(&g) == 1);

    // 25 at 10 per instance: ceil(2.5) = 3.
    std::fs::write(&value, "25\n").unwrap();
    eventually(&lab, "3 running for a value of 25", MINUTE, || {
        running(&g) == 3
    });
    assert!(
        lab.log_count(&["external-above-target"]) > 0,
        "{}",
        lab.log()
    );

    // A program that fails holds the count: no scale-down on a missing reading.
    std::fs::write(&value, "not a number\n").unwrap();
    eventually(&lab, "the failure said", MINUTE, || {
        lab.log_count(&["external signal 1", "has no reading"]) > 0
    });
    eventually(
        &lab,
        "a decision that holds for want of a reading",
        MINUTE,
        || lab.log_count(&["metrics-missing"]) > 0,
    );
    assert_eq!(
        running(&g),
        3,
        "scaled down on a missing reading\n{}",
        lab.log()
    );
    assert_eq!(
        lab.log_count(&["external signal 1", "has no reading"]),
        1,
        "said once\n{}",
        lab.log()
    );

    // Back to 0: down to min after the scale-down window (6 s).
    std::fs::write(&value, "0\n").unwrap();
    eventually(&lab, "back to min", MINUTE, || running(&g) == 1);
    assert!(lab.log_count(&["answers again"]) > 0, "{}", lab.log());
}

#[test]
#[ignore = "needs a real Incus with the busybox image (scripts/test.sh runs it)"]
fn real_a_program_others_can_write_is_refused_with_its_fix() {
    let lab = Lab::new("extw");
    let g = lab.group.clone();
    let program = lab.dir.path().join("loose");
    std::fs::write(&program, "#!/bin/sh\necho 1\n").unwrap();
    std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o777)).unwrap();
    let extra = format!(
        "[[groups.{g}.external]]\ncommand = [\"{}\"]\ntarget = 1\n",
        program.display()
    );
    let file = lab.dir.path().join("desired-state.toml");
    std::fs::write(&file, config(&g, 1, 2, &extra)).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_incus-hpa"))
        .args(["validate", "-c"])
        .arg(&file)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("groups.{g}.external[0].command")) && stderr.contains("chmod"),
        "{stderr}"
    );
}

#[test]
#[ignore = "needs a real Incus with the busybox image (scripts/test.sh runs it)"]
fn real_a_schedule_window_open_now_raises_the_group_to_its_min() {
    let mut lab = Lab::new("sched");
    let g = lab.group.clone();
    // Opens every minute for two: open whenever the daemon looks.
    let open = format!(
        "[[groups.{g}.schedule]]\ncron = \"* * * * *\"\nduration = \"2m\"\nmin = 3\ntimezone = \"UTC\"\n"
    );
    lab.start(&config(&g, 1, 4, &open));
    eventually(&lab, "the window's min (3) running", MINUTE, || {
        running(&g) == 3
    });
    assert!(lab.log_count(&["schedule-min"]) > 0, "{}", lab.log());
    // Without the window, the group's own min: back to 1 after the scale-down window.
    lab.reload(&config(&g, 1, 4, ""));
    eventually(&lab, "back to the group's min", MINUTE, || running(&g) == 1);
}

/// A group on one signal besides idle memory, its instances capped at one CPU.
fn cpu_group(g: &str, signal: &str) -> String {
    format!(
        r#"
[daemon]
interval = "1s"

[groups.{g}]
min = 1
max = 3
{signal}
image = "busybox"
scale_down_stabilization = "6s"
stop_timeout = "1s"

[groups.{g}.config]
"limits.memory" = "64MiB"
"limits.cpu" = "1"
"#
    )
}

/// A loop that spins while the instance runs, detached from the exec session; its pid noted.
const SPIN: &str =
    "busybox sh -c 'while :; do :; done' </dev/null >/dev/null 2>&1 & echo $! >> /tmp/spin.pids";
const STOP_SPIN: &str = "kill $(cat /tmp/spin.pids)";

#[test]
#[ignore = "needs a real Incus with the busybox image (scripts/test.sh runs it)"]
fn real_a_busy_loop_grows_a_cpu_group_and_its_end_shrinks_it() {
    let mut lab = Lab::new("cpu");
    let g = lab.group.clone();
    lab.start(&cpu_group(&g, "cpu_threshold = 50"));
    eventually(&lab, "min (1) running", MINUTE, || running(&g) == 1);
    let first = managed(&g)[0].0.clone();
    // One instance at 100 % of its CPU for a 50 % target: ceil(1 × 100 / 50) = 2.
    lab.exec(&first, SPIN);
    eventually(&lab, "2 running for a busy CPU", MINUTE, || {
        running(&g) >= 2
    });
    assert!(lab.log_count(&["cpu-above-threshold"]) > 0, "{}", lab.log());
    lab.exec(&first, STOP_SPIN);
    eventually(&lab, "back to 1 once idle", MINUTE, || running(&g) == 1);
    assert!(lab.log_count(&["cpu-below-threshold"]) > 0, "{}", lab.log());
}

#[test]
#[ignore = "needs a real Incus with the busybox image (scripts/test.sh runs it)"]
fn real_pressure_alone_grows_a_group_whose_instance_waits_for_cpu() {
    let mut lab = Lab::new("psi");
    let g = lab.group.clone();
    lab.start(&cpu_group(&g, "pressure_threshold = 5"));
    eventually(&lab, "min (1) running", MINUTE, || running(&g) == 1);
    let first = managed(&g)[0].0.clone();
    // Three spinning loops on one CPU: each waits for the others.
    for _ in 0..3 {
        lab.exec(&first, SPIN);
    }
    eventually(&lab, "a second instance for the pressure", MINUTE, || {
        running(&g) >= 2
    });
    assert!(
        lab.log_count(&["pressure-above-threshold"]) > 0,
        "{}",
        lab.log()
    );
    lab.exec(&first, STOP_SPIN);
}
