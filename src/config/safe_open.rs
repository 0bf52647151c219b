//! Opening a file that only trusted users can have put there, without trusting its path.
//!
//! The path is resolved here, one component at a time, with `openat(O_PATH | O_NOFOLLOW)`
//! relative to the directory already opened and checked, so nobody can swap a component
//! between the check and the use. Every directory walked must be owned by root or by the
//! daemon's user and writable by nobody else (sticky directories like `/tmp` excepted); a
//! symlink is followed only when its owner is trusted too (its directory was checked on the
//! way), at most [`MAX_SYMLINKS`] of them; `..` goes back along the directories walked. The
//! file itself is opened read-only from its directory ([`open`]), or only as a place
//! (`O_PATH`, [`open_path`]: a program to execute, which needs no read access), and checked on
//! that open descriptor, so what is checked is what is read, or executed.

use std::collections::VecDeque;
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

use rustix::fs::{fstat, openat, readlinkat, FileType, Mode, OFlags, Stat, CWD};
use rustix::io::Errno;

/// Most symlinks followed on one path: the kernel's own limit (`MAXSYMLINKS`).
pub const MAX_SYMLINKS: u32 = 40;

/// A regular file opened for reading after every check passed.
pub struct Opened {
    pub file: File,
    /// Where the file was found (after following symlinks), for messages.
    pub shown: PathBuf,
}

/// A regular file found after every check passed, opened only as a place (`O_PATH`): it can
/// be executed (`execveat` with `AT_EMPTY_PATH`) and stat-ed, not read.
pub struct Found {
    pub fd: OwnedFd,
    /// Its status, from the descriptor.
    pub stat: Stat,
    /// Where the file was found (after following symlinks), for messages.
    pub shown: PathBuf,
}

/// How the last component is opened.
#[derive(Clone, Copy, PartialEq)]
enum How {
    /// For reading.
    Read,
    /// As a place only (`O_PATH`): what the walk opened it with.
    Path,
}

/// Opens `path` for reading: resolved from `/`, or from the current directory for a relative
/// path, refusing anything `allowed_uid` and root do not control. The error names the path
/// component that is wrong and what to do about it.
pub fn open(path: &Path, allowed_uid: u32) -> Result<Opened, String> {
    let (fd, _, shown) = walk(base(path)?, path, allowed_uid, How::Read)?;
    Ok(Opened {
        file: File::from(fd),
        shown,
    })
}

/// [`open`], opening the file only as a place (`O_PATH`): one that may be executed but not
/// read (mode 0711) is found too.
pub fn open_path(path: &Path, allowed_uid: u32) -> Result<Found, String> {
    let (fd, stat, shown) = walk(base(path)?, path, allowed_uid, How::Path)?;
    Ok(Found { fd, stat, shown })
}

/// Where a walk of `path` starts: `/` (`None`), or the current directory.
fn base(path: &Path) -> Result<Option<Dir>, String> {
    if path.as_os_str().as_bytes().starts_with(b"/") {
        return Ok(None);
    }
    // The name is only for messages: the walk goes through the descriptor.
    let shown = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("."));
    let fd = open_dir(CWD, ".".as_ref(), &shown)?;
    Ok(Some(Dir { fd, shown }))
}

/// [`open`] with `dir` in place of the current directory for a relative `path`.
#[cfg(test)]
pub fn open_relative_to(dir: &Path, path: &Path, allowed_uid: u32) -> Result<Opened, String> {
    let fd = open_dir(CWD, dir.as_os_str(), dir)?;
    let base = Dir {
        fd,
        shown: dir.to_path_buf(),
    };
    let (fd, _, shown) = walk(Some(base), path, allowed_uid, How::Read)?;
    Ok(Opened {
        file: File::from(fd),
        shown,
    })
}

/// A directory on the way, opened with `O_PATH` and already checked.
struct Dir {
    fd: OwnedFd,
    shown: PathBuf,
}

/// One path component still to resolve.
enum Step {
    Root,
    /// `.`, or the end of a path with a trailing `/` (what precedes it must be a directory).
    Dot,
    Up,
    Name(OsString),
}

/// The components of a path (or a symlink's target), in order.
fn steps(path: &OsStr) -> Vec<Step> {
    let bytes = path.as_bytes();
    let mut out = Vec::new();
    if bytes.starts_with(b"/") {
        out.push(Step::Root);
    }
    for part in bytes.split(|&b| b == b'/') {
        match part {
            b"" => {}
            b"." => out.push(Step::Dot),
            b".." => out.push(Step::Up),
            name => out.push(Step::Name(OsStr::from_bytes(name).to_os_string())),
        }
    }
    if bytes.ends_with(b"/") {
        out.push(Step::Dot);
    }
    out
}

