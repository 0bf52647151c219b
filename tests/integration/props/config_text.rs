//! The desired-state parser: no panic on any text, and exactly the documented bounds.

use super::*;

// ---------------------------------------------------------------------------------------------
// 1. The desired-state parser
// ---------------------------------------------------------------------------------------------

const INTEGERS: &[&str] = &[
    "0",
    "-0",
    "+0",
    "-1",
    "1",
    "+1",
    "4294967295",
    "4294967296",
    "-4294967296",
    "9223372036854775807",
    "-9223372036854775808",
    "9223372036854775808",
    "99999999999999999999",
    "0x7fffffff",
    "0xffffffffffffffff",
    "0o17",
    "0b101",
    "1_000",
    "1__0",
    "01",
];

const FLOATS: &[&str] = &[
    "nan",
    "+nan",
    "-nan",
    "inf",
    "+inf",
    "-inf",
    "1e400",
    "-1e400",
    "1e-400",
    "0.0",
    "-0.0",
    "1.0",
    "100.0",
    "100.00000000000001",
    "0.99999999999999999",
    "0.9999999999999999",
    "1e2",
    "50.5",
    "0.1",
    "1.",
    ".5",
    "1_0.5",
];

/// Durations as written in the file: valid, at the bounds, out of them, overflowing, garbage.
const DURATIONS: &[&str] = &[
    "0s",
    "0",
    "1ns",
    "99ms",
    "100ms",
    "1s",
    "5s",
    "30s",
    "119s",
    "120s",
    "120s 1ns",
    "121s",
    "300s",
    "301s",
    "5m",
    "1h 30m",
    "24h",
    "24h 1ns",
    "86400s",
    "86401s",
    "25h",
    "1d",
    "2days",
    "100000years",
    "99999999999999999999s",
    "18446744073709551615s",
    "18446744073709551615ns",
    "18446744073709551616ns",
    "584542046090years",
    "9999999999999999999h",
    "1000000000000000000000000000000ms",
    "-5s",
    "- 5s",
    "+5s",
    "5",
    "5 s",
    " 5s",
    "5s ",
    "1.5s",
    "1e3s",
    "５s",
    "٥s",
    "5秒",
    "∞",
    "",
    "  ",
    "s",
    "5x",
    "1h1h1h",
];

const WORDS: &[&str] = &[
    "auto",
    "cgroup",
    "api",
    "AUTO",
    "busybox",
    "0123456789abcdef",
    "web-",
    "default",
    "a/b",
    "a b",
    "Ünïcödé",
    "true",
    "limits.memory",
];

/// Written as is: booleans, dates, literal and multi-line strings.
const OTHER_RAW: &[&str] = &[
    "true",
    "false",
    "1979-05-27T07:32:00Z",
    "1979-05-27",
    "07:32:00",
    "'5s'",
    "'''\n5s'''",
    "\"\"\"\n5s\n\"\"\"",
];

/// Broken values (a few, or they hide everything else behind syntax errors).
const BROKEN: &[&str] = &["\"unterminated", "[1, ", "{ a = 1", "", "= 1"];

const CONFIG_KEYS: &[&str] = &[
    "limits.memory",
    "limits.cpu",
    "security.privileged",
    "security.nesting",
    "raw.lxc",
    "linux.kernel_modules",
    "security.syscalls.intercept.mknod",
    "user.incus-hpa.group",
    "user.x",
    "volatile.uuid",
    "image.os",
    "boot.autostart",
    "",
];

