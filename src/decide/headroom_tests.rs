//! The host check: how many additions fit, where they go on a cluster, below min too, and
//! what a new instance is expected to use.

use super::headroom::{cap, expected_use};
use super::tests::{obs, settled, spec, unmeasured};
use super::*;
use crate::model::{ExpectedUse, Headroom, HostRoom, InstanceStatus};

const MIB: u64 = 1 << 20;

fn host(member: &str, available_mib: u64, reserve_mib: u64, placeable: bool) -> HostRoom {
    HostRoom {
        member: member.into(),
        available: available_mib * MIB,
        reserve: reserve_mib * MIB,
        placeable,
    }
}

fn single(available_mib: u64, reserve_mib: u64) -> Option<Headroom> {
    Some(Headroom {
        hosts: vec![host("", available_mib, reserve_mib, true)],
        clustered: false,
    })
}

fn creates(n: usize) -> Vec<Action> {
    vec![
        Action::Create {
            cause: Cause::ScaleUp,
            target: None
        };
        n
    ]
}

fn added(actions: &[Action]) -> usize {
    actions.iter().filter(|a| a.adds()).count()
}

#[test]
fn additions_allowed_by_available_reserve_and_expected_use() {
    // (available, reserve, each instance's use (MiB; instances at that many % of 100 MiB),
    // additions planned) → additions allowed.
    let cases: &[(u64, u64, f64, usize, usize)] = &[
        (1000, 100, 30.0, 5, 5),
        (1000, 100, 300.0, 5, 3),
        (1000, 100, 450.0, 5, 2),
        (1000, 100, 900.0, 5, 1),
        (1000, 100, 901.0, 5, 0),
        (100, 100, 1.0, 3, 0),
        (100, 0, 50.0, 3, 2),
        (50, 100, 10.0, 2, 0),
        (0, 0, 0.0, 2, 2),
    ];
    for &(available, reserve, use_mib, planned, allowed) in cases {
        let mut o = obs(&[use_mib, use_mib]);
        o.headroom = single(available, reserve);
        let (actions, check) = cap(&spec(1, 20, 50.0), &o, creates(planned), 2);
        let check = check.unwrap();
        let case = format!("{available} available, {reserve} reserve, {use_mib} each");
        assert_eq!(added(&actions), allowed, "{case}");
        assert_eq!(check.admitted as usize, allowed, "{case}");
        assert_eq!(check.held as usize, planned - allowed, "{case}");
        assert_eq!(check.basis, ExpectedUse::Measured(2), "{case}");
        // No cluster: no target is set.
        assert!(actions
            .iter()
            .all(|a| matches!(a, Action::Create { target: None, .. })));
    }
}

#[test]
fn an_unknown_use_counts_as_zero_but_the_reserve_still_holds() {
    let mut o = obs(&[]);
    o.headroom = single(100, 100);
    let (actions, check) = cap(&spec(0, 5, 50.0), &o, creates(2), 0);
    assert_eq!(added(&actions), 2);
    let check = check.unwrap();
    assert_eq!((check.per_instance, check.basis), (0, ExpectedUse::Unknown));
    assert!(check.to_string().contains("counted as 0"), "{check}");

    o.headroom = single(99, 100);
    let (actions, check) = cap(&spec(0, 5, 50.0), &o, creates(2), 0);
    assert_eq!((added(&actions), check.unwrap().held), (0, 2));
}

#[test]
fn without_a_reading_the_limit_is_the_expected_use() {
    let mut s = spec(1, 5, 50.0);
    s.config.insert("limits.memory".into(), "200MiB".into());
    // Running, but not measured; and a stopped one.
    let o = Observation {
        instances: vec![
            unmeasured(InstanceStatus::Running, 1),
            unmeasured(InstanceStatus::Stopped, 2),
        ],
        ..Default::default()
    };
    assert_eq!(expected_use(&s, &o), (200 * MIB, ExpectedUse::Limit));
    // A measured one wins over the limit: its working set, not its limit.
    assert_eq!(
        expected_use(&s, &obs(&[10.0, 30.0])),
        (20 * MIB, ExpectedUse::Measured(2))
    );
    // A percentage is no size: unknown.
    s.config.insert("limits.memory".into(), "50%".into());
    assert_eq!(expected_use(&s, &o), (0, ExpectedUse::Unknown));
    s.config.remove("limits.memory");
    assert_eq!(expected_use(&s, &o), (0, ExpectedUse::Unknown));

    s.config.insert("limits.memory".into(), "200MiB".into());
    let mut o = o;
    o.headroom = single(500, 100);
    let (actions, check) = cap(&s, &o, creates(3), 1);
    let check = check.unwrap();
    assert_eq!((added(&actions), check.held), (2, 1));
    assert!(check.to_string().contains("its limits.memory"), "{check}");
}

