//! The documents and metrics of the control socket: endpoints without names, the series of
//! removed groups forgotten.

use std::path::Path;
use std::time::Duration;

use super::*;

/// A group's board entry, as a pass would publish it.
fn group(name: &str, project: &str) -> GroupStatus {
    GroupStatus {
        name: name.into(),
        project: project.into(),
        current: 2,
        desired: 2,
        min: 1,
        max: 4,
        unhealthy: 0,
        warm: 0,
        failing: Vec::new(),
        utilization: Some(50.0),
        threshold: Some(70.0),
        signals: vec![SignalStatus {
            name: "external 1".into(),
            value: Some(3.0),
            target: 2.0,
            wants: Some(2),
        }],
        reason: "within-tolerance".into(),
        paused: false,
        last_action: None,
        next_pass: None,
        last_error: None,
        standby: None,
        scale_down_window: None,
        starting: 0,
        not_ready: 0,
        instances: Vec::new(),
    }
}

#[test]
fn the_series_and_board_entry_of_a_removed_group_go_with_it() {
    let t = Telemetry::default();
    // web stays; api is removed; db moves from project staging to default.
    let before = [("web", "default"), ("api", "default"), ("db", "staging")];
    for (g, p) in before {
        t.pass(g, p, Duration::from_millis(20));
        t.action(g, p, "create", "ok", Duration::from_secs(1));
        t.action(g, p, "delete", "failed", Duration::from_secs(1));
        t.error(g, p);
        t.headroom_blocked(g, p);
    }
    t.publish(Status {
        groups: before.iter().map(|(g, p)| group(g, p)).collect(),
    });
    let toml = "[groups.web]\nmax = 4\nmemory_threshold = 70\nimage = \"busybox\"\n\
                [groups.db]\nmax = 4\nmemory_threshold = 70\nimage = \"busybox\"\n";
    let state = crate::config::parse(Path::new("x.toml"), toml)
        .unwrap()
        .state;
    t.retain_groups(&state);
    let metrics = t.metrics();
    assert!(
        metrics.contains("group=\"web\",project=\"default\""),
        "{metrics}"
    );
    for gone in ["group=\"api\"", "group=\"db\",project=\"staging\""] {
        assert!(!metrics.contains(gone), "{gone} left in:\n{metrics}");
    }
    let board: Vec<String> = t.status().groups.into_iter().map(|g| g.name).collect();
    assert_eq!(board, ["web"]);
    // A pass of a removed group that ends afterwards counts nothing; the series of a group
    // kept go on from where they were.
    t.error("api", "default");
    t.pass("db", "staging", Duration::from_millis(20));
    assert!(!t.metrics().contains("group=\"api\""));
    assert!(!t.metrics().contains("project=\"staging\""));
    t.error("web", "default");
    let m = t.metrics();
    assert!(
        m.contains("incus_hpa_reconcile_errors_total{group=\"web\",project=\"default\"} 2"),
        "{m}"
    );
}

#[test]
fn endpoints_name_no_instance_nor_operation() {
    assert_eq!(endpoint("/1.0"), "/1.0");
    assert_eq!(
        endpoint("/1.0/instances?recursion=1&project=p"),
        "/1.0/instances"
    );
    assert_eq!(
        endpoint("/1.0/instances/web-a/state?project=p"),
        "/1.0/instances/{name}/state"
    );
    assert_eq!(
        endpoint("/1.0/instances/web-a/exec"),
        "/1.0/instances/{name}/exec"
    );
    assert_eq!(
        endpoint("/1.0/operations/1c2d-33/wait?timeout=5"),
        "/1.0/operations/{id}/wait"
    );
    assert_eq!(endpoint("/1.0/metrics?project=p"), "/1.0/metrics");
}
