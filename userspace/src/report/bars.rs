//! Terminal bar charts of a merged histogram. The 976 log-linear buckets are
//! too fine to read, so they are grouped into ranges a person reads at a
//! glance: 1-2-5 steps for latencies (1–2 µs, 2–5 µs, 5–10 µs, ...), powers of
//! two for requests in flight (1, 2–3, 4–7, ...: these edges are bucket edges,
//! so in-flight counts are exact). A fine bucket that straddles a 1-2-5 edge
//! goes to the range holding its midpoint: a range's count can be off by the
//! values of one fine bucket (≤ 6.25% wide) at each edge.

use super::merge::{MergedHist, Unit, bucket_mid};
use super::time::{latency_us, thousands};

/// One row of a chart.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    pub label: String,
    pub count: u64,
    /// `p50`, `p99`, `max`, `limit`: what falls in this range.
    pub marks: Vec<&'static str>,
}

/// 0, 1, 2, 5, 10, 20, 50, ... up to 500 s, in µs.
fn latency_edges() -> Vec<f64> {
    let mut edges = vec![0.0];
    let mut decade = 1.0;
    while decade <= 1e8 {
        edges.extend([decade, 2.0 * decade, 5.0 * decade]);
        decade *= 10.0;
    }
    edges
}

/// 0, 1, 2, 4, 8, ...: ranges [0], [1], [2, 3], [4, 7], ...
fn count_edges() -> Vec<f64> {
    let mut edges = vec![0.0, 1.0];
    let mut e = 2.0;
    while e <= 2f64.powi(40) {
        edges.push(e);
        e *= 2.0;
    }
    edges
}

/// Index of the range `[edges[i], edges[i + 1])` holding `v`.
fn range_of(edges: &[f64], v: f64) -> usize {
    edges.iter().rposition(|&e| v >= e).unwrap_or(0)
}

fn latency_label(lo: f64, hi: Option<f64>) -> String {
    let unit_of = |v: f64| {
        if v < 1000.0 {
            "µs"
        } else if v < 1e6 {
            "ms"
        } else {
            "s"
        }
    };
    let num = |v: f64| {
        let scaled = match unit_of(v) {
            "µs" => v,
            "ms" => v / 1e3,
            _ => v / 1e6,
        };
        format!("{scaled}")
    };
    match hi {
        None => format!("≥ {}", latency_us(lo)),
        // `1–2 ms`, but `500 µs–1 ms` across a unit change.
        Some(hi) if unit_of(lo) == unit_of(hi) || lo == 0.0 => {
            format!("{}–{} {}", num(lo), num(hi), unit_of(hi))
        }
        Some(hi) => format!("{} {}–{} {}", num(lo), unit_of(lo), num(hi), unit_of(hi)),
    }
}

fn count_label(lo: f64, hi: Option<f64>) -> String {
    match hi {
        Some(hi) if hi - lo <= 1.0 => format!("{lo}"),
        Some(hi) => format!("{lo}–{}", hi - 1.0),
        None => format!("≥ {lo}"),
    }
}

/// Names a range `[low, high)` (`high` absent for the last).
type LabelFn = fn(f64, Option<f64>) -> String;

