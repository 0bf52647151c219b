//! The columns other than memory demand, and schedule windows on a trace's clock, on small
//! traces whose answers can be worked out by hand.

use std::path::Path;
use std::time::Duration;

use super::tests::{trace, MODEL};
use super::*;
use crate::decide::tests::spec;
use crate::model::{ExternalSpec, ScheduleSpec};

/// A group of `min` to `max` instances with no memory signal.
fn bare(min: u32, max: u32) -> GroupSpec {
    GroupSpec {
        memory_threshold: None,
        ..spec(min, max, 60.0)
    }
}

/// The count at each second.
fn counts(run: &Run) -> Vec<u32> {
    run.timeline.iter().map(|s| s.instances).collect()
}

#[test]
fn a_cpu_trace_grows_and_shrinks_a_cpu_only_group() {
    // 250 % of one instance's CPU from t = 60 to 400, against a 50 % threshold: 5 instances.
    // One instance saturates at 100 %, so the rule climbs (2, 4, 5) as the counters show more.
    let group = GroupSpec {
        cpu_threshold: Some(50.0),
        cpu_limit: Some(2.0),
        ..bare(1, 10)
    };
    let t = trace("t,cpu_percent\n0,40\n60,250\n400,40\n1000,40\n");
    let run = simulate(&group, &t, &MODEL, SimPolicy::Default);
    let c = counts(&run);
    assert_eq!((c[59], run.timeline[59].ideal), (1, 1));
    assert_eq!(run.timeline[60].ideal, 5);
    // The pass at t = 60 reads the counters of t = 45 to 60 (40 %); the one at 75 sees 100 %.
    assert!(c[60..75].iter().all(|n| *n == 1), "{:?}", &c[60..75]);
    assert!(c[75..90].iter().all(|n| *n == 2), "{:?}", &c[75..90]);
    assert_eq!((c[200], c[399]), (5, 5));
    // Back to 40 %: one instance is enough, after the 300 s scale-down stabilization.
    assert_eq!(run.timeline[400].ideal, 1);
    assert_eq!((c[600], c[999]), (5, 1));
    let s = &run.scores;
    assert_eq!((s.peak, s.flips, s.oom_s), (5, 1, 0), "{s:?}");
    // Overloaded (above 1.1 × 50 % a ready instance) while the group catches up, not after.
    assert!(s.overload_s > 0 && s.overload_s < 100, "{s:?}");
    assert!(run.timeline[200..].iter().all(|s| s.utilization < 10.0));
}

#[test]
fn an_idle_cpu_counter_never_grows_the_group() {
    let group = GroupSpec {
        cpu_threshold: Some(50.0),
        ..bare(2, 10)
    };
    let run = simulate(
        &group,
        &trace("t,cpu_percent\n0,0\n300,0\n"),
        &MODEL,
        SimPolicy::Default,
    );
    assert!(counts(&run).iter().all(|n| *n == 2));
    assert_eq!(run.scores.overload_s, 0);
}

#[test]
fn an_external_trace_sets_the_count_to_the_value_over_the_target() {
    let group = GroupSpec {
        external: vec![ExternalSpec {
            command: vec!["/usr/bin/queue-length".into()],
            target: 10.0,
            timeout: Duration::from_secs(5),
        }],
        ..bare(1, 10)
    };
    // 35 → ceil(35 / 10) = 4 at once; 72 → 8 from t = 100; the ideal follows the value.
    let t = trace("t,external\n0,35\n100,72\n200,72\n");
    let run = simulate(&group, &t, &MODEL, SimPolicy::Default);
    let c = counts(&run);
    assert_eq!((c[0], c[99], c[105], c[199]), (4, 4, 8, 8));
    assert_eq!((run.timeline[0].ideal, run.timeline[100].ideal), (4, 8));
    assert_eq!(run.scores.waste_instance_s, 0);
    // The kubernetes baseline reads the same signal.
    let k = simulate(&group, &t, &MODEL, SimPolicy::Kubernetes);
    assert_eq!(counts(&k)[199], 8);
}

#[test]
fn a_pressure_trace_above_the_threshold_grows_the_group() {
    let group = GroupSpec {
        pressure_threshold: Some(10.0),
        ..bare(1, 6)
    };
    // 30 % against 10: three times as many at the first pass; pressure does not fall as
    // instances are added, so the group keeps growing, to its max.
    let run = simulate(
        &group,
        &trace("t,pressure\n0,30\n120,30\n"),
        &MODEL,
        SimPolicy::Default,
    );
    let c = counts(&run);
    assert_eq!((c[0], c[15], c[119]), (3, 6, 6));
    // Below half the threshold, pressure asks for nothing: the group stays at its min.
    let run = simulate(
        &group,
        &trace("t,pressure\n0,4\n120,4\n"),
        &MODEL,
        SimPolicy::Default,
    );
    assert!(counts(&run).iter().all(|n| *n == 1));
}

