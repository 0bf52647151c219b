//! What a run leaves behind: nothing. A program runs in a session of its own; when its run
//! ends (its leader exited, or was killed at the timeout), its process group is killed, and so
//! is every process it started that left the group or the session (`setsid`, a daemon's
//! double fork).
//!
//! Those are found without a cgroup (the unit's is read-only, and a daemon run by hand has
//! none of its own) through the kernel's child subreapers (`PR_SET_CHILD_SUBREAPER`), which
//! any process may be:
//!
//! - the program's leader is one (set between fork and exec, kept across exec): a process of
//!   the run whose parent ends is adopted by the leader, so while the run lasts all of it
//!   stays below the leader;
//! - the daemon is one: when the leader ends, what is left of the run is adopted by the
//!   daemon. Those are the daemon's children that it did not start itself, in a session not
//!   its own (every run is in its own): [`sweep`] kills them (a group leader with its group)
//!   and reaps them, in rounds, as their own children come up in turn. The daemon starts no
//!   other process; one started elsewhere in the daemon's session would be left alone.
//!
//! Leaders are reaped through a pidfd (`pidfd_open`, Linux 5.3), never by pid: a leader's pid
//! is its group's id, so the group is killed before the leader is reaped, while the id cannot
//! have been reused. One lock covers the spawns, the reaping and the sweeps, so a sweep never
//! takes a leader just started, or a pid reused meanwhile, for what a run left. A killed
//! process that has not died yet (one stuck in the kernel) is reaped by a later sweep.

use std::collections::BTreeSet;
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::process::ExitStatusExt;
use std::process::{Child, Command, ExitStatus};
use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError};

use rustix::process::{
    getpid, kill_process, kill_process_group, pidfd_open, set_child_subreaper, waitpid, Pid,
    PidfdFlags, Signal, WaitOptions,
};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

/// Most rounds of one sweep: each finds the children of those the round before killed.
const ROUNDS: usize = 8;

/// The runs' leaders, and those killed that have not ended yet.
struct Registry {
    /// Leaders started and not reaped yet: a sweep leaves them alone.
    leaders: BTreeSet<i32>,
    /// Leaders killed whose end was not seen yet: a later sweep reaps them.
    pending: Vec<(Pid, OwnedFd)>,
}

static REGISTRY: Mutex<Registry> = Mutex::new(Registry {
    leaders: BTreeSet::new(),
    pending: Vec::new(),
});

fn registry() -> MutexGuard<'static, Registry> {
    REGISTRY.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Makes the daemon a child subreaper, once; says so once when it cannot (what a program
/// leaves in a session of its own then outlives its run).
fn subreaper() {
    static SET: OnceLock<()> = OnceLock::new();
    SET.get_or_init(|| {
        if let Err(e) = set_child_subreaper(Some(Pid::INIT)) {
            let e = io::Error::from(e);
            tracing::warn!(error = %e,
                "cannot become a child subreaper ({e}): a process that an external program \
                 starts in a session of its own outlives its run");
        }
    });
}

/// A run's leader, spawned and not reaped yet. Dropped before [`Leader::end`], it kills the
/// run's group and ends as [`Leader::end`] does, without waiting.
pub(super) struct Leader {
    pid: Pid,
    /// Readable once the leader has exited. `None` once reaped or handed to the registry.
    exit: Option<AsyncFd<OwnedFd>>,
}

/// Spawns `cmd` (which starts a session of its own) as a run's leader.
pub(super) fn spawn(cmd: &mut Command) -> io::Result<(Leader, Child)> {
    subreaper();
    let mut reg = registry();
    let child = cmd.spawn()?;
    let pid = i32::try_from(child.id())
        .ok()
        .and_then(Pid::from_raw)
        .ok_or_else(|| io::Error::other("the kernel gave the program no pid"))?;
    let exit = pidfd_open(pid, PidfdFlags::empty())
        .map_err(io::Error::from)
        .and_then(|fd| {
            // SAFETY: an `OwnedFd` stays open, and is the same descriptor, as long as the
            // `AsyncFd` that owns it.
            unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) }
                .map_err(io::Error::from)
        });
    match exit {
        Ok(exit) => {
            reg.leaders.insert(pid.as_raw_pid());
            Ok((
                Leader {
                    pid,
                    exit: Some(exit),
                },
                child,
            ))
        }
        Err(e) => {
            // Killed at once, with its session's group, and reaped.
            let _ = kill_process_group(pid, Signal::KILL);
            let _ = kill_process(pid, Signal::KILL);
            let _ = waitpid(Some(pid), WaitOptions::empty());
            Err(e)
        }
    }
}

