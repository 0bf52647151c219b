//! `[daemon] host_reserve` against a real incusd (through its socket: the host's
//! `/proc/meminfo`). Ignored unless asked for, like the other real tests.

use std::time::Duration;

use crate::lab::*;

/// `config(...)` keeping `reserve` on the host.
fn reserving(group: &str, min: u32, max: u32, reserve: &str) -> String {
    config(group, min, max, "").replace(
        "interval = \"1s\"",
        &format!("interval = \"1s\"\nhost_reserve = \"{reserve}\""),
    )
}

#[test]
#[ignore = "needs a real Incus with the busybox image (scripts/test.sh runs it)"]
fn real_host_reserve_holds_what_the_host_cannot_hold() {
    let mut lab = Lab::new("reserve");
    let g = lab.group.clone();
    // The journal line of a pass that held additions back (the decision's says less).
    let me = format!("{g}: ");
    let held = |lab: &Lab, below_min: bool| {
        lab.log()
            .lines()
            .filter(|l| l.contains(&me) && l.contains("held back") && l.contains("available"))
            .filter(|l| l.contains("stays below its min") == below_min)
            .count()
    };
    // More than this host has: not even min is created.
    lab.start(&reserving(&g, 1, 3, "1TiB"));
    eventually(&lab, "min held back", Duration::from_secs(30), || {
        held(&lab, true) > 0
    });
    assert_eq!(running(&g), 0, "{}", lab.log());
    let log = lab.log();
    assert!(log.contains("reason=\"host-headroom\""), "{log}");
    assert!(log.contains("stays below its min (1)"), "{log}");
    assert!(log.contains("(1.0 TiB of host_reserve"), "{log}");

    // A small reserve lets min through.
    lab.reload(&reserving(&g, 1, 3, "64MiB"));
    eventually(&lab, "min (1) running", Duration::from_secs(60), || {
        running(&g) == 1
    });
    let first = managed(&g)[0].0.clone();

    // Held again, then a scale-up: 40 MiB of 64 MiB (62 %) against a 40 % target wants 2.
    lab.reload(&reserving(&g, 1, 3, "1TiB"));
    lab.exec(&first, FILL);
    eventually(&lab, "scale-up held back", Duration::from_secs(60), || {
        held(&lab, false) > 0
    });
    assert_eq!(running(&g), 1, "{}", lab.log());

    // And let through by a small one.
    lab.reload(&reserving(&g, 1, 3, "64MiB"));
    let t = eventually(&lab, "scale-up to 2", Duration::from_secs(60), || {
        running(&g) == 2
    });
    eprintln!(
        "reserve lowered -> second instance running: {:.1} s",
        t.as_secs_f64()
    );
    assert_eq!(lab.terminate(), Some(0), "{}", lab.log());
}
