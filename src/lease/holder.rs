//! Who holds a lease, told precisely enough to prove that its process is dead.
//!
//! A holder id is `HOST:PID:TAG boot=BOOT_ID pidns=INODE start=TICKS`: the host name and the
//! PID for people, a random tag, then what makes a process unique on Linux: the kernel's boot
//! id (random at every boot; every container of one kernel shares it), the inode of the PID
//! namespace (unique within that boot), and the process's start time (clock ticks after boot,
//! `/proc/PID/stat` field 22), which tells a PID reused by another process.
//!
//! A holder is dead only when that is proven ([`proven_dead`]): same boot and PID namespace as
//! this daemon, and its PID is not running (`kill(pid, 0)` says ESRCH) or runs a process that
//! started at another time. Anything short of that (another host, another container or PID
//! namespace, a process hidden by `ProtectProc=invisible` or owned by another user, an id
//! written by an older version) proves nothing: its lease is waited out. Host names prove
//! nothing either: two clones of one VM, or two containers, may share one.

use std::os::unix::fs::MetadataExt;

/// What identifies a process on Linux.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// `/proc/sys/kernel/random/boot_id`.
    pub boot: String,
    /// The inode of `/proc/self/ns/pid`.
    pub pidns: u64,
    pub pid: u32,
    /// Clock ticks after boot when the process started.
    pub start: u64,
}

impl Identity {
    /// This process's identity; `None` when `/proc` does not tell (then this daemon never
    /// proves another dead, and its own id proves nothing to others).
    pub fn of_this_process() -> Option<Identity> {
        let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
        let pidns = std::fs::metadata("/proc/self/ns/pid").ok()?.ino();
        let pid = std::process::id();
        Some(Identity {
            boot: boot.trim().to_owned(),
            pidns,
            pid,
            start: start_time(&std::fs::read_to_string("/proc/self/stat").ok()?)?,
        })
    }
}

/// A holder id for this process, whose identity is `me`: `HOST:PID:TAG boot=… pidns=…
/// start=…` (see the module's header), without the identity part when `/proc` did not tell it.
pub fn holder_id(me: Option<&Identity>) -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "host".into());
    let tag: String = (0..4).map(|_| fastrand::alphanumeric()).collect();
    let short = format!("{host}:{}:{tag}", std::process::id());
    match me {
        Some(me) => with_identity(&short, me),
        None => short,
    }
}

/// `short` (`HOST:PID:TAG`) with `id` appended.
pub fn with_identity(short: &str, id: &Identity) -> String {
    format!(
        "{short} boot={} pidns={} start={}",
        id.boot, id.pidns, id.start
    )
}

/// The part of a holder id meant for people: `HOST:PID:TAG`.
pub fn short(holder: &str) -> &str {
    holder.split(' ').next().unwrap_or(holder)
}

/// The identity written in a holder id, if it has one. Words it does not know are skipped:
/// an older version reads a record's `lease=MS` as a word of the holder id (see
/// `record`), and still finds the identity.
pub fn parse(holder: &str) -> Option<Identity> {
    let mut words = holder.split(' ');
    let pid = words.next()?.rsplit(':').nth(1)?.parse().ok()?;
    let (mut boot, mut pidns, mut start) = (None, None, None);
    for w in words {
        match w.split_once('=') {
            Some(("boot", v)) if !v.is_empty() => boot = Some(v.to_owned()),
            Some(("pidns", v)) => pidns = v.parse().ok(),
            Some(("start", v)) => start = v.parse().ok(),
            _ => {}
        }
    }
    Some(Identity {
        boot: boot?,
        pidns: pidns?,
        pid,
        start: start?,
    })
}

/// What this daemon can see of the processes of its own PID namespace.
pub trait Processes {
    /// The start time of `pid`, when its `/proc/PID/stat` can be read.
    fn start_time(&self, pid: u32) -> Option<u64>;
    /// `Some(false)` when no process has that PID (ESRCH); `Some(true)` when one has (even one
    /// this daemon may not signal); `None` when it cannot tell.
    fn exists(&self, pid: u32) -> Option<bool>;
}

/// The processes as `/proc` and `kill(pid, 0)` show them.
pub struct Proc;

