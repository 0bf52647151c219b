//! Hot reload: saving the file (in place or by rename, as editors do) or deleting it sends a
//! reload; other files in the directory do not.

use std::time::Duration;

use incus_hpa::daemon::Event;
use incus_hpa::watch::watch;

async fn next(rx: &mut tokio::sync::mpsc::UnboundedReceiver<Event>, what: &str) {
    let ev = tokio::time::timeout(Duration::from_secs(20), rx.recv())
        .await
        .unwrap_or_else(|_| panic!("no reload after {what}"));
    assert_eq!(ev, Some(Event::Reload), "{what}");
}

#[tokio::test]
async fn saving_renaming_and_deleting_the_file_reload() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("desired-state.toml");
    std::fs::write(&file, "").unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let _w = watch(&file, tx).unwrap();

    std::fs::write(&file, "# edited in place\n").unwrap();
    next(&mut rx, "an in-place write").await;

    let tmp = dir.path().join(".desired-state.toml.swp");
    std::fs::write(&tmp, "# edited by rename\n").unwrap();
    std::fs::rename(&tmp, &file).unwrap();
    next(&mut rx, "a rename over the file").await;

    std::fs::remove_file(&file).unwrap();
    next(&mut rx, "a deletion").await;

    // Unrelated files in the directory, and reading the file (as a reload does): no reload
    // (checked after the debounce has passed).
    std::fs::write(&file, "").unwrap();
    next(&mut rx, "re-creation").await;
    std::fs::write(dir.path().join("other.txt"), "x").unwrap();
    for _ in 0..3 {
        let _ = std::fs::read_to_string(&file).unwrap();
    }
    let quiet = tokio::time::timeout(Duration::from_secs(2), rx.recv()).await;
    assert!(quiet.is_err(), "reloaded for an unrelated file: {quiet:?}");
}
