//! The table of keys against the parser: every key read, every example valid.

use super::*;
use std::path::Path;

/// A group key whose value is a table of keys of its own, written as `[groups.web.NAME]` or
/// `[[groups.web.NAME]]`.
fn is_section(k: &Key) -> bool {
    matches!(k.kind, "array of tables" | "table")
}

/// The check of the `ready` table's examples: `port` (and path) or `command`, which exclude
/// each other.
#[derive(Clone, Copy, PartialEq)]
enum Check {
    Port,
    Command,
}

/// A file that sets every key to its example; with `tables`, one table of each array of
/// tables too, and a `ready` table with the `check` given.
fn every_key(tables: bool, check: Check) -> String {
    let mut text = String::from("[daemon]\n");
    for k in keys().iter().filter(|k| k.table == Table::Daemon) {
        text.push_str(k.example);
        text.push('\n');
    }
    text.push_str("\n[groups.web]\n");
    for k in keys()
        .iter()
        .filter(|k| k.table == Table::Group && !is_section(k))
    {
        text.push_str(k.example);
        text.push('\n');
    }
    if tables {
        for (table, name) in [(Table::External, "external"), (Table::Schedule, "schedule")] {
            text.push_str(&format!("\n[[groups.web.{name}]]\n"));
            for k in keys().iter().filter(|k| k.table == table) {
                text.push_str(k.example);
                text.push('\n');
            }
        }
        text.push_str("\n[groups.web.ready]\n");
        let other = match check {
            Check::Port => &["command"][..],
            Check::Command => &["port", "path"][..],
        };
        for k in keys()
            .iter()
            .filter(|k| k.table == Table::Ready && !other.contains(&k.name))
        {
            text.push_str(k.example);
            text.push('\n');
        }
        text.push_str("\n[groups.web.endpoints]\n");
        for k in keys().iter().filter(|k| k.table == Table::Endpoints) {
            text.push_str(k.example);
            text.push('\n');
        }
    }
    text
}

#[test]
fn every_example_is_valid_together() {
    for check in [Check::Port, Check::Command] {
        let text = every_key(true, check);
        let loaded = crate::config::parse(Path::new("keys"), &text)
            .unwrap_or_else(|e| panic!("{:#?}\n{text}", e.diagnostics));
        assert!(loaded.warnings.is_empty(), "{:#?}", loaded.warnings);
        let ready = loaded.state.groups.values().next().unwrap().ready.clone();
        assert!(ready.is_some(), "{text}");
    }
    // The examples of the sections' own keys, written inline.
    for k in keys()
        .iter()
        .filter(|k| k.table == Table::Group && is_section(k))
    {
        let text = every_key(false, Check::Port)
            .replace("[groups.web]\n", &format!("[groups.web]\n{}\n", k.example));
        let loaded = crate::config::parse(Path::new("keys"), &text)
            .unwrap_or_else(|e| panic!("{:#?}\n{text}", e.diagnostics));
        assert!(loaded.warnings.is_empty(), "{:#?}", loaded.warnings);
    }
}

/// Each key's value made the wrong type is reported under that key: the parser reads every
/// key of the table (a key only listed would be accepted and ignored).
#[test]
fn the_parser_reads_every_key_of_the_table() {
    for k in keys() {
        let wrong = if k.table == Table::Group && matches!(k.name, "config" | "ready" | "endpoints")
        {
            "\"a string\""
        } else {
            "{ wrong = 1 }"
        };
        let line = format!("{} = {wrong}", k.name);
        let text = if k.table == Table::Group && is_section(&k) {
            every_key(false, Check::Port)
                .replace("[groups.web]\n", &format!("[groups.web]\n{line}\n"))
        } else if k.table == Table::Ready && k.name == "command" {
            every_key(true, Check::Port).replace(
                "[groups.web.ready]\n",
                &format!("[groups.web.ready]\n{line}\n"),
            )
        } else {
            every_key(true, Check::Port)
                .replace(&format!("\n{}\n", k.example), &format!("\n{line}\n"))
        };
        assert!(text.contains(&line), "{}", k.name);
        let path = match k.table {
            Table::Daemon => format!("daemon.{}", k.name),
            Table::Group => format!("groups.web.{}", k.name),
            Table::External => format!("groups.web.external[0].{}", k.name),
            Table::Schedule => format!("groups.web.schedule[0].{}", k.name),
            Table::Ready => format!("groups.web.ready.{}", k.name),
            Table::Endpoints => format!("groups.web.endpoints.{}", k.name),
        };
        let e = crate::config::parse(Path::new("keys"), &text).unwrap_err();
        assert!(
            e.diagnostics.iter().any(|d| d.key == path),
            "{path} was not read: {:#?}",
            e.diagnostics
        );
    }
}

#[test]
fn names_are_unique_and_documented() {
    let all = keys();
    for (i, k) in all.iter().enumerate() {
        assert!(
            !all[..i]
                .iter()
                .any(|o| o.table == k.table && o.name == k.name),
            "{} twice",
            k.name
        );
        assert!(k.doc.ends_with('.'), "{}: {}", k.name, k.doc);
        assert!(k.example.starts_with(k.name), "{}", k.name);
    }
}

#[test]
fn ranges_are_said_in_words_the_file_accepts() {
    use std::time::Duration;
    // humantime alone says 31 days as "1month 13h 26m 24s" (its months are 30.44 days).
    assert_eq!(h(super::super::WINDOW_MAX), "31days");
    assert_eq!(h(Duration::from_secs(90)), "1m 30s");
    assert_eq!(h(Duration::from_secs(2 * 24 * 3600)), "2days");
    for k in keys() {
        if let Some(range) = &k.range {
            assert!(!range.contains("1month"), "{}: {range}", k.name);
        }
    }
    assert_eq!(
        humantime::parse_duration(&h(super::super::WINDOW_MAX)).unwrap(),
        super::super::WINDOW_MAX
    );
}
