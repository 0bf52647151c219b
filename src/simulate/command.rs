//! The edge of `incus-hpa simulate`: reads the desired-state file and the trace (a file, or one
//! generated from a family and a seed), runs the chosen policies, prints the scores (table or
//! JSON) and draws the plot; with `--family` and no `--seed`, runs a family's seeds and prints
//! the distribution of the default policy's cost against the better baseline
//! ([`super::families`]). Exit status 1, with every problem located, for a bad file, an
//! unknown group or family, a trace that does not fit the group's signals ([`super::fit`]) or
//! a memory group without a memory limit. Notes (a signal without a column, `step` left out of
//! `--compare`) go to stderr.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use super::families::{self, Distribution, Outcome};
use super::generate::{self, Family};
use super::{fit, simulate_with, svg, table, Clock, LoadModel, Plot, SimPolicy, Trace};
use crate::config::{self, DEFAULT_PATH};
use crate::model::size::mib;
use crate::model::GroupSpec;

/// `incus-hpa simulate`: see [`crate::simulate`] for the load model and the scores.
#[derive(Debug, clap::Args)]
pub struct SimulateArgs {
    /// The desired-state file the group comes from.
    #[arg(long, short, value_name = "FILE", default_value = DEFAULT_PATH)]
    pub config: PathBuf,
    /// The group to simulate.
    #[arg(long, required_unless_present = "history")]
    pub group: Option<String>,
    /// The trace: CSV with the header `t` and then any of `demand_mib`, `cpu_percent`,
    /// `pressure` and `external` (one for each of the group's signals), at most 30 days long
    /// and 1,000,000 rows. Not with `--family`, which generates the traces, nor `--history`.
    #[arg(required_unless_present_any = ["family", "history"], conflicts_with_all = ["family", "history"])]
    pub trace: Option<PathBuf>,
    /// Replays the group's own recorded passes (the daemon's history of GROUP, see
    /// incus-hpa(8), FILES) under the group's table in the file, with `--set` changes: what
    /// its instances used beyond their base use (--base-mib), its CPU, pressure and external
    /// readings, from `--since` ago until the last pass, windows at the times they opened.
    /// Prints what happened as recorded (instance-hours, highest count, OOM kills) beside the
    /// replay's scores.
    #[arg(long, value_name = "GROUP", conflicts_with_all = ["family", "start"])]
    pub history: Option<String>,
    /// With `--history`: how far back the replay starts.
    #[arg(long, value_name = "DURATION", default_value = "7d", value_parser = humantime::parse_duration,
          requires = "history")]
    pub since: std::time::Duration,
    /// With `--history`: the state directory the history is in [default: `[daemon]
    /// state_directory` of the file, else $STATE_DIRECTORY, else /var/lib/incus-hpa].
    #[arg(long, value_name = "DIR", requires = "history")]
    pub state_directory: Option<PathBuf>,
    /// Changes a key of the group's table for the replay (repeatable): `KEY=VALUE`, KEY a key
    /// of [groups.NAME] (`config.NAME` for an instance config key), VALUE as in the file
    /// (quotes optional for a string): `--set policy=kubernetes --set
    /// scale_down_stabilization=2m --set config.limits.memory=128MiB`.
    #[arg(long, value_name = "KEY=VALUE")]
    pub set: Vec<String>,
    /// The decision rule: the group's own, Kubernetes' defaults, or the Go lab's ±1 rule.
    #[arg(long, value_enum, default_value = "default")]
    pub policy: crate::simulate::SimPolicy,
    /// Output format.
    #[arg(long, value_enum, default_value = "table")]
    pub format: Format,
    /// Each instance's base memory use, MiB (does not move with load).
    #[arg(long, default_value_t = 4.0)]
    pub base_mib: f64,
    /// Each instance's memory limit, MiB (default: the group's `limits.memory`).
    #[arg(long)]
    pub limit_mib: Option<f64>,
    /// From an instance's creation to its readiness.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    pub warmup: std::time::Duration,
    /// Also draw the run as an SVG.
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,
    /// Show the policy next to `kubernetes` and `step` (`step` reads memory only: it is left
    /// out for a trace with other columns).
    #[arg(long)]
    pub compare: bool,
    /// The instant of the trace's t = 0, RFC 3339, for the group's schedule windows (a window
    /// without a timezone uses UTC).
    #[arg(long, value_name = "RFC3339", default_value = crate::simulate::START,
          value_parser = crate::simulate::parse_start)]
    pub start: std::time::SystemTime,
    /// Replays generated memory traces instead of a file: a family of shapes (`steps`,
    /// `spikes`, `ramps`, `sawtooth-up`, `sawtooth-down`, `sines`, `noise`, `daily`, `bursts`,
    /// `sums`) or `all`, each trace 1 to 6 hours, its demand scaled to what the group's `max`
    /// holds at its threshold. Without `--seed`: runs `--seeds` traces of each family with the
    /// group's policy, `kubernetes` and `step`, and prints per family the distribution of the
    /// ratio of the policy's cost to the better baseline's (median, 95th percentile, worst,
    /// with its seed), the family's total ratio (sum of costs over sum of the better
    /// baselines'), on how many traces the policy was OOM longer than the better baseline,
    /// and the family's floor: the total no policy can go below, the cost of the best count
    /// schedule chosen knowing each trace in advance, over the better baselines'.
    #[arg(long, value_name = "NAME|all")]
    pub family: Option<String>,
    /// With `--family`: how many traces of each family to run, seeds 0 to N − 1.
    #[arg(long, value_name = "N", default_value_t = 100,
          value_parser = clap::value_parser!(u64).range(1..=100_000))]
    pub seeds: u64,
    /// With `--family NAME`: replays that family's trace number S alone, as a trace file is
    /// replayed (scores, `--compare`, `--plot`): how a worst seed is looked at.
    #[arg(long, value_name = "S")]
    pub seed: Option<u64>,
    /// With `--family NAME --seed S` or `--history`: also writes the trace replayed, as CSV a
    /// trace file can be.
    #[arg(long, value_name = "FILE.csv")]
    pub trace_out: Option<PathBuf>,
}

