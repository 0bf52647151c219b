//! Memory from the Incus API: one `GET /1.0/metrics` for the whole project or one `/state`
//! per instance, whichever the pure [`plan`] finds cheaper from what was last seen. On a
//! cluster, where a member's metrics cover only its own instances, that choice is made per
//! member, and the metrics of a member are asked for with `&target=MEMBER`.
//!
//! The CPU time comes in the same answers (`incus_cpu_seconds_total`, `/state`'s
//! `cpu.usage`): it costs no request of its own. The API tells no pressure: `None`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;

use super::MemorySource;
use crate::incus::{Incus, IncusError};
use crate::model::Memory;

/// Memory from the Incus API: one `GET /1.0/metrics` for the whole project or one `/state`
/// per instance, whichever [`plan`] says is cheaper for this call.
pub struct ApiSource {
    incus: Arc<dyn Reads>,
    /// The last metrics answer per project and member: when, and how many instances it
    /// covered.
    seen: Mutex<HashMap<(String, String), (Instant, usize)>>,
}

/// The two requests [`ApiSource`] makes, apart from [`Incus`] so that its tests need not
/// implement the whole trait.
#[async_trait]
trait Reads: Send + Sync {
    async fn metrics(
        &self,
        project: &str,
        member: Option<&str>,
    ) -> Result<HashMap<String, Memory>, IncusError>;
    async fn state(&self, project: &str, name: &str) -> Result<Option<Memory>, IncusError>;
}

struct Through(Arc<dyn Incus>);

#[async_trait]
impl Reads for Through {
    async fn metrics(
        &self,
        project: &str,
        member: Option<&str>,
    ) -> Result<HashMap<String, Memory>, IncusError> {
        self.0.memory_metrics(project, member).await
    }
    async fn state(&self, project: &str, name: &str) -> Result<Option<Memory>, IncusError> {
        self.0.memory_state(project, name).await
    }
}

impl ApiSource {
    pub fn new(incus: Arc<dyn Incus>) -> Self {
        Self::with(Arc::new(Through(incus)))
    }

    fn with(incus: Arc<dyn Reads>) -> Self {
        Self {
            incus,
            seen: Mutex::new(HashMap::new()),
        }
    }

    /// What the source knows of `project`'s metrics on `member` as of `now`.
    fn last_metrics(&self, project: &str, member: &str, now: Instant) -> Option<LastMetrics> {
        let seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        let key = (project.to_owned(), member.to_owned());
        seen.get(&key).map(|&(at, instances)| LastMetrics {
            age: now.saturating_duration_since(at),
            instances,
        })
    }

    /// One `/state` per name, concurrently.
    async fn states(&self, project: &str, names: &[String]) -> Vec<Option<Memory>> {
        let reads = names.iter().map(|n| self.incus.state(project, n));
        futures_util::future::join_all(reads)
            .await
            .into_iter()
            .map(|r| r.ok().flatten())
            .collect()
    }
}

#[async_trait]
impl MemorySource for ApiSource {
    async fn read(&self, project: &str, names: &[String]) -> Vec<Option<Memory>> {
        self.read_member(project, "", names).await
    }

    async fn read_placed(
        &self,
        project: &str,
        names: &[String],
        members: &[String],
    ) -> Vec<Option<Memory>> {
        let mut by_member: Vec<(&str, Vec<usize>)> = Vec::new();
        for (i, m) in members.iter().enumerate().take(names.len()) {
            match by_member.iter_mut().find(|(k, _)| k == m) {
                Some((_, v)) => v.push(i),
                None => by_member.push((m, vec![i])),
            }
        }
        let reads = by_member.iter().map(|(member, idx)| {
            let wanted: Vec<String> = idx.iter().map(|&i| names[i].clone()).collect();
            async move { self.read_member(project, member, &wanted).await }
        });
        let mut out = vec![None; names.len()];
        for ((_, idx), got) in by_member
            .iter()
            .zip(futures_util::future::join_all(reads).await)
        {
            for (&i, m) in idx.iter().zip(got) {
                out[i] = m;
            }
        }
        out
    }
}

