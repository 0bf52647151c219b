//! Tables in the style of `incus list`, for `incus-hpa status` and `incus-hpa simulate`.

/// Renders `header` and `rows` (cells as text) boxed with `+`, `-` and `|`, each column as wide
/// as its widest cell.
pub fn render(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for r in rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cells: &mut dyn Iterator<Item = &str>| -> String {
        let inner: Vec<String> = cells
            .zip(&widths)
            .map(|(c, w)| format!(" {c:<w$} "))
            .collect();
        format!("|{}|\n", inner.join("|"))
    };
    let sep = format!(
        "+{}+\n",
        widths
            .iter()
            .map(|w| "-".repeat(w + 2))
            .collect::<Vec<_>>()
            .join("+")
    );
    let mut out = sep.clone();
    out.push_str(&line(&mut header.iter().copied()));
    out.push_str(&sep);
    for r in rows {
        out.push_str(&line(&mut r.iter().map(String::as_str)));
    }
    out.push_str(&sep);
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn columns_are_as_wide_as_their_widest_cell() {
        let t = super::render(&["A", "LONG"], &[vec!["wide cell".into(), "x".into()]]);
        assert_eq!(
            t,
            "+-----------+------+\n| A         | LONG |\n+-----------+------+\n\
             | wide cell | x    |\n+-----------+------+\n"
        );
    }
}