impl Leader {
    /// Returns once the leader has exited (it is not reaped: [`Leader::end`] does that).
    pub async fn exited(&self) {
        if let Some(exit) = &self.exit {
            if let Ok(mut ready) = exit.readable().await {
                ready.retain_ready();
            }
        }
    }

    /// Kills the run's process group, the leader with it.
    pub fn kill(&self) {
        if self.exit.is_some() {
            // Not reaped: the group's id is still the leader's own.
            let _ = kill_process_group(self.pid, Signal::KILL);
        }
    }

    /// Ends the run: kills what is left of its group, reaps the leader if it has exited
    /// (`None` if it has not: a later sweep reaps it), and kills and reaps what it left
    /// elsewhere.
    pub fn end(&mut self) -> Option<ExitStatus> {
        let exit = self.exit.take()?;
        // Not reaped yet: the group's id is still the leader's own.
        let _ = kill_process_group(self.pid, Signal::KILL);
        let mut reg = registry();
        let status = match waitpid(Some(self.pid), WaitOptions::NOHANG) {
            Ok(Some((_, status))) => Some(ExitStatus::from_raw(status.as_raw())),
            Ok(None) => {
                // Still dying: it stays a leader until a later sweep reaps it.
                reg.pending.push((self.pid, exit.into_inner()));
                None
            }
            // Not a child to reap (it cannot be otherwise): forgotten.
            Err(_) => None,
        };
        if !reg.pending.iter().any(|(pid, _)| *pid == self.pid) {
            reg.leaders.remove(&self.pid.as_raw_pid());
        }
        sweep(&mut reg);
        status
    }
}

impl Drop for Leader {
    fn drop(&mut self) {
        self.end();
    }
}

/// Reaps the killed leaders that have ended, then kills and reaps, in rounds, the daemon's
/// children that are no run's leader and live in a session that is not the daemon's: what
/// ended runs left (see the module's header).
fn sweep(reg: &mut Registry) {
    let pending = std::mem::take(&mut reg.pending);
    for (pid, fd) in pending {
        match waitpid(Some(pid), WaitOptions::NOHANG) {
            Ok(None) => reg.pending.push((pid, fd)),
            _ => {
                reg.leaders.remove(&pid.as_raw_pid());
            }
        }
    }
    let me = getpid();
    // Read from /proc, not getsid(2) through rustix: in a PID namespace whose session leader
    // lives outside it (a container, CI), the session is 0, which rustix's `Pid` cannot hold.
    let Some((_, _, session)) = stat(me.as_raw_pid()) else {
        return;
    };
    for _ in 0..ROUNDS {
        let left: Vec<(Pid, i32)> = children()
            .into_iter()
            .filter(|pid| !reg.leaders.contains(pid))
            .filter_map(|pid| {
                let (parent, group, in_session) = stat(pid)?;
                if parent != me.as_raw_pid() || in_session == session {
                    return None;
                }
                Some((Pid::from_raw(pid)?, group))
            })
            .collect();
        if left.is_empty() {
            return;
        }
        for &(pid, group) in &left {
            if group == pid.as_raw_pid() {
                let _ = kill_process_group(pid, Signal::KILL);
            }
            let _ = kill_process(pid, Signal::KILL);
        }
        let mut reaped = false;
        for &(pid, _) in &left {
            reaped |= matches!(waitpid(Some(pid), WaitOptions::NOHANG), Ok(Some(_)));
        }
        if !reaped {
            // Still dying: a later sweep reaps them.
            return;
        }
    }
}

/// The daemon's children (of all its threads), as /proc tells.
fn children() -> Vec<i32> {
    let mut pids = Vec::new();
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return pids;
    };
    for task in tasks.flatten() {
        match std::fs::read_to_string(task.path().join("children")) {
            Ok(text) => pids.extend(
                text.split_whitespace()
                    .filter_map(|p| p.parse::<i32>().ok()),
            ),
            // A kernel without CONFIG_PROC_CHILDREN: every process's parent is read instead.
            Err(e) if e.kind() == io::ErrorKind::NotFound => return all_children(),
            Err(_) => {}
        }
    }
    pids
}

/// The daemon's children, found among all the processes it may see.
fn all_children() -> Vec<i32> {
    let me = getpid().as_raw_pid();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&pid| stat(pid).is_some_and(|(parent, _, _)| parent == me))
        .collect()
}

/// A process's parent, process group and session, from `/proc/PID/stat` (a zombie's too).
fn stat(pid: i32) -> Option<(i32, i32, i32)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // After the name in parentheses (which may hold anything): state ppid pgrp session.
    let (_, rest) = text.rsplit_once(')')?;
    let mut fields = rest.split_whitespace().skip(1).map(|f| f.parse().ok());
    Some((fields.next()??, fields.next()??, fields.next()??))
}
