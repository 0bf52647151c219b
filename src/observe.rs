//! Observe: the informer's cache (or, when it is stale, one list request) and the memory
//! source → [`Observation`] for one group.
//!
//! Each instance with the group's key is checked with [`ownership`]: only the instances the
//! daemon created for the group are returned as the group's, and only its healthy ones are
//! measured. Instances carrying the key that the daemon did not create (copies, renames,
//! moves, imports) are listed as foreign. A steady pass, with memory from the cgroup files,
//! sends no request to incusd.
//!
//! A group with a `ready` table gets its running (and frozen) instances' readiness and address
//! from the prober's [`Board`] (an instance not checked since its start yet is starting); the
//! others' instances, and instances that do not run, are [`Readiness::Unchecked`].
//!
//! On a cluster, an instance whose member does not answer cannot be measured, and no event
//! says so: a pass that finds one (unreachable, or running without a reading) has the project
//! listed again at the next pass, which is where Incus tells which members are away.

use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use crate::decide::{owner_value, ownership, Ownership};
use crate::incus::{Incus, IncusError, Instance};
use crate::informer::Store;
use crate::memory::MemorySource;
use crate::model::{
    Foreign, GroupSpec, InstanceStatus, Observation, ObservedInstance, Readiness, Wanted,
    PROTECTED_KEY, UUID_KEY, WARM_KEY,
};
use crate::ready::Board;

/// True when `inst` is one the daemon created for the group `spec`.
pub fn is_owned(inst: &Instance, spec: &GroupSpec) -> bool {
    ownership(spec.name.as_str(), &spec.project, &inst.name, &inst.config) == Ownership::Owned
}

/// What `board` says of a running (or frozen) instance of a group with checks, for the start
/// it is at: its readiness and address; starting, no address, when nothing was found of that
/// start yet. Unchecked for the other instances.
pub fn readiness(
    board: &Board,
    spec: &GroupSpec,
    inst: &Instance,
) -> (Readiness, Option<std::net::IpAddr>) {
    let checked_frozen = inst.status() == InstanceStatus::Frozen && spec.ready.is_some();
    if !inst.status().is_healthy() && !checked_frozen {
        return (Readiness::Unchecked, None);
    }
    if spec.ready.is_none() {
        // A group with endpoints has its instances' addresses read, not checked.
        let address = spec
            .endpoints
            .as_ref()
            .and_then(|_| board.get(&spec.project, spec.name.as_str(), &inst.name))
            .filter(|seen| seen.start == inst.last_used_at)
            .and_then(|seen| seen.address);
        return (Readiness::Unchecked, address);
    }
    match board.get(&spec.project, spec.name.as_str(), &inst.name) {
        Some(seen) if seen.start == inst.last_used_at => (seen.readiness, seen.address),
        _ => (Readiness::Starting { why: String::new() }, None),
    }
}

