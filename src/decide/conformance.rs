//! `policy = "kubernetes"` against the resource-metric cases of the Kubernetes replica
//! calculator's own test table (`replica_calculator_test.go`; the numbers, not the code).
//!
//! A pod is an instance, its request a limit, its usage a reading. Kubernetes' tests use CPU;
//! the arithmetic is the same for memory. Where this daemon differs, the row says which of its
//! documented choices makes it differ, and what it decides instead:
//! - **a missing metric never scales down** (Kubernetes counts a missing pod at 100 % of its
//!   request on the way down, and may still shrink);
//! - **readiness**: an unready or pending pod is an instance that is not running (stopped or
//!   starting); it counts as capacity without a reading, so it is a missing metric, where
//!   Kubernetes leaves it out of a scale-down;
//! - **CPU start-up**: Kubernetes ignores the CPU samples of pods started in the last two
//!   minutes, and never memory samples; for memory those pods count as measured;
//! - **a memory reading cannot exceed its limit**: it is capped (CPU use can exceed a request);
//! - failed pods and pods being deleted are instances in error, which do not count.
//!
//! Kubernetes returns an error where no pod has a metric or a request; the daemon keeps the
//! count (`no-metrics`).

use tokio::time::Instant;

use super::tests::spec;
use super::*;
use crate::model::{InstanceStatus, Memory};

#[derive(Clone, Copy)]
enum Pod {
    /// Ready, with this usage (milli-units).
    Ready(u64),
    /// Ready, started within the CPU initialization period, with this usage.
    Hot(u64),
    /// Unready or pending: whatever its usage, it is not running here, so it has no reading.
    Unready,
    /// Ready, no metric.
    NoMetric,
    /// Failed, or being deleted.
    Gone,
}

