//! Every key of the desired-state file, with its type, default, range and meaning: the one
//! table the parser takes its known keys from and `incus-hpa.toml(5)` is written from, so that
//! a key cannot be read without being documented (a test reads each key of this table through
//! the parser, and the parser refuses to read a key that is not here).

use std::time::Duration;

use super::endpoints::{
    DELAY_MAX as ENDPOINTS_DELAY_MAX, TIMEOUT_MAX as ENDPOINTS_TIMEOUT_MAX,
    TIMEOUT_MIN as ENDPOINTS_TIMEOUT_MIN,
};
use super::ready::{FAILURES_MAX, INTERFACE_MAX_LEN, PERIOD_MAX, PERIOD_MIN};
use super::{
    DRAIN_TIMEOUT_MAX, DURATION_MAX, EXTERNAL_TIMEOUT_MAX, PARALLEL_MAX, SUFFIX_LEN, WARM_POOL_MAX,
    WINDOW_MAX,
};
use crate::model::{
    EndpointsSpec, GroupName, Probe, ReadySpec, DEFAULT_INTERFACE, MAX_INSTANCES,
    RESERVE_PERCENT_MAX, RESTART_BACKOFF_MAX, STOP_TIMEOUT_MAX,
};

/// The table a key belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Table {
    /// `[daemon]`.
    Daemon,
    /// `[groups.NAME]`.
    Group,
    /// `[[groups.NAME.external]]`.
    External,
    /// `[[groups.NAME.schedule]]`.
    Schedule,
    /// `[groups.NAME.ready]`.
    Ready,
    /// `[groups.NAME.endpoints]`.
    Endpoints,
}

/// When a change of the key takes effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applies {
    /// From the next pass after a reload.
    OnReload,
    /// Only when the daemon starts (a reload says it kept the old value).
    AtStart,
}

/// One key, as the manual shows it.
#[derive(Debug, Clone)]
pub struct Key {
    pub table: Table,
    pub name: &'static str,
    /// Its TOML type and accepted values, e.g. `duration` or `"auto", "cgroup" or "api"`.
    pub kind: &'static str,
    /// The value when the key is left out (`None`: required).
    pub default: Option<String>,
    /// The accepted range, when narrower than the type.
    pub range: Option<String>,
    pub applies: Applies,
    /// What it does: plain sentences, one paragraph.
    pub doc: &'static str,
    /// One valid TOML line setting it.
    pub example: &'static str,
}

/// The names of the keys of `table`, in the manual's order.
pub fn names(table: Table) -> Vec<&'static str> {
    keys()
        .into_iter()
        .filter(|k| k.table == table)
        .map(|k| k.name)
        .collect()
}

/// The `[daemon]` keys a reload does not change (they are read at start).
pub fn read_at_start() -> Vec<&'static str> {
    keys()
        .into_iter()
        .filter(|k| k.applies == Applies::AtStart)
        .map(|k| k.name)
        .collect()
}

fn h(d: Duration) -> String {
    super::fields::human(d)
}

fn up_to(min: Duration, max: Duration) -> Option<String> {
    Some(format!("{} to {}", h(min), h(max)))
}

