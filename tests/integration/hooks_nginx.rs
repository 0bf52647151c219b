//! `incus-hpa hook nginx` against a real nginx (Debian's nginx-light, which
//! `scripts/install-test-tools.sh` installs), run by the test on 127.0.0.1 with its own
//! prefix and configuration, proxying to two tiny HTTP backends through the upstream file the
//! hook writes.

use std::process::{Command, Stdio};

use super::hooks_common::*;

#[test]
fn the_nginx_hook_writes_the_upstream_and_reloads_nginx() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let port = free_port();
    let upstream = d.join("upstream.conf");
    let nginx = tool("nginx");
    std::fs::create_dir(d.join("tmp")).unwrap();
    std::fs::write(
        d.join("nginx.conf"),
        format!(
            "daemon off;\npid {p}/nginx.pid;\nerror_log {p}/error.log;\nworker_processes 1;\n\
             events {{ worker_connections 64; }}\n\
             http {{\n    access_log off;\n    client_body_temp_path {p}/tmp;\n    proxy_temp_path {p}/tmp;\n\
             \x20   include {u};\n\
             \x20   server {{\n        listen 127.0.0.1:{port};\n        location / {{ proxy_pass http://web; }}\n    }}\n}}\n",
            p = d.display(),
            u = upstream.display(),
        ),
    )
    .unwrap();
    let gate = Gate::default();
    let (a, b) = (backend("a", gate.clone()), backend("b", gate.clone()));
    let file = upstream.to_str().unwrap();

    // The first file, before nginx runs (nothing to reload yet).
    let first = [
        "nginx",
        "--upstream-file",
        file,
        "--upstream",
        "web",
        "--reload-command",
        "/bin/true",
    ];
    succeeded(&hook(&first, &set(&[])));
    let prefix = d.to_str().unwrap();
    let conf = d.join("nginx.conf");
    let conf = conf.to_str().unwrap();
    let _nginx = Server(
        Command::new(&nginx)
            .args([
                "-p",
                prefix,
                "-c",
                conf,
                "-e",
                &format!("{prefix}/error.log"),
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    eventually("nginx answering 502 (its upstream is down)", STEP, || {
        statuses(port, 1) == [502].into()
    });

    let reload = format!("{nginx} -p {prefix} -c {conf} -e {prefix}/error.log -s reload");
    let args = [
        "nginx",
        "--upstream-file",
        file,
        "--upstream",
        "web",
        "--reload-command",
        &reload,
    ];
    succeeded(&hook(&args, &set(&[a, b])));
    // A reload is graceful: the old worker answers until the new one takes over.
    eventually("requests reaching both backends", STEP, || {
        try_bodies(port, 10).is_some_and(|b| b.len() == 2)
    });

    // The same set again: nothing written, no reload (a reload would fail here).
    let written = std::fs::metadata(&upstream).unwrap().modified().unwrap();
    let failing = [
        "nginx",
        "--upstream-file",
        file,
        "--upstream",
        "web",
        "--reload-command",
        "/bin/false",
    ];
    succeeded(&hook(&failing, &set(&[a, b])));
    assert_eq!(
        std::fs::metadata(&upstream).unwrap().modified().unwrap(),
        written
    );

    // A reload that fails: exit 1, the previous file kept.
    let before = std::fs::read_to_string(&upstream).unwrap();
    let out = hook(&failing, &set(&[a]));
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("/bin/false"),
        "{out:?}"
    );
    assert_eq!(std::fs::read_to_string(&upstream).unwrap(), before);

    // One endpoint, reloaded by SIGHUP to the pid in nginx's pid file.
    let pid_file = d.join("nginx.pid");
    let by_signal = [
        "nginx",
        "--upstream-file",
        file,
        "--upstream",
        "web",
        "--pid-file",
        pid_file.to_str().unwrap(),
    ];
    succeeded(&hook(&by_signal, &set(&[a])));
    eventually("requests reaching a only", STEP, || {
        try_bodies(port, 10) == Some(["a".to_owned()].into())
    });

    // None: the placeholder server is down, nginx answers 502.
    succeeded(&hook(&args, &set(&[])));
    eventually("nginx answering 502", STEP, || {
        statuses(port, 3) == [502].into()
    });
    let text = std::fs::read_to_string(&upstream).unwrap();
    assert!(text.contains("server 127.0.0.1:1 down;"), "{text}");
    gate.open();
}
