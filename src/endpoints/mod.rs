//! Endpoints: the set of a group's instances that may take requests, as a load balancer is
//! told of it (`[groups.NAME.endpoints]`), and the [`Publisher`] that runs the group's command
//! with the set on its standard input.
//!
//! An endpoint is an instance of the group that is in service (running, and ready or without
//! a `ready` table; or frozen while its checks have not yet taken it out of service), has an
//! address on the group's interface, and is not leaving (being removed). [`set`] computes it
//! from what a pass observed; [`document`] writes the JSON the command reads, byte for byte:
//! `{"group":"web","project":"default","endpoints":[{"instance":"web-3kd9x2","address":"10.98.0.12","port":80}]}`.

pub mod publisher;

pub use publisher::Publisher;

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::model::{GroupSpec, InstanceStatus, ObservedInstance, Readiness};

/// One instance as the load balancer is told of it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Endpoint {
    pub instance: String,
    /// Its address on the group's interface, IPv6 without brackets.
    pub address: String,
    pub port: u16,
}

/// What `status --json` says of a group's endpoints.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EndpointsStatus {
    /// The set the command last took (exit 0), as in its JSON; empty before.
    pub published: Vec<Endpoint>,
    /// The command is due, running, or waiting to be retried: the set to publish is not the
    /// published one (or a start or reload asks for it again).
    pub pending: bool,
    /// Why the last run failed, while it has not succeeded since; `null` otherwise.
    pub error: Option<String>,
}

/// The group's endpoints among `instances` (sorted by instance name), leaving out those in
/// `leaving`. Empty when the group has no `endpoints` table.
pub fn set(
    spec: &GroupSpec,
    instances: &[ObservedInstance],
    leaving: &BTreeSet<String>,
) -> Vec<Endpoint> {
    let Some(e) = &spec.endpoints else {
        return Vec::new();
    };
    let mut set: Vec<Endpoint> = instances
        .iter()
        .filter(|i| in_service(i) && !i.warm)
        .filter(|i| !leaving.contains(&i.name))
        .filter_map(|i| {
            Some(Endpoint {
                instance: i.name.clone(),
                address: i.address?.to_string(),
                port: e.port,
            })
        })
        .collect();
    set.sort();
    set
}

/// Running and ready (or without checks), or frozen and still ready: an `incus copy` or
/// snapshot freezes its source for a moment, and the prober counts each check of a frozen
/// instance as failed, so a freeze shorter than `failures` checks leaves it in service and a
/// longer one takes it out, as any failing check does. Without checks, a frozen instance is out.
pub fn in_service(i: &ObservedInstance) -> bool {
    match i.status {
        InstanceStatus::Frozen => i.readiness == Readiness::Ready,
        s => s.is_healthy() && i.readiness.serves(),
    }
}

/// The JSON the command reads on its standard input, on one line with a final newline.
pub fn document(group: &str, project: &str, endpoints: &[Endpoint]) -> String {
    #[derive(Serialize)]
    struct Document<'a> {
        group: &'a str,
        project: &'a str,
        endpoints: &'a [Endpoint],
    }
    let mut text = serde_json::to_string(&Document {
        group,
        project,
        endpoints,
    })
    .unwrap_or_default();
    text.push('\n');
    text
}

#[cfg(test)]
mod tests;
