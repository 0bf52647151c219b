//! Observe: Incus → [`Observation`] for one group, in one list request plus the memory source.
//!
//! Only instances whose `user.incus-hpa.group` is exactly the group's name are returned: the
//! server-side filter is a case-insensitive regex, so the value is checked again here.

use crate::incus::{Incus, IncusError, Instance};
use crate::memory::MemorySource;
use crate::model::{GroupSpec, InstanceStatus, Observation, ObservedInstance, GROUP_KEY};

/// True when `inst` was created by incus-hpa for `group`.
pub fn is_managed_by(inst: &Instance, group: &str) -> bool {
    inst.config.get(GROUP_KEY).map(String::as_str) == Some(group)
}

/// Lists the group's managed instances and reads the memory of the running ones.
pub async fn observe(
    incus: &dyn Incus,
    memory: &dyn MemorySource,
    spec: &GroupSpec,
) -> Result<Observation, IncusError> {
    let group = spec.name.as_str();
    let mut listed = incus
        .list_by_config(&spec.project, GROUP_KEY, group)
        .await?;
    listed.retain(|i| is_managed_by(i, group));
    let running: Vec<String> = listed
        .iter()
        .filter(|i| i.status() == InstanceStatus::Running)
        .map(|i| i.name.clone())
        .collect();
    let mut readings = memory.read(&spec.project, &running).await.into_iter();
    let instances = listed
        .into_iter()
        .map(|i| {
            let status = i.status();
            let memory = if status == InstanceStatus::Running {
                readings.next().flatten()
            } else {
                None
            };
            ObservedInstance {
                created_at: i.created_nanos(),
                name: i.name,
                status,
                memory,
            }
        })
        .collect();
    Ok(Observation { instances })
}
