//! The table of keys against the parser: every key read, every example valid.

use super::*;
use std::path::Path;

/// A file that sets every key to its example.
fn every_key() -> String {
    let mut text = String::from("[daemon]\n");
    for k in keys().iter().filter(|k| k.table == Table::Daemon) {
        text.push_str(k.example);
        text.push('\n');
    }
    text.push_str("\n[groups.web]\n");
    for k in keys().iter().filter(|k| k.table == Table::Group) {
        text.push_str(k.example);
        text.push('\n');
    }
    text
}

#[test]
fn every_example_is_valid_together() {
    let text = every_key();
    let loaded = crate::config::parse(Path::new("keys"), &text)
        .unwrap_or_else(|e| panic!("{:#?}\n{text}", e.diagnostics));
    assert!(loaded.warnings.is_empty(), "{:#?}", loaded.warnings);
}

/// Each key's value made the wrong type is reported under that key: the parser reads every
/// key of the table (a key only listed would be accepted and ignored).
#[test]
fn the_parser_reads_every_key_of_the_table() {
    for k in keys() {
        let wrong = if k.name == "config" {
            "\"a string\""
        } else {
            "{ wrong = 1 }"
        };
        let line = format!("{} = {wrong}", k.name);
        let text = every_key().replace(&format!("\n{}\n", k.example), &format!("\n{line}\n"));
        assert!(text.contains(&line), "{}", k.name);
        let path = match k.table {
            Table::Daemon => format!("daemon.{}", k.name),
            Table::Group => format!("groups.web.{}", k.name),
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
