//! The documentation keeps to the code. In `README.md` and `docs/*.md`:
//! - every ```toml block is a valid desired state (`config::parse`), and so is every
//!   `examples/*.toml` and the packaged file; a block marked `<!-- not-validated -->` on the
//!   line before is skipped;
//! - every `incus-hpa` command line of a ```sh, ```bash or ```console block parses with the
//!   real command line (`Cli::try_parse_from`); an inline code span that starts with
//!   `incus-hpa ` must name subcommands and flags that exist (it may leave out required
//!   arguments: it names a command, it does not run one);
//! - every script a command runs (`lab/stress.sh`, `scripts/test.sh`, …) exists, and every
//!   `--flag` given to it appears in the script's own text;
//! - every relative link points to a file that exists, and to a heading of it when it names
//!   one; the README links every page of `docs/`.
//!
//! No Incus, no network, no process: text only.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use clap::error::ErrorKind;
use clap::Parser;
use incus_hpa::cli::Cli;

const SKIP_MARK: &str = "<!-- not-validated -->";

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// Files of `dir` (relative to the root) ending in `ext`, sorted, as relative paths.
fn files(dir: &str, ext: &str) -> Vec<String> {
    let mut out: Vec<String> = std::fs::read_dir(root().join(dir))
        .unwrap_or_else(|e| panic!("{dir}: {e}"))
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(ext))
        .map(|n| format!("{dir}/{n}"))
        .collect();
    out.sort();
    out
}

/// README.md and docs/*.md.
fn pages() -> Vec<String> {
    let mut pages = vec!["README.md".to_owned()];
    pages.extend(files("docs", ".md"));
    pages
}

/// A fenced block: its language, the line of its opening fence (1-based), its text (the
/// fence's indentation removed), and whether it is marked as not to be validated.
struct Block {
    lang: String,
    line: usize,
    text: String,
    skip: bool,
}

/// The fenced blocks of a Markdown text, and the text with their lines blanked (line numbers
/// kept), for the prose checks.
fn split(md: &str) -> (Vec<Block>, String) {
    let lines: Vec<&str> = md.lines().collect();
    let mut blocks = Vec::new();
    let mut prose = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let trimmed = lines[i].trim_start();
        let Some(info) = trimmed.strip_prefix("```") else {
            prose.push(lines[i]);
            i += 1;
            continue;
        };
        let indent = lines[i].len() - trimmed.len();
        let start = i;
        let mut body = Vec::new();
        i += 1;
        while i < lines.len() && !lines[i].trim_start().starts_with("```") {
            let l = lines[i];
            let cut = l.len() - l.trim_start().len();
            body.push(&l[cut.min(indent)..]);
            i += 1;
        }
        prose.extend(std::iter::repeat_n("", i.min(lines.len() - 1) - start + 1));
        i += 1;
        blocks.push(Block {
            lang: info.split_whitespace().next().unwrap_or("").to_owned(),
            line: start + 1,
            text: body.join("\n") + "\n",
            skip: start > 0 && lines[start - 1].trim() == SKIP_MARK,
        });
    }
    (blocks, prose.join("\n"))
}

/// Inline code spans of prose: (line, content with line breaks as spaces).
fn spans(prose: &str) -> Vec<(usize, String)> {
    let chars: Vec<char> = prose.chars().collect();
    let mut out = Vec::new();
    let (mut i, mut line) = (0, 1);
    while i < chars.len() {
        if chars[i] == '\n' {
            line += 1;
        }
        if chars[i] != '`' {
            i += 1;
            continue;
        }
        let run = chars[i..].iter().take_while(|c| **c == '`').count();
        let start = i + run;
        let mut j = start;
        let end = loop {
            if j >= chars.len() {
                break None;
            }
            let r = chars[j..].iter().take_while(|c| **c == '`').count();
            if r == run {
                break Some(j);
            }
            j += r.max(1);
        };
        let Some(end) = end else {
            i = start;
            continue;
        };
        let content: String = chars[start..end].iter().collect();
        out.push((line, content.replace('\n', " ").trim().to_owned()));
        line += content.matches('\n').count();
        i = end + run;
    }
    out
}

