//! What one observe tick costs incusd, side by side, for N managed instances:
//! requests per tick and incusd CPU per tick (from /proc/PID/stat), for
//!   - `cgroup`: the daemon's default on a local incusd (one list request, cgroup files);
//!   - `api`:    one list request plus `GET /state` per running instance;
//!   - `lab`:    the seed lab's way: `recursion=2` list (state of every instance) plus `/state`
//!     per running instance.
//!
//! Needs a real Incus with the `busybox` image (scripts/setup-incus.sh); creates N instances
//! in a group `bench-tick` and deletes them at the end.
//! Run: `cargo bench --bench tick_cost -- 10 50` (sizes; default 10 50), `TICKS=5` to change
//! the ticks per measurement.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use incus_hpa::incus::client::{UnixClient, DEFAULT_SOCKET};
use incus_hpa::incus::Incus;
use incus_hpa::memory::{ApiSource, CgroupSource, MemorySource};
use incus_hpa::model::{GroupName, GroupSpec, GROUP_KEY};
use incus_hpa::observe::observe;

const GROUP: &str = "bench-tick";

/// incusd's user+system CPU time so far.
fn incusd_cpu() -> Duration {
    let tick = 100.0; // USER_HZ on Linux
    for entry in std::fs::read_dir("/proc").expect("/proc") {
        let path = entry.expect("entry").path();
        let comm = std::fs::read_to_string(path.join("comm")).unwrap_or_default();
        if comm.trim() == "incusd" {
            let stat = std::fs::read_to_string(path.join("stat")).expect("stat");
            let after = &stat[stat.rfind(')').expect("comm") + 2..];
            let f: Vec<&str> = after.split_whitespace().collect();
            let ticks: f64 =
                f[11].parse::<f64>().expect("utime") + f[12].parse::<f64>().expect("stime");
            return Duration::from_secs_f64(ticks / tick);
        }
    }
    panic!("no incusd process found");
}

fn spec() -> GroupSpec {
    GroupSpec {
        name: GroupName::parse(GROUP).expect("name"),
        min: 0,
        max: 1000,
        memory_threshold: 50.0,
        tolerance: 0.1,
        image: "busybox".into(),
        instance_prefix: format!("{GROUP}-"),
        profiles: vec!["default".into()],
        project: "default".into(),
        config: BTreeMap::from([("limits.memory".into(), "64MiB".into())]),
        scale_down_stabilization: Duration::from_secs(300),
        scale_up_stabilization: Duration::ZERO,
        max_scale_up_step: None,
        max_scale_down_step: None,
        stop_timeout: Duration::from_secs(1),
        unhealthy_grace: Duration::from_secs(300),
        restart_backoff: Duration::from_secs(10),
        interval: Duration::from_secs(1),
    }
}

async fn raw_get(http: &reqwest::Client, path: &str) {
    let r = http
        .get(format!("http://incus{path}"))
        .send()
        .await
        .expect("request");
    let _ = r.bytes().await.expect("body");
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let sizes: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let sizes = if sizes.is_empty() {
        vec![10, 50]
    } else {
        sizes
    };
    let ticks: u32 = std::env::var("TICKS")
        .ok()
        .and_then(|t| t.parse().ok())
        .unwrap_or(5);
    let socket = std::env::var("INCUS_SOCKET").unwrap_or_else(|_| DEFAULT_SOCKET.into());
    let client = Arc::new(UnixClient::new(&socket).expect("client"));
    let incus: Arc<dyn Incus> = client.clone();
    let http = reqwest::Client::builder()
        .unix_socket(socket.as_str())
        .build()
        .expect("http");
    let spec = spec();
    let cgroup = CgroupSource::system();
    let api = ApiSource::new(incus.clone());

    println!("| N | source | requests/tick | incusd CPU ms/tick | CPU vs cgroup | wall ms/tick |");
    println!("|---|---|---|---|---|---|");
    for n in sizes {
        // Bring the group to n running instances.
        let have = incus
            .list_by_config("default", GROUP_KEY, GROUP)
            .await
            .expect("list")
            .len();
        for _ in have..n {
            let name = incus_hpa::act::new_name(&spec.instance_prefix);
            let req = incus_hpa::act::create_request(&spec, &name, &incus_hpa::act::new_uuid());
            incus.create("default", &req).await.expect("create");
        }
        // Let the metrics cache and any start-up work settle out of the measurement.
        tokio::time::sleep(Duration::from_secs(10)).await;

        let mut results = Vec::new();
        for label in ["cgroup", "api", "lab"] {
            let req0 = client.requests();
            let cpu0 = incusd_cpu();
            let t0 = Instant::now();
            let mut lab_requests = 0;
            for _ in 0..ticks {
                match label {
                    "cgroup" => {
                        observe(incus.as_ref(), &cgroup as &dyn MemorySource, &spec)
                            .await
                            .expect("observe");
                    }
                    "api" => {
                        observe(incus.as_ref(), &api as &dyn MemorySource, &spec)
                            .await
                            .expect("observe");
                    }
                    _ => {
                        raw_get(&http, "/1.0/instances?recursion=2").await;
                        lab_requests += 1;
                        for i in incus
                            .list_by_config("default", GROUP_KEY, GROUP)
                            .await
                            .expect("list")
                        {
                            raw_get(&http, &format!("/1.0/instances/{}/state", i.name)).await;
                            lab_requests += 1;
                        }
                    }
                }
            }
            let wall = t0.elapsed() / ticks;
            let cpu = (incusd_cpu() - cpu0) / ticks;
            let mut requests = (client.requests() - req0) as f64 / f64::from(ticks);
            if label == "lab" {
                // Our own list call above is bookkeeping, not part of the lab's tick.
                requests = f64::from(lab_requests) / f64::from(ticks);
            }
            results.push((label, requests, cpu, wall));
        }
        // Below one clock tick (10 ms) incusd's CPU time reads as 0: no ratio then.
        let base = results[0].2.as_secs_f64();
        for (label, requests, cpu, wall) in results {
            let ratio = if base > 0.0 {
                format!("{:.0}×", cpu.as_secs_f64() / base)
            } else {
                "n/a".into()
            };
            println!(
                "| {n} | {label} | {requests:.0} | {:.0} | {ratio} | {:.0} |",
                cpu.as_secs_f64() * 1000.0,
                wall.as_secs_f64() * 1000.0
            );
        }
    }

    // Clean up every instance of the bench group.
    for i in incus
        .list_by_config("default", GROUP_KEY, GROUP)
        .await
        .expect("list")
    {
        if i.config.get(GROUP_KEY).map(String::as_str) == Some(GROUP) {
            let stop = incus_hpa::incus::StateChange::Stop {
                timeout: Duration::from_secs(10),
                force: true,
            };
            let _ = incus.change_state("default", &i.name, stop).await;
            let _ = incus.delete("default", &i.name).await;
        }
    }
}