struct Case {
    name: &'static str,
    /// The count before (`currentReplicas`).
    current: u32,
    /// Requests, per pod (milli-units).
    requests: &'static [u64],
    pods: &'static [Pod],
    target: f64,
    /// What Kubernetes decides.
    kubernetes: u32,
    /// What the daemon decides, when it differs, and why.
    differs: Option<(u32, &'static str)>,
}

use Pod::*;

const MISSING_DOWN: &str = "a missing metric never scales down";
const READINESS: &str = "readiness: a pod that is not running is a missing metric";
const CPU_ONLY: &str = "Kubernetes ignores start-up samples for CPU only";
const CAPPED: &str = "a memory reading cannot exceed its limit";

#[rustfmt::skip]
const CASES: &[Case] = &[
    Case { name: "ScaleUp", current: 3, requests: &[1000; 3], pods: &[Ready(300), Ready(500), Ready(700)], target: 30.0, kubernetes: 5, differs: None },
    Case { name: "ScaleUpUnreadyLessScale", current: 3, requests: &[1000; 3], pods: &[Unready, Ready(500), Ready(700)], target: 30.0, kubernetes: 4, differs: None },
    Case { name: "ScaleUpHotCpuLessScale", current: 3, requests: &[1000; 3], pods: &[Hot(300), Ready(500), Ready(700)], target: 30.0, kubernetes: 4, differs: Some((5, CPU_ONLY)) },
    Case { name: "ScaleUpUnreadyNoScale", current: 3, requests: &[1000; 3], pods: &[Ready(400), Unready, Unready], target: 30.0, kubernetes: 3, differs: None },
    Case { name: "ScaleHotCpuNoScale", current: 3, requests: &[1000; 3], pods: &[Ready(400), Hot(500), Hot(700)], target: 30.0, kubernetes: 3, differs: Some((6, CPU_ONLY)) },
    Case { name: "ScaleUpIgnoresFailedPods", current: 2, requests: &[1000; 4], pods: &[Ready(500), Ready(700), Gone, Gone], target: 30.0, kubernetes: 4, differs: None },
    Case { name: "ScaleUpIgnoresDeletionPods", current: 2, requests: &[1000; 4], pods: &[Ready(500), Ready(700), Gone, Gone], target: 30.0, kubernetes: 4, differs: None },
    Case { name: "ScaleDown", current: 5, requests: &[1000; 5], pods: &[Ready(100), Ready(300), Ready(500), Ready(250), Ready(250)], target: 50.0, kubernetes: 3, differs: None },
    Case { name: "ScaleDownIncludeUnreadyPods", current: 5, requests: &[1000; 5], pods: &[Ready(100), Ready(300), Ready(500), Unready, Unready], target: 50.0, kubernetes: 2, differs: Some((5, READINESS)) },
    Case { name: "ScaleDownExcludeUnscheduledPods", current: 5, requests: &[1000; 5], pods: &[Ready(100), Unready, Unready, Unready, Unready], target: 50.0, kubernetes: 1, differs: Some((5, READINESS)) },
    Case { name: "ScaleDownIgnoreHotCpuPods", current: 5, requests: &[1000; 5], pods: &[Ready(100), Ready(300), Ready(500), Hot(250), Hot(250)], target: 50.0, kubernetes: 2, differs: Some((3, CPU_ONLY)) },
    Case { name: "ScaleDownIgnoresFailedPods", current: 5, requests: &[1000; 7], pods: &[ Ready(100), Ready(300), Ready(500), Ready(250), Ready(250), Gone, Gone, ], target: 50.0, kubernetes: 3, differs: None },
    Case { name: "ScaleDownIgnoresDeletionPods", current: 5, requests: &[1000; 7], pods: &[ Ready(100), Ready(300), Ready(500), Ready(250), Ready(250), Gone, Gone, ], target: 50.0, kubernetes: 3, differs: None },
    Case { name: "Tolerance", current: 3, requests: &[900, 1000, 1100], pods: &[Ready(1010), Ready(1030), Ready(1020)], target: 100.0, kubernetes: 3, differs: None },
    Case { name: "SuperfluousMetrics", current: 4, requests: &[1000; 4], pods: &[Ready(4000), Ready(9500), Ready(3000), Ready(7000)], target: 100.0, kubernetes: 24, differs: Some((4, CAPPED)) },
    Case { name: "MissingMetrics", current: 4, requests: &[1000; 4], pods: &[Ready(400), Ready(95), NoMetric, NoMetric], target: 100.0, kubernetes: 3, differs: Some((4, MISSING_DOWN)) },
    Case { name: "MissingMetricsNoChangeEq", current: 2, requests: &[1000; 2], pods: &[Ready(1000), NoMetric], target: 100.0, kubernetes: 2, differs: None },
    Case { name: "MissingMetricsNoChangeGt", current: 2, requests: &[1000; 2], pods: &[Ready(1900), NoMetric], target: 100.0, kubernetes: 2, differs: None },
    Case { name: "MissingMetricsNoChangeLt", current: 2, requests: &[1000; 2], pods: &[Ready(600), NoMetric], target: 100.0, kubernetes: 2, differs: None },
    Case { name: "MissingMetricsUnreadyChange", current: 3, requests: &[1000; 3], pods: &[Unready, Ready(450), NoMetric], target: 50.0, kubernetes: 3, differs: None },
    Case { name: "MissingMetricsHotCpuNoChange", current: 3, requests: &[1000; 3], pods: &[Hot(100), Ready(450), NoMetric], target: 50.0, kubernetes: 3, differs: None },
    Case { name: "MissingMetricsUnreadyScaleUp", current: 3, requests: &[1000; 3], pods: &[Unready, Ready(2000), NoMetric], target: 50.0, kubernetes: 4, differs: Some((3, CAPPED)) },
    Case { name: "MissingMetricsHotCpuScaleUp", current: 3, requests: &[1000; 3], pods: &[Unready, Ready(2000), NoMetric], target: 50.0, kubernetes: 4, differs: Some((3, CAPPED)) },
    Case { name: "MissingMetricsUnreadyScaleDown", current: 4, requests: &[1000; 4], pods: &[Unready, Ready(100), Ready(100), NoMetric], target: 50.0, kubernetes: 3, differs: Some((4, MISSING_DOWN)) },
    Case { name: "DuringRollingUpdateWithMaxSurge", current: 2, requests: &[1000; 3], pods: &[Ready(100), Ready(100), NoMetric], target: 50.0, kubernetes: 2, differs: None },
    Case { name: "ComputedToleranceAlgImplementation (target 56)", current: 10, requests: &[400, 200, 310, 290, 302, 298, 301, 299, 300, 300], pods: &[Ready(150); 10], target: 56.0, kubernetes: 9, differs: None },
    Case { name: "ComputedToleranceAlgImplementation (target 55)", current: 10, requests: &[400, 200, 310, 290, 302, 298, 301, 299, 300, 300], pods: &[Ready(150); 10], target: 55.0, kubernetes: 10, differs: None },
    // Kubernetes returns an error for these three, and the HPA keeps its count; so does the
    // daemon, with `no-metrics`.
    Case { name: "DisjointResourcesMetrics (error)", current: 1, requests: &[1000], pods: &[NoMetric], target: 100.0, kubernetes: 1, differs: None },
    Case { name: "EmptyMetrics (error)", current: 4, requests: &[1000; 4], pods: &[NoMetric; 4], target: 100.0, kubernetes: 4, differs: None },
    Case { name: "EmptyCPURequest (error)", current: 1, requests: &[0], pods: &[Ready(200)], target: 100.0, kubernetes: 1, differs: None },
];

fn instance(i: usize, request: u64, pod: Pod) -> ObservedInstance {
    let (status, usage, since_start) = match pod {
        Ready(u) => (InstanceStatus::Running, Some(u), 3600),
        Hot(u) => (InstanceStatus::Running, Some(u), 0),
        Unready => (InstanceStatus::Stopped, None, 3600),
        NoMetric => (InstanceStatus::Running, None, 3600),
        Gone => (InstanceStatus::Error, None, 3600),
    };
    ObservedInstance {
        readiness: Default::default(),
        address: None,
        location: String::new(),
        name: format!("pod-{i}"),
        status,
        created_at: i as i64,
        since_start: Some(std::time::Duration::from_secs(since_start)),
        warm: false,
        protected: false,
        memory: usage.map(|u| Memory {
            usage: u << 20,
            limit: request << 20,
            oom_kills: None,
            ..Default::default()
        }),
    }
}

#[test]
fn kubernetes_conformance() {
    let mut wrong = Vec::new();
    for c in CASES {
        let s = GroupSpec {
            // No stabilization, no rate: the replica calculator alone.
            scale_down_stabilization: std::time::Duration::ZERO,
            max_scale_up_step: Some(1000),
            ..spec(1, 1000, c.target)
        };
        let obs = Observation {
            instances: c
                .pods
                .iter()
                .zip(c.requests.iter().cycle())
                .enumerate()
                .map(|(i, (p, r))| instance(i, *r, *p))
                .collect(),
            foreign: vec![],
            ..Default::default()
        };
        let mut h = History::default();
        let t0 = Instant::now();
        h.record(&s, t0, c.current, c.current, c.current);
        let plan = decide(&s, &obs, &mut h, t0 + std::time::Duration::from_secs(3600));
        let expected = c.differs.map_or(c.kubernetes, |(ours, _)| ours);
        if plan.desired != expected {
            wrong.push(format!(
                "{}: decided {} ({:?}), expected {expected}; Kubernetes decides {}{}",
                c.name,
                plan.desired,
                plan.reason,
                c.kubernetes,
                c.differs.map_or(String::new(), |(_, why)| format!(
                    ", the daemon differs: {why}"
                )),
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn hot_pods_count_for_memory_in_kubernetes_too() {
    // The CPU start-up rule aside, the hot rows are the plain rows: checked against the
    // formula by hand. ScaleUpHotCpuLessScale for memory: 3000 × 50 % → (300+500+700)/3000 =
    // 50 %, 50/30 × 3 = 5. ScaleHotCpuNoScale: 1600/3000 = 53.3 %, × 3 / 30 = 5.33 → 6.
    // ScaleDownIgnoreHotCpuPods: 1400/5000 = 28 %, × 5 / 50 = 2.8 → 3.
    let rows: Vec<_> = CASES
        .iter()
        .filter(|c| c.pods.iter().any(|p| matches!(p, Hot(_))))
        .map(|c| (c.name, c.differs.map(|d| d.0)))
        .collect();
    assert_eq!(
        rows,
        [
            ("ScaleUpHotCpuLessScale", Some(5)),
            ("ScaleHotCpuNoScale", Some(6)),
            ("ScaleDownIgnoreHotCpuPods", Some(3)),
            ("MissingMetricsHotCpuNoChange", None),
        ]
    );
}
