//! What the hook tests share: tiny HTTP backends on 127.0.0.1, a free port, a plain HTTP/1.0
//! client, a server process stopped when dropped, and the hook binary run with a set on stdin,
//! each bounded in time.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// How long one step (a request, a hook, a server coming up, a change seen) may take.
pub const STEP: Duration = Duration::from_secs(15);

/// A port free on 127.0.0.1 now (bound, then released: HAProxy cannot bind port 0 and say
/// which it got).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Polls `cond` until it holds, or panics after `within`.
pub fn eventually(what: &str, within: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A gate requests to `/slow` wait at until it is opened.
#[derive(Clone, Default)]
pub struct Gate(Arc<(Mutex<bool>, Condvar)>);

impl Gate {
    pub fn open(&self) {
        *self.0 .0.lock().unwrap() = true;
        self.0 .1.notify_all();
    }

    fn wait(&self) {
        let mut open = self.0 .0.lock().unwrap();
        while !*open {
            open = self.0 .1.wait(open).unwrap();
        }
    }
}

/// A backend on 127.0.0.1 answering every request `200 OK` with its name (HTTP/1.0, one
/// request per connection); a request for `/slow` is answered once `gate` is open. Its
/// thread lives as long as the test process.
pub fn backend(name: &'static str, gate: Gate) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            let gate = gate.clone();
            std::thread::spawn(move || {
                let _ = conn.set_read_timeout(Some(STEP));
                let mut request = Vec::new();
                let mut buf = [0u8; 1024];
                while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                    match conn.read(&mut buf) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => request.extend_from_slice(&buf[..n]),
                    }
                }
                if request.starts_with(b"GET /slow ") {
                    gate.wait();
                }
                let _ = write!(
                    conn,
                    "HTTP/1.0 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{name}",
                    name.len()
                );
            });
        }
    });
    port
}

/// `GET path` through 127.0.0.1:`port`: the status and the body, or None when no answer came.
pub fn get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut conn = TcpStream::connect(("127.0.0.1", port)).ok()?;
    conn.set_read_timeout(Some(STEP)).ok()?;
    write!(conn, "GET {path} HTTP/1.0\r\nHost: test\r\n\r\n").ok()?;
    let mut answer = Vec::new();
    conn.read_to_end(&mut answer).ok()?;
    let text = String::from_utf8_lossy(&answer);
    let status = text.split_whitespace().nth(1)?.parse().ok()?;
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    Some((status, body.to_owned()))
}

/// The bodies of `n` requests to `/` through `port`, or None when one was not answered 200
/// (to poll on while a change takes effect).
pub fn try_bodies(port: u16, n: usize) -> Option<std::collections::BTreeSet<String>> {
    (0..n)
        .map(|_| match get(port, "/") {
            Some((200, body)) => Some(body),
            _ => None,
        })
        .collect()
}

/// The bodies of `n` requests to `/` through `port` (every one must be answered 200).
pub fn bodies(port: u16, n: usize) -> std::collections::BTreeSet<String> {
    try_bodies(port, n)
        .unwrap_or_else(|| panic!("a request through 127.0.0.1:{port} was not answered 200"))
}

/// The statuses of `n` requests to `/` through `port` (0: no answer).
pub fn statuses(port: u16, n: usize) -> std::collections::BTreeSet<u16> {
    (0..n)
        .map(|_| get(port, "/").map_or(0, |(s, _)| s))
        .collect()
}

/// A server process, stopped and reaped when dropped: SIGTERM first, which nginx's master
/// passes on to its workers before it exits (SIGKILL would leave them running), then SIGKILL
/// if it has not exited within [`STEP`].
pub struct Server(pub Child);

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(pid) = rustix::process::Pid::from_raw(self.0.id() as i32) {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        }
        let deadline = Instant::now() + STEP;
        while Instant::now() < deadline {
            if !matches!(self.0.try_wait(), Ok(None)) {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Where a tool the suite needs is, or a panic that says how to get it.
pub fn tool(name: &str) -> String {
    for dir in ["/usr/sbin", "/usr/bin", "/usr/local/sbin", "/usr/local/bin"] {
        let path = format!("{dir}/{name}");
        if Path::new(&path).exists() {
            return path;
        }
    }
    panic!("{name} is not installed: run scripts/install-test-tools.sh as root")
}

/// The set the daemon would give a hook, for endpoints on 127.0.0.1 at `ports`.
pub fn set(ports: &[u16]) -> String {
    let endpoints: Vec<String> = ports
        .iter()
        .enumerate()
        .map(|(i, p)| format!(r#"{{"instance":"web-{i}","address":"127.0.0.1","port":{p}}}"#))
        .collect();
    format!(
        r#"{{"group":"web","project":"default","endpoints":[{}]}}"#,
        endpoints.join(",")
    )
}

/// Runs `incus-hpa hook ARGS…` with `input` on stdin, to its end (killed after [`STEP`]).
pub fn hook(args: &[&str], input: &str) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_incus-hpa"))
        .arg("hook")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let deadline = Instant::now() + STEP;
    loop {
        if child.try_wait().unwrap().is_some() {
            return child.wait_with_output().unwrap();
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            panic!("incus-hpa hook {args:?} did not end within {STEP:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Asserts that a hook exited 0.
pub fn succeeded(out: &Output) {
    assert!(
        out.status.success(),
        "the hook failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// HAProxy in the foreground on `port`, its backend `web` of `slots` free server slots, with
/// its admin socket in `dir`; returns once the socket answers.
pub fn start_haproxy(dir: &std::path::Path, port: u16, slots: u32) -> Server {
    let socket = dir.join("admin.sock");
    let config = dir.join("haproxy.cfg");
    std::fs::write(
        &config,
        format!(
            "global\n    stats socket {} mode 600 level admin\n\
             defaults\n    mode http\n    timeout connect 2s\n    timeout client 15s\n    timeout server 15s\n\
             frontend fe\n    bind 127.0.0.1:{port}\n    default_backend web\n\
             backend web\n    server-template web- 1-{slots} 127.0.0.1:80 disabled\n",
            socket.display()
        ),
    )
    .unwrap();
    let log = std::fs::File::create(dir.join("haproxy.log")).unwrap();
    let server = Server(
        Command::new(tool("haproxy"))
            .arg("-db")
            .arg("-f")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap(),
    );
    eventually("HAProxy's admin socket", STEP, || {
        incus_hpa::hooks::haproxy::send(&socket, "show info")
            .is_ok_and(|a| a.contains("Name: HAProxy"))
    });
    server
}

/// Requests through HAProxy one after another, until stopped: (sent, failed).
pub struct Client {
    stop: Arc<AtomicBool>,
    sent: Arc<AtomicUsize>,
    failed: Arc<AtomicUsize>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Client {
    pub fn start(port: u16) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let sent = Arc::new(AtomicUsize::new(0));
        let failed = Arc::new(AtomicUsize::new(0));
        let (s, n, f) = (stop.clone(), sent.clone(), failed.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                let ok = matches!(get(port, "/"), Some((200, _)));
                n.fetch_add(1, Ordering::Relaxed);
                if !ok {
                    f.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
        Self {
            stop,
            sent,
            failed,
            thread: Some(thread),
        }
    }

    /// Stops it: (requests sent, requests that did not get a 200).
    pub fn finish(mut self) -> (usize, usize) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        (
            self.sent.load(Ordering::Relaxed),
            self.failed.load(Ordering::Relaxed),
        )
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}
