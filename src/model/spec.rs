//! The desired state: what the operator declared, daemon-wide (`[daemon]`) and per group
//! (`[groups.NAME]`), as `config` builds it from the file. Immutable once built.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use super::endpoint::{Endpoint, TlsFiles};

/// The largest `max` accepted: more instances than Incus runs on any cluster, and a bound on
/// how many actions one pass can plan.
pub const MAX_INSTANCES: u32 = 10_000;

/// A validated group name: lowercase ASCII letters, digits and '-', starting with a letter.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GroupName(String);

impl GroupName {
    /// Longest accepted group name (it is also the default instance name prefix).
    pub const MAX_LEN: usize = 40;

    /// Checks `s` and wraps it, or says what is wrong with it.
    pub fn parse(s: &str) -> Result<Self, String> {
        if s.is_empty() {
            return Err("a group name cannot be empty".into());
        }
        if s.len() > Self::MAX_LEN {
            return Err(format!(
                "a group name has at most {} characters",
                Self::MAX_LEN
            ));
        }
        if !s.starts_with(|c: char| c.is_ascii_lowercase()) {
            return Err("a group name starts with a lowercase letter".into());
        }
        if let Some(c) = s
            .chars()
            .find(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-'))
        {
            return Err(format!(
                "a group name has only lowercase letters, digits and '-' (found {c:?})"
            ));
        }
        Ok(Self(s.to_owned()))
    }

    /// The name as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for GroupName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Where the daemon listens unless `[daemon] control_socket` says otherwise (the unit's
/// `RuntimeDirectory=`).
pub const DEFAULT_CONTROL_SOCKET: &str = "/run/incus-hpa/control.sock";

/// Where instance memory readings come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MemorySourceKind {
    /// The local cgroup files when readable, the Incus API for any instance they do not cover.
    #[default]
    Auto,
    /// Only the local cgroup files (incusd on this host).
    Cgroup,
    /// Only `GET /1.0/instances/NAME/state` (costs incusd ~40 ms of CPU per instance on 6.0).
    Api,
}

/// One `[[groups.NAME.external]]`: a program whose output is a number the group scales on.
#[derive(Debug, Clone, PartialEq)]
pub struct ExternalSpec {
    /// The program (an absolute path) and its arguments, run directly, without a shell.
    pub command: Vec<String>,
    /// The value one instance can take: the signal wants `ceil(value / target)` instances.
    pub target: f64,
    /// How long the program may run before its reading counts as missing.
    pub timeout: Duration,
}

/// One `[[groups.NAME.schedule]]`: a window, opened by a cron expression, during which the
/// group's `min` (and `max`, if given) are replaced.
#[derive(Debug, Clone, PartialEq)]
pub struct ScheduleSpec {
    /// A five-field cron expression (minute hour day-of-month month day-of-week).
    pub cron: String,
    /// How long the window stays open after each time the expression matches.
    pub duration: Duration,
    /// The group's `min` while the window is open.
    pub min: Option<u32>,
    /// The group's `max` while the window is open.
    pub max: Option<u32>,
    /// An IANA time zone name such as "Europe/Paris"; `None`: the host's zone.
    pub timezone: Option<String>,
}

/// Daemon-wide settings (`[daemon]`).
#[derive(Debug, Clone, PartialEq)]
pub struct DaemonSpec {
    /// How often every group is reconciled.
    pub interval: Duration,
    /// Where memory readings come from.
    pub memory_source: MemorySourceKind,
    /// How often the cache of instances is listed afresh, events or not.
    pub resync: Duration,
    /// How many actions of one pass run at once.
    pub max_parallel_actions: usize,
    /// Where `incus-hpa status` and `/metrics` are served (read at start).
    pub control_socket: std::path::PathBuf,
    /// Where `/metrics` is also served over TCP, if anywhere (read at start).
    pub metrics_address: Option<std::net::SocketAddr>,
    /// How long a group's leader lease lasts (see `crate::lease`; read at start).
    pub lease: Duration,
    /// Where Incus is (`[daemon] incus`; read at start). `None`: the command line's socket.
    pub incus: Option<Endpoint>,
    /// The TLS files, when `incus` is an HTTPS address.
    pub tls: Option<TlsFiles>,
    /// The memory each host keeps available: no creation or start takes a host below it.
    pub host_reserve: super::HostReserve,
    /// Where each group's history is kept (`[daemon] state_directory`; read at start).
    /// `None`: the unit's `STATE_DIRECTORY`, else nowhere.
    pub state_directory: Option<std::path::PathBuf>,
}

impl Default for DaemonSpec {
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(15),
            memory_source: MemorySourceKind::Auto,
            resync: Duration::from_secs(300),
            max_parallel_actions: 4,
            control_socket: DEFAULT_CONTROL_SOCKET.into(),
            metrics_address: None,
            lease: Duration::from_secs(15),
            incus: None,
            tls: None,
            host_reserve: super::HostReserve::default(),
            state_directory: None,
        }
    }
}