impl ApiSource {
    /// Reads `names`, all on cluster member `member` (empty: the member answering, or the
    /// only server).
    async fn read_member(
        &self,
        project: &str,
        member: &str,
        names: &[String],
    ) -> Vec<Option<Memory>> {
        let last = self.last_metrics(project, member, Instant::now());
        if plan(names.len(), last) == Plan::State {
            return self.states(project, names).await;
        }
        let target = (!member.is_empty()).then_some(member);
        let metrics = match self.incus.metrics(project, target).await {
            Ok(m) => m,
            // A member that does not answer (offline): its instances have no reading, and
            // asking each of them would only fail again, slowly.
            Err(e) if target.is_some() && !matches!(e, IncusError::Api { status: 423, .. }) => {
                tracing::debug!(project, member, error = %e, "metrics of member unavailable");
                return vec![None; names.len()];
            }
            Err(e) => {
                // 423 (another request is rebuilding them), an old or odd server: the
                // instances are still readable one by one.
                tracing::debug!(project, error = %e, "metrics unavailable, reading /state");
                return self.states(project, names).await;
            }
        };
        self.seen.lock().unwrap_or_else(|e| e.into_inner()).insert(
            (project.to_owned(), member.to_owned()),
            (Instant::now(), metrics.len()),
        );
        let out: Vec<Option<Memory>> = names.iter().map(|n| metrics.get(n).copied()).collect();
        // Not in the metrics: started after incusd cached them (up to 8 s), on another
        // cluster member, or unreadable to incusd. `/state` tells which, for those only.
        super::fill_missing(out, names, |missing| async move {
            self.states(project, &missing).await
        })
        .await
    }
}

/// How one [`ApiSource::read`] gets its readings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plan {
    /// One `GET /1.0/metrics?project=P`, then `/state` for the names it lacks.
    Metrics,
    /// One `GET /1.0/instances/NAME/state` per name.
    State,
}

/// What an [`ApiSource`] remembers of its last metrics answer for a project.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LastMetrics {
    /// How long ago it came.
    pub age: Duration,
    /// How many instances it covered: what a fresh render costs incusd.
    pub instances: usize,
}

/// Metrics read again within this time of the last answer are taken as served from incusd's
/// cache: it keeps them 8 s from the end of a render, but the last answer may itself have come
/// from a render a few seconds old. A warm read cost incusd 0.01–0.03× the `/state`s of 10
/// instances, 0.1–0.3× a single one (`benches/memory_cost.rs`, 10 and 50 running).
pub const METRICS_WARM: Duration = Duration::from_secs(4);

/// A cold render costs incusd about what a `/state` does per running instance of the project
/// (`benches/memory_cost.rs`, medians of three runs: 0.92–1.04× the 50 `/state`s for 50 of 50
/// running, 1.1–1.8× the 10 `/state`s for 10 of 10, 5.3–5.5× for 10 of 50). So it is chosen
/// cold only when the project runs at most this many instances per instance wanted: about
/// the same CPU, one request instead of many, and the working set instead of usage.
pub const METRICS_SHARE: usize = 1;