impl Processes for Proc {
    fn start_time(&self, pid: u32) -> Option<u64> {
        start_time(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
    }

    fn exists(&self, pid: u32) -> Option<bool> {
        let pid = rustix::process::Pid::from_raw(i32::try_from(pid).ok()?)?;
        match rustix::process::test_kill_process(pid) {
            Ok(()) => Some(true),
            Err(rustix::io::Errno::SRCH) => Some(false),
            Err(rustix::io::Errno::PERM) => Some(true),
            Err(_) => None,
        }
    }
}

/// True only when `holder` is proven dead from where `me` stands (see the module's header).
pub fn proven_dead(holder: &str, me: Option<&Identity>, procs: &dyn Processes) -> bool {
    let (Some(h), Some(me)) = (parse(holder), me) else {
        return false;
    };
    if h.boot != me.boot || h.pidns != me.pidns {
        return false;
    }
    if h.pid == me.pid {
        // This PID is ours now: a holder that had it before us is gone.
        return h.start != me.start;
    }
    match procs.start_time(h.pid) {
        Some(start) => start != h.start,
        None => procs.exists(h.pid) == Some(false),
    }
}

/// Field 22 (`starttime`) of a `/proc/PID/stat` line. The command name (field 2) is in
/// parentheses and may hold spaces and parentheses: fields are counted after the last `)`.
fn start_time(stat: &str) -> Option<u64> {
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(19)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// Processes by PID: `Some(start)` visible, `None` hidden but running.
    struct Seen(HashMap<u32, Option<u64>>);

    impl Processes for Seen {
        fn start_time(&self, pid: u32) -> Option<u64> {
            self.0.get(&pid).copied().flatten()
        }
        fn exists(&self, pid: u32) -> Option<bool> {
            Some(self.0.contains_key(&pid))
        }
    }

    fn id(boot: &str, pidns: u64, pid: u32, start: u64) -> Identity {
        Identity {
            boot: boot.into(),
            pidns,
            pid,
            start,
        }
    }

    fn holder(i: &Identity) -> String {
        with_identity(&format!("web-1:{}:abcd", i.pid), i)
    }

    #[test]
    fn ids_read_back_and_show_their_short_part() {
        let i = id("8c1e-aa", 4026531836, 812, 99_000);
        let h = holder(&i);
        assert_eq!(parse(&h), Some(i));
        assert_eq!(short(&h), "web-1:812:abcd");
        // Written by an older version, or garbage: no identity.
        assert_eq!(parse("web-1:812:abcd"), None);
        assert_eq!(parse("garbage"), None);
    }

    #[test]
    fn the_start_time_is_counted_after_the_command_name() {
        let stat = "4242 (we (ird) name) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 \
                    123456 1000 10";
        assert_eq!(start_time(stat), Some(123456));
        let me = Identity::of_this_process().expect("/proc tells");
        assert_eq!(me.pid, std::process::id());
        assert_eq!(Proc.start_time(me.pid), Some(me.start));
        assert_eq!(Proc.exists(me.pid), Some(true));
    }

    #[test]
    fn only_a_process_of_this_kernel_and_pid_namespace_can_be_proven_dead() {
        let me = id("boot-a", 7, 100, 5_000);
        let procs = Seen([(200, Some(6_000)), (300, None)].into_iter().collect());
        let dead = |h: &Identity| proven_dead(&holder(h), Some(&me), &procs);
        // Same kernel and namespace: running with its start time: alive.
        assert!(!dead(&id("boot-a", 7, 200, 6_000)));
        // Its PID now runs another process (another start time): dead.
        assert!(dead(&id("boot-a", 7, 200, 1_000)));
        // Its PID runs nothing: dead.
        assert!(dead(&id("boot-a", 7, 400, 1_000)));
        // Hidden from us (ProtectProc=invisible, another user) but running: not proven.
        assert!(!dead(&id("boot-a", 7, 300, 1_000)));
        // Our own PID with another start time: a holder before us, dead.
        assert!(dead(&id("boot-a", 7, 100, 4_000)));
        // Another PID namespace (another container, `unshare --pid`), or another boot or
        // host: its PIDs mean nothing here, whatever its host name.
        assert!(!dead(&id("boot-a", 8, 400, 1_000)));
        assert!(!dead(&id("boot-b", 7, 400, 1_000)));
        // No identity (an older version), or none of our own: never proven.
        assert!(!proven_dead("web-1:400:abcd", Some(&me), &procs));
        assert!(!proven_dead(
            &holder(&id("boot-a", 7, 400, 1)),
            None,
            &procs
        ));
    }
}
