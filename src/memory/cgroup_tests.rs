//! The cgroup reader on fake trees in a temporary directory: v1, v2 and hybrid layouts, the
//! signals' files, and the files kept open closed when their instances go.

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

#[test]
fn on_v1_the_limit_in_force_comes_from_memory_stat_and_limit_in_bytes_only_where_it_lacks_one() {
    let t = tempfile::tempdir().unwrap();
    // As the kernel writes it: the instance's own lines, then the limit in force (the lowest
    // of its own and its parents': 80000 here), then the whole subtree's totals.
    write(
        &t.path().join("memory/lxc.payload.web-a"),
        &[
            ("memory.usage_in_bytes", "50000\n"),
            ("memory.limit_in_bytes", "100000\n"),
            (
                "memory.stat",
                "cache 4096\ninactive_file 7\nhierarchical_memory_limit 80000\n\
                 hierarchical_memsw_limit 80000\ntotal_cache 4096\ntotal_inactive_file 10000\n",
            ),
            (
                "memory.oom_control",
                "oom_kill_disable 0\nunder_oom 0\noom_kill 0\n",
            ),
        ],
    );
    let s = CgroupSource::new(t.path(), 1 << 30).keeping_files_open();
    let read = s.read_one("default", "web-a").unwrap();
    assert_eq!((read.usage, read.limit), (40000, 80000));
    assert_eq!(
        s.open.as_ref().unwrap().len(),
        3,
        "memory.limit_in_bytes is not read"
    );
    // No limit at all (the kernel's largest page count): the host's memory.
    let unlimited = "hierarchical_memory_limit 9223372036854771712\ntotal_inactive_file 0\n";
    write(
        &t.path().join("memory/lxc.payload.web-b"),
        &[
            ("memory.usage_in_bytes", "50000\n"),
            ("memory.limit_in_bytes", "9223372036854771712\n"),
            ("memory.stat", unlimited),
        ],
    );
    assert_eq!(s.read_one("default", "web-b").unwrap().limit, 1 << 30);
    // A memory.stat without the line: memory.limit_in_bytes.
    let s = CgroupSource::new(t.path(), 1 << 30);
    write(&t.path().join("memory/lxc.payload.web-c"), &V1_MEMORY);
    assert_eq!(s.read_one("default", "web-c").unwrap().limit, 100000);
}

#[test]
fn fields_are_read_in_one_pass_the_first_line_of_each_name_counting() {
    let text = "cache 1\ninactive_file 2\ntotal_inactive_file 3\ninactive_file 9\nbad x\n";
    assert_eq!(
        fields(
            text,
            ["total_inactive_file", "inactive_file", "missing", "bad"]
        ),
        [Some(3), Some(2), None, None]
    );
    assert_eq!(field(text, "cache"), Some(1));
    assert_eq!(field("", "cache"), None);
    assert_eq!(field("cache", "cache"), None, "a line with no value");
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

#[tokio::test]
async fn the_files_of_removed_instances_are_closed_by_the_next_read() {
    let t = tempfile::tempdir().unwrap();
    let names: Vec<String> = (0..5).map(|i| format!("web-{i}")).collect();
    for n in &names {
        let dir = t.path().join(format!("lxc.payload.{n}"));
        write(&dir, &V2_MEMORY);
        write_v2_signals(&dir, "1.00", "2.00");
    }
    let s = CgroupSource::new(t.path(), 1 << 30).keeping_files_open();
    let open = |s: &CgroupSource| s.open.as_ref().map_or(0, OpenFiles::len);
    let read = |names: &[String]| {
        let members = vec![String::new(); names.len()];
        let names = names.to_vec();
        let s = &s;
        async move {
            s.read_wanted("default", &names, &members, Wanted::ALL)
                .await
        }
    };
    assert!(read(&names).await.iter().all(Option::is_some));
    assert_eq!(
        open(&s),
        30,
        "three memory files (this tree has no memory.events), cpu.stat and two pressure \
         files each"
    );
    // Read again: the same files, kept open.
    read(&names).await;
    assert_eq!(open(&s), 30);
    // Three instances deleted (their cgroups removed), then all of them. The daemon reads
    // only the instances still listed (and a real cgroup file kept open answers ENODEV once
    // its cgroup is gone, where this tree's plain files would still read).
    for n in &names[..3] {
        std::fs::remove_dir_all(t.path().join(format!("lxc.payload.{n}"))).unwrap();
    }
    let left = read(&names[3..]).await;
    assert_eq!(left.iter().filter(|m| m.is_some()).count(), 2);
    assert_eq!(open(&s), 12);
    for n in &names[3..] {
        std::fs::remove_dir_all(t.path().join(format!("lxc.payload.{n}"))).unwrap();
    }
    read(&[]).await;
    assert_eq!(open(&s), 0, "descriptors of deleted cgroups kept open");
}

#[test]
fn meminfo_is_in_kib() {
    assert_eq!(
        meminfo_total("MemTotal:       1000 kB\nMemFree: 1 kB\n"),
        Some(1_024_000)
    );
}