/// Splits one shell line into simple commands (at `|`, `||`, `&&`, `;`, `&`), each a list of
/// words, with quotes and backslashes resolved, a `#` comment dropped, and redirections left
/// out.
fn commands(line: &str) -> Vec<Vec<String>> {
    let mut cmds = vec![Vec::new()];
    let mut word: Option<String> = None;
    let mut redirect = false;
    let mut chars = line.chars().peekable();
    let end_word = |word: &mut Option<String>, cmds: &mut Vec<Vec<String>>, redirect: &mut bool| {
        if let Some(w) = word.take() {
            if std::mem::take(redirect) {
                return;
            }
            cmds.last_mut().unwrap().push(w);
        }
    };
    while let Some(c) = chars.next() {
        match c {
            '\'' => {
                let w = word.get_or_insert_with(String::new);
                for q in chars.by_ref() {
                    if q == '\'' {
                        break;
                    }
                    w.push(q);
                }
            }
            '"' => {
                let w = word.get_or_insert_with(String::new);
                while let Some(q) = chars.next() {
                    match q {
                        '"' => break,
                        '\\' => w.extend(chars.next()),
                        _ => w.push(q),
                    }
                }
            }
            '\\' => word.get_or_insert_with(String::new).extend(chars.next()),
            '#' if word.is_none() => break,
            '|' | '&' | ';' => {
                end_word(&mut word, &mut cmds, &mut redirect);
                if chars.peek() == Some(&c) {
                    chars.next();
                }
                cmds.push(Vec::new());
            }
            '>' | '<' => {
                // `2>` and the like: the digits are the descriptor, not a word.
                if word
                    .as_deref()
                    .is_some_and(|w| w.chars().all(|d| d.is_ascii_digit()))
                {
                    word = None;
                }
                end_word(&mut word, &mut cmds, &mut redirect);
                if chars.peek() == Some(&'&') {
                    chars.next();
                }
                redirect = true;
            }
            c if c.is_whitespace() => end_word(&mut word, &mut cmds, &mut redirect),
            c => word.get_or_insert_with(String::new).push(c),
        }
    }
    end_word(&mut word, &mut cmds, &mut redirect);
    cmds.retain(|c| !c.is_empty());
    cmds
}

/// What one checked command was.
#[derive(Debug, PartialEq, Eq)]
enum Checked {
    IncusHpa,
    Script,
    Other,
}

/// Checks one simple command: an `incus-hpa` (or `cargo run --`) invocation must parse, a
/// script must exist and know every `--flag` given to it. `whole` says the command is a
/// whole line to run (a block), not a span naming a command.
fn check(words: &[String], whole: bool) -> Result<Checked, String> {
    let mut w: Vec<&str> = words.iter().map(String::as_str).collect();
    loop {
        match w.first() {
            Some(&("sudo" | "do" | "then" | "else" | "exec" | "time")) => {
                w.remove(0);
            }
            Some(a) if is_assignment(a) => {
                w.remove(0);
            }
            _ => break,
        }
    }
    let Some(&first) = w.first() else {
        return Ok(Checked::Other);
    };
    if first == "cargo" && w.get(1) == Some(&"run") {
        return match w.iter().position(|x| *x == "--") {
            Some(p) => parse_cli(&w[p + 1..], whole),
            None => Ok(Checked::Other),
        };
    }
    if first == "incus-hpa" || first.ends_with("/incus-hpa") {
        return parse_cli(&w[1..], whole);
    }
    let (script, args) = match (first, w.get(1)) {
        ("bash" | "sh", Some(s)) if s.ends_with(".sh") => (*s, &w[2..]),
        (s, _) if s.ends_with(".sh") => (s, &w[1..]),
        _ => return Ok(Checked::Other),
    };
    if script.starts_with('/') {
        return Ok(Checked::Other);
    }
    let path = root().join(script);
    let text = std::fs::read_to_string(&path)
        .map_err(|e| format!("the script {script} cannot be read: {e}"))?;
    for a in args.iter().filter(|a| a.starts_with("--") && a.len() > 2) {
        let flag = a.split('=').next().unwrap_or(a);
        if !text.contains(flag) {
            return Err(format!("{script} does not know {flag}"));
        }
    }
    Ok(Checked::Script)
}

fn is_assignment(word: &str) -> bool {
    word.split_once('=').is_some_and(|(name, _)| {
        !name.is_empty()
            && name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    })
}

