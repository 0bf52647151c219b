//! The addresses of a group with endpoints but no checks: every [`super::ADDRESS_PERIOD`],
//! each running instance of the group whose address is not known for its start yet has it
//! read (once per start, as the prober reads a checked instance's), and the board says it is
//! unchecked, at that address.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;

use tokio::sync::watch;
use tokio::time::{sleep_until, Instant};

use super::{Board, Seen, ADDRESS_PERIOD, ADDRESS_WAIT};
use crate::decide::{ownership, Ownership};
use crate::incus::Incus;
use crate::informer::Store;
use crate::model::{GroupSpec, Readiness};

/// Reads the addresses of the group's running instances until the sender is dropped.
pub(super) async fn follow(
    incus: Arc<dyn Incus>,
    store: Arc<Store>,
    board: Arc<Board>,
    mut spec: watch::Receiver<GroupSpec>,
) {
    // Per instance: the start its address is for, and the address.
    let mut known: HashMap<String, (String, IpAddr)> = HashMap::new();
    let mut next = Instant::now();
    loop {
        tokio::select! {
            _ = sleep_until(next) => {}
            changed = spec.changed() => {
                if changed.is_err() {
                    return;
                }
                spec.borrow_and_update();
                known.clear();
                continue;
            }
        }
        let group = spec.borrow_and_update().clone();
        round(incus.as_ref(), &store, &board, &group, &mut known).await;
        next = (next + ADDRESS_PERIOD).max(Instant::now());
    }
}

/// One look at the group's running instances.
async fn round(
    incus: &dyn Incus,
    store: &Store,
    board: &Board,
    spec: &GroupSpec,
    known: &mut HashMap<String, (String, IpAddr)>,
) {
    let (project, group) = (spec.project.as_str(), spec.name.as_str());
    let Some(listed) =
        store.group_instances(project, group, Instant::now(), std::time::Duration::MAX)
    else {
        return;
    };
    let running: Vec<_> = listed
        .into_iter()
        .filter(|i| i.status().is_healthy())
        .filter(|i| ownership(group, project, &i.name, &i.config) == Ownership::Owned)
        .collect();
    known.retain(|name, _| running.iter().any(|i| &i.name == name));
    board.retain_instances(project, group, |name| known.contains_key(name));
    for i in running {
        let start = i.last_used_at.clone();
        if known.get(&i.name).is_some_and(|(s, _)| *s == start) {
            continue;
        }
        let read = incus.addresses(project, &i.name, spec.interface());
        let Ok(Ok(addresses)) = tokio::time::timeout(ADDRESS_WAIT, read).await else {
            continue;
        };
        let Some(address) = addresses.first().copied() else {
            continue;
        };
        known.insert(i.name.clone(), (start.clone(), address));
        let seen = Seen {
            start,
            readiness: Readiness::Unchecked,
            address: Some(address),
        };
        board.set(project, group, &i.name, seen);
    }
}
