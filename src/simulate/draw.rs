//! The SVG primitives of the simulation's plot ([`super::plot`]): escaping, linear scales,
//! round ticks, and step lines thinned to what a pixel can show (a 30-day trace has 2.6 million
//! seconds and a panel about 850 pixels). Pure: values in, SVG text out.

use std::fmt::Write;

/// `s` with XML's five special characters escaped, for text and attribute values.
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c => out.push(c),
        }
    }
    out
}

/// A pixel coordinate: one decimal, without a trailing `.0`.
pub fn px(v: f64) -> String {
    let r = (v * 10.0).round() / 10.0;
    if r.fract() == 0.0 {
        format!("{r:.0}")
    } else {
        format!("{r:.1}")
    }
}

/// A linear map from values (`lo..hi`) to pixels (`from..to`).
#[derive(Debug, Clone, Copy)]
pub struct Scale {
    pub lo: f64,
    pub hi: f64,
    pub from: f64,
    pub to: f64,
}

impl Scale {
    pub fn at(&self, v: f64) -> f64 {
        let span = if self.hi > self.lo {
            self.hi - self.lo
        } else {
            1.0
        };
        let v = if v.is_finite() { v } else { self.lo };
        self.from + (v - self.lo) / span * (self.to - self.from)
    }
}

/// A round step (1, 2, 2.5 or 5 × 10ᵏ; for counts, a whole 1, 2 or 5 × 10ᵏ) for about `count`
/// intervals from 0 to `hi`.
pub fn step_for(hi: f64, count: usize, whole: bool) -> f64 {
    let raw = (hi / count.max(1) as f64).max(1e-9);
    let magnitude = 10f64.powf(raw.log10().floor());
    let factors: &[f64] = if whole && magnitude < 10.0 {
        &[1.0, 2.0, 5.0, 10.0]
    } else {
        &[1.0, 2.0, 2.5, 5.0, 10.0]
    };
    let step = factors
        .iter()
        .map(|f| f * magnitude)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * magnitude);
    if whole {
        step.round().max(1.0)
    } else {
        step
    }
}

/// The multiples of `step` from 0 to `hi`.
pub fn ticks(hi: f64, step: f64) -> Vec<f64> {
    let n = (hi / step + 1e-9).floor().max(0.0) as usize;
    (0..=n).map(|i| i as f64 * step).collect()
}

/// A tick's label: as many decimals as `step` needs.
pub fn tick_label(v: f64, step: f64) -> String {
    let decimals = (0..4)
        .find(|d| {
            let scaled = step * 10f64.powi(*d);
            (scaled - scaled.round()).abs() < 1e-6
        })
        .unwrap_or(3) as usize;
    format!("{v:.decimals$}")
}

/// About how wide `text` is in a sans-serif font of `size` pixels (SVG cannot be asked).
pub fn text_width(text: &str, size: f64) -> f64 {
    text.chars().count() as f64 * size * 0.55
}

/// The `d` of a path through `values`, each held for one second from t = 0 (so the line ends at
/// t = `values.len()`), moved `dy` pixels down. Changes that fall within half a pixel of one
/// another are drawn as one vertical stroke over their full extent.
pub fn step_path(values: impl IntoIterator<Item = f64>, x: &Scale, y: &Scale, dy: f64) -> String {
    let mut line = Thin::default();
    let mut held: Option<f64> = None;
    let mut n = 0u64;
    for (t, v) in values.into_iter().enumerate() {
        let py = y.at(v) + dy;
        match held {
            None => line.push(x.at(0.0), py),
            Some(p) if p != py => {
                line.push(x.at(t as f64), p);
                line.push(x.at(t as f64), py);
            }
            Some(_) => {}
        }
        held = Some(py);
        n = t as u64 + 1;
    }
    if let Some(p) = held {
        line.push(x.at(n as f64), p);
    }
    line.d()
}

/// Points of a line, gathered into columns half a pixel wide: each column keeps its first
/// point, its lowest and highest (in the order met) and its last.
#[derive(Default)]
struct Thin {
    out: Vec<(f64, f64)>,
    column: Option<Column>,
}

struct Column {
    x: f64,
    first: f64,
    /// (y, the order met) of the lowest and the highest point.
    lo: (f64, usize),
    hi: (f64, usize),
    last: f64,
    seen: usize,
}

impl Thin {
    fn push(&mut self, x: f64, y: f64) {
        let round = |v: f64| (v * 10.0).round() / 10.0;
        let (x, y) = (round(x), round(y));
        match &mut self.column {
            Some(c) if x - c.x < 0.5 => {
                c.seen += 1;
                if y < c.lo.0 {
                    c.lo = (y, c.seen);
                }
                if y > c.hi.0 {
                    c.hi = (y, c.seen);
                }
                c.last = y;
            }
            _ => {
                self.flush();
                self.column = Some(Column {
                    x,
                    first: y,
                    lo: (y, 0),
                    hi: (y, 0),
                    last: y,
                    seen: 0,
                });
            }
        }
    }

    fn flush(&mut self) {
        if let Some(c) = self.column.take() {
            let (a, b) = if c.lo.1 <= c.hi.1 {
                (c.lo.0, c.hi.0)
            } else {
                (c.hi.0, c.lo.0)
            };
            for y in [c.first, a, b, c.last] {
                self.emit((c.x, y));
            }
        }
    }

    /// Appends `p`, dropping repeats and the middle of three points on one straight stroke.
    fn emit(&mut self, p: (f64, f64)) {
        if self.out.last() == Some(&p) {
            return;
        }
        if let [.., a, b] = self.out[..] {
            let horizontal = a.1 == b.1 && b.1 == p.1;
            let vertical = a.0 == b.0 && b.0 == p.0 && (b.1 - a.1) * (p.1 - b.1) >= 0.0;
            if horizontal || vertical {
                self.out.pop();
            }
        }
        self.out.push(p);
    }

    fn d(mut self) -> String {
        self.flush();
        let mut d = String::new();
        let mut last: Option<(f64, f64)> = None;
        for &(x, y) in &self.out {
            let _ = match last {
                None => write!(d, "M{} {}", px(x), px(y)),
                Some((_, ly)) if ly == y => write!(d, "H{}", px(x)),
                Some((lx, _)) if lx == x => write!(d, "V{}", px(y)),
                Some(_) => write!(d, "L{} {}", px(x), px(y)),
            };
            last = Some((x, y));
        }
        d
    }
}

/// Appends a `<line>` from (x1, y1) to (x2, y2) with the attributes `attrs`.
pub fn line(out: &mut String, (x1, y1): (f64, f64), (x2, y2): (f64, f64), attrs: &str) {
    let _ = writeln!(
        out,
        r#"<line x1="{}" y1="{}" x2="{}" y2="{}" {attrs}/>"#,
        px(x1),
        px(y1),
        px(x2),
        px(y2)
    );
}

/// Appends `content` (escaped here) as a `<text>` at (x, y), anchored `anchor` (start, middle
/// or end), with the attributes `attrs`.
pub fn text(out: &mut String, (x, y): (f64, f64), anchor: &str, attrs: &str, content: &str) {
    let _ = writeln!(
        out,
        r#"<text x="{}" y="{}" text-anchor="{anchor}" {attrs}>{}</text>"#,
        px(x),
        px(y),
        esc(content)
    );
}
