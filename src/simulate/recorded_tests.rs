//! Recorded passes as a trace, and `--set` changes to a group's table.

use super::*;
use crate::decide::tests::spec;

fn row(unix_ms: i64, current: u32, demand: Option<f64>) -> Record {
    Record {
        limit_mib: Some(64.0),
        cpu_pct: Some(30.0),
        ..Record::sample(unix_ms, current, demand)
    }
}

#[test]
fn passes_become_a_trace_of_the_demand_beyond_the_base() {
    let rows = [
        row(1_000_000, 2, Some(48.0)),
        row(1_015_000, 2, None),
        row(1_030_000, 3, Some(72.5)),
        row(1_045_000, 3, Some(72.5)),
    ];
    let csv = trace_csv(&spec(1, 10, 60.0), &rows, 4.0).unwrap();
    // 48 − 2 × 4; a pass without a reading keeps it; 72.5 − 3 × 4; the last row ends the run.
    assert_eq!(
        csv,
        "# recorded: group web, 4 passes\nt,demand_mib\n0,40\n30,60.5\n45,60.5\n"
    );
    let trace = crate::simulate::Trace::parse(std::path::Path::new("h.csv"), &csv).unwrap();
    assert_eq!(trace.seconds(), 45);
}

#[test]
fn what_was_recorded_is_summed() {
    let rows = [
        row(0, 2, Some(1.0)),
        row(1_800_000, 4, Some(1.0)),
        row(3_600_000, 4, Some(1.0)),
    ];
    assert_eq!(
        as_recorded(&rows),
        AsRecorded {
            seconds: 3600.0,
            instance_hours: 3.0,
            peak: 4,
            oom_kills: 0
        }
    );
}

#[test]
fn too_little_or_nothing_to_replay_is_said() {
    let s = spec(1, 10, 60.0);
    assert!(trace_csv(&s, &[row(0, 1, Some(1.0))], 4.0).is_err());
    let err = trace_csv(&s, &[row(0, 1, None), row(1000, 1, None)], 4.0).unwrap_err();
    assert!(err.contains("no reading"), "{err}");
}

#[test]
fn sets_change_the_groups_table() {
    let text = "[groups.web]\nmin = 1\nmax = 4\nimage = \"busybox\"\n\n[groups.web.config]\n\"limits.memory\" = \"64MiB\"\n";
    let changed = apply_sets(
        text,
        "web",
        &[
            "max=8".into(),
            "policy=kubernetes".into(),
            "scale_down_stabilization = \"2m\"".into(),
            "config.limits.memory=128MiB".into(),
        ],
    )
    .unwrap();
    let doc: toml::Table = changed.parse().unwrap();
    let web = &doc["groups"]["web"];
    assert_eq!(web["max"].as_integer(), Some(8));
    assert_eq!(web["policy"].as_str(), Some("kubernetes"));
    assert_eq!(web["scale_down_stabilization"].as_str(), Some("2m"));
    assert_eq!(web["config"]["limits.memory"].as_str(), Some("128MiB"));
    assert!(apply_sets(text, "db", &["max=2".into()]).is_err());
    assert!(apply_sets(text, "web", &["max".into()]).is_err());
    assert!(apply_sets(text, "web", &["ready.port=80".into()]).is_err());
}

/// The rows a daemon would have written for a run of `demand` (one value per second): each
/// second, the count it found and what its instances used (their base, and their share of the
/// demand, short of their limit).
fn rows_of(
    run: &crate::simulate::Run,
    demand: &[f64],
    model: &crate::simulate::LoadModel,
) -> Vec<Record> {
    let mut n = 1; // the group's min, before the first pass
    let mut rows = Vec::new();
    for (t, d) in demand.iter().enumerate() {
        let each = (model.base_mib + d / f64::from(n.max(1))).min(model.limit_mib);
        let mut r = row(1_000 * t as i64, n, Some(each * f64::from(n)));
        r.cpu_pct = None;
        rows.push(r);
        n = run.timeline[t].instances;
    }
    rows
}

#[test]
fn a_run_recorded_every_second_replays_to_the_counts_it_recorded() {
    use crate::simulate::generate::Family;
    use crate::simulate::{families, simulate, LoadModel, SimPolicy, Trace};
    let model = LoadModel {
        limit_mib: 64.0,
        base_mib: 4.0,
        warmup: std::time::Duration::ZERO,
    };
    let s = crate::model::GroupSpec {
        policy: crate::model::Policy::Adaptive,
        interval: std::time::Duration::from_secs(5),
        ..spec(1, 12, 60.0)
    };
    let families = [
        Family::Steps,
        Family::Spikes,
        Family::SawtoothUp,
        Family::Bursts,
    ];
    let mut same = 0;
    for family in families {
        let demand = families::trace(&s, &model, family, 3).unwrap();
        let live = simulate(&s, &Trace::from_demand(&demand), &model, SimPolicy::Default);
        let rows = rows_of(&live, &demand, &model);
        let csv = trace_csv(&s, &rows, model.base_mib).unwrap();
        let replayed = simulate(
            &s,
            &Trace::parse(std::path::Path::new("h.csv"), &csv).unwrap(),
            &model,
            SimPolicy::Default,
        );
        let counts =
            |r: &crate::simulate::Run| r.timeline.iter().map(|s| s.instances).collect::<Vec<_>>();
        let (a, b) = (counts(&live), counts(&replayed));
        if a[..b.len()] == b[..] {
            same += 1;
        } else {
            eprintln!("{}: differs", family.name());
        }
    }
    assert_eq!(same, families.len());
}
