//! The Grafana dashboard in `examples/` asks only for metrics and labels the daemon exports:
//! every `incus_hpa_*` name in its queries is a sample of the exposition, and every label it
//! selects on or groups by is one of that metric's labels.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use incus_hpa::control::Telemetry;

/// Sample names and their label names, from the classic text exposition of a daemon that has
/// recorded one of everything.
fn exported() -> BTreeMap<String, BTreeSet<String>> {
    let t = Telemetry::default();
    t.publish(crate::util::web_status());
    t.pass("web", "default", Duration::from_millis(30), Duration::ZERO);
    t.action("web", "default", "create", "ok", Duration::from_millis(300));
    t.error("web", "default");
    t.requests.count("GET", "/1.0/instances", Some(200));
    t.reconnects.inc();
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in incus_hpa::exposition::classic(&t.metrics()).lines() {
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let name_end = line.find(['{', ' ']).unwrap();
        let labels = out.entry(line[..name_end].to_owned()).or_default();
        if let Some(set) = line[name_end..].strip_prefix('{') {
            for pair in set.split('}').next().unwrap().split(',') {
                labels.insert(pair.split('=').next().unwrap().to_owned());
            }
        }
    }
    out
}

/// Every query of the dashboard: the panels' `expr` and the variables' `query`.
fn queries(v: &serde_json::Value, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, v) in m {
                match (k.as_str(), v) {
                    ("expr" | "definition", serde_json::Value::String(q)) => out.push(q.clone()),
                    _ => queries(v, out),
                }
            }
        }
        serde_json::Value::Array(a) => a.iter().for_each(|v| queries(v, out)),
        _ => {}
    }
}

/// The words of `s` made of `[a-z0-9_]`.
fn idents(s: &str) -> impl Iterator<Item = &str> {
    s.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| !w.is_empty())
}

#[test]
fn the_grafana_dashboard_uses_only_exported_metrics_and_labels() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/grafana-dashboard.json");
    let dashboard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let exported = exported();
    let mut qs = Vec::new();
    queries(&dashboard, &mut qs);
    assert!(qs.len() >= 5, "{qs:?}");
    let mut seen = BTreeSet::new();
    for q in &qs {
        let metrics: Vec<&str> = idents(q).filter(|w| w.starts_with("incus_hpa_")).collect();
        assert!(!metrics.is_empty(), "a query of no incus-hpa metric: {q}");
        let mut labels = BTreeSet::new();
        for m in &metrics {
            let Some(l) = exported.get(*m) else {
                panic!("{q}: {m} is not exported; exported: {:?}", exported.keys());
            };
            labels.extend(l.iter().cloned());
            seen.insert(m.to_string());
        }
        // Labels selected on (`{name=…}`), grouped by (`by (…)`) or read by label_values().
        let mut used = Vec::new();
        for sel in q.split('{').skip(1) {
            let body = sel.split('}').next().unwrap();
            used.extend(body.split(',').filter_map(|p| {
                let key = p.split(['=', '!']).next()?.trim();
                (!key.is_empty()).then_some(key.to_owned())
            }));
        }
        for clause in q
            .split("by (")
            .skip(1)
            .chain(q.split("label_values(").skip(1))
        {
            let inside = clause.split(')').next().unwrap();
            used.extend(
                idents(inside)
                    .filter(|w| !w.starts_with("incus_hpa_"))
                    .map(String::from),
            );
        }
        for l in used {
            assert!(
                l == "le" || labels.contains(&l),
                "{q}: no metric of it has the label {l:?} ({labels:?})"
            );
        }
    }
    // The dashboard shows what the issue asks: instances vs. desired vs. utilization.
    for m in [
        "incus_hpa_instances",
        "incus_hpa_utilization_percent",
        "incus_hpa_memory_threshold_percent",
    ] {
        assert!(seen.contains(m), "the dashboard does not show {m}");
    }
}
