//! Small cgroup files kept open from one pass to the next and read again from offset 0: a
//! cgroup file is a seq file, whose text is made afresh by every read from its start, so one
//! `pread` replaces an open, a read and a close each pass (the CPU and pressure files of the
//! signals, three per instance). A file whose cgroup is gone answers ENODEV and is opened anew
//! (an instance restarted gets a new cgroup of the same name).
//!
//! A descriptor kept open keeps its cgroup in the kernel after the instance is deleted, so the
//! files of deleted instances are closed at the next [`OpenFiles::sweep`] but one (the source
//! asks for a sweep after each group's reading; one is done at most every [`SWEEP_EVERY`]): a
//! sweep looks at the files not read since the one before and closes those whose directory is
//! gone, or that were not read for [`IDLE`]. The files read in between are not looked at, so a
//! steady pass costs no more than its reads, and the descriptors kept follow the instances
//! there are. (A sweep after every group's reading looked at every other group's files: a
//! thousand groups of ten made ten million lookups a second.) At most [`MAX_OPEN`] files are
//! kept; past that, a file is read the plain way, so the daemon never holds many descriptors
//! for this: [`max_open`] of the descriptors the process may open (the daemon raises its soft
//! limit to the hard one at start: systemd gives services 1,024 of 524,288).
//!
//! A read goes into one buffer kept for every file (grown to the largest file read): no
//! allocation per read, and the text is handed to the caller's parser in place. Each file kept
//! open holds the kernel's buffer of its seq file (a page, 4 KiB), freed when it is closed.

use std::collections::HashMap;
use std::ffi::OsString;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The fewest files kept open, whatever the limit (a quarter of the usual soft limit of 1,024
/// descriptors).
pub const MAX_OPEN: usize = 256;

/// The most files kept open, whatever the limit: seven files per instance for 8,000 instances
/// (about 230 MiB of the kernel's buffers at that size).
pub const MAX_OPEN_CEILING: usize = 56_000;

/// How many files to keep open when the process may open `limit` descriptors: half of them,
/// within [`MAX_OPEN`] and [`MAX_OPEN_CEILING`] (the other half for Incus, the control socket,
/// the programs the daemon runs).
pub fn max_open(limit: u64) -> usize {
    usize::try_from(limit / 2)
        .unwrap_or(usize::MAX)
        .clamp(MAX_OPEN, MAX_OPEN_CEILING)
}

/// A file not read for this long is closed by the next sweep.
pub const IDLE: Duration = Duration::from_secs(600);

/// The least time between two sweeps: the files of a deleted instance are closed within twice
/// this after their last reading (with one `stat` per instance directory per sweep).
pub const SWEEP_EVERY: Duration = Duration::from_secs(5);

/// The cache of open files; see the module's header.
pub struct OpenFiles {
    kept: Mutex<Kept>,
    /// The most files kept open.
    max: usize,
    /// The least time between two sweeps ([`SWEEP_EVERY`]).
    every: Duration,
}

impl Default for OpenFiles {
    /// At most [`MAX_OPEN`] files kept.
    fn default() -> Self {
        Self::with_max(MAX_OPEN)
    }
}

#[derive(Default)]
struct Kept {
    /// By path, as bytes: hashed and compared as such (a `Path` is hashed and compared by its
    /// components, which cost more than the `pread` of a small file).
    files: HashMap<OsString, Open>,
    /// Sweeps done so far.
    sweeps: u64,
    /// When the last was done.
    swept: Option<Instant>,
    /// The buffer every read goes into.
    buf: Vec<u8>,
}

struct Open {
    file: File,
    /// When it was last read.
    used: Instant,
    /// How many sweeps had been done when it was last read.
    sweep: u64,
}

impl OpenFiles {
    /// At most `max` files kept open.
    pub fn with_max(max: usize) -> Self {
        Self {
            kept: Mutex::default(),
            max,
            every: SWEEP_EVERY,
        }
    }

    /// Sweeping whenever asked (for tests of what a sweep closes).
    #[cfg(test)]
    pub(super) fn sweeping_every_time(self) -> Self {
        Self {
            every: Duration::ZERO,
            ..self
        }
    }

    fn kept(&self) -> std::sync::MutexGuard<'_, Kept> {
        self.kept.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The text of the small file at `path`, or `None` when it cannot be read.
    #[cfg(test)]
    pub fn read(&self, path: &Path) -> Option<String> {
        self.read_with(path, |t| Some(t.to_owned()))
    }

    /// What `parse` makes of the text of the small file at `path` (read into the kept buffer),
    /// or `None` when it cannot be read.
    pub fn read_with<T>(&self, path: &Path, parse: impl FnOnce(&str) -> Option<T>) -> Option<T> {
        self.read_at(path, Instant::now(), parse)
    }

    fn read_at<T>(
        &self,
        path: &Path,
        now: Instant,
        parse: impl FnOnce(&str) -> Option<T>,
    ) -> Option<T> {
        let mut guard = self.kept();
        let kept = &mut *guard;
        let sweep = kept.sweeps;
        if let Some(open) = kept.files.get_mut(path.as_os_str()) {
            if let Some(n) = read_from_start(&open.file, &mut kept.buf) {
                open.used = now;
                open.sweep = sweep;
                return parse(std::str::from_utf8(&kept.buf[..n]).ok()?);
            }
            // Its cgroup is gone (or the file changed): open it anew.
            kept.files.remove(path.as_os_str());
        }
        let file = File::open(path).ok()?;
        let n = read_from_start(&file, &mut kept.buf)?;
        // Full: read the plain way (the sweeps close what is idle; looking for it here made
        // every file opened past the limit cost a look at every file kept).
        if kept.files.len() < self.max {
            let open = Open {
                file,
                used: now,
                sweep,
            };
            kept.files.insert(path.as_os_str().to_owned(), open);
        }
        parse(std::str::from_utf8(&kept.buf[..n]).ok()?)
    }

    /// Sweeps when the last sweep was [`SWEEP_EVERY`] ago or more (see [`OpenFiles::sweep_at`]).
    pub fn sweep(&self) {
        let now = Instant::now();
        let due = self
            .kept()
            .swept
            .is_none_or(|t| now.saturating_duration_since(t) >= self.every);
        if due {
            self.sweep_at(now);
        }
    }

    /// Closes the files not read since the last sweep whose directory is gone (their cgroup was
    /// removed: the instance was deleted or stopped) or that were not read for [`IDLE`]. One
    /// `stat` per directory looked at.
    fn sweep_at(&self, now: Instant) {
        let mut kept = self.kept();
        kept.swept = Some(now);
        let current = kept.sweeps;
        let mut there: HashMap<PathBuf, bool> = HashMap::new();
        kept.files.retain(|path, open| {
            if open.sweep == current {
                return true;
            }
            if now.saturating_duration_since(open.used) >= IDLE {
                return false;
            }
            let dir = Path::new(path).parent().unwrap_or(Path::new("/"));
            *there
                .entry(dir.to_path_buf())
                .or_insert_with(|| std::fs::symlink_metadata(dir).is_ok())
        });
        kept.sweeps += 1;
    }

    /// How many files are kept open.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.kept().files.len()
    }
}