#[test]
fn below_min_too_and_the_plan_says_so() {
    let mut s = spec(3, 5, 50.0);
    s.config.insert("limits.memory".into(), "256MiB".into());
    let mut o = obs(&[]);
    o.headroom = single(600, 100);
    let (mut h, now) = settled(0);
    let plan = decide(&s, &o, &mut h, now);
    assert_eq!(plan.reason, Reason::HostHeadroom);
    assert_eq!(plan.desired, 3, "the count stays what min says");
    assert_eq!(
        plan.actions,
        vec![Action::Create {
            cause: Cause::BelowMin,
            target: None
        }]
    );
    let check = plan.headroom.unwrap();
    assert_eq!(
        (check.admitted, check.held, check.below_min),
        (1, 2, Some(3))
    );
    let text = check.to_string();
    assert!(
        text.contains("600 MiB available") && text.contains("868 MiB"),
        "{text}"
    );
    assert!(text.contains("stays below its min (3)"), "{text}");

    // With room for all three, all three go, for the reason they are made.
    let (mut h, now) = settled(0);
    o.headroom = single(10_000, 100);
    let plan = decide(&s, &o, &mut h, now);
    assert_eq!(added(&plan.actions), 3);
    assert_eq!(plan.reason, Reason::BelowMin);
    assert_eq!(plan.headroom.unwrap().held, 0);
}

#[test]
fn a_group_that_fits_is_decided_as_without_the_check() {
    let s = spec(1, 10, 50.0);
    let mut o = obs(&[90.0, 90.0]);
    let (mut h, now) = settled(2);
    let without = decide(&s, &o, &mut h, now);
    o.headroom = single(100_000, 1000);
    let (mut h, now) = settled(2);
    let with = decide(&s, &o, &mut h, now);
    assert_eq!(with.actions, without.actions);
    assert_eq!(with.reason, without.reason);
    assert!(without.headroom.is_none());
    assert_eq!(with.headroom.unwrap().held, 0);
}

/// Three instances on m1, one on m2, none on m3; each uses 50 MiB.
fn on_members() -> Observation {
    let mut o = obs(&[50.0, 50.0, 50.0, 50.0]);
    for (i, m) in o.instances.iter_mut().zip(["m1", "m1", "m1", "m2"]) {
        i.location = m.into();
    }
    o
}

fn targets(actions: &[Action]) -> Vec<Option<&str>> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Create { target, .. } | Action::CreateWarm { target } => {
                Some(target.as_deref())
            }
            _ => None,
        })
        .collect()
}

