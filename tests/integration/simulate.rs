//! `incus-hpa simulate` on the decision-quality traces in `benches/traces/` (step, spike, slow
//! ramp, fast oscillation, sawtooth, noisy plateau, a day in an hour; min 1, max 10, threshold
//! 60, 64 MiB limits): the default policy against the two baselines, by the yardstick,
//! and the command's own behaviour (JSON, comparison, plot, located errors).

use std::path::{Path, PathBuf};
use std::process::Command;

use incus_hpa::simulate::{simulate, LoadModel, SimPolicy, Trace};

fn traces() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/traces")
}

const SHAPES: [&str; 7] = [
    "step",
    "spike",
    "ramp",
    "oscillation",
    "sawtooth",
    "noisy",
    "day",
];

#[test]
fn the_default_policy_beats_kubernetes_and_the_step_rule_on_every_shape() {
    let loaded = incus_hpa::config::load(&traces().join("group.toml")).unwrap();
    let spec = loaded.state.groups.values().next().unwrap();
    let model = LoadModel {
        limit_mib: 64.0,
        base_mib: 4.0,
        warmup: std::time::Duration::from_secs(2),
    };
    let (mut ours, mut best) = (0.0, 0.0);
    for shape in SHAPES {
        let path = traces().join(format!("{shape}.csv"));
        let trace = Trace::parse(&path, &std::fs::read_to_string(&path).unwrap()).unwrap();
        let run = |p| simulate(spec, &trace, &model, p).scores;
        let (d, k, s) = (
            run(SimPolicy::Default),
            run(SimPolicy::Kubernetes),
            run(SimPolicy::Step),
        );
        let better = k.cost.min(s.cost);
        assert!(
            d.oom_s <= k.oom_s.min(s.oom_s),
            "{shape}: {} s OOM against {} (kubernetes) and {} (step)",
            d.oom_s,
            k.oom_s,
            s.oom_s
        );
        assert!(
            d.cost <= 1.25 * better,
            "{shape}: cost {:.1} against {:.1} (kubernetes) and {:.1} (step)\n{d:?}",
            d.cost,
            k.cost,
            s.cost
        );
        ours += d.cost;
        best += better;
    }
    assert!(ours <= 0.75 * best, "{ours:.1} against {best:.1}");
}

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_incus-hpa"))
}

#[test]
fn simulate_prints_json_compares_and_plots() {
    let dir = tempfile::tempdir().unwrap();
    let svg = dir.path().join("run.svg");
    let out = bin()
        .args([
            "simulate",
            "--group",
            "bench",
            "--compare",
            "--format",
            "json",
            "--config",
        ])
        .arg(traces().join("group.toml"))
        .arg(traces().join("spike.csv"))
        .arg("--plot")
        .arg(&svg)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let policies: Vec<&str> = rows
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["policy"].as_str().unwrap())
        .collect();
    assert_eq!(policies, ["default", "kubernetes", "step"]);
    let plot = std::fs::read_to_string(&svg).unwrap();
    assert!(
        plot.starts_with("<svg") && plot.contains("ideal instances"),
        "{plot:.200}"
    );
}

#[test]
fn simulate_names_the_file_line_and_key_of_what_is_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.csv");
    std::fs::write(&bad, "t,demand_mib\n0,10\n5,lots\n").unwrap();
    let config = traces().join("group.toml");
    let run = |args: &[&str], trace: &Path| {
        let out = bin()
            .arg("simulate")
            .args(args)
            .arg("--config")
            .arg(&config)
            .arg(trace)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1));
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let e = run(&["--group", "bench"], &bad);
    assert!(
        e.contains(&format!("{}:3: demand_mib: \"lots\"", bad.display())),
        "{e}"
    );
    // A run keeps every simulated second: a trace past 30 days is refused, not run.
    let long = dir.path().join("long.csv");
    std::fs::write(&long, "t,demand_mib\n0,10\n1e10,0\n").unwrap();
    let e = run(&["--group", "bench"], &long);
    assert!(
        e.contains(&format!(
            "{}:3: t: 1e10 is beyond the longest trace, 30 days (2592000 s)",
            long.display()
        )),
        "{e}"
    );
    let e = run(&["--group", "web"], &traces().join("step.csv"));
    assert!(e.contains("no group \"web\" (groups: bench)"), "{e}");
    let nolimit = dir.path().join("g.toml");
    std::fs::write(
        &nolimit,
        "[groups.bench]\nmax = 3\nmemory_threshold = 50\nimage = \"b\"\n",
    )
    .unwrap();
    let out = bin()
        .args(["simulate", "--group", "bench", "--config"])
        .arg(&nolimit)
        .arg(traces().join("step.csv"))
        .output()
        .unwrap();
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(
        e.contains("groups.bench.config.\"limits.memory\" is not set"),
        "{e}"
    );
}
