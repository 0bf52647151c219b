//! `incus-hpa simulate`: replays a trace through the daemon's own decision code
//! ([`crate::decide::decide`], on a simulated clock) under a simple load model, and scores it.
//!
//! The load model: every instance has the group's memory limit L and a base use B that does not
//! move with load. Memory demand D(t) (`demand_mib`) is spread evenly over the ready instances,
//! each using `B + D / ready` (observed capped at L); an instance is ready `warmup` after its
//! creation and observed idle until then (memory B, no CPU, no pressure). The run starts with
//! `min` ready instances. Decisions happen at t = 0, every `interval`, when a schedule window
//! opens or closes, and, for the `adaptive` policy, in the second an instance reaches its
//! limit, the group goes above its tolerance, or an instance the last pass created reaches its
//! limit too (as the daemon wakes then: [`crate::decide::adaptive::wakes`]); creations and
//! removals happen at once.
//! The other columns of a trace (see [`Trace`]):
//! - `cpu_percent` C(t): the group's CPU demand, in percent of one instance's CPU limit, spread
//!   like memory: each ready instance runs at `min(100, C / ready)` %, and its CPU counter
//!   (`cpu_ns`) grows by that share of the group's `cpu_limit` (1 CPU if unset) every second;
//!   the daemon's rule turns the counters into rates between passes.
//! - `pressure` P(t): the PSI value every ready instance shows; it does not fall as instances
//!   are added (that is the point of the pressure rule).
//! - `external` X(t): the value the group's programs print, the same for each of them.
//!
//! A signal of the group without a column reads idle; a column for a signal the group does not
//! have is refused ([`fit`]). Schedule windows are evaluated on the trace's clock ([`Clock`]).
//!
//! Scores, per second: `overload_s` (no instance ready; or the mean memory utilization of the
//! ready instances above 1.1 × the memory threshold; or the CPU demand per ready instance,
//! `C / ready`, above 1.1 × the CPU threshold or above 100 %), `oom_s` (memory at or above
//! 100 %), `waste_instance_s` (instances above the ideal count: the highest of each signal's,
//! `ceil(D / (threshold × L − B))` for memory, `ceil(C / cpu_threshold)` for CPU and
//! `ceil(X / target)` for each external program, none for pressure; clamped to the `min` and
//! `max` in force), `churn` (instances created plus removed), `flips` (changes of direction
//! between successive scalings), `peak`. Pressure has no score of its own.

pub mod advise;
pub mod advise_cmd;
mod clock;
pub mod command;
pub mod families;
pub mod fit;
pub mod generate;
pub mod hindsight;
mod plot;
pub mod recorded;
mod trace;

use std::time::Duration;

use serde::Serialize;
use tokio::time::Instant;

use crate::decide::adaptive::{at_limit, strain, wakes, Strain};
use crate::decide::{decide, History};
use crate::model::{
    Action, GroupSpec, InstanceStatus, Memory, Observation, ObservedInstance, Policy, Window,
};
pub use clock::{parse_start, start, Clock, START};
pub use plot::{svg, Plot};
pub use trace::{Column, Reading, Trace, TraceError, MAX_TRACE_ROWS, MAX_TRACE_SECONDS};

const MIB: f64 = 1024.0 * 1024.0;

/// The load model's parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LoadModel {
    /// Each instance's memory limit, MiB.
    pub limit_mib: f64,
    /// Each instance's base use, MiB.
    pub base_mib: f64,
    /// From creation to ready.
    pub warmup: Duration,
}

/// Which decision rule a run replays.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SimPolicy {
    /// The group as configured (its `policy`, windows, tolerance and interval).
    Default,
    /// The Kubernetes HPA with its defaults: 15 s period, tolerance 0.1, 300 s scale-down
    /// stabilization, scale-up at most max(+4, +100 %) per 15 s; on the group's own signals
    /// (the highest count any of them wants), and its schedule windows.
    Kubernetes,
    /// The Go lab's rule: every 10 s, +1 when the mean memory use is at or above the threshold,
    /// −1 when it is below half of it (within the bounds of the open schedule windows). Memory
    /// only: it replays `t,demand_mib` traces only.
    Step,
}

impl SimPolicy {
    pub fn name(&self) -> &'static str {
        match self {
            SimPolicy::Default => "default",
            SimPolicy::Kubernetes => "kubernetes",
            SimPolicy::Step => "step",
        }
    }
}

/// A run's scores (`--format json` prints these names).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Scores {
    pub policy: String,
    pub overload_s: u64,
    pub oom_s: u64,
    pub waste_instance_s: u64,
    pub churn: u64,
    pub flips: u64,
    pub peak: u32,
    /// `10 × oom_s + overload_s + waste_instance_s / 60 + 2 × churn`.
    pub cost: f64,
}

