//! The decision core over many passes: no panic, and its invariants hold.

use super::*;

// ---------------------------------------------------------------------------------------------
// 3. The decision core
// ---------------------------------------------------------------------------------------------

/// A valid `[groups.web]` (and `[daemon]`) from random in-range values, as TOML.
fn spec_toml() -> BoxedStrategy<String> {
    let window = || prop_oneof![Just(0u64), 1u64..=120, 0u64..=86_400];
    let step = || prop::option::of(1u32..=5);
    prop_oneof![3 => 1u32..=5, 1 => 1u32..=40]
        .prop_flat_map(move |max| {
            (
                Just(max),
                0..=max,
                prop_oneof![(1u32..=100).prop_map(f64::from), 1.0f64..=100.0],
                prop_oneof![Just(0.0f64), Just(0.1), 0.0f64..1.0],
                window(),
                window(),
                step(),
                step(),
                window(),
                100u64..=300_000,
                prop_oneof![
                    prop::sample::select(vec![100u64, 1_000, 5_000, 15_000, 60_000, 3_600_000]),
                    100u64..=3_600_000,
                ],
            )
        })
        .prop_map(
            |(max, min, threshold, tolerance, down, up, up_step, down_step, grace, backoff, interval)| {
                let mut t = format!(
                    "[daemon]\ninterval = \"{interval}ms\"\n\n[groups.web]\nmin = {min}\nmax = {max}\n\
                     memory_threshold = {threshold:?}\ntolerance = {tolerance:?}\nimage = \"busybox\"\n\
                     scale_down_stabilization = \"{down}s\"\nscale_up_stabilization = \"{up}s\"\n\
                     unhealthy_grace = \"{grace}s\"\nrestart_backoff = \"{backoff}ms\"\n"
                );
                if let Some(s) = up_step {
                    t.push_str(&format!("max_scale_up_step = {s}\n"));
                }
                if let Some(s) = down_step {
                    t.push_str(&format!("max_scale_down_step = {s}\n"));
                }
                // Some groups keep a warm pool (the interval's digits pick its size).
                t.push_str(&format!("warm_pool = {}\n", interval % 4));
                // And a scale-down order; one in thirteen is paused.
                let order = ["newest", "oldest", "least-memory"][(backoff % 3) as usize];
                t.push_str(&format!("scale_down_order = \"{order}\"\n"));
                if grace % 13 == 0 {
                    t.push_str("paused = true\n");
                }
                t.push_str("\n[groups.web.config]\n\"limits.memory\" = \"64MiB\"\n");
                t
            },
        )
        .boxed()
}

fn parse_spec(text: &str) -> GroupSpec {
    let loaded = config::parse(Path::new(FILE), text)
        .unwrap_or_else(|e| panic!("a generated spec is invalid: {:#?}\n{text}", e.diagnostics));
    loaded.state.groups.into_values().next().unwrap()
}

fn big_u64() -> BoxedStrategy<u64> {
    prop_oneof![
        Just(0u64),
        Just(1),
        Just(u64::MAX),
        any::<u64>(),
        0u64..=1 << 40
    ]
    .boxed()
}

fn memory() -> BoxedStrategy<Memory> {
    prop_oneof![
        // A realistic reading: 0–150 % of a 1 MiB–64 GiB limit.
        3 => (1u64 << 20..=1u64 << 36, 0u64..=150)
            .prop_map(|(limit, pct)| Memory { usage: limit / 100 * pct, limit, oom_kills: None, ..Default::default() }),
        // Anything, 0 and u64::MAX included.
        1 => (big_u64(), big_u64()).prop_map(|(usage, limit)| Memory { usage, limit, oom_kills: None, ..Default::default() }),
    ]
    .boxed()
}

fn status() -> BoxedStrategy<InstanceStatus> {
    use InstanceStatus::*;
    prop_oneof![
        4 => Just(Running),
        2 => Just(Ready),
        3 => Just(Stopped),
        1 => Just(Frozen),
        1 => Just(Error),
        1 => Just(Transition),
    ]
    .boxed()
}

/// An instance, without its name (given by its place, so names persist from pass to pass).
#[derive(Debug, Clone)]
struct Inst {
    status: InstanceStatus,
    created_at: i64,
    since_start: Option<Duration>,
    memory: Option<Memory>,
}

fn inst() -> BoxedStrategy<Inst> {
    (
        status(),
        prop_oneof![0i64..4, any::<i64>()],
        prop::option::of(prop_oneof![
            (0u64..120_000).prop_map(Duration::from_millis),
            (0u64..7_200).prop_map(Duration::from_secs),
            any::<u64>().prop_map(Duration::from_secs),
        ]),
        prop::option::weighted(0.8, memory()),
    )
        .prop_map(|(status, created_at, since_start, memory)| Inst {
            status,
            created_at,
            since_start,
            memory,
        })
        .boxed()
}