/// A window every day from 00:10 for 10 minutes (UTC: it has no zone), min 4.
fn nightly() -> GroupSpec {
    GroupSpec {
        schedule: vec![ScheduleSpec {
            cron: "10 0 * * *".into(),
            duration: Duration::from_secs(600),
            min: Some(4),
            max: None,
            timezone: None,
        }],
        ..spec(1, 10, 60.0)
    }
}

#[test]
fn a_schedule_window_opens_and_closes_on_the_trace_clock() {
    // t = 0 is 7 s after midnight: the window opens at t = 593 and closes at t = 1193, between
    // two passes (every 15 s): the pass that the change makes due acts on the second.
    let clock = Clock::new(&nightly().schedule, start() + Duration::from_secs(7)).unwrap();
    assert_eq!(clock.at(0), (None, Some(593)));
    let open = Some(Window {
        min: Some(4),
        max: None,
    });
    assert_eq!(clock.at(593), (open, Some(1193)));
    let t = trace("t,demand_mib\n0,20\n2400,20\n");
    for policy in [SimPolicy::Default, SimPolicy::Kubernetes, SimPolicy::Step] {
        let run = simulate_with(&nightly(), &t, &MODEL, policy, &clock);
        let c = counts(&run);
        assert_eq!((c[592], c[593], c[1192]), (1, 4, 4), "{policy:?}");
        // The ideal count is held to the min in force.
        assert_eq!(
            (
                run.timeline[592].ideal,
                run.timeline[600].ideal,
                run.timeline[1193].ideal
            ),
            (1, 4, 1)
        );
        // Closed, the group's own rule takes it back down (after its stabilization).
        assert_eq!(c[2399], 1, "{policy:?}");
    }
    // On the default clock (t = 0 at midnight) the window opens at t = 600.
    let run = simulate(&nightly(), &t, &MODEL, SimPolicy::Default);
    let c = counts(&run);
    assert_eq!((c[599], c[600]), (1, 4));
}

#[test]
fn a_window_in_its_own_zone_opens_on_its_wall_clock() {
    // 00:10 in Paris is 23:10 UTC the day before in January: t = 0 is 23:00 UTC.
    let mut group = nightly();
    group.schedule[0].timezone = Some("Europe/Paris".into());
    let clock = Clock::new(&group.schedule, start() - Duration::from_secs(3600)).unwrap();
    assert_eq!(clock.at(0).1, Some(600));
    assert_eq!(parse_start(START), Ok(start()));
    assert_eq!(
        parse_start("2026-01-04T23:00:00Z"),
        parse_start("2026-01-05T00:00:00+01:00")
    );
    assert!(parse_start("monday").is_err());
}

#[test]
fn a_trace_fits_a_group_when_each_column_is_one_of_its_signals() {
    let file = Path::new("load.csv");
    let cpu = GroupSpec {
        cpu_threshold: Some(50.0),
        pressure_threshold: Some(10.0),
        ..bare(1, 10)
    };
    // A group's signal without a column reads idle, and a note says so.
    let notes = fit::check(&cpu, &trace("t,cpu_percent\n0,1\n9,1\n"), file).unwrap();
    assert_eq!(
        notes,
        ["load.csv:1: note: no `pressure` column: the group's pressure reads 0"]
    );
    // A column for a signal the group does not have is refused, named with the header's line.
    let e = fit::check(
        &cpu,
        &trace("# memory too\nt,demand_mib,cpu_percent\n0,1,1\n9,1,1\n"),
        file,
    )
    .unwrap_err();
    assert_eq!(
        e,
        "load.csv:2: column `demand_mib`: group \"web\" has no memory_threshold, so nothing \
         would read it"
    );
    // And a trace with none of the group's columns says which it would need.
    let e = fit::check(&cpu, &trace("t,external\n0,1\n9,1\n"), file).unwrap_err();
    assert!(
        e.ends_with(
            "load.csv:1: group \"web\" scales on `cpu_percent`, `pressure`, and the trace has \
             no such column"
        ),
        "{e}"
    );
    // The step rule reads memory only.
    let memory = trace("t,demand_mib\n0,1\n9,1\n");
    assert!(fit::step_fits(&memory));
    assert!(!fit::step_fits(&trace(
        "t,demand_mib,cpu_percent\n0,1,1\n9,1,1\n"
    )));
    assert_eq!(fit::check(&spec(1, 2, 60.0), &memory, file), Ok(vec![]));
}
