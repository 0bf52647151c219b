//! `incus-hpa simulate --family` on generated traces (`simulate::generate`): the command's
//! distribution table and its replay of one seed; and the default policy against the two
//! baselines on 300 generated traces (what holds today).

use std::path::{Path, PathBuf};
use std::process::Command;

use incus_hpa::simulate::families::{self, Outcome};
use incus_hpa::simulate::generate::Family;
use incus_hpa::simulate::LoadModel;

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

/// Seeds 0 to 29 of every family: 300 traces of 1 to 6 hours.
const SEEDS: u64 = 30;

/// Every trace of every family, replayed three ways.
fn outcomes() -> Vec<(Family, Vec<Outcome>)> {
    let loaded = incus_hpa::config::load(&group()).unwrap();
    let spec = loaded.state.groups.values().next().unwrap().clone();
    let model = LoadModel {
        limit_mib: 64.0,
        base_mib: 4.0,
        warmup: std::time::Duration::from_secs(2),
    };
    Family::ALL
        .into_iter()
        .map(|f| {
            let runs = (0..SEEDS)
                .map(|seed| families::replay(&spec, &model, f, seed).unwrap())
                .collect();
            (f, runs)
        })
        .collect()
}

/// What holds today, per family (total ratio, traces above 1.25×, traces OOM longer than the
/// better baseline): a change that makes a family worse fails here, with the family's
/// distribution and the replay of its worst seed. The bounds the default policy is meant to
/// hold ([`families::RATIO_BOUND`] and never OOM longer on every trace, [`families::TOTAL_BOUND`]
/// per family) are met by the families of [`MEETS_THE_BOUNDS`], and asserted there trace by
/// trace; `simulate --family all` shows where the others miss them.
/// Measured with seeds 0 to 29 (the printed totals, rounded up at the third decimal).
#[rustfmt::skip]
const HOLDS: [(&str, f64, usize, usize); 10] = [
    ("steps", 0.299, 0, 0),
    ("spikes", 0.341, 0, 4),
    ("ramps", 0.349, 0, 0),
    ("sawtooth-up", 0.929, 0, 0),
    ("sawtooth-down", 0.352, 0, 0),
    ("sines", 0.639, 0, 0),
    ("noise", 0.669, 0, 0),
    ("daily", 0.528, 0, 0),
    ("bursts", 0.395, 0, 7),
    ("sums", 0.598, 0, 2),
];

/// The families on every trace of which the default policy holds the bounds.
const MEETS_THE_BOUNDS: [&str; 6] = ["steps", "ramps", "sawtooth-down", "sines", "noise", "daily"];

/// The bounds of the decisions that remember (issue 31), over the 300 traces: the total at
/// most [`TOTAL_OF_ALL`] the better baselines'; each family OOM no longer in all than the
/// better baselines over it; every trace at most [`families::RATIO_BOUND`]; and the families
/// of [`WHEN_SET`] closer to their floors than when the bounds were set.
const TOTAL_OF_ALL: f64 = 0.45;

/// Family totals when the bounds were set, which they must now be below.
const WHEN_SET: [(&str, f64); 3] = [("sawtooth-up", 0.97), ("sines", 0.66), ("daily", 0.546)];

/// The families whose floor ([`incus_hpa::simulate::hindsight`]: the cost of the best count
/// schedule chosen knowing each trace in advance) is above [`families::TOTAL_BOUND`]: no
/// policy can meet that bound on them.
const OUT_OF_REACH: [&str; 1] = ["sawtooth-up"];

#[test]
fn the_default_policy_does_no_worse_than_measured_on_300_generated_traces() {
    let mut all = Vec::new();
    for ((family, runs), (name, total, above, oom)) in outcomes().into_iter().zip(HOLDS) {
        assert_eq!(family.name(), name);
        let d = families::distribution(name, &runs).unwrap();
        let oom_s: u64 = runs.iter().map(|r| r.default.oom_s).sum();
        let better_oom_s: u64 = runs.iter().map(|r| r.better().oom_s).sum();
        assert!(
            oom_s <= better_oom_s,
            "{name}: OOM {oom_s} s in all, against the better baselines' {better_oom_s} s"
        );
        for run in &runs {
            assert!(
                run.ratio() <= families::RATIO_BOUND,
                "{name} seed {}: {:.2}× the better baseline\nreplay: incus-hpa simulate -c \
                 benches/traces/group.toml --group bench --family {name} --seed {} --compare",
                run.seed,
                run.ratio(),
                run.seed
            );
        }
        if let Some((_, then)) = WHEN_SET.iter().find(|(n, _)| *n == name) {
            assert!(d.total < *then, "{d:?}: {then} when the bounds were set");
        }
        assert!(
            d.total <= total && d.above_bound <= above && d.oom_above <= oom,
            "{d:?}\nreplay: incus-hpa simulate -c benches/traces/group.toml --group bench \
             --family {name} --seed {} --compare",
            d.worst_seed
        );
        let floor = d.floor.unwrap();
        assert!(floor <= d.total, "{d:?}");
        assert_eq!(
            floor > families::TOTAL_BOUND,
            OUT_OF_REACH.contains(&name),
            "{d:?}"
        );
        if MEETS_THE_BOUNDS.contains(&name) {
            assert!(d.total <= families::TOTAL_BOUND, "{d:?}");
            for run in &runs {
                let broken = run.violations();
                assert!(
                    broken.is_empty(),
                    "{name} seed {}: {}\nreplay: incus-hpa simulate -c benches/traces/group.toml \
                     --group bench --family {name} --seed {} --compare",
                    run.seed,
                    broken.join("; "),
                    run.seed
                );
            }
        }
        all.extend(runs);
    }
    let d = families::distribution("all", &all).unwrap();
    assert!(d.total <= TOTAL_OF_ALL, "{d:?}");
    // What holds today, as for each family: 0.445 in total, 13 traces OOM longer.
    assert!(d.total <= 0.445 && d.oom_above <= 13, "{d:?}");
}