#[test]
fn on_a_cluster_each_new_instance_goes_to_a_member_with_room() {
    // (rooms of m1, m2, m3 in MiB above the reserve; m3 placeable?) → targets of 3 creations.
    type Case = (u64, u64, u64, bool, &'static [Option<&'static str>]);
    let cases: &[Case] = &[
        // Plenty everywhere: the fewest of the group's instances first (m3 has none, m2 one),
        // then the most room (m2 and m3 at one each: m2 has 50 MiB more).
        (
            1000,
            1000,
            1000,
            true,
            &[Some("m3"), Some("m2"), Some("m3")],
        ),
        // m3 is outside the group's target: m2 twice, then m1 and m2 at three each: m1 has
        // more room.
        (
            1000,
            1000,
            1000,
            false,
            &[Some("m2"), Some("m2"), Some("m1")],
        ),
        // m3 has room for one, m2 for none: the rest go to m1.
        (1000, 40, 60, true, &[Some("m3"), Some("m1"), Some("m1")]),
        // Room for two in all: the third is held.
        (50, 0, 50, true, &[Some("m3"), Some("m1")]),
        // No room anywhere: all held.
        (10, 10, 10, true, &[]),
    ];
    for &(m1, m2, m3, m3_placeable, want) in cases {
        let mut o = on_members();
        o.headroom = Some(Headroom {
            hosts: vec![
                host("m1", m1 + 100, 100, true),
                host("m2", m2 + 100, 100, true),
                host("m3", m3 + 100, 100, m3_placeable),
            ],
            clustered: true,
        });
        let (actions, check) = cap(&spec(1, 10, 50.0), &o, creates(3), 4);
        let case = format!("{m1}/{m2}/{m3} {m3_placeable}");
        assert_eq!(targets(&actions), want, "{case}");
        assert_eq!(check.unwrap().held as usize, 3 - want.len(), "{case}");
    }
}

#[test]
fn on_a_cluster_with_no_member_read_creations_go_unchecked() {
    let mut o = on_members();
    // Only m1 was read (an instance to start is there), and it is no place for new ones.
    o.headroom = Some(Headroom {
        hosts: vec![host("m1", 0, 100, false)],
        clustered: true,
    });
    let (actions, check) = cap(&spec(1, 10, 50.0), &o, creates(2), 4);
    assert_eq!(targets(&actions), [None, None]);
    assert_eq!(check.unwrap().held, 0);
}

#[test]
fn starts_and_promotions_are_checked_where_their_instance_is() {
    let mut o = on_members();
    let mut stopped = unmeasured(InstanceStatus::Stopped, 10);
    stopped.location = "m1".into();
    let mut warm = unmeasured(InstanceStatus::Stopped, 11);
    (warm.location, warm.warm) = ("m2".into(), true);
    let mut elsewhere = unmeasured(InstanceStatus::Stopped, 12);
    elsewhere.location = "m9".into();
    o.instances.extend([stopped, warm, elsewhere]);
    o.headroom = Some(Headroom {
        hosts: vec![host("m1", 120, 100, true), host("m2", 100, 100, true)],
        clustered: true,
    });
    let start = |n: i64| Action::Start {
        name: format!("web-{n}"),
        cause: Cause::Restart,
    };
    let promote = Action::Promote {
        name: "web-11".into(),
        cause: Cause::ScaleUp,
    };
    let remove = Action::Remove {
        name: "web-0".into(),
        cause: Cause::ScaleDown,
    };
    let plan = vec![start(10), promote, start(12), remove.clone()];
    let (actions, check) = cap(&spec(1, 10, 50.0), &o, plan, 4);
    // m1 has 20 MiB above its reserve: too little for 50. m2 none. m9 was not read: unchecked.
    // Removals always pass.
    assert_eq!(actions, vec![start(12), remove]);
    assert_eq!(check.unwrap().held, 2);
}

#[test]
fn nothing_is_capped_without_figures_or_additions() {
    let o = obs(&[90.0]);
    let (actions, check) = cap(&spec(1, 5, 50.0), &o, creates(2), 1);
    assert_eq!((added(&actions), check), (2, None));
    let mut o = o;
    o.headroom = single(0, 100);
    let remove = vec![Action::Remove {
        name: "web-0".into(),
        cause: Cause::ScaleDown,
    }];
    let (actions, check) = cap(&spec(0, 5, 50.0), &o, remove.clone(), 1);
    assert_eq!((actions, check), (remove, None));
}

#[test]
fn the_warm_pool_is_checked_too_and_does_not_count_as_service() {
    let mut s = spec(1, 5, 50.0);
    s.warm_pool = 2;
    let mut o = obs(&[50.0]);
    o.headroom = single(160, 100);
    let (mut h, now) = settled(1);
    let plan = decide(&s, &o, &mut h, now);
    assert_eq!(plan.actions, vec![Action::CreateWarm { target: None }]);
    assert_eq!(plan.reason, Reason::HostHeadroom);
    let check = plan.headroom.unwrap();
    assert_eq!((check.held, check.below_min), (1, None));
}