/// One second of a run, for plots.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Second {
    pub t: u64,
    pub demand_mib: f64,
    pub instances: u32,
    pub ideal: u32,
    /// Mean utilization of the ready instances, percent (100 with none ready).
    pub utilization: f64,
}

/// A run: its scores and its timeline.
#[derive(Debug, Clone)]
pub struct Run {
    pub scores: Scores,
    pub timeline: Vec<Second>,
}

/// One simulated instance: the `seq`-th created, at second `created`, ready from `ready_at`,
/// with the CPU time it has used, ns.
#[derive(Debug, Clone)]
struct SimInstance {
    seq: u64,
    created: u64,
    ready_at: u64,
    cpu_ns: u64,
}

impl SimInstance {
    fn new(seq: u64, t: u64, warmup: u64) -> SimInstance {
        SimInstance {
            seq,
            created: t,
            ready_at: t + warmup,
            cpu_ns: 0,
        }
    }

    fn name(&self) -> String {
        format!("sim-{}", self.seq)
    }
}

/// The spec a policy decides with: the group's own, or Kubernetes' defaults on its bounds.
pub fn spec_for(spec: &GroupSpec, policy: SimPolicy) -> GroupSpec {
    match policy {
        SimPolicy::Default => spec.clone(),
        SimPolicy::Kubernetes | SimPolicy::Step => GroupSpec {
            policy: Policy::Kubernetes,
            interval: Duration::from_secs(if policy == SimPolicy::Step { 10 } else { 15 }),
            tolerance_up: 0.1,
            tolerance_down: 0.1,
            scale_down_stabilization: Duration::from_secs(300),
            scale_up_stabilization: Duration::ZERO,
            max_scale_up_step: None,
            max_scale_down_step: None,
            warm_pool: 0,
            paused: false,
            ..spec.clone()
        },
    }
}

/// Replays `trace` for the group `spec` under `model` with `policy`, from [`clock::start`].
/// The config refuses a schedule whose windows do not compile: such a spec replays without
/// them here ([`simulate_with`] and [`Clock::new`] say what is wrong).
pub fn simulate(spec: &GroupSpec, trace: &Trace, model: &LoadModel, policy: SimPolicy) -> Run {
    let clock = Clock::new(&spec.schedule, clock::start())
        .unwrap_or_else(|_| Clock::without_windows(clock::start()));
    simulate_with(spec, trace, model, policy, &clock)
}

/// The bounds in force: the group's, or those an open window sets (as the daemon's decision
/// applies them: a window's `min` above the group's `max` raises the `max` with it).
fn bounds(spec: &GroupSpec, window: Option<Window>) -> (u32, u32) {
    let Some(w) = window else {
        return (spec.min, spec.max);
    };
    let min = w.min.unwrap_or(spec.min);
    let max = w.max.unwrap_or(spec.max).max(min);
    (min.min(max), max)
}

/// [`simulate`] with the schedule windows of `clock`.
pub fn simulate_with(
    spec: &GroupSpec,
    trace: &Trace,
    model: &LoadModel,
    policy: SimPolicy,
    clock: &Clock,
) -> Run {
    simulate_between(spec, trace, model, policy, clock, &mut |_, _, _| {})
}

/// What [`simulate_between`] calls before each pass that decides: the second, the group's
/// history, and the clock's time then (a test restarts the daemon there).
pub type BetweenPasses<'a> = dyn FnMut(u64, &mut History, Instant) + 'a;

/// [`simulate_with`], calling `between` before each pass of the decision code.
pub fn simulate_between(
    spec: &GroupSpec,
    trace: &Trace,
    model: &LoadModel,
    policy: SimPolicy,
    clock: &Clock,
    between: &mut BetweenPasses<'_>,
) -> Run {
    let mut timeline = Vec::with_capacity(trace.seconds() as usize);
    let scores = simulate_each(spec, trace, model, policy, clock, between, &mut |s| {
        timeline.push(s);
    });
    Run { scores, timeline }
}

