//! Several daemons on one group, through the fake Incus: only the holder of the group's lease
//! acts; the others report `standby`; a holder that dies is replaced within one lease plus a
//! renewal, and one that shuts down cleanly at once.

use std::sync::Arc;
use std::time::Duration;

use crate::fake::{mem, FakeIncus};
use crate::util::{eventually, run_for, web, Harness};

const MINUTE: Duration = Duration::from_secs(60);

fn standby(h: &Harness) -> Option<String> {
    h.telemetry.status().groups.first()?.standby.clone()
}

#[tokio::test(start_paused = true)]
async fn two_daemons_never_create_more_than_one_would() {
    let fake = Arc::new(FakeIncus::default());
    *fake.default_memory.lock().unwrap() = Some(mem(90.0));
    let a = Harness::start_as("host-a:1:aaaa", &web(2, 6), fake.clone());
    let b = Harness::start_as("host-b:2:bbbb", &web(2, 6), fake.clone());
    // Busy instances: the group grows to its max, and never past it, over a few minutes.
    for _ in 0..1800 {
        run_for(Duration::from_millis(100)).await;
        assert!(fake.managed("web").len() <= 6, "{:?}", fake.managed("web"));
    }
    assert_eq!(fake.running("web"), 6);
    // One holds the lease; the other stands by and says who acts.
    let (sa, sb) = (standby(&a), standby(&b));
    assert!(sa.is_some() != sb.is_some(), "{sa:?} {sb:?}");
    let holder = fake
        .project_key("default", "user.incus-hpa.lease.web")
        .unwrap();
    let standing_by = sa.or(sb).unwrap();
    assert!(
        holder.starts_with(&standing_by),
        "{holder} vs {standing_by}"
    );
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_dead_holder_is_replaced_within_a_lease_and_a_clean_one_at_once() {
    let fake = Arc::new(FakeIncus::default());
    let a = Harness::start_as("host-a:1:aaaa", &web(2, 4), fake.clone());
    eventually("2 running", MINUTE, || fake.running("web") == 2).await;
    run_for(Duration::from_secs(5)).await;
    let b = Harness::start_as("host-b:2:bbbb", &web(2, 4), fake.clone());
    run_for(Duration::from_secs(10)).await;
    assert_eq!(standby(&b).as_deref(), Some("host-a:1:aaaa"));
    // SIGKILL: no shutdown, the lease stays written until it runs out.
    a.kill();
    let victim = fake.managed("web")[0].0.clone();
    fake.remove(&victim);
    let killed = tokio::time::Instant::now();
    eventually("the other daemon replaces it", MINUTE, || {
        fake.running("web") == 2
    })
    .await;
    // Lease (15 s) plus its drift margin (3 s), plus one renewal (5 s) and one interval (2 s).
    let took = killed.elapsed();
    assert!(took <= Duration::from_secs(25), "{took:?}");
    assert!(
        took >= Duration::from_secs(15),
        "taken over before the lease ran out: {took:?}"
    );
    assert_eq!(standby(&b), None);
    // A clean shutdown gives the lease up: a third daemon takes over within a renewal.
    let c = Harness::start_as("host-c:3:cccc", &web(2, 4), fake.clone());
    run_for(Duration::from_secs(10)).await;
    assert!(standby(&c).is_some());
    b.shutdown().await;
    let victim = fake.managed("web")[0].0.clone();
    fake.remove(&victim);
    let stopped = tokio::time::Instant::now();
    eventually("the third daemon replaces it", MINUTE, || {
        fake.running("web") == 2
    })
    .await;
    assert!(
        stopped.elapsed() <= Duration::from_secs(8),
        "{:?}",
        stopped.elapsed()
    );
    c.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_renewal_that_loses_a_race_reads_again() {
    use incus_hpa::lease::{Leases, Standing};
    let fake = Arc::new(FakeIncus::default());
    let leases = Leases::new("host-a:1:aaaa".into(), Duration::from_secs(15));
    let groups = ["web".to_owned()];
    // Two lost races, then the write goes through: held.
    fake.conflict_next_puts(2);
    leases
        .renew(fake.as_ref(), "default", &groups)
        .await
        .unwrap();
    let now = tokio::time::Instant::now();
    assert!(matches!(
        leases.standing("default", "web", now),
        Standing::Held { .. }
    ));
    // Three lost races: nothing is known yet, and nothing is acted on.
    let other = Leases::new("host-b:2:bbbb".into(), Duration::from_secs(15));
    fake.conflict_next_puts(3);
    other
        .renew(fake.as_ref(), "db", &["db".to_owned()])
        .await
        .unwrap();
    assert_eq!(other.standing("db", "db", now), Standing::Unknown);
    assert_eq!(fake.calls("put_leases"), 6);
}

#[tokio::test(start_paused = true)]
async fn a_daemon_refused_the_lease_acts_on_nothing_until_it_may_write_it() {
    let fake = Arc::new(FakeIncus::default());
    fake.refuse_leases(true);
    let h = Harness::start(&web(2, 4), fake.clone());
    run_for(Duration::from_secs(30)).await;
    assert_eq!(fake.managed("web").len(), 0, "acted without a lease");
    assert!(standby(&h).is_some());
    // Allowed at last: it takes the lease and the group is made.
    fake.refuse_leases(false);
    eventually("2 running", MINUTE, || fake.running("web") == 2).await;
    assert_eq!(standby(&h), None);
    h.shutdown().await;
}