/// Resolves `path` from `base` (a relative path) or from `/`, checking each directory walked,
/// each symlink followed and the file opened (as `how` says).
fn walk(
    base: Option<Dir>,
    path: &Path,
    allowed_uid: u32,
    how: How,
) -> Result<(OwnedFd, Stat, PathBuf), String> {
    if path.as_os_str().is_empty() {
        return Err("an empty path names no file".into());
    }
    // The directories walked, each a child of the one below it: `..` pops.
    let mut stack: Vec<Dir> = Vec::new();
    if let Some(base) = base {
        check_dir(&base.shown, &stat(&base.fd, &base.shown)?, allowed_uid)?;
        stack.push(base);
    }
    let mut pending: VecDeque<Step> = steps(path.as_os_str()).into();
    let mut links = 0;
    while let Some(step) = pending.pop_front() {
        match step {
            Step::Dot => {}
            Step::Root => {
                let shown = PathBuf::from("/");
                let fd = open_dir(CWD, "/".as_ref(), &shown)?;
                check_dir(&shown, &stat(&fd, &shown)?, allowed_uid)?;
                stack.clear();
                stack.push(Dir { fd, shown });
            }
            Step::Up if stack.len() > 1 => {
                stack.pop();
            }
            Step::Up => {
                // Above where the walk started (`..` of `/` is `/` itself).
                let bottom = &stack[0];
                let shown = if bottom.shown == Path::new("/") {
                    bottom.shown.clone()
                } else if bottom.shown.is_absolute() {
                    bottom
                        .shown
                        .parent()
                        .unwrap_or(Path::new("/"))
                        .to_path_buf()
                } else {
                    bottom.shown.join("..")
                };
                let fd = open_dir(&bottom.fd, "..".as_ref(), &shown)?;
                check_dir(&shown, &stat(&fd, &shown)?, allowed_uid)?;
                stack[0] = Dir { fd, shown };
            }
            Step::Name(name) => {
                let dir = stack.last().expect("a walk starts at / or at its base");
                let shown = dir.shown.join(&name);
                let flags = OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC;
                let fd = openat(&dir.fd, &name, flags, Mode::empty())
                    .map_err(|e| open_error(&shown, e))?;
                let st = stat(&fd, &shown)?;
                let last = pending.is_empty();
                match FileType::from_raw_mode(st.st_mode) {
                    FileType::Symlink => {
                        links += 1;
                        if links > MAX_SYMLINKS {
                            return Err(format!(
                                "{}: too many levels of symbolic links (more than {MAX_SYMLINKS}): \
                                 refusing it (look for a symlink loop)",
                                shown.display()
                            ));
                        }
                        check_symlink(&shown, &st, allowed_uid)?;
                        // The empty name reads the link `fd` itself refers to (Linux, O_PATH).
                        let target = readlinkat(&fd, "", Vec::new()).map_err(|e| {
                            format!(
                                "cannot read the symlink {}: {}",
                                shown.display(),
                                std::io::Error::from(e)
                            )
                        })?;
                        let target = OsString::from_vec(target.into_bytes());
                        for s in steps(&target).into_iter().rev() {
                            pending.push_front(s);
                        }
                    }
                    FileType::Directory if !last => {
                        check_dir(&shown, &st, allowed_uid)?;
                        stack.push(Dir { fd, shown });
                    }
                    kind if !last => {
                        return Err(format!(
                            "{} is not a directory (it is {})",
                            shown.display(),
                            kind_name(kind)
                        ));
                    }
                    FileType::RegularFile if how == How::Path => {
                        check_owner(&shown, st.st_uid, allowed_uid)?;
                        check_mode(&shown, Mode::from_raw_mode(st.st_mode), false)?;
                        return Ok((fd, st, shown));
                    }
                    FileType::RegularFile => return open_file(dir, &name, shown, allowed_uid),
                    kind => return Err(not_regular(&shown, kind)),
                }
            }
        }
    }
    // The path ended on a directory (`/`, `dir/`, `dir/..`, or a symlink to a directory).
    let dir = stack.last().expect("a walk starts at / or at its base");
    Err(not_regular(&dir.shown, FileType::Directory))
}

