//! One check of one instance, within the group's `timeout`: an HTTP GET, a TCP connection, or
//! a command run inside the instance through the Incus API. The outcome says what passed
//! ("HTTP 200") or, short and plain, why it failed ("connection refused", "HTTP 503", "timed
//! out after 1s", "exit code 1", "no address on eth0 yet").

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use crate::incus::Incus;
use crate::model::{Probe, ReadySpec};

use super::track::Outcome;

/// Runs checks; holds the HTTP client they share.
#[derive(Debug, Clone)]
pub struct Checker {
    http: reqwest::Client,
}

/// The instance a check is of.
#[derive(Debug, Clone, Copy)]
pub struct Target<'a> {
    pub project: &'a str,
    pub name: &'a str,
    /// Its address on the group's interface, when known.
    pub address: Option<IpAddr>,
}

impl Checker {
    /// A checker whose HTTP client goes to the instances directly (no proxy from the
    /// environment), follows no redirect (a 3xx is an answer: ready), keeps no connection
    /// between checks (each check opens its own, as a new client would) and uses no TLS.
    pub fn new() -> Result<Self, String> {
        let http = reqwest::Client::builder()
            .use_preconfigured_tls(crate::incus::tls::unused())
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .pool_max_idle_per_host(0)
            .build()
            .map_err(|e| format!("cannot make the HTTP client of the readiness checks: {e}"))?;
        Ok(Self { http })
    }

    /// One check of `target` as `spec` says, within `spec.timeout`.
    pub async fn check(&self, incus: &dyn Incus, target: Target<'_>, spec: &ReadySpec) -> Outcome {
        let timeout = spec.timeout;
        let address = match (spec.probe.needs_address(), target.address) {
            (true, None) => return Err(format!("no address on {} yet", spec.interface)),
            (_, a) => a,
        };
        let run = async {
            match (&spec.probe, address) {
                (Probe::Http { port, path }, Some(ip)) => {
                    self.http_get(SocketAddr::new(ip, *port), path, timeout)
                        .await
                }
                (Probe::Tcp { port }, Some(ip)) => tcp(SocketAddr::new(ip, *port)).await,
                (Probe::Command(argv), _) => {
                    match incus.exec(target.project, target.name, argv).await {
                        Ok(0) => Ok("exit code 0".to_owned()),
                        Ok(code) => Err(format!("exit code {code}")),
                        Err(e) => Err(format!("could not run the check: {e}")),
                    }
                }
                (_, None) => Err(format!("no address on {} yet", spec.interface)),
            }
        };
        tokio::time::timeout(timeout, run)
            .await
            .unwrap_or_else(|_| Err(timed_out(timeout)))
    }

    /// `GET http://ADDRESS:port/path`: a 2xx or 3xx answer passes.
    async fn http_get(&self, to: SocketAddr, path: &str, timeout: Duration) -> Outcome {
        // `SocketAddr` writes an IPv6 address in brackets, as a URL wants it.
        let url = format!("http://{to}{path}");
        let answer = self.http.get(&url).timeout(timeout).send().await;
        match answer {
            Ok(r) => {
                let code = r.status().as_u16();
                let said = format!("HTTP {code}");
                if r.status().is_success() || r.status().is_redirection() {
                    Ok(said)
                } else {
                    Err(said)
                }
            }
            Err(e) if e.is_timeout() => Err(timed_out(timeout)),
            Err(e) => Err(why(&e)),
        }
    }
}

/// A TCP connection to `to`: made, it passes (and is closed at once).
async fn tcp(to: SocketAddr) -> Outcome {
    match tokio::net::TcpStream::connect(to).await {
        Ok(_) => Ok("connected".to_owned()),
        Err(e) => Err(io_why(&e)),
    }
}

fn timed_out(timeout: Duration) -> String {
    format!("timed out after {}", humantime::format_duration(timeout))
}

/// Why a request failed: its innermost I/O error says it best.
fn why(e: &(dyn std::error::Error + 'static)) -> String {
    let mut cause = Some(e);
    let mut innermost = e.to_string();
    while let Some(c) = cause {
        if let Some(io) = c.downcast_ref::<io::Error>() {
            return io_why(io);
        }
        innermost = c.to_string();
        cause = c.source();
    }
    innermost
}

/// An I/O error in a few words.
fn io_why(e: &io::Error) -> String {
    // EAFNOSUPPORT (RestrictAddressFamilies=), EPERM and EACCES (IPAddressDeny=): the
    // daemon's systemd sandbox, not the instance.
    if matches!(e.raw_os_error(), Some(97 | 1 | 13)) {
        return format!("the daemon may not reach the network ({e}): its systemd unit denies it");
    }
    match e.kind() {
        io::ErrorKind::ConnectionRefused => "connection refused".into(),
        io::ErrorKind::ConnectionReset => "connection reset".into(),
        io::ErrorKind::ConnectionAborted => "connection aborted".into(),
        io::ErrorKind::UnexpectedEof => "connection closed without an answer".into(),
        io::ErrorKind::TimedOut => "timed out".into(),
        _ => match e.raw_os_error() {
            Some(101) => "network unreachable".into(),
            Some(113) => "no route to host".into(),
            _ => e.to_string(),
        },
    }
}

#[cfg(test)]
#[path = "probe_tests.rs"]
mod tests;
