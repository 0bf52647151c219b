//! The [`Incus`] trait over the REST API: for each call, the path and body it sends and how
//! its answer is read. How a request goes out, and an operation is waited for, is the parent
//! module's.

use std::collections::HashMap;
use std::net::IpAddr;

use async_trait::async_trait;
use reqwest::Method;
use serde_json::Value;

use super::{enc, store, Client, DELETE_WAIT, STOP_MARGIN};
use crate::incus::host::{from_meminfo, from_resources};
use crate::incus::metrics::from_metrics;
use crate::incus::{
    ClusterMember, CreateInstance, HostMemory, Incus, IncusError, Instance, LeaseHome, Problem,
    StateChange, Unreachable,
};
use crate::model::Memory;

/// Where the local host's memory is read when Incus is the local socket.
const MEMINFO: &str = "/proc/meminfo";

#[async_trait]
impl Incus for Client {
    async fn exec(&self, project: &str, name: &str, command: &[String]) -> Result<i64, IncusError> {
        let path = format!("/1.0/instances/{}/exec?project={}", enc(name), enc(project));
        let body = serde_json::json!({
            "command": command,
            "wait-for-websocket": false,
            "interactive": false,
            "record-output": false,
        });
        let what = format!(
            "running {} in {name}",
            command.first().map_or("", String::as_str)
        );
        let meta = self
            .operation_result(
                Method::POST,
                &path,
                Some(&body),
                &what,
                self.operation_timeout,
            )
            .await?;
        Ok(meta.get("return").and_then(Value::as_i64).unwrap_or(-1))
    }

    async fn server_version(&self) -> Result<String, IncusError> {
        let v: Value = self.get_json("/1.0", "GET /1.0").await?;
        if let Some(tls) = &self.tls {
            // Over HTTPS, Incus answers `/1.0` to anyone and says whether it trusts them.
            if v.get("auth").and_then(Value::as_str) != Some("trusted") {
                return Err(IncusError::Transport(Unreachable {
                    socket: self.socket.clone(),
                    problem: Problem::Untrusted(tls.untrusted(&self.socket)),
                }));
            }
        }
        Ok(v.pointer("/environment/server_version")
            .and_then(Value::as_str)
            .unwrap_or("unknown")
            .to_owned())
    }

    async fn list(&self, project: &str) -> Result<Vec<Instance>, IncusError> {
        let path = format!("/1.0/instances?recursion=1&project={}", enc(project));
        self.get_json(&path, "listing instances").await
    }

    async fn list_by_config(
        &self,
        project: &str,
        key: &str,
        value: &str,
    ) -> Result<Vec<Instance>, IncusError> {
        // The server-side filter is a case-insensitive regex: callers check the exact value.
        let filter = format!("config.{key} eq {value}");
        let path = format!(
            "/1.0/instances?recursion=1&project={}&filter={}",
            enc(project),
            enc(&filter)
        );
        self.get_json(&path, "listing instances").await
    }