/// A healthy instance with a reading near `load` percent of its limit.
fn steady_inst(load: u64) -> BoxedStrategy<Inst> {
    (
        prop_oneof![3 => Just(InstanceStatus::Running), 1 => Just(InstanceStatus::Ready)],
        0i64..1_000,
        prop::option::of((0u64..100_000).prop_map(Duration::from_secs)),
        1u64 << 20..=1u64 << 36,
        0u64..=20,
    )
        .prop_map(
            move |(status, created_at, since_start, limit, noise)| Inst {
                status,
                created_at,
                since_start,
                memory: Some(Memory {
                    usage: limit / 100 * (load + noise).saturating_sub(10),
                    limit,
                    oom_kills: None,
                    ..Default::default()
                }),
            },
        )
        .boxed()
}

/// An observation: mostly a steady group (healthy, measured, around one load) with now and then
/// an instance in any state, or anything at all.
fn instances() -> BoxedStrategy<Vec<Inst>> {
    let count = || prop_oneof![3 => 0usize..=8, 1 => 0usize..=30];
    prop_oneof![
        3 => (0u64..=120, count()).prop_flat_map(|(load, n)| {
            prop::collection::vec(prop_oneof![8 => steady_inst(load), 1 => inst()], n)
        }),
        1 => count().prop_flat_map(|n| prop::collection::vec(inst(), n)),
    ]
    .boxed()
}

/// What the reconciler tells the history after acting: instance `i{n}` was created, or
/// started (successfully or not).
#[derive(Debug, Clone)]
enum Hook {
    Created(usize),
    Started(usize, bool),
}

/// One pass: which spec is in force, the observation (instances `i{offset}`, `i{offset+1}`…),
/// what the actor reports afterwards, and how much time passes until the next pass.
#[derive(Debug, Clone)]
struct Pass {
    spec: usize,
    offset: usize,
    instances: Vec<Inst>,
    hooks: Vec<Hook>,
    advance: Duration,
}

fn pass() -> BoxedStrategy<Pass> {
    let hook = prop_oneof![
        (0usize..35).prop_map(Hook::Created),
        (0usize..35, any::<bool>()).prop_map(|(n, ok)| Hook::Started(n, ok)),
    ];
    (
        any::<usize>(),
        0usize..3,
        instances(),
        prop::collection::vec(hook, 0..3),
        prop_oneof![
            Just(Duration::ZERO),
            (0u64..10_000).prop_map(Duration::from_millis),
            (0u64..600).prop_map(Duration::from_secs),
            (0u64..3_600_000).prop_map(Duration::from_millis),
        ],
    )
        .prop_map(|(spec, offset, instances, hooks, advance)| Pass {
            spec,
            offset,
            instances,
            hooks,
            advance,
        })
        .boxed()
}

fn observation(p: &Pass) -> Observation {
    Observation {
        instances: p
            .instances
            .iter()
            .enumerate()
            .map(|(n, i)| ObservedInstance {
                readiness: Default::default(),
                address: None,
                location: String::new(),
                name: format!("i{}", n + p.offset),
                status: i.status,
                created_at: i.created_at,
                since_start: i.since_start,
                memory: i.memory,
                // Every fifth instance carries the warm-pool key (it matters when stopped),
                // every seventh is protected.
                warm: (n + p.offset) % 5 == 4,
                protected: (n + p.offset) % 7 == 3,
            })
            .collect(),
        foreign: Vec::new(),
        ..Default::default()
    }
}

