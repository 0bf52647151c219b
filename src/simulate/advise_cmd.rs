//! The edge of `incus-hpa advise`: reads the desired-state file and each group's history,
//! replays it at candidate sizes ([`super::advise`]) and prints the advice, a table or JSON.
//! Exit status 1 for a bad file, an unknown group, or a named group without a history or a
//! memory limit to size; with no group named, the groups that cannot be advised on are said
//! on stderr and the others advised on.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use super::advise::{for_group, own_size, Advice, NoAdvice, BASE_MIB};
use super::command::{exit, located, recorded_rows};
use crate::config::{self, DEFAULT_PATH};
use crate::model::GroupSpec;

/// `incus-hpa advise`.
#[derive(Debug, clap::Args)]
pub struct AdviseArgs {
    /// The group to advise on [default: every group scaled on memory].
    pub group: Option<String>,
    /// The desired-state file the groups come from.
    #[arg(long, short, value_name = "FILE", default_value = DEFAULT_PATH)]
    pub config: PathBuf,
    /// How far back the history replayed starts.
    #[arg(long, value_name = "DURATION", default_value = "7d", value_parser = humantime::parse_duration)]
    pub since: Duration,
    /// The state directory the history is in [default: `[daemon] state_directory` of the
    /// file, else $STATE_DIRECTORY, else /var/lib/incus-hpa].
    #[arg(long, value_name = "DIR")]
    pub state_directory: Option<PathBuf>,
    /// Each instance's base memory use, MiB (does not move with load).
    #[arg(long, default_value_t = BASE_MIB)]
    pub base_mib: f64,
    /// From an instance's creation to its readiness.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    pub warmup: Duration,
    /// Print the advice as JSON: one object per group with `group`, `hours`, `current`,
    /// `advised` and `candidates` (each with `limit_mib`, `instance_hours`,
    /// `memory_gib_hours`, `oom_s`, `overload_s`, `churn`, `fewest`, `most`).
    #[arg(long)]
    pub json: bool,
}

/// Runs `incus-hpa advise`.
pub fn run(args: &AdviseArgs) -> ExitCode {
    exit(try_run(args))
}

fn try_run(args: &AdviseArgs) -> Result<(), String> {
    let loaded = config::load(&args.config).map_err(located)?;
    let file = args.config.display();
    let groups: Vec<&GroupSpec> = match &args.group {
        Some(name) => vec![loaded
            .state
            .groups
            .values()
            .find(|g| g.name.as_str() == name)
            .ok_or_else(|| format!("{file}: no group {name:?}"))?],
        None => loaded
            .state
            .groups
            .values()
            .filter(|g| g.memory_threshold.is_some())
            .collect(),
    };
    let mut advice = Vec::new();
    for spec in groups {
        match one(args, &loaded.state.daemon, spec) {
            Ok(a) => advice.push(a),
            Err(e) if args.group.is_some() => return Err(e),
            Err(e) => eprintln!("{e}"),
        }
    }
    if args.json {
        println!("{}", serde_json::to_string(&advice).unwrap_or_default());
    } else if !advice.is_empty() {
        print!("{}", table(&advice));
        println!(
            "Each group's history replayed under its own policy at each size; nothing is \
             applied. To follow the advice, set \"limits.memory\" in [groups.NAME.config] \
             (new instances get it; incus config set NAME limits.memory SIZE changes a running \
             one)."
        );
    }
    Ok(())
}

fn one(
    args: &AdviseArgs,
    daemon: &crate::model::DaemonSpec,
    spec: &GroupSpec,
) -> Result<Advice, String> {
    let (file, group) = (args.config.display(), spec.name.as_str());
    if spec.memory_threshold.is_none() {
        return Err(format!(
            "{file}: {group}: advice sizes memory, and the group has no memory_threshold"
        ));
    }
    let key = format!("groups.{group}.config.\"limits.memory\"");
    let limit_mib = own_size(spec)
        .ok_or_else(|| format!("{file}: {key}: no size to advise from (\"64MiB\", \"1GiB\")"))?;
    if !(args.base_mib.is_finite() && args.base_mib >= 0.0 && args.base_mib < limit_mib) {
        return Err(format!(
            "--base-mib {}: must be at least 0 and below {group}'s limit ({limit_mib} MiB)",
            args.base_mib
        ));
    }
    let (dir, rows) = recorded_rows(args.state_directory.as_deref(), daemon, group, args.since)?;
    for_group(spec, &rows, args.base_mib, args.warmup).map_err(|e| match e {
        NoAdvice::Schedule(e) => format!("{file}: groups.{group}: {e}"),
        NoAdvice::Group(e) => format!("{}: {group}: {e}", dir.display()),
    })
}

fn table(advice: &[Advice]) -> String {
    let arrow = |a: String, b: String| if a == b { a } else { format!("{a} → {b}") };
    let rows: Vec<Vec<String>> = advice
        .iter()
        .map(|a| {
            let (c, d) = (&a.current, &a.advised);
            let saved = if c.memory_gib_hours > 0.0 && c.limit_mib != d.limit_mib {
                format!(
                    " ({:+.0}%)",
                    (d.memory_gib_hours / c.memory_gib_hours - 1.0) * 100.0
                )
            } else {
                String::new()
            };
            vec![
                a.group.clone(),
                format!("{:.1}h", a.hours),
                format!("{}MiB", c.limit_mib),
                format!("{}MiB", d.limit_mib),
                arrow(
                    format!("{}-{}", c.fewest, c.most),
                    format!("{}-{}", d.fewest, d.most),
                ),
                format!(
                    "{}{saved}",
                    arrow(
                        format!("{:.2}", c.memory_gib_hours),
                        format!("{:.2}", d.memory_gib_hours)
                    )
                ),
                arrow(c.oom_s.to_string(), d.oom_s.to_string()),
                arrow(c.churn.to_string(), d.churn.to_string()),
            ]
        })
        .collect();
    crate::table::render(
        &[
            "GROUP",
            "HISTORY",
            "SIZE",
            "ADVISED",
            "COUNT",
            "MEMORY GiB-h",
            "AT LIMIT s",
            "CHURN",
        ],
        &rows,
    )
}
