//! The program of an external signal, as it will be run. The daemon runs it with its own
//! rights, which are root's through `incus-admin`, so whoever can change the program, or the
//! interpreter of a script, is root on the host.
//!
//! [`open_program`] opens it without trusting its path ([`super::safe_open`], `O_PATH`) and
//! checks what it opened: a regular file that root owns, that nobody else may write and that
//! someone may execute, through directories that root owns and nobody else may write (sticky
//! ones excepted), symlinks followed only when root owns them. A script names its interpreter
//! on its `#!` line, read here as the kernel reads it; the interpreter is held to the same
//! rules, opened the same way, and must be a binary. The daemon executes the descriptors
//! checked here (`crate::external`), so what is checked is what runs, at every run: a file
//! put in the program's place after a check is never run.
//!
//! The program is opened as a place, not for reading, so a binary that others may execute
//! but not read (mode 0711) is accepted: executing needs no read access, and the kernel
//! loads the binary itself. The daemon's user then cannot tell a script from a binary, and
//! executes it as a binary: the kernel refuses a script whose file its interpreter could not
//! open (the descriptor is closed on exec), so no unchecked interpreter ever starts.

use std::ffi::{OsStr, OsString};
use std::io::Read;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use rustix::fs::{fstat, open, Mode, OFlags};
use rustix::io::Errno;

use super::safe_open::{self, Found};

/// What the kernel reads of a file to tell how to execute it (`BINPRM_BUF_SIZE`): a `#!`
/// line is at most this long, its last byte left out.
pub const HEAD: usize = 256;

/// A program opened and checked, ready to be executed by its descriptors.
pub struct Program {
    /// What the kernel executes (`execveat(fd, "", AT_EMPTY_PATH)`, close-on-exec): the
    /// program, or a script's interpreter. Opened as a place (`O_PATH`).
    pub exec: OwnedFd,
    /// The script, when the program is one.
    pub script: Option<Script>,
    /// Whether the daemon's user may read the program (else it is executed as a binary).
    pub readable: bool,
}

/// A script: how its interpreter is called, as its `#!` line says.
pub struct Script {
    /// The interpreter as the line names it (its `argv[0]`).
    pub interpreter: OsString,
    /// The one argument the line gives after the interpreter, if any.
    pub arg: Option<OsString>,
    /// The script, opened as a place: the interpreter reads it as `/dev/fd/N`.
    pub file: OwnedFd,
}

/// Opens and checks the program `path` (absolute) and, for a script, its interpreter (see the
/// module's header). The error names what is wrong and the fix: the config parser gives it
/// with the file, line and key; the runner at each run, with the signal.
pub fn open_program(path: &str) -> Result<Program, String> {
    if !path.starts_with('/') {
        return Err(format!("{path} is not an absolute path"));
    }
    let found = safe_open::open_path(Path::new(path), 0)?;
    executable(path.as_ref(), &found)?;
    let Some(first) = head(&found)? else {
        return Ok(Program {
            exec: found.fd,
            script: None,
            readable: false,
        });
    };
    let Some((interpreter, arg)) = shebang(&first).map_err(|why| format!("{path}: {why}"))? else {
        return Ok(Program {
            exec: found.fd,
            script: None,
            readable: true,
        });
    };
    let shown = format!(
        "the interpreter of {path} (#!{})",
        Path::new(&interpreter).display()
    );
    if !interpreter.as_bytes().starts_with(b"/") {
        return Err(format!(
            "{shown} is not an absolute path: name it from / on the #! line"
        ));
    }
    let found_interpreter =
        safe_open::open_path(interpreter.as_ref(), 0).map_err(|why| format!("{shown}: {why}"))?;
    executable(interpreter.as_ref(), &found_interpreter)
        .map_err(|why| format!("{shown}: {why}"))?;
    if head(&found_interpreter)
        .map_err(|why| format!("{shown}: {why}"))?
        .is_some_and(|h| h.starts_with(b"#!"))
    {
        return Err(format!(
            "{shown} is itself a script: name its own interpreter (a binary) on the #! line \
             of {path}"
        ));
    }
    Ok(Program {
        exec: found_interpreter.fd,
        script: Some(Script {
            interpreter,
            arg,
            file: found.fd,
        }),
        readable: true,
    })
}