/// How `simulate` prints its scores.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Table,
    Json,
}

/// Runs `incus-hpa simulate`.
pub fn run(args: &SimulateArgs) -> ExitCode {
    exit(try_run(args))
}

/// A command's outcome as its exit status: 0, or 1 with the message on stderr.
pub(super) fn exit(result: Result<(), String>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("{message}");
            ExitCode::from(1)
        }
    }
}

/// Every problem of a refused desired-state file, located, then the refusal: one per line.
pub(super) fn located(e: config::ConfigError) -> String {
    let mut lines: Vec<String> = e.diagnostics.iter().map(|d| d.to_string()).collect();
    lines.push(e.to_string());
    lines.join("\n")
}

fn try_run(args: &SimulateArgs) -> Result<(), String> {
    let group = match (&args.group, &args.history) {
        (Some(g), Some(h)) if g != h => {
            return Err(format!(
                "--group {g:?} and --history {h:?}: name one group (--history GROUP is enough)"
            ))
        }
        (Some(g), _) | (None, Some(g)) => g.as_str(),
        (None, None) => return Err("simulate: name the --group".into()),
    };
    if args.trace_out.is_some() && args.seed.is_none() && args.history.is_none() {
        return Err(
            "--trace-out: writes a generated trace (--family NAME --seed S) or a recorded \
             one (--history GROUP)"
                .into(),
        );
    }
    let loaded = load(args, group)?;
    let file = args.config.display();
    let spec = loaded
        .state
        .groups
        .values()
        .find(|g| g.name.as_str() == group)
        .ok_or_else(|| {
            let known: Vec<&str> = loaded.state.groups.keys().map(|g| g.as_str()).collect();
            format!(
                "{file}: no group {:?} (groups: {})",
                group,
                if known.is_empty() {
                    "none".into()
                } else {
                    known.join(", ")
                }
            )
        })?;
    let model = model(args, group, spec)?;
    if args.history.is_some() {
        return replay_history(args, &loaded.state.daemon, spec, &model);
    }
    let (trace_path, trace) = match (&args.family, &args.trace) {
        (Some(name), _) => {
            let chosen = family_list(name)?;
            if spec.memory_threshold.is_none() {
                return Err(format!(
                    "--family: generated traces are memory demand, and group {group:?} has no \
                     memory_threshold"
                ));
            }
            let Some(seed) = args.seed else {
                return run_families(args, spec, &model, &chosen);
            };
            let [family] = chosen[..] else {
                return Err(format!(
                    "--seed {seed}: name the family whose trace to replay ({})",
                    Family::names()
                ));
            };
            let demand = families::trace(spec, &model, family, seed).unwrap_or_default();
            if let Some(out) = &args.trace_out {
                std::fs::write(out, generate::csv(family, seed, &demand))
                    .map_err(|e| format!("{}: cannot write the trace: {e}", out.display()))?;
            }
            let name = PathBuf::from(format!("{}-{seed}.csv", family.name()));
            (name, Trace::from_demand(&demand))
        }
        (None, _) if args.seed.is_some() => {
            return Err("--seed: replays a generated trace: name its --family".into())
        }
        (None, Some(path)) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| format!("{}: cannot read the trace: {e}", path.display()))?;
            let trace = Trace::parse(path, &text).map_err(|e| e.to_string())?;
            (path.clone(), trace)
        }
        (None, None) => return Err("simulate: name a trace file or a --family".into()),
    };
    replay(args, spec, &model, &trace_path, &trace, args.start)
}