/// Every key, `[daemon]` first, each table in the manual's order.
pub fn keys() -> Vec<Key> {
    use Applies::{AtStart, OnReload};
    use Table::{Daemon, Endpoints, External, Group, Ready, Schedule};
    let d = |s: &str| Some(s.to_owned());
    let quoted = |t: Duration| Some(format!("\"{}\"", h(t)));
    let ready = ReadySpec::with_probe(Probe::Tcp { port: 1 });
    vec![
        Key {
            table: Daemon,
            name: "interval",
            kind: "duration",
            default: d("\"15s\""),
            range: up_to(Duration::from_millis(100), DURATION_MAX),
            applies: OnReload,
            doc: "How often every group is observed and reconciled. Between two passes, a \
                  lifecycle event of one of a group's instances (stopped, deleted, frozen, \
                  renamed by someone else) and a saved desired-state file wake the loop at once. \
                  It is also the period step limits count in.",
            example: "interval = \"15s\"",
        },
        Key {
            table: Daemon,
            name: "memory_source",
            kind: "\"auto\", \"cgroup\" or \"api\"",
            default: d("\"auto\""),
            range: None,
            applies: OnReload,
            doc: "Where memory readings come from. \"cgroup\" reads each instance's cgroup files \
                  on this host (its working set: usage less inactive page cache, as the kubelet \
                  counts it) and sends no request to Incus. \"api\" asks Incus, one \
                  GET /1.0/metrics per project or one GET /1.0/instances/NAME/state per \
                  instance, whichever costs incusd less; it works for a remote Incus or a \
                  cluster. \"auto\" reads the cgroup files and asks the API for every instance \
                  they do not cover. An instance without a reading is never a reason to scale \
                  down.",
            example: "memory_source = \"auto\"",
        },
        Key {
            table: Daemon,
            name: "resync",
            kind: "duration",
            default: d("\"5m\""),
            range: up_to(Duration::from_secs(10), DURATION_MAX),
            applies: OnReload,
            doc: "How often the cache of instances is listed afresh from Incus, events or not: a \
                  guard against an event that was missed. A steady pass sends no request.",
            example: "resync = \"5m\"",
        },
        Key {
            table: Daemon,
            name: "max_parallel_actions",
            kind: "integer",
            default: d("4"),
            range: Some(format!("1 to {PARALLEL_MAX}")),
            applies: OnReload,
            doc: "How many actions (creations, starts, removals) of one pass run at once.",
            example: "max_parallel_actions = 4",
        },
        Key {
            table: Daemon,
            name: "host_reserve",
            kind: "size (\"2GiB\", \"512MiB\", bytes) or percentage (\"10%\")",
            default: d("\"5%\""),
            range: Some(format!(
                "a size of 0 or more, or 0% to {RESERVE_PERCENT_MAX}% of each host's memory"
            )),
            applies: OnReload,
            doc: "The memory each host keeps available. No creation, start, promotion or \
                  warm-pool creation takes a host below it, counting what each new instance \
                  is expected to use: the mean working set of the group's measured \
                  instances, else the group's limits.memory, else 0 (the journal says so). \
                  Below min too: a host that cannot hold an instance is not pushed into the OOM \
                  killer. What is held back is logged with REASON=host-headroom and counted in \
                  incus_hpa_headroom_blocked_total. The figure is the host's MemAvailable \
                  (/proc/meminfo) when Incus is the local socket, Incus' memory total less used \
                  (GET /1.0/resources) over HTTPS and for each cluster member, where a new \
                  instance goes to a member with room (within the group's target). It is read \
                  only by a pass that would add instances. The default, 5%, keeps room for the \
                  page cache, incusd and the host's own services on any size of host without \
                  setting much aside; \"0\" only keeps hosts from being overcommitted.",
            example: "host_reserve = \"5%\"",
        },
        Key {
            table: Daemon,
            name: "control_socket",
            kind: "absolute path",
            default: d("\"/run/incus-hpa/control.sock\""),
            range: None,
            applies: AtStart,
            doc: "The unix socket where the daemon serves GET /status (for incus-hpa status) and \
                  GET /metrics (Prometheus). incus-hpa status finds it in the file given with \
                  --config, or is given it with --control-socket.",
            example: "control_socket = \"/run/incus-hpa/control.sock\"",
        },
        Key {
            table: Daemon,
            name: "state_directory",
            kind: "absolute path",
            default: d("$STATE_DIRECTORY (the packaged unit's /var/lib/incus-hpa), else none"),
            range: None,
            applies: AtStart,
            doc: "Where each group's history is kept: a row per pass for a day (written every \
                  10 s), a row per minute for the week before, and what the adaptive policy \
                  has learned, saved once a minute and when the daemon stops. A restarted daemon \
                  resumes each group from it and decides as if it had never stopped; without \
                  a directory a restart starts every group afresh. A crash or a full disk \
                  loses at most the last minute and never stops the daemon; a save that \
                  cannot be read is set aside with one journal line. A group taken out of the \
                  file keeps its history for 7 days. See incus-hpa(8), FILES.",
            example: "state_directory = \"/var/lib/incus-hpa\"",
        },
        Key {
            table: Daemon,
            name: "metrics_address",
            kind: "\"IP:PORT\"",
            default: d("none (off)"),
            range: None,
            applies: AtStart,
            doc: "Also serve GET /metrics, and only that, over TCP at this address. The packaged \
                  unit allows no network: install \
                  /usr/share/doc/incus-hpa/examples/metrics-tcp.conf as a drop-in first.",
            example: "metrics_address = \"127.0.0.1:9750\"",
        },
        Key {
            table: Daemon,
            name: "lease",
            kind: "duration",
            default: d("\"15s\""),
            range: up_to(Duration::from_secs(3), Duration::from_secs(600)),
            applies: AtStart,
            doc: "How long a group's leader lease lasts. Several daemons may be given the same \
                  group (on several hosts of a cluster); only the holder of the group's lease \
                  acts on it, the others stand by, and one takes over when a lease has not been \
                  renewed for its holder's length: daemons may be given different values, each \
                  lease says its own. Leases are kept in the Incus profile incus-hpa.leases \
                  of the group's project (the default project's for a project without \
                  profiles of its own).",
            example: "lease = \"15s\"",
        },
        Key {
            table: Daemon,
            name: "incus",
            kind: "\"unix:///PATH\" or \"https://HOST[:PORT]\"",
            default: d("\"unix:///var/lib/incus/unix.socket\""),
            range: None,
            applies: AtStart,
            doc: "Where Incus is. An https:// address (port 8443 unless given) reaches a remote \
                  server or a cluster, with the client certificate of tls_client_cert and \
                  tls_client_key; the packaged unit allows no network, install \
                  /usr/share/doc/incus-hpa/examples/incus-https.conf as a drop-in first. \
                  --incus-socket PATH (or INCUS_SOCKET) on the command line wins over this key.",
            example: "incus = \"https://192.0.2.11:8443\"",
        },
        Key {
            table: Daemon,
            name: "tls_client_cert",
            kind: "absolute path",
            default: d("none; required with an https:// incus"),
            range: None,
            applies: AtStart,
            doc: "The PEM client certificate Incus trusts (incus config trust add-certificate \
                  CERT on the server). Ignored, with a warning, unless incus is an https:// \
                  address.",
            example: "tls_client_cert = \"/etc/incus-hpa/client.crt\"",
        },
        Key {
            table: Daemon,
            name: "tls_client_key",
            kind: "absolute path",
            default: d("none; required with an https:// incus"),
            range: None,
            applies: AtStart,
            doc: "The certificate's PEM private key. It is refused unless its group and others \
                  have no access to it at all (as with mode 0600, whoever owns it), or it is \
                  owned by root and the group incus-hpa, which may only read it (0640 \
                  root:incus-hpa).",
            example: "tls_client_key = \"/etc/incus-hpa/client.key\"",
        },
        Key {
            table: Daemon,
            name: "tls_server_cert",
            kind: "absolute path",
            default: d(
                "none: the server's certificate must come from an authority this host \
                        trusts",
            ),
            range: None,
            applies: AtStart,
            doc: "The server's (or the cluster's) certificate, pinned: the certificate Incus \
                  presents must be exactly this one.",
            example: "tls_server_cert = \"/etc/incus-hpa/server.crt\"",
        },
        Key {
            table: Group,
            name: "min",
            kind: "integer",
            default: d("1"),
            range: Some("0 to max".into()),
            applies: OnReload,
            doc: "Never fewer instances in service. Restored at once, without stabilization or \
                  step limits.",
            example: "min = 1",
        },
        Key {
            table: Group,
            name: "max",
            kind: "integer",
            default: None,
            range: Some(format!("1 to {MAX_INSTANCES}, at least min")),
            applies: OnReload,
            doc: "Never more healthy instances, except while the count goes back to it after a \
                  schedule window that allowed more (see SCHEDULES). Lowered in the file, it is \
                  restored at once, without stabilization or step limits; those removals count \
                  toward max_scale_down_step.",
            example: "max = 5",
        },
        Key {
            table: Group,
            name: "memory_threshold",
            kind: "number (percent)",
            default: d("none: memory is not a signal of the group"),
            range: Some("1 to 100".into()),
            applies: OnReload,
            doc: "The average memory use the group is kept at, in percent of each instance's \
                  memory limit (limits.memory). Above it instances are added, well below it \
                  removed, as the policy decides. A group scales on at least one signal: \
                  memory_threshold, cpu_threshold, pressure_threshold or an external table. \
                  With several, each wants a count and the group takes the highest; a signal \
                  without a reading never lowers the count.",
            example: "memory_threshold = 70",
        },
        Key {
            table: Group,
            name: "cpu_threshold",
            kind: "number (percent)",
            default: d("none: CPU is not a signal of the group"),
            range: Some("1 to 100".into()),
            applies: OnReload,
            doc: "The average CPU use the group is kept at, in percent of each instance's CPU \
                  limit, which the group's config must set: \"limits.cpu\" (a number of CPUs, \
                  or a set such as \"0-1\") or \"limits.cpu.allowance\" as a quota such as \
                  \"50ms/100ms\" (the smaller of the two when both are set). An instance's use \
                  is its CPU time between two passes over the time between them, so it counts \
                  from its second pass. The group wants ceil(n * mean / threshold) instances, \
                  with the tolerance band (the Kubernetes rule).",
            example: "cpu_threshold = 70",
        },
        Key {
            table: Group,
            name: "pressure_threshold",
            kind: "number (percent)",
            default: d("none: pressure is not a signal of the group"),
            range: Some("1 to 100".into()),
            applies: OnReload,
            doc: "Pressure stall information: the share of time some task of an instance waits \
                  for CPU or memory (the higher of its cpu.pressure and memory.pressure \"some \
                  avg10\"), averaged over the instances. Pressure does not fall as instances are \
                  added the way utilization does, so it only asks for growth: above the \
                  threshold the group wants ceil(n * pressure / threshold) instances; from half \
                  the threshold up to it, the count it has; below half, nothing (the other \
                  signals decide, and alone it lets the group shrink to min). Read from the \
                  cgroup files of the host the instances run on.",
            example: "pressure_threshold = 20",
        },
        Key {
            table: Group,
            name: "image",
            kind: "string",
            default: None,
            range: None,
            applies: OnReload,
            doc: "The local image new instances are created from: an alias, or a fingerprint \
                  (12 hex digits or more). The daemon never downloads an image; incus image \
                  list shows the ones there are.",
            example: "image = \"busybox\"",
        },
        Key {
            table: Group,
            name: "instance_prefix",
            kind: "string",
            default: d("the group's name and \"-\""),
            range: Some(format!(
                "1 to {} characters: a letter first, then letters, digits and \"-\"",
                63 - SUFFIX_LEN
            )),
            applies: OnReload,
            doc: "New instances are named with this prefix and 6 random characters. The name \
                  does not make an instance the group's: only instances the daemon created for \
                  the group are (the keys user.incus-hpa.group and user.incus-hpa.owner it sets \
                  on them).",
            example: "instance_prefix = \"web-\"",
        },
        Key {
            table: Group,
            name: "profiles",
            kind: "array of strings",
            default: d("[\"default\"]"),
            range: None,
            applies: OnReload,
            doc: "The profiles new instances are created with, in this order.",
            example: "profiles = [\"default\"]",
        },
        Key {
            table: Group,
            name: "project",
            kind: "string",
            default: d("\"default\""),
            range: Some(
                "an Incus project name: not empty, no \"/\", \"?\", \"&\", \"#\" or space".into(),
            ),
            applies: OnReload,
            doc: "The Incus project the group's instances live in. A group whose project changes \
                  is handled like a group removed from its old project: its instances there are \
                  left as they are.",
            example: "project = \"default\"",
        },
        Key {
            table: Group,
            name: "config",
            kind: "table of strings",
            default: d("{}"),
            range: None,
            applies: OnReload,
            doc: "Incus instance config for new instances, usually written as its own table \
                  [groups.NAME.config]; numbers and booleans are accepted and written as \
                  Incus expects. Set \"limits.memory\" here or in a profile: without a limit, an \
                  instance's use is measured against the host's whole memory (validate warns). \
                  Keys under user.incus-hpa., volatile. and image. are refused; so are keys that \
                  make a container root on the host (security.privileged = true, raw.*, \
                  linux.kernel_modules, some security.syscalls.intercept.*) unless \
                  allow_privileged = true.",
            example: "config = { \"limits.memory\" = \"256MiB\", \"limits.cpu\" = \"1\" }",
        },
        Key {
            table: Group,
            name: "policy",
            kind: "\"adaptive\" or \"kubernetes\"",
            default: d("\"adaptive\""),
            range: None,
            applies: OnReload,
            doc: "How the count follows memory. \"kubernetes\" is the Kubernetes HPA rule, \
                  exactly: ceil(n * utilization / threshold) over the n measured instances, no \
                  change within the tolerance, and Kubernetes' default scale-up rate unless step \
                  limits are set. \"adaptive\" sizes the group from an estimate of its demand: \
                  each instance's base use is learned, an instance at its limit at least doubles \
                  the count (held down by it, the count grows by 4, or triples if that is less), \
                  growth is carried one interval ahead (and while the demand rises \
                  through noise, the count is kept only with a margin of half its typical \
                  change between passes within the tolerance), how long a drop is held is \
                  learned from how the group's drops came back (never longer than \
                  scale_down_stabilization), a demand that held a level over the last hour \
                  gets no more than the count that would have cost least over its readings \
                  (incus-hpa status GROUP shows both), and an instance that reaches its memory \
                  limit, or a group that goes above its tolerance, between two passes wakes the \
                  next one at once, as does an instance the last pass added that reaches its \
                  limit too (read from its cgroup files on this host), rather than room \
                  being kept ahead of surges. Both stay within min, max, \
                  the stabilization windows and the step limits, and neither scales down on a \
                  missing reading.",
            example: "policy = \"adaptive\"",
        },
        Key {
            table: Group,
            name: "tolerance",
            kind: "number",
            default: d("0.1"),
            range: Some("0 up to, not including, 1".into()),
            applies: OnReload,
            doc: "Sets both tolerance_up and tolerance_down. For memory with policy = \
                  \"kubernetes\", and for CPU and external signals: no change while \
                  utilization / threshold is within 1 - tolerance_down and 1 + tolerance_up. \
                  For memory with \"adaptive\": only tolerance_up counts (see there), and \
                  how far above the threshold a group with an unmeasured instance must be \
                  before it grows.",
            example: "tolerance = 0.1",
        },
        Key {
            table: Group,
            name: "tolerance_up",
            kind: "number",
            default: d("tolerance"),
            range: Some("0 up to, not including, 1".into()),
            applies: OnReload,
            doc: "No scale-up while utilization / threshold is at most 1 + tolerance_up \
                  (Kubernetes 1.33 and later set each direction apart). With policy = \
                  \"adaptive\", for memory: the count is kept while every demand of the last \
                  minute stays within it (by half a typical change between passes while the \
                  demand rises through noise).",
            example: "tolerance_up = 0.1",
        },
        Key {
            table: Group,
            name: "tolerance_down",
            kind: "number",
            default: d("tolerance"),
            range: Some("0 up to, not including, 1".into()),
            applies: OnReload,
            doc: "No scale-down while utilization / threshold is at least 1 - tolerance_down. \
                  Not for memory with policy = \"adaptive\", which gives instances back as soon \
                  as the threshold asks for fewer (through its scale-down window).",
            example: "tolerance_down = 0.1",
        },
        Key {
            table: Group,
            name: "scale_down_stabilization",
            kind: "duration",
            default: d("\"5m\""),
            range: Some(format!("at most {}", h(DURATION_MAX))),
            applies: OnReload,
            doc: "A scale-down goes only as low as the highest recommendation of this window, so \
                  that a short dip does not remove instances. The adaptive policy holds a drop \
                  for as long as it learned from how the group's drops of the last hour came \
                  back, from 0 up to this window (a minute before it knows any).",
            example: "scale_down_stabilization = \"5m\"",
        },
        Key {
            table: Group,
            name: "scale_up_stabilization",
            kind: "duration",
            default: d("\"0s\""),
            range: Some(format!("at most {}", h(DURATION_MAX))),
            applies: OnReload,
            doc: "A scale-up goes only as high as the lowest recommendation of this window.",
            example: "scale_up_stabilization = \"0s\"",
        },
        Key {
            table: Group,
            name: "max_scale_up_step",
            kind: "integer",
            default: d("no limit"),
            range: Some("1 or more".into()),
            applies: OnReload,
            doc: "At most this many instances are added per interval, however many passes run; \
                  replacements count. Not applied when restoring min.",
            example: "max_scale_up_step = 2",
        },
        Key {
            table: Group,
            name: "max_scale_down_step",
            kind: "integer",
            default: d("no limit"),
            range: Some("1 or more".into()),
            applies: OnReload,
            doc: "At most this many instances are removed per interval: a gradual scale-down, \
                  however long the group was paused or could not act, down to a schedule \
                  window's max and after a window closes too. Every removal counts, whatever \
                  its reason, but the warm pool's. Restoring a max lowered in the file, and \
                  removing crash-looping or unhealthy instances, are not held back by it, but \
                  use it: no scale-down follows them within the interval.",
            example: "max_scale_down_step = 1",
        },
        Key {
            table: Group,
            name: "scale_down_order",
            kind: "\"newest\", \"oldest\" or \"least-memory\"",
            default: d("\"newest\""),
            range: None,
            applies: OnReload,
            doc: "Which healthy instances a scale-down removes first; stopped ones always go \
                  first, and instances a person protected (incus config set NAME \
                  user.incus-hpa.protected=true) never.",
            example: "scale_down_order = \"newest\"",
        },
        Key {
            table: Group,
            name: "stop_timeout",
            kind: "duration",
            default: d("\"30s\""),
            range: Some(format!("at most {}", h(STOP_TIMEOUT_MAX))),
            applies: OnReload,
            doc: "How long an instance being removed is given to stop gracefully before it is \
                  stopped by force and deleted. The bound keeps a removal in flight within the \
                  unit's TimeoutStopSec.",
            example: "stop_timeout = \"30s\"",
        },
        Key {
            table: Group,
            name: "drain_command",
            kind: "array of strings",
            default: d("none"),
            range: Some("a program first".into()),
            applies: OnReload,
            doc: "A command run inside an instance (incus exec, no shell unless you name one) \
                  before its graceful stop, to let its work finish. An instance protected \
                  (user.incus-hpa.protected=true) while it drains or stops is not removed: it \
                  is left running, or started again if the removal had stopped it.",
            example: "drain_command = [\"/bin/sh\", \"-c\", \"nginx -s quit\"]",
        },
        Key {
            table: Group,
            name: "drain_timeout",
            kind: "duration",
            default: d("\"30s\""),
            range: up_to(Duration::from_secs(1), DRAIN_TIMEOUT_MAX),
            applies: OnReload,
            doc: "How long the drain command may run; then the stop goes on.",
            example: "drain_timeout = \"30s\"",
        },
        Key {
            table: Group,
            name: "unhealthy_grace",
            kind: "duration",
            default: d("\"5m\""),
            range: Some(format!("at most {}", h(DURATION_MAX))),
            applies: OnReload,
            doc: "An unhealthy instance (in error, frozen, or stuck in a transition) is \
                  replaced at once and kept this long before it is removed, in case it recovers; \
                  frozen and in-transition instances are confirmed for 5 s first. An instance \
                  on a cluster member that does not answer still counts, unmeasured, and is \
                  replaced after this long.",
            example: "unhealthy_grace = \"5m\"",
        },
        Key {
            table: Group,
            name: "restart_backoff",
            kind: "duration",
            default: d("\"10s\""),
            range: up_to(Duration::from_millis(100), RESTART_BACKOFF_MAX),
            applies: OnReload,
            doc: "The first delay before a crash-looping instance is restarted, or a failed \
                  start tried again; it doubles each time, up to the top of the range.",
            example: "restart_backoff = \"10s\"",
        },
        Key {
            table: Group,
            name: "warm_pool",
            kind: "integer",
            default: d("0"),
            range: Some(format!("0 to {WARM_POOL_MAX}")),
            applies: OnReload,
            doc: "Stopped instances kept created and ready, beyond max; a scale-up starts them \
                  first and refills the pool after.",
            example: "warm_pool = 0",
        },
        Key {
            table: Group,
            name: "paused",
            kind: "boolean",
            default: d("false"),
            range: None,
            applies: OnReload,
            doc: "Observe, decide and report as usual, but create, start and delete nothing.",
            example: "paused = false",
        },
        Key {
            table: Group,
            name: "allow_privileged",
            kind: "boolean",
            default: d("false"),
            range: None,
            applies: OnReload,
            doc: "Accept config keys that make a container root on the host.",
            example: "allow_privileged = false",
        },
        Key {
            table: Group,
            name: "target",
            kind: "string",
            default: d(
                "none: the daemon picks the member with room that holds the fewest of the \
                 group's instances (Incus' scheduler when no member can be read)",
            ),
            range: Some(
                "a cluster member, or @ and a cluster group: letters, digits, \"-\", \"_\", \".\""
                    .into(),
            ),
            applies: OnReload,
            doc: "On an Incus cluster, where new instances go.",
            example: "target = \"@web-nodes\"",
        },
        Key {
            table: Group,
            name: "external",
            kind: "array of tables",
            default: d("none"),
            range: None,
            applies: OnReload,
            doc: "External signals, each a [[groups.NAME.external]] table; see EXTERNAL \
                  SIGNALS.",
            example: "external = []",
        },
        Key {
            table: Group,
            name: "schedule",
            kind: "array of tables",
            default: d("none"),
            range: None,
            applies: OnReload,
            doc: "Schedule windows, each a [[groups.NAME.schedule]] table; see SCHEDULES.",
            example: "schedule = []",
        },
        Key {
            table: Group,
            name: "ready",
            kind: "table",
            default: d("none: an instance is in service as soon as it runs"),
            range: None,
            applies: OnReload,
            doc: "When an instance is ready to take requests: a [groups.NAME.ready] table, see \
                  READINESS. Each running instance of the group is checked every period, from \
                  the daemon's host to its address on interface (an HTTP answer 2xx or 3xx, or \
                  a TCP connection), or by a command run inside it through Incus. Until its \
                  first check passes an instance is starting: it counts toward the group's \
                  count, so none is created in its place, but it is not in service and not \
                  measured: like an instance without a reading, it counts as idle when the group \
                  grows and holds a scale-down back. After failures checks in a row fail, a ready \
                  instance is out of service: unhealthy, replaced at once and removed after \
                  unhealthy_grace. An instance never ready within start_timeout of its start \
                  is a failed start: removed and replaced. The packaged unit reaches no \
                  network: checks on a port need the drop-in \
                  /usr/share/doc/incus-hpa/examples/ready-network.conf.",
            example: "ready = { port = 8080, path = \"/healthz\" }",
        },
        Key {
            table: Group,
            name: "endpoints",
            kind: "table",
            default: d("none: nothing is published"),
            range: None,
            applies: OnReload,
            doc: "Where the group's instances in service are published for a load balancer: a \
                  [groups.NAME.endpoints] table, see ENDPOINTS. An endpoint is an instance that \
                  runs, is ready (or has no ready table), has an address on the group's \
                  interface (ready.interface, else eth0) and is not being removed. A removal \
                  takes the instance out of the set and waits for command to succeed, then \
                  deregistration_delay, before it drains and stops the instance.",
            example: "endpoints = { port = 8080, command = [\"/usr/lib/incus-hpa/hooks/haproxy\", \"--backend\", \"web\"] }",
        },
        Key {
            table: External,
            name: "command",
            kind: "array of strings",
            default: None,
            range: Some("an absolute path first".into()),
            applies: OnReload,
            doc: "The program and its arguments, run directly (no shell, no PATH search) as \
                  the daemon's user, with a small environment and standard input closed, at \
                  most once per interval. It prints one number on standard output. The program \
                  must be owned by root and writable by no one else, like every directory on \
                  its path, and so must a script's #! interpreter; this is checked again before \
                  every run, on the file that then runs (a file put in its place is never run). \
                  A binary mode 0711 is accepted; a script must be readable, and reads itself as \
                  /dev/fd/N. A program that fails, runs out of time or prints anything but a \
                  number gives no reading, said once in the journal with what it wrote on \
                  standard error. The packaged unit allows no network: a program that needs it \
                  needs a drop-in (see /usr/share/doc/incus-hpa/docs/signals.md).",
            example: "command = [\"/usr/local/bin/queue-depth\", \"jobs\"]",
        },
        Key {
            table: External,
            name: "target",
            kind: "number",
            default: None,
            range: Some("above 0".into()),
            applies: OnReload,
            doc: "The value one instance can take: the signal wants ceil(value / target) \
                  instances, with the tolerance band around the count there is.",
            example: "target = 20",
        },
        Key {
            table: External,
            name: "timeout",
            kind: "duration",
            default: d("\"5s\""),
            range: up_to(Duration::from_millis(100), EXTERNAL_TIMEOUT_MAX),
            applies: OnReload,
            doc: "How long the program may run; then it is killed, with its children, and the \
                  signal has no reading. When it exits, or is killed, whatever it started is \
                  killed too, even processes that left its session.",
            example: "timeout = \"5s\"",
        },
        Key {
            table: Schedule,
            name: "cron",
            kind: "string",
            default: None,
            range: Some("five fields: minute hour day-of-month month day-of-week".into()),
            applies: OnReload,
            doc: "When the window opens, as a cron expression in the window's time zone.",
            example: "cron = \"0 8 * * 1-5\"",
        },
        Key {
            table: Schedule,
            name: "duration",
            kind: "duration",
            default: None,
            range: up_to(Duration::from_secs(60), WINDOW_MAX),
            applies: OnReload,
            doc: "How long the window stays open each time it opens (elapsed time, across a \
                  change of daylight saving time too).",
            example: "duration = \"10h\"",
        },
        Key {
            table: Schedule,
            name: "min",
            kind: "integer",
            default: d("the group's min"),
            range: Some("at most the window's max".into()),
            applies: OnReload,
            doc: "The group's min while the window is open (above the group's max, it raises \
                  the max with it). A window sets min, max or both.",
            example: "min = 4",
        },
        Key {
            table: Schedule,
            name: "max",
            kind: "integer",
            default: d("the group's max"),
            range: Some("1 or more".into()),
            applies: OnReload,
            doc: "The group's max while the window is open. A count above it goes down within \
                  max_scale_down_step, without the stabilization window.",
            example: "max = 12",
        },
        Key {
            table: Schedule,
            name: "timezone",
            kind: "string",
            default: d("the host's time zone"),
            range: Some("an IANA time zone name".into()),
            applies: OnReload,
            doc: "The time zone the cron expression is read in, such as \"Europe/Paris\".",
            example: "timezone = \"Europe/Paris\"",
        },
        Key {
            table: Ready,
            name: "port",
            kind: "integer",
            default: d("none; the table sets port or command"),
            range: Some("1 to 65535".into()),
            applies: OnReload,
            doc: "Check the instance over the network, from the daemon's host, on its address on \
                  interface: without path, the check passes when a TCP connection to this port \
                  opens; with path, it is an HTTP request (see path). Not with command.",
            example: "port = 8080",
        },
        Key {
            table: Ready,
            name: "path",
            kind: "string",
            default: d("none: a TCP check"),
            range: Some("a path from \"/\", without spaces or control characters".into()),
            applies: OnReload,
            doc: "Makes the check HTTP: GET http://ADDRESS:PORT/PATH, where ADDRESS is the \
                  instance's address on interface. An answer 2xx or 3xx within timeout passes; \
                  any other, or none, fails. Only with port.",
            example: "path = \"/healthz\"",
        },
        Key {
            table: Ready,
            name: "command",
            kind: "array of strings",
            default: d("none; the table sets port or command"),
            range: Some("an absolute path first".into()),
            applies: OnReload,
            doc: "Check the instance by running this program inside it, through Incus (as incus \
                  exec does: no shell unless you name one, no PATH search): exit status 0 within \
                  timeout passes. The path is the instance's, not looked at on the daemon's \
                  host. Not with port or path.",
            example: "command = [\"/usr/bin/pg_isready\", \"-q\"]",
        },
        Key {
            table: Ready,
            name: "period",
            kind: "duration",
            default: quoted(ready.period),
            range: up_to(PERIOD_MIN, PERIOD_MAX),
            applies: OnReload,
            doc: "How often each running instance of the group is checked, from its start on.",
            example: "period = \"2s\"",
        },
        Key {
            table: Ready,
            name: "timeout",
            kind: "duration",
            default: quoted(ready.timeout),
            range: Some("above 0 and below period".into()),
            applies: OnReload,
            doc: "How long one check may take; a check that has not passed by then fails.",
            example: "timeout = \"1s\"",
        },
        Key {
            table: Ready,
            name: "failures",
            kind: "integer",
            default: Some(ready.failures.to_string()),
            range: Some(format!("1 to {FAILURES_MAX}")),
            applies: OnReload,
            doc: "How many checks in a row must fail to take a ready instance out of service. It \
                  is then unhealthy, under the usual rules: replaced at once, and kept \
                  unhealthy_grace before it is removed, in case a check passes again. A frozen \
                  ready instance is not checked: each of its checks counts as failed, so a \
                  freeze shorter than failures checks (an incus copy or snapshot freezes its source \
                  for a moment) leaves it in service, and its endpoints published.",
            example: "failures = 3",
        },
        Key {
            table: Ready,
            name: "start_timeout",
            kind: "duration",
            default: quoted(ready.start_timeout),
            range: Some(format!("period to {}", h(PERIOD_MAX))),
            applies: OnReload,
            doc: "How long after its start an instance may take to pass its first check. One \
                  that is never ready within it is a failed start: removed and replaced \
                  (REASON never-ready).",
            example: "start_timeout = \"2m\"",
        },
        Key {
            table: Ready,
            name: "interface",
            kind: "string",
            default: Some(format!("\"{DEFAULT_INTERFACE}\"")),
            range: Some(format!(
                "a Linux interface name: 1 to {INTERFACE_MAX_LEN} ASCII characters, no \"/\", \
                 \":\" or spaces"
            )),
            applies: OnReload,
            doc: "The instance's network interface whose address a port check reaches: its first \
                  global IPv4 address, else its first global IPv6 address, as Incus reports it \
                  once the instance has started. An instance without one fails its port checks.",
            example: "interface = \"eth0\"",
        },
        Key {
            table: Endpoints,
            name: "port",
            kind: "integer",
            default: d("the ready table's port; required without one"),
            range: Some("1 to 65535".into()),
            applies: OnReload,
            doc: "The port each endpoint is published with: the port the instances take \
                  requests on.",
            example: "port = 8080",
        },
        Key {
            table: Endpoints,
            name: "command",
            kind: "array of strings",
            default: None,
            range: Some("an absolute path first".into()),
            applies: OnReload,
            doc: "The program that tells the load balancer, and its arguments, run on the \
                  daemon's host under the rules of an external signal's command (root's file \
                  in root's directories, no shell, no PATH search, a small environment), with \
                  the set as one line of JSON on its standard input (shown here with spaces, \
                  which the daemon does not write): {\"group\": \"web\", \"project\": \
                  \"default\", \"endpoints\": [{\"instance\": \"web-3kd9x2\", \"address\": \
                  \"10.98.0.12\", \"port\": 80}]}, endpoints sorted by instance. It \
                  runs when the set changes, when the daemon starts or takes the group over, \
                  and after a reload; only on the daemon that holds the group's lease. Exit \
                  status 0 is success; a failure is retried after 1s, doubling up to 1m, and \
                  logged once with its stderr, and again when it succeeds.",
            example: "command = [\"/usr/lib/incus-hpa/hooks/haproxy\", \"--backend\", \"web\"]",
        },
        Key {
            table: Endpoints,
            name: "timeout",
            kind: "duration",
            default: quoted(EndpointsSpec::TIMEOUT),
            range: up_to(ENDPOINTS_TIMEOUT_MIN, ENDPOINTS_TIMEOUT_MAX),
            applies: OnReload,
            doc: "How long one run of command may take; one that has not ended by then is \
                  killed with everything it started, and counts as failed. A removal waits at \
                  most twice this, and a second, for the set without its instance to be \
                  published; then the removal is held and tried again at a later pass.",
            example: "timeout = \"10s\"",
        },
        Key {
            table: Endpoints,
            name: "deregistration_delay",
            kind: "duration",
            default: quoted(EndpointsSpec::DEREGISTRATION_DELAY),
            range: Some(format!("at most {}", h(ENDPOINTS_DELAY_MAX))),
            applies: OnReload,
            doc: "How long a removed instance keeps running once the set without it is \
                  published, for the requests it still serves to end; then it is drained \
                  (drain_command) and stopped. An instance that was not in the set is removed \
                  without waiting.",
            example: "deregistration_delay = \"10s\"",
        },
    ]
}

/// The rules of a group's name, for the manual.
pub fn group_name_rule() -> String {
    format!(
        "lowercase letters, digits and \"-\", a letter first, at most {} characters",
        GroupName::MAX_LEN
    )
}

#[cfg(test)]
#[path = "keys_tests.rs"]
mod tests;
