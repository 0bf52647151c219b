//! Small cgroup files kept open from one pass to the next and read again from offset 0: a
//! cgroup file is a seq file, whose text is made afresh by every read from its start, so one
//! `pread` replaces an open, a read and a close each pass (the CPU and pressure files of the
//! signals, three per instance). A file whose cgroup is gone answers ENODEV and is opened anew
//! (an instance restarted gets a new cgroup of the same name). At most [`MAX_OPEN`] files are
//! kept, the ones used least recently given up first after [`IDLE`]; past that, a file is read
//! the plain way, so the daemon never holds many descriptors for this.

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The most files kept open (a quarter of the usual soft limit of 1,024 descriptors).
pub const MAX_OPEN: usize = 256;

/// A file not read for this long is closed when room is needed.
pub const IDLE: Duration = Duration::from_secs(600);

/// The cache of open files; see the module's header.
#[derive(Default)]
pub struct OpenFiles {
    files: Mutex<HashMap<PathBuf, (File, Instant)>>,
}

impl OpenFiles {
    /// The text of the small file at `path`, or `None` when it cannot be read.
    pub fn read(&self, path: &Path) -> Option<String> {
        let now = Instant::now();
        let mut files = self.files.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((file, used)) = files.get_mut(path) {
            if let Some(text) = read_from_start(file) {
                *used = now;
                return Some(text);
            }
            // Its cgroup is gone (or the file changed): open it anew.
            files.remove(path);
        }
        let file = File::open(path).ok()?;
        let text = read_from_start(&file)?;
        if files.len() >= MAX_OPEN {
            files.retain(|_, (_, used)| now.duration_since(*used) < IDLE);
        }
        if files.len() < MAX_OPEN {
            files.insert(path.to_path_buf(), (file, now));
        }
        Some(text)
    }

    /// How many files are kept open.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.files.lock().unwrap_or_else(|e| e.into_inner()).len()
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
