//! Readings from the container's cgroup files on this host (v1, v2 or hybrid): no request to
//! incusd at all. Memory is the working set (usage minus inactive page cache, as the kubelet
//! computes it), with the OOM killer's count (`memory.events` on v2, `memory.oom_control` on
//! v1); beside it, the CPU time used and the pressure (PSI), read from the instance's v2
//! directory where there is one.
//!
//! The files read per instance, in order (`P` is `lxc.payload.NAME`, or
//! `lxc.payload.PROJECT_NAME` outside the `default` project):
//! - v1, and hybrid (v1 controllers beside a v2 tree mounted at `unified/`): `memory/P/`
//!   `memory.usage_in_bytes`, `memory.limit_in_bytes`, `memory.stat`, `memory.oom_control`;
//!   then, when `unified/P` is a directory (hybrid), its `cpu.stat`, `cpu.pressure` and
//!   `memory.pressure`; `cpuacct/P/cpuacct.usage` only when there is no `cpu.stat` to read
//!   (pure v1: no pressure either).
//! - v2: `P/` (or `unified/P/`, wherever `memory.current` is) `memory.current`, `memory.max`,
//!   `memory.stat`, `memory.events`, `cpu.stat`, `cpu.pressure`, `memory.pressure`.
//!
//! CPU time and pressure are read only for a group that scales on them, and on the real tree
//! their three files stay open from one pass to the next ([`OpenFiles`]).

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
    /// Reads under `/sys/fs/cgroup`, with the host's memory from `/proc/meminfo`.
    pub fn system() -> Self {
        let host_total = std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|m| meminfo_total(&m))
            .unwrap_or(0);
        Self {
            open: Some(OpenFiles::default()),
            ..Self::new("/sys/fs/cgroup", host_total)
        }
    }

    pub fn new(root: impl Into<PathBuf>, host_total: u64) -> Self {
        Self {
            root: root.into(),
            host_total,
            open: None,
        }
    }

    /// A small file of the signals: through the open files when kept, else read once.
    fn small(&self, path: &Path) -> Option<String> {
        match &self.open {
            Some(open) => open.read(path),
            None => read_small(path),
        }
    }

    /// The higher "some avg10" of `dir`'s `cpu.pressure` and `memory.pressure`, of those that
    /// are there and readable.
    fn pressure(&self, dir: &Path) -> Option<f64> {
        ["cpu.pressure", "memory.pressure"]
            .into_iter()
            .filter_map(|f| psi_some_avg10(&self.small(&dir.join(f))?))
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

    /// One instance's reading, or `None` when its memory files are not there or unreadable.
    /// Its CPU time and pressure are `None` when their files are missing or garbled: they
    /// never make the memory reading missing.
    pub fn read_one(&self, project: &str, name: &str) -> Option<Memory> {
        self.read_one_wanted(project, name, Wanted::ALL)
    }

    /// [`CgroupSource::read_one`], with CPU time and pressure only as `wanted` asks (at most
    /// three more small files each pass, and none for a group that scales on memory alone).
    pub fn read_one_wanted(&self, project: &str, name: &str, wanted: Wanted) -> Option<Memory> {
        let payload = Self::payload(project, name);
        let extra = wanted.cpu || wanted.pressure;
        let v1 = self.root.join("memory").join(&payload);
        let (usage, limit, inactive, oom_kills, v2) = if v1.is_dir() {
            (
                read_u64(&v1.join("memory.usage_in_bytes"))?,
                read_u64(&v1.join("memory.limit_in_bytes")),
                stat_field(&v1.join("memory.stat"), "total_inactive_file"),
                stat_field(&v1.join("memory.oom_control"), "oom_kill"),
                // Hybrid: the v2 tree beside the v1 controllers. Pure v1: none.
                // (Not checked first: on pure v1 its files fail to open, one stat less here.)
                Some(self.root.join("unified").join(&payload)).filter(|_| extra),
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
                Some(v2),
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
        v2.and_then(|d| field(&self.small(&d.join("cpu.stat"))?, "usage_usec"))
            .map(|us| us.saturating_mul(1000))
            .or_else(|| read_u64(&v1))
    }
}

#[async_trait]
impl MemorySource for CgroupSource {
    async fn read(&self, project: &str, names: &[String]) -> Vec<Option<Memory>> {
        names.iter().map(|n| self.read_one(project, n)).collect()
    }

    async fn read_wanted(
        &self,
        project: &str,
        names: &[String],
        _members: &[String],
        wanted: Wanted,
    ) -> Vec<Option<Memory>> {
        names
            .iter()
            .map(|n| self.read_one_wanted(project, n, wanted))
            .collect()
    }

    fn usage(&self, project: &str, name: &str) -> Option<u64> {
        let payload = Self::payload(project, name);
        [
            self.root
                .join("memory")
                .join(&payload)
                .join("memory.usage_in_bytes"),
            self.root.join(&payload).join("memory.current"),
            self.root
                .join("unified")
                .join(&payload)
                .join("memory.current"),
        ]
        .iter()
        .find_map(|p| read_u64(p))
    }

    fn peek(&self, project: &str, name: &str) -> Option<Memory> {
        self.read_one_wanted(project, name, Wanted::NONE)
    }
}

fn read_u64(path: &Path) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

fn stat_field(path: &Path, name: &str) -> Option<u64> {
    field(&std::fs::read_to_string(path).ok()?, name)
}

/// The value of `name` in a `KEY VALUE` per line text (`memory.stat`, `cpu.stat`).
fn field(text: &str, name: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == name).then(|| v.trim().parse().ok()).flatten()
    })
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
        // The watch between passes reads the usage alone (page cache included), from one file.
        assert_eq!(s.usage("default", "web-a"), Some(50000));
        assert_eq!(s.usage("default", "web-b"), None);
        assert_eq!(
            s.peek("default", "web-a"),
            s.read_one_wanted("default", "web-a", Wanted::NONE)
        );
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

    /// The memory files of a v1 instance: 40000 of 100000 bytes used.
    const V1_MEMORY: [(&str, &str); 3] = [
        ("memory.usage_in_bytes", "50000\n"),
        ("memory.limit_in_bytes", "100000\n"),
        ("memory.stat", "total_inactive_file 10000\n"),
    ];

    /// The same as a v2 instance's files.
    const V2_MEMORY: [(&str, &str); 3] = [
        ("memory.current", "50000\n"),
        ("memory.max", "100000\n"),
        ("memory.stat", "inactive_file 10000\n"),
    ];

    const CPU_STAT: &str = "usage_usec 2472371\nuser_usec 1219628\nsystem_usec 1252742\n\
                            nice_usec 0\n";

    fn psi(some: &str) -> String {
        format!(
            "some avg10={some} avg60=2.03 avg300=0.45 total=2089955\n\
             full avg10=99.00 avg60=1.22 avg300=0.27 total=1341970\n"
        )
    }

    /// A v2 directory's CPU counter, and its pressure files with these "some avg10".
    fn write_v2_signals(dir: &Path, cpu: &str, memory: &str) {
        write(
            dir,
            &[
                ("cpu.stat", CPU_STAT),
                ("cpu.pressure", &psi(cpu)),
                ("memory.pressure", &psi(memory)),
            ],
        );
    }

    /// v1's CPU counter of the cgroup `payload`.
    fn write_cpuacct(root: &Path, payload: &str, usage: &str) {
        write(
            &root.join("cpuacct").join(payload),
            &[("cpuacct.usage", usage)],
        );
    }

    /// What `s` reads of `name`'s CPU time and pressure (its memory must read 40000/100000).
    fn signals(s: &CgroupSource, project: &str, name: &str) -> (Option<u64>, Option<f64>) {
        let m = s.read_one(project, name).expect("a memory reading");
        assert_eq!((m.usage, m.limit), (40000, 100000), "{m:?}");
        (m.cpu_ns, m.pressure)
    }

    #[test]
    fn the_watch_reads_memory_current_on_v2_at_the_root_or_under_unified() {
        for under in ["", "unified"] {
            let t = tempfile::tempdir().unwrap();
            write(&t.path().join(under).join("lxc.payload.web-a"), &V2_MEMORY);
            let s = CgroupSource::new(t.path(), 1 << 30);
            let current: u64 = V2_MEMORY[0].1.trim().parse().unwrap();
            assert_eq!(s.usage("default", "web-a"), Some(current), "{under:?}");
            assert!(s.peek("default", "web-a").is_some(), "{under:?}");
        }
    }

    #[test]
    fn cgroup_v1_cpu_comes_from_cpuacct_without_pressure() {
        let t = tempfile::tempdir().unwrap();
        write(&t.path().join("memory/lxc.payload.web-a"), &V1_MEMORY);
        write_cpuacct(t.path(), "lxc.payload.web-a", "2513643288\n");
        let s = CgroupSource::new(t.path(), 1 << 30);
        assert_eq!(signals(&s, "default", "web-a"), (Some(2_513_643_288), None));
    }

    #[test]
    fn cgroup_v2_cpu_is_usage_usec_in_ns_and_pressure_the_higher_avg10() {
        // At the root of a pure v2 host, or under `unified/` (memory in v2 on a hybrid host).
        for under in ["", "unified"] {
            let t = tempfile::tempdir().unwrap();
            let dir = t.path().join(under).join("lxc.payload.web-a");
            write(&dir, &V2_MEMORY);
            write_v2_signals(&dir, "7.49", "12.50");
            let s = CgroupSource::new(t.path(), 1 << 30);
            assert_eq!(
                signals(&s, "default", "web-a"),
                (Some(2_472_371_000), Some(12.5)),
                "{under}"
            );
            write(&dir, &[("memory.pressure", &psi("0.00"))]);
            assert_eq!(signals(&s, "default", "web-a").1, Some(7.49), "{under}");
        }
    }

    #[test]
    fn cgroup_hybrid_reads_cpu_and_pressure_in_the_unified_tree() {
        let t = tempfile::tempdir().unwrap();
        // As on this kind of host: memory and cpuacct in v1, the v2 tree under `unified/`,
        // an instance of project `staging`.
        let payload = "lxc.payload.staging_web-a";
        write(&t.path().join("memory").join(payload), &V1_MEMORY);
        write_cpuacct(t.path(), payload, "2513643288\n");
        let unified = t.path().join("unified").join(payload);
        write_v2_signals(&unified, "7.49", "0.00");
        let s = CgroupSource::new(t.path(), 1 << 30);
        // v2's counter first, while it is there.
        assert_eq!(
            signals(&s, "staging", "web-a"),
            (Some(2_472_371_000), Some(7.49))
        );
        // The same name in `default` is another cgroup: nothing there.
        assert_eq!(s.read_one("default", "web-a"), None);
        // Without v2's counter, v1's.
        std::fs::remove_file(unified.join("cpu.stat")).unwrap();
        assert_eq!(
            signals(&s, "staging", "web-a"),
            (Some(2_513_643_288), Some(7.49))
        );
    }

    #[test]
    fn missing_cpu_and_pressure_files_leave_the_memory_reading() {
        let t = tempfile::tempdir().unwrap();
        write(&t.path().join("lxc.payload.v2"), &V2_MEMORY);
        write(&t.path().join("memory/lxc.payload.v1"), &V1_MEMORY);
        // Hybrid, with an empty v2 directory and no cpuacct one.
        write(&t.path().join("memory/lxc.payload.hy"), &V1_MEMORY);
        std::fs::create_dir_all(t.path().join("unified/lxc.payload.hy")).unwrap();
        let s = CgroupSource::new(t.path(), 1 << 30);
        for name in ["v2", "v1", "hy"] {
            assert_eq!(signals(&s, "default", name), (None, None), "{name}");
        }
        // One pressure file of two: its figure.
        write(
            &t.path().join("unified/lxc.payload.hy"),
            &[("memory.pressure", &psi("3.00"))],
        );
        assert_eq!(signals(&s, "default", "hy"), (None, Some(3.0)));
    }

    #[test]
    fn garbled_cpu_and_pressure_files_read_as_missing() {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("lxc.payload.web-a");
        write(&dir, &V2_MEMORY);
        write(
            &dir,
            &[
                ("cpu.stat", "usage_usec lots\n"),
                ("cpu.pressure", "some avg10=NaN avg60=0.00\n"),
                ("memory.pressure", "full avg10=5.00\n"),
            ],
        );
        // A v2 counter that does not parse falls back to v1's, garbled too here.
        write_cpuacct(t.path(), "lxc.payload.web-a", "-1\n");
        let s = CgroupSource::new(t.path(), 1 << 30);
        assert_eq!(signals(&s, "default", "web-a"), (None, None));
        // One pressure readable, the other not: the one there is.
        write(&dir, &[("memory.pressure", &psi("4.25"))]);
        write_cpuacct(t.path(), "lxc.payload.web-a", "123\n");
        assert_eq!(signals(&s, "default", "web-a"), (Some(123), Some(4.25)));
    }

    #[test]
    fn psi_some_avg10_is_read_from_the_some_line() {
        assert_eq!(psi_some_avg10(&psi("7.49")), Some(7.49));
        assert_eq!(psi_some_avg10(&psi("100.00")), Some(100.0));
        // The root cgroup's cpu.pressure (older kernels) has no "full" line.
        assert_eq!(
            psi_some_avg10("some avg10=0.50 avg60=0.00 avg300=0.00 total=1\n"),
            Some(0.5)
        );
        for garbage in [
            "",
            "full avg10=1.00 avg60=0.00 avg300=0.00 total=1\n",
            "some avg60=1.00 total=1\n",
            "some avg10= avg60=1.00\n",
            "some avg10=-1.00\n",
            "some avg10=inf\n",
            "someavg10=1.00\n",
        ] {
            assert_eq!(psi_some_avg10(garbage), None, "{garbage:?}");
        }
    }

    #[test]
    fn meminfo_is_in_kib() {
        assert_eq!(
            meminfo_total("MemTotal:       1000 kB\nMemFree: 1 kB\n"),
            Some(1_024_000)
        );
    }
}