/// The plan's invariants, whatever the history.
fn check_plan(
    spec: &GroupSpec,
    obs: &Observation,
    plan: &Plan,
    previous: Option<u32>,
) -> Result<(), TestCaseError> {
    let max = spec.max as usize;
    prop_assert!(
        spec.min <= plan.desired && plan.desired <= spec.max,
        "desired {} outside [{}, {}]",
        plan.desired,
        spec.min,
        spec.max
    );
    // Promotions from the warm pool are creations too, as far as capacity goes.
    let creates = plan
        .actions
        .iter()
        .filter(|a| matches!(a, Action::Create { .. } | Action::Promote { .. }))
        .count();
    prop_assert!(creates <= max, "{creates} creations, max {max}");
    prop_assert!(
        !spec.paused || plan.actions.is_empty(),
        "a paused group acted"
    );
    let refills = plan
        .actions
        .iter()
        .filter(|a| matches!(a, Action::CreateWarm { .. }))
        .count();
    prop_assert!(
        refills <= spec.warm_pool as usize,
        "{refills} refills, pool {}",
        spec.warm_pool
    );

    let names: BTreeSet<&str> = obs.instances.iter().map(|i| i.name.as_str()).collect();
    let mut touched = BTreeSet::new();
    for a in &plan.actions {
        if let Action::Start { name, .. }
        | Action::Remove { name, .. }
        | Action::Promote { name, .. } = a
        {
            prop_assert!(
                names.contains(name.as_str()),
                "{a:?} names no observed instance"
            );
            prop_assert!(
                touched.insert(name.as_str()),
                "{name} acted on twice: {:?}",
                plan.actions
            );
        }
        if let Action::Remove { name, .. } = a {
            let i = obs.instances.iter().find(|i| &i.name == name).unwrap();
            prop_assert!(!i.protected, "a protected instance removed: {:?}", a);
        }
        if let Action::Start { name, .. } | Action::Promote { name, .. } = a {
            let i = obs.instances.iter().find(|i| &i.name == name).unwrap();
            prop_assert_eq!(i.status, InstanceStatus::Stopped, "{:?}", a);
            prop_assert_eq!(i.warm, matches!(a, Action::Promote { .. }), "{:?}", a);
        }
    }

    let healthy = obs
        .instances
        .iter()
        .filter(|i| i.status.is_healthy())
        .count();
    prop_assert_eq!(plan.healthy as usize, healthy);
    prop_assert!(plan.current >= plan.healthy);
    prop_assert_eq!(
        (plan.current + plan.unhealthy + plan.warm) as usize,
        obs.instances.len()
    );
    prop_assert_eq!(plan.previous, previous.unwrap_or(plan.current));
    // Creation never takes the serving instances above max (unhealthy ones may surge above it:
    // they are replaced before they are removed).
    prop_assert!(
        creates == 0 || healthy + creates <= max,
        "{healthy} healthy + {creates} created > max {max}"
    );

    // Never scale down on missing data: an instance that counts as capacity (`plan.current`:
    // healthy, stopped and restarting in place, or frozen/in transition for less than
    // UNHEALTHY_CONFIRM) without a usable reading (healthy with a reading whose limit is not
    // 0) forbids removals for scale-down.
    let measured = obs
        .instances
        .iter()
        .filter(|i| i.status.is_healthy() && i.memory.and_then(|m| m.percent()).is_some())
        .count();
    let scale_down: Vec<&Action> = plan
        .actions
        .iter()
        .filter(|a| a.cause() == Cause::ScaleDown)
        .collect();
    prop_assert!(
        scale_down
            .iter()
            .all(|a| matches!(a, Action::Remove { .. })),
        "{scale_down:?}"
    );
    if plan.current as usize > measured {
        prop_assert!(
            scale_down.is_empty(),
            "scale-down with {} of {} capacity measured: {plan:?}",
            measured,
            plan.current
        );
    }
    // The same, from the observation alone: a healthy instance without a reading, or a stopped
    // one restarted in place.
    let unmeasured_healthy = healthy - measured;
    let restarting = plan
        .actions
        .iter()
        .any(|a| matches!(a, Action::Start { .. }));
    if unmeasured_healthy > 0 || restarting {
        prop_assert!(scale_down.is_empty(), "{plan:?}");
    }
    Ok(())
}

fn run_passes(specs: &[GroupSpec], passes: &[Pass]) -> Result<(), TestCaseError> {
    let mut history = History::default();
    let mut now = Instant::now();
    for p in passes {
        let spec = &specs[p.spec % specs.len()];
        let obs = observation(p);
        let previous = history.desired();
        let plan = decide(spec, &obs, &mut history, now);
        check_plan(spec, &obs, &plan, previous)?;
        prop_assert_eq!(history.desired(), Some(plan.desired));
        for hook in &p.hooks {
            match *hook {
                Hook::Created(n) => history.created(&format!("i{n}")),
                Hook::Started(n, ok) => history.started(spec, &format!("i{n}"), ok, now),
            }
        }
        now += p.advance;
    }
    Ok(())
}

proptest! {
    #[test]
    fn decide_keeps_its_invariants_over_passes(
        spec in spec_toml(),
        passes in prop::collection::vec(pass(), 1..=20),
    ) {
        run_passes(&[parse_spec(&spec)], &passes)?;
    }

    /// The same across reloads: the history is kept when the group's spec changes.
    #[test]
    fn decide_keeps_its_invariants_across_reloads(
        specs in prop::collection::vec(spec_toml(), 2),
        passes in prop::collection::vec(pass(), 1..=20),
    ) {
        let specs: Vec<GroupSpec> = specs.iter().map(|s| parse_spec(s)).collect();
        run_passes(&specs, &passes)?;
    }
}
