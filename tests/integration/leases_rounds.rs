//! Rounds of leases through the fake Incus, round by round: daemons given different lease
//! lengths, the confirmation of a lease just taken, and projects that share one lease store.

use std::sync::Arc;
use std::time::Duration;

use incus_hpa::incus::Incus;
use incus_hpa::lease::{Clocks, Leases, Standing};
use tokio::time::{advance, Instant};

use crate::fake::FakeIncus;
use crate::util::{eventually, run_for, web, Harness};

const WEB: &str = "web";

fn daemon(me: &str, lease_s: u64) -> Leases {
    Leases::with(
        me.into(),
        None,
        Duration::from_secs(lease_s),
        Clocks::tokio(),
    )
}

/// The wall clock of the daemons of these tests (tokio's, paused).
fn now_ms() -> i64 {
    (Clocks::tokio().wall)()
}

async fn round(l: &Leases, fake: &FakeIncus, project: &str) {
    l.renew(fake, project, &[WEB.to_owned()]).await.unwrap();
}

/// Takes the lease of `web` of `project`, and confirms it a renewal later.
async fn take(l: &Leases, fake: &FakeIncus, project: &str) {
    round(l, fake, project).await;
    advance(l.confirm_after()).await;
    round(l, fake, project).await;
    assert!(l.holds(project, WEB), "{:?}", l.standing(project, WEB));
}

/// Writes `value` as the lease of `key` in the store of `project`, as another daemon would.
async fn write(fake: &FakeIncus, project: &str, key: &str, value: String) {
    let mut home = fake.leases(project).await.unwrap();
    home.config.insert(key.into(), value);
    assert!(fake.put_leases(project, &home).await.unwrap());
}

/// A rolling restart gives one daemon `lease = "600s"`; the other keeps the default 15 s. The
/// long lease is renewed every 200 s, and the other never takes it between two renewals: it
/// is judged by its writer's length, not its reader's.
#[tokio::test(start_paused = true)]
async fn daemons_given_different_leases_never_both_hold_a_group() {
    let fake = Arc::new(FakeIncus::default());
    let long = Arc::new(daemon("host-a:1:aaaa", 600));
    let short = Arc::new(daemon("host-b:2:bbbb", 15));
    for l in [&long, &short] {
        l.set_groups([("default", WEB)]);
    }
    take(&long, &fake, "default").await;
    // From now on each renews on its own, as the daemon does.
    let keep_long = tokio::spawn(long.clone().keep(fake.clone()));
    let keep_short = tokio::spawn(short.clone().keep(fake.clone()));
    let both = || long.holds("default", WEB) && short.holds("default", WEB);
    // Half an hour, sampled every second: the holder acts throughout, and only it.
    for _ in 0..1800 {
        run_for(Duration::from_secs(1)).await;
        assert!(!both(), "both hold the lease");
        assert!(
            long.holds("default", WEB),
            "{:?}",
            long.standing("default", WEB)
        );
    }
    assert!(matches!(
        short.standing("default", WEB),
        Standing::Standby { .. }
    ));
    // The holder dies: the other takes over once the long lease ran out, and not before.
    keep_long.abort();
    let died = Instant::now();
    while !short.holds("default", WEB) {
        run_for(Duration::from_secs(1)).await;
        assert!(!both(), "both hold the lease");
        assert!(
            died.elapsed() < Duration::from_secs(900),
            "never taken over"
        );
    }
    assert!(!long.holds("default", WEB));
    keep_short.abort();
}

/// Its own record, found after its lease ran out here (its renewals failed for a minute), is
/// a lease taken anew: another daemon may have read it expired and written at the same
/// instant, both answered 200. It is acted on only once read back a renewal later.
#[tokio::test(start_paused = true)]
async fn its_own_lease_found_after_it_ran_out_is_confirmed_anew() {
    let fake = Arc::new(FakeIncus::default());
    let a = daemon("host-a:1:aaaa", 15);
    take(&a, &fake, "default").await;
    advance(Duration::from_secs(60)).await;
    assert!(!a.holds("default", WEB));
    // A and B read the store, where A's record ran out, and both write.
    let seen_by_b = fake.leases("default").await.unwrap();
    round(&a, &fake, "default").await;
    assert_eq!(a.standing("default", WEB), Standing::Confirming);
    assert!(!a.holds("default", WEB), "acted on a lease not read back");
    let mut b_write = seen_by_b;
    let until = now_ms() + 15_000;
    b_write.config.insert(
        "user.incus-hpa.lease.web".into(),
        format!("host-b:2:bbbb lease=15000 until={until}"),
    );
    fake.pass_stale_puts(1);
    assert!(fake.put_leases("default", &b_write).await.unwrap());
    // B's write stayed: A's next round reads it, and A never acted.
    advance(a.confirm_after()).await;
    round(&a, &fake, "default").await;
    assert!(matches!(
        a.standing("default", WEB),
        Standing::Standby { .. }
    ));
}