/// Lists the group's instances (from `store` while it is fresh, see [`Store::list`]), reads
/// the memory of the healthy ones and, for a group with checks, their readiness on `board`.
pub async fn observe(
    incus: &dyn Incus,
    memory: &dyn MemorySource,
    store: &Store,
    board: &Board,
    spec: &GroupSpec,
    resync: Duration,
) -> Result<Observation, IncusError> {
    let group = spec.name.as_str();
    let listed = store
        .list_group(incus, &spec.project, group, Instant::now(), resync)
        .await?;
    let now = SystemTime::now();
    let mut owned = Vec::new();
    let mut foreign = Vec::new();
    for i in listed {
        match ownership(group, &spec.project, &i.name, &i.config) {
            Ownership::Owned => owned.push(i),
            Ownership::Foreign(why) => foreign.push(Foreign {
                adopt: owner_value(
                    &spec.project,
                    &i.name,
                    i.config.get(UUID_KEY).map_or("", String::as_str),
                ),
                name: i.name.clone(),
                why,
            }),
            Ownership::NotInGroup => {}
        }
    }
    let (healthy, members): (Vec<String>, Vec<String>) = owned
        .iter()
        .filter(|i| i.status().is_healthy())
        .map(|i| (i.name.clone(), i.member().to_owned()))
        .unzip();
    let mut readings = memory
        .read_wanted(
            &spec.project,
            &healthy,
            &members,
            Wanted {
                cpu: spec.cpu_threshold.is_some(),
                pressure: spec.pressure_threshold.is_some(),
            },
        )
        .await
        .into_iter();
    let instances = owned
        .into_iter()
        .map(|i| {
            let status = i.status();
            let memory = if status.is_healthy() {
                readings.next().flatten()
            } else {
                None
            };
            let (readiness, address) = readiness(board, spec, &i);
            ObservedInstance {
                readiness,
                address,
                warm: i.config.get(WARM_KEY).is_some_and(|v| v == "true"),
                protected: i.config.get(PROTECTED_KEY).is_some_and(|v| v == "true"),
                created_at: i.created_nanos(),
                since_start: i.since_start(now),
                location: i.member().to_owned(),
                name: i.name.clone(),
                status,
                memory,
            }
        })
        .collect::<Vec<ObservedInstance>>();
    let in_doubt = instances.iter().any(|i| {
        !i.location.is_empty()
            && (i.status == InstanceStatus::Unreachable
                || (i.status.is_healthy() && i.memory.is_none()))
    });
    if in_doubt {
        store.invalidate(&spec.project);
    }
    Ok(Observation {
        instances,
        foreign,
        ..Default::default()
    })
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::model::{Probe, ReadySpec};
    use crate::ready::Seen;

    fn instance(status: &str, started: &str) -> Instance {
        Instance {
            name: "web-a".into(),
            status: status.into(),
            config: HashMap::new(),
            created_at: String::new(),
            last_used_at: started.into(),
            project: "default".into(),
            location: String::new(),
            unreachable: false,
        }
    }

    #[test]
    fn readiness_is_the_board_s_for_the_instance_s_start() {
        let mut spec = crate::decide::tests::spec(1, 3, 50.0);
        let board = Board::default();
        let running = instance("Running", "2026-12-03T10:00:00Z");
        // No checks: unchecked, whatever the board says.
        assert_eq!(
            readiness(&board, &spec, &running),
            (Readiness::Unchecked, None)
        );
        spec.ready = Some(ReadySpec::with_probe(Probe::Tcp { port: 80 }));
        // Not checked yet.
        let starting = Readiness::Starting { why: String::new() };
        assert_eq!(readiness(&board, &spec, &running), (starting.clone(), None));
        let ip: std::net::IpAddr = "10.1.2.3".parse().unwrap();
        board.set(
            "default",
            "web",
            "web-a",
            Seen {
                start: "2026-12-03T10:00:00Z".into(),
                readiness: Readiness::Ready,
                address: Some(ip),
            },
        );
        assert_eq!(
            readiness(&board, &spec, &running),
            (Readiness::Ready, Some(ip))
        );
        // Started again since it was checked: starting again.
        let again = instance("Running", "2026-12-03T10:05:00Z");
        assert_eq!(readiness(&board, &spec, &again), (starting, None));
        // Frozen (an `incus copy` of it under way): what its checks found stands.
        let frozen = instance("Frozen", "2026-12-03T10:00:00Z");
        assert_eq!(
            readiness(&board, &spec, &frozen),
            (Readiness::Ready, Some(ip))
        );
        // Not running: unchecked.
        let stopped = instance("Stopped", "2026-12-03T10:00:00Z");
        assert_eq!(
            readiness(&board, &spec, &stopped),
            (Readiness::Unchecked, None)
        );
        // Frozen in a group without checks: unchecked.
        spec.ready = None;
        assert_eq!(
            readiness(&board, &spec, &frozen),
            (Readiness::Unchecked, None)
        );
    }
}
