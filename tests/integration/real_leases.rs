//! Three daemons on one group, on the real Incus, the first through the unix socket and the
//! others through HTTPS with a certificate restricted to the project: the lease lives in the
//! project's lease store, the profile `incus-hpa.leases`; one daemon acts and the
//! others stand by; the group never grows past what one daemon would
//! make; a SIGKILLed holder is replaced by the other, and a SIGSTOPped one that wakes after its
//! lease ran out does not act until it holds the lease again. And a daemon that takes a group
//! over from a dead holder resumes from what that holder left in the learned store, the
//! profile `incus-hpa.learned`.

use std::process::Command;
use std::time::Duration;

use crate::https::HttpsAccess;
use crate::lab::*;

const MINUTE: Duration = Duration::from_secs(60);

/// The group's file for the daemon of `lab`, through HTTPS with `https`, else the socket.
fn toml(lab: &Lab, min: u32, max: u32, https: Option<&HttpsAccess>) -> String {
    config(&lab.group, min, max, "").replace(
        "[daemon]",
        &format!(
            "[daemon]\nlease = \"3s\"\ncontrol_socket = \"{}\"\n{}",
            lab.dir.path().join("control.sock").display(),
            https.map(HttpsAccess::daemon_keys).unwrap_or_default()
        ),
    )
}

fn holder(group: &str) -> String {
    incus_ok(&[
        "profile",
        "get",
        "incus-hpa.leases",
        &format!("user.incus-hpa.lease.{group}"),
    ])
    .trim()
    .to_owned()
}

/// An instance of the group other than `first` (the one whose memory is filled).
fn other_than(group: &str, first: &str) -> String {
    managed(group)
        .into_iter()
        .find(|(n, _)| n != first)
        .expect("a second instance")
        .0
}

fn signal(lab: &Lab, sig: &str) {
    let pid = lab.daemon.as_ref().expect("a daemon").id().to_string();
    assert!(Command::new("kill")
        .args([sig, &pid])
        .status()
        .unwrap()
        .success());
}

#[test]
#[ignore = "needs a real Incus with the busybox image (scripts/test.sh runs it)"]
fn real_three_daemons_take_turns_and_never_fight() {
    let https = HttpsAccess::new(true, 2100);
    let mut a = Lab::new("lease");
    let g = a.group.clone();
    a.start(&toml(&a, 1, 2, None));
    // Created for `min` once its new lease is read back, not as the replacement of an instance
    // decided while nobody acted.
    eventually(&a, "1 running, created for min", MINUTE, || {
        running(&g) == 1 && a.log_count(&["action=\"create\"", "reason=\"below-min\""]) == 1
    });
    assert_eq!(a.log_count(&["reason=\"replace\""]), 0, "{}", a.log());
    let pid_a = a.daemon.as_ref().unwrap().id();
    assert!(holder(&g).contains(&format!(":{pid_a}:")), "{}", holder(&g));

    let mut b = a.beside();
    b.start(&toml(&b, 1, 2, Some(&https)));
    eventually(&b, "the second daemon stands by", MINUTE, || {
        b.log_count(&["standby (", "nothing is done here"]) > 0
    });
    // Memory over the threshold in one instance: the group goes to its max, once.
    let first = managed(&g)[0].0.clone();
    a.exec(&first, FILL);
    eventually(&a, "2 running", MINUTE, || running(&g) == 2);
    for _ in 0..20 {
        std::thread::sleep(Duration::from_millis(250));
        assert!(
            managed(&g).len() <= 2,
            "{:?}\n{}\n{}",
            managed(&g),
            a.log(),
            b.log()
        );
    }
    assert_eq!(b.log_count(&["action=\"create\""]), 0, "{}", b.log());

    // SIGKILL the holder, and delete an instance: the other daemon takes over and replaces it.
    signal(&a, "-KILL");
    let victim = other_than(&g, &first);
    incus_ok(&["delete", "--force", &victim]);
    eventually(&b, "the second daemon replaces it", MINUTE, || {
        running(&g) == 2 && b.log_count(&["action=\"create\"", "outcome=\"ok\""]) == 1
    });
    let pid_b = b.daemon.as_ref().unwrap().id();
    assert!(holder(&g).contains(&format!(":{pid_b}:")), "{}", holder(&g));

    // SIGSTOP the new holder past its lease: a third daemon takes over; the stopped one, once
    // resumed, stands by instead of acting on what it saw before.
    let mut c = a.beside();
    c.start(&toml(&c, 1, 2, Some(&https)));
    eventually(&c, "the third daemon stands by", MINUTE, || {
        c.log_count(&["standby ("]) > 0
    });
    signal(&b, "-STOP");
    let pid_c = c.daemon.as_ref().unwrap().id();
    eventually(&c, "the third daemon holds the lease", MINUTE, || {
        holder(&g).contains(&format!(":{pid_c}:"))
    });
    let removed = other_than(&g, &first);
    incus_ok(&["delete", "--force", &removed]);
    signal(&b, "-CONT");
    eventually(&c, "the group is whole again", MINUTE, || running(&g) == 2);
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(managed(&g).len(), 2, "{:?}\n{}", managed(&g), b.log());
    assert_eq!(
        b.log_count(&["action=\"create\"", "outcome=\"ok\""]),
        1,
        "the resumed daemon acted without the lease\n{}",
        b.log()
    );
    assert_eq!(c.terminate(), Some(0), "{}", c.log());
    assert_eq!(b.terminate(), Some(0), "{}", b.log());
}

