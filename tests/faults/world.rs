//! One fault scenario's world: a daemon (through the fault proxy or straight on incusd) on a
//! group of its own, sentinel instances it must never touch, the checks every scenario ends
//! with, and the row it adds to the report (`target/tmp/faults-table.md`).

use std::path::PathBuf;
use std::time::Duration;

use crate::lab::*;
use crate::proxy::{Proxy, ProxyHandle};

/// Where the real incusd listens.
pub const INCUS_SOCKET: &str = "/var/lib/incus/unix.socket";

/// A desired-state file for the scenario's group: 1 s interval, memory from the API (so memory
/// readings cross the proxy too), a short scale-down window.
pub fn desired(group: &str, min: u32, max: u32, extra: &str) -> String {
    config(group, min, max, extra)
        .replace("[daemon]", "[daemon]\nmemory_source = \"api\"")
        .replace(
            "scale_down_stabilization = \"6s\"",
            "scale_down_stabilization = \"2s\"",
        )
}

/// The group's own instances (name, status) and the leftovers' names.
type Snapshot = (Vec<(String, String)>, Vec<String>);

/// A scenario under way.
pub struct World {
    pub lab: Lab,
    pub name: &'static str,
    pub proxy: Option<Proxy>,
    /// Runs the proxy (dropped after it).
    rt: tokio::runtime::Runtime,
    /// Instances the daemon must never touch, with their status at the start.
    sentinels: Vec<(String, String)>,
}

impl World {
    /// A world for scenario `name`; `proxied` puts the fault proxy between daemon and incusd.
    pub fn new(name: &'static str, tag: &str, proxied: bool) -> Self {
        let lab = Lab::new(tag);
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let proxy = proxied.then(|| {
            let path = lab.dir.path().join("proxy.socket");
            rt.block_on(async { Proxy::start(&path, INCUS_SOCKET.as_ref()) })
        });
        Self {
            lab,
            name,
            proxy,
            rt,
            sentinels: Vec::new(),
        }
    }

    /// Restarts the proxy (as an incusd restart would look): every open connection, the
    /// event stream included, is cut, so the daemon reconnects and lists afresh. Rules are lost.
    pub fn cut_connections(&mut self) {
        let old = self.proxy.take().expect("a proxied world");
        let path = old.path().to_path_buf();
        self.rt.block_on(old.stop());
        self.proxy = Some(
            self.rt
                .block_on(async { Proxy::start(&path, INCUS_SOCKET.as_ref()) }),
        );
    }

    pub fn faults(&self) -> ProxyHandle {
        self.proxy.as_ref().expect("a proxied world").handle()
    }

    fn socket(&self) -> Option<PathBuf> {
        self.proxy.as_ref().map(|p| p.path().to_path_buf())
    }

    /// Starts (or starts again) the daemon on `toml`; requests time out after 1 s.
    pub fn start(&mut self, toml: &str) {
        let socket = self.socket();
        self.lab.start_with(
            toml,
            socket.as_deref(),
            &[("INCUS_HPA_REQUEST_TIMEOUT", "1s")],
        );
    }

    /// A person's instance with the group's prefix and no key, and a copy of a managed one
    /// (which carries the key): the daemon must leave both as they are.
    pub fn add_sentinels(&mut self) {
        let g = self.lab.group.clone();
        let manual = format!("{g}-manual");
        self.lab.launch_unmanaged(&manual, &[]);
        let source = managed(&g)
            .into_iter()
            .find(|(_, s)| s == "Running")
            .expect("a running instance to copy")
            .0;
        let copy = format!("{g}-copy");
        incus_ok(&["copy", &source, &copy]);
        self.sentinels = [manual, copy]
            .into_iter()
            .map(|n| {
                let s = status(&n);
                (n, s)
            })
            .collect();
    }

    /// The group's own instances: everything with its key but the sentinels.
    pub fn own(&self) -> Vec<(String, String)> {
        managed(&self.lab.group)
            .into_iter()
            .filter(|(n, _)| !self.is_sentinel(n))
            .collect()
    }

    fn is_sentinel(&self, name: &str) -> bool {
        self.sentinels.iter().any(|(s, _)| s == name)
    }

    /// From one listing: the group's own instances, and the leftovers (instances named like
    /// the daemon's, GROUP-xxxxxx, that are stopped or not the group's own). `None` while
    /// Incus lists an instance without its config (it does during some operations).
    fn snapshot(&self) -> Option<Snapshot> {
        let prefix = format!("{}-", self.lab.group);
        let mut own = Vec::new();
        let mut orphans = Vec::new();
        for i in &instances("default") {
            let name = i["name"].as_str()?;
            if !name.starts_with(&prefix) || self.is_sentinel(name) {
                continue;
            }
            let config = i["config"].as_object()?;
            let status = i["status"].as_str()?.to_owned();
            let ours = config.get(KEY).and_then(|v| v.as_str()) == Some(self.lab.group.as_str());
            let daemon_named = name.len() == prefix.len() + 6;
            if ours {
                if status != "Running" {
                    orphans.push(name.to_owned());
                }
                own.push((name.to_owned(), status));
            } else if daemon_named {
                orphans.push(name.to_owned());
            }
        }
        Some((own, orphans))
    }