/// `Ok` when someone may execute the file (the kernel tells whether the daemon's user may).
fn executable(path: &Path, found: &Found) -> Result<(), String> {
    if found.stat.st_mode & 0o111 != 0 {
        return Ok(());
    }
    let p = path.display();
    Err(format!(
        "{p} is not executable: refusing it (chmod 755 {p})"
    ))
}

/// The first [`HEAD`] bytes of the file `found` is, read through a descriptor opened anew
/// from it (the same file, whatever its path names now); `None` when the daemon's user may
/// not read it.
fn head(found: &Found) -> Result<Option<Vec<u8>>, String> {
    let shown = found.shown.display();
    let again = format!("/proc/self/fd/{}", found.fd.as_raw_fd());
    let fd = match open(
        again.as_str(),
        OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOCTTY,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(Errno::ACCESS) => return Ok(None),
        Err(e) => return Err(format!("cannot read {shown}: {}", std::io::Error::from(e))),
    };
    let st = fstat(&fd).map_err(|e| format!("cannot stat {shown}: {}", std::io::Error::from(e)))?;
    if (st.st_dev, st.st_ino) != (found.stat.st_dev, found.stat.st_ino) {
        return Err(format!(
            "{shown} changed while it was being opened: refusing it"
        ));
    }
    let mut head = Vec::with_capacity(HEAD);
    std::fs::File::from(fd)
        .take(HEAD as u64)
        .read_to_end(&mut head)
        .map_err(|e| format!("cannot read {shown}: {e}"))?;
    Ok(Some(head))
}

/// The interpreter and its optional argument that the `#!` line at the start of `head` names,
/// as Linux reads it (`fs/binfmt_script.c`): `None` when `head` does not start with `#!`. The
/// line ends at the first newline within [`HEAD`] bytes; without one, the interpreter's name
/// must end (space, tab or NUL) within the first `HEAD - 1` bytes. Spaces and tabs around the
/// interpreter are skipped; what follows it, up to a NUL or the end of the line without its
/// trailing spaces and tabs, is one argument.
pub fn shebang(head: &[u8]) -> Result<Option<(OsString, Option<OsString>)>, String> {
    if !head.starts_with(b"#!") {
        return Ok(None);
    }
    let mut buf = [0u8; HEAD];
    let n = head.len().min(HEAD);
    buf[..n].copy_from_slice(&head[..n]);
    let spacetab = |b: &u8| matches!(b, b' ' | b'\t');
    let ends_name = |b: &u8| matches!(b, b' ' | b'\t' | 0);
    let end = match buf.iter().position(|&b| b == b'\n') {
        Some(end) => end,
        None => {
            let last = HEAD - 1;
            let start = buf[2..last]
                .iter()
                .position(|b| !spacetab(b))
                .map(|i| i + 2)
                .ok_or("its #! line names no interpreter")?;
            if !buf[start..last].iter().any(ends_name) {
                return Err(format!(
                    "its #! line is longer than the {last} bytes the kernel reads"
                ));
            }
            last
        }
    };
    let mut line = &buf[2..end];
    while let Some(rest) = line.strip_suffix(b" ").or_else(|| line.strip_suffix(b"\t")) {
        line = rest;
    }
    let line = &line[line.iter().position(|b| !spacetab(b)).unwrap_or(line.len())..];
    let name_end = line.iter().position(ends_name).unwrap_or(line.len());
    let name = &line[..name_end];
    if name.is_empty() {
        return Err("its #! line names no interpreter".into());
    }
    let arg = match line.get(name_end) {
        Some(b' ' | b'\t') => {
            let rest = &line[name_end..];
            let rest = &rest[rest.iter().position(|b| !spacetab(b)).unwrap_or(rest.len())..];
            let rest = &rest[..rest.iter().position(|&b| b == 0).unwrap_or(rest.len())];
            (!rest.is_empty()).then(|| OsStr::from_bytes(rest).to_os_string())
        }
        _ => None,
    };
    Ok(Some((OsStr::from_bytes(name).to_os_string(), arg)))
}

#[cfg(test)]
#[path = "program_tests.rs"]
mod tests;
