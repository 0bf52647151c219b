//! What one observe tick costs, side by side, for N managed instances: requests per tick,
//! incusd CPU and the daemon's own CPU per tick, for
//!   - `lab`:      the seed lab's way: a `recursion=2` list (state of every instance) plus
//!     `/state` per running instance;
//!   - `list`:     incus-hpa 0.2's way: one filtered list per tick, memory from cgroup files;
//!   - `informer`: the default now: the informer's cache (listed once, kept by events), memory
//!     from cgroup files kept open (one `pread` each): no request at all;
//!   - `informer, files reopened`: the same with each file opened, read and closed at every
//!     tick (the way before they were kept open);
//!   - `pread only (the floor)`: no daemon at all, only the memory files a reading reads (three
//!     on cgroup v1, four on v2) of each instance read with `pread` on descriptors opened
//!     before, into one buffer, parsed not: what reading them costs at least on this machine;
//!   - `informer+signals`: the same for a group that also scales on CPU and pressure (its
//!     cgroup's `cpu.stat`, `cpu.pressure` and `memory.pressure` read too);
//!   - `informer+api`: the cache, memory over the API (`memory_source = "api"`).
//!
//! Needs a real Incus with the `busybox` image (scripts/setup-incus.sh); creates N instances in
//! a group `bench-tick` and deletes them at the end.
//! Run: `cargo bench --bench tick_cost -- 10 50 200` (sizes; default 10 50), `TICKS=5` for the
//! ticks of the expensive ways (the cheap ones run 50 times as many, for clock resolution);
//! `ONLY_CHEAP=1` leaves out the ways that have incusd render every instance (`lab`, `list`,
//! `informer+api`: at N = 1,000 a tick of `lab` alone costs incusd about 40 s).

#[path = "support/mod.rs"]
mod support;

use std::time::{Duration, Instant};

use incus_hpa::incus::Incus;
use incus_hpa::informer::Store;
use incus_hpa::memory::{ApiSource, CgroupSource, MemorySource};
use incus_hpa::observe::observe;
use support::*;

const GROUP: &str = "bench-tick";

async fn raw_get(http: &reqwest::Client, path: &str) {
    let r = http
        .get(format!("http://incus{path}"))
        .send()
        .await
        .expect("request");
    let _ = r.bytes().await.expect("body");
}

/// The memory files a reading reads of each running instance, opened once (cgroup v1 or v2,
/// wherever they are): the floor of what reading memory costs.
struct MemoryFiles {
    files: Vec<std::fs::File>,
    buf: std::cell::RefCell<Vec<u8>>,
}

impl MemoryFiles {
    fn open(members: &[(String, String)]) -> Self {
        let root = std::path::Path::new("/sys/fs/cgroup");
        let mut files = Vec::new();
        for (name, _) in members.iter().filter(|(_, s)| s == "Running") {
            let payload = format!("lxc.payload.{name}");
            let v1 = root.join("memory").join(&payload);
            let v2 = [root.join(&payload), root.join("unified").join(&payload)]
                .into_iter()
                .find(|d| d.join("memory.current").exists());
            let names: Vec<std::path::PathBuf> = if v1.join("memory.usage_in_bytes").exists() {
                // The limit in force is memory.stat's hierarchical_memory_limit.
                ["memory.usage_in_bytes", "memory.stat", "memory.oom_control"]
                    .iter()
                    .map(|f| v1.join(f))
                    .collect()
            } else if let Some(d) = v2 {
                [
                    "memory.current",
                    "memory.max",
                    "memory.stat",
                    "memory.events",
                ]
                .iter()
                .map(|f| d.join(f))
                .collect()
            } else {
                continue;
            };
            files.extend(names.iter().filter_map(|p| std::fs::File::open(p).ok()));
        }
        Self {
            files,
            buf: std::cell::RefCell::new(vec![0; 8192]),
        }
    }

    fn read(&self) {
        use std::os::unix::fs::FileExt;
        let mut buf = self.buf.borrow_mut();
        for f in &self.files {
            let _ = std::hint::black_box(f.read_at(&mut buf, 0));
        }
    }
}

