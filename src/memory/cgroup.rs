//! Readings from the container's cgroup files on this host (v1, v2 or hybrid): no request to
//! incusd at all. Memory is the working set (usage minus inactive page cache, as the kubelet
//! computes it), with the OOM killer's count (`memory.events` on v2, `memory.oom_control` on
//! v1); beside it, the CPU time used and the pressure (PSI), read from the instance's v2
//! directory where there is one.
//!
//! The files read per instance, in order (`P` is `lxc.payload.NAME`, or
//! `lxc.payload.PROJECT_NAME` outside the `default` project):
//! - v1, and hybrid (v1 controllers beside a v2 tree mounted at `unified/`): `memory/P/`
//!   `memory.usage_in_bytes`, `memory.stat` (its `hierarchical_memory_limit` is the limit in
//!   force: the lowest of the instance's and its parents'; `memory.limit_in_bytes` is read
//!   only where it lacks one), `memory.oom_control`;
//!   then, when `unified/P` is a directory (hybrid), its `cpu.stat`, `cpu.pressure` and
//!   `memory.pressure`; `cpuacct/P/cpuacct.usage` only when there is no `cpu.stat` to read
//!   (pure v1: no pressure either).
//! - v2: `P/` (or `unified/P/`, wherever `memory.current` is) `memory.current`, `memory.max`,
//!   `memory.stat`, `memory.events`, `cpu.stat`, `cpu.pressure`, `memory.pressure`.
//!
//! CPU time and pressure are read only for a group that scales on them. On the real tree every
//! file read stays open from one pass to the next ([`OpenFiles`]), so a steady reading is one
//! `pread` per file and no `open`, `statx` or `close`; each reading ends with a sweep (done at
//! most every few seconds) that closes those of deleted instances.

use std::path::{Path, PathBuf};

use async_trait::async_trait;

use super::open_files::OpenFiles;
use super::MemorySource;
use crate::model::{Memory, Wanted};

/// Memory from the local cgroup tree (v1 or v2), with an injectable root for tests.
pub struct CgroupSource {
    root: PathBuf,
    host_total: u64,
    /// The signals' files kept open between passes (on the real cgroup tree only: a test's
    /// tree of plain files is read afresh, since a plain file removed stays readable open).
    open: Option<OpenFiles>,
}

