//! `incus-hpa hook haproxy`: makes a HAProxy backend's servers match the endpoint set through
//! HAProxy's runtime API (its admin stats socket), without a reload.
//!
//! The backend is declared with free slots, which the hook fills and empties:
//!
//! ```text
//! global
//!     stats socket /run/haproxy/admin.sock mode 660 level admin
//! backend web
//!     server-template web- 1-20 127.0.0.1:80 disabled
//! ```
//!
//! `show servers state BACKEND` gives the slots (those whose name starts with
//! `--server-prefix`, all by default). An endpoint keeps the slot that has its address and
//! port already; a new one takes a free slot (one in maintenance), with `set server B/S addr
//! A port P` then `set server B/S state ready`; a slot whose endpoint left the set is put in
//! `state maint`. New endpoints are put in service before leaving ones are taken out, so a set
//! that changes whole never leaves the backend empty. A slot that already is as it should be
//! gets no command: a second run with the same set sends none.
//!
//! Why `maint` and not `drain` for a leaving server: both let the requests and connections in
//! flight finish (HAProxy does not cut them unless told to, with `shutdown sessions`); they
//! differ for new requests. A server in `drain` still takes those of clients that persist on it
//! (a stick table, a persistence cookie), and the daemon stops the instance
//! `deregistration_delay` after this hook returns: such a request would then fail. In `maint`
//! no new request goes to it at all, so none is lost, and the delay is what lets the requests
//! in flight finish.
//!
//! More endpoints than slots is an error, before any command is sent. Each command has its
//! own connection (`cmd\n`, read to the end); HAProxy answers `set server … state` with an
//! empty line and `set server … addr` with "IP changed from …" or "no need to change …":
//! anything else is reported as the error.

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::IpAddr;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use super::{Endpoint, EndpointSet};

/// How long one command may take on the socket (connect aside, which is immediate or fails).
const IO_TIMEOUT: Duration = Duration::from_secs(10);

/// The admin-state bits that keep a server out of service: forced (`state maint`), inherited
/// from a tracked server, resolution failure, hostname resolution (SRV_ADMF_FMAINT, IMAINT,
/// RMAINT, HMAINT). The "configured in maintenance" bit (CMAINT, 0x04, from `disabled`) stays
/// set after `state ready` and does not stop traffic.
const MAINT_BITS: u32 = 0x01 | 0x02 | 0x20 | 0x40;
/// Draining, forced or inherited (SRV_ADMF_FDRAIN, IDRAIN).
const DRAIN_BITS: u32 = 0x08 | 0x10;

/// One server of the backend, as `show servers state` says it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Slot {
    /// The server's name (`web-3`).
    pub name: String,
    /// Its address, when it is one (not `-`).
    pub addr: Option<IpAddr>,
    /// Its port.
    pub port: u16,
    /// Its administrative state (`srv_admin_state`, a bit field).
    pub admin: u32,
}

impl Slot {
    /// In maintenance: takes no request.
    pub fn in_maint(&self) -> bool {
        self.admin & MAINT_BITS != 0
    }

    /// Takes new requests: neither in maintenance nor draining.
    pub fn in_service(&self) -> bool {
        !self.in_maint() && self.admin & DRAIN_BITS == 0
    }
}

