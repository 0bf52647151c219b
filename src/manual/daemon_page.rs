//! `incus-hpa(8)`: the daemon and every command with all its flags (from [`crate::cli`]), exit
//! status, signals, files, environment and journal fields.

use clap::{Arg, ArgAction, Command, CommandFactory};
use roff::{bold, roman, Inline};

use super::{placeholder, reference, Page};
use crate::model::{Cause, Reason};

/// The page's text, in roff.
pub fn daemon_page() -> String {
    let cli = crate::cli::Cli::command();
    let mut p = Page::new("INCUS-HPA", "8", "System Administration");
    p.section("NAME");
    p.0.text([roman(
        "incus-hpa - keep groups of Incus containers sized to their load",
    )]);
    p.section("SYNOPSIS");
    p.0.text([
        bold("incus-hpa"),
        roman(" ["),
        bold("--incus-socket"),
        roman(" "),
        placeholder("PATH"),
        roman("] "),
        placeholder("COMMAND"),
        roman(" ["),
        placeholder("OPTIONS"),
        roman("]"),
    ]);
    p.section("DESCRIPTION");
    p.para(
        "incus-hpa is a horizontal autoscaler for Incus containers. Its desired-state file, \
         incus-hpa.toml(5), declares groups of instances: for each, min and max, what it scales \
         on (memory, CPU, pressure, numbers a program prints, schedule windows), and the image \
         and config to create them from. incus-hpa \
         run observes each group's instances at every interval, from a cache that Incus' events \
         keep current and from their cgroup files (and, for \
         the adaptive policy, as soon as an instance reaches its memory limit, or the group goes \
         above its tolerance, between two \
         passes, or an instance the last pass added reaches its limit too), decides how many \
         there should be, and creates, starts or deletes instances until reality matches. It only ever acts on instances it created for a group, never on missing data, \
         and keeps running on the last good file when an edit is wrong.",
    );
    p.para(
        "The package runs it as the systemd unit incus-hpa.service, under the user incus-hpa in \
         the group incus-admin: systemctl enable --now incus-hpa starts it, systemctl reload \
         incus-hpa (or saving the file) applies an edit, journalctl -u incus-hpa shows what it \
         decides and does, and incus-hpa status asks it what it thinks of each group.",
    );
    p.section("COMMANDS");
    for sub in cli.get_subcommands().filter(|s| !s.is_hide_set()) {
        command(&mut p, "incus-hpa", sub);
        // A command of commands (`hook`): each of its own, as `incus-hpa hook NAME`.
        let parent = format!("incus-hpa {}", sub.get_name());
        for nested in sub.get_subcommands().filter(|s| !s.is_hide_set()) {
            command(&mut p, &parent, nested);
        }
    }
    p.section("GLOBAL OPTIONS");
    p.para("Given before or after the command.");
    for arg in cli.get_arguments().filter(|a| a.is_global_set()) {
        option(&mut p, arg);
    }
    exit_status(&mut p);
    signals(&mut p);
    endpoints(&mut p);
    files(&mut p);
    environment(&mut p);
    journal(&mut p);
    p.section("SEE ALSO");
    let mut see = Vec::new();
    for (i, (name, section)) in [
        ("incus-hpa.toml", "5"),
        ("incus", "1"),
        ("systemctl", "1"),
        ("journalctl", "1"),
        ("systemd.service", "5"),
    ]
    .into_iter()
    .enumerate()
    {
        if i > 0 {
            see.push(roman(", "));
        }
        see.extend(reference(name, section));
    }
    see.push(roman(
        "; /usr/share/doc/incus-hpa/README.md and the guides in /usr/share/doc/incus-hpa/docs/.",
    ));
    p.0.text(see);
    p.render()
}

/// The arguments of `cmd` a person gives: not hidden, not `--help` and `--version`, not the
/// global ones propagated from the top.
fn shown_args(cmd: &Command) -> impl Iterator<Item = &Arg> {
    cmd.get_arguments().filter(|a| {
        !a.is_hide_set()
            && !a.is_global_set()
            && !matches!(a.get_action(), ArgAction::Help | ArgAction::Version)
    })
}