impl CgroupSource {
    /// Reads under `/sys/fs/cgroup` (or `INCUS_HPA_CGROUP_ROOT`, a fake tree for the fleet
    /// benchmark), with the host's memory from `/proc/meminfo`.
    pub fn system() -> Self {
        let host_total = std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|m| meminfo_total(&m))
            .unwrap_or(0);
        // Half the descriptors the daemon may open (it raised its limit at start).
        let max = super::open_files::max_open(crate::limits::descriptors());
        Self {
            open: Some(OpenFiles::with_max(max)),
            ..Self::new(
                std::env::var_os("INCUS_HPA_CGROUP_ROOT")
                    .map_or_else(|| PathBuf::from("/sys/fs/cgroup"), PathBuf::from),
                host_total,
            )
        }
    }

    /// [`CgroupSource::system`] without the files kept open: each file opened, read and closed
    /// at every reading (the way before they were kept, for the benchmarks' side-by-side rows).
    pub fn system_reopening() -> Self {
        Self {
            open: None,
            ..Self::system()
        }
    }

    pub fn new(root: impl Into<PathBuf>, host_total: u64) -> Self {
        Self {
            root: root.into(),
            host_total,
            open: None,
        }
    }

    /// The same source keeping the signals' files open, as on the real tree: for tests whose
    /// tree removes whole directories (a plain file removed stays readable open). It sweeps
    /// after every reading (not at most every few seconds).
    #[cfg(test)]
    fn keeping_files_open(self) -> Self {
        Self {
            open: Some(OpenFiles::default().sweeping_every_time()),
            ..self
        }
    }

    /// What `parse` makes of a cgroup file's text: through the open files when kept (read in
    /// place, into their buffer), else read once.
    fn text<T>(&self, path: &Path, parse: impl FnOnce(&str) -> Option<T>) -> Option<T> {
        match &self.open {
            Some(open) => open.read_with(path, parse),
            None => parse(&read_small(path)?),
        }
    }

    /// A file holding one number (`memory.current`, `memory.max`, …).
    fn number(&self, path: &Path) -> Option<u64> {
        self.text(path, |t| t.trim().parse().ok())
    }

    /// The value of `name` in a `KEY VALUE` per line file (`memory.stat`, `memory.events`).
    fn stat_field(&self, path: &Path, name: &str) -> Option<u64> {
        self.text(path, |t| field(t, name))
    }

    /// The higher "some avg10" of `dir`'s `cpu.pressure` and `memory.pressure`, of those that
    /// are there and readable.
    fn pressure(&self, dir: &Path) -> Option<f64> {
        ["cpu.pressure", "memory.pressure"]
            .into_iter()
            .filter_map(|f| self.text(&dir.join(f), psi_some_avg10))
            .reduce(f64::max)
    }

    /// The cgroup directory name LXC gives an instance of a project.
    fn payload(project: &str, name: &str) -> String {
        if project == "default" {
            format!("lxc.payload.{name}")
        } else {
            format!("lxc.payload.{project}_{name}")
        }
    }

    /// The path of an instance's v1 `memory.usage_in_bytes`.
    fn v1_usage_file(&self, payload: &str) -> PathBuf {
        let mut file = self.root.join("memory");
        file.push(payload);
        file.push("memory.usage_in_bytes");
        file
    }

    /// An instance's v2 `memory.current` (its path and value), in the v2 tree or the
    /// hybrid's `unified/`, whichever has it.
    fn v2_usage(&self, payload: &str) -> Option<(PathBuf, u64)> {
        [
            self.root.join(payload),
            self.root.join("unified").join(payload),
        ]
        .into_iter()
        .find_map(|mut file| {
            file.push("memory.current");
            let usage = self.number(&file)?;
            Some((file, usage))
        })
    }

    /// One instance's reading, or `None` when its memory files are not there or unreadable.
    /// Its CPU time and pressure are `None` when their files are missing or garbled: they
    /// never make the memory reading missing.
    pub fn read_one(&self, project: &str, name: &str) -> Option<Memory> {
        self.read_one_wanted(project, name, Wanted::ALL)
    }

    /// [`CgroupSource::read_one`], with CPU time and pressure only as `wanted` asks (at most
    /// three more small files each pass, and none for a group that scales on memory alone).
    /// The layout is found by the files themselves (v1's `memory.usage_in_bytes` first), never
    /// by a `stat` of a directory: kept open, the memory files cost a `pread` each.
    pub fn read_one_wanted(&self, project: &str, name: &str, wanted: Wanted) -> Option<Memory> {
        let payload = Self::payload(project, name);
        let extra = wanted.cpu || wanted.pressure;
        // One path per instance, its file name changed for each file (no path made per file).
        let mut file = self.v1_usage_file(&payload);
        let (usage, limit, inactive, oom_kills, v2) = if let Some(usage) = self.number(&file) {
            // v1's memory.stat has the limit in force too (the lowest of the instance's and
            // its parents'): one file fewer per reading. `memory.limit_in_bytes` where not.
            file.set_file_name("memory.stat");
            let [inactive, limit] = self
                .text(&file, |t| {
                    Some(fields(
                        t,
                        ["total_inactive_file", "hierarchical_memory_limit"],
                    ))
                })
                .unwrap_or_default();
            let limit = limit.or_else(|| {
                file.set_file_name("memory.limit_in_bytes");
                self.number(&file)
            });
            file.set_file_name("memory.oom_control");
            (
                usage,
                limit,
                inactive,
                self.stat_field(&file, "oom_kill"),
                // Hybrid: the v2 tree beside the v1 controllers. Pure v1: none.
                // (Not checked first: on pure v1 its files fail to open, one stat less.)
                Some(self.root.join("unified").join(&payload)).filter(|_| extra),
            )
        } else {
            let (mut file, usage) = self.v2_usage(&payload)?;
            file.set_file_name("memory.max"); // "max" parses as None: no limit
            let limit = self.number(&file);
            file.set_file_name("memory.stat");
            let inactive = self.stat_field(&file, "inactive_file");
            // Counts the kills in the whole subtree (an init's services included).
            file.set_file_name("memory.events");
            let oom_kills = self.stat_field(&file, "oom_kill");
            file.pop();
            (usage, limit, inactive, oom_kills, Some(file))
        };
        let host = self.host_total;
        let limit = match limit {
            Some(l) if host == 0 || l < host => l,
            _ => host,
        };
        (limit > 0).then(|| Memory {
            usage: usage.saturating_sub(inactive.unwrap_or(0)),
            limit,
            oom_kills,
            cpu_ns: if wanted.cpu {
                self.cpu_ns(&payload, v2.as_deref())
            } else {
                None
            },
            pressure: v2
                .as_deref()
                .filter(|_| wanted.pressure)
                .and_then(|d| self.pressure(d)),
        })
    }

    /// CPU time used, ns: v2's `cpu.stat` `usage_usec` (in every v2 directory, whatever its
    /// controllers), else v1's `cpuacct.usage`.
    fn cpu_ns(&self, payload: &str, v2: Option<&Path>) -> Option<u64> {
        let v1 = self
            .root
            .join("cpuacct")
            .join(payload)
            .join("cpuacct.usage");
        v2.and_then(|d| self.stat_field(&d.join("cpu.stat"), "usage_usec"))
            .map(|us| us.saturating_mul(1000))
            .or_else(|| self.number(&v1))
    }
}