fn parse_cli(args: &[&str], whole: bool) -> Result<Checked, String> {
    let argv = std::iter::once("incus-hpa").chain(args.iter().copied());
    match Cli::try_parse_from(argv) {
        Ok(_) => Ok(Checked::IncusHpa),
        Err(e) => match e.kind() {
            ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => Ok(Checked::IncusHpa),
            ErrorKind::MissingRequiredArgument
            | ErrorKind::MissingSubcommand
            | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
                if !whole =>
            {
                Ok(Checked::IncusHpa)
            }
            _ => Err(format!("`incus-hpa {}`: {}", args.join(" "), e.render())),
        },
    }
}

/// The shell lines of a block: continuation lines joined, comments and output left out (in a
/// `console` block only `$ ` and `# ` lines are commands), lines with `$(` or backticks
/// skipped. Each with its line number.
fn shell_lines(block: &Block) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut pending: Option<(usize, String)> = None;
    for (i, raw) in block.text.lines().enumerate() {
        let number = block.line + 1 + i;
        let mut line = raw.trim().to_owned();
        if pending.is_none() {
            if block.lang == "console" {
                match line.strip_prefix("$ ").or_else(|| line.strip_prefix("# ")) {
                    Some(cmd) => line = cmd.to_owned(),
                    None => continue,
                }
            } else if line.starts_with('#') || line.is_empty() {
                continue;
            }
        }
        let (start, mut text) = pending.take().unwrap_or((number, String::new()));
        match line.strip_suffix('\\') {
            Some(part) => {
                text.push_str(part);
                text.push(' ');
                pending = Some((start, text));
            }
            None => {
                text.push_str(&line);
                out.push((start, text));
            }
        }
    }
    out.extend(pending);
    out.retain(|(_, l)| !l.contains("$(") && !l.contains('`'));
    out
}

/// GitHub's anchors for the headings of a Markdown text (fenced blocks already blanked).
fn anchors(prose: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in prose.lines() {
        let hashes = line.chars().take_while(|c| *c == '#').count();
        if !(1..=6).contains(&hashes) || !line[hashes..].starts_with(' ') {
            continue;
        }
        let slug: String = line[hashes..]
            .trim()
            .to_lowercase()
            .chars()
            .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
            .map(|c| if c == ' ' { '-' } else { c })
            .collect();
        let mut unique = slug.clone();
        let mut n = 0;
        while !out.insert(unique.clone()) {
            n += 1;
            unique = format!("{slug}-{n}");
        }
    }
    out
}

/// The targets of the Markdown links of prose, with their line: `[text](target)`.
fn links(prose: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (n, line) in prose.lines().enumerate() {
        // Code spans are not links.
        let line: String = line.split('`').step_by(2).collect::<Vec<_>>().join("");
        for (at, _) in line.match_indices("](") {
            let rest = &line[at + 2..];
            if let Some(end) = rest.find(')') {
                out.push((n + 1, rest[..end].trim().to_owned()));
            }
        }
    }
    out
}

