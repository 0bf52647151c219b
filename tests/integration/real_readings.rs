//! The readings of a real instance beside its memory: CPU time and pressure from the cgroup
//! files of this host, CPU time from the API's answers. Ignored by a plain `cargo test`, like
//! the other real tests; the instance has its own random name and is removed at the end.

use std::sync::Arc;
use std::time::{Duration, Instant};

use incus_hpa::incus::client::{UnixClient, DEFAULT_SOCKET};
use incus_hpa::incus::Incus;
use incus_hpa::memory::{ApiSource, CgroupSource, MemorySource};

use crate::lab::*;

/// How far apart the two cgroup readings are: the CPU share shown is the counter's change
/// over it (only shown: the test asserts no rate, the host may be busy).
const INTERVAL: Duration = Duration::from_secs(2);

#[tokio::test]
#[ignore = "needs a real Incus with the busybox image (scripts/test.sh runs it)"]
async fn real_busy_instance_reads_cpu_time_and_pressure() {
    let mut lab = Lab::new("cpu");
    let name = format!("{}-busy", lab.group);
    lab.launch_unmanaged(&name, &["limits.cpu=1"]);
    // A loop that spins for as long as the instance runs, detached from the exec session.
    lab.exec(
        &name,
        "busybox sh -c 'while :; do :; done' </dev/null >/dev/null 2>&1 &",
    );
    let cgroup = CgroupSource::system();
    let read = || {
        let m = cgroup
            .read_one("default", &name)
            .expect("a cgroup reading of a running instance");
        (Instant::now(), m)
    };
    let (t0, first) = read();
    std::thread::sleep(INTERVAL);
    let (t1, second) = read();
    let (Some(c0), Some(c1)) = (first.cpu_ns, second.cpu_ns) else {
        panic!("no CPU time: {first:?} {second:?}");
    };
    assert!(
        c1 > c0,
        "the CPU counter did not move: {first:?} {second:?}"
    );
    assert!(second.pressure.is_some(), "no pressure: {second:?}");
    assert!(second.limit > 0 && second.usage > 0, "{second:?}");
    eprintln!(
        "busy loop: {:.2} CPU over {:.1} s, pressure {:?} %",
        (c1 - c0) as f64 / (t1 - t0).as_nanos() as f64,
        (t1 - t0).as_secs_f64(),
        second.pressure
    );

    // The API: the CPU time comes with the memory, from /state and from the metrics.
    let client = Arc::new(UnixClient::new(DEFAULT_SOCKET).expect("client"));
    let state = client.memory_state("default", &name).await.unwrap();
    let state = state.expect("a /state reading");
    assert!(state.cpu_ns.is_some_and(|ns| ns > 0), "{state:?}");
    assert_eq!(state.pressure, None, "{state:?}");
    let api = ApiSource::new(client.clone());
    // Two instances wanted: one metrics request (the ghost is then asked for by /state).
    let ghost = format!("{name}-ghost");
    let read = api.read("default", &[name.clone(), ghost]).await;
    let m = read[0].expect("an API reading");
    assert!(m.cpu_ns.is_some_and(|ns| ns > 0), "{read:?}");
    assert_eq!(m.pressure, None, "{read:?}");
}
