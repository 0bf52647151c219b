//! Traffic on the real Incus: busybox web servers on the test's bridge behind a real HAProxy on
//! 127.0.0.1, fed by `incus-hpa hook haproxy` as the group's endpoints command. While a client
//! sends requests through HAProxy without a pause, the group scales in: the instance leaves
//! HAProxy's backend before it is stopped, `deregistration_delay` after, and not one request
//! fails. A hook that fails holds the removal; a restart publishes the set it finds.

use std::time::Duration;

use crate::hooks_common::{free_port, get, start_haproxy, Client};
use crate::lab::*;
use crate::web::{status_json, Net, PROFILE, SUBNET};

const MINUTE: Duration = Duration::from_secs(60);

/// The time at the start of a log line, in milliseconds since the epoch's day start (lines of
/// one test run fall within one day but for a run across midnight, which only shifts a check).
fn millis(line: &str) -> Option<i64> {
    let t = line.get(11..23)?; // HH:MM:SS.mmm of 2026-12-03T14:00:00.000000Z
    let h: i64 = t.get(0..2)?.parse().ok()?;
    let m: i64 = t.get(3..5)?.parse().ok()?;
    let s: i64 = t.get(6..8)?.parse().ok()?;
    let ms: i64 = t.get(9..12)?.parse().ok()?;
    Some(((h * 60 + m) * 60 + s) * 1000 + ms)
}

/// The time of the first line of `log` with every one of `parts`.
fn when(log: &str, parts: &[&str]) -> Option<i64> {
    log.lines()
        .find(|l| parts.iter().all(|p| l.contains(p)))
        .and_then(millis)
}

#[test]
#[ignore = "needs a real Incus (scripts/test.sh runs it)"]
fn real_scale_in_behind_haproxy_drops_no_request() {
    let _net = Net::up();
    let mut lab = Lab::new("trf");
    let g = lab.group.clone();
    let sock = lab.dir.path().join("control.sock");
    let port = free_port();
    let _haproxy = start_haproxy(lab.dir.path(), port, 4);
    let admin = lab.dir.path().join("admin.sock");
    let group = |min: u32, command: &str| {
        let extra = format!(
            "ready = {{ port = 80, path = \"/\", period = \"500ms\", timeout = \"400ms\" }}\n\
             endpoints = {{ command = {command}, timeout = \"5s\", \
             deregistration_delay = \"2s\" }}\n\
             profiles = [\"default\", \"{PROFILE}\"]"
        );
        config(&g, min, 3, &extra)
            .replace("image = \"busybox\"", "image = \"busybox-web\"")
            .replace(
                "[daemon]",
                &format!("[daemon]\ncontrol_socket = \"{}\"", sock.display()),
            )
    };
    let hook = format!(
        "[{:?}, \"hook\", \"haproxy\", \"--socket\", {:?}, \"--backend\", \"web\"]",
        env!("CARGO_BIN_EXE_incus-hpa"),
        admin.display().to_string()
    );
    lab.start(&group(2, &hook));

    // Two instances ready and published; HAProxy answers through them.
    eventually(&lab, "two endpoints published", MINUTE, || {
        status_json(&sock)["groups"][0]["endpoints"]["published"]
            .as_array()
            .is_some_and(|p| p.len() == 2)
    });
    let published = status_json(&sock)["groups"][0]["endpoints"]["published"].clone();
    for e in published.as_array().unwrap() {
        assert!(
            e["address"].as_str().unwrap().starts_with(SUBNET),
            "{published}"
        );
        assert_eq!(e["port"], 80);
    }
    eventually(&lab, "HAProxy answers 200", MINUTE, || {
        matches!(get(port, "/"), Some((200, _)))
    });

    // Scale in to 1 under a client that never pauses: the leaving instance is taken out of
    // HAProxy first, stopped 2 s later, and no request fails.
    let client = Client::start(port);
    lab.reload(&group(1, &hook));
    eventually(&lab, "one instance left", MINUTE, || managed(&g).len() == 1);
    let (sent, failed) = client.finish();
    let log = lab.log();
    assert!(sent > 0, "no request was sent");
    assert_eq!(failed, 0, "{failed} of {sent} requests failed\n{log}");
    let out = log
        .lines()
        .find(|l| l.contains("took ") && l.contains("out of the endpoints"))
        .unwrap_or_else(|| panic!("no removal took an instance out of the endpoints\n{log}"));
    let name = out
        .split("took ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .unwrap()
        .to_owned();
    let (left, deleted) = (
        millis(out).unwrap(),
        when(&log, &["deleted ", &name]).expect("its delete in the log"),
    );
    assert!(
        deleted - left >= 2000,
        "deleted {} ms after it left the set\n{log}",
        deleted - left
    );
    eprintln!(
        "{sent} requests, {failed} failed; {name} deleted {} ms after it left",
        deleted - left
    );

    // A hook that fails (its backend does not exist) holds the next removal: the instance
    // stays; once the hook works again the removal goes on.
    let broken = hook.replace("\"web\"]", "\"nowhere\"]");
    lab.reload(&group(2, &hook));
    eventually(&lab, "two endpoints again", MINUTE, || {
        status_json(&sock)["groups"][0]["endpoints"]["published"]
            .as_array()
            .is_some_and(|p| p.len() == 2)
    });
    let held_before = lab.log_count(&["held the removal"]);
    lab.reload(&group(1, &broken));
    eventually(&lab, "a removal held", MINUTE, || {
        lab.log_count(&["held the removal"]) > held_before
    });
    assert_eq!(managed(&g).len(), 2, "{}", lab.log());
    lab.reload(&group(1, &hook));
    eventually(&lab, "the held removal done", MINUTE, || {
        managed(&g).len() == 1
    });

    // A restart publishes the set it finds and removes nothing.
    assert_eq!(lab.terminate(), Some(0), "{}", lab.log());
    let survivor = managed(&g)[0].0.clone();
    lab.start(&group(1, &hook));
    eventually(&lab, "the set published after the restart", MINUTE, || {
        status_json(&sock)["groups"][0]["endpoints"]["published"]
            .as_array()
            .is_some_and(|p| p.len() == 1 && p[0]["instance"] == survivor.as_str())
    });
    assert_eq!(managed(&g).len(), 1, "{}", lab.log());
    assert!(matches!(get(port, "/"), Some((200, _))));
    assert_eq!(lab.terminate(), Some(0), "{}", lab.log());
}