/// A TOML basic string holding `s`.
fn quote(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => {
                out.push_str(&format!("\\u{:04X}", c as u32))
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn float_text(f: f64) -> String {
    if f.is_nan() {
        "nan".into()
    } else if f.is_infinite() {
        if f > 0.0 { "inf" } else { "-inf" }.into()
    } else {
        format!("{f:?}")
    }
}

/// A TOML value, as source text to write.
#[derive(Debug, Clone)]
enum Tv {
    /// Written as is: a number, a boolean, a date, or something invalid on purpose.
    Raw(String),
    /// A basic string, escaped.
    Str(String),
    Array(Vec<Tv>),
    /// An inline table.
    Table(Vec<(String, Tv)>),
}

impl Tv {
    fn render(&self) -> String {
        match self {
            Tv::Raw(s) => s.clone(),
            Tv::Str(s) => quote(s),
            Tv::Array(items) => {
                let items: Vec<_> = items.iter().map(Tv::render).collect();
                format!("[{}]", items.join(", "))
            }
            Tv::Table(entries) => {
                let entries: Vec<_> = entries
                    .iter()
                    .map(|(k, v)| format!("{} = {}", quote(k), v.render()))
                    .collect();
                format!("{{ {} }}", entries.join(", "))
            }
        }
    }
}

fn integer() -> BoxedStrategy<String> {
    prop_oneof![
        2 => any::<i64>().prop_map(|n| n.to_string()),
        2 => (0i64..12).prop_map(|n| n.to_string()),
        1 => select_str(INTEGERS),
    ]
    .boxed()
}

fn float() -> BoxedStrategy<String> {
    prop_oneof![
        2 => any::<f64>().prop_map(float_text),
        2 => (0.0f64..=120.0).prop_map(float_text),
        1 => select_str(FLOATS),
    ]
    .boxed()
}

fn text() -> BoxedStrategy<String> {
    prop_oneof![
        select_str(DURATIONS),
        select_str(WORDS),
        "\\PC{0,12}",
        any::<String>(),
    ]
    .boxed()
}

fn config_key() -> BoxedStrategy<String> {
    prop_oneof![3 => select_str(CONFIG_KEYS), 1 => "\\PC{0,8}"].boxed()
}

/// Any TOML value: scalars of every type, arrays (mixed too) and inline tables, nested.
fn toml_value() -> BoxedStrategy<String> {
    let leaf = prop_oneof![
        4 => integer().prop_map(Tv::Raw),
        4 => float().prop_map(Tv::Raw),
        4 => text().prop_map(Tv::Str),
        4 => select_str(OTHER_RAW).prop_map(Tv::Raw),
        1 => select_str(BROKEN).prop_map(Tv::Raw),
    ];
    leaf.prop_recursive(2, 12, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Tv::Array),
            // Distinct keys: a duplicate is a syntax error that hides everything else.
            prop::collection::btree_map(config_key(), inner, 0..4)
                .prop_map(|m| Tv::Table(m.into_iter().collect())),
        ]
    })
    .prop_map(|v| v.render())
    .boxed()
}

/// A duration string from 0 up to `max_secs`, at the bounds included.
fn duration_upto(max_secs: u64) -> BoxedStrategy<String> {
    prop_oneof![
        select_str(&["\"0s\"", "\"1s\"", "\"1m 30s\"", "\"100ms\""]),
        Just(format!("\"{max_secs}s\"")),
        (0..=max_secs).prop_map(|s| format!("\"{s}s\"")),
    ]
    .boxed()
}

