//! Hand-written SVG for the page: latency heatmaps (x: time, y: latency in
//! power-of-two rows, colour: how many), the shared episode timeline, and a
//! bulk flow's limiter strip. Every chart of a page uses the same time axis
//! (the run's window), so an episode's band lines up across all of them.

use std::fmt::Write as _;

use super::esc;
use crate::hist::BUCKETS;
use crate::report::episodes::{Episode, EpisodeState, cause_words};
use crate::report::merge::{Sparse, Unit, bucket_bounds};
use crate::report::network::BulkFlow;
use crate::report::time::{clock, latency_us, thousands};

/// Plot geometry shared by every chart, px.
pub const PLOT_W: f64 = 880.0;
const LEFT: f64 = 78.0;
const RIGHT: f64 = 12.0;
const AXIS_H: f64 = 22.0;
const ROW_H: f64 = 14.0;
/// More intervals than this are binned into equal-time columns.
const MAX_COLUMNS: usize = 440;

/// The run's window: µs since the epoch to x in the plot.
#[derive(Clone, Copy)]
pub struct TimeAxis {
    pub start_us: i64,
    pub end_us: i64,
}

impl TimeAxis {
    fn span(&self) -> f64 {
        (self.end_us - self.start_us).max(1) as f64
    }

    pub fn x(&self, us: i64) -> f64 {
        let f = (us - self.start_us) as f64 / self.span();
        LEFT + f.clamp(0.0, 1.0) * PLOT_W
    }

    /// Tick marks every 1-2-5 step that gives at most 8 of them.
    fn ticks(&self) -> Vec<i64> {
        const STEPS_MS: [i64; 16] = [
            100, 200, 500, 1_000, 2_000, 5_000, 10_000, 15_000, 30_000, 60_000, 120_000, 300_000,
            600_000, 900_000, 1_800_000, 3_600_000,
        ];
        let span_ms = self.span() / 1000.0;
        let step_ms = STEPS_MS
            .iter()
            .copied()
            .find(|s| span_ms / *s as f64 <= 8.0)
            .unwrap_or(((span_ms / 8.0) as i64 / 3_600_000 + 1) * 3_600_000);
        let step = step_ms * 1000;
        let mut t = (self.start_us / step + 1) * step;
        let mut out = Vec::new();
        while t < self.end_us {
            out.push(t);
            t += step;
        }
        out
    }

    /// The time axis under a plot whose bottom is at `y`.
    fn draw(&self, svg: &mut String, y: f64) {
        let _ = write!(
            svg,
            r#"<line class="axis" x1="{LEFT}" y1="{y}" x2="{:.1}" y2="{y}"/>"#,
            LEFT + PLOT_W
        );
        for t in self.ticks() {
            let x = self.x(t);
            let _ = write!(
                svg,
                r#"<line class="tick" x1="{x:.1}" y1="{y}" x2="{x:.1}" y2="{:.1}"/><text class="tick-label" x="{x:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
                y + 4.0,
                y + 15.0,
                clock_label(t)
            );
        }
    }
}

/// `00:55:16` or `00:55:16.5` when the second is not whole.
fn clock_label(us: i64) -> String {
    let full = clock(us);
    let (hms, frac) = full.split_once('.').unwrap_or((&full, "000"));
    let frac = frac.trim_end_matches('0');
    if frac.is_empty() {
        hms.to_string()
    } else {
        format!("{hms}.{frac}")
    }
}

/// One interval of a heatmap: its end, its length, its buckets.
pub struct Column<'a> {
    pub ts_us: i64,
    pub interval_ms: u64,
    pub buckets: &'a Sparse,
}

/// Power-of-two row of a bucket index (the log-linear geometry has 16
/// sub-buckets per power of two, so this is exact).
fn row_of(index: u16) -> usize {
    usize::from(index) >> 4
}