/// One command: its synopsis, what it does, and each of its options. `parent` is what comes
/// before its name (`incus-hpa`, or `incus-hpa hook`).
fn command(p: &mut Page, parent: &str, sub: &Command) {
    let mut synopsis = String::new();
    for a in shown_args(sub) {
        let value = a
            .get_value_names()
            .and_then(|v| v.first())
            .map(|v| v.to_string())
            .unwrap_or_else(|| a.get_id().as_str().to_uppercase());
        let shown = match a.get_long() {
            Some(long) if matches!(a.get_action(), ArgAction::SetTrue) => format!("--{long}"),
            Some(long) => format!("--{long} {value}"),
            None => value,
        };
        if a.is_required_set() {
            synopsis.push_str(&format!(" {shown}"));
        } else {
            synopsis.push_str(&format!(" [{shown}]"));
        }
    }
    p.subsection_of(vec![
        bold(format!("{parent} {}", sub.get_name())),
        roman(synopsis),
    ]);
    let about = sub
        .get_long_about()
        .or(sub.get_about())
        .map(|s| s.to_string())
        .unwrap_or_default();
    for para in about.split("\n\n") {
        p.para(&sentence(para));
    }
    for a in shown_args(sub) {
        option(p, a);
    }
}

/// Help text as the page prints it: on one line, without the backquotes of Markdown, and
/// ending with a full stop (clap drops it from a help of one sentence).
fn sentence(text: &str) -> String {
    let mut s = text.replace('\n', " ").replace('`', "");
    if !s.is_empty() && !s.ends_with(['.', ']', ')']) {
        s.push('.');
    }
    s
}

/// One option or argument: its flags and value, its help, default, choices and variable.
fn option(p: &mut Page, a: &Arg) {
    let value = a
        .get_value_names()
        .and_then(|v| v.first())
        .map(|v| v.to_string())
        .unwrap_or_else(|| a.get_id().as_str().to_uppercase());
    let mut tag: Vec<Inline> = Vec::new();
    if let Some(long) = a.get_long() {
        tag.push(bold(format!("--{long}")));
    }
    if let Some(short) = a.get_short() {
        tag.push(roman(", "));
        tag.push(bold(format!("-{short}")));
    }
    if a.get_action().takes_values() {
        if !tag.is_empty() {
            tag.push(roman(" "));
        }
        tag.push(placeholder(&value));
    }
    let mut help = sentence(
        &a.get_long_help()
            .or(a.get_help())
            .map(|s| s.to_string())
            .unwrap_or_default(),
    );
    let choices: Vec<String> = a
        .get_possible_values()
        .iter()
        .filter(|v| !v.is_hide_set())
        .map(|v| v.get_name().to_owned())
        .collect();
    if !choices.is_empty() && a.get_action().takes_values() {
        help.push_str(&format!(" One of: {}.", choices.join(", ")));
    }
    let defaults: Vec<String> = a
        .get_default_values()
        .iter()
        .map(|v| v.to_string_lossy().into_owned())
        .collect();
    if !defaults.is_empty() && a.get_action().takes_values() {
        help.push_str(&format!(" Default: {}.", defaults.join(", ")));
    }
    if let Some(env) = a.get_env() {
        help.push_str(&format!(
            " The environment variable {} sets it too.",
            env.to_string_lossy()
        ));
    }
    p.entry(tag, help.trim());
}

fn exit_status(p: &mut Page) {
    p.section("EXIT STATUS");
    p.entry(
        vec![bold("0")],
        "Success: run stopped cleanly on SIGTERM or SIGINT; validate found no error; plan, \
         status, simulate and advise printed their answer; a hook made the load balancer match the set.",
    );
    p.entry(
        vec![bold("1")],
        "Failure: validate found an error; plan could not read the file or reach Incus; status \
         found no daemon answering on the control socket, or none within --timeout; simulate could not read its file, \
         trace or history; advise could not read its file, or a group it was asked about has \
         no history or no limits.memory; a hook could not read the set or change the load balancer \
         (the reason on stderr); run failed after its start (for instance, it could not listen on its control \
         socket).",
    );
    p.entry(
        vec![bold("2")],
        "The command line is wrong (an unknown command or flag); the usage is printed.",
    );
    p.entry(
        vec![bold("78")],
        "run could not start on its configuration (EX_CONFIG): the desired-state file is \
         refused (an error in it, or its ownership or modes), or the Incus endpoint it names \
         cannot be used (a TLS certificate or key that cannot be read or loaded). The unit does \
         not restart on it (RestartPreventExitStatus=78): fix the file, check it with incus-hpa \
         validate, then systemctl restart incus-hpa.",
    );
}

