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
        endpoints: None,
        advice: None,
    }
}

#[test]
fn the_series_and_board_entry_of_a_removed_group_go_with_it() {
    let t = Telemetry::default();
    // web stays; api is removed; db moves from project staging to default.
    let before = [("web", "default"), ("api", "default"), ("db", "staging")];
    for (g, p) in before {
        t.pass(g, p, Duration::from_millis(20), Duration::ZERO);
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
    t.pass("db", "staging", Duration::from_millis(20), Duration::ZERO);
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

#[test]
fn readiness_shows_in_the_metrics_and_the_json_document() {
    use crate::model::{InstanceStatus, InstanceView, Readiness};
    let views = [
        InstanceView {
            name: "web-a".into(),
            status: InstanceStatus::Running,
            readiness: Readiness::Ready,
            address: Some("10.0.0.2".parse().unwrap()),
        },
        InstanceView {
            name: "web-b".into(),
            status: InstanceStatus::Running,
            readiness: Readiness::Starting {
                why: "connection refused".into(),
            },
            address: None,
        },
        InstanceView {
            name: "web-c".into(),
            status: InstanceStatus::Running,
            readiness: Readiness::NotReady {
                why: "HTTP 503".into(),
            },
            address: Some("10.0.0.4".parse().unwrap()),
        },
    ];
    let g = GroupStatus {
        starting: 1,
        not_ready: 1,
        instances: views.iter().map(InstanceState::of).collect(),
        endpoints: None,
        advice: None,
        ..group("web", "default")
    };
    let t = Telemetry::default();
    t.publish(Status {
        groups: vec![g.clone()],
    });
    let m = t.metrics();
    for (state, n) in [
        ("current", 2),
        ("ready", 1),
        ("starting", 1),
        ("not_ready", 1),
    ] {
        let line = format!(
            "incus_hpa_instances{{group=\"web\",project=\"default\",state=\"{state}\"}} {n}"
        );
        assert!(m.contains(&line), "{line} not in:\n{m}");
    }

    let json = serde_json::to_value(&g).unwrap();
    assert_eq!(json["starting"], 1);
    assert_eq!(json["not_ready"], 1);
    assert_eq!(
        json["instances"][1],
        serde_json::json!({"name": "web-b", "status": "running", "readiness": "starting",
            "why": "connection refused", "address": null})
    );
    assert_eq!(json["instances"][0]["address"], "10.0.0.2");
    assert_eq!(json["instances"][0]["why"], serde_json::Value::Null);
    assert_eq!(json["instances"][2]["readiness"], "not-ready");
    // A document without them (an older daemon's) still reads.
    let mut old = json.clone();
    for key in ["starting", "not_ready", "instances"] {
        old.as_object_mut().unwrap().remove(key);
    }
    let back: GroupStatus = serde_json::from_value(old).unwrap();
    assert_eq!((back.starting, back.instances.len()), (0, 0));

    let table = table(&Status { groups: vec![g] });
    assert!(table.contains("| 2       |"), "{table}");
    // What is cut to fit 100 columns is whole in `status web`.
    assert!(table.contains("| 1 star"), "{table}");
    assert!(table.lines().all(|l| l.chars().count() <= 100), "{table}");
}

#[test]
fn a_group_s_endpoints_are_in_the_status_as_read_when_asked() {
    use crate::endpoints::{Endpoint, EndpointsStatus};
    let t = Telemetry::default();
    t.publish(Status {
        groups: vec![group("web", "default"), group("db", "default")],
    });
    t.live_endpoints(std::sync::Arc::new(|_, group| {
        (group == "web").then(|| EndpointsStatus {
            published: vec![Endpoint {
                instance: "web-3kd9x2".into(),
                address: "10.98.0.12".into(),
                port: 80,
            }],
            pending: true,
            error: Some("exited with code 1: no backend".into()),
        })
    }));
    let v = serde_json::to_value(t.status()).unwrap();
    assert_eq!(
        v["groups"][0]["endpoints"].to_string(),
        "{\"error\":\"exited with code 1: no backend\",\"pending\":true,\"published\":\
         [{\"address\":\"10.98.0.12\",\"instance\":\"web-3kd9x2\",\"port\":80}]}"
    );
    assert!(
        v["groups"][1].get("endpoints").is_none(),
        "absent without a table"
    );
}
