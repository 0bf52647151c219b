//! What the benchmarks share: CPU clocks (incusd's and this process's), creating and removing
//! a group of busybox instances the way the daemon would, and a guard that removes them even
//! when a benchmark panics.

#![allow(dead_code)]

mod incusd;

use std::sync::Arc;
use std::time::Duration;

use futures_util::stream::{self, StreamExt};
use incus_hpa::incus::client::{UnixClient, DEFAULT_SOCKET};
use incus_hpa::incus::{Incus, StateChange};
use incus_hpa::model::{GroupSpec, GROUP_KEY};

/// The CPU time (user + system) incusd has used so far: all its threads, and the helpers it
/// forks and reaps (`incusd forknet …` renders each instance's state: most of the cost).
pub fn incusd_cpu() -> Duration {
    let pid = incusd_pid();
    cpu_of(&pid, true)
}

/// The CPU time (user + system) process `pid` has used so far, with the children it has reaped
/// when `children`.
pub fn cpu_of(pid: &str, children: bool) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("a process's stat");
    let after = &stat[stat.rfind(')').expect("comm") + 2..];
    let f: Vec<&str> = after.split_whitespace().collect();
    // utime, stime, then cutime, cstime
    let last = if children { 14 } else { 12 };
    let ticks: f64 = f[11..=last]
        .iter()
        .map(|v| v.parse::<f64>().expect("a CPU time"))
        .sum();
    Duration::from_secs_f64(ticks / 100.0) // USER_HZ
}

/// incusd itself, not one of its `incusd fork…` helpers.
pub fn incusd_pid() -> String {
    incusd::incusd_pid().expect("no incusd process found: run scripts/setup-incus.sh")
}

/// This process's CPU time, to the nanosecond.
pub fn own_cpu() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

/// The median of some measurements.
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

pub fn client() -> Arc<UnixClient> {
    let socket = std::env::var("INCUS_SOCKET").unwrap_or_else(|_| DEFAULT_SOCKET.into());
    Arc::new(UnixClient::new(&socket).expect("client"))
}

/// A group as the benchmarks configure it: busybox, 64 MiB, 1 s interval, written as a
/// desired-state file would (the parser fills in every default).
pub fn spec(group: &str, image: &str) -> GroupSpec {
    let text = format!(
        "[daemon]\ninterval = \"1s\"\n\n[groups.{group}]\nmin = 0\nmax = 1000\n\
         memory_threshold = 50\nimage = {image:?}\nstop_timeout = \"1s\"\n\n\
         [groups.{group}.config]\n\"limits.memory\" = \"64MiB\"\n"
    );
    let loaded = incus_hpa::config::parse(std::path::Path::new("bench"), &text).expect("spec");
    loaded.state.groups.into_values().next().expect("the group")
}

/// The group's instances, as Incus lists them (exact key).
pub async fn members(incus: &dyn Incus, group: &str) -> Vec<(String, String)> {
    incus
        .list_by_config("default", GROUP_KEY, group)
        .await
        .expect("list")
        .into_iter()
        .filter(|i| i.config.get(GROUP_KEY).map(String::as_str) == Some(group))
        .map(|i| (i.name, i.status))
        .collect()
}

/// Creates instances for the group, as the daemon would (owned), until it has `n`, 4 at a time.
pub async fn fill(incus: &dyn Incus, spec: &GroupSpec, n: usize) {
    let have = members(incus, spec.name.as_str()).await.len();
    stream::iter(have..n)
        .for_each_concurrent(4, |_| async {
            let name = incus_hpa::act::new_name(&spec.instance_prefix);
            let req =
                incus_hpa::act::create_request(spec, &name, &incus_hpa::act::new_uuid(), false);
            incus.create("default", &req).await.expect("create");
        })
        .await;
}

/// Forgets what the last daemon learned of `group` (the summary a stopped daemon leaves in
/// Incus for the next holder of the group's lease): a run that starts after it starts from
/// nothing, as the first did.
pub fn forget_learned(group: &str) {
    let _ = std::process::Command::new("incus")
        .args([
            "profile",
            "unset",
            incus_hpa::incus::LEARNED_PROFILE,
            &incus_hpa::lease::learned::key("default", group),
        ])
        .output();
}

/// Stops and deletes every instance of the group, 8 at a time, and forgets what the last
/// daemon learned of it ([`forget_learned`]).
pub async fn empty(incus: &dyn Incus, group: &str) {
    forget_learned(group);
    let names: Vec<String> = members(incus, group)
        .await
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    stream::iter(names)
        .for_each_concurrent(8, |name| async move {
            let stop = StateChange::Stop {
                timeout: Duration::from_secs(10),
                force: true,
            };
            let _ = incus.change_state("default", &name, stop).await;
            let _ = incus.delete("default", &name).await;
        })
        .await;
}

/// Removes every instance of `group` when dropped (with the CLI: it may run while unwinding).
pub struct Cleanup(pub String);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let out = std::process::Command::new("incus")
            .args(["list", "-f", "csv", "-c", "n"])
            .output();
        let Ok(out) = out else { return };
        let prefix = format!("{}-", self.0);
        for name in String::from_utf8_lossy(&out.stdout).lines() {
            if name.starts_with(&prefix) {
                let _ = std::process::Command::new("incus")
                    .args(["delete", "--force", name])
                    .output();
            }
        }
    }
}
