//! The metrics a scrape reads: counters, gauges and classic histograms by
//! label set, and their Prometheus text exposition (format 0.0.4).
//!
//! Written here rather than with a Prometheus client library: the clients
//! (`prometheus`, `prometheus-client`) take observations one at a time,
//! while stalltrace's histograms arrive already counted, bucket by bucket, by
//! the kernel; and the format is a few lines of text.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::time::{Duration, Instant};

/// Label pairs in a fixed order (the family's own).
pub type Labels = Vec<(&'static str, String)>;

/// Series kept at most, whatever the host: a histogram counts as one. Past
/// it, new series are refused and counted (`stalltrace_metrics_series_refused_total`).
pub const MAX_SERIES: usize = 4096;

/// A series of a subject (a disk, an interface) nothing has updated for this
/// long is dropped (a disk removed, a namespace gone): the scrape and the
/// memory stay the size of what exists. Run-level series never expire.
pub const SERIES_TTL: Duration = Duration::from_secs(600);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

/// A histogram's `le` edges in the exported unit, ascending; `+Inf` is implied.
#[derive(Clone, Debug)]
pub struct Edges(pub Vec<f64>);

#[derive(Clone, Debug)]
enum Value {
    Number(f64),
    Histogram {
        /// Per edge (not cumulative); the last slot is above every edge.
        buckets: Vec<u64>,
        count: u64,
        sum: f64,
    },
}

#[derive(Clone, Debug)]
struct Series {
    value: Value,
    touched: Instant,
}

#[derive(Clone, Debug)]
struct Family {
    help: &'static str,
    kind: Kind,
    edges: Option<Edges>,
    /// Its series are dropped once SERIES_TTL passes without an update.
    expires: bool,
    series: BTreeMap<Labels, Series>,
}

#[derive(Clone, Debug, Default)]
pub struct Registry {
    families: BTreeMap<&'static str, Family>,
    series: usize,
    refused: u64,
}

impl Registry {
    /// Declares a counter or gauge; declaring again is harmless.
    pub fn declare(&mut self, name: &'static str, kind: Kind, help: &'static str) {
        debug_assert!(
            kind != Kind::Histogram,
            "histograms need edges: declare_histogram"
        );
        self.families.entry(name).or_insert(Family {
            help,
            kind,
            edges: None,
            expires: false,
            series: BTreeMap::new(),
        });
    }

    pub fn declare_histogram(&mut self, name: &'static str, help: &'static str, edges: &Edges) {
        self.families.entry(name).or_insert_with(|| Family {
            help,
            kind: Kind::Histogram,
            edges: Some(edges.clone()),
            expires: false,
            series: BTreeMap::new(),
        });
    }

    /// The series of `name` with `labels`, made (as `empty`) if there is room.
    fn series(
        &mut self,
        name: &str,
        labels: Labels,
        empty: fn(&Family) -> Value,
    ) -> Option<&mut Value> {
        let now = Instant::now();
        let family = self.families.get_mut(name)?;
        if !family.series.contains_key(&labels) {
            if self.series >= MAX_SERIES {
                self.refused += 1;
                return None;
            }
            self.series += 1;
            let value = empty(family);
            family.series.insert(
                labels.clone(),
                Series {
                    value,
                    touched: now,
                },
            );
        }
        let series = family.series.get_mut(&labels)?;
        series.touched = now;
        Some(&mut series.value)
    }

    pub fn add(&mut self, name: &str, labels: Labels, by: f64) {
        if let Some(Value::Number(v)) = self.series(name, labels, |_| Value::Number(0.0)) {
            *v += by;
        }
    }

    /// Sets a gauge, or a counter the kernel keeps the running total of.
    pub fn set(&mut self, name: &str, labels: Labels, to: f64) {
        if let Some(Value::Number(v)) = self.series(name, labels, |_| Value::Number(0.0)) {
            *v = to;
        }
    }

    /// Adds to a histogram: each `(at, count)` to the bucket whose upper edge
    /// is the first at or above `at` (a value in the exported unit), and `sum`
    /// to its sum. The series is made even when nothing is added, so a quiet
    /// subject still shows (with zeros).
    pub fn observe(
        &mut self,
        name: &str,
        labels: Labels,
        counts: impl IntoIterator<Item = (f64, u64)>,
        sum: f64,
    ) {
        let Some(edges) = self.families.get(name).and_then(|f| f.edges.clone()) else {
            return;
        };
        let empty = |f: &Family| Value::Histogram {
            buckets: vec![0; f.edges.as_ref().map_or(0, |e| e.0.len()) + 1],
            count: 0,
            sum: 0.0,
        };
        if let Some(Value::Histogram {
            buckets,
            count: total,
            sum: s,
        }) = self.series(name, labels, empty)
        {
            for (at, count) in counts {
                buckets[edges.0.partition_point(|&edge| edge < at)] += count;
                *total += count;
            }
            *s += sum;
        }
    }

    /// Marks `name`'s series as a subject's, dropped once not updated for a while.
    pub fn expires(&mut self, name: &str) {
        if let Some(family) = self.families.get_mut(name) {
            family.expires = true;
        }
    }

    /// Drops the series of expiring families not updated within `ttl` of `now`.
    pub fn expire(&mut self, now: Instant, ttl: Duration) {
        for family in self.families.values_mut().filter(|f| f.expires) {
            let before = family.series.len();
            family
                .series
                .retain(|_, s| now.saturating_duration_since(s.touched) < ttl);
            self.series -= before - family.series.len();
        }
    }

    pub fn refused(&self) -> u64 {
        self.refused
    }

    /// The text exposition of every series.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for (name, family) in &self.families {
            if family.series.is_empty() {
                continue;
            }
            let kind = match family.kind {
                Kind::Counter => "counter",
                Kind::Gauge => "gauge",
                Kind::Histogram => "histogram",
            };
            let _ = writeln!(out, "# HELP {name} {}", family.help);
            let _ = writeln!(out, "# TYPE {name} {kind}");
            for (labels, series) in &family.series {
                match &series.value {
                    Value::Number(v) => {
                        let _ = writeln!(out, "{name}{} {}", label_text(labels, None), number(*v));
                    }
                    Value::Histogram {
                        buckets,
                        count,
                        sum,
                    } => {
                        let edges = family.edges.as_ref().map_or(&[][..], |e| &e.0[..]);
                        let mut cumulative = 0;
                        for (edge, n) in edges.iter().zip(buckets) {
                            cumulative += n;
                            let le = number(*edge);
                            let _ = writeln!(
                                out,
                                "{name}_bucket{} {cumulative}",
                                label_text(labels, Some(&le))
                            );
                        }
                        let _ = writeln!(
                            out,
                            "{name}_bucket{} {count}",
                            label_text(labels, Some("+Inf"))
                        );
                        let _ = writeln!(
                            out,
                            "{name}_sum{} {}",
                            label_text(labels, None),
                            number(*sum)
                        );
                        let _ = writeln!(out, "{name}_count{} {count}", label_text(labels, None));
                    }
                }
            }
        }
        out
    }
}

