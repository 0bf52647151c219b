//! Serving traffic: what makes one of a group's instances ready to take requests
//! (`[groups.NAME.ready]`), and what the daemon knows of each instance's readiness.
//!
//! An instance is *in service* (counted as capacity and measured) once it is running and,
//! when the group has a `ready` table, its check has passed; until then it is *starting*. A
//! group without a `ready` table serves as soon as an instance runs, as before.

use std::fmt;
use std::net::IpAddr;
use std::time::Duration;

/// The interface whose address a check (and a load balancer) reaches an instance on, unless
/// `[groups.NAME.ready] interface` names another.
pub const DEFAULT_INTERFACE: &str = "eth0";

/// How an instance is checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Probe {
    /// `GET http://ADDRESS:port/path` from the daemon's host: a 2xx or 3xx answer is ready.
    Http { port: u16, path: String },
    /// A TCP connection to `ADDRESS:port` from the daemon's host.
    Tcp { port: u16 },
    /// A program run inside the instance through the Incus API: exit 0 is ready.
    Command(Vec<String>),
}

impl Probe {
    /// The port a check reaches, when it reaches one.
    pub fn port(&self) -> Option<u16> {
        match self {
            Probe::Http { port, .. } | Probe::Tcp { port } => Some(*port),
            Probe::Command(_) => None,
        }
    }

    /// Whether the check needs the instance's address (it reaches it over the network).
    pub fn needs_address(&self) -> bool {
        !matches!(self, Probe::Command(_))
    }
}

impl fmt::Display for Probe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Probe::Http { port, path } => write!(f, "HTTP GET :{port}{path}"),
            Probe::Tcp { port } => write!(f, "TCP connect :{port}"),
            Probe::Command(argv) => write!(f, "command {}", argv.join(" ")),
        }
    }
}

/// `[groups.NAME.ready]`: when an instance of the group is ready to take requests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadySpec {
    pub probe: Probe,
    /// How often each running instance is checked.
    pub period: Duration,
    /// How long one check may take before it counts as failed.
    pub timeout: Duration,
    /// Consecutive failed checks that take a ready instance out of service.
    pub failures: u32,
    /// An instance never ready this long after its start is a failed start: replaced.
    pub start_timeout: Duration,
    /// The interface whose address is checked (and published).
    pub interface: String,
}

impl ReadySpec {
    /// The defaults of every key but the probe.
    pub fn with_probe(probe: Probe) -> Self {
        Self {
            probe,
            period: Duration::from_secs(2),
            timeout: Duration::from_secs(1),
            failures: 3,
            start_timeout: Duration::from_secs(120),
            interface: DEFAULT_INTERFACE.to_owned(),
        }
    }
}

/// `[groups.NAME.endpoints]`: the group's in-service instances are published to a load
/// balancer by running `command` with the set on its standard input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointsSpec {
    /// The port each endpoint is published with.
    pub port: u16,
    /// The program (absolute path, root's) and its arguments, run on the daemon's host.
    pub command: Vec<String>,
    /// How long one run may take.
    pub timeout: Duration,
    /// After an instance leaves the set (its removal), how long before it is drained and
    /// stopped.
    pub deregistration_delay: Duration,
}

impl EndpointsSpec {
    /// The default `timeout`.
    pub const TIMEOUT: Duration = Duration::from_secs(10);
    /// The default `deregistration_delay`.
    pub const DEREGISTRATION_DELAY: Duration = Duration::from_secs(10);

    /// How long a removal waits for the set without the instance to be published: a run in
    /// flight, then its own, and a second to spare.
    pub fn removal_wait(&self) -> Duration {
        self.timeout * 2 + Duration::from_secs(1)
    }
}

/// What the daemon knows of one instance's readiness.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Readiness {
    /// The group has no `ready` table (or the instance does not run): it serves when it runs.
    #[default]
    Unchecked,
    /// Running, and not ready yet: its checks have not passed once since its start. `why` is
    /// the last check's failure (empty before the first check ends).
    Starting { why: String },
    /// Its last check passed, or fewer than `failures` checks in a row have failed since.
    Ready,
    /// It was ready, and `failures` checks in a row failed: out of service.
    NotReady { why: String },
    /// Never ready within `start_timeout` of its start: a failed start.
    NeverReady { why: String },
}

impl Readiness {
    /// Short machine-friendly name (status, metrics labels).
    pub fn as_str(&self) -> &'static str {
        match self {
            Readiness::Unchecked => "unchecked",
            Readiness::Starting { .. } => "starting",
            Readiness::Ready => "ready",
            Readiness::NotReady { .. } => "not-ready",
            Readiness::NeverReady { .. } => "never-ready",
        }
    }

    /// Why it is not ready, when it is not.
    pub fn why(&self) -> Option<&str> {
        match self {
            Readiness::Starting { why }
            | Readiness::NotReady { why }
            | Readiness::NeverReady { why } => Some(why),
            Readiness::Unchecked | Readiness::Ready => None,
        }
    }

    /// It may take requests (as far as its checks tell).
    pub fn serves(&self) -> bool {
        matches!(self, Readiness::Unchecked | Readiness::Ready)
    }
}

impl fmt::Display for Readiness {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.why() {
            Some(why) if !why.is_empty() => write!(f, "{} ({why})", self.as_str()),
            _ => f.write_str(self.as_str()),
        }
    }
}

/// An instance's address on its group's interface, once known.
pub type Address = Option<IpAddr>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readiness_says_why_it_is_not_ready() {
        assert_eq!(Readiness::Ready.to_string(), "ready");
        let r = Readiness::NotReady {
            why: "HTTP 503".into(),
        };
        assert_eq!(r.to_string(), "not-ready (HTTP 503)");
        assert!(!r.serves());
        assert!(Readiness::Unchecked.serves());
        assert_eq!(
            Readiness::Starting { why: String::new() }.to_string(),
            "starting"
        );
    }

    #[test]
    fn only_network_checks_need_an_address() {
        assert!(Probe::Tcp { port: 80 }.needs_address());
        assert!(!Probe::Command(vec!["/bin/true".into()]).needs_address());
        assert_eq!(ReadySpec::with_probe(Probe::Tcp { port: 80 }).failures, 3);
    }
}
