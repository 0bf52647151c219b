//! The load model and the scores on small traces whose answers can be worked out by hand.

use std::path::Path;
use std::time::Duration;

use super::*;
use crate::decide::tests::spec;

fn trace(text: &str) -> Trace {
    Trace::parse(Path::new("t.csv"), text).unwrap()
}

const MODEL: LoadModel = LoadModel {
    limit_mib: 64.0,
    base_mib: 4.0,
    warmup: Duration::from_secs(2),
};

#[test]
fn a_steady_demand_the_minimum_holds_costs_nothing() {
    // 1 instance: 4 + 20 = 24 MiB of 64 (37.5 %), under 60 %: nothing to do, nothing lost.
    let run = simulate(
        &spec(1, 10, 60.0),
        &trace("t,demand_mib\n0,20\n600,20\n"),
        &MODEL,
        SimPolicy::Kubernetes,
    );
    let s = &run.scores;
    assert_eq!(
        (
            s.overload_s,
            s.oom_s,
            s.waste_instance_s,
            s.churn,
            s.flips,
            s.peak
        ),
        (0, 0, 0, 0, 0, 1)
    );
    assert_eq!(run.timeline.len(), 600);
    assert!((run.timeline[0].utilization - 37.5).abs() < 1e-9);
}

#[test]
fn a_step_is_scored_second_by_second() {
    // 250 MiB from t = 10 on one instance: at its limit (OOM and overload) until the step rule
    // adds instances, one per 10 s, each ready 2 s after its creation.
    let t = trace("t,demand_mib\n0,0\n10,250\n100,250\n");
    let run = simulate(&spec(1, 10, 60.0), &t, &MODEL, SimPolicy::Step);
    let s = &run.scores;
    // Ideal: ceil(250 / (0.6 × 64 − 4)) = 8. The step rule reaches it at t = 80 (+1 per 10 s
    // from t = 10).
    assert_eq!(run.timeline[50].ideal, 8);
    assert_eq!(s.peak, 8);
    assert_eq!(s.churn, 7);
    assert_eq!(s.flips, 0);
    assert!(s.oom_s >= 20 && s.overload_s >= s.oom_s, "{s:?}");
    assert_eq!(
        s.cost,
        10.0 * s.oom_s as f64
            + s.overload_s as f64
            + s.waste_instance_s as f64 / 60.0
            + 2.0 * s.churn as f64
    );
}

#[test]
fn without_a_ready_instance_utilization_counts_as_full() {
    let run = simulate(
        &spec(0, 3, 60.0),
        &trace("t,demand_mib\n0,10\n5,10\n"),
        &MODEL,
        SimPolicy::Kubernetes,
    );
    assert_eq!(run.timeline[0].utilization, 100.0);
    assert_eq!(run.scores.oom_s, 5);
    assert_eq!(run.scores.overload_s, 5);
}

#[test]
fn flips_count_changes_of_direction() {
    // Up and down twice with the step rule: 0 → 70 MiB → 0 → 70 MiB → 0.
    let t = trace("t,demand_mib\n0,70\n60,0\n200,70\n260,0\n400,0\n");
    let run = simulate(&spec(1, 10, 60.0), &t, &MODEL, SimPolicy::Step);
    assert_eq!(run.scores.flips, 3, "{:?}", run.scores);
}

#[test]
fn the_scores_print_as_a_table_and_as_json_with_the_contract_names() {
    let run = simulate(
        &spec(1, 10, 60.0),
        &trace("t,demand_mib\n0,20\n60,20\n"),
        &MODEL,
        SimPolicy::Kubernetes,
    );
    let json = serde_json::to_value(&run.scores).unwrap();
    for key in [
        "policy",
        "overload_s",
        "oom_s",
        "waste_instance_s",
        "churn",
        "flips",
        "peak",
    ] {
        assert!(json.get(key).is_some(), "{key} in {json}");
    }
    assert!(table(&[run.scores]).contains("| kubernetes "));
}

#[test]
fn limits_memory_sizes_read_as_incus_writes_them() {
    use crate::model::size::mib;
    assert_eq!(mib("64MiB"), Some(64.0));
    assert_eq!(mib("1GiB"), Some(1024.0));
    assert_eq!(mib("512MB"), Some(512e6 / 1048576.0));
    assert_eq!(mib("50%"), None);
    assert_eq!(mib("lots"), None);
}
