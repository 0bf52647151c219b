//! What reading memory through the Incus API costs incusd, side by side in one run, to choose
//! between its two ways (`ApiSource` in src/memory.rs):
//!   - `state`:        one `GET /1.0/instances/NAME/state` per instance of the group;
//!   - `metrics cold`: one `GET /1.0/metrics?project=default`, the first after more than 10 s
//!     without one, so incusd renders every running instance of the project;
//!   - `metrics warm`: the same again within incusd's 8 s cache.
//!
//! For each size N it reports requests, incusd CPU and wall time per read, each the median of
//! `REPEAT` (5) measures, and their ratios to `state`. incusd CPU comes from /proc/PID/stat of
//! the main incusd (the `incusd` whose second argument does not start with `fork`): `self` is
//! its utime+stime, `+forks` adds the cutime+cstime of the helpers it forks and reaps
//! (`incusd forknet …`), which is where most of a render's CPU goes. `M` is the number of
//! running instances in the project (what a metrics render covers). After the sizes, each
//! smaller N is measured again as a group among the largest size's running instances
//! ("10 of 50"). Finally it prints what `memory::plan` picks for each row.
//!
//! Needs a real Incus with the `busybox` image (scripts/setup-incus.sh); creates instances with
//! `limits.memory=64MiB` named `bmc-XXXXXX-N` in the default project and deletes them at the
//! end, also when the bench panics. Other running instances of the default project count in
//! `M`; anyone else reading metrics meanwhile warms the cache (hence the medians).
//! Run: `cargo bench --bench memory_cost -- 10 50` (sizes; default 10 50); `REPEAT=7` for
//! more measures, `WARM_READS=20` for more warm reads per measure (default 10).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use incus_hpa::incus::client::{UnixClient, DEFAULT_SOCKET};
use incus_hpa::incus::{CreateInstance, ImageSource, Incus, StateChange};
use incus_hpa::memory::{plan, LastMetrics};

const PROJECT: &str = "default";
/// incusd keeps metrics 8 s; wait this long after the last metrics request for a cold one.
const COLD_AFTER: Duration = Duration::from_secs(10);

/// The bench's instances, deleted when it ends, however it ends.
struct Instances {
    socket: String,
    names: Vec<String>,
}

impl Drop for Instances {
    fn drop(&mut self) {
        let names = std::mem::take(&mut self.names);
        if names.is_empty() {
            return;
        }
        eprintln!("deleting {} bench instances", names.len());
        let socket = self.socket.clone();
        // Drop may run while the bench's own runtime unwinds: clean up from a runtime of its own.
        let done = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async {
                let c = UnixClient::new(&socket).expect("client");
                // incusd may be restarting (a fault test next door): give it a minute.
                for _ in 0..60 {
                    if c.server_version().await.is_ok() {
                        break;
                    }
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                let stop = StateChange::Stop {
                    timeout: Duration::from_secs(1),
                    force: true,
                };
                let c = &c;
                let gone = names.iter().map(|n| async move {
                    let _ = c.change_state(PROJECT, n, stop).await;
                    if let Err(e) = c.delete(PROJECT, n).await {
                        if !e.is_not_found() {
                            eprintln!("could not delete {n}: {e}");
                        }
                    }
                });
                futures_util::future::join_all(gone).await;
            });
        })
        .join();
        if done.is_err() {
            eprintln!("cleanup panicked: delete the `bmc-` instances by hand");
        }
    }
}

/// The main incusd's pid and CPU so far: (its own utime+stime, its reaped children's
/// cutime+cstime).
fn incusd_cpu() -> (String, Duration, Duration) {
    let tick = 100.0; // USER_HZ on Linux
    for entry in std::fs::read_dir("/proc").expect("/proc") {
        let path = entry.expect("entry").path();
        let comm = std::fs::read_to_string(path.join("comm")).unwrap_or_default();
        if comm.trim() != "incusd" {
            continue;
        }
        let cmdline = std::fs::read(path.join("cmdline")).unwrap_or_default();
        let second = cmdline.split(|b| *b == 0).nth(1).unwrap_or_default();
        if second.starts_with(b"fork") {
            continue;
        }
        let stat = std::fs::read_to_string(path.join("stat")).expect("stat");
        let after = &stat[stat.rfind(')').expect("comm") + 2..];
        let f: Vec<f64> = after
            .split_whitespace()
            .map(|x| x.parse().unwrap_or(0.0))
            .collect();
        let secs = |a: usize, b: usize| Duration::from_secs_f64((f[a] + f[b]) / tick);
        let pid = path
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        return (pid, secs(11, 12), secs(13, 14));
    }
    panic!("no incusd process found");
}

