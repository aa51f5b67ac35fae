//! Markdown tables padded to column width, so the same text reads well in a
//! terminal and renders in docs/BENCHMARKS.md.

/// Figures read best right-aligned, words left-aligned: a column is a figure
/// column when every cell in it starts with a digit, or is empty or "–" (no figure).
fn numeric(rows: &[Vec<String>], col: usize) -> bool {
    rows.iter().all(|r| {
        r.get(col)
            .and_then(|c| c.chars().next())
            .is_none_or(|c| c.is_ascii_digit() || c == '–')
    })
}

/// The first column (labels) is always left-aligned.
pub fn markdown(headers: &[impl AsRef<str>], rows: &[Vec<String>]) -> String {
    let cols = headers.len();
    // At least 3: the width of a markdown alignment marker (`--:`).
    let mut width: Vec<usize> = headers
        .iter()
        .map(|h| h.as_ref().chars().count().max(3))
        .collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate().take(cols) {
            width[i] = width[i].max(cell.chars().count());
        }
    }
    let right: Vec<bool> = (0..cols).map(|i| i > 0 && numeric(rows, i)).collect();
    let line = |cells: Vec<String>| format!("| {} |\n", cells.join(" | "));
    let pad = |i: usize, s: &str| {
        let fill = " ".repeat(width[i].saturating_sub(s.chars().count()));
        if right[i] {
            format!("{fill}{s}")
        } else {
            format!("{s}{fill}")
        }
    };
    let mut out = line(
        headers
            .iter()
            .enumerate()
            .map(|(i, h)| pad(i, h.as_ref()))
            .collect(),
    );
    out += &line(
        (0..cols)
            .map(|i| {
                let dashes = "-".repeat(width[i]);
                if right[i] {
                    format!("{}:", &dashes[1..])
                } else {
                    dashes
                }
            })
            .collect(),
    );
    for row in rows {
        out += &line(
            (0..cols)
                .map(|i| pad(i, row.get(i).map_or("", |s| s)))
                .collect(),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn columns_line_up() {
        let t = super::markdown(
            &["a", "b", "c"],
            &[vec!["long".into(), "1".into(), "word".into()]],
        );
        assert_eq!(
            t,
            "| a    |   b | c    |\n| ---- | --: | ---- |\n| long |   1 | word |\n"
        );
    }
}