/// Picks how to read `wanted` instances of a project, given what is known of its metrics.
/// Pure, so that the rule is tested on its own:
/// - nothing wanted: no request at all;
/// - metrics read less than [`METRICS_WARM`] ago: metrics again, incusd answers from its cache
///   at almost no cost, one request instead of `wanted`;
/// - metrics never read: metrics if more than one instance is wanted (one request instead of
///   several, and it tells how large the project is), `/state` for a single one;
/// - otherwise metrics if the project's last count of running instances is at most
///   [`METRICS_SHARE`] × `wanted`: the render costs about what the `/state`s would. A count
///   that has grown since is learnt at the next metrics read; one that has shrunk is not
///   (the source keeps reading `/state`, today's cost).
pub fn plan(wanted: usize, last: Option<LastMetrics>) -> Plan {
    match last {
        _ if wanted == 0 => Plan::State,
        Some(l) if l.age < METRICS_WARM => Plan::Metrics,
        None if wanted > 1 => Plan::Metrics,
        None => Plan::State,
        Some(l) if l.instances <= METRICS_SHARE.saturating_mul(wanted) => Plan::Metrics,
        Some(_) => Plan::State,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::incus::CreateInstance;

    fn seen(age_secs: u64, instances: usize) -> Option<LastMetrics> {
        Some(LastMetrics {
            age: Duration::from_secs(age_secs),
            instances,
        })
    }

    #[test]
    fn plan_reads_nothing_for_nothing() {
        assert_eq!(plan(0, None), Plan::State);
        assert_eq!(plan(0, seen(0, 10)), Plan::State);
    }

    #[test]
    fn plan_uses_warm_metrics_whatever_the_share() {
        assert_eq!(plan(1, seen(0, 500)), Plan::Metrics);
        assert_eq!(
            plan(
                1,
                Some(LastMetrics {
                    age: METRICS_WARM - Duration::from_millis(1),
                    instances: 500
                })
            ),
            Plan::Metrics
        );
        assert_eq!(
            plan(
                1,
                Some(LastMetrics {
                    age: METRICS_WARM,
                    instances: 500
                })
            ),
            Plan::State
        );
    }

    #[test]
    fn plan_probes_an_unknown_project_only_for_several_instances() {
        assert_eq!(plan(1, None), Plan::State);
        assert_eq!(plan(2, None), Plan::Metrics);
        assert_eq!(plan(50, None), Plan::Metrics);
    }

    #[test]
    fn plan_renders_the_project_cold_only_when_the_group_is_a_large_share() {
        let share = METRICS_SHARE;
        // The whole project is the group.
        assert_eq!(plan(10, seen(15, 10)), Plan::Metrics);
        // The project at the largest size it pays to render for 10 instances, and one more.
        assert_eq!(plan(10, seen(15, 10 * share)), Plan::Metrics);
        assert_eq!(plan(10, seen(15, 10 * share + 1)), Plan::State);
        // A small group in a large project.
        assert_eq!(plan(2, seen(60, 50)), Plan::State);
        assert_eq!(plan(1, seen(60, 1)), Plan::Metrics);
        // No instances left running in the project: nothing to render.
        assert_eq!(plan(3, seen(60, 0)), Plan::Metrics);
    }

    /// Answers the source's reads, and records them.
    struct Fake {
        /// The metrics answer, or the HTTP status it fails with.
        metrics: Result<HashMap<String, Memory>, u16>,
        state: HashMap<String, Memory>,
        calls: Mutex<Vec<String>>,
    }

    /// `usage` MiB of 64, and `usage` s of CPU time.
    fn mib(usage: u64) -> Memory {
        Memory {
            usage: usage << 20,
            limit: 64 << 20,
            oom_kills: None,
            cpu_ns: Some(usage * 1_000_000_000),
            pressure: None,
        }
    }

    impl Fake {
        /// Metrics read `a`, `b`, `c` and `d` at 1–4 MiB; `/state` reads them at 11–14 MiB.
        fn new(metrics: Result<&[&str], u16>) -> Arc<Self> {
            let all = ["a", "b", "c", "d"];
            let at = |base: u64| {
                move |names: &[&str]| -> HashMap<String, Memory> {
                    names
                        .iter()
                        .map(|n| {
                            let i = all.iter().position(|a| a == n).unwrap() as u64;
                            (n.to_string(), mib(base + i + 1))
                        })
                        .collect()
                }
            };
            Arc::new(Self {
                metrics: metrics.map(|m| at(0)(m)),
                state: at(10)(&all),
                calls: Mutex::new(Vec::new()),
            })
        }

        fn calls(&self) -> Vec<String> {
            std::mem::take(&mut *self.calls.lock().unwrap())
        }
    }

    #[async_trait]
    impl Reads for Fake {
        async fn state(&self, _: &str, name: &str) -> Result<Option<Memory>, IncusError> {
            self.calls.lock().unwrap().push(format!("state {name}"));
            Ok(self.state.get(name).copied())
        }
        async fn metrics(
            &self,
            _: &str,
            member: Option<&str>,
        ) -> Result<HashMap<String, Memory>, IncusError> {
            self.calls.lock().unwrap().push(match member {
                Some(m) => format!("metrics {m}"),
                None => "metrics".into(),
            });
            self.metrics.clone().map_err(|status| IncusError::Api {
                what: "metrics".into(),
                status,
                message: "Metrics are currently being built by another request".into(),
            })
        }
    }

    fn names(n: &[&str]) -> Vec<String> {
        n.iter().map(|s| s.to_string()).collect()
    }

    #[tokio::test]
    async fn several_instances_are_read_in_one_metrics_request_then_from_the_cache() {
        let incus = Fake::new(Ok(&["a", "b", "c", "d"]));
        let api = ApiSource::with(incus.clone());
        let read = api.read("default", &names(&["a", "b"])).await;
        assert_eq!(read, vec![Some(mib(1)), Some(mib(2))]);
        assert_eq!(incus.calls(), ["metrics"]);
        // Right after, even a single instance comes from the (warm) metrics.
        assert_eq!(
            api.read("default", &names(&["c"])).await,
            vec![Some(mib(3))]
        );
        assert_eq!(incus.calls(), ["metrics"]);
        // Another project knows nothing yet: one instance is read by /state.
        assert_eq!(api.read("other", &names(&["d"])).await, vec![Some(mib(14))]);
        assert_eq!(incus.calls(), ["state d"]);
        assert_eq!(api.read("default", &[]).await, vec![]);
        assert!(incus.calls().is_empty());
    }

    #[tokio::test]
    async fn a_refused_metrics_request_falls_back_to_state() {
        let incus = Fake::new(Err(423));
        let api = ApiSource::with(incus.clone());
        let read = api.read("default", &names(&["a", "b", "x"])).await;
        assert_eq!(read, vec![Some(mib(11)), Some(mib(12)), None]);
        assert_eq!(incus.calls(), ["metrics", "state a", "state b", "state x"]);
        // Nothing learnt: the next read tries metrics again.
        api.read("default", &names(&["a", "b"])).await;
        assert_eq!(incus.calls(), ["metrics", "state a", "state b"]);
    }

    #[tokio::test]
    async fn instances_missing_from_the_metrics_are_read_by_state() {
        let incus = Fake::new(Ok(&["a", "c"]));
        let api = ApiSource::with(incus.clone());
        let read = api.read("default", &names(&["a", "b", "c", "x"])).await;
        assert_eq!(read, vec![Some(mib(1)), Some(mib(12)), Some(mib(3)), None]);
        assert_eq!(incus.calls(), ["metrics", "state b", "state x"]);
        // The CPU time came with the memory, from either answer: no request of its own.
        let cpu: Vec<_> = read.iter().map(|m| m.and_then(|m| m.cpu_ns)).collect();
        assert_eq!(
            cpu,
            [
                Some(1_000_000_000),
                Some(12_000_000_000),
                Some(3_000_000_000),
                None
            ]
        );
    }

    #[tokio::test]
    async fn a_small_group_of_a_large_project_is_read_by_state_once_the_cache_is_cold() {
        let incus = Fake::new(Ok(&["a", "b", "c", "d"]));
        let api = ApiSource::with(incus.clone());
        let long_ago = Instant::now()
            .checked_sub(Duration::from_secs(60))
            .unwrap_or_else(Instant::now);
        let learnt = |instances| {
            api.seen
                .lock()
                .unwrap()
                .insert(("default".into(), String::new()), (long_ago, instances))
        };
        learnt(4 * METRICS_SHARE + 1);
        api.read("default", &names(&["a", "b", "c", "d"])).await;
        assert_eq!(incus.calls(), ["state a", "state b", "state c", "state d"]);
        learnt(4 * METRICS_SHARE);
        api.read("default", &names(&["a", "b", "c", "d"])).await;
        assert_eq!(incus.calls(), ["metrics"]);
    }

    /// A real instance, force-deleted when the test ends, however it ends.
    struct Scratch(String);

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::process::Command::new("incus")
                .args(["delete", "--force", &self.0])
                .status();
        }
    }

    #[tokio::test]
    #[ignore = "needs a real Incus (scripts/test.sh runs it)"]
    async fn metrics_and_state_agree_on_a_real_instance() {
        use crate::incus::client::{UnixClient, DEFAULT_SOCKET};
        use crate::incus::ImageSource;
        let client = Arc::new(UnixClient::new(DEFAULT_SOCKET).unwrap());
        client
            .server_version()
            .await
            .expect("a real Incus on the default socket");
        let name = format!("mem-it-{:06x}", fastrand::u32(..0x100_0000));
        let _scratch = Scratch(name.clone());
        client
            .create(
                "default",
                &CreateInstance {
                    name: name.clone(),
                    kind: "container".into(),
                    source: ImageSource::local("busybox"),
                    config: HashMap::from([("limits.memory".into(), "64MiB".into())]),
                    profiles: vec!["default".into()],
                    start: true,
                    target: None,
                },
            )
            .await
            .expect("a busybox instance (scripts/setup-incus.sh imports the image)");
        let dd = "mount -t tmpfs -o size=60m tmpfs /dev/shm; \
                  dd if=/dev/zero of=/dev/shm/f bs=1M count=20";
        let out = std::process::Command::new("incus")
            .args(["exec", &name, "--", "sh", "-c", dd])
            .output()
            .expect("incus exec");
        assert!(out.status.success(), "{out:?}");
        // Past incusd's metrics cache, so that they were rendered after the dd.
        tokio::time::sleep(Duration::from_secs(9)).await;
        let metrics = client.memory_metrics("default", None).await.unwrap();
        let state = client.memory_state("default", &name).await.unwrap();
        let (m, st) = (metrics[&name], state.expect("a /state reading"));
        assert_eq!(m.limit, 64 << 20, "{m:?}");
        assert_eq!(st.limit, 64 << 20, "{st:?}");
        // tmpfs is shmem, not inactive file cache: both count the 20 MiB.
        assert!(m.usage >= 20 << 20, "{m:?}");
        assert!(m.usage.abs_diff(st.usage) <= 4 << 20, "{m:?} {st:?}");
        // The source: two unknown instances, so one metrics request; the missing one is
        // read by /state, which does not find it.
        let api = ApiSource::new(client.clone());
        let ghost = format!("{name}-ghost");
        let read = api.read("default", &[name.clone(), ghost]).await;
        let first = read[0].expect("a reading");
        assert!(first.usage.abs_diff(m.usage) <= 4 << 20, "{read:?}");
        assert_eq!(read[1], None);
    }
}
