//! Where memory readings come from, behind one trait so that cheaper sources can be added. A
//! reading carries, where its source can tell, the instance's CPU time (a counter) and its
//! pressure (PSI): the cgroup files tell both, the API only the CPU time, from the answers
//! it already asks for.
//!
//! - [`CgroupSource`] reads the container's cgroup files on this host: no request to incusd at
//!   all, and the working set (usage minus inactive page cache, as the kubelet computes it),
//!   so an instance whose cache is full still scales down.
//! - [`ApiSource`] asks incusd, which works from anywhere but costs it ~40 ms of CPU per
//!   running instance it renders on 6.0. It reads either one `GET /1.0/metrics?project=P`
//!   (every running instance of the project in one request, the same working set as the
//!   cgroup files, see [`crate::incus::metrics`]; incusd caches it ~8 s) or one
//!   `GET /1.0/instances/NAME/state` per instance (only the group's, but page cache counts as
//!   used), whichever the pure [`plan`] finds cheaper from what the source last saw of the
//!   project's metrics. A metrics failure (423 while another request rebuilds them) and any
//!   instance the metrics lack fall back to `/state`.
//! - [`AutoSource`] uses the cgroup files and falls back to the API for each instance they miss.

mod api;
mod cgroup;
mod open_files;

use std::sync::Arc;

use async_trait::async_trait;

use crate::incus::Incus;
use crate::model::{Memory, MemorySourceKind, Wanted};
pub use api::{plan, ApiSource, LastMetrics, Plan};
pub use cgroup::CgroupSource;
pub use open_files::{max_open, MAX_OPEN_CEILING};

/// Reads memory for running instances. `None` for an instance means "unknown": the decision
/// core never scales down on it.
#[async_trait]
pub trait MemorySource: Send + Sync {
    async fn read(&self, project: &str, names: &[String]) -> Vec<Option<Memory>>;

    /// Like [`MemorySource::read`], knowing the cluster member each instance is on
    /// (`members[i]` for `names[i]`, empty when not clustered).
    async fn read_placed(
        &self,
        project: &str,
        names: &[String],
        members: &[String],
    ) -> Vec<Option<Memory>> {
        let _ = members;
        self.read(project, names).await
    }

    /// Like [`MemorySource::read_placed`], reading CPU time and pressure only as `wanted` asks
    /// (a source that reads them at no cost may fill them anyway).
    async fn read_wanted(
        &self,
        project: &str,
        names: &[String],
        members: &[String],
        wanted: Wanted,
    ) -> Vec<Option<Memory>> {
        let _ = wanted;
        self.read_placed(project, names, members).await
    }

    /// What one instance uses now, page cache included, when this source can tell it without a
    /// request to incusd (one cgroup file on this host): the watch between passes reads it
    /// every second ([`crate::reconciler::Reconciler::peek`]). `None` otherwise.
    fn usage(&self, project: &str, name: &str) -> Option<u64> {
        let _ = (project, name);
        None
    }

    /// One instance's reading, when this source can take it without a request to incusd: what
    /// the watch reads of an instance whose [`MemorySource::usage`] is near its limit. `None`
    /// otherwise.
    fn peek(&self, project: &str, name: &str) -> Option<Memory> {
        let _ = (project, name);
        None
    }
}

/// The cgroup files first, the API for the instances they do not cover.
pub struct AutoSource {
    cgroup: CgroupSource,
    api: ApiSource,
}

#[async_trait]
impl MemorySource for AutoSource {
    async fn read(&self, project: &str, names: &[String]) -> Vec<Option<Memory>> {
        self.read_placed(project, names, &vec![String::new(); names.len()])
            .await
    }

    async fn read_placed(
        &self,
        project: &str,
        names: &[String],
        members: &[String],
    ) -> Vec<Option<Memory>> {
        self.read_wanted(project, names, members, Wanted::ALL).await
    }

    async fn read_wanted(
        &self,
        project: &str,
        names: &[String],
        members: &[String],
        wanted: Wanted,
    ) -> Vec<Option<Memory>> {
        let out = self
            .cgroup
            .read_wanted(project, names, members, wanted)
            .await;
        // The members of the names the cgroup files lack, in the order `fill_missing` asks.
        let placed: Vec<String> = members
            .iter()
            .zip(&out)
            .filter(|(_, m)| m.is_none())
            .map(|(member, _)| member.clone())
            .collect();
        fill_missing(out, names, |missing| async move {
            self.api.read_placed(project, &missing, &placed).await
        })
        .await
    }

    fn usage(&self, project: &str, name: &str) -> Option<u64> {
        self.cgroup.usage(project, name)
    }

    fn peek(&self, project: &str, name: &str) -> Option<Memory> {
        self.cgroup.peek(project, name)
    }
}

/// Completes `out` (one slot per name) with what `fallback` reads for the names it lacks.
pub(crate) async fn fill_missing<F, Fut>(
    mut out: Vec<Option<Memory>>,
    names: &[String],
    fallback: F,
) -> Vec<Option<Memory>>
where
    F: FnOnce(Vec<String>) -> Fut,
    Fut: std::future::Future<Output = Vec<Option<Memory>>>,
{
    let missing: Vec<String> = names
        .iter()
        .zip(&out)
        .filter(|(_, m)| m.is_none())
        .map(|(n, _)| n.clone())
        .collect();
    if missing.is_empty() {
        return out;
    }
    let mut found = fallback(missing).await.into_iter();
    for slot in out.iter_mut().filter(|m| m.is_none()) {
        *slot = found.next().flatten();
    }
    out
}

/// Builds the source the configuration asks for.
pub fn source(kind: MemorySourceKind, incus: Arc<dyn Incus>) -> Arc<dyn MemorySource> {
    match kind {
        MemorySourceKind::Cgroup => Arc::new(CgroupSource::system()),
        MemorySourceKind::Api => Arc::new(ApiSource::new(incus)),
        MemorySourceKind::Auto => Arc::new(AutoSource {
            cgroup: CgroupSource::system(),
            api: ApiSource::new(incus),
        }),
    }
}
