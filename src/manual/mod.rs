//! The manual: `incus-hpa(8)` from the command line's own definition ([`crate::cli`]) and
//! `incus-hpa.toml(5)` from the table of keys the parser uses ([`crate::config::keys`]), so that
//! a flag or a key cannot exist without its page; and the shell completions. `generate-assets`
//! writes them all for the package.

mod daemon_page;
mod file_page;

use std::path::Path;

use roff::{bold, italic, roman, Inline, Roff};

pub use daemon_page::daemon_page;
pub use file_page::file_page;

/// The file names of the pages, as installed under `/usr/share/man/man8` and `man5`.
pub const DAEMON_PAGE: &str = "incus-hpa.8";
pub const FILE_PAGE: &str = "incus-hpa.toml.5";

/// Writes both man pages and the completions for bash, zsh and fish into `dir`.
pub fn generate_assets(dir: &Path) -> std::io::Result<()> {
    use clap::CommandFactory;
    std::fs::create_dir_all(dir)?;
    std::fs::write(dir.join(DAEMON_PAGE), daemon_page())?;
    std::fs::write(dir.join(FILE_PAGE), file_page())?;
    let cmd = crate::cli::Cli::command();
    for shell in [
        clap_complete::Shell::Bash,
        clap_complete::Shell::Zsh,
        clap_complete::Shell::Fish,
    ] {
        clap_complete::generate_to(shell, &mut cmd.clone(), "incus-hpa", dir)?;
    }
    Ok(())
}

/// A man page being written: sections, paragraphs and tagged entries over [`Roff`], which
/// escapes the text.
struct Page(Roff);

impl Page {
    fn new(name: &str, section: &str, manual: &str) -> Self {
        let mut r = Roff::new();
        let version = format!("incus-hpa {}", env!("CARGO_PKG_VERSION"));
        r.control(
            "TH",
            [name, section, &release_date(), version.as_str(), manual],
        );
        // Names, paths and keys are not to be broken across lines.
        r.control("nh", []);
        r.control("ad", ["l"]);
        Page(r)
    }

    fn section(&mut self, title: &str) -> &mut Self {
        self.0.control("SH", [title]);
        self
    }

    fn subsection(&mut self, title: &str) -> &mut Self {
        self.0.control("SS", [title]);
        self
    }

    /// A subsection whose heading has several fonts (on the line after `.SS`).
    fn subsection_of(&mut self, title: Vec<Inline>) -> &mut Self {
        self.0.control("SS", []);
        self.0.text(title);
        self
    }

    /// A paragraph of plain text (after a section heading, or after another paragraph).
    fn para(&mut self, text: &str) -> &mut Self {
        self.0.control("PP", []);
        self.0.text([roman(text)]);
        self
    }

    /// A tagged entry: `tag` on its own line, then `text` indented.
    fn entry(&mut self, tag: Vec<Inline>, text: &str) -> &mut Self {
        self.0.control("TP", []);
        self.0.text(tag);
        self.0.text([roman(text)]);
        self
    }

    /// More lines of the current entry, each on its own line.
    fn lines(&mut self, lines: &[Vec<Inline>]) -> &mut Self {
        for l in lines {
            self.0.control("br", []);
            self.0.text(l.clone());
        }
        self
    }

    /// Literal lines (a file, commands), indented.
    fn literal(&mut self, text: &str) -> &mut Self {
        self.0.control("PP", []);
        self.0.control("RS", ["4"]);
        self.0.control("nf", []);
        for line in text.lines() {
            self.0.text([roman(line)]);
        }
        self.0.control("fi", []);
        self.0.control("RE", []);
        self
    }

    fn render(&self) -> String {
        self.0.render()
    }
}

/// The date of this release, `YYYY-MM-DD`, from the newest entry of the package's changelog
/// (so that the pages change with a release, not with each build).
fn release_date() -> String {
    const CHANGELOG: &str = include_str!("../../packaging/changelog");
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    // " -- NAME <MAIL>  Tue, 01 Dec 2026 18:00:00 +0000"
    let date = CHANGELOG
        .lines()
        .find_map(|l| l.strip_prefix(" -- "))
        .and_then(|l| l.split_once(">  "))
        .and_then(|(_, d)| d.split_once(", "))
        .map(|(_, d)| d.split_whitespace().take(3).collect::<Vec<_>>());
    match date.as_deref() {
        Some([day, month, year]) => match MONTHS.iter().position(|m| m == month) {
            Some(m) => format!("{year}-{:02}-{day}", m + 1),
            None => String::new(),
        },
        _ => String::new(),
    }
}

/// `name(section)` in bold, as SEE ALSO writes it.
fn reference(name: &str, section: &str) -> Vec<Inline> {
    vec![bold(name), roman(format!("({section})"))]
}

/// `word` in italic, for a placeholder.
fn placeholder(word: &str) -> Inline {
    italic(word)
}

#[cfg(test)]
mod tests;