/// `{a="x",b="y"}` (with `le` last), or nothing without labels.
fn label_text(labels: &Labels, le: Option<&str>) -> String {
    let mut pairs: Vec<String> = labels
        .iter()
        .map(|(k, v)| format!("{k}=\"{}\"", escape(v)))
        .collect();
    if let Some(le) = le {
        pairs.push(format!("le=\"{le}\""));
    }
    if pairs.is_empty() {
        String::new()
    } else {
        format!("{{{}}}", pairs.join(","))
    }
}

/// Label values escape backslash, double quote and line feed (the format's rule).
fn escape(v: &str) -> String {
    v.replace('\\', r"\\")
        .replace('"', r#"\""#)
        .replace('\n', r"\n")
}

/// Shortest text that reads back as the same float (Rust's `Display` is that).
fn number(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.into()
    } else {
        format!("{v}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(dev: &str) -> Labels {
        vec![("device", dev.to_string())]
    }

    #[test]
    fn renders_cumulative_buckets_and_escaped_labels() {
        let mut r = Registry::default();
        r.declare_histogram("t_seconds", "time", &Edges(vec![0.001, 0.01]));
        r.observe(
            "t_seconds",
            labels("a\"b"),
            [(0.0005, 2), (0.01, 1)],
            0.0108,
        );
        r.observe("t_seconds", labels("a\"b"), [(5.0, 1)], 5.0);
        r.declare("n_total", Kind::Counter, "count");
        r.add("n_total", vec![], 3.0);
        let text = r.render();
        assert!(
            text.contains("t_seconds_bucket{device=\"a\\\"b\",le=\"0.001\"} 2\n"),
            "{text}"
        );
        assert!(text.contains("t_seconds_bucket{device=\"a\\\"b\",le=\"0.01\"} 3\n"));
        assert!(text.contains("t_seconds_bucket{device=\"a\\\"b\",le=\"+Inf\"} 4\n"));
        assert!(text.contains("t_seconds_count{device=\"a\\\"b\"} 4\n"));
        assert!(text.contains("# TYPE n_total counter\nn_total 3\n"));
    }

    #[test]
    fn series_are_capped_and_expire() {
        let mut r = Registry::default();
        r.declare("g", Kind::Gauge, "g");
        r.expires("g");
        r.declare("run", Kind::Gauge, "run-level");
        r.set("run", vec![], 1.0);
        for i in 0..MAX_SERIES + 5 {
            r.set("g", labels(&i.to_string()), 1.0);
        }
        assert_eq!(r.refused(), 6);
        r.expire(Instant::now() + SERIES_TTL, SERIES_TTL);
        assert_eq!(
            r.render(),
            "# HELP run run-level\n# TYPE run gauge\nrun 1\n"
        );
        r.set("g", labels("new"), 2.0);
        assert_eq!(r.refused(), 6);
    }
}
