//! The Incus boundary: a trait for everything the daemon asks of Incus, the API types it reads
//! (tolerant: unknown fields are ignored), and the typed error. The client (unix socket or
//! HTTPS, [`Endpoint`]) is in [`client`], its TLS in [`tls`]; tests use an in-memory fake behind
//! the same trait.

pub mod client;
pub mod host;
pub mod metrics;
pub mod tls;
mod unreachable;

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

pub use crate::model::{Endpoint, DEFAULT_HTTPS_PORT};
use crate::model::{InstanceStatus, Memory};
pub use host::{ClusterMember, HostMemory};
pub(crate) use unreachable::group_name;
pub use unreachable::{Problem, Unreachable};

/// What went wrong talking to Incus, one variant per layer.
#[derive(Debug, thiserror::Error)]
pub enum IncusError {
    /// The socket could not be reached, or Incus did not answer in time: says why and what to do.
    #[error("{0}")]
    Transport(Unreachable),
    /// Incus answered with an error status.
    #[error("Incus refused {what}: {message} (HTTP {status})")]
    Api {
        what: String,
        status: u16,
        message: String,
    },
    /// An asynchronous operation finished in failure.
    #[error("Incus operation for {what} failed: {message}")]
    Operation { what: String, message: String },
    /// An asynchronous operation had not ended when its wait did: it may still succeed.
    #[error("Incus operation for {what} had not ended after {waited:?} (it is {status})")]
    Unfinished {
        what: String,
        status: String,
        waited: Duration,
    },
    /// The answer could not be understood.
    #[error("unexpected answer from Incus to {what}: {message}")]
    Decode { what: String, message: String },
}

impl IncusError {
    /// True when the error means "no such instance".
    pub fn is_not_found(&self) -> bool {
        matches!(self, IncusError::Api { status: 404, .. })
    }

    /// True when Incus could not be reached at all (as opposed to answering with an error).
    pub fn is_transport(&self) -> bool {
        matches!(self, IncusError::Transport(_))
    }

    /// True when nothing says how the request ended: the connection failed or timed out, or
    /// its operation had not ended when the wait did. What it asked for may have happened, or
    /// may still happen.
    pub fn is_in_doubt(&self) -> bool {
        matches!(
            self,
            IncusError::Transport(_) | IncusError::Unfinished { .. }
        )
    }
}

/// An instance as listed (`GET /1.0/instances?recursion=1`).
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct Instance {
    pub name: String,
    #[serde(default)]
    pub status: String,
    /// `null` for an instance on a cluster member that does not answer: read as empty.
    /// Without the keys Incus writes for itself (see [`Instance::keeps`]).
    #[serde(default, deserialize_with = "kept_config")]
    pub config: HashMap<String, String>,
    #[serde(default)]
    pub created_at: String,
    /// When it was last started.
    #[serde(default)]
    pub last_used_at: String,
    #[serde(default)]
    pub project: String,
    /// The cluster member it is on; `none` (or empty) when Incus is not clustered.
    #[serde(default)]
    pub location: String,
    /// Its member does not answer: this is what was last known of it (see
    /// [`Instance::is_unavailable`]), not what Incus says now.
    #[serde(skip)]
    pub unreachable: bool,
}

impl Instance {
    /// Whether a config key is kept when an instance is read: every key but those Incus writes
    /// for itself (`image.*`, `volatile.*`: a dozen per instance, two of them long ID maps),
    /// except `volatile.uuid`, which ownership reads. Nothing the daemon reads is left out; a
    /// thousand instances read take about 1.5 MiB less, and their copies none.
    pub fn keeps(key: &str) -> bool {
        key == crate::model::UUID_KEY
            || !(key.starts_with("volatile.") || key.starts_with("image."))
    }

    /// True for what a cluster lists in place of an instance on a member that does not answer:
    /// status Error, its member, and nothing else (no config: not even its group key).
    pub fn is_unavailable(&self) -> bool {
        self.status == "Error" && self.config.is_empty() && !self.member().is_empty()
    }