/// The desired-state file, with the `--set` changes made to `group`'s table.
fn load(args: &SimulateArgs, group: &str) -> Result<config::Loaded, String> {
    if args.set.is_empty() {
        return config::load(&args.config).map_err(located);
    }
    let text = std::fs::read_to_string(&args.config)
        .map_err(|e| format!("{}: {e}", args.config.display()))?;
    let changed = super::recorded::apply_sets(&text, group, &args.set)
        .map_err(|e| format!("{}: {e}", args.config.display()))?;
    let name = PathBuf::from(format!("{} with --set", args.config.display()));
    config::parse(&name, &changed).map_err(located)
}

/// Replays the group's recorded passes.
fn replay_history(
    args: &SimulateArgs,
    daemon: &crate::model::DaemonSpec,
    spec: &GroupSpec,
    model: &LoadModel,
) -> Result<(), String> {
    let group = spec.name.as_str();
    let (dir, rows) = recorded_rows(args.state_directory.as_deref(), daemon, group, args.since)?;
    let csv = super::recorded::trace_csv(spec, &rows, model.base_mib)
        .map_err(|e| format!("{}: {group}: {e}", dir.display()))?;
    if let Some(out) = &args.trace_out {
        std::fs::write(out, &csv)
            .map_err(|e| format!("{}: cannot write the trace: {e}", out.display()))?;
    }
    let name = PathBuf::from(format!("{group}-history.csv"));
    let trace = Trace::parse(&name, &csv).map_err(|e| e.to_string())?;
    let start = crate::history::at_unix_ms(rows[0].unix_ms);
    let recorded = super::recorded::as_recorded(&rows);
    match args.format {
        Format::Table => println!(
            "as recorded: {} passes over {}, {:.2} instance-hours, at most {} instances, {} OOM \
             kill(s)",
            rows.len(),
            humantime::format_duration(std::time::Duration::from_secs(recorded.seconds as u64)),
            recorded.instance_hours,
            recorded.peak,
            recorded.oom_kills
        ),
        Format::Json => eprintln!(
            "{}",
            serde_json::json!({"as_recorded": {"passes": rows.len(), "seconds": recorded.seconds,
                "instance_hours": recorded.instance_hours, "peak": recorded.peak,
                "oom_kills": recorded.oom_kills}})
        ),
    }
    replay(args, spec, model, &name, &trace, start)
}

/// The rows `group` recorded within `since` (at least one), and the state directory they
/// are in: `dir` when given, else the file's `[daemon] state_directory`, else
/// `$STATE_DIRECTORY`, else the packaged unit's. Lines that are not rows are said on stderr.
pub(super) fn recorded_rows(
    dir: Option<&Path>,
    daemon: &crate::model::DaemonSpec,
    group: &str,
    since: std::time::Duration,
) -> Result<(PathBuf, Vec<crate::history::Record>), String> {
    let dir = dir.map_or_else(
        || crate::history::read_from(daemon.state_directory.as_deref()),
        Path::to_owned,
    );
    let from = std::time::SystemTime::now()
        .checked_sub(since)
        .unwrap_or(std::time::UNIX_EPOCH);
    let from_ms = crate::history::unix_ms(from);
    let (rows, bad) = crate::history::read(&dir, group, from_ms)
        .map_err(|e| format!("{}: cannot read the history of {group}: {e}", dir.display()))?;
    if rows.is_empty() {
        return Err(format!(
            "{}: no pass of {group} recorded in the last {} (the daemon keeps each group's \
             history in its state directory; see incus-hpa(8), FILES)",
            dir.join("groups").join(group).display(),
            humantime::format_duration(since)
        ));
    }
    if bad > 0 {
        eprintln!(
            "{}: note: {bad} line(s) that are not rows were skipped",
            dir.display()
        );
    }
    Ok((dir, rows))
}

/// The families `name` stands for: one, or every one for `all`.
fn family_list(name: &str) -> Result<Vec<Family>, String> {
    if name == "all" {
        return Ok(Family::ALL.to_vec());
    }
    Family::named(name).map(|f| vec![f]).ok_or_else(|| {
        format!(
            "--family {name:?}: no such family (families: {}, or all)",
            Family::names()
        )
    })
}

