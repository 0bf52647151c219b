//! The ready-made endpoint hooks (`incus-hpa hook …`): programs the daemon runs, as a group's
//! `[groups.NAME.endpoints] command`, whenever the group's set of endpoints changes. Each reads
//! the set as JSON on standard input,
//! `{"group":"web","project":"default","endpoints":[{"instance":"web-3kd9x2","address":"10.98.0.12","port":80}]}`,
//! makes a load balancer send requests to exactly those endpoints, and exits 0 only once it
//! has: [`haproxy`] through HAProxy's runtime API (no reload), [`nginx`] by rewriting an
//! upstream file and reloading nginx. Any failure is one line on standard error and exit 1,
//! which the daemon logs and retries. Running a hook twice with the same set changes nothing
//! the second time.
//!
//! [`haproxy_rate`] is not a hook but an external program (`[[groups.NAME.external]]`): it
//! prints a HAProxy backend's current session rate, to scale on requests.

pub mod haproxy;
pub mod haproxy_rate;
pub mod nginx;

use std::io::Read;
use std::net::IpAddr;
use std::process::ExitCode;

use serde::Deserialize;

use crate::cli::HookCommand;

/// The set of endpoints a hook is given, as the daemon writes it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct EndpointSet {
    /// The group's name.
    pub group: String,
    /// The Incus project of the group.
    pub project: String,
    /// The instances in service, sorted by name; empty when none is.
    pub endpoints: Vec<Endpoint>,
}

/// One instance in service: where a load balancer reaches it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Endpoint {
    /// The instance's name.
    pub instance: String,
    /// Its address on the group's interface (IPv4 or IPv6, without brackets).
    pub address: IpAddr,
    /// The port requests go to.
    pub port: u16,
}

impl Endpoint {
    /// `ADDRESS:PORT`, with an IPv6 address in brackets.
    pub fn socket_text(&self) -> String {
        std::net::SocketAddr::new(self.address, self.port).to_string()
    }
}

/// Parses the JSON a hook reads on standard input.
pub fn parse_set(text: &str) -> Result<EndpointSet, String> {
    serde_json::from_str(text).map_err(|e| format!("the endpoint set on stdin is not valid: {e}"))
}

/// Reads and parses standard input (to its end).
fn read_stdin() -> Result<EndpointSet, String> {
    let mut text = String::new();
    std::io::stdin()
        .read_to_string(&mut text)
        .map_err(|e| format!("cannot read the endpoint set on stdin: {e}"))?;
    parse_set(&text)
}

/// Runs one `incus-hpa hook` command: exit 0 when done, 1 with one line on stderr otherwise.
pub fn run(command: &HookCommand) -> ExitCode {
    let result = match command {
        HookCommand::Haproxy {
            socket,
            backend,
            server_prefix,
        } => read_stdin().and_then(|set| {
            haproxy::apply(
                socket,
                backend,
                server_prefix.as_deref().unwrap_or(""),
                &set,
            )
        }),
        HookCommand::Nginx {
            upstream_file,
            upstream,
            reload_command,
            pid_file,
        } => read_stdin().and_then(|set| {
            let reload = match pid_file {
                Some(p) => nginx::Reload::Signal(p.clone()),
                None => nginx::Reload::Command(reload_command.clone()),
            };
            nginx::apply(upstream_file, upstream, &reload, &set).map(|_| ())
        }),
        HookCommand::HaproxyRate { socket, backend } => {
            haproxy_rate::rate(socket, backend).map(|r| println!("{r}"))
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(why) => {
            eprintln!("incus-hpa hook: {why}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_daemons_json_is_read() {
        let set = parse_set(
            r#"{"group":"web","project":"default","endpoints":[{"instance":"web-3kd9x2","address":"10.98.0.12","port":80},{"instance":"web-b","address":"fd42::5","port":8080}]}"#,
        )
        .unwrap();
        assert_eq!(set.group, "web");
        assert_eq!(set.endpoints.len(), 2);
        assert_eq!(set.endpoints[0].socket_text(), "10.98.0.12:80");
        assert_eq!(set.endpoints[1].socket_text(), "[fd42::5]:8080");
        let empty = parse_set(r#"{"group":"web","project":"p","endpoints":[]}"#).unwrap();
        assert!(empty.endpoints.is_empty());
        assert!(parse_set(r#"{"group":"web"}"#).is_err());
        assert!(parse_set(
            r#"{"group":"w","project":"p","endpoints":[{"instance":"a","address":"[::1]","port":80}]}"#
        )
        .is_err());
    }
}