    /// The cluster member it is on, empty when Incus is not clustered.
    pub fn member(&self) -> &str {
        match self.location.as_str() {
            "none" => "",
            m => m,
        }
    }

    /// The status as the daemon reasons about it. Incus 6.0 reports `Ready` for a running
    /// instance whose workload signalled readiness through `/dev/incus`.
    pub fn status(&self) -> InstanceStatus {
        if self.unreachable {
            return InstanceStatus::Unreachable;
        }
        match self.status.as_str() {
            "Running" => InstanceStatus::Running,
            "Ready" => InstanceStatus::Ready,
            "Stopped" => InstanceStatus::Stopped,
            "Frozen" => InstanceStatus::Frozen,
            "Error" => InstanceStatus::Error,
            _ => InstanceStatus::Transition,
        }
    }

    /// Creation time in nanoseconds since the Unix epoch (0 when unreadable).
    pub fn created_nanos(&self) -> i64 {
        rfc3339(&self.created_at)
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .and_then(|d| i64::try_from(d.as_nanos()).ok())
            .unwrap_or(0)
    }

    /// How long before `now` it was last started; `None` when unknown (never started, or a
    /// clock that went backwards).
    pub fn since_start(&self, now: std::time::SystemTime) -> Option<Duration> {
        let started = rfc3339(&self.last_used_at)?;
        // Incus writes 1970-01-01 for an instance never started.
        if started <= std::time::UNIX_EPOCH {
            return None;
        }
        now.duration_since(started).ok()
    }
}

/// An instance's config as read: a map that may be `null` (read as empty), without the keys
/// [`Instance::keeps`] leaves out, which are skipped as they are read.
fn kept_config<'de, D>(d: D) -> Result<HashMap<String, String>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    struct Kept;
    impl<'de> serde::de::Visitor<'de> for Kept {
        type Value = HashMap<String, String>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a map of strings, or null")
        }
        fn visit_unit<E>(self) -> Result<Self::Value, E> {
            Ok(HashMap::new())
        }
        fn visit_none<E>(self) -> Result<Self::Value, E> {
            Ok(HashMap::new())
        }
        fn visit_some<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            d.deserialize_map(self)
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(
            self,
            mut map: A,
        ) -> Result<Self::Value, A::Error> {
            let mut kept = HashMap::new();
            while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
                if Instance::keeps(&key) {
                    kept.insert(key.into_owned(), map.next_value()?);
                } else {
                    map.next_value::<serde::de::IgnoredAny>()?;
                }
            }
            Ok(kept)
        }
    }
    d.deserialize_option(Kept)
}

/// An RFC 3339 time as Incus writes it (UTC, `Z`, up to nanoseconds).
fn rfc3339(s: &str) -> Option<std::time::SystemTime> {
    humantime::parse_rfc3339_weak(s.trim_end_matches('Z')).ok()
}

/// The body of `POST /1.0/instances`.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct CreateInstance {
    pub name: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub source: ImageSource,
    pub config: HashMap<String, String>,
    pub profiles: Vec<String>,
    pub start: bool,
    /// Where a cluster places it (`?target=`): a member, or `@GROUP` for a cluster group;
    /// `None` lets Incus' scheduler choose.
    #[serde(skip)]
    pub target: Option<String>,
}

/// Where a new instance's root filesystem comes from.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ImageSource {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub alias: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fingerprint: Option<String>,
}

impl ImageSource {
    /// A local image by alias, or by fingerprint when `image` looks like one (hex, ≥ 12 chars).
    pub fn local(image: &str) -> Self {
        let is_fp = image.len() >= 12 && image.chars().all(|c| c.is_ascii_hexdigit());
        Self {
            kind: "image".into(),
            alias: (!is_fp).then(|| image.to_owned()),
            fingerprint: is_fp.then(|| image.to_owned()),
        }
    }
}