fn signals(p: &mut Page) {
    p.section("SIGNALS");
    p.entry(
        vec![bold("SIGHUP")],
        "Read the desired-state file again (systemctl reload incus-hpa sends it; saving the \
         file does the same). A file with an error is refused and the last good one stays in \
         force.",
    );
    p.entry(
        vec![bold("SIGUSR1")],
        "Write the daemon's cache of instances to the journal, for a bug report.",
    );
    p.entry(
        vec![bold("SIGTERM"), roman(", "), bold("SIGINT")],
        "Stop: no new action starts, a drain in flight is cut short, the actions in flight \
         complete (165 s at most), each group's history is saved and what it learned is left \
         in Incus for the next holder of its lease, the leases are given up, and the daemon \
         exits 0. Instances are left running.",
    );
}

fn endpoints(p: &mut Page) {
    p.section("ENDPOINTS");
    p.para(
        "For a group with a [groups.NAME.endpoints] table (see incus-hpa.toml(5)), the daemon \
         holding the group's lease runs its command with the group's endpoints on standard \
         input, one line of JSON, endpoints sorted by instance name, an IPv6 address without \
         brackets, an empty list when no instance is in service:",
    );
    p.literal(
        "{\"group\":\"web\",\"project\":\"default\",\"endpoints\":[{\"instance\":\"web-3kd9x2\",\n \
         \"address\":\"10.98.0.12\",\"port\":80}]}",
    );
    p.para(
        "It runs when the set changes, at start, after a takeover and after a reload; a failed \
         run is retried after 1 s, doubling up to 1 min. A removal publishes the set without \
         its instance and waits deregistration_delay before the drain and the stop; a failed \
         run holds the removal. status --json shows, per group, endpoints: {\"published\": \
         [the same objects], \"pending\": true or false, \"error\": the last failure or null}.",
    );
}

fn files(p: &mut Page) {
    p.section("FILES");
    for (path, what) in [
        (
            crate::config::DEFAULT_PATH,
            "The desired-state file; see incus-hpa.toml(5).",
        ),
        (
            "/run/incus-hpa/control.sock",
            "The control socket ([daemon] control_socket): GET /status for incus-hpa status \
             (what the last pass of each group saw; who acts on it, STANDBY, as the daemon's \
             lease says when asked), GET /metrics for Prometheus. Mode 0660 from the moment \
             it appears, whatever the umask: root and members of the group incus-hpa. At start, \
             a socket nobody listens on is replaced; one a daemon answers on, or that the \
             daemon's user may not connect to, is left, and the daemon runs without one.",
        ),
        (
            "/var/lib/incus-hpa/groups/GROUP/",
            "Each group's history ([daemon] state_directory; the unit's StateDirectory): \
             passes.csv, a row per pass for the last day (time, count, desired count, the \
             instances' memory use and limit, each signal's reading, OOM kills, the \
             decision's reason); minutes.csv, a row per minute for the six days before; \
             learned.json, what the decisions had learned at the last save, at most a minute \
             old, from which a restarted daemon resumes the group. About 0.3 MiB per group a \
             day at interval = \"15s\" and 5 MiB at \"1s\", and 0.5 MiB for the week of \
             minutes. Removed 7 days after the group leaves the desired-state file, and \
             by apt purge.",
        ),
        (
            "/var/lib/incus/unix.socket",
            "The Incus socket, unless --incus-socket or [daemon] incus says otherwise.",
        ),
        (
            "/lib/systemd/system/incus-hpa.service",
            "The unit. Drop-ins go in /etc/systemd/system/incus-hpa.service.d/ \
             (systemctl edit incus-hpa).",
        ),
        (
            "/usr/lib/incus-hpa/hooks/",
            "The ready-made endpoint hooks haproxy and nginx, which run incus-hpa hook haproxy \
             and incus-hpa hook nginx; docs/traffic.md shows the configuration they \
             expect, and examples/haproxy-hook.conf and nginx-hook.conf the drop-ins they need.",
        ),
        (
            "/usr/share/doc/incus-hpa/",
            "The README, the guides (docs/) and the examples (examples/).",
        ),
    ] {
        p.entry(vec![bold(path)], what);
    }
}

