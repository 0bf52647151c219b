//! One run of a program (see [`super::read`] for what a caller sees). What is executed is what
//! [`open_program`] opened and checked just before, by its descriptor
//! (`execveat(fd, "", AT_EMPTY_PATH)`); for a script, its interpreter's, given the script as
//! `/dev/fd/N` as the kernel itself would. It runs in a session of its own, as a child
//! subreaper ([`super::reap`]). Its stdout and stderr are read as they come, bounded. The run
//! ends when the leader exits (what it left is killed then, and what they wrote before is
//! still read) or at the timeout (everything is killed).

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::process::{ExitStatus, Stdio};
use std::sync::Arc;
use std::time::Duration;

use rustix::io::{fcntl_setfd, Errno, FdFlags};
use rustix::process::{set_child_subreaper, setsid, Pid};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::pipe;

use super::reap;
use super::{Captured, ExternalError, ENVIRONMENT, KEPT};
use crate::config::{open_program, Program};
use crate::text::printable;

/// How long a leader killed at the timeout is waited for, so that what it leaves is killed
/// with it; one that takes longer (stuck in the kernel) is reaped, and its leftovers killed,
/// by a later run's end.
const KILL_WAIT: Duration = Duration::from_secs(1);

/// Runs the program to its end (see [`super::read`]): its exit status, stdout and stderr.
/// With `input`, its stdin is a pipe that gets `input` then is closed (a program that exits
/// without reading it all is no error); without, `/dev/null`.
pub(super) async fn run(
    command: &[String],
    timeout: Duration,
    input: Option<&[u8]>,
) -> Result<(ExitStatus, Captured, Captured), ExternalError> {
    let deadline = tokio::time::Instant::now() + timeout;
    let Some((program, args)) = command.split_first() else {
        return Err(ExternalError::Spawn {
            program: "(no program)".into(),
            source: io::Error::new(io::ErrorKind::InvalidInput, "the command is empty"),
        });
    };
    let shown = printable(program).into_owned();
    let spawn_error = |source| ExternalError::Spawn {
        program: shown.clone(),
        source,
    };
    let checked = open_program(program).map_err(|why| ExternalError::Unusable {
        program: shown.clone(),
        why: printable(&why).into_owned(),
    })?;
    let readable = checked.readable;
    let exec = Arc::new(Exec::new(program, checked, args).map_err(spawn_error)?);
    let mut cmd = std::process::Command::new(program);
    cmd.env_clear()
        .current_dir("/")
        .stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let in_child = exec.clone();
    // SAFETY: the closure runs in the child, between fork and exec, where only
    // async-signal-safe calls may be made: it makes system calls only, on what was prepared
    // before the fork (see `Exec::exec`).
    unsafe {
        cmd.pre_exec(move || in_child.exec());
    }
    let spawned = reap::spawn(&mut cmd);
    // The descriptors of the program are the parent's no longer.
    drop((cmd, exec));
    let (mut leader, mut child) = spawned.map_err(|source| match source.raw_os_error() {
        Some(code) if code == Errno::NOENT.raw_os_error() && !readable => ExternalError::Unusable {
            program: shown.clone(),
            why: format!(
                "{shown} is not readable by the daemon's user, so it can only run as a \
                     binary, and the kernel could not run it as one (a script must be readable: \
                     chmod a+r {shown})"
            ),
        },
        _ => spawn_error(source),
    })?;
    let pipes = match (child.stdout.take(), child.stderr.take()) {
        (Some(out), Some(err)) => pipe::Receiver::from_owned_fd(OwnedFd::from(out))
            .and_then(|out| Ok((out, pipe::Receiver::from_owned_fd(OwnedFd::from(err))?))),
        _ => Err(io::Error::other("no pipe to the program")),
    };
    // Dropped on an error: the leader, and whatever it started, are killed.
    let (out, err) = pipes.map_err(spawn_error)?;
    let stdin = match child.stdin.take() {
        Some(w) => Some(pipe::Sender::from_owned_fd(OwnedFd::from(w)).map_err(spawn_error)?),
        None => None,
    };
    let finished = tokio::time::timeout_at(deadline, async {
        let ended = async {
            leader.exited().await;
            leader.end()
        };
        let fed = feed(stdin, input.unwrap_or_default());
        let (out, err, (), ended) = tokio::join!(capture(out), capture(err), fed, ended);
        (out, err, ended)
    })
    .await;
    match finished {
        Ok((out, err, Some(status))) => Ok((status, out, err)),
        Ok((_, _, None)) => Err(spawn_error(io::Error::other(
            "how it ended could not be read",
        ))),
        Err(_elapsed) => {
            leader.kill();
            let _ = tokio::time::timeout(KILL_WAIT, leader.exited()).await;
            leader.end();
            Err(ExternalError::Timeout { after: timeout })
        }
    }
}