/// A state change (`PUT /1.0/instances/NAME/state`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum StateChange {
    Start,
    Stop { timeout: Duration, force: bool },
}

/// The profile of each project that holds its leader leases, the lease store (see
/// `crate::lease`): a name nobody gives a profile meant for instances. A profile rather than
/// the project's own config: a certificate restricted to the project may write the one and not
/// the other. The daemon makes it, marked [`STORE_KEY`]; no instance uses it. (incus-hpa 0.2
/// used a profile named `incus-hpa`, a name a person may well have chosen: it is never read
/// nor written now.)
pub const LEASE_PROFILE: &str = "incus-hpa.leases";

/// The config key that marks the lease store as the daemon's own: [`STORE_VALUE`].
pub const STORE_KEY: &str = "user.incus-hpa.store";
/// The value of [`STORE_KEY`] in the lease store.
pub const STORE_VALUE: &str = "leases";

/// The profile of each project where a lease holder leaves what each group's decisions learned,
/// for the daemon that takes the group over next (see `crate::lease::learned`): apart from
/// the lease store, which every renewal reads and writes, so that its size never slows a
/// renewal. Made by the daemon, marked [`STORE_KEY`]` = `[`LEARNED_VALUE`]; no instance uses it.
pub const LEARNED_PROFILE: &str = "incus-hpa.learned";
/// The value of [`STORE_KEY`] in the learned store.
pub const LEARNED_VALUE: &str = "learned";

/// The lease store of a project ([`LEASE_PROFILE`]), as read: its config, and everything else
/// a write must send back unchanged, with the ETag a compare-and-swap needs.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct LeaseHome {
    pub config: BTreeMap<String, String>,
    pub description: String,
    /// Its devices, as read: written back untouched.
    pub devices: serde_json::Map<String, serde_json::Value>,
    /// What uses it (`/1.0/instances/NAME…`): a store is used by nothing.
    pub used_by: Vec<String>,
    /// The project the profile lives in, as Incus says (`project`): the default project for a
    /// project made with `features.profiles=false`, which uses the default project's profiles
    /// (its store is shared, see `crate::lease::key`). Empty when not said. Never written.
    pub project: String,
    /// The `ETag` of the answer: a write with `If-Match` on it fails if another came first.
    pub etag: String,
}