/// One group of instances as the operator declared it (`[groups.NAME]`).
#[derive(Debug, Clone, PartialEq)]
pub struct GroupSpec {
    pub name: GroupName,
    pub min: u32,
    pub max: u32,
    /// Target average memory use, percent of each instance's limit (1–100); `None`: memory is
    /// not a signal of this group.
    pub memory_threshold: Option<f64>,
    /// Target average CPU use, percent of each instance's CPU limit ([`GroupSpec::cpu_limit`]).
    pub cpu_threshold: Option<f64>,
    /// Pressure (PSI "some avg10", percent) above which the group grows.
    pub pressure_threshold: Option<f64>,
    /// No scale-up while utilization / threshold is at most 1 + this (Kubernetes: 0.1).
    pub tolerance_up: f64,
    /// No scale-down while utilization / threshold is at least 1 − this (Kubernetes: 0.1).
    pub tolerance_down: f64,
    /// Each instance's CPU limit, in CPUs, from the group's `limits.cpu` or
    /// `limits.cpu.allowance` (required with `cpu_threshold`).
    pub cpu_limit: Option<f64>,
    /// Programs whose output the group scales on.
    pub external: Vec<ExternalSpec>,
    /// Windows that replace `min` (and `max`) while they are open.
    pub schedule: Vec<ScheduleSpec>,
    pub image: String,
    pub instance_prefix: String,
    pub profiles: Vec<String>,
    pub project: String,
    pub config: BTreeMap<String, String>,
    pub scale_down_stabilization: Duration,
    pub scale_up_stabilization: Duration,
    /// At most this many instances added by one reconcile (`None`: no limit).
    pub max_scale_up_step: Option<u32>,
    /// At most this many instances removed by one reconcile (`None`: no limit).
    pub max_scale_down_step: Option<u32>,
    /// How long a graceful stop may take before the instance is stopped by force.
    pub stop_timeout: Duration,
    /// How long an instance may stay unhealthy (frozen, in error, stuck in a transition) before
    /// it is removed; it is replaced as soon as it is seen unhealthy.
    pub unhealthy_grace: Duration,
    /// The first delay before restarting an instance that crashed again; doubles on every
    /// crash, up to [`RESTART_BACKOFF_MAX`].
    pub restart_backoff: Duration,
    /// The daemon's `interval`: the period step limits apply to.
    pub interval: Duration,
    /// How many stopped instances are kept ready to start, on top of `max`.
    pub warm_pool: u32,
    /// Observed, decided and reported, but nothing is created, started or deleted.
    pub paused: bool,
    /// Which instances a scale-down removes first.
    pub scale_down_order: ScaleDownOrder,
    /// How the desired count follows memory.
    pub policy: Policy,
    /// Run inside an instance before its graceful stop (empty: none).
    pub drain_command: Vec<String>,
    /// How long the drain command may run.
    pub drain_timeout: Duration,
    /// Where a cluster places new instances: a member, or `@GROUP` for a cluster group
    /// (`None`: Incus' scheduler chooses).
    pub target: Option<String>,
    /// When an instance is ready to take requests (`None`: as soon as it runs).
    pub ready: Option<super::ReadySpec>,
    /// Where the group's in-service instances are published (`None`: nowhere).
    pub endpoints: Option<super::EndpointsSpec>,
}

impl GroupSpec {
    /// The interface whose address checks reach and endpoints publish: the `ready` table's,
    /// else [`super::DEFAULT_INTERFACE`].
    pub fn interface(&self) -> &str {
        self.ready
            .as_ref()
            .map_or(super::DEFAULT_INTERFACE, |r| r.interface.as_str())
    }
}

/// How a group's desired count follows its memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Policy {
    /// The Kubernetes HPA, exactly: its formula, tolerance band and stabilization windows, and,
    /// unless step limits are set, its default scale-up rate (per 15 s, the larger of +4
    /// instances and +100 %).
    Kubernetes,
    /// Sized from an estimate of the demand: base use learned, readings at the limit doubled,
    /// growth carried one interval ahead, scale-down let go of after a minute unless the load
    /// oscillates (see `decide::adaptive`). The default.
    #[default]
    Adaptive,
}

impl Policy {
    pub fn as_str(&self) -> &'static str {
        match self {
            Policy::Kubernetes => "kubernetes",
            Policy::Adaptive => "adaptive",
        }
    }
}

/// Which instances a scale-down removes first (after stopped ones, which always go first).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ScaleDownOrder {
    /// The most recently created (Kubernetes' ReplicaSet does the same).
    #[default]
    Newest,
    /// The longest-running.
    Oldest,
    /// The one using the least memory (the least work cut off); unmeasured ones last.
    LeastMemory,
}

impl ScaleDownOrder {
    pub fn as_str(&self) -> &'static str {
        match self {
            ScaleDownOrder::Newest => "newest",
            ScaleDownOrder::Oldest => "oldest",
            ScaleDownOrder::LeastMemory => "least-memory",
        }
    }
}

/// The longest `stop_timeout` accepted: with the forced stop and the delete after it (20 s
/// each at most), one removal stays within the 165 s a shutdown waits for it
/// (`crate::daemon::SHUTDOWN_BUDGET`), itself within the unit's `TimeoutStopSec=180s`.
pub const STOP_TIMEOUT_MAX: Duration = Duration::from_secs(120);

/// Longest delay between two restarts of a crash-looping instance, or two starts of one that
/// fails to start.
pub const RESTART_BACKOFF_MAX: Duration = Duration::from_secs(300);

/// The whole desired state: immutable once built; a reload builds a new one.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct DesiredState {
    pub daemon: DaemonSpec,
    pub groups: BTreeMap<GroupName, GroupSpec>,
}
