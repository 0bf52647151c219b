//! Operator controls on the real Incus: a paused group whose memory is over its threshold holds
//! still until it is resumed, `incus-hpa status` and the metrics agree with Incus, and protected
//! instances survive a scale-down.

use std::time::Duration;

use crate::lab::*;

const MINUTE: Duration = Duration::from_secs(60);
const PROTECTED: &str = "user.incus-hpa.protected";

#[test]
#[ignore = "needs a real Incus with the busybox image (scripts/test.sh runs it)"]
fn real_pause_holds_a_group_and_protection_keeps_instances() {
    let mut lab = Lab::new("ops");
    let g = lab.group.clone();
    let sock = lab.dir.path().join("control.sock");
    // Metrics on TCP too, on a port the system picks (the log names it).
    let with_socket = |t: String| {
        t.replace(
            "[daemon]",
            &format!(
                "[daemon]\ncontrol_socket = \"{}\"\nmetrics_address = \"127.0.0.1:0\"",
                sock.display()
            ),
        )
    };
    let toml = with_socket(config(&g, 1, 3, ""));
    let paused = with_socket(config(&g, 1, 3, "paused = true"));
    lab.start(&toml);
    eventually(&lab, "min (1) running", MINUTE, || running(&g) == 1);
    let first = managed(&g)[0].0.clone();
    let current = |n: u32| {
        format!("incus_hpa_instances{{group=\"{g}\",project=\"default\",state=\"current\"}} {n}")
    };
    eventually(&lab, "the metrics show 1", MINUTE, || {
        get(&sock, "/metrics").contains(&current(1))
    });
    promtool_check(&get(&sock, "/metrics"));

    // Paused, then over threshold: it decides to scale up, says it is paused, does nothing.
    lab.reload(&paused);
    lab.exec(&first, FILL);
    eventually(&lab, "a paused decision to scale up", MINUTE, || {
        lab.log_count(&["paused (nothing is done)", "scaling up", "paused=true"]) > 0
    });
    assert_eq!(managed(&g).len(), 1, "acted while paused\n{}", lab.log());

    // Resumed: it scales up; `status --json` and the metrics agree with Incus.
    lab.reload(&toml);
    eventually(&lab, "2 running after the resume", MINUTE, || {
        running(&g) == 2
    });
    eventually(&lab, "status --json shows 2", MINUTE, || {
        let doc = status_json(&sock);
        doc["groups"][0]["current"] == 2 && doc["groups"][0]["paused"] == false
    });
    let doc = status_json(&sock);
    assert_eq!(doc["groups"][0]["name"], g.as_str());
    assert_eq!(
        doc["groups"][0]["last_action"]["kind"],
        "create",
        "{}",
        lab.log()
    );
    // The same metrics on the unix socket and on TCP: they moved with the scale-up and parse.
    let tcp = metrics_address(&lab);
    eventually(&lab, "the metrics show 2", MINUTE, || {
        get(&sock, "/metrics").contains(&current(2))
    });
    for metrics in [get(&sock, "/metrics"), get_tcp(tcp, "/metrics")] {
        assert!(metrics.contains(&current(2)), "{metrics}");
        let creates = "incus_hpa_incus_requests_total{method=\"POST\",endpoint=\"/1.0/instances\",status=\"2xx\"}";
        assert!(metrics.contains(creates), "{metrics}");
        let ok = "incus_hpa_actions_total{group=\"";
        assert!(metrics.contains(ok), "{metrics}");
        promtool_check(&metrics);
    }
    assert!(get_tcp(tcp, "/status").contains("not found"));
    let second = managed(&g)
        .into_iter()
        .find(|(n, _)| *n != first)
        .unwrap()
        .0;

    // Both protected, memory released: nothing can go, and the decision says why.
    incus_ok(&["config", "set", &first, &format!("{PROTECTED}=true")]);
    incus_ok(&["config", "set", &second, &format!("{PROTECTED}=true")]);
    lab.exec(&first, "rm -f /dev/shm/fill");
    eventually(&lab, "a decision held by protection", MINUTE, || {
        lab.log_count(&["reason=\"protected\""]) > 0
    });
    assert_eq!(managed(&g).len(), 2, "{}", lab.log());

    // The first unprotected: it goes (it is the one left to remove), the newest stays.
    incus_ok(&["config", "unset", &first, PROTECTED]);
    eventually(&lab, "back to 1", MINUTE, || managed(&g).len() == 1);
    assert_eq!(
        managed(&g)[0].0,
        second,
        "the protected instance was removed"
    );
    assert_eq!(lab.terminate(), Some(0), "{}", lab.log());
}