/// Opens the final component for reading and checks what was opened. `O_NONBLOCK` keeps a
/// fifo swapped in at the last moment from blocking the open; it is refused right after.
fn open_file(
    dir: &Dir,
    name: &OsStr,
    shown: PathBuf,
    allowed_uid: u32,
) -> Result<(OwnedFd, Stat, PathBuf), String> {
    let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK;
    let fd = openat(&dir.fd, name, flags, Mode::empty()).map_err(|e| match e {
        Errno::LOOP => format!(
            "{} changed while it was being opened (it is now a symlink): refusing it",
            shown.display()
        ),
        e => open_error(&shown, e),
    })?;
    let st = stat(&fd, &shown)?;
    match FileType::from_raw_mode(st.st_mode) {
        FileType::RegularFile => {}
        kind => return Err(not_regular(&shown, kind)),
    }
    check_owner(&shown, st.st_uid, allowed_uid)?;
    check_mode(&shown, Mode::from_raw_mode(st.st_mode), false)?;
    Ok((fd, st, shown))
}

fn open_dir(dir: impl std::os::fd::AsFd, name: &OsStr, shown: &Path) -> Result<OwnedFd, String> {
    let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC;
    openat(dir, name, flags, Mode::empty()).map_err(|e| open_error(shown, e))
}

fn stat(fd: &OwnedFd, shown: &Path) -> Result<Stat, String> {
    fstat(fd).map_err(|e| {
        format!(
            "cannot stat {}: {}",
            shown.display(),
            std::io::Error::from(e)
        )
    })
}

fn open_error(shown: &Path, e: Errno) -> String {
    match e {
        Errno::NOENT => format!("{}: no such file or directory", shown.display()),
        e => format!(
            "cannot open {}: {}",
            shown.display(),
            std::io::Error::from(e)
        ),
    }
}

fn not_regular(shown: &Path, kind: FileType) -> String {
    format!(
        "{} is not a regular file (it is {})",
        shown.display(),
        kind_name(kind)
    )
}

fn kind_name(kind: FileType) -> &'static str {
    match kind {
        FileType::RegularFile => "a regular file",
        FileType::Directory => "a directory",
        FileType::Symlink => "a symlink",
        FileType::Fifo => "a fifo",
        FileType::Socket => "a socket",
        FileType::CharacterDevice => "a character device",
        FileType::BlockDevice => "a block device",
        FileType::Unknown => "of an unknown type",
    }
}

fn check_dir(shown: &Path, st: &Stat, allowed_uid: u32) -> Result<(), String> {
    check_owner(shown, st.st_uid, allowed_uid)?;
    check_mode(shown, Mode::from_raw_mode(st.st_mode), true)
}

/// A symlink's mode means nothing; its owner could repoint it (in a sticky directory, only
/// its owner can: that is the attack this refuses).
fn check_symlink(shown: &Path, st: &Stat, allowed_uid: u32) -> Result<(), String> {
    if st.st_uid == 0 || st.st_uid == allowed_uid {
        return Ok(());
    }
    Err(format!(
        "{} is a symlink owned by uid {}, not by root or the daemon's user: refusing to follow \
         it (chown -h root {}, or name its target instead)",
        shown.display(),
        st.st_uid,
        shown.display()
    ))
}

fn check_owner(shown: &Path, uid: u32, allowed_uid: u32) -> Result<(), String> {
    if uid == 0 || uid == allowed_uid {
        return Ok(());
    }
    Err(format!(
        "{} is owned by uid {uid}, not by root or the daemon's user: refusing it (chown root {})",
        shown.display(),
        shown.display()
    ))
}

/// Refuses write access for group or others, except on a sticky directory (like `/tmp`,
/// where nobody can replace an entry they do not own).
fn check_mode(shown: &Path, mode: Mode, is_dir: bool) -> Result<(), String> {
    if is_dir && mode.contains(Mode::SVTX) {
        return Ok(());
    }
    let (who, chmod) = match (mode.contains(Mode::WGRP), mode.contains(Mode::WOTH)) {
        (false, false) => return Ok(()),
        (true, false) => ("its group", "g-w"),
        (false, true) => ("others", "o-w"),
        (true, true) => ("its group and others", "go-w"),
    };
    Err(format!(
        "{} is writable by {who}: refusing it (chmod {chmod} {})",
        shown.display(),
        shown.display()
    ))
}