/// A heatmap of one series. `own` episodes (those about this disk or
/// interface) are drawn as strong bands, the others faintly.
pub fn heatmap(
    title: &str,
    unit: Unit,
    axis: TimeAxis,
    columns: &[Column],
    episodes: &[(&Episode, usize, bool)],
    attrs: &str,
) -> String {
    // The grid: columns × power-of-two rows, with each column's x span.
    let mut spans: Vec<(i64, i64)> = Vec::new();
    let mut grid: Vec<Vec<u64>> = Vec::new();
    let rows_total = (BUCKETS >> 4) + 1;
    let binned = columns.len() > MAX_COLUMNS;
    if binned {
        let bin_us =
            ((axis.end_us - axis.start_us).max(1) as f64 / MAX_COLUMNS as f64).ceil() as i64;
        for i in 0..MAX_COLUMNS as i64 {
            spans.push((axis.start_us + i * bin_us, axis.start_us + (i + 1) * bin_us));
        }
        grid = vec![vec![0; rows_total]; MAX_COLUMNS];
        for c in columns {
            let bin = (((c.ts_us - axis.start_us).max(0)) / bin_us).min(MAX_COLUMNS as i64 - 1);
            for &(index, n) in c.buckets {
                grid[bin as usize][row_of(index)] += n;
            }
        }
    } else {
        for c in columns {
            spans.push((c.ts_us - c.interval_ms as i64 * 1000, c.ts_us));
            let mut col = vec![0; rows_total];
            for &(index, n) in c.buckets {
                col[row_of(index)] += n;
            }
            grid.push(col);
        }
    }
    let used = |r: usize| grid.iter().any(|col| col[r] > 0);
    let (lo, hi) = match (
        (0..rows_total).find(|&r| used(r)),
        (0..rows_total).rev().find(|&r| used(r)),
    ) {
        (Some(lo), Some(hi)) => (lo, hi),
        _ => (0, 0),
    };
    // At least 6 rows, so a narrow distribution still reads as one.
    let hi = hi.max(lo + 5).min(rows_total - 1);
    let rows = hi - lo + 1;
    let max = grid.iter().flatten().copied().max().unwrap_or(0);
    let height = rows as f64 * ROW_H;
    let total_h = height + AXIS_H + 6.0;
    let mut svg = format!(
        r#"<svg class="heatmap" {attrs} viewBox="0 0 {:.0} {total_h:.0}" width="{:.0}" height="{total_h:.0}" role="img" aria-label="{}">"#,
        LEFT + PLOT_W + RIGHT,
        LEFT + PLOT_W + RIGHT,
        esc(title)
    );
    let _ = write!(
        svg,
        r#"<rect class="plot-bg" x="{LEFT}" y="0" width="{PLOT_W}" height="{height:.1}"/>"#
    );
    for (ci, col) in grid.iter().enumerate() {
        let (from, to) = spans[ci];
        let x0 = axis.x(from);
        let w = (axis.x(to) - x0).max(1.0);
        for (r, &n) in col.iter().enumerate().take(hi + 1).skip(lo) {
            if n == 0 {
                continue;
            }
            let y = (hi - r) as f64 * ROW_H;
            let (low, high) = row_range(unit, r);
            let _ = write!(
                svg,
                r#"<rect class="cell" x="{x0:.1}" y="{y:.1}" width="{w:.1}" height="{ROW_H}" fill="{}"><title>{} to {}: {} to {}: {}</title></rect>"#,
                colour(n, max),
                clock(from),
                clock(to),
                esc(&value_label(unit, low)),
                esc(&value_label(unit, high)),
                thousands(n)
            );
        }
    }
    for r in lo..=hi {
        // Label every row when there are few, else every other one.
        if rows > 16 && (r - lo) % 2 == 1 {
            continue;
        }
        let y = (hi - r) as f64 * ROW_H + ROW_H * 0.75;
        let _ = write!(
            svg,
            r#"<text class="row-label" x="{:.1}" y="{y:.1}" text-anchor="end">{}</text>"#,
            LEFT - 6.0,
            esc(&value_label(unit, row_range(unit, r).0))
        );
    }
    for (e, rank, own) in episodes {
        let x0 = axis.x(e.start_us);
        let w = (axis.x(e.end_us) - x0).max(2.0);
        let _ = write!(
            svg,
            r#"<rect class="episode-band{}" data-episode="{}" x="{x0:.1}" y="0" width="{w:.1}" height="{height:.1}"><title>#{rank} {}: {}</title></rect>"#,
            if *own { " own" } else { "" },
            e.id,
            esc(&e.kind),
            esc(&cause_words(&e.cause))
        );
    }
    axis.draw(&mut svg, height);
    svg.push_str("</svg>");
    svg
}

