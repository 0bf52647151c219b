//! The actor against the fake Incus: fresh reads decide (a stale cache never removes a protected
//! instance nor starts one that is no longer the group's), the lease is asked before every
//! step that changes something, and a creation Incus did not say the end of is never undone.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use incus_hpa::act::{self, ActError, Applied, Ctx, Done, Shutdown};
use incus_hpa::informer::Store;
use incus_hpa::model::{Action, Cause, GroupSpec, OWNER_KEY, PROTECTED_KEY};

use crate::fake::FakeIncus;
use crate::util::{eventually, run_for, web, Harness};

const MINUTE: Duration = Duration::from_secs(60);
const SECOND: Duration = Duration::from_secs(1);

fn spec(extra: &str) -> GroupSpec {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("g.toml");
    std::fs::write(
        &file,
        web(1, 4).replace(
            "[groups.web.config]",
            &format!("{extra}\n[groups.web.config]"),
        ),
    )
    .unwrap();
    let loaded = incus_hpa::config::load(&file).unwrap();
    loaded.state.groups.into_values().next().unwrap()
}

/// Applies `actions` on a cache read before `behind_its_back` changes Incus, with a fence
/// that holds for its first `allowed` questions.
async fn apply(
    fake: &FakeIncus,
    spec: &GroupSpec,
    behind_its_back: impl FnOnce(),
    actions: &[Action],
    allowed: usize,
) -> Applied {
    let store = Store::default();
    store
        .list(
            fake,
            &spec.project,
            tokio::time::Instant::now(),
            Duration::MAX,
        )
        .await
        .unwrap();
    behind_its_back();
    let asked = AtomicUsize::new(0);
    let fence = || asked.fetch_add(1, Ordering::SeqCst) < allowed;
    act::apply(
        &Ctx {
            incus: fake,
            store: &store,
            spec,
            shutdown: &Shutdown::default(),
            fence: &fence,
            endpoints: None,
            ready: None,
            quiet: None,
        },
        actions,
        4,
    )
    .await
}

fn remove(name: &str) -> Action {
    Action::Remove {
        name: name.into(),
        cause: Cause::ScaleDown,
    }
}

#[tokio::test(start_paused = true)]
async fn a_removal_stops_at_the_step_where_the_lease_ran_out() {
    let fake = FakeIncus::default();
    fake.add_owned("web", "web-aaaaaa", "Running");
    let s = spec("drain_command = [\"/bin/true\"]");
    // Held to start the action and to drain; gone before the stop.
    let applied = apply(&fake, &s, || {}, &[remove("web-aaaaaa")], 2).await;
    let result = &applied.outcomes[0].result;
    assert!(
        matches!(result, Err(ActError::LeaseLost { step }) if step.contains("stopping")),
        "{result:?}"
    );
    assert_eq!(fake.calls("exec"), 1, "drained");
    assert_eq!(
        (fake.calls("change_state"), fake.calls("delete")),
        (0, 0),
        "nothing after the lease ran out"
    );
    assert_eq!(
        fake.managed("web"),
        vec![("web-aaaaaa".into(), "Running".into())]
    );
    // Held throughout: stopped and deleted.
    let applied = apply(&fake, &s, || {}, &[remove("web-aaaaaa")], usize::MAX).await;
    assert!(applied.outcomes[0].result.is_ok());
    assert!(!fake.exists("web-aaaaaa"));
}

#[tokio::test(start_paused = true)]
async fn actions_not_started_for_lack_of_a_lease_are_counted() {
    let fake = FakeIncus::default();
    let s = spec("");
    let creates = vec![
        Action::Create {
            cause: Cause::ScaleUp,
            target: None,
        };
        3
    ];
    let applied = apply(&fake, &s, || {}, &creates, 0).await;
    assert_eq!((applied.outcomes.len(), applied.fenced), (0, 3));
    assert_eq!(fake.calls("create"), 0);
}