/// The load model of the arguments, for the group `spec`.
fn model(args: &SimulateArgs, group: &str, spec: &GroupSpec) -> Result<LoadModel, String> {
    let file = args.config.display();
    let limit_mib = match args.limit_mib {
        Some(l) if l.is_finite() && l > 0.0 => l,
        Some(l) => return Err(format!("--limit-mib {l}: must be a positive number of MiB")),
        // Without memory as a signal, the limit only fills the readings the daemon's rules
        // expect: the group's if it has a readable one, else 1 GiB.
        None if spec.memory_threshold.is_none() => spec
            .config
            .get("limits.memory")
            .and_then(|v| mib(v))
            .unwrap_or(1024.0),
        None => {
            let key = format!("groups.{group}.config.\"limits.memory\"");
            let value = spec.config.get("limits.memory").ok_or_else(|| {
                format!("{file}: {key} is not set: the simulation needs each instance's limit (or --limit-mib)")
            })?;
            mib(value).ok_or_else(|| {
                format!("{file}: {key} = {value:?}: the simulation needs a size such as \"64MiB\" (or --limit-mib)")
            })?
        }
    };
    if !(args.base_mib.is_finite() && args.base_mib >= 0.0 && args.base_mib < limit_mib) {
        return Err(format!(
            "--base-mib {}: must be at least 0 and below the limit ({limit_mib} MiB)",
            args.base_mib
        ));
    }
    Ok(LoadModel {
        limit_mib,
        base_mib: args.base_mib,
        warmup: args.warmup,
    })
}

/// Runs seeds 0 to `--seeds` − 1 of each of `chosen` and prints their distributions (and
/// that of all of them, for more than one family).
fn run_families(
    args: &SimulateArgs,
    spec: &GroupSpec,
    model: &LoadModel,
    chosen: &[Family],
) -> Result<(), String> {
    let mut all: Vec<Outcome> = Vec::new();
    let mut rows: Vec<Distribution> = Vec::new();
    for family in chosen {
        let outcomes: Vec<Outcome> = (0..args.seeds)
            .filter_map(|seed| families::replay(spec, model, *family, seed))
            .collect();
        rows.extend(families::distribution(family.name(), &outcomes));
        all.extend(outcomes);
    }
    if chosen.len() > 1 {
        rows.extend(families::distribution("all", &all));
    }
    match args.format {
        Format::Table => print!("{}", families::table(&rows)),
        Format::Json => println!("{}", serde_json::to_string(&rows).unwrap_or_default()),
    }
    Ok(())
}

/// Replays one trace (from `trace_path`, or generated and named so) as asked, and prints it.
fn replay(
    args: &SimulateArgs,
    spec: &GroupSpec,
    model: &LoadModel,
    trace_path: &Path,
    trace: &Trace,
    start: std::time::SystemTime,
) -> Result<(), String> {
    let file = args.config.display();
    let group = spec.name.as_str();
    let notes = fit::check(spec, trace, trace_path)?;
    if args.plot.is_some() && spec.memory_threshold.is_none() {
        return Err(format!(
            "--plot: the plot draws memory demand and utilization, and group {group:?} has no \
             memory_threshold"
        ));
    }
    if args.policy == SimPolicy::Step && !fit::step_fits(trace) {
        return Err(format!(
            "--policy step: the Go lab's ±1 rule reads memory only, and {} has other columns \
             than `demand_mib`: use `default` or `kubernetes`",
            trace_path.display()
        ));
    }
    let clock =
        Clock::new(&spec.schedule, start).map_err(|e| format!("{file}: groups.{group}: {e}"))?;
    for note in notes {
        eprintln!("{note}");
    }
    let mut policies = vec![args.policy];
    if args.compare {
        policies.extend(
            [SimPolicy::Kubernetes, SimPolicy::Step]
                .into_iter()
                .filter(|p| *p != args.policy),
        );
        if !fit::step_fits(trace) {
            eprintln!(
                "{}: note: `step` is left out of the comparison: the Go lab's ±1 rule reads \
                 memory only",
                trace_path.display()
            );
            policies.retain(|p| *p != SimPolicy::Step);
        }
    }
    let runs: Vec<_> = policies
        .iter()
        .map(|p| simulate_with(spec, trace, model, *p, &clock))
        .collect();
    let scores: Vec<_> = runs.iter().map(|r| r.scores.clone()).collect();
    match (args.format, args.compare) {
        (Format::Table, _) => print!("{}", table(&scores)),
        (Format::Json, false) => {
            println!("{}", serde_json::to_string(&scores[0]).unwrap_or_default())
        }
        (Format::Json, true) => println!("{}", serde_json::to_string(&scores).unwrap_or_default()),
    }
    if let Some(path) = &args.plot {
        let title = format!(
            "{} on {}",
            group,
            trace_path
                .file_name()
                .map_or_else(String::new, |n| n.to_string_lossy().into_owned())
        );
        let plot = Plot {
            title: &title,
            policy: spec.policy.as_str(),
            threshold: spec.memory_threshold.unwrap_or(100.0),
            min: spec.min,
            max: spec.max,
        };
        std::fs::write(path, svg(&plot, &runs))
            .map_err(|e| format!("{}: cannot write the plot: {e}", path.display()))?;
    }
    Ok(())
}
