//! Typed, located access to one TOML table: each getter reports a wrong type with its place,
//! and `finish` reports every key nobody asked for (our `deny_unknown_fields`).

use std::collections::BTreeSet;
use std::ops::Range;
use std::time::Duration;

use toml::de::{DeTable, DeValue};
use toml::Spanned;

use super::diag::Collector;

/// A table being read, with the dotted path that leads to it.
pub struct Fields<'t, 'i> {
    table: &'t DeTable<'i>,
    path: String,
    span: Range<usize>,
    seen: BTreeSet<String>,
}

/// A value with the span it came from.
pub type At<T> = (T, Range<usize>);

impl<'t, 'i> Fields<'t, 'i> {
    pub fn new(table: &'t DeTable<'i>, path: &str, span: Range<usize>) -> Self {
        Self {
            table,
            path: path.to_owned(),
            span,
            seen: BTreeSet::new(),
        }
    }

    /// The dotted path of `key` in this table.
    pub fn key(&self, key: &str) -> String {
        if self.path.is_empty() {
            key.to_owned()
        } else {
            format!("{}.{key}", self.path)
        }
    }

    /// Whether the table has `key` at all (whatever its value).
    pub fn has(&self, key: &str) -> bool {
        self.table.contains_key(key)
    }

    /// Where the table itself is.
    pub fn span(&self) -> Range<usize> {
        self.span.clone()
    }

    fn get(&mut self, key: &str) -> Option<&'t Spanned<DeValue<'i>>> {
        self.seen.insert(key.to_owned());
        self.table.get(key)
    }

    fn wrong(&self, c: &mut Collector, key: &str, v: &Spanned<DeValue>, expected: &str) {
        c.error(
            Some(v.span()),
            &self.key(key),
            format!("expected {expected}, found {}", type_name(v.get_ref())),
        );
    }

    /// A required key: reports it missing, at the table's place.
    pub fn required<T>(&self, c: &mut Collector, key: &str, v: Option<T>) -> Option<T> {
        if v.is_none() && !self.table.contains_key(key) {
            c.error(
                Some(self.span()),
                &self.key(key),
                "missing (this key is required)",
            );
        }
        v
    }

    pub fn string(&mut self, c: &mut Collector, key: &str) -> Option<At<String>> {
        let v = self.get(key)?;
        match v.get_ref() {
            DeValue::String(s) => Some((s.to_string(), v.span())),
            _ => {
                self.wrong(c, key, v, "a string");
                None
            }
        }
    }

    /// A string, or a whole number in its place (as its digits): a size takes both.
    pub fn string_or_integer(&mut self, c: &mut Collector, key: &str) -> Option<At<String>> {
        let v = self.get(key)?;
        match v.get_ref() {
            DeValue::String(s) => Some((s.to_string(), v.span())),
            DeValue::Integer(i) => {
                let n = i64::from_str_radix(&i.as_str().replace('_', ""), i.radix()).ok();
                Some((
                    n.map_or_else(|| i.as_str().to_owned(), |n| n.to_string()),
                    v.span(),
                ))
            }
            _ => {
                self.wrong(c, key, v, "a string or a whole number");
                None
            }
        }
    }

    /// A string that must name one of `choices`; anything else is reported with the names,
    /// in their order.
    pub fn choice<T: Copy>(
        &mut self,
        c: &mut Collector,
        key: &str,
        choices: &[(&str, T)],
    ) -> Option<T> {
        let (s, span) = self.string(c, key)?;
        let found = choices.iter().find(|(name, _)| *name == s).map(|(_, v)| *v);
        if found.is_none() {
            let names: Vec<String> = choices.iter().map(|(n, _)| format!("{n:?}")).collect();
            c.error(
                Some(span),
                &self.key(key),
                format!("{s:?} is not one of {}", names.join(", ")),
            );
        }
        found
    }

    pub fn boolean(&mut self, c: &mut Collector, key: &str) -> Option<At<bool>> {
        let v = self.get(key)?;
        match v.get_ref() {
            DeValue::Boolean(b) => Some((*b, v.span())),
            _ => {
                self.wrong(c, key, v, "true or false");
                None
            }
        }
    }

    /// A non-negative integer that fits in a u32.
    pub fn count(&mut self, c: &mut Collector, key: &str) -> Option<At<u32>> {
        let v = self.get(key)?;
        match v.get_ref() {
            DeValue::Integer(i) => {
                let parsed = i64::from_str_radix(&i.as_str().replace('_', ""), i.radix()).ok();
                match parsed.and_then(|n| u32::try_from(n).ok()) {
                    Some(n) => Some((n, v.span())),
                    None => {
                        c.error(
                            Some(v.span()),
                            &self.key(key),
                            format!("expected a whole number from 0 to {}", u32::MAX),
                        );
                        None
                    }
                }
            }
            _ => {
                self.wrong(c, key, v, "a whole number");
                None
            }
        }
    }

    /// An integer or a float.
    pub fn number(&mut self, c: &mut Collector, key: &str) -> Option<At<f64>> {
        let v = self.get(key)?;
        let n = match v.get_ref() {
            DeValue::Integer(i) => i64::from_str_radix(&i.as_str().replace('_', ""), i.radix())
                .ok()
                .map(|n| n as f64),
            DeValue::Float(f) => f.as_str().replace('_', "").parse::<f64>().ok(),
            _ => {
                self.wrong(c, key, v, "a number");
                return None;
            }
        };
        match n.filter(|n| n.is_finite()) {
            Some(n) => Some((n, v.span())),
            None => {
                c.error(Some(v.span()), &self.key(key), "expected a finite number");
                None
            }
        }
    }