/// [`simulate_between`], handing each second to `each` rather than keeping them (a week is
/// 604,800 seconds: 19 MB of timeline).
pub fn simulate_each(
    spec: &GroupSpec,
    trace: &Trace,
    model: &LoadModel,
    policy: SimPolicy,
    clock: &Clock,
    between: &mut BetweenPasses<'_>,
    each: &mut dyn FnMut(Second),
) -> Scores {
    let spec = GroupSpec {
        warm_pool: 0,
        paused: false,
        cpu_limit: Some(spec.cpu_limit.unwrap_or(1.0)),
        ..spec_for(spec, policy)
    };
    let (limit, base) = (model.limit_mib, model.base_mib.min(model.limit_mib));
    let warmup = model.warmup.as_secs_f64().ceil() as u64;
    let every = spec.interval.as_secs_f64().ceil().max(1.0) as u64;
    // A group without a memory threshold has no memory demand; 100 % keeps this total.
    let threshold = spec.memory_threshold.unwrap_or(100.0);
    let per_instance = (threshold / 100.0 * limit - base).max(f64::MIN_POSITIVE);
    // CPU time a second at 100 % of the group's CPU limit, ns.
    let cpu_second = spec.cpu_limit.unwrap_or(1.0) * 1e9;

    let t0 = Instant::now();
    let mut history = History::default();
    let mut created = 0u64;
    let mut instances: Vec<SimInstance> = (0..spec.min)
        .map(|_| {
            created += 1;
            SimInstance {
                seq: created,
                created: 0,
                ready_at: 0,
                cpu_ns: 0,
            }
        })
        .collect();
    let (mut churn, mut flips, mut last_direction) = (0u64, 0u64, 0i64);
    let (mut overload, mut oom, mut waste, mut peak) = (0u64, 0u64, 0u64, 0u32);
    let (mut window, mut wake) = (None, Some(0));
    let (mut min, mut max) = (spec.min, spec.max);
    let (mut last_pass, mut last_pass_strain) = (0u64, None);
    // The instances the last pass measured: those created up to then.
    let mut measured = created;

    for t in 0..trace.seconds() {
        let now = trace.at(t as f64);
        let demand = now.demand_mib.unwrap_or(0.0);
        let cpu = now.cpu_percent.unwrap_or(0.0);
        let mut changed = false;
        if wake.is_some_and(|w| t >= w) {
            let (open, next) = clock.at(t);
            changed = open != window;
            (window, wake) = (open, next);
            (min, max) = bounds(&spec, window);
        }
        let ready = instances.iter().filter(|i| i.ready_at <= t).count();
        let use_mib = |i: &SimInstance| {
            if i.ready_at <= t && ready > 0 {
                (base + demand / ready as f64).min(limit)
            } else {
                base
            }
        };
        // The daemon's watch between passes: readings that reached the limit, or took the
        // group above its tolerance, since the last pass, or an instance created by the last
        // pass at its limit, wake the `adaptive` policy's pass at once (see `adaptive::wakes`).
        // The baselines have no watch.
        let memory = |i: &SimInstance| Memory {
            usage: (use_mib(i) * MIB) as u64,
            limit: (limit * MIB) as u64,
            ..Default::default()
        };
        // What a pass now would read (it measures them all: their memory, with their CPU and
        // pressure), and what the watch reads.
        let strain_pass =
            (policy == SimPolicy::Default).then(|| strain(&spec, instances.iter().map(memory)));
        let strain_now = strain_pass.map(|s| {
            let new_at_limit = instances
                .iter()
                .any(|i| i.seq > measured && at_limit(&memory(i)));
            if new_at_limit {
                Strain::NewAtLimit
            } else {
                s
            }
        });
        let since_pass = Duration::from_secs(t.saturating_sub(last_pass));
        let woken = last_pass_strain
            .zip(strain_now)
            .is_some_and(|(at, now)| wakes(&spec, at, now, since_pass));
        if t % every == 0 || changed || woken {
            (last_pass, last_pass_strain, measured) = (t, strain_pass, created);
            let before = instances.len() as i64;
            match policy {
                SimPolicy::Step => {
                    let mean = instances
                        .iter()
                        .map(|i| use_mib(i) / limit * 100.0)
                        .sum::<f64>()
                        / instances.len().max(1) as f64;
                    let n = instances.len() as u32;
                    // A window that opens or closes between two steps only moves the bounds.
                    let target = if t % every != 0 {
                        n
                    } else if instances.is_empty() || mean >= threshold {
                        n + 1
                    } else if mean < threshold / 2.0 {
                        n.saturating_sub(1)
                    } else {
                        n
                    };
                    let target = target.clamp(min, max);
                    while (instances.len() as u32) < target {
                        created += 1;
                        instances.push(SimInstance::new(created, t, warmup));
                    }
                    instances.truncate(target as usize);
                }
                _ => {
                    let obs = Observation {
                        instances: instances
                            .iter()
                            .map(|i| {
                                let ready = i.ready_at <= t;
                                ObservedInstance {
                                    readiness: Default::default(),
                                    address: None,
                                    location: String::new(),
                                    name: i.name(),
                                    status: InstanceStatus::Running,
                                    created_at: i.created as i64 * 1_000_000_000 + i.seq as i64,
                                    since_start: Some(Duration::from_secs(t - i.created)),
                                    memory: Some(Memory {
                                        oom_kills: None,
                                        cpu_ns: spec.cpu_threshold.map(|_| i.cpu_ns),
                                        pressure: spec.pressure_threshold.map(|_| {
                                            if ready {
                                                now.pressure.unwrap_or(0.0)
                                            } else {
                                                0.0
                                            }
                                        }),
                                        ..memory(i)
                                    }),
                                    warm: false,
                                    protected: false,
                                }
                            })
                            .collect(),
                        external: vec![Some(now.external.unwrap_or(0.0)); spec.external.len()],
                        window,
                        ..Default::default()
                    };
                    between(t, &mut history, t0 + Duration::from_secs(t));
                    let plan = decide(&spec, &obs, &mut history, t0 + Duration::from_secs(t));
                    for action in plan.actions {
                        match action {
                            Action::Create { .. } => {
                                created += 1;
                                let new = SimInstance::new(created, t, warmup);
                                history.created(&new.name());
                                instances.push(new);
                            }
                            Action::Remove { name, .. } => instances.retain(|i| i.name() != name),
                            Action::Promote { .. }
                            | Action::Start { .. }
                            | Action::CreateWarm { .. } => {}
                        }
                    }
                }
            }
            let change = instances.len() as i64 - before;
            churn += change.unsigned_abs();
            if change != 0 {
                if last_direction != 0 && change.signum() != last_direction {
                    flips += 1;
                }
                last_direction = change.signum();
            }
        }

        let ready = instances.iter().filter(|i| i.ready_at <= t).count();
        let utilization = utilization(demand, ready, limit, base);
        // CPU demand per ready instance, percent of its limit (above 100: demand that waits).
        let cpu_each = cpu / ready.max(1) as f64;
        let cpu_over = spec
            .cpu_threshold
            .is_some_and(|c| cpu_each > (1.1 * c).min(100.0));
        if memory_overloaded(ready, utilization, threshold) || cpu_over {
            overload += 1;
        }
        if utilization >= 100.0 {
            oom += 1;
        }
        for i in instances.iter_mut().filter(|i| i.ready_at <= t) {
            i.cpu_ns = i
                .cpu_ns
                .saturating_add((cpu_each.min(100.0) / 100.0 * cpu_second) as u64);
        }
        let mut need = (demand / per_instance).ceil();
        if let Some(c) = spec.cpu_threshold {
            need = need.max((cpu / c).ceil());
        }
        for e in &spec.external {
            need = need.max((now.external.unwrap_or(0.0) / e.target).ceil());
        }
        let ideal = (need as u32).clamp(min, max);
        let n = instances.len() as u32;
        waste += u64::from(n.saturating_sub(ideal));
        peak = peak.max(n);
        each(Second {
            t,
            demand_mib: demand,
            instances: n,
            ideal,
            utilization,
        });
    }
    let cost = cost(oom as f64, overload as f64, waste as f64, churn as f64);
    Scores {
        policy: policy.name().into(),
        overload_s: overload,
        oom_s: oom,
        waste_instance_s: waste,
        churn,
        flips,
        peak,
        cost,
    }
}

