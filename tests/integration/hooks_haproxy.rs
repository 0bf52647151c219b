//! `incus-hpa hook haproxy` and `hook haproxy-rate` against a real HAProxy (Debian's, which
//! `scripts/install-test-tools.sh` installs), run by the test on 127.0.0.1 with its own
//! configuration: a backend of three server slots, two tiny HTTP backends behind it.

use incus_hpa::hooks::haproxy;

use super::hooks_common::*;

#[test]
fn the_haproxy_hook_makes_the_backend_the_set_without_a_reload() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let _haproxy = start_haproxy(dir.path(), port, 3);
    let socket = dir.path().join("admin.sock");
    let gate = Gate::default();
    let (a, b) = (backend("a", gate.clone()), backend("b", gate.clone()));
    let args = [
        "haproxy",
        "--socket",
        socket.to_str().unwrap(),
        "--backend",
        "web",
    ];

    // No server yet: HAProxy answers 503.
    assert_eq!(statuses(port, 2), [503].into());

    succeeded(&hook(&args, &set(&[a, b])));
    assert_eq!(bodies(port, 10), ["a".to_owned(), "b".to_owned()].into());
    // The same set again: accepted, and nothing changes.
    let before = haproxy::slots(&socket, "web", "").unwrap();
    succeeded(&hook(&args, &set(&[a, b])));
    assert_eq!(haproxy::slots(&socket, "web", "").unwrap(), before);

    // b leaves while a request is in flight on it: that request still completes, and no new
    // request goes to b.
    let slow = std::thread::spawn(move || {
        // Round robin: of two requests in a row, one goes to b.
        let one = std::thread::spawn(move || get(port, "/slow"));
        let two = std::thread::spawn(move || get(port, "/slow"));
        (one.join().unwrap(), two.join().unwrap())
    });
    eventually("two requests in flight", STEP, || {
        let stat = haproxy::send(&socket, "show stat").unwrap();
        stat.lines()
            .filter(|l| l.starts_with("web,web-"))
            .filter_map(|l| l.split(',').nth(4))
            .filter(|scur| *scur == "1")
            .count()
            == 2
    });
    succeeded(&hook(&args, &set(&[a])));
    assert_eq!(bodies(port, 10), ["a".to_owned()].into());
    gate.open();
    let (one, two) = slow.join().unwrap();
    let mut answered = [one.unwrap(), two.unwrap()];
    answered.sort();
    assert_eq!(answered, [(200, "a".to_owned()), (200, "b".to_owned())]);

    // None in service: 503.
    succeeded(&hook(&args, &set(&[])));
    assert_eq!(statuses(port, 3), [503].into());

    // Back to both, then more endpoints than slots: refused, nothing changed.
    succeeded(&hook(&args, &set(&[b, a])));
    assert_eq!(bodies(port, 10), ["a".to_owned(), "b".to_owned()].into());
    let before = haproxy::slots(&socket, "web", "").unwrap();
    let out = hook(&args, &set(&[a, b, free_port(), free_port()]));
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("4 endpoints but only 3"), "{stderr}");
    assert_eq!(haproxy::slots(&socket, "web", "").unwrap(), before);

    // An unknown backend: exit 1, said.
    let out = hook(
        &[
            "haproxy",
            "--socket",
            socket.to_str().unwrap(),
            "--backend",
            "nope",
        ],
        &set(&[a]),
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("Can't find backend"),
        "{out:?}"
    );
}

#[test]
fn haproxy_rate_prints_the_backends_rate() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let _haproxy = start_haproxy(dir.path(), port, 3);
    let socket = dir.path().join("admin.sock");
    let a = backend("a", Gate::default());
    succeeded(&hook(
        &[
            "haproxy",
            "--socket",
            socket.to_str().unwrap(),
            "--backend",
            "web",
        ],
        &set(&[a]),
    ));
    let rate_args = [
        "haproxy-rate",
        "--socket",
        socket.to_str().unwrap(),
        "--backend",
        "web",
    ];
    // The rate is over the last second: requests, then the rate at once, until it shows them.
    eventually("a rate of the requests just sent", STEP, || {
        bodies(port, 5);
        let out = hook(&rate_args, "");
        succeeded(&out);
        let rate: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
        // At most what was sent in the last second or so (a few rounds of five).
        assert!(rate <= 100, "{rate}");
        rate >= 1
    });
    let out = hook(
        &[rate_args[0], "--socket", rate_args[2], "--backend", "nope"],
        "",
    );
    assert_eq!(out.status.code(), Some(1));
}
