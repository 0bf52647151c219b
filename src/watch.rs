//! Hot reload on save: watches the desired-state file's directory (editors replace files by
//! rename, and the file may briefly vanish), debounces, and asks the daemon loop to reload.

use std::path::{Path, PathBuf};
use std::time::Duration;

use notify_debouncer_mini::notify::RecursiveMode;
use notify_debouncer_mini::{new_debouncer, DebounceEventResult, Debouncer};
use tokio::sync::mpsc::UnboundedSender;

use crate::daemon::Event;

/// How long the file must stay quiet before a reload.
pub const DEBOUNCE: Duration = Duration::from_millis(500);

/// Keeps the watch alive; dropping it stops watching.
pub struct Watch {
    _debouncer: Debouncer<notify_debouncer_mini::notify::RecommendedWatcher>,
}

/// Watches `file` and sends [`Event::Reload`] after it changes, appears or disappears.
pub fn watch(file: &Path, events: UnboundedSender<Event>) -> Result<Watch, String> {
    let file: PathBuf =
        std::path::absolute(file).map_err(|e| format!("{}: {e}", file.display()))?;
    let dir = file
        .parent()
        .ok_or_else(|| format!("{} has no directory to watch", file.display()))?
        .to_path_buf();
    let name = file.file_name().map(|n| n.to_owned());
    // Reading the file (as a reload does) is an event too: only a real change counts.
    let mut last = fingerprint(&file);
    let mut debouncer = new_debouncer(DEBOUNCE, move |res: DebounceEventResult| match res {
        Ok(evs) => {
            if evs.iter().any(|e| e.path.file_name() == name.as_deref()) {
                let now = fingerprint(&file);
                if now != last {
                    last = now;
                    let _ = events.send(Event::Reload);
                }
            }
        }
        Err(e) => tracing::warn!(error = %e, "watching the desired-state file failed: {e}"),
    })
    .map_err(|e| format!("cannot watch {}: {e}", dir.display()))?;
    debouncer
        .watcher()
        .watch(&dir, RecursiveMode::NonRecursive)
        .map_err(|e| format!("cannot watch {}: {e}", dir.display()))?;
    Ok(Watch {
        _debouncer: debouncer,
    })
}

/// What identifies a version of the file: device, inode, size, modification and change times
/// (a `chmod` matters too: the daemon checks the mode). `None` when it does not exist.
fn fingerprint(file: &Path) -> Option<(u64, u64, u64, i64, i64, i64, i64)> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(file).ok()?;
    Some((
        m.dev(),
        m.ino(),
        m.size(),
        m.mtime(),
        m.mtime_nsec(),
        m.ctime(),
        m.ctime_nsec(),
    ))
}