/// The mean memory utilization of `ready` instances sharing `demand` MiB, each using `base`
/// more and observed capped at `limit`, percent (100 with none ready).
fn utilization(demand: f64, ready: usize, limit: f64, base: f64) -> f64 {
    if ready == 0 {
        100.0
    } else {
        (base + demand / ready as f64).min(limit) / limit * 100.0
    }
}

/// Whether a second is overloaded on memory: no instance ready, or their utilization above
/// 1.1 × the threshold.
fn memory_overloaded(ready: usize, utilization: f64, threshold: f64) -> bool {
    ready == 0 || utilization > 1.1 * threshold
}

/// What scores cost: `10 × oom_s + overload_s + waste_instance_s / 60 + 2 × churn`.
fn cost(oom_s: f64, overload_s: f64, waste_instance_s: f64, churn: f64) -> f64 {
    10.0 * oom_s + overload_s + waste_instance_s / 60.0 + 2.0 * churn
}

/// Scores as a table in the style of `incus list`.
pub fn table(rows: &[Scores]) -> String {
    let header = [
        "POLICY",
        "OVERLOAD_S",
        "OOM_S",
        "WASTE_INSTANCE_S",
        "CHURN",
        "FLIPS",
        "PEAK",
        "COST",
    ];
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|s| {
            vec![
                s.policy.clone(),
                s.overload_s.to_string(),
                s.oom_s.to_string(),
                s.waste_instance_s.to_string(),
                s.churn.to_string(),
                s.flips.to_string(),
                s.peak.to_string(),
                format!("{:.1}", s.cost),
            ]
        })
        .collect();
    crate::table::render(&header, &cells)
}

#[cfg(test)]
mod tests;

#[cfg(test)]
#[path = "signals_tests.rs"]
mod signals_tests;