/// The value range of a power-of-two row, in the field's unit.
fn row_range(unit: Unit, row: usize) -> (f64, f64) {
    let first = (row << 4).min(BUCKETS - 1);
    let last = ((row << 4) + 15).min(BUCKETS - 1);
    (bucket_bounds(unit, first).0, bucket_bounds(unit, last).1)
}

fn value_label(unit: Unit, v: f64) -> String {
    match unit {
        Unit::Micros => latency_us(v),
        Unit::Count => format!("{v:.0}"),
    }
}

/// Light yellow (few) to dark purple (many), on a log scale: a handful of
/// slow I/Os beside a million fast ones still shows.
pub fn colour(n: u64, max: u64) -> String {
    const STOPS: [(f64, [f64; 3]); 5] = [
        (0.0, [255.0, 247.0, 188.0]),
        (0.25, [254.0, 196.0, 79.0]),
        (0.5, [236.0, 112.0, 20.0]),
        (0.75, [166.0, 54.0, 3.0]),
        (1.0, [60.0, 20.0, 80.0]),
    ];
    let t = if max <= 1 {
        1.0
    } else {
        ((n as f64).ln_1p() / (max as f64).ln_1p()).clamp(0.0, 1.0)
    };
    let i = STOPS
        .iter()
        .rposition(|(at, _)| t >= *at)
        .unwrap_or(0)
        .min(STOPS.len() - 2);
    let (a, ca) = STOPS[i];
    let (b, cb) = STOPS[i + 1];
    let f = (t - a) / (b - a);
    let c: Vec<u8> = (0..3)
        .map(|k| (ca[k] + (cb[k] - ca[k]) * f).round() as u8)
        .collect();
    format!("#{:02x}{:02x}{:02x}", c[0], c[1], c[2])
}

/// Every episode as a bar on the run's time axis, one lane each, in rank order.
pub fn timeline(axis: TimeAxis, episodes: &[Episode]) -> String {
    let lane = 22.0;
    let height = episodes.len().max(1) as f64 * lane;
    let total_h = height + AXIS_H + 6.0;
    let mut svg = format!(
        r#"<svg class="timeline" viewBox="0 0 {:.0} {total_h:.0}" width="{:.0}" height="{total_h:.0}" role="img" aria-label="stall episodes over the recording">"#,
        LEFT + PLOT_W + RIGHT,
        LEFT + PLOT_W + RIGHT
    );
    let _ = write!(
        svg,
        r#"<rect class="plot-bg" x="{LEFT}" y="0" width="{PLOT_W}" height="{height:.1}"/>"#
    );
    for (i, e) in episodes.iter().enumerate() {
        let y = i as f64 * lane + 3.0;
        let x0 = axis.x(e.start_us);
        let w = (axis.x(e.end_us) - x0).max(3.0);
        let open = e.state == EpisodeState::StillOpen;
        let _ = write!(
            svg,
            r##"<text class="row-label" x="{:.1}" y="{:.1}" text-anchor="end">#{} {}</text><rect class="episode kind-{}{}" id="episode-{}" data-episode="{}" x="{x0:.1}" y="{y:.1}" width="{w:.1}" height="{:.1}" rx="3"><title>#{} {}: {}, {} to {}{}</title></rect>"##,
            LEFT - 6.0,
            y + 12.0,
            i + 1,
            esc(&cause_words(&e.kind)),
            esc(&e.kind),
            if open { " still-open" } else { "" },
            e.id,
            e.id,
            lane - 6.0,
            i + 1,
            esc(&e.kind),
            esc(&cause_words(&e.cause)),
            clock(e.start_us),
            clock(e.end_us),
            if open {
                ", still open when the recording ended"
            } else {
                ""
            }
        );
    }
    axis.draw(&mut svg, height);
    svg.push_str("</svg>");
    svg
}