fn status_json(sock: &std::path::Path) -> serde_json::Value {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_incus-hpa"))
        .args(["status", "--json", "--control-socket"])
        .arg(sock)
        .output()
        .unwrap();
    serde_json::from_slice(&out.stdout).unwrap_or_default()
}

/// One HTTP/1.0 GET on the control socket: the body.
fn get(sock: &std::path::Path, path: &str) -> String {
    http_get(std::os::unix::net::UnixStream::connect(sock).unwrap(), path)
}

/// One HTTP/1.0 GET on `[daemon] metrics_address`: the body.
fn get_tcp(addr: std::net::SocketAddr, path: &str) -> String {
    http_get(std::net::TcpStream::connect(addr).unwrap(), path)
}

fn http_get(mut s: impl std::io::Read + std::io::Write, path: &str) -> String {
    write!(s, "GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out.split_once("\r\n\r\n")
        .map_or(out.clone(), |(_, b)| b.to_owned())
}

/// Where the daemon says it serves `/metrics` on TCP.
fn metrics_address(lab: &Lab) -> std::net::SocketAddr {
    let log = lab.log();
    let Some(at) = log.split("serving /metrics on http://").nth(1) else {
        panic!("the daemon does not serve /metrics on TCP\n{log}");
    };
    at.split('/').next().unwrap().parse().unwrap()
}

/// `promtool check metrics` on `text`: it must parse and pass promtool's lint, as
/// Prometheus' own tooling sees it (`scripts/install-test-tools.sh` installs promtool).
fn promtool_check(text: &str) {
    use std::io::Write;
    let mut child = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| {
            panic!("promtool: {e}: run `bash scripts/install-test-tools.sh` (as root) first")
        });
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics: {}{}\n--- the metrics ---\n{text}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
#[ignore = "needs a real Incus with the busybox image (scripts/test.sh runs it)"]
fn real_drain_runs_inside_the_instance_before_its_removal() {
    let mut lab = Lab::new("drain");
    let g = lab.group.clone();
    // It writes a file, reads it back and exits with a status the daemon must report.
    let drain = "drain_command = [\"/bin/sh\", \"-c\", \"echo bye > /tmp/drained && \
                 test -s /tmp/drained && exit 3\"]\ndrain_timeout = \"10s\"";
    lab.start(&config(&g, 1, 2, drain));
    eventually(&lab, "min (1) running", MINUTE, || running(&g) == 1);
    let first = managed(&g)[0].0.clone();
    lab.exec(&first, FILL);
    eventually(&lab, "scale-up to 2", MINUTE, || running(&g) == 2);
    let second = managed(&g)
        .into_iter()
        .find(|(n, _)| *n != first)
        .unwrap()
        .0;
    lab.exec(&first, "rm -f /dev/shm/fill");
    eventually(&lab, "back to 1", MINUTE, || managed(&g).len() == 1);
    let log = lab.log();
    let drained = format!("the drain command in {second} exited 3 after");
    assert!(log.contains(&drained), "{log}");
    assert!(
        !exists(&second),
        "a failed drain still removes the instance"
    );
    assert_eq!(lab.terminate(), Some(0), "{}", lab.log());
}