struct Row {
    way: &'static str,
    requests: f64,
    incusd: Duration,
    daemon: Duration,
    wall: Duration,
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
    // The ways that have incusd render every instance (about 40 ms each) are left out.
    let only_cheap = std::env::var_os("ONLY_CHEAP").is_some();
    let _cleanup = Cleanup(GROUP.into());
    let client = client();
    let incus: std::sync::Arc<dyn Incus> = client.clone();
    let socket = std::env::var("INCUS_SOCKET")
        .unwrap_or_else(|_| incus_hpa::incus::client::DEFAULT_SOCKET.into());
    incus_hpa::incus::tls::provider();
    let http = reqwest::Client::builder()
        .unix_socket(socket.as_str())
        .build()
        .expect("http");
    let spec = spec(GROUP, "busybox");
    let signals = incus_hpa::model::GroupSpec {
        cpu_threshold: Some(50.0),
        pressure_threshold: Some(20.0),
        cpu_limit: Some(1.0),
        ..spec.clone()
    };
    let cgroup = CgroupSource::system();
    let reopening = CgroupSource::system_reopening();
    let api = ApiSource::new(incus.clone());
    let resync = Duration::from_secs(3600);

    println!(
        "| N | way | requests/tick | incusd CPU ms/tick | daemon CPU ms/tick | \
         (daemon+incusd) CPU ms per instance per tick | wall ms/tick |"
    );
    println!("|---|---|---|---|---|---|---|");
    for n in sizes {
        fill(incus.as_ref(), &spec, n).await;
        // Let incusd's metrics cache and start-up work settle out of the measurement.
        tokio::time::sleep(Duration::from_secs(10)).await;
        let store = Store::default();
        // No group here has checks: the board stays empty.
        let board = incus_hpa::ready::Board::default();
        // The informer lists once; what follows is steady ticks.
        store
            .list(
                incus.as_ref(),
                "default",
                tokio::time::Instant::now(),
                resync,
            )
            .await
            .expect("list");

        let floor = MemoryFiles::open(&members(incus.as_ref(), GROUP).await);
        let mut rows = Vec::new();
        for way in [
            "lab",
            "list",
            "informer",
            "informer, files reopened",
            "informer+signals",
            "informer+api",
            "pread only (the floor)",
        ] {
            let cheap =
                (way.starts_with("informer") && way != "informer+api") || way.starts_with("pread");
            if only_cheap && !cheap {
                continue;
            }
            let k = if cheap { ticks * 50 } else { ticks };
            let req0 = client.requests();
            let (cpu0, own0, t0) = (incusd_cpu(), own_cpu(), Instant::now());
            let mut lab_requests = 0u64;
            for _ in 0..k {
                match way {
                    "lab" => {
                        raw_get(&http, "/1.0/instances?recursion=2").await;
                        lab_requests += 1;
                        for (name, status) in members(incus.as_ref(), GROUP).await {
                            if status == "Running" {
                                raw_get(&http, &format!("/1.0/instances/{name}/state")).await;
                                lab_requests += 1;
                            }
                        }
                    }
                    "list" => {
                        let fresh = Store::default();
                        observe(incus.as_ref(), &cgroup, &fresh, &board, &spec, resync)
                            .await
                            .expect("observe");
                    }
                    "informer" => {
                        observe(incus.as_ref(), &cgroup, &store, &board, &spec, resync)
                            .await
                            .expect("observe");
                    }
                    "informer, files reopened" => {
                        observe(incus.as_ref(), &reopening, &store, &board, &spec, resync)
                            .await
                            .expect("observe");
                    }
                    "pread only (the floor)" => floor.read(),
                    "informer+signals" => {
                        observe(incus.as_ref(), &cgroup, &store, &board, &signals, resync)
                            .await
                            .expect("observe");
                    }
                    _ => {
                        observe(
                            incus.as_ref(),
                            &api as &dyn MemorySource,
                            &store,
                            &board,
                            &spec,
                            resync,
                        )
                        .await
                        .expect("observe");
                    }
                }
            }
            let (incusd, daemon, wall) = (
                (incusd_cpu() - cpu0) / k,
                (own_cpu() - own0) / k,
                t0.elapsed() / k,
            );
            let requests = if way == "lab" {
                // The bookkeeping list above is ours, not the lab's.
                lab_requests as f64 / f64::from(k)
            } else {
                (client.requests() - req0) as f64 / f64::from(k)
            };
            rows.push(Row {
                way,
                requests,
                incusd,
                daemon,
                wall,
            });
        }
        for r in rows {
            let ms = |d: Duration| d.as_secs_f64() * 1000.0;
            // The daemon's own CPU includes the client's work on the requests it sends.
            let per_instance = (ms(r.incusd) + ms(r.daemon)) / n as f64;
            println!(
                "| {n} | {} | {:.1} | {:.1} | {:.3} | {:.4} | {:.1} |",
                r.way,
                r.requests,
                ms(r.incusd),
                ms(r.daemon),
                per_instance,
                ms(r.wall)
            );
        }
    }
    empty(incus.as_ref(), GROUP).await;
}