    /// A humantime duration such as "5s", "1m 30s" or "5m".
    pub fn duration(&mut self, c: &mut Collector, key: &str) -> Option<At<Duration>> {
        let (s, span) = self.string(c, key)?;
        match humantime::parse_duration(&s) {
            Ok(d) => Some((d, span)),
            Err(e) => {
                c.error(
                    Some(span),
                    &self.key(key),
                    format!(
                        "{s:?} is not a duration ({e}); write e.g. \"30s\", \"5m\" or \"1h 30m\""
                    ),
                );
                None
            }
        }
    }

    /// A duration from `min` to `max`; anything else is reported with both bounds.
    pub fn duration_within(
        &mut self,
        c: &mut Collector,
        key: &str,
        min: Duration,
        max: Duration,
    ) -> Option<Duration> {
        let (d, span) = self.duration(c, key)?;
        if d < min || d > max {
            let range = if min.is_zero() {
                format!("at most {}", human(max))
            } else {
                format!("from {} to {}", human(min), human(max))
            };
            c.error(
                Some(span),
                &self.key(key),
                format!(
                    "{} is out of range: must be {range}",
                    humantime::format_duration(d)
                ),
            );
            return None;
        }
        Some(d)
    }

    pub fn strings(&mut self, c: &mut Collector, key: &str) -> Option<At<Vec<String>>> {
        let v = self.get(key)?;
        let DeValue::Array(items) = v.get_ref() else {
            self.wrong(c, key, v, "an array of strings");
            return None;
        };
        let mut out = Vec::new();
        for (n, item) in items.iter().enumerate() {
            match item.get_ref() {
                DeValue::String(s) => out.push(s.to_string()),
                other => c.error(
                    Some(item.span()),
                    &format!("{}[{n}]", self.key(key)),
                    format!("expected a string, found {}", type_name(other)),
                ),
            }
        }
        Some((out, v.span()))
    }

    pub fn table(&mut self, c: &mut Collector, key: &str) -> Option<Fields<'t, 'i>> {
        let v = self.get(key)?;
        match v.get_ref() {
            DeValue::Table(t) => Some(Fields::new(t, &self.key(key), v.span())),
            _ => {
                self.wrong(c, key, v, "a table");
                None
            }
        }
    }

    /// An array of tables (`[[KEY]]`), each named `KEY[i]` in messages.
    pub fn tables(&mut self, c: &mut Collector, key: &str) -> Vec<Fields<'t, 'i>> {
        let Some(v) = self.get(key) else {
            return Vec::new();
        };
        let DeValue::Array(items) = v.get_ref() else {
            self.wrong(
                c,
                key,
                v,
                &format!("an array of tables ([[{}]])", self.key(key)),
            );
            return Vec::new();
        };
        let mut out = Vec::new();
        for (i, item) in items.iter().enumerate() {
            let path = format!("{}[{i}]", self.key(key));
            match item.get_ref() {
                DeValue::Table(t) => out.push(Fields::new(t, &path, item.span())),
                other => c.error(
                    Some(item.span()),
                    &path,
                    format!("expected a table, found {}", type_name(other)),
                ),
            }
        }
        out
    }

    /// Every entry of the table, marking them all as known.
    pub fn entries(
        &mut self,
    ) -> Vec<(
        &'t Spanned<toml::de::DeString<'i>>,
        &'t Spanned<DeValue<'i>>,
    )> {
        let all: Vec<_> = self.table.iter().collect();
        for (k, _) in &all {
            self.seen.insert(k.get_ref().to_string());
        }
        all
    }

    /// Reports every key that no getter asked for.
    pub fn finish(self, c: &mut Collector, known: &[&str]) {
        // A key read here but missing from `known` (the table of keys) would be undocumented.
        debug_assert!(
            self.seen.iter().all(|k| known.contains(&k.as_str())),
            "{}: read {:?}, known {known:?}",
            self.path,
            self.seen
        );
        for (k, _) in self.table.iter() {
            if !self.seen.contains(k.get_ref().as_ref()) {
                c.error(
                    Some(k.span()),
                    &self.key(k.get_ref()),
                    format!("unknown key (known here: {})", known.join(", ")),
                );
            }
        }
    }
}

/// `d` as the file writes it: humantime's words ("1m 30s"), except that a whole number of
/// days from 30 on is said in days ("31days"), not humantime's months of 30.44 days
/// ("1month 13h 26m 24s").
pub fn human(d: Duration) -> String {
    const DAY: u64 = 24 * 3600;
    match d.as_secs() {
        s if s >= 30 * DAY && s % DAY == 0 && d.subsec_nanos() == 0 => format!("{}days", s / DAY),
        _ => humantime::format_duration(d).to_string(),
    }
}

/// A value's TOML type, for messages.
pub fn type_name(v: &DeValue) -> &'static str {
    match v {
        DeValue::String(_) => "a string",
        DeValue::Integer(_) => "an integer",
        DeValue::Float(_) => "a float",
        DeValue::Boolean(_) => "a boolean",
        DeValue::Datetime(_) => "a date-time",
        DeValue::Array(_) => "an array",
        DeValue::Table(_) => "a table",
    }
}
