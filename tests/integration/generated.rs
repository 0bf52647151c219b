//! `incus-hpa simulate --family` on generated traces (`simulate::generate`): the command's
//! distribution table and its replay of one seed.

use std::path::{Path, PathBuf};
use std::process::Command;

fn group() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/traces/group.toml")
}

fn simulate(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_incus-hpa"))
        .args(["simulate", "--group", "bench", "--config"])
        .arg(group())
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn a_family_prints_its_distribution_and_a_seed_replays_as_a_trace() {
    let out = simulate(&["--family", "spikes", "--seeds", "3", "--format", "json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let row = &rows.as_array().unwrap()[0];
    assert_eq!(row["family"], "spikes");
    assert_eq!(row["traces"], 3);
    let worst = row["worst_seed"].as_u64().unwrap();
    assert!(worst < 3, "{row}");

    // The worst seed replays alone, and its trace, written out, replays the same.
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("worst.csv");
    let seed = worst.to_string();
    let args = [
        "--family",
        "spikes",
        "--seed",
        &seed,
        "--compare",
        "--format",
        "json",
    ];
    let out = simulate(&[&args[..], &["--trace-out", csv.to_str().unwrap()]].concat());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let generated: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let out = simulate(&["--compare", "--format", "json", csv.to_str().unwrap()]);
    let from_file: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(generated, from_file);
    let (d, k, s) = (&generated[0], &generated[1], &generated[2]);
    let better = k["cost"].as_f64().unwrap().min(s["cost"].as_f64().unwrap());
    let ratio = d["cost"].as_f64().unwrap() / better;
    assert!(
        (ratio - row["worst"].as_f64().unwrap()).abs() < 1e-9,
        "{ratio} {row}"
    );

    // Every family, in a table, with a row for all of them.
    let out = simulate(&["--family", "all", "--seeds", "1"]);
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    for name in ["steps", "sawtooth-up", "sawtooth-down", "sums", "all"] {
        assert!(table.contains(&format!("| {name} ")), "{name}:\n{table}");
    }
}

#[test]
fn a_bad_family_or_a_seed_without_one_is_refused() {
    let out = simulate(&["--family", "waves"]);
    assert_eq!(out.status.code(), Some(1));
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(
        e.contains("--family \"waves\": no such family") && e.contains("sawtooth-up"),
        "{e}"
    );
    let out = simulate(&["--family", "all", "--seed", "2"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("name the family"));
    let trace = group().with_file_name("step.csv");
    let out = simulate(&["--seed", "2", trace.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("name its --family"));
    // A trace file and a family are one or the other.
    let out = simulate(&["--family", "steps", trace.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
}