/// Rows from the first non-empty range to the last (empty ranges between
/// them stay: the gaps are part of the shape), with p50, p99 and max marked,
/// and `limit` (a queue depth) marked on a count chart.
pub fn rows(h: &MergedHist, limit: Option<f64>) -> Vec<Row> {
    let (edges, label): (Vec<f64>, LabelFn) = match h.unit() {
        Unit::Micros => (latency_edges(), latency_label),
        Unit::Count => (count_edges(), count_label),
    };
    let mut counts = vec![0u64; edges.len()];
    for (index, n) in h.sparse() {
        counts[range_of(&edges, bucket_mid(h.unit(), usize::from(index)))] += n;
    }
    let (Some(first), Some(last)) = (
        counts.iter().position(|&n| n > 0),
        counts.iter().rposition(|&n| n > 0),
    ) else {
        return Vec::new();
    };
    let mut marks: Vec<(usize, &'static str)> = Vec::new();
    for (name, v) in [("p50", h.percentile(0.5)), ("p99", h.percentile(0.99))] {
        if let Some(v) = v {
            marks.push((range_of(&edges, v), name));
        }
    }
    // `max` is the highest bucket's upper edge: mark the range its values went to.
    if let Some(&(index, _)) = h.sparse().last() {
        marks.push((
            range_of(&edges, bucket_mid(h.unit(), usize::from(index))),
            "max",
        ));
    }
    let mut last = last;
    let mut first = first;
    // A limit just past the data is worth a row (the data stops short of it);
    // one far beyond would only add empty rows: the caller says it in words.
    if let Some(l) = limit {
        let i = range_of(&edges, l);
        if i <= last + 1 {
            marks.push((i, "limit"));
            last = last.max(i);
            first = first.min(i);
        }
    }
    (first..=last)
        .map(|i| Row {
            label: label(edges[i], edges.get(i + 1).copied()),
            count: counts[i],
            marks: marks
                .iter()
                .filter(|(at, _)| *at == i)
                .map(|(_, m)| *m)
                .collect(),
        })
        .collect()
}

const EIGHTHS: [&str; 8] = ["", "▏", "▎", "▍", "▌", "▋", "▊", "▉"];

/// A bar of `count / max` of `width` cells, in eighths; a non-zero count
/// always shows (one eighth), however small.
pub fn bar(count: u64, max: u64, width: usize) -> String {
    if max == 0 || count == 0 || width == 0 {
        return String::new();
    }
    let eighths = ((count as f64 / max as f64) * (width * 8) as f64).round() as usize;
    let eighths = eighths.clamp(1, width * 8);
    let mut s = "█".repeat(eighths / 8);
    s.push_str(EIGHTHS[eighths % 8]);
    s
}

/// The chart as lines: `label │bar      │ count  ◀ p50 p99`, fitting `width`.
pub fn render(rows: &[Row], width: usize, indent: usize) -> String {
    let label_w = rows
        .iter()
        .map(|r| r.label.chars().count())
        .max()
        .unwrap_or(0);
    let count_w = rows
        .iter()
        .map(|r| thousands(r.count).len())
        .max()
        .unwrap_or(1);
    let marks_w = 16; // "◀ p50 p99 max"
    let bar_w = width
        .saturating_sub(indent + label_w + count_w + marks_w + 6)
        .max(10);
    let max = rows.iter().map(|r| r.count).max().unwrap_or(0);
    let mut out = String::new();
    for r in rows {
        let b = bar(r.count, max, bar_w);
        let pad = bar_w.saturating_sub(b.chars().count());
        let marks = if r.marks.is_empty() {
            String::new()
        } else {
            format!("  ◀ {}", r.marks.join(" "))
        };
        let line = format!(
            "{:indent$}{:>label_w$} │{b}{:pad$}│ {:>count_w$}{marks}",
            "",
            r.label,
            "",
            thousands(r.count),
        );
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn latency(buckets: Value) -> MergedHist {
        let mut h = MergedHist::new(Unit::Micros);
        h.add(&crate::report::fixtures::hist(buckets, 1.0)).unwrap();
        h
    }
    use serde_json::Value;

    #[test]
    fn latency_buckets_group_into_1_2_5_ranges_with_marks() {
        // 90 values at ~1.06 µs, 9 at ~3.1 µs, 1 at ~700 µs.
        let h = latency(json!([
            [1.024, 1.087, 90],
            [3.072, 3.199, 9],
            [688.128, 720.895, 1]
        ]));
        let rows = rows(&h, None);
        let labels: Vec<&str> = rows.iter().map(|r| r.label.as_str()).collect();
        assert_eq!(
            labels,
            [
                "1–2 µs",
                "2–5 µs",
                "5–10 µs",
                "10–20 µs",
                "20–50 µs",
                "50–100 µs",
                "100–200 µs",
                "200–500 µs",
                "500 µs–1 ms"
            ]
        );
        let counts: Vec<u64> = rows.iter().map(|r| r.count).collect();
        assert_eq!(counts, [90, 9, 0, 0, 0, 0, 0, 0, 1]);
        assert_eq!(rows[0].marks, ["p50"]);
        assert_eq!(rows[1].marks, ["p99"]); // the 99th of 100 values is at ~3.1 µs
        assert_eq!(rows[8].marks, ["max"]);
        assert_eq!(rows.iter().map(|r| r.count).sum::<u64>(), h.count());
    }

    #[test]
    fn in_flight_ranges_are_powers_of_two_and_mark_the_limit() {
        let mut h = MergedHist::new(Unit::Count);
        h.add(&json!({"count": 55, "mean": 3.3, "buckets": [[1.0, 1.0, 10], [3.0, 3.0, 5], [4.0, 4.0, 40]]}))
            .unwrap();
        let rows_to = |limit| rows(&h, Some(limit));
        let near = rows_to(8.0);
        let labels: Vec<&str> = near.iter().map(|r| r.label.as_str()).collect();
        assert_eq!(labels, ["1", "2–3", "4–7", "8–15"]);
        assert_eq!(
            near.iter().map(|r| r.count).collect::<Vec<_>>(),
            [10, 5, 40, 0]
        );
        assert_eq!(near[2].marks, ["p50", "p99", "max"]);
        assert_eq!(near[3].marks, ["limit"]);
        // At the limit: marked on the data's own row.
        assert_eq!(rows_to(4.0)[2].marks, ["p50", "p99", "max", "limit"]);
        // Far above the data: no empty rows up to it, and no mark.
        let far = rows_to(128.0);
        assert_eq!(far.len(), 3);
        assert!(far.iter().all(|r| !r.marks.contains(&"limit")));
    }

    #[test]
    fn bars_scale_to_the_width_and_small_counts_still_show() {
        assert_eq!(bar(100, 100, 10), "██████████");
        assert_eq!(bar(50, 100, 10), "█████");
        assert_eq!(bar(1, 1_000_000, 10), "▏");
        assert_eq!(bar(0, 100, 10), "");
        let rendered = render(
            &[
                Row {
                    label: "1–2 µs".into(),
                    count: 1000,
                    marks: vec!["p50"],
                },
                Row {
                    label: "2–5 µs".into(),
                    count: 10,
                    marks: vec![],
                },
            ],
            60,
            2,
        );
        let lines: Vec<&str> = rendered.lines().collect();
        assert_eq!(lines.len(), 2);
        assert!(lines[0].ends_with("1,000  ◀ p50"), "{}", lines[0]);
        for l in &lines {
            assert!(l.chars().count() <= 60, "{l}");
        }
        // Both bars end at the same column: the frame lines up.
        let frame_end = |l: &str| {
            l.chars()
                .enumerate()
                .filter(|(_, c)| *c == '│')
                .nth(1)
                .map(|(i, _)| i)
        };
        assert_eq!(frame_end(lines[0]), frame_end(lines[1]));
        assert!(frame_end(lines[0]).is_some());
    }
}
