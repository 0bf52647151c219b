//! Small cgroup files kept open from one pass to the next and read again from offset 0: a
//! cgroup file is a seq file, whose text is made afresh by every read from its start, so one
//! `pread` replaces an open, a read and a close each pass (the CPU and pressure files of the
//! signals, three per instance). A file whose cgroup is gone answers ENODEV and is opened anew
//! (an instance restarted gets a new cgroup of the same name).
//!
//! A descriptor kept open keeps its cgroup in the kernel after the instance is deleted, so the
//! files of deleted instances are closed at the next [`OpenFiles::sweep`] but one (the source
//! sweeps after each group's reading): a sweep looks at the files not read since the one
//! before and closes those whose directory is gone, or that were not read for [`IDLE`]. The
//! files read in between are not looked at, so a steady pass costs no more than its reads,
//! and the descriptors kept follow the instances there are. At most [`MAX_OPEN`] files are
//! kept; past that, a file is read the plain way, so the daemon never holds many descriptors
//! for this.

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The most files kept open (a quarter of the usual soft limit of 1,024 descriptors).
pub const MAX_OPEN: usize = 256;

/// A file not read for this long is closed by the next sweep (or when room is needed).
pub const IDLE: Duration = Duration::from_secs(600);

/// The cache of open files; see the module's header.
#[derive(Default)]
pub struct OpenFiles {
    kept: Mutex<Kept>,
}

#[derive(Default)]
struct Kept {
    files: HashMap<PathBuf, Open>,
    /// Sweeps done so far.
    sweeps: u64,
}

struct Open {
    file: File,
    /// When it was last read.
    used: Instant,
    /// How many sweeps had been done when it was last read.
    sweep: u64,
}

impl OpenFiles {
    fn kept(&self) -> std::sync::MutexGuard<'_, Kept> {
        self.kept.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The text of the small file at `path`, or `None` when it cannot be read.
    pub fn read(&self, path: &Path) -> Option<String> {
        self.read_at(path, Instant::now())
    }

    fn read_at(&self, path: &Path, now: Instant) -> Option<String> {
        let mut kept = self.kept();
        let sweep = kept.sweeps;
        if let Some(open) = kept.files.get_mut(path) {
            if let Some(text) = read_from_start(&open.file) {
                open.used = now;
                open.sweep = sweep;
                return Some(text);
            }
            // Its cgroup is gone (or the file changed): open it anew.
            kept.files.remove(path);
        }
        let file = File::open(path).ok()?;
        let text = read_from_start(&file)?;
        if kept.files.len() >= MAX_OPEN {
            kept.files
                .retain(|_, open| now.duration_since(open.used) < IDLE);
        }
        if kept.files.len() < MAX_OPEN {
            let open = Open {
                file,
                used: now,
                sweep,
            };
            kept.files.insert(path.to_path_buf(), open);
        }
        Some(text)
    }

    /// Closes the files not read since the last sweep whose directory is gone (their cgroup was
    /// removed: the instance was deleted or stopped) or that were not read for [`IDLE`]. One
    /// `stat` per directory looked at.
    pub fn sweep(&self) {
        self.sweep_at(Instant::now());
    }

    fn sweep_at(&self, now: Instant) {
        let mut kept = self.kept();
        let current = kept.sweeps;
        let mut there: HashMap<PathBuf, bool> = HashMap::new();
        kept.files.retain(|path, open| {
            if open.sweep == current {
                return true;
            }
            if now.saturating_duration_since(open.used) >= IDLE {
                return false;
            }
            let dir = path.parent().unwrap_or(Path::new("/"));
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

/// The whole text of `file` from offset 0, whatever was read of it before.
fn read_from_start(file: &File) -> Option<String> {
    let mut text = Vec::new();
    let mut buf = [0u8; 1024];
    loop {
        let n = file.read_at(&mut buf, text.len() as u64).ok()?;
        if n == 0 {
            break;
        }
        text.extend_from_slice(&buf[..n]);
        if text.len() > 64 * 1024 {
            return None;
        }
    }
    String::from_utf8(text).ok()
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
        files.sweep();
        assert_eq!(
            files.len(),
            8,
            "read since the last sweep: kept, not looked at"
        );
        std::fs::remove_dir_all(&dirs[0]).unwrap();
        files.sweep();
        assert_eq!(files.len(), 6, "d0 is gone");
        // Read between two sweeps: kept even though its directory went in between.
        assert!(files.read(&dirs[1].join("cpu.stat")).is_some());
        std::fs::remove_dir_all(&dirs[1]).unwrap();
        files.sweep();
        assert_eq!(files.len(), 5, "d1's unread file closed, its read one kept");
        files.sweep();
        assert_eq!(files.len(), 4, "and closed at the sweep after");
    }

    #[test]
    fn a_sweep_closes_the_files_not_read_for_idle() {
        let dir = tempfile::tempdir().unwrap();
        let (old, new) = (dir.path().join("old"), dir.path().join("new"));
        std::fs::write(&old, "1\n").unwrap();
        std::fs::write(&new, "2\n").unwrap();
        let files = OpenFiles::default();
        let t0 = Instant::now();
        assert!(files.read_at(&old, t0).is_some());
        files.sweep_at(t0);
        assert!(files.read_at(&new, t0 + IDLE).is_some());
        files.sweep_at(t0 + IDLE);
        assert_eq!(files.len(), 1, "the idle one closed, the other kept");
        assert!(files.read_at(&new, t0 + IDLE).is_some());
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
}
