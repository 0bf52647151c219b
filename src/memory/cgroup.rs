//! Memory from the container's cgroup files on this host (v1 or v2): no request to incusd at
//! all, and the working set (usage minus inactive page cache, as the kubelet computes it), with
//! the OOM killer's count (`memory.events` on v2, `memory.oom_control` on v1).

use std::path::{Path, PathBuf};

use async_trait::async_trait;

use super::MemorySource;
use crate::model::Memory;

/// Memory from the local cgroup tree (v1 or v2), with an injectable root for tests.
pub struct CgroupSource {
    root: PathBuf,
    host_total: u64,
}

impl CgroupSource {
    /// Reads under `/sys/fs/cgroup`, with the host's memory from `/proc/meminfo`.
    pub fn system() -> Self {
        let host_total = std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|m| meminfo_total(&m))
            .unwrap_or(0);
        Self::new("/sys/fs/cgroup", host_total)
    }

    pub fn new(root: impl Into<PathBuf>, host_total: u64) -> Self {
        Self {
            root: root.into(),
            host_total,
        }
    }

    /// The cgroup directory name LXC gives an instance of a project.
    fn payload(project: &str, name: &str) -> String {
        if project == "default" {
            format!("lxc.payload.{name}")
        } else {
            format!("lxc.payload.{project}_{name}")
        }
    }

    /// One instance's memory, or `None` when its files are not there or unreadable.
    pub fn read_one(&self, project: &str, name: &str) -> Option<Memory> {
        let payload = Self::payload(project, name);
        let v1 = self.root.join("memory").join(&payload);
        let (usage, limit, inactive, oom_kills) = if v1.is_dir() {
            (
                read_u64(&v1.join("memory.usage_in_bytes"))?,
                read_u64(&v1.join("memory.limit_in_bytes")),
                stat_field(&v1.join("memory.stat"), "total_inactive_file"),
                stat_field(&v1.join("memory.oom_control"), "oom_kill"),
            )
        } else {
            let v2 = [
                self.root.join(&payload),
                self.root.join("unified").join(&payload),
            ]
            .into_iter()
            .find(|p| p.join("memory.current").is_file())?;
            (
                read_u64(&v2.join("memory.current"))?,
                read_u64(&v2.join("memory.max")), // "max" parses as None: no limit
                stat_field(&v2.join("memory.stat"), "inactive_file"),
                // Counts the kills in the whole subtree (an init's services included).
                stat_field(&v2.join("memory.events"), "oom_kill"),
            )
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
            ..Default::default()
        })
    }
}

#[async_trait]
impl MemorySource for CgroupSource {
    async fn read(&self, project: &str, names: &[String]) -> Vec<Option<Memory>> {
        names.iter().map(|n| self.read_one(project, n)).collect()
    }
}

fn read_u64(path: &Path) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

fn stat_field(path: &Path, field: &str) -> Option<u64> {
    let text = std::fs::read_to_string(path).ok()?;
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == field).then(|| v.trim().parse().ok()).flatten()
    })
}

/// `MemTotal` from /proc/meminfo, in bytes.
fn meminfo_total(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, files: &[(&str, &str)]) {
        std::fs::create_dir_all(dir).unwrap();
        for (f, c) in files {
            std::fs::write(dir.join(f), c).unwrap();
        }
    }

    #[test]
    fn reads_cgroup_v1_working_set() {
        let t = tempfile::tempdir().unwrap();
        write(
            &t.path().join("memory/lxc.payload.web-a"),
            &[
                ("memory.usage_in_bytes", "50000\n"),
                ("memory.limit_in_bytes", "100000\n"),
                ("memory.stat", "cache 1\ntotal_inactive_file 10000\n"),
                (
                    "memory.oom_control",
                    "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n",
                ),
            ],
        );
        let s = CgroupSource::new(t.path(), 1 << 30);
        assert_eq!(
            s.read_one("default", "web-a"),
            Some(Memory {
                usage: 40000,
                limit: 100000,
                oom_kills: Some(2),
                ..Default::default()
            })
        );
        assert_eq!(s.read_one("default", "web-b"), None);
    }

    #[test]
    fn reads_cgroup_v2_with_projects_and_no_limit() {
        let t = tempfile::tempdir().unwrap();
        write(
            &t.path().join("lxc.payload.staging_db-a"),
            &[
                ("memory.current", "300\n"),
                ("memory.max", "max\n"),
                ("memory.stat", "anon 3\ninactive_file 100\n"),
                (
                    "memory.events",
                    "low 0\nhigh 0\nmax 7\noom 1\noom_kill 1\noom_group_kill 0\n",
                ),
            ],
        );
        let s = CgroupSource::new(t.path(), 1000);
        assert_eq!(
            s.read_one("staging", "db-a"),
            Some(Memory {
                usage: 200,
                limit: 1000,
                oom_kills: Some(1),
                ..Default::default()
            })
        );
        assert_eq!(s.read_one("default", "db-a"), None);
    }

    #[test]
    fn meminfo_is_in_kib() {
        assert_eq!(
            meminfo_total("MemTotal:       1000 kB\nMemFree: 1 kB\n"),
            Some(1_024_000)
        );
    }
}