fn environment(p: &mut Page) {
    p.section("ENVIRONMENT");
    for (name, what) in [
        (
            "INCUS_SOCKET",
            "The Incus unix socket, as --incus-socket gives it.",
        ),
        (
            "TZ",
            "The host's time zone, for schedule windows that name none (else /etc/localtime; \
             UTC, said once, when neither tells).",
        ),
        (
            "RUST_LOG",
            "Which entries are logged: info by default; incus_hpa=debug also logs every \
             decision that repeats the previous one.",
        ),
        (
            "JOURNAL_STREAM",
            "Set by systemd: entries then go to the journal with the fields below; otherwise \
             they are written to standard error as text.",
        ),
        (
            "NOTIFY_SOCKET, WATCHDOG_USEC",
            "Set by systemd: readiness, the STATUS= line of systemctl status, and the watchdog.",
        ),
        (
            "INCUS_HPA_REQUEST_TIMEOUT, INCUS_HPA_OPERATION_TIMEOUT",
            "How long one request to Incus (30s) and one creation, start or command (2m) are \
             waited for, as durations; meant for tests.",
        ),
        (
            "INCUS_HPA_CGROUP_ROOT",
            "Where the cgroup files are read instead of /sys/fs/cgroup; meant for the fleet \
             benchmark's fake tree.",
        ),
    ] {
        p.entry(vec![bold(name)], what);
    }
}

fn journal(p: &mut Page) {
    p.section("JOURNAL FIELDS");
    p.para(
        "Under systemd every entry carries fields that journalctl can select on, for instance \
         journalctl -u incus-hpa GROUP=web ACTION=delete, or -o verbose to see them all.",
    );
    p.entry(
        vec![bold("Decisions")],
        "One entry per group when a pass acts or decides differently from the pass before: \
         GROUP, CURRENT (instances in service, starting ones included), DESIRED, UNHEALTHY, \
         STARTING and NOT_READY (by the group's ready check), UTILIZATION (percent, or \
         unknown), REASON, PAUSED, STANDBY (true when this daemon does not act on the group: another \
         holds its lease, its own lease is not confirmed yet, or the project's lease store \
         cannot be used).",
    );
    p.entry(
        vec![bold("Actions")],
        "One entry per action: GROUP, INSTANCE, ACTION (create, create-warm, start, promote, \
         delete, drain), REASON, OUTCOME (ok, failed, pending: a creation whose end Incus has \
         not told; for drain also timeout and cut), ERROR, and for drain EXIT and DURATION.",
    );
    p.entry(
        vec![bold("Instances")],
        "A warning about one instance: GROUP, INSTANCE and REASON: crash-loop (with CRASHES), \
         unhealthy (STATUS), failing-start (FAILURES), unreachable (MEMBER: its cluster member \
         does not answer), not-ready and never-ready (WHY: its check's last failure), foreign (it carries the group's key, but the daemon did not create \
         it, and it is left alone).",
    );
    p.subsection("REASON of a decision");
    for r in REASONS {
        p.entry(vec![bold(r.as_str())], reason(r));
    }
    p.subsection("REASON of an action");
    for c in CAUSES {
        p.entry(vec![bold(c.as_str())], cause(c));
    }
}

/// Every reason of a decision, in the page's order ([`reason`] fails to compile without a new
/// one; a test checks that each name is on the page).
pub const REASONS: [Reason; 22] = [
    Reason::BelowMin,
    Reason::AboveMax,
    Reason::ScheduleMin,
    Reason::ScheduleMax,
    Reason::WindowClosed,
    Reason::AboveThreshold,
    Reason::AtLimit,
    Reason::Forecast,
    Reason::BelowThreshold,
    Reason::CpuAboveThreshold,
    Reason::CpuBelowThreshold,
    Reason::PressureAboveThreshold,
    Reason::PressureBelowThreshold,
    Reason::ExternalAboveTarget,
    Reason::ExternalBelowTarget,
    Reason::WithinTolerance,
    Reason::Stabilizing,
    Reason::StabilizingUp,
    Reason::MetricsMissing,
    Reason::NoMetrics,
    Reason::Protected,
    Reason::HostHeadroom,
];

