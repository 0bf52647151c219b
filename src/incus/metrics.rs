//! The Prometheus text of `GET /1.0/metrics`: a small tolerant parser ([`parse_sample`]) and
//! the working set and CPU time of each instance of a project ([`from_metrics`]).
//!
//! The parser is the daemon's own: the `prometheus-parse` crate splits label values on `,` and
//! `=` without unescaping, and the other parsers on crates.io are LGPL or single unproven
//! releases.

use std::collections::HashMap;

use crate::model::Memory;

/// The metric names [`from_metrics`] reads.
const METRIC_TOTAL: &str = "incus_memory_MemTotal_bytes";
const METRIC_FREE: &str = "incus_memory_MemFree_bytes";
const METRIC_INACTIVE_FILE: &str = "incus_memory_Inactive_file_bytes";
const METRIC_OOM_KILLS: &str = "incus_memory_OOM_kills_total";
const METRIC_CPU: &str = "incus_cpu_seconds_total";

/// The `mode`s of [`METRIC_CPU`] that are not CPU time used. incusd writes only `user` and
/// `system` for a container (from `cpuacct.usage_all` or `cpu.stat`), but all eight modes of
/// the guest's `/proc/stat` for a virtual machine.
const CPU_NOT_USED: [&str; 3] = ["idle", "iowait", "steal"];

/// The working set of each instance of `project` in a `GET /1.0/metrics` answer, by name.
///
/// For a container incusd writes `MemTotal` = the effective limit (`limits.memory`, at most the
/// host's memory), `MemFree` = limit − the cgroup's usage (`memory.usage_in_bytes` or
/// `memory.current`, page cache included) and `Inactive_file` = the cgroup's
/// `total_inactive_file` or `inactive_file`. So usage = `MemTotal` − `MemFree`, and the
/// reading is usage − `Inactive_file` with `MemTotal` as the limit: the same working set as
/// [`CgroupSource`], so page cache that the kernel can drop does not hold a group up.
/// (`Cached_bytes` would also subtract active cache, which is in use; `RSS_bytes` exists on
/// cgroup v1 only and leaves out shmem and tmpfs, which do count against the limit.)
///
/// `OOM_kills_total`, when incusd writes it, is the OOM killer's count.
///
/// The CPU time is `incus_cpu_seconds_total` summed over its `cpu`s and the modes of time used
/// (all but `idle`, `iowait` and `steal`): for a container, `user` + `system`, which is the
/// cgroup's `cpuacct.usage` or `usage_usec`, the counter [`CgroupSource`] and `/state` read.
///
/// An instance lacks a reading when `MemTotal` or `MemFree` is missing or not a number, or
/// when `MemFree` exceeds `MemTotal`: incusd writes usage −1 when it could not read it.
pub fn from_metrics(text: &str, project: &str) -> HashMap<String, Memory> {
    #[derive(Default)]
    struct Fields {
        total: Option<f64>,
        free: Option<f64>,
        inactive: Option<f64>,
        oom_kills: Option<f64>,
        /// Seconds, summed over the samples read so far.
        cpu: Option<f64>,
    }
    let mut by_name: HashMap<String, Fields> = HashMap::new();
    for s in text.lines().filter_map(parse_sample) {
        if !matches!(
            s.name,
            METRIC_TOTAL | METRIC_FREE | METRIC_INACTIVE_FILE | METRIC_OOM_KILLS | METRIC_CPU
        ) || s.label("project").is_some_and(|p| p != project)
        {
            continue;
        }
        let Some(name) = s.label("name") else {
            continue;
        };
        let f = by_name.entry(name.to_owned()).or_default();
        if s.name == METRIC_CPU {
            if !s.label("mode").is_some_and(|m| CPU_NOT_USED.contains(&m)) {
                f.cpu = Some(f.cpu.unwrap_or(0.0) + s.value);
            }
            continue;
        }
        let slot = match s.name {
            METRIC_TOTAL => &mut f.total,
            METRIC_FREE => &mut f.free,
            METRIC_OOM_KILLS => &mut f.oom_kills,
            _ => &mut f.inactive,
        };
        *slot = Some(s.value);
    }
    by_name
        .into_iter()
        .filter_map(|(name, f)| {
            let mut m = working_set(f.total?, f.free?, f.inactive)?;
            m.oom_kills = f
                .oom_kills
                .filter(|k| k.is_finite() && *k >= 0.0)
                .map(|k| k as u64);
            m.cpu_ns = f
                .cpu
                .filter(|c| c.is_finite() && *c >= 0.0)
                .map(|c| (c * 1e9).round() as u64);
            Some((name, m))
        })
        .collect()
}