/// Everything the daemon asks of Incus. Every call has a timeout; every asynchronous operation
/// is waited for and its outcome read from the body.
#[async_trait]
pub trait Incus: Send + Sync {
    /// The server's version, to check that Incus answers.
    async fn server_version(&self) -> Result<String, IncusError>;
    /// Every instance of `project` (`GET /1.0/instances?recursion=1&project=P`, one request,
    /// no state), unfiltered: on a cluster, an instance on a member that does not answer is
    /// listed without its config (see [`Instance::is_unavailable`]), so a filter on config
    /// would drop it.
    async fn list(&self, project: &str) -> Result<Vec<Instance>, IncusError>;
    /// Instances in `project` whose `key` config equals `value` (one request, no state).
    async fn list_by_config(
        &self,
        project: &str,
        key: &str,
        value: &str,
    ) -> Result<Vec<Instance>, IncusError>;
    /// One instance, or `None` when it does not exist.
    async fn get(&self, project: &str, name: &str) -> Result<Option<Instance>, IncusError>;
    /// Creates (and, with `start`, starts) an instance; returns once the operation finished.
    async fn create(&self, project: &str, req: &CreateInstance) -> Result<(), IncusError>;
    /// Starts or stops an instance; returns once the operation finished.
    async fn change_state(
        &self,
        project: &str,
        name: &str,
        change: StateChange,
    ) -> Result<(), IncusError>;
    /// Runs `command` in a running instance (no terminal, output discarded) and returns its exit
    /// status once it ended.
    async fn exec(&self, project: &str, name: &str, command: &[String]) -> Result<i64, IncusError>;
    /// Deletes a stopped instance; returns once the operation finished.
    async fn delete(&self, project: &str, name: &str) -> Result<(), IncusError>;
    /// Sets one config key of an instance (`PATCH`, other keys untouched).
    async fn set_config(
        &self,
        project: &str,
        name: &str,
        key: &str,
        value: &str,
    ) -> Result<(), IncusError>;
    /// Memory of a running instance from `GET /1.0/instances/NAME/state` (expensive on 6.0).
    async fn memory_state(&self, project: &str, name: &str) -> Result<Option<Memory>, IncusError>;
    /// The global addresses of a running instance on `interface`, from `GET
    /// /1.0/instances/NAME/state` (`network.IFACE.addresses`): the IPv4 ones first, then the
    /// IPv6 ones, each in the order Incus lists them, so the first is the one to reach it on.
    /// Empty when the interface has none yet (or does not exist, or the instance is stopped).
    async fn addresses(
        &self,
        project: &str,
        name: &str,
        interface: &str,
    ) -> Result<Vec<IpAddr>, IncusError>;
    /// Memory of every running instance of `project` that incusd's metrics cover, by name,
    /// from one `GET /1.0/metrics?project=P`: those on the cluster member `member`
    /// (`&target=MEMBER`), or on the member answering when `None` (all of them when Incus is
    /// not clustered). incusd renders every running instance of the project there, as
    /// expensive as a `/state` each, then serves the answer from a cache for ~8 s; a
    /// concurrent rebuild can answer 423. The reading is the working set, see
    /// [`metrics::from_metrics`].
    async fn memory_metrics(
        &self,
        project: &str,
        member: Option<&str>,
    ) -> Result<HashMap<String, Memory>, IncusError>;
    /// The memory of the host Incus runs on (`member` `None`), or of the cluster member
    /// `member`: the local `/proc/meminfo` when Incus is the local socket and `member` is
    /// `None`, else `GET /1.0/resources[?target=MEMBER]` (see [`host`]).
    async fn host_memory(&self, member: Option<&str>) -> Result<HostMemory, IncusError>;
    /// The cluster's members (`GET /1.0/cluster/members?recursion=1`), after `GET /1.0/cluster`
    /// says it is one; empty for a single server.
    async fn cluster_members(&self) -> Result<Vec<ClusterMember>, IncusError>;
    /// The lease store of `project` (`GET /1.0/profiles/incus-hpa.leases?project=P`), with its
    /// ETag; made first, marked [`STORE_KEY`], when no profile has that name.
    async fn leases(&self, project: &str) -> Result<LeaseHome, IncusError>;
    /// Writes the store back (`PUT` with `If-Match: etag`): config, description and devices as
    /// given, so that whatever the daemon does not own goes back as it was read.
    /// `Ok(false)` when another writer changed it since `etag` was read (HTTP 412): nothing
    /// was written.
    async fn put_leases(&self, project: &str, new: &LeaseHome) -> Result<bool, IncusError>;
    /// The learned store of `project` ([`LEARNED_PROFILE`]), as [`Incus::leases`] reads the
    /// lease store (made first, marked, when missing). Not every Incus here has one.
    async fn learned(&self, project: &str) -> Result<LeaseHome, IncusError> {
        Err(IncusError::Api {
            what: format!("reading profile {LEARNED_PROFILE} of project {project}"),
            status: 501,
            message: "not served here".into(),
        })
    }
    /// Writes the learned store back, as [`Incus::put_leases`] writes the lease store.
    async fn put_learned(&self, project: &str, _new: &LeaseHome) -> Result<bool, IncusError> {
        Err(IncusError::Api {
            what: format!("writing profile {LEARNED_PROFILE} of project {project}"),
            status: 501,
            message: "not served here".into(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(created_at: &str) -> Instance {
        Instance {
            location: String::new(),
            unreachable: false,
            name: "x".into(),
            status: "Running".into(),
            config: HashMap::new(),
            created_at: created_at.into(),
            last_used_at: String::new(),
            project: "default".into(),
        }
    }

    #[test]
    fn creation_times_order_to_the_nanosecond() {
        let a = at("2026-11-30T04:56:52.166537123Z").created_nanos();
        let b = at("2026-11-30T04:56:52.166537124Z").created_nanos();
        assert!(a > 1_700_000_000_000_000_000 && b == a + 1, "{a} {b}");
        assert_eq!(
            at("2026-11-30T04:56:52Z").created_nanos(),
            1_796_014_612_000_000_000
        );
        assert_eq!(at("garbage").created_nanos(), 0);
    }

    #[test]
    fn ready_is_a_status_of_its_own_and_unknown_ones_are_transitions() {
        let with = |s: &str| Instance {
            status: s.into(),
            ..at("")
        };
        assert_eq!(with("Ready").status(), InstanceStatus::Ready);
        assert!(with("Ready").status().is_healthy());
        assert_eq!(with("Frozen").status(), InstanceStatus::Frozen);
        assert_eq!(with("Starting").status(), InstanceStatus::Transition);
        assert_eq!(with("").status(), InstanceStatus::Transition);
    }

    #[test]
    fn time_since_the_last_start() {
        let i = Instance {
            last_used_at: "2026-11-30T04:56:52.5Z".into(),
            ..at("")
        };
        let now = rfc3339("2026-11-30T04:57:00Z").unwrap();
        assert_eq!(i.since_start(now), Some(Duration::from_millis(7500)));
        let never = Instance {
            last_used_at: "1970-01-01T00:00:00Z".into(),
            ..at("")
        };
        assert_eq!(never.since_start(now), None);
        assert_eq!(at("").since_start(now), None);
    }

    #[test]
    fn images_by_alias_or_fingerprint() {
        assert_eq!(
            ImageSource::local("busybox").alias.as_deref(),
            Some("busybox")
        );
        let fp = ImageSource::local("0123456789abcdef");
        assert_eq!(
            (fp.alias, fp.fingerprint.as_deref()),
            (None, Some("0123456789abcdef"))
        );
    }

    #[test]
    fn unknown_fields_are_ignored() {
        let i: Instance = serde_json::from_str(
            r#"{"name":"a","status":"Stopped","config":{},"created_at":"","new_field":1}"#,
        )
        .unwrap();
        assert_eq!(i.status(), InstanceStatus::Stopped);
    }

    #[test]
    fn a_read_keeps_every_config_key_but_those_incus_writes_for_itself_and_the_uuid() {
        let i: Instance = serde_json::from_str(
            r#"{"name": "web-a", "status": "Running", "config": {
                "volatile.uuid": "9ffd1eae", "volatile.idmap.next": "[{\"Isuid\":true}]",
                "volatile.last_state.power": "RUNNING", "image.os": "busybox",
                "limits.memory": "64MiB", "user.incus-hpa.group": "web", "user.note": "kept"},
                "expanded_config": {"volatile.uuid": "other"}}"#,
        )
        .unwrap();
        let mut keys: Vec<&str> = i.config.keys().map(String::as_str).collect();
        keys.sort();
        assert_eq!(
            keys,
            [
                "limits.memory",
                "user.incus-hpa.group",
                "user.note",
                "volatile.uuid"
            ]
        );
        assert_eq!(i.config["volatile.uuid"], "9ffd1eae");
        for config in ["null", "{}"] {
            let i: Instance =
                serde_json::from_str(&format!(r#"{{"name": "a", "config": {config}}}"#)).unwrap();
            assert!(i.config.is_empty(), "{config}");
        }
        let i: Instance = serde_json::from_value(serde_json::json!({
            "name": "a", "config": {"image.os": "x", "user.a": "b"}}))
        .unwrap();
        assert_eq!(i.config.len(), 1, "from a value too");
    }
}