#[async_trait]
impl MemorySource for CgroupSource {
    async fn read(&self, project: &str, names: &[String]) -> Vec<Option<Memory>> {
        self.read_wanted(project, names, &[], Wanted::ALL).await
    }

    /// Reads each instance, then sweeps the files kept open (see `OpenFiles::sweep`): those
    /// of deleted instances are closed by the next group's reading but one.
    async fn read_wanted(
        &self,
        project: &str,
        names: &[String],
        _members: &[String],
        wanted: Wanted,
    ) -> Vec<Option<Memory>> {
        let out = names
            .iter()
            .map(|n| self.read_one_wanted(project, n, wanted))
            .collect();
        if let Some(open) = &self.open {
            open.sweep();
        }
        out
    }

    fn usage(&self, project: &str, name: &str) -> Option<u64> {
        let payload = Self::payload(project, name);
        self.number(&self.v1_usage_file(&payload))
            .or_else(|| Some(self.v2_usage(&payload)?.1))
    }

    fn peek(&self, project: &str, name: &str) -> Option<Memory> {
        self.read_one_wanted(project, name, Wanted::NONE)
    }
}

/// The value of `name` in a `KEY VALUE` per line text (`memory.stat`, `cpu.stat`).
fn field(text: &str, name: &str) -> Option<u64> {
    let [v] = fields(text, [name]);
    v
}

/// The values of `names` in a `KEY VALUE` per line text, in one pass over it that ends when
/// every one is found (the first line of each name counts).
fn fields<const N: usize>(text: &str, names: [&str; N]) -> [Option<u64>; N] {
    let mut found = [None; N];
    let mut left = N;
    for line in text.lines() {
        let Some((k, v)) = line.split_once(' ') else {
            continue;
        };
        if let Some(i) = names.iter().position(|n| *n == k) {
            if found[i].is_none() {
                found[i] = Some(v.trim().parse().ok());
                left -= 1;
                if left == 0 {
                    break;
                }
            }
        }
    }
    found.map(Option::flatten)
}

/// A small cgroup file (a PSI file, `cpu.stat`) in one `read`, with neither the `fstat` nor the
/// second `read` of [`std::fs::read_to_string`]: the kernel hands a seq file's whole text to a
/// buffer that holds it. A file that fills the buffer is read again in full.
fn read_small(path: &Path) -> Option<String> {
    use std::io::Read;
    let mut buf = [0u8; 1024];
    let mut file = std::fs::File::open(path).ok()?;
    let n = file.read(&mut buf).ok()?;
    if n == buf.len() {
        return std::fs::read_to_string(path).ok();
    }
    String::from_utf8(buf[..n].to_vec()).ok()
}

/// The "some avg10" of a PSI file (`some avg10=1.50 avg60=0.20 avg300=0.05 total=123`), in
/// percent: the share of the last 10 s in which some task of the group waited.
fn psi_some_avg10(text: &str) -> Option<f64> {
    let some = text.lines().find_map(|l| l.strip_prefix("some "))?;
    let avg10 = some
        .split_whitespace()
        .find_map(|f| f.strip_prefix("avg10="))?;
    let v: f64 = avg10.parse().ok()?;
    (v.is_finite() && v >= 0.0).then_some(v)
}

/// `MemTotal` from /proc/meminfo, in bytes.
fn meminfo_total(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

#[cfg(test)]
#[path = "cgroup_tests.rs"]
mod tests;