/// A flow's limiter over time (coloured spans) and its send rate (a line).
pub fn flow_strip(axis: TimeAxis, f: &BulkFlow) -> String {
    let h = 40.0;
    let total_h = h + AXIS_H + 6.0;
    let mut svg = format!(
        r#"<svg class="flow" viewBox="0 0 {:.0} {total_h:.0}" width="{:.0}" height="{total_h:.0}" role="img" aria-label="limiter over time">"#,
        LEFT + PLOT_W + RIGHT,
        LEFT + PLOT_W + RIGHT
    );
    let _ = write!(
        svg,
        r#"<rect class="plot-bg" x="{LEFT}" y="0" width="{PLOT_W}" height="{h}"/>"#
    );
    for (start, end, limiter) in f.limiter_spans() {
        let x0 = axis.x(start);
        let w = (axis.x(end) - x0).max(1.0);
        let _ = write!(
            svg,
            r#"<rect class="limiter limiter-{}" x="{x0:.1}" y="0" width="{w:.1}" height="{h}"><title>{} to {}: {}</title></rect>"#,
            esc(&limiter),
            clock(start),
            clock(end),
            esc(&limiter)
        );
    }
    let peak = f.peak_send_mbps.max(1e-9);
    let points: Vec<String> = f
        .series
        .iter()
        .map(|p| {
            let x = axis.x(p.ts_us - p.interval_ms as i64 * 500);
            let y = h - 2.0 - (p.send_mbps / peak) * (h - 6.0);
            format!("{x:.1},{y:.1}")
        })
        .collect();
    if points.len() > 1 {
        let _ = write!(
            svg,
            r#"<polyline class="rate" points="{}"/>"#,
            points.join(" ")
        );
    }
    let _ = write!(
        svg,
        r#"<text class="row-label" x="{:.1}" y="14" text-anchor="end">{} Mbit/s</text>"#,
        LEFT - 6.0,
        crate::report::time::sig3(f.peak_send_mbps)
    );
    axis.draw(&mut svg, h);
    svg.push_str("</svg>");
    svg
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn colours_run_from_light_to_dark_on_a_log_scale() {
        assert_eq!(colour(1, 1), "#3c1450");
        assert_eq!(colour(1_000_000, 1_000_000), "#3c1450");
        // One in a million is still visibly coloured, not background.
        assert_ne!(colour(1, 1_000_000), colour(0, 1_000_000));
        assert_eq!(colour(0, 1_000_000), "#fff7bc");
    }

    #[test]
    fn rows_are_powers_of_two_of_nanoseconds() {
        // Row 7: bucket indexes 112..=127, [1024, 2047] ns.
        assert_eq!(row_range(Unit::Micros, 7), (1.024, 2.047));
        assert_eq!(row_of(112), 7);
        assert_eq!(row_of(127), 7);
    }

    #[test]
    fn ticks_fall_inside_the_window_on_round_times() {
        let start = crate::report::time::parse_us("2026-11-22T00:55:14.702669Z").unwrap();
        let axis = TimeAxis {
            start_us: start,
            end_us: start + 6_060_000,
        };
        let ticks = axis.ticks();
        assert!(!ticks.is_empty() && ticks.len() <= 8, "{ticks:?}");
        for t in &ticks {
            assert!(*t > axis.start_us && *t < axis.end_us);
            assert_eq!(t % 1_000_000, 0);
        }
        assert_eq!(clock_label(ticks[0]), "00:55:15");
    }
}