/// Parses the answer to `show servers state BACKEND` (format 1: a version line, a `#` header
/// naming the columns, a line per server) into its slots, by the columns' names.
pub fn parse_servers_state(text: &str) -> Result<Vec<Slot>, String> {
    let mut lines = text.lines().map(str::trim).filter(|l| !l.is_empty());
    match lines.next() {
        Some("1") => {}
        Some(other) => return Err(format!("HAProxy answered: {other}")),
        None => return Err("HAProxy answered nothing to show servers state".into()),
    }
    let header: Vec<&str> = lines
        .next()
        .and_then(|h| h.strip_prefix('#'))
        .ok_or("no header line in the answer to show servers state")?
        .split_whitespace()
        .collect();
    let column = |name: &str| {
        header
            .iter()
            .position(|c| *c == name)
            .ok_or_else(|| format!("no {name} column in the answer to show servers state"))
    };
    let (name, addr, port, admin) = (
        column("srv_name")?,
        column("srv_addr")?,
        column("srv_port")?,
        column("srv_admin_state")?,
    );
    let mut slots = Vec::new();
    for line in lines {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let field = |i: usize| {
            fields
                .get(i)
                .copied()
                .ok_or_else(|| format!("a short line in show servers state: {line}"))
        };
        slots.push(Slot {
            name: field(name)?.to_owned(),
            addr: field(addr)?.parse().ok(),
            port: field(port)?
                .parse()
                .map_err(|_| format!("a bad srv_port in show servers state: {line}"))?,
            admin: field(admin)?
                .parse()
                .map_err(|_| format!("a bad srv_admin_state in show servers state: {line}"))?,
        });
    }
    Ok(slots)
}

/// What a command's answer must look like to be a success.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    /// An empty answer (`set server … state`).
    Empty,
    /// The answer of a changed or unchanged address (`set server … addr`).
    AddrChanged,
}

/// One runtime API command and the answer it must get.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Command {
    /// The command line, without its newline.
    pub line: String,
    /// The answer that means success.
    pub expect: Expect,
}

impl Command {
    fn state(backend: &str, slot: &str, state: &str) -> Self {
        Command {
            line: format!("set server {backend}/{slot} state {state}"),
            expect: Expect::Empty,
        }
    }

    fn addr(backend: &str, slot: &str, e: &Endpoint) -> Self {
        Command {
            line: format!(
                "set server {backend}/{slot} addr {} port {}",
                e.address, e.port
            ),
            expect: Expect::AddrChanged,
        }
    }

    /// Whether `answer` means the command was accepted.
    pub fn accepted(&self, answer: &str) -> bool {
        let answer = answer.trim();
        match self.expect {
            Expect::Empty => answer.is_empty(),
            Expect::AddrChanged => {
                answer.starts_with("IP changed from") || answer.starts_with("no need to change")
            }
        }
    }
}

/// The commands that make `slots` serve exactly `endpoints` (see the module's header), or an
/// error when there are more endpoints than slots.
pub fn plan(backend: &str, slots: &[Slot], endpoints: &[Endpoint]) -> Result<Vec<Command>, String> {
    if endpoints.len() > slots.len() {
        return Err(format!(
            "{} endpoints but only {} server slots in backend {backend}: declare more (for \
             instance server-template with a larger range) or lower the group's max",
            endpoints.len(),
            slots.len()
        ));
    }
    let at = |s: &Slot, e: &Endpoint| s.addr == Some(e.address) && s.port == e.port;
    let mut taken: BTreeSet<usize> = BTreeSet::new();
    let mut first = Vec::new();
    let mut unplaced = Vec::new();
    // An endpoint keeps a slot at its address: one in service first, else any.
    for e in endpoints {
        let found = (0..slots.len())
            .filter(|i| !taken.contains(i) && at(&slots[*i], e))
            .min_by_key(|i| !slots[*i].in_service());
        match found {
            Some(i) => {
                taken.insert(i);
                if !slots[i].in_service() {
                    first.push(Command::state(backend, &slots[i].name, "ready"));
                }
            }
            None => unplaced.push(e),
        }
    }
    // New endpoints take free slots (in maintenance already), in the backend's order.
    let free: Vec<usize> = (0..slots.len())
        .filter(|i| !taken.contains(i) && slots[*i].in_maint())
        .collect();
    let mut free = free.into_iter();
    let mut later = Vec::new();
    for e in unplaced {
        match free.next() {
            Some(i) => {
                taken.insert(i);
                if !at(&slots[i], e) {
                    first.push(Command::addr(backend, &slots[i].name, e));
                }
                first.push(Command::state(backend, &slots[i].name, "ready"));
            }
            None => later.push(e),
        }
    }
    // Then the slots of endpoints that left go in maintenance; the endpoints still without a
    // slot take those.
    let mut leaving = Vec::new();
    for (i, s) in slots.iter().enumerate() {
        if !taken.contains(&i) && !s.in_maint() {
            first.push(Command::state(backend, &s.name, "maint"));
            leaving.push(i);
        }
    }
    for (e, i) in later.into_iter().zip(leaving) {
        first.push(Command::addr(backend, &slots[i].name, e));
        first.push(Command::state(backend, &slots[i].name, "ready"));
    }
    Ok(first)
}

