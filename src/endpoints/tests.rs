//! The set computation and the JSON a command reads, byte for byte.

use std::collections::BTreeSet;

use super::*;
use crate::decide::tests::{spec, unmeasured};
use crate::model::{EndpointsSpec, InstanceStatus, Readiness};

fn with_endpoints() -> GroupSpec {
    let mut s = spec(1, 5, 70.0);
    s.endpoints = Some(EndpointsSpec {
        port: 80,
        command: vec!["/bin/true".into()],
        timeout: EndpointsSpec::TIMEOUT,
        deregistration_delay: EndpointsSpec::DEREGISTRATION_DELAY,
    });
    s
}

fn at(created: i64, address: &str, readiness: Readiness) -> ObservedInstance {
    let mut i = unmeasured(InstanceStatus::Running, created);
    i.address = Some(address.parse().unwrap());
    i.readiness = readiness;
    i
}

#[test]
fn the_set_is_the_instances_in_service_with_an_address_not_leaving() {
    let s = with_endpoints();
    let mut stopped = at(5, "10.0.0.5", Readiness::Unchecked);
    stopped.status = InstanceStatus::Stopped;
    let mut no_address = at(6, "10.0.0.6", Readiness::Ready);
    no_address.address = None;
    let mut warm = at(7, "10.0.0.7", Readiness::Unchecked);
    warm.warm = true;
    let instances = vec![
        at(3, "10.0.0.3", Readiness::Ready),
        at(1, "fd42::1", Readiness::Unchecked),
        at(2, "10.0.0.2", Readiness::Starting { why: String::new() }),
        at(4, "10.0.0.4", Readiness::NotReady { why: "503".into() }),
        stopped,
        no_address,
        warm,
        at(8, "10.0.0.8", Readiness::Ready),
    ];
    let leaving: BTreeSet<String> = ["web-8".to_owned()].into();
    let found = set(&s, &instances, &leaving);
    let names: Vec<&str> = found.iter().map(|e| e.instance.as_str()).collect();
    assert_eq!(names, ["web-1", "web-3"], "sorted by name");
    assert_eq!(found[0].address, "fd42::1", "no brackets");
    assert_eq!(found[1].port, 80);
    // No endpoints table: nothing.
    assert!(set(&spec(1, 5, 70.0), &instances, &BTreeSet::new()).is_empty());
}

#[test]
fn a_frozen_instance_stays_while_its_checks_have_it_ready() {
    let s = with_endpoints();
    let frozen = |created, address, readiness| {
        let mut i = at(created, address, readiness);
        i.status = InstanceStatus::Frozen;
        i
    };
    let instances = vec![
        // Checked and ready when frozen (an `incus copy` of it under way): still in service.
        frozen(1, "10.0.0.1", Readiness::Ready),
        // Its checks took it out meanwhile.
        frozen(
            2,
            "10.0.0.2",
            Readiness::NotReady {
                why: "frozen".into(),
            },
        ),
        // Not ready yet when frozen.
        frozen(3, "10.0.0.3", Readiness::Starting { why: String::new() }),
        // A group without checks: a frozen instance is out.
        frozen(4, "10.0.0.4", Readiness::Unchecked),
    ];
    let found = set(&s, &instances, &BTreeSet::new());
    let names: Vec<&str> = found.iter().map(|e| e.instance.as_str()).collect();
    assert_eq!(names, ["web-1"]);
}

#[test]
fn the_document_is_exactly_the_documented_json() {
    let endpoints = vec![
        Endpoint {
            instance: "web-3kd9x2".into(),
            address: "10.98.0.12".into(),
            port: 80,
        },
        Endpoint {
            instance: "web-a".into(),
            address: "fd42::7".into(),
            port: 80,
        },
    ];
    assert_eq!(
        document("web", "default", &endpoints),
        "{\"group\":\"web\",\"project\":\"default\",\"endpoints\":[\
         {\"instance\":\"web-3kd9x2\",\"address\":\"10.98.0.12\",\"port\":80},\
         {\"instance\":\"web-a\",\"address\":\"fd42::7\",\"port\":80}]}\n"
    );
    assert_eq!(
        document("web", "p", &[]),
        "{\"group\":\"web\",\"project\":\"p\",\"endpoints\":[]}\n"
    );
}
