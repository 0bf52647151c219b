//! The pages against what they document: every flag of every command, every key, every
//! reason; and the example of the file page is a valid file.

use clap::CommandFactory;

use super::daemon_page::{CAUSES, REASONS};
use super::*;
use crate::config::keys::{keys, Table};

/// The part of `page` from the line starting with `from` to the next heading of that level.
fn part<'a>(page: &'a str, from: &str) -> &'a str {
    let start = page
        .find(from)
        .unwrap_or_else(|| panic!("{from:?} is not on the page"));
    let level = &from[..3];
    let rest = &page[start + from.len()..];
    let end = rest
        .find(&format!("\n{level}"))
        .map_or(rest.len(), |i| i + 1);
    &rest[..end]
}

/// How roff writes a flag (a dash is `\-`).
fn flag(long: &str) -> String {
    format!("\\-\\-{}", long.replace('-', "\\-"))
}

#[test]
fn every_flag_of_every_command_is_on_the_daemon_page() {
    let page = daemon_page();
    let cli = crate::cli::Cli::command();
    let mut seen = 0;
    let mut commands = Vec::new();
    for sub in cli.get_subcommands().filter(|s| !s.is_hide_set()) {
        commands.push((sub.get_name().to_owned(), sub));
        for nested in sub.get_subcommands().filter(|s| !s.is_hide_set()) {
            commands.push((format!("{} {}", sub.get_name(), nested.get_name()), nested));
        }
    }
    for (name, sub) in commands {
        let heading = format!(".SS\n\\fBincus\\-hpa {}\\fR", name.replace('-', "\\-"));
        let section = part(&page, &heading);
        for arg in sub
            .get_arguments()
            .filter(|a| !a.is_hide_set() && !a.is_global_set())
        {
            match arg.get_long() {
                Some("help") | Some("version") => {}
                Some(long) => {
                    assert!(
                        section.contains(&flag(long)),
                        "{} --{long} is missing:\n{section}",
                        sub.get_name()
                    );
                    seen += 1;
                }
                None => {
                    let id = arg.get_id().as_str().to_uppercase();
                    assert!(section.contains(&id), "{} {id} is missing", sub.get_name());
                }
            }
        }
    }
    assert!(seen > 10, "{seen}");
    assert!(part(&page, ".SH \"GLOBAL OPTIONS\"").contains(&flag("incus-socket")));
    for heading in [
        "EXIT STATUS",
        "SIGNALS",
        "FILES",
        "ENVIRONMENT",
        "JOURNAL FIELDS",
    ] {
        assert!(
            page.contains(&format!(".SH \"{heading}\""))
                || page.contains(&format!(".SH {heading}\n")),
            "{heading}"
        );
    }
    for status in ["0", "1", "2", "78"] {
        assert!(
            part(&page, ".SH \"EXIT STATUS\"").contains(&format!(".TP\n\\fB{status}\\fR")),
            "{status}"
        );
    }
    for signal in ["SIGHUP", "SIGUSR1", "SIGTERM", "SIGINT"] {
        assert!(part(&page, ".SH SIGNALS").contains(signal), "{signal}");
    }
}

#[test]
fn every_reason_is_on_the_daemon_page() {
    let page = daemon_page();
    let journal = part(&page, ".SH \"JOURNAL FIELDS\"");
    for name in REASONS
        .iter()
        .map(|r| r.as_str())
        .chain(CAUSES.iter().map(|c| c.as_str()))
    {
        assert!(
            journal.contains(&format!("\\fB{}\\fR", name.replace('-', "\\-"))),
            "{name}"
        );
    }
}

#[test]
fn every_key_is_on_the_file_page_in_its_table() {
    let page = file_page();
    for (table, heading) in [
        (Table::Daemon, ".SH [daemon]"),
        (Table::Group, ".SH [groups.NAME]"),
        (Table::External, ".SH \"EXTERNAL SIGNALS\""),
        (Table::Schedule, ".SH SCHEDULES"),
        (Table::Ready, ".SH READINESS"),
        (Table::Endpoints, ".SH ENDPOINTS"),
    ] {
        let section = part(&page, heading);
        for k in keys().into_iter().filter(|k| k.table == table) {
            let tag = format!(".TP\n\\fB{}\\fR = ", k.name.replace('-', "\\-"));
            assert!(
                section.contains(&tag),
                "{} is missing from {heading}",
                k.name
            );
        }
    }
}

#[test]
fn the_file_pages_example_is_a_valid_file() {
    let loaded = crate::config::parse(std::path::Path::new("example"), file_page::EXAMPLE)
        .unwrap_or_else(|e| panic!("{:#?}", e.diagnostics));
    assert!(loaded.warnings.is_empty(), "{:#?}", loaded.warnings);
}

#[test]
fn assets_are_written() {
    let dir = tempfile::tempdir().unwrap();
    generate_assets(dir.path()).unwrap();
    for name in [
        DAEMON_PAGE,
        FILE_PAGE,
        "incus-hpa.bash",
        "_incus-hpa",
        "incus-hpa.fish",
    ] {
        assert!(dir.path().join(name).exists(), "{name}");
    }
}