/// A round woken sooner than a renewal after the take (an event, another group due) leaves a
/// new lease unconfirmed, and writes nothing for it; one a renewal later confirms it.
#[tokio::test(start_paused = true)]
async fn a_round_sooner_than_a_renewal_after_the_take_does_not_confirm_it() {
    let fake = Arc::new(FakeIncus::default());
    let a = daemon("host-a:1:aaaa", 15);
    round(&a, &fake, "default").await;
    assert_eq!(a.standing("default", WEB), Standing::Confirming);
    assert_eq!(a.confirm_in("default", WEB), Some(a.confirm_after()));
    for early in [Duration::ZERO, a.confirm_after() - Duration::from_millis(1)] {
        advance(early).await;
        round(&a, &fake, "default").await;
        assert_eq!(a.standing("default", WEB), Standing::Confirming);
    }
    assert_eq!(fake.calls("put_leases"), 1);
    assert_eq!(a.confirm_in("default", WEB), Some(Duration::from_millis(1)));
    advance(Duration::from_millis(1)).await;
    round(&a, &fake, "default").await;
    assert!(a.holds("default", WEB));
    assert_eq!(a.confirm_in("default", WEB), None);
}

/// The daemon's loop wakes a group's round every interval (2 s) while its new lease is not
/// confirmed: it still acts only a renewal (5 s) after it took it.
#[tokio::test(start_paused = true)]
async fn a_daemon_acts_on_a_lease_it_took_only_a_renewal_later() {
    let fake = Arc::new(FakeIncus::default());
    let started = Instant::now();
    let h = Harness::start(&web(2, 4), fake.clone());
    eventually("a creation", Duration::from_secs(60), || {
        !fake.managed("web").is_empty()
    })
    .await;
    let took = started.elapsed();
    assert!(
        took >= Duration::from_secs(5),
        "acted {took:?} after the take"
    );
    h.shutdown().await;
}

/// A project made with `features.profiles=false` uses the default project's profiles, the lease
/// store among them: a group `web` there and one in the default project keep a lease each in
/// that one store, and both act.
#[tokio::test(start_paused = true)]
async fn groups_of_one_name_in_projects_sharing_a_store_keep_their_own_leases() {
    let fake = Arc::new(FakeIncus::default());
    fake.use_default_profiles("staging");
    let a = daemon("host-a:1:aaaa", 15);
    let b = daemon("host-b:2:bbbb", 15);
    round(&a, &fake, "default").await;
    round(&b, &fake, "staging").await;
    advance(a.confirm_after()).await;
    round(&a, &fake, "default").await;
    round(&b, &fake, "staging").await;
    assert!(a.holds("default", WEB), "{:?}", a.standing("default", WEB));
    assert!(b.holds("staging", WEB), "{:?}", b.standing("staging", WEB));
    let key = |k: &str| fake.project_key("default", k).unwrap_or_default();
    assert!(key("user.incus-hpa.lease.web").starts_with("host-a:1:aaaa lease=15000 until="));
    assert!(key("user.incus-hpa.lease.staging.web").starts_with("host-b:2:bbbb "));
    // A project with profiles of its own keeps the group's name alone, as every version did.
    let c = daemon("host-c:3:cccc", 15);
    round(&c, &fake, "prod").await;
    assert!(fake
        .project_key("prod", "user.incus-hpa.lease.web")
        .is_some_and(|v| v.starts_with("host-c:3:cccc ")));
    // Each gives up its own on shutdown.
    b.release(fake.as_ref(), "staging", &[WEB.to_owned()])
        .await
        .unwrap();
    assert_eq!(key("user.incus-hpa.lease.staging.web"), "");
    assert!(key("user.incus-hpa.lease.web").starts_with("host-a:1:aaaa "));
}

/// During an upgrade, an older daemon of a project that shares the default project's store
/// keeps its group's lease under the group's name alone (no `lease=`): while it renews it, a
/// newer daemon of a group of that name waits; once it ran out, the newer one takes its own.
#[tokio::test(start_paused = true)]
async fn an_older_daemons_lease_in_a_shared_store_is_waited_out() {
    let fake = Arc::new(FakeIncus::default());
    fake.use_default_profiles("staging");
    let older = |fake: Arc<FakeIncus>| async move {
        let until = now_ms() + 15_000;
        let value = format!("old-host:7:oooo until={until}");
        write(&fake, "default", "user.incus-hpa.lease.web", value).await;
    };
    let b = daemon("host-b:2:bbbb", 15);
    for _ in 0..12 {
        older(fake.clone()).await;
        round(&b, &fake, "staging").await;
        assert_eq!(
            b.standing("staging", WEB).standby().as_deref(),
            Some("old-host:7:oooo")
        );
        advance(Duration::from_secs(5)).await;
    }
    // The older daemon stopped: its lease and the margin run out, then B takes its own.
    advance(Duration::from_secs(15)).await;
    round(&b, &fake, "staging").await;
    assert_eq!(b.standing("staging", WEB), Standing::Confirming);
    advance(b.confirm_after()).await;
    round(&b, &fake, "staging").await;
    assert!(b.holds("staging", WEB));
    assert!(fake
        .project_key("default", "user.incus-hpa.lease.staging.web")
        .is_some_and(|v| v.starts_with("host-b:2:bbbb ")));
}
