//! Several signals: whatever each instance's readings and the external value, a pass in which
//! any signal lacks a reading never lowers the count (no stabilization window to hide it), and
//! the count always stays within min and max.

use super::*;

const MIB: u64 = 1 << 20;

/// A group on every signal, with no scale-down window: nothing but the rules holds a count.
fn group(min: u32, max: u32) -> GroupSpec {
    let text = format!(
        "[groups.web]\nmin = {min}\nmax = {max}\nmemory_threshold = 50\ncpu_threshold = 50\n\
         pressure_threshold = 20\nimage = \"b\"\nscale_down_stabilization = \"0s\"\n\n\
         [[groups.web.external]]\ncommand = [\"/bin/q\"]\ntarget = 10\n\n\
         [groups.web.config]\n\"limits.memory\" = \"100MiB\"\n\"limits.cpu\" = \"1\"\n"
    );
    let loaded = config::parse(Path::new(FILE), &text).unwrap();
    loaded.state.groups.into_values().next().unwrap()
}

/// One instance's readings in a pass: memory percent, CPU used since the pass before (percent
/// of its CPU), pressure; each may be missing.
type Readings = (Option<u8>, Option<u8>, Option<u8>);

fn readings() -> impl Strategy<Value = Readings> {
    (
        prop::option::weighted(0.8, 0u8..=100),
        prop::option::weighted(0.8, 0u8..=100),
        prop::option::weighted(0.8, 0u8..=60),
    )
}

fn observe(
    n: usize,
    pass: &[Readings],
    counters: &mut [u64],
    external: Option<f64>,
    interval: Duration,
) -> Observation {
    Observation {
        instances: (0..n)
            .map(|k| {
                let (mem, cpu, pressure) = pass[k % pass.len()];
                if let Some(c) = cpu {
                    counters[k] += u64::from(c) * interval.as_nanos() as u64 / 100;
                }
                ObservedInstance {
                    readiness: Default::default(),
                    address: None,
                    name: format!("web-{k}"),
                    status: InstanceStatus::Running,
                    created_at: k as i64,
                    since_start: Some(Duration::from_secs(3600)),
                    memory: mem.map(|m| Memory {
                        usage: u64::from(m) * MIB,
                        limit: 100 * MIB,
                        cpu_ns: cpu.map(|_| counters[k]),
                        pressure: pressure.map(f64::from),
                        ..Default::default()
                    }),
                    location: String::new(),
                    warm: false,
                    protected: false,
                }
            })
            .collect(),
        external: vec![external],
        ..Default::default()
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn a_missing_reading_of_any_signal_never_lowers_the_count(
        min in 0u32..=3,
        max in 3u32..=12,
        n in 1usize..=8,
        passes in prop::collection::vec(
            (prop::collection::vec(readings(), 1..=4), prop::option::weighted(0.8, 0.0f64..=200.0)),
            2..=6,
        ),
    ) {
        let spec = group(min, max);
        let mut history = History::default();
        let mut counters = vec![0u64; n];
        let t0 = Instant::now();
        let mut count = n as u32;
        let mut previous: Option<u32> = None;
        for (i, (pass, external)) in passes.iter().enumerate() {
            let obs = observe(count as usize, pass, &mut counters, *external, spec.interval);
            let now = t0 + spec.interval * i as u32;
            let plan = decide(&spec, &obs, &mut history, now);
            prop_assert!(min <= plan.desired && plan.desired <= max, "{plan:?}");
            let missing = external.is_none()
                || obs.instances.iter().any(|i| {
                    i.memory.is_none_or(|m| m.cpu_ns.is_none() || m.pressure.is_none())
                })
                || i == 0; // no CPU rate before a second reading
            if let Some(before) = previous {
                if missing && before <= max && before >= min {
                    prop_assert!(
                        plan.desired >= before,
                        "lowered from {} to {} with a reading missing: {:?}",
                        before, plan.desired, plan
                    );
                }
            }
            previous = Some(plan.desired);
            count = plan.desired.max(1);
            counters.resize(count as usize, 0);
        }
    }
}