/// What the holder of `group` left for the next one, as stored: `(holder, at_unix_ms)`.
fn left(group: &str) -> Option<(String, i64)> {
    let out = Command::new("incus")
        .args([
            "profile",
            "get",
            "incus-hpa.learned",
            &format!("user.incus-hpa.learned.default.{group}"),
        ])
        .output()
        .ok()?;
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    Some((v["holder"].as_str()?.to_owned(), v["at_unix_ms"].as_i64()?))
}

fn wall_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

#[test]
#[ignore = "needs a real Incus with the busybox image (scripts/test.sh runs it)"]
fn real_a_new_holder_resumes_from_what_the_dead_one_left() {
    let mut a = Lab::new("left");
    let g = a.group.clone();
    // Kubernetes' rule with a 150 s scale-down window: the window that begins under the first
    // holder ends, under the second, when it would have; one that knew nothing would hold
    // 150 s from its own start. The first summary is handed over a minute after the start and
    // written with a round of leases after that: the window leaves the first holder about 90 s
    // to write it before it would scale down itself (one that began removing an instance
    // before it died would have it restarted by the next, and the window with it).
    let toml = toml(&a, 1, 2, None).replace(
        "scale_down_stabilization = \"6s\"",
        "scale_down_stabilization = \"150s\"\npolicy = \"kubernetes\"",
    );
    a.start(&toml);
    eventually(&a, "1 running", MINUTE, || running(&g) == 1);
    let first = managed(&g)[0].0.clone();
    a.exec(&first, FILL);
    eventually(&a, "2 running", MINUTE, || running(&g) == 2);
    a.exec(&first, "rm -f /dev/shm/fill");
    let dropped = wall_ms();
    // A summary left after the drop (a minute after the start), then the holder dies.
    eventually(&a, "a summary left after the drop", 2 * MINUTE, || {
        left(&g).is_some_and(|(_, at)| at > dropped)
    });
    let pid_a = a.daemon.as_ref().unwrap().id();
    let (by, at) = left(&g).unwrap();
    eprintln!(
        "memory dropped at {dropped} ms; a summary left at {at} ms, seen in Incus at {} ms",
        wall_ms()
    );
    assert!(by.contains(&format!(":{pid_a}:")), "{by}");
    assert_eq!(running(&g), 2, "held within the window\n{}", a.log());
    signal(&a, "-KILL");
    let mut b = a.beside();
    b.start(&toml.replace(
        &a.dir.path().join("control.sock").display().to_string(),
        &b.dir.path().join("control.sock").display().to_string(),
    ));
    eventually(
        &b,
        "the new holder resumes from what the dead one left",
        MINUTE,
        || b.log_count(&["taken over from", "resumes from what it left"]) > 0,
    );
    let took_over = std::time::Instant::now();
    if let Some(line) = b.log().lines().find(|l| l.contains("taken over from")) {
        eprintln!("{line}");
    }
    eventually(
        &b,
        "down to 1 when the window that began under A ends",
        3 * MINUTE,
        || running(&g) == 1,
    );
    let after = took_over.elapsed();
    let since_drop = Duration::from_millis((wall_ms() - dropped) as u64);
    assert!(
        since_drop >= Duration::from_secs(145),
        "scaled down within the window: {since_drop:?}\n{}",
        b.log()
    );
    assert!(
        after < Duration::from_secs(140),
        "held a new window: {after:?} after the takeover\n{}",
        b.log()
    );
    assert_eq!(b.terminate(), Some(0), "{}", b.log());
}
