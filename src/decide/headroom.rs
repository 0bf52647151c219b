//! The host check (`[daemon] host_reserve`), pure: given the hosts' memory in the
//! observation, which of a plan's additions fit, and on a cluster where each new instance goes.
//!
//! - **What is counted**: every addition (creation, start, promotion, warm-pool creation) is
//!   expected to use the mean working set of the group's measured instances, else the group's
//!   `limits.memory`, else 0 (and the journal line says so). An addition fits a host when
//!   `available − reserve − what this pass already put there ≥ expected use`; removals free
//!   nothing here (they run after the additions, and a stopping instance gives its memory back
//!   late).
//! - **Where**: a start or a promotion is checked on the host its instance is on; a creation,
//!   on a single server, on the server; on a cluster, on the member with room for it that holds
//!   the fewest of the group's instances (then the most room, then by name) among those the
//!   group's `target` allows, and that member becomes the creation's target.
//! - **What does not fit is held back**, below `min` too, and said in the [`HeadroomCheck`];
//!   the plan's reason becomes `host-headroom`. A host that could not be read is not checked:
//!   a start there goes ahead, and a cluster with no member read places as without the check.
//! - Without figures (`Observation::headroom` is `None`: nothing to add, or nothing read),
//!   nothing is capped.

use std::collections::BTreeMap;

use crate::model::size::bytes;
use crate::model::{Action, ExpectedUse, GroupSpec, HeadroomCheck, Observation};

/// What one new instance of the group is expected to use, bytes, and from what.
pub fn expected_use(spec: &GroupSpec, obs: &Observation) -> (u64, ExpectedUse) {
    let readings: Vec<u64> = obs
        .instances
        .iter()
        .filter_map(|i| i.memory)
        .map(|m| m.usage)
        .collect();
    if !readings.is_empty() {
        let sum: u128 = readings.iter().map(|u| u128::from(*u)).sum();
        let mean = sum / readings.len() as u128;
        return (
            u64::try_from(mean).unwrap_or(u64::MAX),
            ExpectedUse::Measured(readings.len()),
        );
    }
    match spec.config.get("limits.memory").and_then(|v| bytes(v)) {
        Some(limit) if limit > 0 => (limit, ExpectedUse::Limit),
        _ => (0, ExpectedUse::Unknown),
    }
}

/// Caps `actions` to what the hosts of `obs.headroom` can hold, in their order (what restores
/// service comes first), and places the creations on a cluster. `healthy` is how many of the
/// group's instances serve now: with the admitted additions below `spec.min`, the check says
/// the group stays below it. `None` when the hosts were not read or nothing is added.
pub fn cap(
    spec: &GroupSpec,
    obs: &Observation,
    actions: Vec<Action>,
    healthy: u32,
) -> (Vec<Action>, Option<HeadroomCheck>) {
    let Some(headroom) = &obs.headroom else {
        return (actions, None);
    };
    if !actions.iter().any(Action::adds) {
        return (actions, None);
    }
    let (per, basis) = expected_use(spec, obs);
    // What is left above the reserve on each host read (negative: below it already).
    let mut left: BTreeMap<&str, i128> = headroom
        .hosts
        .iter()
        .map(|h| {
            (
                h.member.as_str(),
                i128::from(h.available) - i128::from(h.reserve),
            )
        })
        .collect();
    let placeable: Vec<&str> = headroom
        .hosts
        .iter()
        .filter(|h| h.placeable)
        .map(|h| h.member.as_str())
        .collect();
    let mut load: BTreeMap<&str, usize> = BTreeMap::new();
    for i in obs.instances.iter().filter(|i| !i.warm) {
        *load.entry(i.location.as_str()).or_default() += 1;
    }
    let location = |name: &str| {
        obs.instances
            .iter()
            .find(|i| i.name == name)
            .map_or("", |i| i.location.as_str())
    };
    let need = i128::from(per);
    let mut claimed: BTreeMap<String, u64> = BTreeMap::new();
    let (mut admitted, mut held, mut serving, mut short) = (0u32, 0u32, 0u32, 0u32);
    let mut out = Vec::with_capacity(actions.len());
    for action in actions {
        // Where it goes: `Some(member)` to check and claim there, `None` to let it through
        // unchecked; `Err` when it does not fit.
        let at: Result<Option<&str>, ()> = match &action {
            Action::Remove { .. } => {
                out.push(action);
                continue;
            }
            Action::Start { name, .. } | Action::Promote { name, .. } => {
                let m = location(name);
                match left.get(m) {
                    Some(l) if *l >= need => Ok(Some(m)),
                    Some(_) => Err(()),
                    None => Ok(None),
                }
            }
            Action::Create { .. } | Action::CreateWarm { .. } if !headroom.clustered => {
                match left.get("") {
                    Some(l) if *l >= need => Ok(Some("")),
                    Some(_) => Err(()),
                    None => Ok(None),
                }
            }
            Action::Create { .. } | Action::CreateWarm { .. } => {
                let best = placeable
                    .iter()
                    .copied()
                    .filter(|m| left.get(m).is_some_and(|l| *l >= need))
                    .min_by_key(|m| {
                        (
                            load.get(m).copied().unwrap_or(0),
                            std::cmp::Reverse(left.get(m).copied().unwrap_or(0)),
                            *m,
                        )
                    });
                match best {
                    Some(m) => Ok(Some(m)),
                    None if placeable.is_empty() => Ok(None),
                    None => Err(()),
                }
            }
        };
        let service = !matches!(action, Action::CreateWarm { .. });
        match at {
            Err(()) => {
                held += 1;
                short += u32::from(service);
                continue;
            }
            Ok(Some(m)) => {
                *left.entry(m).or_default() -= need;
                *load.entry(m).or_default() += 1;
                *claimed.entry(m.to_owned()).or_default() += per;
            }
            Ok(None) => {}
        }
        admitted += 1;
        serving += u32::from(service);
        out.push(place(
            action,
            at.ok().flatten().filter(|_| headroom.clustered),
        ));
    }
    let below_min = (short > 0 && healthy + serving < spec.min).then_some(spec.min);
    let check = HeadroomCheck {
        per_instance: per,
        basis,
        admitted,
        held,
        claimed: claimed.into_iter().collect(),
        hosts: headroom.hosts.clone(),
        below_min,
    };
    (out, Some(check))
}

/// `action` with its creation targeted at `member`, when one was chosen for it.
fn place(action: Action, member: Option<&str>) -> Action {
    let target = member.map(str::to_owned);
    match action {
        Action::Create { cause, .. } if target.is_some() => Action::Create { cause, target },
        Action::CreateWarm { .. } if target.is_some() => Action::CreateWarm { target },
        a => a,
    }
}
