//! A host's memory and a cluster's members, as Incus (or the local `/proc/meminfo`) tells
//! them: what `[daemon] host_reserve` is checked against (see `crate::headroom`).

use serde::Deserialize;
use serde_json::Value;

/// The memory of one host (a server, or a cluster member), bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostMemory {
    pub total: u64,
    /// What new work can use without swapping: `MemAvailable`, or Incus' total − used.
    pub available: u64,
}

/// `/proc/meminfo` → `MemTotal` and `MemAvailable` (the kernel's estimate of what can be
/// allocated without swapping: free memory and the reclaimable part of the page cache and
/// slabs, less the low watermarks). `None` when either is missing.
pub fn from_meminfo(text: &str) -> Option<HostMemory> {
    let field = |name: &str| {
        text.lines().find_map(|l| {
            let rest = l.strip_prefix(name)?.strip_prefix(':')?;
            let kb: u64 = rest.trim().trim_end_matches("kB").trim().parse().ok()?;
            kb.checked_mul(1024)
        })
    };
    Some(HostMemory {
        total: field("MemTotal")?,
        available: field("MemAvailable")?,
    })
}

/// The `metadata` of `GET /1.0/resources` → `memory.total` and `memory.total −
/// memory.used`. Incus computes `used` as total − free − page cache − buffers (with `total`
/// the physical memory, a little above `MemTotal`), so what this leaves is optimistic: all
/// of the page cache (shared memory and tmpfs included) counts as available.
pub fn from_resources(metadata: &Value) -> Option<HostMemory> {
    let total = metadata.pointer("/memory/total")?.as_u64()?;
    let used = metadata.pointer("/memory/used")?.as_u64()?;
    Some(HostMemory {
        total,
        available: total.saturating_sub(used),
    })
}

/// A member of an Incus cluster (`GET /1.0/cluster/members?recursion=1`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct ClusterMember {
    pub server_name: String,
    /// `Online`, `Offline`, `Evacuated`, `Blocked`…
    #[serde(default)]
    pub status: String,
    /// The cluster groups it belongs to (a group's `target = "@NAME"`).
    #[serde(default)]
    pub groups: Vec<String>,
}

impl ClusterMember {
    /// Instances can be placed and started there.
    pub fn is_online(&self) -> bool {
        self.status == "Online"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meminfo_in_kilobytes() {
        let text = "MemTotal:       24684092 kB\nMemFree:         5285760 kB\n\
                    MemAvailable:   22750864 kB\nBuffers:          123 kB\n";
        assert_eq!(
            from_meminfo(text),
            Some(HostMemory {
                total: 24_684_092 * 1024,
                available: 22_750_864 * 1024
            })
        );
        assert_eq!(from_meminfo("MemTotal: 1 kB\n"), None);
        assert_eq!(from_meminfo("MemTotalX: 1 kB\nMemAvailable: 1 kB"), None);
    }

    #[test]
    fn resources_as_incus_6_0_answers_them() {
        // `incus query /1.0/resources` on the project machine (the fields read, and a few).
        let v: Value = serde_json::from_str(
            r#"{"cpu":{},"memory":{"hugepages_size":2097152,"hugepages_total":0,
                "hugepages_used":0,"nodes":[{"numa_node":0,"total":25769803776,
                "used":19848859648}],"total":25769803776,"used":2718679040},"system":{}}"#,
        )
        .unwrap();
        assert_eq!(
            from_resources(&v),
            Some(HostMemory {
                total: 25_769_803_776,
                available: 25_769_803_776 - 2_718_679_040
            })
        );
        assert_eq!(from_resources(&serde_json::json!({"memory": {}})), None);
    }

    #[test]
    fn members_as_listed() {
        let m: Vec<ClusterMember> = serde_json::from_str(
            r#"[{"server_name":"m1","status":"Online","groups":["default","web"],"url":"x"},
                {"server_name":"m2","status":"Offline"}]"#,
        )
        .unwrap();
        assert!(m[0].is_online() && !m[1].is_online());
        assert_eq!(m[0].groups, ["default", "web"]);
        assert!(m[1].groups.is_empty());
    }
}
