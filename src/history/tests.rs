//! The history's files: written, cut by a crash, damaged, folded into minutes, removed after
//! the grace period; rows read back as they were written.

use std::fs;
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use super::*;
use crate::decide::tests::spec;

const WAIT: Duration = Duration::from_secs(30);

fn row(unix_ms: i64, current: u32, demand: f64) -> Record {
    Record {
        unix_ms,
        current,
        desired: current + 1,
        demand_mib: Some(demand),
        limit_mib: Some(64.0),
        memory_pct: Some(50.125),
        cpu_pct: None,
        pressure_pct: None,
        external: Some(3.0),
        oom_kills: 1,
        reason: "above-threshold".into(),
    }
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// A history whose desired count is 3.
fn learned() -> History {
    crate::decide::tests::settled(3).0
}

#[test]
fn a_row_reads_back_as_written() {
    let r = row(1_700_000_000_123, 3, 12.5);
    let line = r.line();
    assert_eq!(
        line,
        "1700000000123,3,4,12.5,64,50.125,,,3,1,above-threshold\n"
    );
    assert_eq!(Record::parse(line.trim_end()), Some(r));
    assert_eq!(
        Record::parse("1700000000123,3,4,12.5"),
        None,
        "a row a crash cut"
    );
    assert_eq!(Record::parse(record::HEADER), None);
}

#[test]
fn passes_and_what_was_learned_are_written_and_read_back() {
    let dir = tempfile::tempdir().unwrap();
    let s = spec(1, 10, 60.0);
    let mut store = Store::open(dir.path());
    let t = now_ms();
    let start = Instant::now();
    store.pass("web", &row(t, 2, 10.0), start);
    store.pass("web", &row(t + 1000, 3, 20.0), start);
    // First saved within a minute of its first pass, at an offset of its own.
    assert!(store.due("web", start + SAVE_EVERY));
    let h = learned();
    store.save("web", &h, start);
    assert!(
        !store.due("web", start + SAVE_EVERY / 2),
        "saved a moment ago"
    );
    assert!(store.due("web", start + SAVE_EVERY));
    store.flush(WAIT);
    let (rows, bad) = read(dir.path(), "web", 0).unwrap();
    assert_eq!(
        (rows, bad),
        (vec![row(t, 2, 10.0), row(t + 1000, 3, 20.0)], 0)
    );
    // A new store (a restart) resumes from it.
    let mut again = Store::open(dir.path());
    let resumed = again.resume(&s, Instant::now());
    assert_eq!(resumed.desired(), Some(3));
}

#[test]
fn a_crash_mid_write_loses_neither_the_last_save_nor_the_rows_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let s = spec(1, 10, 60.0);
    let mut store = Store::open(dir.path());
    let t = now_ms();
    store.pass("web", &row(t, 2, 10.0), Instant::now());
    store.save("web", &learned(), Instant::now());
    store.flush(WAIT);
    drop(store);
    // Killed while writing: a save half written beside the last, a row cut short.
    let g = dir.path().join("groups/web");
    fs::write(g.join("learned.json.tmp"), b"{\"saved_at_unix_ms\": 17").unwrap();
    let mut passes = fs::OpenOptions::new()
        .append(true)
        .open(g.join("passes.csv"))
        .unwrap();
    std::io::Write::write_all(&mut passes, b"1700000000999,3,4,1").unwrap();
    drop(passes);
    let mut store = Store::open(dir.path());
    assert_eq!(store.resume(&s, Instant::now()).desired(), Some(3));
    store.pass("web", &row(t + 2000, 4, 30.0), Instant::now());
    store.save("web", &learned(), Instant::now());
    store.flush(WAIT);
    let (rows, bad) = read(dir.path(), "web", 0).unwrap();
    assert_eq!(rows, vec![row(t, 2, 10.0), row(t + 2000, 4, 30.0)]);
    assert_eq!(bad, 1, "the cut row, and only it, is not read");
}

#[test]
fn a_damaged_save_is_set_aside_and_the_group_starts_fresh() {
    let dir = tempfile::tempdir().unwrap();
    let s = spec(1, 10, 60.0);
    let g = dir.path().join("groups/web");
    fs::create_dir_all(&g).unwrap();
    fs::write(g.join("learned.json"), b"not json").unwrap();
    let mut store = Store::open(dir.path());
    assert_eq!(store.resume(&s, Instant::now()).desired(), None);
    assert_eq!(
        fs::read(g.join("learned.json.damaged")).unwrap(),
        b"not json"
    );
    assert!(!g.join("learned.json").exists());
    assert!(matches!(disk::load(dir.path(), "web"), Loaded::Nothing));
    // A save from a version this daemon does not read is set aside too.
    let mut saved = learned().save(Instant::now());
    saved.version = 99;
    let json = format!(
        "{{\"saved_at_unix_ms\":0,\"history\":{}}}",
        serde_json::to_string(&saved).unwrap()
    );
    fs::write(g.join("learned.json"), json).unwrap();
    match disk::load(dir.path(), "web") {
        Loaded::Damaged(why) => assert!(why.contains("version 99"), "{why}"),
        _ => panic!("read a version it does not know"),
    }
}

