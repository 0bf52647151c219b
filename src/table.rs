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

/// [`render`], at most `width` columns wide: the widest of the columns `first` are cut first,
/// then the widest of all (never below their header), each cut cell ending in `…`.
pub fn render_within(
    header: &[&str],
    rows: &[Vec<String>],
    width: usize,
    first: &[usize],
) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    let floors = widths.clone();
    for r in rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let total = |w: &[usize]| w.iter().sum::<usize>() + 3 * w.len() + 1;
    let cuttable = |w: &[usize], i: usize| w[i] > floors[i].max(3);
    while total(&widths) > width {
        let widest = |among: &mut dyn Iterator<Item = usize>| {
            among
                .filter(|&i| cuttable(&widths, i))
                .max_by_key(|&i| (widths[i], i))
        };
        let Some(i) = widest(&mut first.iter().copied().filter(|&i| i < widths.len()))
            .or_else(|| widest(&mut (0..widths.len())))
        else {
            break;
        };
        widths[i] -= 1;
    }
    let cut = |c: &str, w: usize| -> String {
        if c.chars().count() <= w {
            c.to_owned()
        } else {
            let mut s: String = c.chars().take(w.saturating_sub(1)).collect();
            s.push('…');
            s
        }
    };
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|r| r.iter().zip(&widths).map(|(c, w)| cut(c, *w)).collect())
        .collect();
    render(header, &rows)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_widest_columns_are_cut_to_fit() {
        let rows = vec![vec![
            "web".into(),
            "a long reason to say".into(),
            "x".into(),
        ]];
        let t = super::render_within(&["GROUP", "REASON", "NOTE"], &rows, 28, &[]);
        assert!(t.lines().all(|l| l.chars().count() <= 28), "{t}");
        assert!(t.contains("| a long r… |"), "{t}");
        // Wide enough: as render draws it.
        assert_eq!(
            super::render_within(&["GROUP", "REASON", "NOTE"], &rows, 100, &[2]),
            super::render(&["GROUP", "REASON", "NOTE"], &rows)
        );
    }

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