#[tokio::test(start_paused = true)]
async fn fresh_reads_refuse_what_a_stale_cache_would_allow() {
    let fake = FakeIncus::default();
    fake.add_owned("web", "web-aaaaaa", "Running");
    fake.add_owned("web", "web-bbbbbb", "Stopped");
    let s = spec("");
    // Protected after the pass read it: never removed.
    let applied = apply(
        &fake,
        &s,
        || fake.set_config("web-aaaaaa", PROTECTED_KEY, Some("true")),
        &[remove("web-aaaaaa")],
        usize::MAX,
    )
    .await;
    let result = &applied.outcomes[0].result;
    assert!(
        matches!(result, Err(ActError::Refused { why, .. }) if why.contains("protected")),
        "{result:?}"
    );
    assert!(fake.exists("web-aaaaaa"));
    assert_eq!((fake.calls("change_state"), fake.calls("delete")), (0, 0));
    // Taken over by a person (its owner record rewritten): neither started nor promoted.
    for action in [
        Action::Start {
            name: "web-bbbbbb".into(),
            cause: Cause::Restart,
        },
        Action::Promote {
            name: "web-bbbbbb".into(),
            cause: Cause::ScaleUp,
        },
    ] {
        let applied = apply(
            &fake,
            &s,
            || fake.set_config("web-bbbbbb", OWNER_KEY, Some("default/web-bbbbbb/theirs")),
            &[action],
            usize::MAX,
        )
        .await;
        let result = &applied.outcomes[0].result;
        assert!(
            matches!(result, Err(ActError::Refused { why, .. }) if why.contains("not (or no longer)")),
            "{result:?}"
        );
    }
    assert_eq!(fake.calls("change_state") + fake.calls("set_config"), 0);
    assert_eq!(fake.get_instance("web-bbbbbb").unwrap().status, "Stopped");
}

/// Sets `key` to `value` on `name` `after` the start (a person, while the daemon acts).
async fn later(fake: &FakeIncus, after: Duration, name: &str, key: &str, value: &str) {
    tokio::time::sleep(after).await;
    fake.set_config(name, key, Some(value));
}

#[tokio::test(start_paused = true)]
async fn an_instance_protected_during_its_drain_is_left_running() {
    let fake = FakeIncus::default();
    fake.add_owned("web", "web-aaaaaa", "Running");
    fake.set_drain(0, Some(MINUTE));
    let s = spec("drain_command = [\"/bin/true\"]\ndrain_timeout = \"5m\"");
    let removal = [remove("web-aaaaaa")];
    let (applied, ()) = tokio::join!(
        apply(&fake, &s, || {}, &removal, usize::MAX),
        later(&fake, 10 * SECOND, "web-aaaaaa", PROTECTED_KEY, "true"),
    );
    let result = &applied.outcomes[0].result;
    assert!(
        matches!(result, Err(ActError::Refused { why, .. })
            if why.contains("protected it") && why.contains("left running")),
        "{result:?}"
    );
    assert_eq!(fake.drains().len(), 1);
    assert_eq!((fake.calls("change_state"), fake.calls("delete")), (0, 0));
    assert_eq!(fake.get_instance("web-aaaaaa").unwrap().status, "Running");
}

#[tokio::test(start_paused = true)]
async fn an_instance_taken_over_during_its_drain_is_left_as_it_is() {
    let fake = FakeIncus::default();
    fake.add_owned("web", "web-aaaaaa", "Running");
    fake.set_drain(0, Some(MINUTE));
    let s = spec("drain_command = [\"/bin/true\"]\ndrain_timeout = \"5m\"");
    let theirs = "default/web-aaaaaa/theirs";
    let removal = [remove("web-aaaaaa")];
    let (applied, ()) = tokio::join!(
        apply(&fake, &s, || {}, &removal, usize::MAX),
        later(&fake, 10 * SECOND, "web-aaaaaa", OWNER_KEY, theirs),
    );
    let result = &applied.outcomes[0].result;
    assert!(
        matches!(result, Err(ActError::Refused { why, .. }) if why.contains("no longer")),
        "{result:?}"
    );
    assert_eq!((fake.calls("change_state"), fake.calls("delete")), (0, 0));
    assert_eq!(fake.get_instance("web-aaaaaa").unwrap().status, "Running");
}

