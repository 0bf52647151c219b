//! The host check: whatever the hosts, the group and its instances, no host is given more
//! additions than fit above its reserve, and nothing is added that the plan without the check
//! would not have added.

use super::*;
use incus_hpa::model::{Headroom, HostRoom, Reason};

const MIB: u64 = 1 << 20;
const MEMBERS: [&str; 3] = ["m1", "m2", "m3"];

fn group() -> BoxedStrategy<GroupSpec> {
    (
        0u32..=4,
        1u32..=8,
        0u32..=3,
        prop::sample::select(vec![
            "",
            "\"limits.memory\" = \"64MiB\"",
            "\"limits.memory\" = \"1GiB\"",
        ]),
    )
        .prop_map(|(min, max, warm, limit)| {
            let max = max.max(min);
            let text = format!(
                "[groups.web]\nmin = {min}\nmax = {max}\nmemory_threshold = 50\nimage = \"b\"\n\
                 warm_pool = {warm}\n\n[groups.web.config]\n{limit}\n"
            );
            let loaded = config::parse(Path::new(FILE), &text).unwrap();
            loaded.state.groups.into_values().next().unwrap()
        })
        .boxed()
}

fn instance(clustered: bool) -> BoxedStrategy<(InstanceStatus, Option<u64>, usize, bool)> {
    (
        prop_oneof![
            3 => Just(InstanceStatus::Running),
            2 => Just(InstanceStatus::Stopped),
            1 => Just(InstanceStatus::Error),
        ],
        prop::option::weighted(0.7, 0u64..=2048),
        0usize..if clustered { 3 } else { 1 },
        any::<bool>(),
    )
        .boxed()
}

fn host(member: &'static str) -> BoxedStrategy<Option<HostRoom>> {
    prop::option::weighted(
        0.85,
        (0u64..=4096, 0u64..=1024, any::<bool>()).prop_map(move |(a, r, placeable)| HostRoom {
            member: member.into(),
            available: a * MIB,
            reserve: r * MIB,
            placeable,
        }),
    )
    .boxed()
}

/// A group, what was observed of it (the hosts' figures included), whether it is a cluster.
fn case() -> BoxedStrategy<(GroupSpec, Observation)> {
    any::<bool>()
        .prop_flat_map(|clustered| {
            let hosts = if clustered {
                (host("m1"), host("m2"), host("m3"))
                    .prop_map(|(a, b, c)| [a, b, c].into_iter().flatten().collect::<Vec<_>>())
                    .boxed()
            } else {
                (0u64..=4096, 0u64..=1024)
                    .prop_map(|(a, r)| {
                        vec![HostRoom {
                            member: String::new(),
                            available: a * MIB,
                            reserve: r * MIB,
                            placeable: true,
                        }]
                    })
                    .boxed()
            };
            (
                group(),
                prop::collection::vec(instance(clustered), 0..=8),
                hosts,
                Just(clustered),
            )
        })
        .prop_map(|(spec, instances, hosts, clustered)| {
            let instances = instances
                .into_iter()
                .enumerate()
                .map(|(n, (status, usage, at, warm))| ObservedInstance {
                    readiness: Default::default(),
                    address: None,
                    name: format!("web-{n}"),
                    status,
                    created_at: n as i64,
                    since_start: Some(Duration::from_secs(3600)),
                    memory: usage.filter(|_| status.is_healthy()).map(|u| Memory {
                        usage: u * MIB,
                        limit: 1024 * MIB,
                        ..Default::default()
                    }),
                    location: if clustered {
                        MEMBERS[at].into()
                    } else {
                        String::new()
                    },
                    warm: warm && status == InstanceStatus::Stopped,
                    protected: false,
                })
                .collect();
            let obs = Observation {
                instances,
                headroom: Some(Headroom { hosts, clustered }),
                ..Default::default()
            };
            (spec, obs)
        })
        .boxed()
}

/// The host an addition lands on (`None`: unchecked, on a host that was not read).
fn lands_on<'a>(a: &'a Action, obs: &'a Observation, clustered: bool) -> Option<&'a str> {
    match a {
        Action::Start { name, .. } | Action::Promote { name, .. } => obs
            .instances
            .iter()
            .find(|i| &i.name == name)
            .map(|i| i.location.as_str()),
        Action::Create { target, .. } | Action::CreateWarm { target } if clustered => {
            target.as_deref()
        }
        Action::Create { .. } | Action::CreateWarm { .. } => Some(""),
        Action::Remove { .. } => None,
    }
}

proptest! {
    #[test]
    fn never_more_additions_than_fit((spec, obs) in case()) {
        let now = Instant::now();
        let plan = decide(&spec, &obs, &mut History::default(), now);
        let unchecked = Observation { headroom: None, ..obs.clone() };
        let free = decide(&spec, &unchecked, &mut History::default(), now);
        let adds = |p: &Plan| p.actions.iter().filter(|a| a.adds()).count();
        let Some(check) = &plan.headroom else {
            prop_assert_eq!(adds(&free), 0);
            prop_assert_eq!(&plan.actions, &free.actions);
            return Ok(());
        };
        // Only what the plan without the check adds, less what was held.
        prop_assert_eq!(adds(&plan) + check.held as usize, adds(&free));
        prop_assert_eq!(check.admitted as usize, adds(&plan));
        prop_assert_eq!(check.held > 0, plan.reason == Reason::HostHeadroom, "{:?}", plan.reason);
        let removals = |p: &Plan| p.actions.iter().filter(|a| !a.adds()).cloned().collect::<Vec<_>>();
        prop_assert_eq!(removals(&plan), removals(&free));

        let headroom = obs.headroom.as_ref().unwrap();
        let mut on: BTreeMap<&str, u64> = BTreeMap::new();
        for a in plan.actions.iter().filter(|a| a.adds()) {
            let Some(m) = lands_on(a, &obs, headroom.clustered) else {
                // A creation on a cluster goes untargeted only when no member it may use was read.
                prop_assert!(!headroom.hosts.iter().any(|h| h.placeable), "{a:?} untargeted");
                continue;
            };
            if let Action::Create { .. } | Action::CreateWarm { .. } = a {
                prop_assert!(
                    headroom.hosts.iter().any(|h| h.member == m && h.placeable),
                    "{a:?} placed on {m}, not a member it may use"
                );
            }
            *on.entry(m).or_default() += 1;
        }
        for h in &headroom.hosts {
            let n = on.get(h.member.as_str()).copied().unwrap_or(0);
            let need = i128::from(n) * i128::from(check.per_instance);
            prop_assert!(
                n == 0 || need <= i128::from(h.available) - i128::from(h.reserve),
                "{n} × {} on {h:?}", check.per_instance
            );
        }
    }
}