/// One measure: requests, incusd CPU (self, +forks) and wall time, all per read.
#[derive(Debug, Clone, Copy, Default)]
struct Cost {
    requests: f64,
    cpu_self: f64,
    cpu_all: f64,
    wall: f64,
}

/// Runs `f` and returns what it cost, divided by `reads`; `None` when incusd restarted
/// meanwhile.
async fn measure<F: std::future::Future<Output = ()>>(
    client: &UnixClient,
    reads: u32,
    f: F,
) -> Option<Cost> {
    let r0 = client.requests();
    let (p0, s0, c0) = incusd_cpu();
    let t0 = Instant::now();
    f.await;
    let wall = t0.elapsed();
    let (p1, s1, c1) = incusd_cpu();
    if p0 != p1 || s1 < s0 || c1 < c0 {
        eprintln!("incusd restarted during a measure; not counted");
        return None;
    }
    let n = f64::from(reads);
    Some(Cost {
        requests: (client.requests() - r0) as f64 / n,
        cpu_self: (s1 - s0).as_secs_f64() * 1000.0 / n,
        cpu_all: ((s1 - s0) + (c1 - c0)).as_secs_f64() * 1000.0 / n,
        wall: wall.as_secs_f64() * 1000.0 / n,
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

fn median_cost(v: &[Cost]) -> Cost {
    Cost {
        requests: median(v.iter().map(|c| c.requests).collect()),
        cpu_self: median(v.iter().map(|c| c.cpu_self).collect()),
        cpu_all: median(v.iter().map(|c| c.cpu_all).collect()),
        wall: median(v.iter().map(|c| c.wall).collect()),
    }
}

/// The medians for one group of `n` among `m` running instances.
struct Row {
    n: usize,
    m: usize,
    state: Cost,
    cold: Cost,
    warm: Cost,
    /// Measures whose metrics lacked one of the group's instances.
    incomplete: usize,
    /// Cold reads answered 423 or otherwise failed.
    failed: usize,
}

struct Bench {
    client: Arc<UnixClient>,
    repeat: usize,
    warm_reads: u32,
    last_metrics: Instant,
}

impl Bench {
    async fn metrics_ok(&self, group: &[String]) -> Result<(usize, bool), String> {
        let m = self
            .client
            .memory_metrics(PROJECT, None)
            .await
            .map_err(|e| e.to_string())?;
        Ok((m.len(), group.iter().all(|n| m.contains_key(n))))
    }

    async fn row(&mut self, group: &[String]) -> Row {
        let (mut state, mut cold, mut warm) = (Vec::new(), Vec::new(), Vec::new());
        let (mut m, mut incomplete, mut failed) = (Vec::new(), 0, 0);
        for _ in 0..self.repeat {
            // (b) cold: the first metrics request after more than 8 s without one.
            let idle = self.last_metrics.elapsed();
            if idle < COLD_AFTER {
                tokio::time::sleep(COLD_AFTER - idle).await;
            }
            let mut seen = None;
            let cost = measure(&self.client, 1, async {
                seen = Some(self.metrics_ok(group).await);
            })
            .await;
            let cold_at = Instant::now();
            match seen.expect("measured") {
                Ok((count, all)) => {
                    m.push(count as f64);
                    incomplete += usize::from(!all);
                    cold.extend(cost);
                }
                Err(e) => {
                    eprintln!("cold metrics failed: {e}");
                    failed += 1;
                }
            }
            // (c) warm: again, within the cache's 8 s.
            let reads = self.warm_reads;
            let cost = measure(&self.client, reads, async {
                for _ in 0..reads {
                    if let Err(e) = self.metrics_ok(group).await {
                        eprintln!("warm metrics failed: {e}");
                    }
                }
            })
            .await;
            if cold_at.elapsed() < Duration::from_secs(7) {
                warm.extend(cost);
            } else {
                eprintln!("warm reads took too long to stay in the cache; not counted");
            }
            self.last_metrics = Instant::now();
            // (a) one /state per instance of the group, concurrently as ApiSource does.
            let client = &self.client;
            let mut ok = true;
            let cost = measure(client, 1, async {
                let reads = group.iter().map(|n| client.memory_state(PROJECT, n));
                for r in futures_util::future::join_all(reads).await {
                    if let Err(e) = r {
                        eprintln!("state failed: {e}");
                        ok = false;
                    }
                }
            })
            .await;
            if ok {
                state.extend(cost);
            }
        }
        let show = |v: &[Cost]| {
            v.iter()
                .map(|c| format!("{:.0}", c.cpu_all))
                .collect::<Vec<_>>()
                .join(" ")
        };
        eprintln!(
            "  {} of {:?}: CPU ms +forks per read: state [{}] cold [{}] warm [{}]",
            group.len(),
            m,
            show(&state),
            show(&cold),
            show(&warm)
        );
        Row {
            n: group.len(),
            m: median(m).round() as usize,
            state: median_cost(&state),
            cold: median_cost(&cold),
            warm: median_cost(&warm),
            incomplete,
            failed,
        }
    }
}

fn ratio(x: f64, base: f64) -> String {
    if base > 0.0 {
        format!("{:.2}×", x / base)
    } else {
        "n/a".into()
    }
}

fn print(rows: &[Row]) {
    println!();
    println!(
        "| group N of M running | read | requests/read | incusd CPU ms/read self | +forks | \
         CPU vs state (+forks) | CPU ms per rendered instance (+forks) | wall ms/read | wall vs state |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for r in rows {
        for (label, c, rendered) in [
            ("state", r.state, r.n),
            ("metrics cold", r.cold, r.m),
            ("metrics warm", r.warm, 0),
        ] {
            let per = if rendered > 0 {
                format!("{:.1}", c.cpu_all / rendered as f64)
            } else {
                "—".into()
            };
            println!(
                "| {} of {} | {label} | {:.0} | {:.1} | {:.1} | {} | {per} | {:.1} | {} |",
                r.n,
                r.m,
                c.requests,
                c.cpu_self,
                c.cpu_all,
                ratio(c.cpu_all, r.state.cpu_all),
                c.wall,
                ratio(c.wall, r.state.wall),
            );
        }
        if r.incomplete + r.failed > 0 {
            println!(
                "|  | ({} measures lacked an instance, {} cold reads failed) | | | | | | | |",
                r.incomplete, r.failed
            );
        }
    }
    println!();
    println!("What `memory::plan` picks (instances known from the last metrics answer):");
    println!();
    println!("| group N of M running | metrics read < 4 s ago | metrics read longer ago | never |");
    println!("|---|---|---|---|");
    for r in rows {
        let at = |age| {
            plan(
                r.n,
                Some(LastMetrics {
                    age,
                    instances: r.m,
                }),
            )
        };
        println!(
            "| {} of {} | {:?} | {:?} | {:?} |",
            r.n,
            r.m,
            at(Duration::from_secs(1)),
            at(Duration::from_secs(15)),
            plan(r.n, None),
        );
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let mut sizes: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .filter(|n| *n > 0)
        .collect();
    if sizes.is_empty() {
        sizes = vec![10, 50];
    }
    sizes.sort_unstable();
    sizes.dedup();
    let env = |k: &str, d: usize| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .filter(|v| *v > 0)
            .unwrap_or(d)
    };
    let socket = std::env::var("INCUS_SOCKET").unwrap_or_else(|_| DEFAULT_SOCKET.into());
    let client = Arc::new(UnixClient::new(&socket).expect("client"));
    client.server_version().await.expect("Incus answers");
    let mut bench = Bench {
        client: client.clone(),
        repeat: env("REPEAT", 5),
        warm_reads: u32::try_from(env("WARM_READS", 10)).unwrap_or(10),
        last_metrics: Instant::now(),
    };
    let prefix = format!("bmc-{:06x}-", fastrand::u32(..0x100_0000));
    let mut instances = Instances {
        socket,
        names: Vec::new(),
    };
    let mut rows = Vec::new();
    for &n in &sizes {
        while instances.names.len() < n {
            let name = format!("{prefix}{}", instances.names.len());
            // Recorded first, so that a creation that fails half-way is cleaned up too.
            instances.names.push(name.clone());
            let req = CreateInstance {
                name,
                kind: "container".into(),
                source: ImageSource::local("busybox"),
                config: HashMap::from([("limits.memory".into(), "64MiB".into())]),
                profiles: vec!["default".into()],
                start: true,
                target: None,
            };
            client.create(PROJECT, &req).await.expect("create");
        }
        eprintln!("{n} instances running, measuring");
        // Start-up work settles; the metrics cache goes cold.
        tokio::time::sleep(COLD_AFTER).await;
        rows.push(bench.row(&instances.names[..n]).await);
    }
    // The smaller groups among every instance: metrics render them all, /state the group's.
    for &n in &sizes[..sizes.len() - 1] {
        eprintln!("{n} of {} running, measuring", instances.names.len());
        rows.push(bench.row(&instances.names[..n]).await);
    }
    print(&rows);
    drop(instances);
}