/// Sends one command on its own connection and returns the whole answer.
pub fn send(socket: &Path, line: &str) -> Result<String, String> {
    let fail = |e: std::io::Error| format!("HAProxy's socket {}: {e}", socket.display());
    let mut stream = UnixStream::connect(socket).map_err(fail)?;
    stream.set_read_timeout(Some(IO_TIMEOUT)).map_err(fail)?;
    stream.set_write_timeout(Some(IO_TIMEOUT)).map_err(fail)?;
    stream
        .write_all(format!("{line}\n").as_bytes())
        .map_err(fail)?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).map_err(fail)?;
    Ok(answer)
}

/// The slots of `backend` whose names start with `prefix`.
pub fn slots(socket: &Path, backend: &str, prefix: &str) -> Result<Vec<Slot>, String> {
    let answer = send(socket, &format!("show servers state {backend}"))?;
    let mut slots = parse_servers_state(&answer)
        .map_err(|e| format!("backend {backend} on {}: {e}", socket.display()))?;
    slots.retain(|s| s.name.starts_with(prefix));
    if slots.is_empty() {
        return Err(format!(
            "backend {backend} has no server named {prefix}…: declare slots (server-template \
             {prefix}… 1-20 127.0.0.1:80 disabled)"
        ));
    }
    Ok(slots)
}

