//! The daemon's limit on open descriptors. systemd starts a service with a soft limit of 1,024
//! and a hard one of 524,288 (its defaults since v240), and asks a program that needs more to
//! raise the soft limit itself: the daemon does at start ([`raise_descriptors`]), to keep the
//! cgroup files of many instances open ([`crate::memory`]), and puts it back in the programs it
//! runs ([`restore_in_child`]), which may use `select(2)` (it fails past descriptor 1,023).
//! And the memory the allocator keeps free: the daemon gives it back every [`GIVE_BACK_EVERY`]
//! ([`give_back`]).

use std::sync::atomic::{AtomicU64, Ordering};

use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};

/// The most the daemon raises its soft limit to: twice the cgroup files it ever keeps open.
pub const RAISED_TO_AT_MOST: u64 = 2 * crate::memory::MAX_OPEN_CEILING as u64;

/// The soft limit the daemon was given (0: not raised).
static GIVEN: AtomicU64 = AtomicU64::new(0);

/// The soft limit on open descriptors now (`u64::MAX` when unlimited).
pub fn descriptors() -> u64 {
    getrlimit(Resource::Nofile).current.unwrap_or(u64::MAX)
}

/// Raises the soft limit to the hard one, up to [`RAISED_TO_AT_MOST`]; returns the soft limit
/// then. A limit already higher is left as it is; a refusal leaves it as it was.
pub fn raise_descriptors() -> u64 {
    let was = getrlimit(Resource::Nofile);
    let soft = was.current.unwrap_or(u64::MAX);
    let hard = was.maximum.unwrap_or(u64::MAX);
    let want = hard.min(RAISED_TO_AT_MOST);
    if want <= soft {
        return soft;
    }
    let raised = Rlimit {
        current: Some(want),
        maximum: was.maximum,
    };
    match setrlimit(Resource::Nofile, raised) {
        Ok(()) => {
            GIVEN.store(soft, Ordering::Relaxed);
            want
        }
        Err(_) => soft,
    }
}

/// In a child between fork and exec: the soft limit the daemon was given, back. A system call
/// only (async-signal-safe); nothing when the daemon did not raise it.
pub fn restore_in_child() -> std::io::Result<()> {
    let given = GIVEN.load(Ordering::Relaxed);
    if given == 0 {
        return Ok(());
    }
    let now = getrlimit(Resource::Nofile);
    setrlimit(
        Resource::Nofile,
        Rlimit {
            current: Some(given),
            maximum: now.maximum,
        },
    )
    .map_err(std::io::Error::from)
}

/// How often the daemon gives the allocator's free memory back.
pub const GIVE_BACK_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

/// Gives the memory the allocator keeps free back to the system. glibc keeps what is freed in
/// its arenas (one per thread that allocated: the loop's, the history writer's, the blocking
/// pool's) for ever: the listings of a start, 1,000 creations, a group's rows and saves. At
/// 1,000 real instances that was 0.3 MiB of the daemon's resident memory after creating them
/// all, at 10,000 simulated ones 9 MiB of the history's; a few milliseconds each time.
pub fn give_back() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free memory; it takes no pointer and is thread-safe.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_soft_limit_goes_up_to_the_hard_one_within_the_bound_and_back_in_a_child() {
        let before = getrlimit(Resource::Nofile);
        let raised = raise_descriptors();
        let hard = before.maximum.unwrap_or(u64::MAX);
        assert_eq!(
            raised,
            before
                .current
                .unwrap_or(u64::MAX)
                .max(hard.min(RAISED_TO_AT_MOST))
        );
        assert_eq!(descriptors(), raised);
        // What a program run by the daemon is given (the shell prints its soft limit).
        let out = {
            use std::os::unix::process::CommandExt;
            let mut cmd = std::process::Command::new("sh");
            cmd.args(["-c", "ulimit -Sn"]);
            // SAFETY: a system call only, between fork and exec.
            unsafe {
                cmd.pre_exec(restore_in_child);
            }
            cmd.output().unwrap()
        };
        let given = GIVEN.load(Ordering::Relaxed);
        let expected = if given == 0 { raised } else { given };
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            expected.to_string()
        );
    }
}