/// A value that `key` accepts (mostly: min may exceed max, and a privileged config key needs
/// `allow_privileged`).
fn good(key: &str) -> BoxedStrategy<String> {
    match key {
        "min" => (0u32..6).prop_map(|n| n.to_string()).boxed(),
        "max" => prop_oneof![
            8 => (1u32..12).prop_map(|n| n.to_string()),
            1 => Just("4294967295".to_owned()),
        ]
        .boxed(),
        "memory_threshold" | "cpu_threshold" | "pressure_threshold" => prop_oneof![
            (1u32..=100).prop_map(|n| n.to_string()),
            (1.0f64..=100.0).prop_map(float_text),
            select_str(&["1", "100", "1.0", "100.0", "1e2"]),
        ]
        .boxed(),
        "tolerance" | "tolerance_up" | "tolerance_down" => prop_oneof![
            (0.0f64..1.0).prop_map(float_text),
            select_str(&["0", "0.0", "0.1", "0.999"]),
        ]
        .boxed(),
        "image" => select_str(&[
            "\"busybox\"",
            "\"0123456789abcdef\"",
            "\"images:debian/12\"",
        ]),
        "instance_prefix" => prop_oneof![
            select_str(&["\"web-\"", "\"a\"", "\"A1-\""]),
            Just(quote(&"p".repeat(57))),
        ]
        .boxed(),
        "profiles" => select_str(&["[]", "[\"default\"]", "[\"default\", \"big\"]"]),
        "project" => select_str(&["\"default\"", "\"staging\""]),
        "config" => select_str(&[
            "{}",
            "{ \"limits.memory\" = \"64MiB\" }",
            "{ \"limits.cpu\" = 2, \"boot.autostart\" = true }",
            "{ \"limits.memory\" = \"1GiB\", \"security.nesting\" = \"true\" }",
            "{ \"security.privileged\" = \"true\" }",
            "{ \"raw.lxc\" = \"lxc.apparmor.profile=unconfined\" }",
        ]),
        "scale_down_stabilization" | "scale_up_stabilization" | "unhealthy_grace" => {
            duration_upto(DURATION_MAX.as_secs())
        }
        "stop_timeout" => duration_upto(STOP_TIMEOUT_MAX.as_secs()),
        "restart_backoff" => prop_oneof![
            select_str(&["\"100ms\"", "\"10s\"", "\"300s\"", "\"5m\""]),
            (100u64..=300_000).prop_map(|ms| format!("\"{ms}ms\"")),
        ]
        .boxed(),
        "max_scale_up_step" | "max_scale_down_step" => {
            (1u32..6).prop_map(|n| n.to_string()).boxed()
        }
        "allow_privileged" | "paused" => select_str(&["true", "false"]),
        "scale_down_order" => select_str(&["\"newest\"", "\"oldest\"", "\"least-memory\""]),
        "policy" => select_str(&["\"kubernetes\""]),
        "drain_command" => select_str(&["[\"/bin/sh\", \"-c\", \"sleep 1\"]", "[\"true\"]"]),
        "drain_timeout" => select_str(&["\"1s\"", "\"30s\"", "\"5m\""]),
        "target" => select_str(&["\"m1\"", "\"@web-nodes\""]),
        "external" => select_str(&[
            "[]",
            "[{ command = [\"/usr/local/bin/depth\"], target = 5 }]",
            "[{ command = [\"/bin/q\", \"x\"], target = 0.5, timeout = \"1s\" }]",
        ]),
        "schedule" => select_str(&[
            "[]",
            "[{ cron = \"0 8 * * 1-5\", duration = \"10h\", min = 1 }]",
            "[{ cron = \"*/5 * * * *\", duration = \"1m\", max = 3, timezone = \"UTC\" }]",
        ]),
        "ready" => select_str(&[
            "{ port = 8080 }",
            "{ port = 80, path = \"/healthz\", period = \"5s\", failures = 1 }",
            "{ command = [\"/bin/true\"], timeout = \"500ms\", interface = \"enp5s0\" }",
        ]),
        "endpoints" => select_str(&[
            "{ port = 80, command = [\"/usr/lib/incus-hpa/hooks/haproxy\"] }",
            "{ port = 8080, command = [\"/bin/hook\", \"web\"], timeout = \"2s\", \
             deregistration_delay = \"0s\" }",
        ]),
        "warm_pool" => (0u32..=config::WARM_POOL_MAX)
            .prop_map(|n| n.to_string())
            .boxed(),
        other => unreachable!("no good value for {other}"),
    }
}

/// A value for `key`: often a good one, else anything (any type, any duration string).
fn messy(key: &'static str) -> BoxedStrategy<String> {
    prop_oneof![
        3 => good(key),
        2 => toml_value(),
        1 => select_str(DURATIONS).prop_map(|d| quote(&d)),
    ]
    .boxed()
}

fn valid_group_name() -> BoxedStrategy<String> {
    prop_oneof![
        6 => select_str(&["web", "api", "db", "w-1", "a"]),
        1 => Just("a".repeat(40)),
        1 => "[a-z][a-z0-9-]{0,6}",
    ]
    .boxed()
}

fn group_name() -> BoxedStrategy<String> {
    prop_oneof![
        3 => valid_group_name(),
        2 => select_str(&["", "Web", "9x", "-a", "a_b", "ü", "a.b", "web "]),
        1 => Just("a".repeat(41)),
        1 => "\\PC{0,6}",
    ]
    .boxed()
}

/// `[groups.NAME]`: its keys (in any order) and an optional `[groups.NAME.config]` section.
#[derive(Debug, Clone)]
struct GroupText {
    name: String,
    entries: Vec<(String, String)>,
    config_section: Option<Vec<(String, String)>>,
}