    async fn get(&self, project: &str, name: &str) -> Result<Option<Instance>, IncusError> {
        let path = format!("/1.0/instances/{}?project={}", enc(name), enc(project));
        match self
            .get_json(&path, &format!("reading instance {name}"))
            .await
        {
            Ok(i) => Ok(Some(i)),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    async fn create(&self, project: &str, req: &CreateInstance) -> Result<(), IncusError> {
        let body = serde_json::to_value(req).map_err(|e| IncusError::Decode {
            what: "create request".into(),
            message: e.to_string(),
        })?;
        let mut path = format!("/1.0/instances?project={}", enc(project));
        if let Some(target) = &req.target {
            path.push_str(&format!("&target={}", enc(target)));
        }
        self.operation(
            Method::POST,
            &path,
            Some(&body),
            &format!("creating {}", req.name),
            self.operation_timeout,
        )
        .await
    }

    async fn change_state(
        &self,
        project: &str,
        name: &str,
        change: StateChange,
    ) -> Result<(), IncusError> {
        let body = match change {
            StateChange::Start => serde_json::json!({"action": "start"}),
            StateChange::Stop { timeout, force } => serde_json::json!({
                "action": "stop",
                "timeout": timeout.as_secs().max(1),
                "force": force,
            }),
        };
        let path = format!(
            "/1.0/instances/{}/state?project={}",
            enc(name),
            enc(project)
        );
        let what = match change {
            StateChange::Start => format!("starting {name}"),
            StateChange::Stop { force: true, .. } => format!("force-stopping {name}"),
            StateChange::Stop { .. } => format!("stopping {name}"),
        };
        let wait = match change {
            StateChange::Start => self.operation_timeout,
            StateChange::Stop {
                force: true,
                timeout,
            } => timeout,
            StateChange::Stop { timeout, .. } => timeout + STOP_MARGIN,
        };
        self.operation(Method::PUT, &path, Some(&body), &what, wait)
            .await
    }

    async fn delete(&self, project: &str, name: &str) -> Result<(), IncusError> {
        let path = format!("/1.0/instances/{}?project={}", enc(name), enc(project));
        self.operation(
            Method::DELETE,
            &path,
            None,
            &format!("deleting {name}"),
            DELETE_WAIT,
        )
        .await
    }

    async fn set_config(
        &self,
        project: &str,
        name: &str,
        key: &str,
        value: &str,
    ) -> Result<(), IncusError> {
        let path = format!("/1.0/instances/{}?project={}", enc(name), enc(project));
        let body = serde_json::json!({ "config": { key: value } });
        self.operation(
            Method::PATCH,
            &path,
            Some(&body),
            &format!("setting {key} on {name}"),
            self.timeout,
        )
        .await
    }

    async fn memory_state(&self, project: &str, name: &str) -> Result<Option<Memory>, IncusError> {
        let path = format!(
            "/1.0/instances/{}/state?project={}",
            enc(name),
            enc(project)
        );
        let v: Value = self
            .get_json(&path, &format!("reading the state of {name}"))
            .await?;
        Ok(state_reading(&v))
    }

    async fn addresses(
        &self,
        project: &str,
        name: &str,
        interface: &str,
    ) -> Result<Vec<IpAddr>, IncusError> {
        let path = format!(
            "/1.0/instances/{}/state?project={}",
            enc(name),
            enc(project)
        );
        let v: Value = self
            .get_json(&path, &format!("reading the addresses of {name}"))
            .await?;
        Ok(state_addresses(&v, interface))
    }

    async fn host_memory(&self, member: Option<&str>) -> Result<HostMemory, IncusError> {
        if member.is_none() && self.tls.is_none() {
            // Incus is the local socket: its host is this one, and the kernel says it best.
            let what = || format!("reading {MEMINFO}");
            let text =
                tokio::fs::read_to_string(MEMINFO)
                    .await
                    .map_err(|e| IncusError::Decode {
                        what: what(),
                        message: e.to_string(),
                    })?;
            return from_meminfo(&text).ok_or_else(|| IncusError::Decode {
                what: what(),
                message: "no MemTotal or MemAvailable".into(),
            });
        }
        let mut path = "/1.0/resources".to_owned();
        if let Some(member) = member {
            path.push_str(&format!("?target={}", enc(member)));
        }
        let what = match member {
            Some(m) => format!("reading the resources of cluster member {m}"),
            None => "reading the server's resources".into(),
        };
        let v: Value = self.get_json(&path, &what).await?;
        from_resources(&v).ok_or_else(|| IncusError::Decode {
            what,
            message: "no memory.total or memory.used".into(),
        })
    }

    async fn cluster_members(&self) -> Result<Vec<ClusterMember>, IncusError> {
        let cluster: Value = self.get_json("/1.0/cluster", "reading the cluster").await?;
        if cluster.get("enabled").and_then(Value::as_bool) != Some(true) {
            return Ok(Vec::new());
        }
        self.get_json(
            "/1.0/cluster/members?recursion=1",
            "listing the cluster members",
        )
        .await
    }

    async fn leases(&self, project: &str) -> Result<LeaseHome, IncusError> {
        store::read(self, project, &store::LEASES).await
    }

    async fn put_leases(&self, project: &str, new: &LeaseHome) -> Result<bool, IncusError> {
        store::write(self, project, new, &store::LEASES).await
    }

    async fn learned(&self, project: &str) -> Result<LeaseHome, IncusError> {
        store::read(self, project, &store::LEARNED).await
    }

    async fn put_learned(&self, project: &str, new: &LeaseHome) -> Result<bool, IncusError> {
        store::write(self, project, new, &store::LEARNED).await
    }

    async fn memory_metrics(
        &self,
        project: &str,
        member: Option<&str>,
    ) -> Result<HashMap<String, Memory>, IncusError> {
        let mut path = format!("/1.0/metrics?project={}", enc(project));
        if let Some(member) = member {
            path.push_str(&format!("&target={}", enc(member)));
        }
        let text = self
            .get_text(&path, &format!("reading the metrics of project {project}"))
            .await?;
        Ok(from_metrics(&text, project))
    }
}

/// The reading in an instance's `/state`: `memory.usage` (page cache included) of
/// `memory.total`, and `cpu.usage`, the CPU time used in ns (the cgroup's `cpuacct.usage` or
/// `usage_usec`; incusd writes -1 when it could not read it, and leaves 0 when the host has no
/// CPU accounting: both are no reading). `None` without a usage and a positive limit.
pub(super) fn state_reading(v: &Value) -> Option<Memory> {
    let usage = v.pointer("/memory/usage").and_then(Value::as_u64)?;
    let limit = v.pointer("/memory/total").and_then(Value::as_u64)?;
    (limit > 0).then(|| Memory {
        usage,
        limit,
        oom_kills: None,
        cpu_ns: v
            .pointer("/cpu/usage")
            .and_then(Value::as_u64)
            .filter(|&ns| ns > 0),
        pressure: None,
    })
}

/// The global addresses of `interface` in an instance's `/state` (`network.IFACE.addresses[]`,
/// each with `family` `inet` or `inet6`, `address` and `scope`): IPv4 first, then IPv6, each in
/// the order listed. Entries that do not read as such are skipped; a missing or `null` network
/// is no address.
pub(super) fn state_addresses(v: &Value, interface: &str) -> Vec<IpAddr> {
    let listed = v
        .get("network")
        .and_then(|n| n.get(interface))
        .and_then(|i| i.get("addresses"))
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    let global = |family: &'static str| {
        listed
            .iter()
            .filter(move |a| a.get("family").and_then(Value::as_str) == Some(family))
            .filter(|a| a.get("scope").and_then(Value::as_str) == Some("global"))
            .filter_map(|a| a.get("address")?.as_str()?.parse::<IpAddr>().ok())
    };
    global("inet").chain(global("inet6")).collect()
}
