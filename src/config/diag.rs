//! Located configuration problems: every error or warning names the file, line, column and key.

use std::fmt;
use std::ops::Range;
use std::path::{Path, PathBuf};

/// How bad a problem is: errors reject the file, warnings only inform.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Severity {
    Error,
    Warning,
}

/// One problem in a desired-state file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
    pub severity: Severity,
    pub file: PathBuf,
    /// 1-based line and column; 0 when the problem has no place (e.g. an unreadable file).
    pub line: usize,
    pub column: usize,
    /// Dotted key path, e.g. `groups.web.max`; empty for the document itself.
    pub key: String,
    pub message: String,
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sev = match self.severity {
            Severity::Error => "error",
            Severity::Warning => "warning",
        };
        write!(f, "{}", self.file.display())?;
        if self.line > 0 {
            write!(f, ":{}:{}", self.line, self.column)?;
        }
        write!(f, ": {sev}: ")?;
        if !self.key.is_empty() {
            write!(f, "{}: ", self.key)?;
        }
        f.write_str(&self.message)
    }
}

/// Collects diagnostics for one file, turning byte spans into line and column.
pub struct Collector<'a> {
    file: &'a Path,
    text: &'a str,
    pub diagnostics: Vec<Diagnostic>,
}

impl<'a> Collector<'a> {
    pub fn new(file: &'a Path, text: &'a str) -> Self {
        Self {
            file,
            text,
            diagnostics: Vec::new(),
        }
    }

    fn push(&mut self, severity: Severity, span: Option<Range<usize>>, key: &str, message: String) {
        let (line, column) = span.map_or((0, 0), |s| line_col(self.text, s.start));
        self.diagnostics.push(Diagnostic {
            severity,
            file: self.file.to_path_buf(),
            line,
            column,
            key: key.to_owned(),
            message,
        });
    }

    pub fn error(&mut self, span: Option<Range<usize>>, key: &str, message: impl Into<String>) {
        self.push(Severity::Error, span, key, message.into());
    }

    pub fn warning(&mut self, span: Option<Range<usize>>, key: &str, message: impl Into<String>) {
        self.push(Severity::Warning, span, key, message.into());
    }

    pub fn has_errors(&self) -> bool {
        self.diagnostics
            .iter()
            .any(|d| d.severity == Severity::Error)
    }
}

/// 1-based line and column (in characters) of a byte offset.
pub fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let mut offset = offset.min(text.len());
    while !text.is_char_boundary(offset) {
        offset -= 1;
    }
    let before = &text[..offset];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    (line, before[line_start..].chars().count() + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_and_column_are_one_based() {
        let t = "a = 1\nbé = 2\n";
        assert_eq!(line_col(t, 0), (1, 1));
        assert_eq!(line_col(t, 6), (2, 1));
        assert_eq!(line_col(t, 10), (2, 4));
        assert_eq!(line_col(t, 999), (3, 1));
    }
}