    /// Waits until exactly `n` of the group's own instances run and nothing else is left
    /// (seen twice in a row); returns how long it took, which the report shows.
    ///
    /// The wait is `within` plus Incus' own start timeout: Incus 6.0 sometimes holds a
    /// container start in `forkstart` until it gives up after about 90 s (docs/cost.md), and no
    /// client can shorten that. The scenario is about what the daemon keeps safe and that it
    /// converges, not how fast: one such stall after a SIGKILL failed a CI run at 60 s.
    pub fn converge(&self, n: usize, within: Duration) -> Duration {
        const INCUS_START_TIMEOUT: Duration = Duration::from_secs(90);
        let mut seen = 0;
        eventually(
            &self.lab,
            &format!("{n} running, nothing else"),
            within + INCUS_START_TIMEOUT,
            || {
                let settled = self
                    .snapshot()
                    .is_some_and(|(own, orphans)| own.len() == n && orphans.is_empty());
                seen = if settled { seen + 1 } else { 0 };
                seen >= 2
            },
        )
    }

    /// Checks what every scenario must keep, and adds the scenario's row to the report.
    pub fn finish(mut self, converged: Duration, scale_downs_on_missing: usize) {
        let touched = self
            .sentinels
            .iter()
            .filter(|(n, s)| !exists(n) || status(n) != *s)
            .count();
        // Leftovers: stopped instances of the group, or instances named like the daemon's
        // that are not the group's own.
        let (own, orphans) = self.snapshot().unwrap_or_default();
        let cache = self.cache_agrees();
        let log = self.lab.log();
        let panics = count_lines(&log, &["panicked"]);
        let alive = self
            .lab
            .daemon
            .as_mut()
            .is_some_and(|c| c.try_wait().unwrap().is_none());
        let row = format!(
            "| {} | {touched} | {} | {scale_downs_on_missing} | {panics} | {:.1} s |\n",
            self.name,
            orphans.len(),
            converged.as_secs_f64()
        );
        eprint!("{row}");
        report(&row);
        assert!(alive, "the daemon died\n{log}");
        if let Err(e) = cache {
            panic!("{e}\n{log}");
        }
        assert_eq!(self.lab.terminate(), Some(0), "{}", self.lab.log());
        assert_eq!(touched, 0, "unmanaged instances touched\n{log}");
        assert!(
            orphans.is_empty(),
            "orphans left: {orphans:?}\nown: {own:?}\n{log}"
        );
        assert_eq!(
            scale_downs_on_missing, 0,
            "scale-down on missing data\n{log}"
        );
        assert_eq!(panics, 0, "{log}");
    }
}

impl World {
    /// Asks the daemon for its cache (SIGUSR1) and compares the group's part of it with a
    /// fresh `incus list` (names and statuses), a few times until they agree.
    fn cache_agrees(&self) -> Result<(), String> {
        let Some(child) = &self.lab.daemon else {
            return Err("no daemon".into());
        };
        let prefix = format!("{}-", self.lab.group);
        let mut last = String::new();
        // Up to ~10 s: an instance created behind the daemon's back is read a settle time
        // (3 s) later.
        for _ in 0..40 {
            let before = self.lab.log_count(&["cache: project default:"]);
            std::process::Command::new("kill")
                .args(["-USR1", &child.id().to_string()])
                .status()
                .unwrap();
            eventually(
                &self.lab,
                "the cache dumped",
                Duration::from_secs(10),
                || self.lab.log_count(&["cache: project default:"]) > before,
            );
            let log = self.lab.log();
            let line = log
                .lines()
                .rev()
                .find(|l| l.contains("cache: project default:"))
                .unwrap_or_default();
            let inside = line
                .split_once('[')
                .and_then(|(_, r)| r.split_once(']'))
                .map_or("", |(l, _)| l);
            let mut cached: Vec<String> = inside
                .split(", ")
                .filter(|e| e.starts_with(&prefix))
                .map(str::to_owned)
                .collect();
            let mut fresh: Vec<String> = instances("default")
                .iter()
                .filter(|i| i["config"][KEY].is_string())
                .filter_map(|i| {
                    let name = i["name"].as_str()?;
                    name.starts_with(&prefix)
                        .then(|| format!("{name} {}", i["status"].as_str().unwrap_or("")))
                })
                .collect();
            cached.sort();
            fresh.sort();
            if cached == fresh {
                return Ok(());
            }
            last = format!("the cache {cached:?} differs from a fresh list {fresh:?}");
            std::thread::sleep(Duration::from_millis(250));
        }
        Err(last)
    }
}

/// An instance's status as `incus list` shows it (`RUNNING`, `STOPPED`, …).
pub fn status(name: &str) -> String {
    status_in("default", name)
}

/// Appends a row to the report CI prints after the suite.
fn report(row: &str) {
    use std::io::Write;
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("faults-table.md");
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap();
    f.write_all(row.as_bytes()).unwrap();
}

/// Lets a scenario's fault window (a fixed duration, not a wait for something) pass.
pub fn hold(d: Duration) {
    std::thread::sleep(d);
}
