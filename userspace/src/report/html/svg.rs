//! Hand-written SVG for the page: latency heatmaps (x: time, y: latency in
//! power-of-two rows, colour: how many), the shared episode timeline, and a
//! bulk flow's limiter strip. Every chart of a page uses the same time axis
//! (the run's window), so an episode's band lines up across all of them.
//! Written with the page's template, which escapes every string.

use maud::{Markup, html};

use crate::hist::BUCKETS;
use crate::report::episodes::EpisodeState;
use crate::report::merge::{Sparse, Unit, bucket_bounds};
use crate::report::time::{clock, latency_us, sig3, thousands};
use crate::report::view::{EpisodeView, FlowView};

/// Plot geometry shared by every chart, px.
pub const PLOT_W: f64 = 880.0;
const LEFT: f64 = 78.0;
const RIGHT: f64 = 12.0;
const AXIS_H: f64 = 22.0;
const ROW_H: f64 = 14.0;
/// The whole width of a chart.
const WIDTH: f64 = LEFT + PLOT_W + RIGHT;
/// More intervals than this are binned into equal-time columns.
const MAX_COLUMNS: usize = 440;

/// A coordinate, to a tenth of a pixel.
fn px(v: f64) -> String {
    format!("{v:.1}")
}

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
    fn draw(&self, y: f64) -> Markup {
        html! {
            line class="axis" x1=(LEFT) y1=(y) x2=(px(LEFT + PLOT_W)) y2=(y) {}
            @for t in self.ticks() {
                @let x = px(self.x(t));
                line class="tick" x1=(x) y1=(y) x2=(x) y2=(px(y + 4.0)) {}
                text class="tick-label" x=(x) y=(px(y + 15.0)) text-anchor="middle" { (clock_label(t)) }
            }
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

/// What a heatmap is of, as its data attributes say for tests and scripts.
pub enum Subject<'a> {
    Disk {
        dev: &'a str,
        op: &'a str,
    },
    Iface(&'a str),
    /// A SQL Server instance's requests, by its worker's pid.
    Instance(u32),
}

/// Power-of-two row of a bucket index (the log-linear geometry has 16
/// sub-buckets per power of two, so this is exact).
fn row_of(index: u16) -> usize {
    usize::from(index) >> 4
}

/// The grid of a heatmap: each column's time span and its count per
/// power-of-two row.
fn grid(axis: TimeAxis, columns: &[Column]) -> (Vec<(i64, i64)>, Vec<Vec<u64>>) {
    let rows_total = (BUCKETS >> 4) + 1;
    let mut spans = Vec::new();
    let mut grid = Vec::new();
    if columns.len() > MAX_COLUMNS {
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
    (spans, grid)
}

/// A heatmap of one series. `own` episodes (those about this disk or
/// interface) are drawn as strong bands, the others faintly.
pub fn heatmap(
    title: &str,
    unit: Unit,
    axis: TimeAxis,
    columns: &[Column],
    episodes: &[(&EpisodeView, bool)],
    subject: Subject,
) -> Markup {
    let (spans, grid) = grid(axis, columns);
    let rows_total = (BUCKETS >> 4) + 1;
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
    let total_h = format!("{:.0}", height + AXIS_H + 6.0);
    let (dev, op, iface, worker) = match subject {
        Subject::Disk { dev, op } => (Some(dev), Some(op), None, None),
        Subject::Iface(i) => (None, None, Some(i), None),
        Subject::Instance(pid) => (None, None, None, Some(pid)),
    };
    html! {
        svg class="heatmap" data-dev=[dev] data-op=[op] data-iface=[iface] data-worker=[worker]
            viewBox=(format!("0 0 {WIDTH:.0} {total_h}")) width=(format!("{WIDTH:.0}"))
            height=(total_h) role="img" aria-label=(title) {
            rect class="plot-bg" x=(LEFT) y="0" width=(PLOT_W) height=(px(height)) {}
            @for (ci, col) in grid.iter().enumerate() {
                @let (from, to) = spans[ci];
                @let x0 = axis.x(from);
                @let w = (axis.x(to) - x0).max(1.0);
                @for (r, &n) in col.iter().enumerate().take(hi + 1).skip(lo) {
                    @if n > 0 {
                        @let (low, high) = row_range(unit, r);
                        rect class="cell" x=(px(x0)) y=(px((hi - r) as f64 * ROW_H))
                            width=(px(w)) height=(ROW_H) fill=(colour(n, max)) {
                            title {
                                (clock(from)) " to " (clock(to)) ": " (value_label(unit, low))
                                " to " (value_label(unit, high)) ": " (thousands(n))
                            }
                        }
                    }
                }
            }
            @for r in lo..=hi {
                // Label every row when there are few, else every other one.
                @if rows <= 16 || (r - lo) % 2 == 0 {
                    text class="row-label" x=(px(LEFT - 6.0))
                        y=(px((hi - r) as f64 * ROW_H + ROW_H * 0.75)) text-anchor="end" {
                        (value_label(unit, row_range(unit, r).0))
                    }
                }
            }
            @for (e, own) in episodes {
                @let x0 = axis.x(e.start_us);
                rect class=(if *own { "episode-band own" } else { "episode-band" })
                    data-episode=(e.id) x=(px(x0)) y="0"
                    width=(px((axis.x(e.end_us) - x0).max(2.0))) height=(px(height)) {
                    title { "#" (e.rank) " " (e.kind_words) ": " (e.cause_words) }
                }
            }
            (axis.draw(height))
        }
    }
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
pub fn timeline(axis: TimeAxis, episodes: &[EpisodeView]) -> Markup {
    let lane = 22.0;
    let height = episodes.len().max(1) as f64 * lane;
    let total_h = format!("{:.0}", height + AXIS_H + 6.0);
    html! {
        svg class="timeline" viewBox=(format!("0 0 {WIDTH:.0} {total_h}"))
            width=(format!("{WIDTH:.0}")) height=(total_h) role="img"
            aria-label="stall episodes over the recording" {
            rect class="plot-bg" x=(LEFT) y="0" width=(PLOT_W) height=(px(height)) {}
            @for (i, e) in episodes.iter().enumerate() {
                @let y = i as f64 * lane + 3.0;
                @let x0 = axis.x(e.start_us);
                @let open = e.when.state == EpisodeState::StillOpen;
                text class="row-label" x=(px(LEFT - 6.0)) y=(px(y + 12.0)) text-anchor="end" {
                    "#" (e.rank) " " (e.kind_words)
                }
                rect class=(format!("episode kind-{}{}", e.kind, if open { " still-open" } else { "" }))
                    id=(format!("episode-{}", e.id)) data-episode=(e.id) x=(px(x0)) y=(px(y))
                    width=(px((axis.x(e.end_us) - x0).max(3.0))) height=(px(lane - 6.0)) rx="3" {
                    title {
                        "#" (e.rank) " " (e.kind_words) ": " (e.cause_words) ", "
                        (e.when.start) " to " (e.when.end)
                        @if let Some(note) = e.when.note() { ", " (note) }
                    }
                }
            }
            (axis.draw(height))
        }
    }
}

/// A flow's limiter over time (coloured spans) and its send rate (a line).
pub fn flow_strip(axis: TimeAxis, f: &FlowView) -> Markup {
    let h = 40.0;
    let total_h = format!("{:.0}", h + AXIS_H + 6.0);
    let peak = f.data.peak_send_mbps.max(1e-9);
    let points: Vec<String> = f
        .data
        .series
        .iter()
        .map(|p| {
            let x = axis.x(p.ts_us - p.interval_ms as i64 * 500);
            let y = h - 2.0 - (p.send_mbps / peak) * (h - 6.0);
            format!("{x:.1},{y:.1}")
        })
        .collect();
    html! {
        svg class="flow" viewBox=(format!("0 0 {WIDTH:.0} {total_h}"))
            width=(format!("{WIDTH:.0}")) height=(total_h) role="img"
            aria-label="limiter over time" {
            rect class="plot-bg" x=(LEFT) y="0" width=(PLOT_W) height=(h) {}
            @for s in &f.spans {
                @let x0 = axis.x(s.start_us);
                rect class=(format!("limiter limiter-{}", s.limiter)) x=(px(x0)) y="0"
                    width=(px((axis.x(s.end_us) - x0).max(1.0))) height=(h) {
                    title { (s.words) }
                }
            }
            @if points.len() > 1 {
                polyline class="rate" points=(points.join(" ")) {}
            }
            text class="row-label" x=(px(LEFT - 6.0)) y="14" text-anchor="end" {
                (sig3(f.data.peak_send_mbps)) " Mbit/s"
            }
            (axis.draw(h))
        }
    }
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
