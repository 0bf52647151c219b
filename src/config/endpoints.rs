//! `[groups.NAME.endpoints]` → an [`EndpointsSpec`]: the program that publishes the group's
//! in-service instances to a load balancer, the port they are published with, how long one
//! run may take and how long a removed instance stays up once out of the set; every problem
//! reported at its key.

use std::time::Duration;

use super::diag::{Collector, Severity};
use super::fields::Fields;
use super::keys::{self, Table};
use super::signals::check_program;
use crate::model::EndpointsSpec;

/// The shortest `timeout` accepted.
pub const TIMEOUT_MIN: Duration = Duration::from_secs(1);

/// The longest `timeout` accepted.
pub const TIMEOUT_MAX: Duration = Duration::from_secs(300);

/// The longest `deregistration_delay` accepted.
pub const DELAY_MAX: Duration = Duration::from_secs(3600);

/// Reads the `endpoints` table of the group `t`, if it has one; `ready_port` is the `ready`
/// table's port, the default of `port`. `None` when it has none, and when it has errors (they
/// are in `c`, which rejects the file). With `check_files`, the program's file is checked as
/// an external signal's is.
pub(super) fn read(
    c: &mut Collector,
    t: &mut Fields,
    ready_port: Option<u16>,
    check_files: bool,
) -> Option<EndpointsSpec> {
    let e = t.table(c, "endpoints")?;
    table(c, e, ready_port, check_files)
}

fn table(
    c: &mut Collector,
    mut t: Fields,
    ready_port: Option<u16>,
    check_files: bool,
) -> Option<EndpointsSpec> {
    let before = c.diagnostics.len();
    let port = t.count(c, "port");
    let command = t.strings(c, "command");
    let command = t.required(c, "command", command);
    let timeout = t.duration_within(c, "timeout", TIMEOUT_MIN, TIMEOUT_MAX);
    let delay = t.duration_within(c, "deregistration_delay", Duration::ZERO, DELAY_MAX);
    let (port_key, command_key) = (t.key("port"), t.key("command"));
    let span = t.span();
    let has_port = t.has("port");
    t.finish(c, &keys::names(Table::Endpoints));

    let port = match port {
        Some((n, span)) => match u16::try_from(n) {
            Ok(p) if p > 0 => Some(p),
            _ => {
                c.error(
                    Some(span),
                    &port_key,
                    format!("{n} is out of range: must be from 1 to 65535"),
                );
                None
            }
        },
        None if !has_port && ready_port.is_none() => {
            c.error(
                Some(span),
                &port_key,
                "missing: the port the instances take requests on (it defaults to the ready \
                 table's port, and this group's ready table has none)",
            );
            None
        }
        None => ready_port,
    };
    if let Some((argv, span)) = &command {
        let checked = match argv.first() {
            None => Err(
                "must name a program, e.g. [\"/usr/lib/incus-hpa/hooks/haproxy\", \
                         \"--backend\", \"web\"]"
                    .to_owned(),
            ),
            Some(program) if check_files => check_program(program),
            Some(program) if !program.starts_with('/') => Err(format!(
                "the program {:?} is not an absolute path: name it from / (such as \
                 /usr/lib/incus-hpa/hooks/haproxy); it is not looked up in PATH",
                crate::text::printable(program)
            )),
            Some(_) => Ok(()),
        };
        if let Err(e) = checked {
            c.error(Some(span.clone()), &command_key, e);
        }
    }
    if c.diagnostics[before..]
        .iter()
        .any(|d| d.severity == Severity::Error)
    {
        return None;
    }
    Some(EndpointsSpec {
        port: port?,
        command: command?.0,
        timeout: timeout.unwrap_or(EndpointsSpec::TIMEOUT),
        deregistration_delay: delay.unwrap_or(EndpointsSpec::DEREGISTRATION_DELAY),
    })
}

#[cfg(test)]
#[path = "endpoints_tests.rs"]
mod tests;
