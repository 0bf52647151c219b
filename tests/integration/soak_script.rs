//! `scripts/soak.sh --dry-run`: its cycle of churn and its sampling, on a stand-in for the
//! daemon; needs no root, no Incus and no network, and leaves nothing behind.

use std::path::Path;
use std::process::Command;

#[test]
fn the_soak_script_churns_its_own_groups_samples_every_minute_and_cleans_up() {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/soak.sh");
    let out = Command::new("bash")
        .arg(&script)
        .args(["--dry-run", "--minutes", "16", "--sample-every", "0"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A row per minute, the start's included: minute, rss, descriptors, threads.
    let rows: Vec<Vec<&str>> = stdout
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .filter(|w| w.len() > 4 && w[0].parse::<u32>().is_ok() && w[1].parse::<u64>().is_ok())
        .collect();
    assert_eq!(rows.len(), 17, "{stdout}");
    for (m, row) in rows.iter().enumerate() {
        assert_eq!(row[0], m.to_string(), "{stdout}");
        assert!(row[2].parse::<u32>().is_ok_and(|fds| fds > 0), "{stdout}");
    }
    // Every kind of churn, each on the soak's own groups only.
    let tag = stdout
        .split_whitespace()
        .find_map(|w| w.strip_suffix("-mem"))
        .expect("the memory group's name");
    for what in [
        "fill ",
        "delete ",
        "stop ",
        "edit: ",
        "burn CPU ",
        "freeze ",
        "release ",
        "SIGHUP, no change",
        "a file that does not parse",
    ] {
        assert!(stdout.contains(what), "no {what:?} in:\n{stdout}");
    }
    for line in stdout.lines().filter(|l| l.contains("would-run incus")) {
        assert!(line.contains(&format!("<an instance of {tag}-")), "{line}");
    }
    assert!(
        stdout.contains("== first minutes against the last ones"),
        "{stdout}"
    );
    // Its directory is gone.
    let dir = stdout
        .split_whitespace()
        .find(|w| w.starts_with("/tmp/incus-hpa-soak."))
        .and_then(|w| Path::new(w).parent())
        .expect("its directory");
    assert!(!dir.exists(), "{} left behind", dir.display());
}