/// Usage minus inactive file cache from the metrics' fields; see [`from_metrics`].
fn working_set(total: f64, free: f64, inactive: Option<f64>) -> Option<Memory> {
    if !(total.is_finite() && free.is_finite() && total >= 1.0 && (0.0..=total).contains(&free)) {
        return None;
    }
    let usage = total - free;
    let inactive = inactive
        .filter(|v| v.is_finite() && *v > 0.0)
        .unwrap_or(0.0);
    Some(Memory {
        usage: (usage - inactive.min(usage)).round() as u64,
        limit: total.round() as u64,
        oom_kills: None,
        ..Default::default()
    })
}

/// One sample of the Prometheus text format: `name{label="value",…} value [timestamp]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample<'a> {
    pub name: &'a str,
    /// Label names and their unescaped values, in the order written.
    pub labels: Vec<(&'a str, String)>,
    pub value: f64,
}

impl Sample<'_> {
    /// The value of label `key`, if the sample has it.
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// Parses one line of the Prometheus text format: `None` for a blank line, a comment (`# HELP`,
/// `# TYPE`, `# EOF`…) or anything malformed, which costs only that line. Label values may
/// hold `\\`, `\"` and `\n` escapes, `,` and `}`; values are Go floats (`1.5e+09`, `NaN`,
/// `+Inf`); a trailing timestamp is ignored.
pub fn parse_sample(line: &str) -> Option<Sample<'_>> {
    let line = line.trim();
    if line.starts_with('#') {
        return None;
    }
    let is_name = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    let end = line.find(|c: char| !is_name(c)).unwrap_or(line.len());
    let (name, mut rest) = line.split_at(end);
    if name.is_empty() || name.starts_with(|c: char| c.is_ascii_digit()) {
        return None;
    }
    let mut labels = Vec::new();
    if let Some(r) = rest.trim_start().strip_prefix('{') {
        rest = r;
        loop {
            rest = rest.trim_start();
            if let Some(r) = rest.strip_prefix('}') {
                rest = r;
                break;
            }
            let end = rest.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))?;
            let (key, r) = rest.split_at(end);
            if key.is_empty() {
                return None;
            }
            let r = r.trim_start().strip_prefix('=')?.trim_start();
            let (value, r) = quoted(r.strip_prefix('"')?)?;
            labels.push((key, value));
            let r = r.trim_start();
            rest = match r.strip_prefix(',') {
                Some(r) => r,
                None if r.starts_with('}') => r,
                None => return None,
            };
        }
    }
    let value = rest.split_whitespace().next()?.parse().ok()?;
    Some(Sample {
        name,
        labels,
        value,
    })
}

