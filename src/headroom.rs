//! Host headroom, the reading half (`[daemon] host_reserve`): the hosts' memory, gathered into
//! the [`Observation`] for a pass that would add instances. The cap itself is the decision's
//! (`crate::decide`, pure).
//!
//! - **When**: only when the plan adds instances, so that a steady pass still sends no
//!   request. The pass decides once without the figures; when that plan creates, starts or
//!   promotes anything, it reads the hosts here and decides again, from the history as it was
//!   before the first decision (see `crate::reconciler`). Deciding twice is cheap and pure;
//!   guessing beforehand whether a pass will add (from the previous plan, or the count) would
//!   miss the first pass of a scale-up.
//! - **What**: with Incus on the local socket, the local `/proc/meminfo` (`MemAvailable`, no
//!   request); over HTTPS, `GET /1.0/resources` (total − used). On a cluster (`GET
//!   /1.0/cluster`, then its members), `GET /1.0/resources?target=MEMBER` for each online
//!   member a new instance may go to (the group's `target`: a member, a cluster group, or
//!   all) and each member an instance to start is on. `host_reserve` as a percentage is of
//!   each host's own total.
//! - **One reading per host per round**: the passes that start within a second of each other
//!   share a [`Round`] (see `crate::reconciler`): each host (and the member list) is read once
//!   for all of them, and what a group's pass planned on a host is taken off what the next
//!   group sees there, so two groups never both take the last room of a host.
//! - **A host that cannot be read** is warned about and not checked (see `crate::decide`'s
//!   headroom rules); when nothing can be read, additions are not capped this pass.

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;

use crate::incus::{ClusterMember, HostMemory, Incus};
use crate::model::{
    Action, GroupSpec, Headroom, HeadroomCheck, HostReserve, HostRoom, Observation, Plan,
};

/// What the passes of one round share: the reserve, the readings, and what each pass planned
/// on each host.
pub struct Round {
    reserve: HostReserve,
    state: Mutex<Shared>,
}

#[derive(Default)]
struct Shared {
    /// The cluster's members (empty: a single server), once read.
    members: Option<Vec<ClusterMember>>,
    /// Each host read (`""`: the single server).
    readings: HashMap<String, HostMemory>,
    /// What passes of this round planned on each host, bytes.
    claimed: HashMap<String, u64>,
}

impl Round {
    /// A round that keeps `reserve` on each host.
    pub fn new(reserve: HostReserve) -> Self {
        Self {
            reserve,
            state: Mutex::new(Shared::default()),
        }
    }

    fn with<T>(&self, f: impl FnOnce(&mut Shared) -> T) -> T {
        f(&mut self.state.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// The figures of the hosts `plan`'s additions could go to; `None` when the plan adds
    /// nothing, or nothing could be read.
    pub async fn read(
        &self,
        incus: &dyn Incus,
        spec: &GroupSpec,
        obs: &Observation,
        plan: &Plan,
    ) -> Option<Headroom> {
        if !plan.actions.iter().any(Action::adds) {
            return None;
        }
        let group = spec.name.as_str();
        let members = match self.with(|s| s.members.clone()) {
            Some(m) => m,
            None => match incus.cluster_members().await {
                Ok(m) => {
                    self.with(|s| s.members = Some(m.clone()));
                    m
                }
                Err(e) => {
                    tracing::warn!(group, error = %e,
                        "{group}: cannot tell whether Incus is a cluster ({e}): additions are \
                         not checked against host_reserve this pass");
                    return None;
                }
            },
        };
        // (member, placeable), in order.
        let wanted: Vec<(String, bool)> = if members.is_empty() {
            vec![(String::new(), true)]
        } else {
            let starting: BTreeSet<&str> = plan
                .actions
                .iter()
                .filter_map(|a| match a {
                    Action::Start { name, .. } | Action::Promote { name, .. } => Some(name),
                    _ => None,
                })
                .filter_map(|n| obs.instances.iter().find(|i| &i.name == n))
                .map(|i| i.location.as_str())
                .collect();
            let creates = plan
                .actions
                .iter()
                .any(|a| matches!(a, Action::Create { .. } | Action::CreateWarm { .. }));
            members
                .iter()
                .filter(|m| m.is_online())
                .map(|m| {
                    let name = m.server_name.as_str();
                    let allowed = match spec.target.as_deref() {
                        None => true,
                        Some(t) => match t.strip_prefix('@') {
                            Some(g) => m.groups.iter().any(|x| x == g),
                            None => t == name,
                        },
                    };
                    (name.to_owned(), creates && allowed)
                })
                .filter(|(name, placeable)| *placeable || starting.contains(name.as_str()))
                .collect()
        };
        let unread: Vec<&str> = self.with(|s| {
            wanted
                .iter()
                .map(|(m, _)| m.as_str())
                .filter(|m| !s.readings.contains_key(*m))
                .collect()
        });
        let reads = unread.iter().map(|m| async move {
            let member = (!m.is_empty()).then_some(*m);
            (*m, incus.host_memory(member).await)
        });
        for (m, result) in futures_util::future::join_all(reads).await {
            match result {
                Ok(r) => self.with(|s| s.readings.insert(m.to_owned(), r)),
                Err(e) => {
                    let host = if m.is_empty() {
                        "the host".to_owned()
                    } else {
                        format!("cluster member {m}")
                    };
                    tracing::warn!(group, member = m, error = %e,
                        "{group}: cannot read the memory of {host} ({e}): what would go there \
                         is not checked against host_reserve this pass");
                    None
                }
            };
        }
        let hosts: Vec<HostRoom> = self.with(|s| {
            wanted
                .iter()
                .filter_map(|(m, placeable)| {
                    let r = s.readings.get(m)?;
                    let claimed = s.claimed.get(m).copied().unwrap_or(0);
                    Some(HostRoom {
                        member: m.clone(),
                        available: r.available.saturating_sub(claimed),
                        reserve: self.reserve.of(r.total),
                        placeable: *placeable,
                    })
                })
                .collect()
        });
        let clustered = !members.is_empty();
        (!hosts.is_empty()).then_some(Headroom { hosts, clustered })
    }

    /// Takes what `check` let through off what the next passes of the round see.
    pub fn claim(&self, check: &HeadroomCheck) {
        self.with(|s| {
            for (m, b) in &check.claimed {
                let c = s.claimed.entry(m.clone()).or_default();
                *c = c.saturating_add(*b);
            }
        });
    }
}

/// The journal line of a pass that held additions back (one per pass): what was available,
/// what was needed, and where the expected use comes from.
pub fn report(spec: &GroupSpec, check: &HeadroomCheck) {
    let group = spec.name.as_str();
    tracing::warn!(
        group,
        reason = "host-headroom",
        held = check.held,
        expected_use = check.per_instance,
        "{group}: {check}"
    );
}