#[test]
fn every_toml_example_is_a_valid_desired_state() {
    let mut failures = Vec::new();
    let mut checked = 0;
    for page in pages() {
        let (blocks, _) = split(&read(&page));
        for b in blocks.iter().filter(|b| b.lang == "toml" && !b.skip) {
            checked += 1;
            if let Err(e) = incus_hpa::config::parse(Path::new("block"), &b.text) {
                let diags: Vec<String> = e.diagnostics.iter().map(|d| format!("  {d}")).collect();
                failures.push(format!(
                    "{page}:{}: the toml block is not a valid desired state:\n{}",
                    b.line,
                    diags.join("\n")
                ));
            }
        }
    }
    let mut examples = files("examples", ".toml");
    examples.push("packaging/desired-state.toml".to_owned());
    for file in examples {
        checked += 1;
        if let Err(e) = incus_hpa::config::parse(Path::new(&file), &read(&file)) {
            let diags: Vec<String> = e.diagnostics.iter().map(|d| format!("  {d}")).collect();
            failures.push(format!(
                "{file}:1: not a valid desired state:\n{}",
                diags.join("\n")
            ));
        }
    }
    assert!(checked >= 6, "only {checked} toml examples found");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn every_command_shown_exists_with_its_flags() {
    let mut failures = Vec::new();
    let (mut cli, mut scripts) = (0, 0);
    let mut count = |r: Result<Checked, String>, place: String| match r {
        Ok(Checked::IncusHpa) => cli += 1,
        Ok(Checked::Script) => scripts += 1,
        Ok(Checked::Other) => {}
        Err(e) => failures.push(format!("{place}: {e}")),
    };
    for page in pages() {
        let (blocks, prose) = split(&read(&page));
        for b in blocks
            .iter()
            .filter(|b| matches!(b.lang.as_str(), "sh" | "bash" | "console") && !b.skip)
        {
            for (line, text) in shell_lines(b) {
                for cmd in commands(&text) {
                    count(check(&cmd, true), format!("{page}:{line}"));
                }
            }
        }
        for (line, span) in spans(&prose) {
            let first = span.split_whitespace().next().unwrap_or("");
            let named = span.starts_with("incus-hpa ")
                || span.starts_with("sudo incus-hpa ")
                || span.starts_with("cargo run ")
                || first.ends_with(".sh")
                || (matches!(first, "bash" | "sh") && span.contains(".sh"));
            if !named || span.contains("$(") {
                continue;
            }
            for cmd in commands(&span) {
                count(check(&cmd, false), format!("{page}:{line}"));
            }
        }
    }
    assert!(
        cli >= 20 && scripts >= 10,
        "{cli} incus-hpa commands and {scripts} scripts found"
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn every_relative_link_points_to_something_that_exists() {
    let mut failures = Vec::new();
    let mut linked = BTreeSet::new();
    for page in pages() {
        let (_, prose) = split(&read(&page));
        let dir = Path::new(&page).parent().unwrap_or(Path::new(""));
        for (line, target) in links(&prose) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (file, anchor) = target.split_once('#').unwrap_or((&target, ""));
            let rel = if file.is_empty() {
                PathBuf::from(&page)
            } else {
                normalize(&dir.join(file))
            };
            if page == "README.md" {
                linked.insert(rel.to_string_lossy().into_owned());
            }
            if !root().join(&rel).exists() {
                failures.push(format!("{page}:{line}: {target}: no such file"));
                continue;
            }
            if !anchor.is_empty() && rel.extension().is_some_and(|e| e == "md") {
                let (_, target_prose) = split(&read(&rel.to_string_lossy()));
                if !anchors(&target_prose).contains(anchor) {
                    failures.push(format!("{page}:{line}: {target}: no such heading"));
                }
            }
        }
    }
    for doc in files("docs", ".md") {
        if !linked.contains(&doc) {
            failures.push(format!("README.md: {doc} is not linked"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// `docs/../README.md` → `README.md`.
fn normalize(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::CurDir => {}
            c => out.push(c),
        }
    }
    out
}

#[test]
fn the_checks_read_shell_and_markdown_as_meant() {
    assert_eq!(
        commands(r#"sudo incus-hpa status --json | jq '.groups' && echo "a # b" # note"#),
        vec![
            vec!["sudo", "incus-hpa", "status", "--json"],
            vec!["jq", ".groups"],
            vec!["echo", "a # b"],
        ]
    );
    assert_eq!(
        commands("incus-hpa validate -c f.toml 2>&1 >/dev/null; x"),
        vec![vec!["incus-hpa", "validate", "-c", "f.toml"], vec!["x"]]
    );
    let words = |s: &str| commands(s).remove(0);
    assert!(check(&words("incus-hpa status --control-socket /x"), true).is_ok());
    assert!(check(&words("incus-hpa status --no-such-flag"), true).is_err());
    assert!(check(&words("incus-hpa simulate"), true).is_err());
    assert!(check(&words("incus-hpa simulate"), false).is_ok());
    assert!(check(&words("incus-hpa frobnicate"), false).is_err());
    assert!(check(&words("lab/stress.sh --release web"), true).is_ok());
    assert!(check(&words("lab/stress.sh --frobnicate web"), true).is_err());
    assert!(check(&words("bash scripts/no-such-script.sh"), true).is_err());
    assert!(check(&words("cargo run -- generate-assets target/assets"), true).is_ok());

    let (blocks, prose) = split("a\n<!-- not-validated -->\n  ```toml\n  x = 1\n  ```\n# `B` c\n");
    assert_eq!(
        (blocks[0].line, blocks[0].text.as_str(), blocks[0].skip),
        (3, "x = 1\n", true)
    );
    assert!(anchors(&prose).contains("b-c"));
    assert_eq!(
        spans("see `incus-hpa\nplan` and ``a`b``"),
        vec![(1, "incus-hpa plan".to_owned()), (2, "a`b".to_owned())]
    );
}