/// The most a file may hold (a cgroup's `memory.stat` is about 1.5 KiB).
const MAX_TEXT: usize = 64 * 1024;

/// Reads the whole of `file` from offset 0 into `buf` (grown when the file fills it), whatever
/// was read of it before; the length read. One `pread` when `buf` holds the file: a seq file's
/// text is made afresh from its start by each read at offset 0, so a file that fills the buffer
/// is read again whole into a bigger one, never in pieces.
fn read_from_start(file: &File, buf: &mut Vec<u8>) -> Option<usize> {
    if buf.is_empty() {
        buf.resize(4096, 0);
    }
    loop {
        let n = file.read_at(buf, 0).ok()?;
        if n < buf.len() {
            return Some(n);
        }
        if buf.len() >= MAX_TEXT {
            return None;
        }
        let bigger = buf.len() * 2;
        buf.resize(bigger, 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_is_read_afresh_from_the_start_each_time() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cpu.pressure");
        std::fs::write(&path, "some avg10=1.00\n").unwrap();
        let files = OpenFiles::default();
        assert_eq!(files.read(&path).as_deref(), Some("some avg10=1.00\n"));
        std::fs::write(&path, "some avg10=25.50 avg60=3.00\n").unwrap();
        assert_eq!(
            files.read(&path).as_deref(),
            Some("some avg10=25.50 avg60=3.00\n")
        );
        assert_eq!(files.len(), 1, "kept open, not opened again");
        assert_eq!(files.read(&dir.path().join("missing")), None);
        assert_eq!(files.len(), 1);
    }

    #[test]
    fn a_sweep_closes_the_files_of_removed_directories_not_read_since_the_last() {
        let root = tempfile::tempdir().unwrap();
        let files = OpenFiles::default();
        let dirs: Vec<PathBuf> = (0..4).map(|i| root.path().join(format!("d{i}"))).collect();
        for d in &dirs {
            std::fs::create_dir(d).unwrap();
            for f in ["cpu.stat", "cpu.pressure"] {
                std::fs::write(d.join(f), "x\n").unwrap();
                assert!(files.read(&d.join(f)).is_some());
            }
        }
        files.sweep_at(Instant::now());
        assert_eq!(
            files.len(),
            8,
            "read since the last sweep: kept, not looked at"
        );
        std::fs::remove_dir_all(&dirs[0]).unwrap();
        files.sweep_at(Instant::now());
        assert_eq!(files.len(), 6, "d0 is gone");
        // Read between two sweeps: kept even though its directory went in between.
        assert!(files.read(&dirs[1].join("cpu.stat")).is_some());
        std::fs::remove_dir_all(&dirs[1]).unwrap();
        files.sweep_at(Instant::now());
        assert_eq!(files.len(), 5, "d1's unread file closed, its read one kept");
        files.sweep_at(Instant::now());
        assert_eq!(files.len(), 4, "and closed at the sweep after");
    }

    #[test]
    fn a_sweep_is_done_at_most_every_sweep_every() {
        let root = tempfile::tempdir().unwrap();
        let d = root.path().join("d");
        std::fs::create_dir(&d).unwrap();
        std::fs::write(d.join("cpu.stat"), "x\n").unwrap();
        let files = OpenFiles::default();
        assert!(files.read(&d.join("cpu.stat")).is_some());
        files.sweep();
        std::fs::remove_dir_all(&d).unwrap();
        for _ in 0..3 {
            files.sweep();
        }
        assert_eq!(files.len(), 1, "asked within SWEEP_EVERY: no sweep done");
        let later = files.kept().swept.unwrap() + SWEEP_EVERY;
        files.sweep_at(later);
        assert_eq!(files.len(), 0, "the sweep due closes it");
    }

    #[test]
    fn a_sweep_closes_the_files_not_read_for_idle() {
        let dir = tempfile::tempdir().unwrap();
        let (old, new) = (dir.path().join("old"), dir.path().join("new"));
        std::fs::write(&old, "1\n").unwrap();
        std::fs::write(&new, "2\n").unwrap();
        let files = OpenFiles::default();
        let t0 = Instant::now();
        assert!(files.read_at(&old, t0, |t| Some(t.len())).is_some());
        files.sweep_at(t0);
        assert!(files.read_at(&new, t0 + IDLE, |t| Some(t.len())).is_some());
        files.sweep_at(t0 + IDLE);
        assert_eq!(files.len(), 1, "the idle one closed, the other kept");
        assert!(files.read_at(&new, t0 + IDLE, |t| Some(t.len())).is_some());
    }

    #[test]
    fn no_more_than_max_open_files_are_kept() {
        let dir = tempfile::tempdir().unwrap();
        let files = OpenFiles::default();
        for i in 0..MAX_OPEN + 10 {
            let path = dir.path().join(format!("f{i}"));
            std::fs::write(&path, format!("{i}\n")).unwrap();
            assert_eq!(files.read(&path), Some(format!("{i}\n")));
        }
        assert_eq!(files.len(), MAX_OPEN);
    }

    #[test]
    fn a_file_bigger_than_the_buffer_is_read_whole_and_the_buffer_kept() {
        let dir = tempfile::tempdir().unwrap();
        let (big, small) = (
            dir.path().join("memory.stat"),
            dir.path().join("memory.max"),
        );
        let text: String = (0..1000).map(|i| format!("key{i} {i}\n")).collect();
        assert!(text.len() > 4096);
        std::fs::write(&big, &text).unwrap();
        std::fs::write(&small, "max\n").unwrap();
        let files = OpenFiles::default();
        assert_eq!(files.read(&big), Some(text.clone()));
        assert_eq!(files.read(&small).as_deref(), Some("max\n"));
        assert_eq!(
            files.read(&big),
            Some(text),
            "read again whole, from the start"
        );
        std::fs::write(&big, vec![b'x'; MAX_TEXT + 1]).unwrap();
        assert_eq!(files.read(&big), None, "past MAX_TEXT: not a cgroup file");
    }

    #[test]
    fn the_files_kept_are_half_the_descriptors_within_bounds() {
        assert_eq!(max_open(1024), 512);
        assert_eq!(max_open(256), MAX_OPEN);
        assert_eq!(max_open(0), MAX_OPEN);
        assert_eq!(max_open(20_000), 10_000);
        assert_eq!(max_open(524_288), MAX_OPEN_CEILING);
        assert_eq!(max_open(u64::MAX), MAX_OPEN_CEILING);
        let dir = tempfile::tempdir().unwrap();
        let files = OpenFiles::with_max(3);
        for i in 0..5 {
            let path = dir.path().join(format!("f{i}"));
            std::fs::write(&path, "1\n").unwrap();
            assert!(files.read(&path).is_some());
        }
        assert_eq!(files.len(), 3);
    }
}