/// A clean group has a valid name, every required key and only accepted values (mostly: see
/// [`good`]); a messy one has anything anywhere.
fn group_text(clean: bool) -> BoxedStrategy<GroupText> {
    let name = if clean {
        valid_group_name()
    } else {
        group_name()
    };
    name.prop_flat_map(move |name| {
        let entries: Vec<BoxedStrategy<Option<(String, String)>>> = config::group_keys()
            .iter()
            // cpu_threshold needs a CPU limit in the config: only messy groups have it.
            .filter(|&&k| !clean || k != "cpu_threshold")
            .map(|&k| {
                let value = if clean { good(k) } else { messy(k) };
                let entry = value.prop_map(move |v| (format!("{k} = "), v));
                if clean && matches!(k, "max" | "memory_threshold" | "image") {
                    entry.prop_map(Some).boxed()
                } else {
                    prop::option::weighted(if clean { 0.4 } else { 0.6 }, entry).boxed()
                }
            })
            .collect();
        let unknown = if clean {
            Just(None).boxed()
        } else {
            prop::option::weighted(
                0.2,
                (config_key(), toml_value()).prop_map(|(k, v)| (format!("{} = ", quote(&k)), v)),
            )
            .boxed()
        };
        let section = if clean {
            prop::option::weighted(
                0.3,
                Just(vec![("limits.memory".to_owned(), "\"128MiB\"".to_owned())]),
            )
            .boxed()
        } else {
            prop::option::weighted(
                0.3,
                prop::collection::btree_map(config_key(), toml_value(), 0..3)
                    .prop_map(|m| m.into_iter().collect()),
            )
            .boxed()
        };
        (Just(name), entries, unknown, section)
    })
    .prop_flat_map(|(name, entries, unknown, config_section)| {
        let entries: Vec<_> = entries.into_iter().flatten().chain(unknown).collect();
        (
            Just(name),
            Just(entries).prop_shuffle(),
            Just(config_section),
        )
    })
    .prop_map(|(name, entries, config_section)| GroupText {
        name,
        entries,
        config_section,
    })
    .boxed()
}

/// A whole desired-state file.
#[derive(Debug, Clone)]
struct DocText {
    prelude: Option<String>,
    daemon: Option<Vec<(String, String)>>,
    groups: Vec<GroupText>,
    crlf: bool,
}

impl DocText {
    fn render(&self) -> String {
        let mut lines: Vec<String> = Vec::new();
        lines.extend(self.prelude.clone());
        if let Some(daemon) = &self.daemon {
            lines.push("[daemon]".into());
            lines.extend(daemon.iter().map(|(k, v)| format!("{k}{v}")));
        }
        for g in &self.groups {
            lines.push(String::new());
            lines.push(format!("[groups.{}]", quote(&g.name)));
            lines.extend(g.entries.iter().map(|(k, v)| format!("{k}{v}")));
            if let Some(section) = &g.config_section {
                lines.push(format!("[groups.{}.config]", quote(&g.name)));
                lines.extend(section.iter().map(|(k, v)| format!("{} = {v}", quote(k))));
            }
        }
        let sep = if self.crlf { "\r\n" } else { "\n" };
        let mut text = lines.join(sep);
        text.push_str(sep);
        text
    }
}

fn daemon_text(clean: bool) -> BoxedStrategy<Vec<(String, String)>> {
    let good_interval = select_str(&[
        "\"100ms\"",
        "\"5s\"",
        "\"15s\"",
        "\"24h\"",
        "\"86400s\"",
        "\"1h 30m\"",
    ]);
    let good_source = select_str(&["\"auto\"", "\"cgroup\"", "\"api\""]);
    let (interval, source) = if clean {
        (good_interval, good_source)
    } else {
        (
            prop_oneof![
                2 => good_interval,
                1 => select_str(DURATIONS).prop_map(|d| quote(&d)),
                1 => toml_value(),
            ]
            .boxed(),
            prop_oneof![2 => good_source, 1 => toml_value()].boxed(),
        )
    };
    let unknown = if clean {
        Just(None).boxed()
    } else {
        prop::option::weighted(
            0.2,
            (config_key(), toml_value()).prop_map(|(k, v)| (format!("{} = ", quote(&k)), v)),
        )
        .boxed()
    };
    (
        prop::option::weighted(0.7, interval.prop_map(|v| ("interval = ".to_owned(), v))),
        prop::option::weighted(0.5, source.prop_map(|v| ("memory_source = ".to_owned(), v))),
        unknown,
    )
        .prop_map(|(a, b, c)| a.into_iter().chain(b).chain(c).collect())
        .boxed()
}

/// A file made only of clean parts (valid, mostly), or of parts of any kind.
fn doc_text() -> BoxedStrategy<DocText> {
    prop_oneof![clean_doc(), messy_doc()].boxed()
}

fn clean_doc() -> BoxedStrategy<DocText> {
    (
        prop::option::weighted(0.6, daemon_text(true)),
        prop::collection::vec(group_text(true), 0..=3),
        any::<bool>(),
    )
        .prop_map(|(daemon, mut groups, crlf)| {
            // One table per name (a second `[groups.web]` is invalid TOML).
            let mut seen = BTreeSet::new();
            groups.retain(|g| seen.insert(g.name.clone()));
            DocText {
                prelude: None,
                daemon,
                groups,
                crlf,
            }
        })
        .boxed()
}