#[test]
fn a_day_of_passes_is_folded_into_minutes_and_a_week_is_kept() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = Store::open(dir.path());
    let now = now_ms();
    let (hour, day) = (3_600_000, 24 * 3_600_000);
    // Eight days ago (dropped), two days ago (two passes in one minute), now.
    let minute = (now - 2 * day).div_euclid(60_000) * 60_000;
    for r in [
        row(now - 8 * day, 1, 5.0),
        row(minute + 1000, 2, 10.0),
        row(minute + 2000, 5, 7.0),
        row(now - hour, 3, 12.0),
    ] {
        store.pass("web", &r, Instant::now());
    }
    store.save("web", &learned(), Instant::now());
    store.flush(WAIT);
    let (rows, bad) = read(dir.path(), "web", 0).unwrap();
    assert_eq!(bad, 0);
    let mut folded = row(minute, 5, 10.0);
    folded.desired = 6;
    folded.oom_kills = 2;
    assert_eq!(rows, vec![folded, row(now - hour, 3, 12.0)]);
    let passes = fs::read_to_string(dir.path().join("groups/web/passes.csv")).unwrap();
    assert_eq!(
        passes.lines().count(),
        2,
        "the header and the last hour: {passes}"
    );
    // Since a time: only what is newer.
    let (recent, _) = read(dir.path(), "web", now - day).unwrap();
    assert_eq!(recent, vec![row(now - hour, 3, 12.0)]);
}

#[test]
fn the_rows_read_by_minute_are_the_rows_folded_into_minutes() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = Store::open(dir.path());
    let now = now_ms();
    let day = 24 * 3_600_000;
    // Two days ago (folded into minutes.csv when written), then passes every 7 s for an hour
    // ending now (passes.csv), some minutes with a higher one.
    let mut rows = vec![
        row(now - 2 * day, 2, 10.0),
        row(now - 2 * day + 5_000, 3, 4.0),
    ];
    rows.extend(
        (0..514)
            .rev()
            .map(|k| row(now - k * 7_000, 2 + (k % 3) as u32, (k % 11) as f64)),
    );
    for r in &rows {
        store.pass("web", r, Instant::now());
    }
    store.save("web", &learned(), Instant::now());
    store.flush(WAIT);
    let (all, _) = read(dir.path(), "web", 0).unwrap();
    let minutes = disk::read_minutes(dir.path(), "web", 0).unwrap();
    assert_eq!(minutes, record::by_minute(all.clone()));
    assert!(
        minutes.len() < all.len() / 5,
        "{} of {}",
        minutes.len(),
        all.len()
    );
    // Since a time, as `read`.
    let since = now - 1_800_000;
    let (recent, _) = read(dir.path(), "web", since).unwrap();
    assert_eq!(
        disk::read_minutes(dir.path(), "web", since).unwrap(),
        record::by_minute(recent)
    );
}

#[test]
fn a_group_no_longer_declared_keeps_its_history_for_the_grace_period() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = Store::open(dir.path());
    for g in ["web", "old", "gone"] {
        store.pass(g, &row(now_ms(), 1, 1.0), Instant::now());
        store.save(g, &learned(), Instant::now());
    }
    store.flush(WAIT);
    // `gone` was last written longer ago than the grace period.
    let long_ago = SystemTime::now() - GRACE - Duration::from_secs(60);
    for f in ["passes.csv", "learned.json"] {
        let file = fs::File::options()
            .write(true)
            .open(dir.path().join("groups/gone").join(f))
            .unwrap();
        file.set_modified(long_ago).unwrap();
    }
    store.declared(["web".to_owned()]);
    store.flush(WAIT);
    let groups = dir.path().join("groups");
    assert!(groups.join("web").exists());
    assert!(groups.join("old").exists(), "within its grace period");
    assert!(!groups.join("gone").exists());
}

#[test]
fn a_directory_that_cannot_be_written_stops_nothing() {
    let dir = tempfile::tempdir().unwrap();
    // `groups` is a file: nothing can be written under it.
    fs::write(dir.path().join("groups"), b"").unwrap();
    let mut store = Store::open(dir.path());
    store.pass("web", &row(now_ms(), 1, 1.0), Instant::now());
    store.save("web", &learned(), Instant::now());
    store.flush(WAIT);
    assert!(matches!(
        disk::load(dir.path(), "web"),
        Loaded::Damaged(_) | Loaded::Nothing
    ));
    // The store goes on: the next rows are kept for the next save.
    store.pass("web", &row(now_ms(), 2, 1.0), Instant::now());
}

#[test]
fn the_directory_is_the_key_else_the_units() {
    use std::ffi::OsStr;
    let key = Path::new("/srv/hpa");
    assert_eq!(
        directory(Some(key), Some(OsStr::new("/var/lib/incus-hpa"))),
        Some(key.to_owned())
    );
    assert_eq!(
        directory(None, Some(OsStr::new("/var/lib/incus-hpa:/var/lib/other"))),
        Some("/var/lib/incus-hpa".into())
    );
    assert_eq!(directory(None, None), None);
}

#[test]
fn rows_are_written_every_few_seconds_without_a_save() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = Store::open(dir.path());
    let (t, start) = (now_ms(), Instant::now());
    store.pass("web", &row(t, 2, 10.0), start);
    store.pass("db", &row(t, 1, 5.0), start);
    store.write_rows(start);
    store.flush(WAIT);
    assert_eq!(read(dir.path(), "web", 0).unwrap().0, vec![], "not yet");
    store.write_rows(start + ROWS_EVERY);
    store.flush(WAIT);
    assert_eq!(read(dir.path(), "web", 0).unwrap().0, vec![row(t, 2, 10.0)]);
    assert_eq!(read(dir.path(), "db", 0).unwrap().0, vec![row(t, 1, 5.0)]);
    assert!(
        matches!(disk::load(dir.path(), "web"), Loaded::Nothing),
        "no save yet"
    );
}