fn reason(r: Reason) -> &'static str {
    match r {
        Reason::BelowMin => "Fewer instances than min: the count is raised to min at once.",
        Reason::AboveMax => {
            "More instances than max (lowered in the file, or found at start): the count is \
             lowered to max at once; the removals count toward max_scale_down_step."
        }
        Reason::ScheduleMin => {
            "Fewer instances than the min of an open schedule window: the count is raised at once."
        }
        Reason::ScheduleMax => {
            "More instances than the max of an open schedule window: the count is lowered to it \
             within max_scale_down_step, without the stabilization window."
        }
        Reason::WindowClosed => {
            "More instances than max since a schedule window that allowed them closed: the count \
             goes down to max through the scale-down stabilization window and the step limits."
        }
        Reason::AboveThreshold => "Memory use is above the threshold: instances are added.",
        Reason::CpuAboveThreshold => "CPU use is above cpu_threshold: instances are added.",
        Reason::CpuBelowThreshold => {
            "CPU use is below cpu_threshold, and no other signal holds the count: instances are \
             removed."
        }
        Reason::PressureAboveThreshold => {
            "Pressure is above pressure_threshold: instances are added in proportion."
        }
        Reason::PressureBelowThreshold => {
            "Pressure is below half of pressure_threshold, and no other signal holds the count: \
             instances are removed."
        }
        Reason::ExternalAboveTarget => {
            "An external value asks for more instances than there are (value / target)."
        }
        Reason::ExternalBelowTarget => {
            "An external value asks for fewer instances, and no other signal holds the count."
        }
        Reason::Forecast => {
            "The demand of the last hour repeats with a period, and one period ago it rose \
             within the time new instances take: instances are added before the rise comes \
             again (policy adaptive)."
        }
        Reason::AtLimit => {
            "An instance is at its memory limit, or its OOM killer killed since the last pass: \
             the demand is unknown, and the count at least doubles (policy adaptive)."
        }
        Reason::BelowThreshold => {
            "Memory use is below the threshold, and no other signal holds the count: instances \
             are removed."
        }
        Reason::WithinTolerance => {
            "No change: memory use is within the tolerance of the threshold (policy kubernetes), \
             or the recommendation equals the count (policy adaptive)."
        }
        Reason::Stabilizing => "A scale-down is held back by the scale-down stabilization window.",
        Reason::StabilizingUp => "A scale-up is held back by the scale-up stabilization window.",
        Reason::MetricsMissing => {
            "Some instances or signals have no reading and the rest would scale down: the count \
             is kept."
        }
        Reason::NoMetrics => "No signal has a reading: the count is kept.",
        Reason::Protected => {
            "A scale-down is cut short by instances a person protected \
             (user.incus-hpa.protected=true)."
        }
        Reason::HostHeadroom => {
            "Additions (creations, starts, promotions, warm-pool creations) are held back: \
             the host, or every cluster member the group may use, would be left with less \
             available memory than host_reserve, counting what each new instance is expected \
             to use. Below min too. A warning says what was available and what was needed."
        }
    }
}

/// Every reason of an action, in the page's order (see [`REASONS`]).
pub const CAUSES: [Cause; 12] = [
    Cause::BelowMin,
    Cause::AboveMax,
    Cause::ScaleUp,
    Cause::ScaleDown,
    Cause::Replace,
    Cause::Surplus,
    Cause::Restart,
    Cause::CrashLoop,
    Cause::StartRetry,
    Cause::Unhealthy,
    Cause::NeverReady,
    Cause::WarmPool,
];

fn cause(c: Cause) -> &'static str {
    match c {
        Cause::BelowMin => "The group is below min.",
        Cause::AboveMax => "The group is above max.",
        Cause::ScaleUp => "The signals ask for more instances.",
        Cause::ScaleDown => "The signals ask for fewer instances.",
        Cause::Replace => "An instance is missing or unhealthy: this is its replacement.",
        Cause::Surplus => {
            "More instances serve than desired (an unhealthy one recovered after it was \
             replaced)."
        }
        Cause::Restart => "A stopped instance of the group is started again.",
        Cause::CrashLoop => {
            "A crash-looping instance is restarted after its backoff, or replaced after too \
             many crashes."
        }
        Cause::StartRetry => "A start that failed is tried again after its backoff.",
        Cause::Unhealthy => {
            "An instance unhealthy for longer than unhealthy_grace is removed (it was replaced \
             already)."
        }
        Cause::NeverReady => {
            "An instance not ready within the start_timeout of its [groups.NAME.ready] check \
             after its start is removed (a failed start; its replacement is made in the same \
             pass)."
        }
        Cause::WarmPool => "The warm pool is refilled, or shrunk to its size.",
    }
}