fn messy_doc() -> BoxedStrategy<DocText> {
    let prelude = prop::option::weighted(
        0.2,
        select_str(&[
            "groups = 5",
            "daemon = 1",
            "daemon = []",
            "x = 1",
            "groups = {}",
            "[groups]",
            "# a comment",
            "\u{feff}",
        ]),
    );
    (
        prelude,
        prop::option::weighted(0.6, daemon_text(false)),
        prop::collection::vec(prop::bool::ANY.prop_flat_map(group_text), 0..=3),
        any::<bool>(),
    )
        .prop_map(|(prelude, daemon, groups, crlf)| DocText {
            prelude,
            daemon,
            groups,
            crlf,
        })
        .boxed()
}

/// Parses `text` and checks what comes back: every diagnostic placed within the text and
/// shown with the file first; a valid state within every documented bound. Says whether the
/// text was accepted.
fn check_parse(text: &str) -> Result<bool, TestCaseError> {
    let path = Path::new(FILE);
    let result = config::parse(path, text);
    let diagnostics = match &result {
        Ok(l) => &l.warnings,
        Err(e) => &e.diagnostics,
    };
    // Lines as `line_col` counts them: separated by '\n' only.
    let lines: Vec<&str> = text.split('\n').collect();
    for d in diagnostics {
        let shown = d.to_string();
        prop_assert!(shown.starts_with(FILE), "{shown:?}");
        prop_assert_eq!(d.file.as_path(), path);
        if d.line > 0 {
            prop_assert!(
                d.line <= text.lines().count() + 1,
                "line {} of a {}-line text: {shown}",
                d.line,
                text.lines().count()
            );
            prop_assert!(d.line <= lines.len(), "{shown}");
            let width = lines[d.line - 1].chars().count();
            prop_assert!(
                d.column >= 1 && d.column <= width + 1,
                "column {} of a {width}-character line: {shown}",
                d.column
            );
        }
    }
    let accepted = result.is_ok();
    match result {
        Ok(loaded) => {
            prop_assert!(
                loaded
                    .warnings
                    .iter()
                    .all(|d| d.severity == Severity::Warning),
                "{:?}",
                loaded.warnings
            );
            check_state(&loaded.state)?;
        }
        Err(e) => {
            prop_assert_eq!(e.file.as_path(), path);
            prop_assert!(
                e.diagnostics.iter().any(|d| d.severity == Severity::Error),
                "refused without an error: {:?}",
                e.diagnostics
            );
        }
    }
    Ok(accepted)
}

fn check_state(state: &DesiredState) -> Result<(), TestCaseError> {
    let interval = state.daemon.interval;
    prop_assert!(
        interval >= Duration::from_millis(100) && interval <= DURATION_MAX,
        "interval {interval:?}"
    );
    for (name, g) in &state.groups {
        prop_assert_eq!(name, &g.name);
        prop_assert!(GroupName::parse(name.as_str()).is_ok(), "{name}");
        prop_assert!(g.min <= g.max, "min {} > max {}", g.min, g.max);
        prop_assert!(g.max >= 1, "max {}", g.max);
        prop_assert!(g.max <= incus_hpa::model::MAX_INSTANCES, "max {}", g.max);
        prop_assert!(
            g.warm_pool <= config::WARM_POOL_MAX,
            "warm_pool {}",
            g.warm_pool
        );
        prop_assert_eq!(g.interval, interval, "the daemon's interval");
        for (key, v) in [
            ("memory_threshold", g.memory_threshold),
            ("cpu_threshold", g.cpu_threshold),
            ("pressure_threshold", g.pressure_threshold),
        ] {
            prop_assert!(
                v.is_none_or(|v| (1.0..=100.0).contains(&v)),
                "{} {:?}",
                key,
                v
            );
        }
        prop_assert!(
            g.memory_threshold.is_some()
                || g.cpu_threshold.is_some()
                || g.pressure_threshold.is_some()
                || !g.external.is_empty(),
            "a group without a signal"
        );
        for (key, v) in [
            ("tolerance_up", g.tolerance_up),
            ("tolerance_down", g.tolerance_down),
        ] {
            prop_assert!((0.0..1.0).contains(&v), "{} {}", key, v);
        }
        for (key, d) in [
            ("scale_down_stabilization", g.scale_down_stabilization),
            ("scale_up_stabilization", g.scale_up_stabilization),
            ("unhealthy_grace", g.unhealthy_grace),
        ] {
            prop_assert!(d <= DURATION_MAX, "{key} {d:?}");
        }
        prop_assert!(
            g.stop_timeout <= STOP_TIMEOUT_MAX,
            "stop_timeout {:?}",
            g.stop_timeout
        );
        prop_assert!(
            g.restart_backoff >= Duration::from_millis(100)
                && g.restart_backoff <= RESTART_BACKOFF_MAX,
            "restart_backoff {:?}",
            g.restart_backoff
        );
        prop_assert!(g.max_scale_up_step.is_none_or(|s| s >= 1));
        prop_assert!(g.max_scale_down_step.is_none_or(|s| s >= 1));
        prop_assert_eq!(g.interval, interval);
        prop_assert!(!g.image.trim().is_empty());
        let p = &g.instance_prefix;
        prop_assert!(
            (1..=57).contains(&p.len())
                && p.starts_with(|c: char| c.is_ascii_alphabetic())
                && p.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'),
            "instance_prefix {p:?}"
        );
        prop_assert!(g.profiles.iter().all(|p| !p.trim().is_empty()));
        prop_assert!(
            !g.project.trim().is_empty() && !g.project.contains(['/', '?', '&', '#', ' '])
        );
        for key in g.config.keys() {
            prop_assert!(
                !key.starts_with("user.incus-hpa.")
                    && !key.starts_with("volatile.")
                    && !key.starts_with("image."),
                "config key {key:?}"
            );
        }
    }
    Ok(())
}