/// The hook: reads the slots, plans, and sends each command, stopping at the first refused.
pub fn apply(socket: &Path, backend: &str, prefix: &str, set: &EndpointSet) -> Result<(), String> {
    let slots = slots(socket, backend, prefix)?;
    for c in plan(backend, &slots, &set.endpoints)? {
        let answer = send(socket, &c.line)?;
        if !c.accepted(&answer) {
            return Err(format!(
                "HAProxy refused \"{}\": {}",
                c.line,
                crate::text::printable(answer.trim())
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const STATE: &str = "1\n# be_id be_name srv_id srv_name srv_addr srv_op_state srv_admin_state srv_uweight srv_iweight srv_time_since_last_change srv_check_status srv_check_result srv_check_health srv_check_state srv_agent_state bk_f_forced_id srv_f_forced_id srv_fqdn srv_port srvrecord srv_use_ssl srv_check_port srv_check_addr srv_agent_addr srv_agent_port\n\
3 web 1 web-1 10.0.0.1 2 4 1 1 0 1 0 0 8 0 0 0 - 80 - 0 0 - - 0\n\
3 web 2 web-2 127.0.0.1 0 5 1 1 4 1 0 0 8 0 0 0 - 80 - 0 0 - - 0\n\
3 web 3 web-3 fd00::2 2 12 1 1 0 1 0 0 8 0 0 0 - 8080 - 0 0 - - 0\n\n";

    fn ep(address: &str, port: u16) -> Endpoint {
        Endpoint {
            instance: format!("i-{address}"),
            address: address.parse().unwrap(),
            port,
        }
    }

    fn lines(c: Vec<Command>) -> Vec<String> {
        c.into_iter().map(|c| c.line).collect()
    }

    #[test]
    fn the_state_is_read_by_its_columns() {
        let slots = parse_servers_state(STATE).unwrap();
        assert_eq!(slots.len(), 3);
        assert_eq!(slots[0].name, "web-1");
        assert_eq!(slots[0].addr, Some("10.0.0.1".parse().unwrap()));
        assert!(slots[0].in_service());
        assert!(slots[1].in_maint());
        assert_eq!(slots[2].port, 8080);
        assert!(!slots[2].in_maint() && !slots[2].in_service());
        assert!(parse_servers_state("Can't find backend.\n\n")
            .unwrap_err()
            .contains("Can't find backend"));
        assert!(parse_servers_state("1\n").is_err());
    }

    #[test]
    fn endpoints_keep_their_slots_and_new_ones_take_free_slots() {
        let slots = parse_servers_state(STATE).unwrap();
        let got = lines(plan("web", &slots, &[ep("10.0.0.1", 80), ep("10.0.0.7", 80)]).unwrap());
        assert_eq!(
            got,
            [
                "set server web/web-2 addr 10.0.0.7 port 80",
                "set server web/web-2 state ready",
                "set server web/web-3 state maint",
            ]
        );
    }

    #[test]
    fn a_draining_slot_at_an_endpoints_address_is_made_ready() {
        let slots = parse_servers_state(STATE).unwrap();
        let got = lines(plan("web", &slots, &[ep("fd00::2", 8080), ep("10.0.0.1", 80)]).unwrap());
        assert_eq!(got, ["set server web/web-3 state ready"]);
    }

    #[test]
    fn the_same_set_twice_sends_nothing() {
        let mut slots = parse_servers_state(STATE).unwrap();
        slots[2].admin = 5;
        assert!(plan("web", &slots, &[ep("10.0.0.1", 80)])
            .unwrap()
            .is_empty());
    }

    #[test]
    fn the_empty_set_puts_every_slot_in_maintenance() {
        let slots = parse_servers_state(STATE).unwrap();
        assert_eq!(
            lines(plan("web", &slots, &[]).unwrap()),
            [
                "set server web/web-1 state maint",
                "set server web/web-3 state maint"
            ]
        );
    }

    #[test]
    fn a_set_that_changes_whole_adds_before_it_removes() {
        let mut slots = parse_servers_state(STATE).unwrap();
        slots[1].admin = 4;
        // No slot is free: the leaving ones are put in maintenance, then reused.
        let got = lines(
            plan(
                "web",
                &slots,
                &[ep("10.0.0.7", 80), ep("10.0.0.8", 80), ep("10.0.0.9", 80)],
            )
            .unwrap(),
        );
        assert_eq!(
            got,
            [
                "set server web/web-1 state maint",
                "set server web/web-2 state maint",
                "set server web/web-3 state maint",
                "set server web/web-1 addr 10.0.0.7 port 80",
                "set server web/web-1 state ready",
                "set server web/web-2 addr 10.0.0.8 port 80",
                "set server web/web-2 state ready",
                "set server web/web-3 addr 10.0.0.9 port 80",
                "set server web/web-3 state ready",
            ]
        );
    }

    #[test]
    fn more_endpoints_than_slots_is_an_error() {
        let slots = parse_servers_state(STATE).unwrap();
        let four: Vec<Endpoint> = (1..=4).map(|i| ep(&format!("10.1.0.{i}"), 80)).collect();
        let e = plan("web", &slots, &four).unwrap_err();
        assert!(e.contains("4 endpoints but only 3"), "{e}");
    }

    #[test]
    fn answers_are_checked() {
        let state = Command::state("web", "web-1", "ready");
        assert!(state.accepted("\n"));
        assert!(!state.accepted("No such server.\n\n"));
        let e = ep("10.0.0.7", 80);
        let addr = Command::addr("web", "web-1", &e);
        assert!(addr.accepted(
            "IP changed from '127.0.0.1' to '10.0.0.7', port changed from '80' to '81' by 'stats socket command'\n\n"
        ));
        assert!(addr.accepted(
            "no need to change the addr, no need to change the port by 'stats socket command'\n\n"
        ));
        assert!(!addr.accepted("Invalid addr 'bad' by 'stats socket command'\n"));
    }
}