/// What the child executes, prepared before the fork: between fork and exec, the child may
/// only make system calls (no allocation).
struct Exec {
    /// The program, or the script's interpreter (close-on-exec).
    program: OwnedFd,
    /// The script, kept open across the exec for its interpreter to read as `/dev/fd/N`.
    script: Option<OwnedFd>,
    /// The strings `argv` and `envp` point into.
    _strings: Vec<CString>,
    /// Addresses of NUL-terminated strings, then 0: the arrays `execveat` takes.
    argv: Vec<usize>,
    envp: Vec<usize>,
}

impl Exec {
    /// The program's arguments: `program` then `args`; a script's are its interpreter, the
    /// argument its `#!` line gives, `/dev/fd/N`, then `args`. The environment is
    /// [`ENVIRONMENT`].
    fn new(program: &str, checked: Program, args: &[String]) -> io::Result<Self> {
        let text = |s: &[u8]| {
            CString::new(s).map_err(|_| {
                io::Error::new(io::ErrorKind::InvalidInput, "an argument holds a NUL byte")
            })
        };
        let mut argv = Vec::new();
        let script = match checked.script {
            None => {
                argv.push(text(program.as_bytes())?);
                None
            }
            Some(script) => {
                argv.push(text(script.interpreter.as_bytes())?);
                if let Some(arg) = &script.arg {
                    argv.push(text(arg.as_bytes())?);
                }
                let fd = script.file.as_raw_fd();
                argv.push(text(format!("/dev/fd/{fd}").as_bytes())?);
                Some(script.file)
            }
        };
        for arg in args {
            argv.push(text(arg.as_bytes())?);
        }
        let envp = ENVIRONMENT
            .iter()
            .map(|(k, v)| text(format!("{k}={v}").as_bytes()))
            .collect::<io::Result<Vec<_>>>()?;
        let addresses = |strings: &[CString]| {
            let mut a: Vec<usize> = strings.iter().map(|s| s.as_ptr() as usize).collect();
            a.push(0);
            a
        };
        let (argv_at, envp_at) = (addresses(&argv), addresses(&envp));
        argv.extend(envp);
        Ok(Self {
            program: checked.exec,
            script,
            _strings: argv,
            argv: argv_at,
            envp: envp_at,
        })
    }

    /// In the child: the descriptor limit the daemon was given ([`crate::limits`]), a session
    /// of its own (and with it a process group), child subreaper
    /// (kept across exec), the script left open across the exec, then the exec. Returns only
    /// when something failed. System calls only.
    fn exec(&self) -> io::Result<()> {
        crate::limits::restore_in_child()?;
        setsid()?;
        set_child_subreaper(Some(Pid::INIT))?;
        if let Some(script) = &self.script {
            fcntl_setfd(script, FdFlags::empty())?;
        }
        // SAFETY: `argv` and `envp` hold addresses of NUL-terminated strings that live as long
        // as `self` (`_strings`), each array ending with a null pointer; `program` is an open
        // descriptor. The empty path with AT_EMPTY_PATH executes the descriptor itself.
        unsafe {
            libc::syscall(
                libc::SYS_execveat,
                self.program.as_raw_fd(),
                c"".as_ptr(),
                self.argv.as_ptr() as *const *const libc::c_char,
                self.envp.as_ptr() as *const *const libc::c_char,
                libc::AT_EMPTY_PATH,
            );
        }
        Err(io::Error::last_os_error())
    }
}

/// Writes `input` into the program's stdin, then closes it. A write error (the program closed
/// its end, or exited) ends it: how the program ended tells the rest.
async fn feed(pipe: Option<pipe::Sender>, input: &[u8]) {
    let Some(mut pipe) = pipe else {
        return;
    };
    let _ = pipe.write_all(input).await;
}

/// Reads `pipe` to its end, keeping the first [`KEPT`] bytes. A read error ends it like the
/// end of the pipe (the exit status still tells how the program ended).
async fn capture(mut pipe: impl AsyncRead + Unpin) -> Captured {
    let mut captured = Captured::default();
    let mut buf = [0u8; 8192];
    loop {
        let n = match pipe.read(&mut buf).await {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        };
        let room = KEPT - captured.kept.len();
        captured.kept.extend_from_slice(&buf[..n.min(room)]);
        captured.more |= n > room;
    }
    captured
}