/// A label value after its opening quote: the unescaped value and what follows the closing
/// quote, or `None` when it does not close.
fn quoted(s: &str) -> Option<(String, &str)> {
    let mut value = String::new();
    let mut chars = s.char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            '"' => return Some((value, &s[i + 1..])),
            '\\' => match chars.next()?.1 {
                'n' => value.push('\n'),
                other => value.push(other),
            },
            c => value.push(c),
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_parse_with_labels_exponents_and_timestamps() {
        let s = parse_sample(
            r#"incus_memory_MemTotal_bytes{name="web-a",project="default",type="container"} 6.7108864e+07"#,
        )
        .unwrap();
        assert_eq!(s.name, "incus_memory_MemTotal_bytes");
        assert_eq!(s.label("name"), Some("web-a"));
        assert_eq!(s.label("type"), Some("container"));
        assert_eq!(s.label("nope"), None);
        assert_eq!(s.value, 67_108_864.0);
        let t = parse_sample("up 1 1700000000000").unwrap();
        assert_eq!((t.name, t.labels.len(), t.value), ("up", 0, 1.0));
        // Blanks around tokens, a trailing comma, empty braces, a trailing \r.
        let u = parse_sample("  m { a = \"1\" , b=\"2\", }\t-3.5E-1\r").unwrap();
        assert_eq!(u.labels, vec![("a", "1".into()), ("b", "2".into())]);
        assert_eq!(u.value, -0.35);
        assert_eq!(parse_sample("m{} 2").unwrap().value, 2.0);
    }

    #[test]
    fn label_values_unescape_and_may_hold_separators() {
        let s = parse_sample(r#"m{path="C:\\dir",say="a \"b\", c}",nl="x\ny"} 1"#).unwrap();
        assert_eq!(s.label("path"), Some(r"C:\dir"));
        assert_eq!(s.label("say"), Some(r#"a "b", c}"#));
        assert_eq!(s.label("nl"), Some("x\ny"));
    }

    #[test]
    fn special_values_parse_as_go_writes_them() {
        let v = |line: &str| parse_sample(line).map(|s| s.value);
        assert!(v("m NaN").unwrap().is_nan());
        assert_eq!(v("m +Inf"), Some(f64::INFINITY));
        assert_eq!(v("m -Inf"), Some(f64::NEG_INFINITY));
        assert_eq!(v("m 2.4684084001e+10"), Some(24_684_084_001.0));
        assert_eq!(v("m 1e3"), Some(1000.0));
    }

    #[test]
    fn comments_blanks_and_garbage_are_skipped() {
        for line in [
            "",
            "   ",
            "# HELP incus_memory_MemFree_bytes The amount of free memory.",
            "# TYPE incus_memory_MemFree_bytes gauge",
            "# EOF",
            "m",
            "m{a=\"1\"}",
            "m{a=\"unterminated} 1",
            "m{a=1} 1",
            "m{a=\"1\" b=\"2\"} 1",
            "m{=\"1\"} 1",
            "m{a=\"1\"} one",
            "9m 1",
            "{a=\"1\"} 1",
            "m 0x10",
        ] {
            assert_eq!(parse_sample(line), None, "{line:?}");
        }
    }

    /// Lines as incusd 6.0.4 writes them, with the instances' other metrics around.
    const METRICS: &str = r#"# HELP incus_cpu_seconds_total The total number of CPU time used in seconds.
# TYPE incus_cpu_seconds_total counter
incus_cpu_seconds_total{cpu="0",mode="system",name="web-a",project="default",type="container"} 0.05
incus_cpu_seconds_total{cpu="0",mode="user",name="web-a",project="default",type="container"} 1.25
incus_cpu_seconds_total{cpu="1",mode="system",name="web-a",project="default",type="container"} 0.2
incus_cpu_seconds_total{cpu="1",mode="user",name="web-a",project="default",type="container"} 2.5e-05
incus_cpu_seconds_total{cpu="0",mode="system",name="web-a",project="other",type="container"} 3
incus_cpu_seconds_total{cpu="0",mode="system",name="nofree",project="default",type="container"} 1
# HELP incus_memory_Inactive_file_bytes The amount of file-backed memory on inactive LRU list.
# TYPE incus_memory_Inactive_file_bytes gauge
incus_memory_Inactive_file_bytes{name="web-a",project="default",type="container"} 1.048576e+07
incus_memory_Inactive_file_bytes{name="web-b",project="default",type="container"} 0

# HELP incus_memory_MemFree_bytes The amount of free memory.
# TYPE incus_memory_MemFree_bytes gauge
incus_memory_MemFree_bytes{name="web-a",project="default",type="container"} 3.3554432e+07
incus_memory_MemFree_bytes{name="web-b",project="default",type="container"} 6.0817408e+07
incus_memory_MemFree_bytes{name="broken",project="default",type="container"} 2.4684084001e+10
incus_memory_MemFree_bytes{name="web-a",project="other",type="container"} 1
# HELP incus_memory_MemTotal_bytes The amount of used memory.
# TYPE incus_memory_MemTotal_bytes gauge
incus_memory_MemTotal_bytes{name="web-a",project="default",type="container"} 6.7108864e+07
incus_memory_MemTotal_bytes{name="web-b",project="default",type="container"} 6.7108864e+07
incus_memory_MemTotal_bytes{name="broken",project="default",type="container"} 2.4684084e+10
incus_memory_MemTotal_bytes{name="nofree",project="default",type="container"} 6.7108864e+07
incus_memory_MemTotal_bytes{name="nan",project="default",type="container"} NaN
incus_memory_MemFree_bytes{name="nan",project="default",type="container"} 1
incus_memory_MemTotal_bytes{name="web-a",project="other",type="container"} 2
incus_memory_RSS_bytes{name="web-a",project="default",type="container"} 1.2e+07
# HELP incus_memory_OOM_kills_total The number of out of memory kills.
# TYPE incus_memory_OOM_kills_total counter
incus_memory_OOM_kills_total{name="web-a",project="default",type="container"} 3
incus_uptime_seconds 643.678511837
# EOF
"#;

    #[test]
    fn metrics_give_the_working_set_of_each_instance_of_the_project() {
        let m = from_metrics(METRICS, "default");
        // usage 32 MiB, of which 10 MiB inactive cache: 22 MiB of 64 MiB; user and system
        // time of both CPUs, 1.500025 s.
        assert_eq!(
            m.get("web-a"),
            Some(&Memory {
                usage: 22 << 20,
                limit: 64 << 20,
                oom_kills: Some(3),
                cpu_ns: Some(1_500_025_000),
                pressure: None,
            })
        );
        assert_eq!(
            m.get("web-b"),
            Some(&Memory {
                usage: 6 << 20,
                limit: 64 << 20,
                oom_kills: None,
                ..Default::default()
            })
        );
        // Usage unreadable (MemFree = MemTotal + 1), MemFree missing (its CPU time alone is
        // no reading), MemTotal not a number.
        assert_eq!(m.len(), 2, "{m:?}");
        assert_eq!(
            from_metrics(METRICS, "other").get("web-a"),
            Some(&Memory {
                usage: 1,
                limit: 2,
                oom_kills: None,
                cpu_ns: Some(3_000_000_000),
                pressure: None,
            })
        );
        assert!(from_metrics("# EOF\n", "default").is_empty());
    }

    /// The lines of one instance: 64 MiB, 32 MiB free, and `cpu` lines.
    fn with_cpu(name: &str, kind: &str, cpu: &[(&str, &str)]) -> String {
        let labels = format!(r#"name="{name}",project="default",type="{kind}""#);
        let mut text = format!(
            "incus_memory_MemTotal_bytes{{{labels}}} 6.7108864e+07\n\
             incus_memory_MemFree_bytes{{{labels}}} 3.3554432e+07\n"
        );
        for (mode, value) in cpu {
            text.push_str(&format!(
                "incus_cpu_seconds_total{{cpu=\"0\",mode=\"{mode}\",{labels}}} {value}\n"
            ));
        }
        text
    }

    #[test]
    fn cpu_time_is_the_modes_of_time_used_summed() {
        let cpu = |name: &str, kind: &str, lines: &[(&str, &str)]| {
            from_metrics(&with_cpu(name, kind, lines), "default")
                .get(name)
                .map(|m| m.cpu_ns)
        };
        // cgroup v2: a single `cpu="0"`, user and system.
        assert_eq!(
            cpu(
                "c",
                "container",
                &[("user", "1.219628"), ("system", "1.252742")]
            ),
            Some(Some(2_472_370_000))
        );
        // A virtual machine's agent writes every mode of the guest's /proc/stat: idle, iowait
        // and steal are not time the instance used.
        let vm = [
            ("iowait", "5"),
            ("irq", "0.25"),
            ("idle", "100"),
            ("nice", "0.5"),
            ("softirq", "0.25"),
            ("steal", "1"),
            ("system", "1"),
            ("user", "2"),
        ];
        assert_eq!(cpu("vm", "virtual-machine", &vm), Some(Some(4_000_000_000)));
        // No CPU lines, a value that is not a count of seconds: a memory reading without CPU.
        assert_eq!(cpu("none", "container", &[]), Some(None));
        assert_eq!(
            cpu("nan", "container", &[("user", "1"), ("system", "NaN")]),
            Some(None)
        );
        assert_eq!(cpu("neg", "container", &[("user", "-1")]), Some(None));
        assert_eq!(cpu("inf", "container", &[("user", "+Inf")]), Some(None));
    }

    #[test]
    fn cache_larger_than_usage_reads_zero() {
        assert_eq!(
            working_set(100.0, 40.0, Some(80.0)),
            Some(Memory {
                usage: 0,
                limit: 100,
                oom_kills: None,
                ..Default::default()
            })
        );
        assert_eq!(
            working_set(100.0, 40.0, Some(f64::NAN)),
            Some(Memory {
                usage: 60,
                limit: 100,
                oom_kills: None,
                ..Default::default()
            })
        );
        assert_eq!(working_set(0.0, 0.0, None), None);
        assert_eq!(working_set(100.0, -1.0, None), None);
        assert_eq!(working_set(f64::INFINITY, 1.0, None), None);
    }
}
