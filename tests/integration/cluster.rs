//! The daemon on a (fake) Incus cluster: placement follows `target` or the scheduler, a
//! scale-down keeps the group spread over the members, and instances on an offline member
//! are neither measured nor scaled down, and are replaced only after the health grace period.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use crate::fake::{mem, FakeIncus};
use crate::util::{eventually, run_for, web, Harness};

const MINUTE: Duration = Duration::from_secs(60);

fn cluster() -> Arc<FakeIncus> {
    let fake = Arc::new(FakeIncus::default());
    fake.cluster(&["m1", "m2", "m3"], &[("two", &["m2", "m3"])]);
    *fake.default_memory.lock().unwrap() = Some(mem(10.0));
    fake
}

fn with_target(toml: &str, target: &str) -> String {
    toml.replace(
        "image = \"busybox\"",
        &format!("image = \"busybox\"\ntarget = \"{target}\""),
    )
}

fn counts(pairs: &[(&str, usize)]) -> BTreeMap<String, usize> {
    pairs.iter().map(|(m, n)| (m.to_string(), *n)).collect()
}

#[tokio::test(start_paused = true)]
async fn placement_follows_target_and_the_scheduler_otherwise() {
    let h = Harness::start(&with_target(&web(4, 6), "@two"), cluster());
    eventually("4 running", MINUTE, || h.fake.running("web") == 4).await;
    assert_eq!(h.fake.locations("web"), counts(&[("m2", 2), ("m3", 2)]));
    h.shutdown().await;

    let h = Harness::start(&with_target(&web(2, 6), "m1"), cluster());
    eventually("2 running", MINUTE, || h.fake.running("web") == 2).await;
    assert_eq!(h.fake.locations("web"), counts(&[("m1", 2)]));
    h.shutdown().await;

    let h = Harness::start(&web(3, 6), cluster());
    eventually("3 running", MINUTE, || h.fake.running("web") == 3).await;
    assert_eq!(
        h.fake.locations("web"),
        counts(&[("m1", 1), ("m2", 1), ("m3", 1)])
    );
    h.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_scale_down_keeps_the_group_spread_over_the_members() {
    // Three on m1 first, then three more by the scheduler: 3 / 2 / 1 (or 3 / 1 / 2).
    let h = Harness::start(&with_target(&web(3, 6), "m1"), cluster());
    eventually("3 running", MINUTE, || h.fake.running("web") == 3).await;
    h.reload(&web(6, 6));
    eventually("6 running", MINUTE, || h.fake.running("web") == 6).await;
    assert_eq!(h.fake.locations("web")["m1"], 3);
    // Down to 3: one left on each member.
    h.reload(&web(3, 3));
    eventually("3 running", MINUTE, || h.fake.running("web") == 3).await;
    assert_eq!(
        h.fake.locations("web"),
        counts(&[("m1", 1), ("m2", 1), ("m3", 1)])
    );
    h.shutdown().await;
}

/// A group on the cluster: the Kubernetes policy with no scale-down window (so that only a
/// missing reading holds a scale-down back), a 30 s health grace period.
fn group(min: u32, max: u32) -> String {
    format!(
        r#"
[daemon]
interval = "2s"

[groups.web]
min = {min}
max = {max}
memory_threshold = 50
image = "busybox"
policy = "kubernetes"
scale_down_stabilization = "0s"
unhealthy_grace = "30s"

[groups.web.config]
"limits.memory" = "100MiB"
"#
    )
}

/// How many of the group's instances are on members other than `member`.
fn elsewhere(fake: &FakeIncus, member: &str) -> usize {
    fake.locations("web")
        .iter()
        .filter(|(m, _)| *m != member)
        .map(|(_, n)| n)
        .sum()
}

#[tokio::test(start_paused = true)]
async fn no_scale_down_while_a_member_is_offline_within_the_grace_period() {
    let h = Harness::start(&group(3, 4), cluster());
    eventually("3 running", MINUTE, || h.fake.running("web") == 3).await;
    // Idle (10 % of a 50 % target): one instance would do. But m3 stops answering first.
    h.fake.set_offline("m3", true);
    h.reload(&group(1, 4));
    run_for(Duration::from_secs(20)).await;
    assert_eq!(
        h.fake.managed("web").len(),
        3,
        "{:?}",
        h.fake.locations("web")
    );
    assert_eq!(h.fake.calls("delete"), 0);
    // Past the grace period m3's instance is lost: the other two are measured, and the group
    // scales down to one of them; the lost one is left alone.
    eventually("down to 1 running elsewhere", MINUTE, || {
        elsewhere(&h.fake, "m3") == 1
    })
    .await;
    assert_eq!(h.fake.locations("web")["m3"], 1);
    // m3 back: two idle instances, one goes.
    h.fake.set_offline("m3", false);
    eventually("1 left", MINUTE, || h.fake.managed("web").len() == 1).await;
    h.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn an_instance_on_an_offline_member_is_replaced_after_the_grace_period_within_max() {
    let fake = cluster();
    // 45 % of a 50 % target: within the tolerance, three instances stay three.
    *fake.default_memory.lock().unwrap() = Some(mem(45.0));
    let h = Harness::start(&group(3, 3), fake);
    eventually("3 running", MINUTE, || h.fake.running("web") == 3).await;
    h.reload(&group(1, 3));
    h.fake.set_offline("m3", true);
    run_for(Duration::from_secs(20)).await;
    assert_eq!(
        h.fake.managed("web").len(),
        3,
        "nothing replaced within the grace period"
    );
    // After it: a replacement on m1 or m2, and still three that count (max 3).
    eventually("a replacement", MINUTE, || elsewhere(&h.fake, "m3") == 3).await;
    run_for(Duration::from_secs(10)).await;
    assert_eq!(elsewhere(&h.fake, "m3"), 3, "{:?}", h.fake.locations("web"));
    // m3 is back: four count, one above max; the surplus goes from a member with two.
    h.fake.set_offline("m3", false);
    eventually("back to 3", MINUTE, || h.fake.managed("web").len() == 3).await;
    assert_eq!(
        h.fake.locations("web"),
        counts(&[("m1", 1), ("m2", 1), ("m3", 1)])
    );
    h.shutdown().await;
}