#[tokio::test(start_paused = true)]
async fn an_instance_protected_during_its_stop_is_started_again() {
    let fake = FakeIncus::default();
    fake.add_owned("web", "web-aaaaaa", "Running");
    fake.set_stop_time(Some(30 * SECOND));
    let s = spec("");
    let removal = [remove("web-aaaaaa")];
    let (applied, ()) = tokio::join!(
        apply(&fake, &s, || {}, &removal, usize::MAX),
        later(&fake, 10 * SECOND, "web-aaaaaa", PROTECTED_KEY, "true"),
    );
    let result = &applied.outcomes[0].result;
    assert!(
        matches!(result, Err(ActError::Refused { why, .. })
            if why.contains("protected it") && why.contains("started again")),
        "{result:?}"
    );
    assert_eq!(fake.calls("delete"), 0);
    assert_eq!(fake.get_instance("web-aaaaaa").unwrap().status, "Running");
    // A stopped one is left stopped, as it was: there is no stop to undo.
    fake.add_owned("web", "web-bbbbbb", "Stopped");
    fake.set_config("web-bbbbbb", PROTECTED_KEY, Some("true"));
    let applied = apply(&fake, &s, || {}, &[remove("web-bbbbbb")], usize::MAX).await;
    assert!(applied.outcomes[0].result.is_err());
    assert_eq!(fake.get_instance("web-bbbbbb").unwrap().status, "Stopped");
}

#[tokio::test(start_paused = true)]
async fn a_creation_incus_did_not_finish_telling_is_never_undone_and_counted_next_pass() {
    let fake = Arc::new(FakeIncus::default());
    fake.set_creates_unfinished(true);
    let create = [Action::Create {
        cause: Cause::BelowMin,
        target: None,
    }];
    let applied = apply(&fake, &spec(""), || {}, &create, usize::MAX).await;
    assert!(
        matches!(applied.outcomes[0].result, Ok(Done::StillRunning)),
        "{:?}",
        applied.outcomes
    );
    assert_eq!((fake.managed("web").len(), fake.calls("delete")), (1, 0));
    // The daemon: every wait ends early, yet the group reaches its min once, and stays there.
    let fake = Arc::new(FakeIncus::default());
    fake.set_creates_unfinished(true);
    let h = Harness::start(&web(2, 4), fake.clone());
    eventually("2 running", MINUTE, || fake.running("web") == 2).await;
    run_for(Duration::from_secs(30)).await;
    assert_eq!(fake.managed("web").len(), 2, "{:?}", fake.managed("web"));
    assert_eq!(fake.calls("delete"), 0);
    h.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_holder_whose_lease_ran_out_during_a_drain_never_takes_the_next_holders_removal_for_its_own(
) {
    let fake = FakeIncus::default();
    fake.add_owned("web", "web-aaaaaa", "Running");
    fake.set_drain(0, Some(MINUTE));
    let s = spec("drain_command = [\"/bin/true\"]\ndrain_timeout = \"5m\"");
    let removal = [remove("web-aaaaaa")];
    // Held to start the action and to drain; during the drain its lease runs out, and the
    // daemon that takes the group over removes the instance itself.
    let (applied, ()) = tokio::join!(apply(&fake, &s, || {}, &removal, 2), async {
        tokio::time::sleep(10 * SECOND).await;
        fake.remove("web-aaaaaa");
    });
    let result = &applied.outcomes[0].result;
    assert!(
        matches!(result, Err(ActError::LeaseLost { step }) if step.contains("stopping")),
        "not a removal of its own: {result:?}"
    );
    assert_eq!((fake.calls("change_state"), fake.calls("delete")), (0, 0));
}