proptest! {
    #[test]
    fn config_parse_survives_any_string(text in any::<String>()) {
        check_parse(&text)?;
    }

    #[test]
    fn config_parse_survives_printable_and_toml_like_text(
        text in prop_oneof!["\\PC*", "[\\[\\]{}=\"'.,a-z0-9 \n\r\t#_+-]{0,80}"]
    ) {
        check_parse(&text)?;
    }

    #[test]
    fn config_parse_keeps_its_bounds_on_structured_toml(doc in doc_text()) {
        check_parse(&doc.render())?;
    }
}

/// Values at and just beyond the documented bounds, and whether the parser must accept each:
/// (key, value as written, accepted). `<name>` is the group's name, `<interval>` the daemon's,
/// `<privileged>` a privileged config key with `allow_privileged = true`.
const BOUNDS: &[(&str, &str, bool)] = &[
    ("<name>", "a", true),
    ("<name>", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", true),
    ("<name>", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", false),
    ("<name>", "", false),
    ("<name>", "1a", false),
    ("<name>", "a_b", false),
    ("<name>", "Web", false),
    ("<interval>", "\"100ms\"", true),
    ("<interval>", "\"99ms\"", false),
    ("<interval>", "\"24h\"", true),
    ("<interval>", "\"24h 1ns\"", false),
    ("<interval>", "\"0s\"", false),
    ("<interval>", "15", false),
    ("min", "0", true),
    ("min", "1", true),
    ("min", "13", false),
    ("min", "-1", false),
    ("min", "4294967296", false),
    ("min", "1.0", false),
    ("min", "\"1\"", false),
    ("max", "0", false),
    ("max", "12", true),
    ("max", "10000", true),
    ("max", "10001", false),
    ("max", "4294967295", false),
    ("max", "4294967296", false),
    ("max", "-1", false),
    ("max", "9223372036854775807", false),
    ("memory_threshold", "1", true),
    ("memory_threshold", "1.0", true),
    ("memory_threshold", "100", true),
    ("memory_threshold", "100.0", true),
    ("memory_threshold", "1e2", true),
    ("memory_threshold", "0.999", false),
    ("memory_threshold", "100.001", false),
    ("memory_threshold", "0", false),
    ("memory_threshold", "-50", false),
    ("memory_threshold", "nan", false),
    ("memory_threshold", "inf", false),
    ("memory_threshold", "1e400", false),
    ("memory_threshold", "\"50\"", false),
    ("pressure_threshold", "1", true),
    ("pressure_threshold", "100", true),
    ("pressure_threshold", "0.5", false),
    ("pressure_threshold", "101", false),
    ("tolerance_up", "0.999", true),
    ("tolerance_up", "1", false),
    ("tolerance_down", "0", true),
    ("tolerance_down", "-0.1", false),
    (
        "external",
        "[{ command = [\"/bin/q\"], target = 0.001 }]",
        true,
    ),
    (
        "external",
        "[{ command = [\"/bin/q\"], target = 0 }]",
        false,
    ),
    ("external", "[{ command = [\"q\"], target = 1 }]", false),
    ("external", "[{ command = [], target = 1 }]", false),
    (
        "external",
        "[{ command = [\"/bin/q\"], target = 1, timeout = \"60s\" }]",
        true,
    ),
    (
        "external",
        "[{ command = [\"/bin/q\"], target = 1, timeout = \"61s\" }]",
        false,
    ),
    (
        "external",
        "[{ command = [\"/bin/q\"], target = 1, other = 1 }]",
        false,
    ),
    (
        "schedule",
        "[{ cron = \"0 8 * * *\", duration = \"1m\", min = 1 }]",
        true,
    ),
    (
        "schedule",
        "[{ cron = \"0 8 * * *\", duration = \"59s\", min = 1 }]",
        false,
    ),
    (
        "schedule",
        "[{ cron = \"0 8 * *\", duration = \"1h\", min = 1 }]",
        false,
    ),
    (
        "schedule",
        "[{ cron = \"0 8 * * *\", duration = \"1h\" }]",
        false,
    ),
    (
        "schedule",
        "[{ cron = \"0 8 * * *\", duration = \"1h\", min = 3, max = 2 }]",
        false,
    ),
    ("tolerance", "0", true),
    ("tolerance", "0.0", true),
    ("tolerance", "-0.0", true),
    ("tolerance", "0.999999", true),
    ("tolerance", "1", false),
    ("tolerance", "1.0", false),
    ("tolerance", "-0.001", false),
    ("tolerance", "nan", false),
    ("tolerance", "-inf", false),
    ("scale_down_stabilization", "\"0s\"", true),
    ("scale_down_stabilization", "\"24h\"", true),
    ("scale_down_stabilization", "\"86400s\"", true),
    ("scale_down_stabilization", "\"24h 1ns\"", false),
    ("scale_down_stabilization", "\"100000years\"", false),
    (
        "scale_down_stabilization",
        "\"99999999999999999999s\"",
        false,
    ),
    ("scale_down_stabilization", "\"-1s\"", false),
    ("scale_down_stabilization", "300", false),
    ("scale_up_stabilization", "\"24h\"", true),
    ("scale_up_stabilization", "\"24h 1ns\"", false),
    ("unhealthy_grace", "\"0s\"", true),
    ("unhealthy_grace", "\"24h\"", true),
    ("unhealthy_grace", "\"24h 1ns\"", false),
    ("stop_timeout", "\"0s\"", true),
    ("stop_timeout", "\"120s\"", true),
    ("stop_timeout", "\"2m\"", true),
    ("stop_timeout", "\"120s 1ns\"", false),
    ("stop_timeout", "\"24h\"", false),
    ("warm_pool", "0", true),
    ("warm_pool", "100", true),
    ("warm_pool", "101", false),
    ("warm_pool", "-1", false),
    ("restart_backoff", "\"100ms\"", true),
    ("restart_backoff", "\"99ms\"", false),
    ("restart_backoff", "\"0s\"", false),
    ("restart_backoff", "\"300s\"", true),
    ("restart_backoff", "\"5m\"", true),
    ("restart_backoff", "\"300s 1ns\"", false),
    ("max_scale_up_step", "1", true),
    ("max_scale_up_step", "4294967295", true),
    ("max_scale_up_step", "0", false),
    ("max_scale_up_step", "4294967296", false),
    ("max_scale_down_step", "1", true),
    ("max_scale_down_step", "0", false),
    ("max_scale_down_step", "-1", false),
    ("image", "\"x\"", true),
    ("image", "\"\"", false),
    ("image", "\" \"", false),
    ("image", "1", false),
    (
        "instance_prefix",
        "\"ppppppppppppppppppppppppppppppppppppppppppppppppppppppppp\"",
        true,
    ),
    (
        "instance_prefix",
        "\"pppppppppppppppppppppppppppppppppppppppppppppppppppppppppp\"",
        false,
    ),
    ("instance_prefix", "\"\"", false),
    ("instance_prefix", "\"-a\"", false),
    ("instance_prefix", "\"a_b\"", false),
    ("project", "\"x\"", true),
    ("project", "\"\"", false),
    ("project", "\"a/b\"", false),
    ("project", "\"a b\"", false),
    ("profiles", "[]", true),
    ("profiles", "[\"\"]", false),
    ("profiles", "[1]", false),
    ("profiles", "\"default\"", false),
    ("config", "{ \"limits.cpu\" = 2 }", true),
    ("config", "{ \"limits.cpu\" = 1.5 }", false),
    ("config", "{ \"security.privileged\" = \"true\" }", false),
    ("config", "{ \"security.privileged\" = \"false\" }", true),
    ("config", "{ \"raw.lxc\" = \"\" }", false),
    ("config", "{ \"volatile.uuid\" = \"x\" }", false),
    ("config", "{ \"image.os\" = \"x\" }", false),
    ("config", "{ \"user.incus-hpa.group\" = \"web\" }", false),
    ("config", "[]", false),
    (
        "<privileged>",
        "{ \"security.privileged\" = \"true\" }",
        true,
    ),
    ("allow_privileged", "1", false),
    ("paused", "true", true),
    ("paused", "\"true\"", false),
    ("scale_down_order", "\"least-memory\"", true),
    ("scale_down_order", "\"largest\"", false),
    ("policy", "\"kubernetes\"", true),
    ("policy", "\"hpa\"", false),
    ("drain_command", "[]", false),
    ("drain_command", "[\"/bin/true\"]", true),
    ("drain_timeout", "\"5m\"", true),
    ("drain_timeout", "\"6m\"", false),
    ("drain_timeout", "\"0s\"", false),
    ("unknown_key", "1", false),
];

/// A group every value of which is accepted, as key → value text.
fn valid_group() -> BoxedStrategy<BTreeMap<&'static str, String>> {
    let others: Vec<BoxedStrategy<Option<(&'static str, String)>>> = config::group_keys()
        .iter()
        .filter(|k| !matches!(**k, "min" | "max" | "config" | "cpu_threshold"))
        .map(|&k| {
            let entry = good(k).prop_map(move |v| (k, v));
            if matches!(k, "memory_threshold" | "image") {
                entry.prop_map(Some).boxed()
            } else {
                prop::option::of(entry).boxed()
            }
        })
        .collect();
    let config = prop::option::of(
        select_str(&[
            "{}",
            "{ \"limits.memory\" = \"64MiB\" }",
            "{ \"limits.cpu\" = 2, \"boot.autostart\" = true }",
        ])
        .prop_map(|v| ("config", v)),
    );
    (1u32..12)
        .prop_flat_map(|max| (Just(max), 0..=max.min(5)))
        .prop_flat_map(move |(max, min)| (Just(max), Just(min), others.clone(), config.clone()))
        .prop_map(|(max, min, others, config)| {
            let mut g: BTreeMap<&'static str, String> = others.into_iter().flatten().collect();
            g.extend(config);
            g.insert("max", max.to_string());
            g.insert("min", min.to_string());
            g
        })
        .boxed()
}

proptest! {
    // Every case parses every bound: fewer cases.
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// A valid file with one value set at or just beyond its bound: accepted exactly when the
    /// bound allows it (every bound, on each random valid file).
    #[test]
    fn config_accepts_exactly_the_documented_bounds(
        group in valid_group(),
        name in valid_group_name(),
    ) {
        for &(key, value, accepted) in BOUNDS {
            let (mut group, mut name, mut interval) = (group.clone(), name.clone(), "\"15s\"");
            match key {
                "<name>" => name = value.to_owned(),
                "<interval>" => interval = value,
                "<privileged>" => {
                    group.insert("config", value.to_owned());
                    group.insert("allow_privileged", "true".to_owned());
                }
                "config" => {
                    group.insert("config", value.to_owned());
                    group.insert("allow_privileged", "false".to_owned());
                }
                k => {
                    group.insert(k, value.to_owned());
                }
            }
            let mut text =
                format!("[daemon]\ninterval = {interval}\n\n[groups.{}]\n", quote(&name));
            for (k, v) in &group {
                text.push_str(&format!("{k} = {v}\n"));
            }
            prop_assert_eq!(check_parse(&text)?, accepted, "{} = {}\n{}", key, value, text);
        }
    }
}

/// The structured strategy must reach both outcomes, or the invariants of one go untested.
#[test]
fn structured_toml_is_valid_often_enough_to_matter() {
    let mut runner = TestRunner::deterministic();
    let strategy = doc_text();
    let (mut valid, mut invalid) = (0, 0);
    for _ in 0..300 {
        let doc = strategy.new_tree(&mut runner).unwrap().current();
        match config::parse(Path::new(FILE), &doc.render()) {
            Ok(l) if !l.state.groups.is_empty() => valid += 1,
            Ok(_) => {}
            Err(_) => invalid += 1,
        }
    }
    assert!(
        valid >= 30 && invalid >= 30,
        "{valid} valid files with groups and {invalid} invalid ones out of 300"
    );
}
