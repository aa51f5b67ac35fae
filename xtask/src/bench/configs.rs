//! Each configuration's figures of one part, the same for every paired
//! suite: a side (each figure's median and min–max over the rounds, with
//! the runs), each configuration over the untraced run of the same round
//! (the ratios), and the table that shows both in a suite's columns.

use std::collections::{BTreeMap, BTreeSet};
use std::marker::PhantomData;
use std::ops::Index;

use serde::Serialize;
use serde::ser::{SerializeMap, Serializer};

use super::paired::PartRuns;
use super::parts::{ProcessResult, process};
use super::stats::{Estimate, Summary, range, summary};

/// A run's figures, as its side and its ratios read them.
pub trait Figures: Clone + Serialize {
    /// Whether the published sides and ratios hold each figure as a key of
    /// its own, a ratio `null` where there is none (the block suite's
    /// shape), rather than under `figures`, a ratio left out where there is
    /// none (the net suite's).
    const AT_TOP: bool;
    /// Every figure of the run, by key.
    fn figures(&self) -> Vec<(&'static str, f64)>;
    fn figure(&self, key: &str) -> f64;
    /// Every other process's user-space CPU while it ran, in % of one CPU.
    fn others_user_cpu_pct(&self) -> f64;
    fn steal_pct(&self) -> f64;
}

/// One configuration of one part over the rounds.
pub struct Side<R> {
    pub figures: BTreeMap<&'static str, Summary>,
    pub others_user_cpu_pct: Summary,
    pub steal_pct: Summary,
    pub runs: Vec<R>,
}

impl<R: Figures> Side<R> {
    pub fn of<'a>(runs: impl IntoIterator<Item = &'a R>) -> Self
    where
        R: 'a,
    {
        let runs: Vec<R> = runs.into_iter().cloned().collect();
        let keys: BTreeSet<&'static str> = runs
            .iter()
            .flat_map(|r| r.figures().into_iter().map(|(k, _)| k))
            .collect();
        Side {
            figures: keys
                .into_iter()
                .map(|k| (k, summary(runs.iter().map(|r| r.figure(k)))))
                .collect(),
            others_user_cpu_pct: summary(runs.iter().map(R::others_user_cpu_pct)),
            steal_pct: summary(runs.iter().map(R::steal_pct)),
            runs,
        }
    }
}

impl<R: Figures> Serialize for Side<R> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(None)?;
        if R::AT_TOP {
            for (key, s) in &self.figures {
                map.serialize_entry(key, s)?;
            }
        } else {
            map.serialize_entry("figures", &self.figures)?;
        }
        map.serialize_entry("others_user_cpu_pct", &self.others_user_cpu_pct)?;
        map.serialize_entry("steal_pct", &self.steal_pct)?;
        map.serialize_entry("runs", &self.runs)?;
        map.end()
    }
}

/// A configuration over the untraced run of the same round, per figure:
/// median of the rounds' ratios and its 95% interval (None where no round
/// gave one: the untraced figure was 0 in every round).
pub struct Ratios<R> {
    by_figure: BTreeMap<&'static str, Option<Estimate>>,
    run: PhantomData<R>,
}

impl<R: Figures> Ratios<R> {
    /// Each of `keys`, `other`'s run over `untraced`'s of the same round.
    pub fn of<'a>(
        keys: &[&'static str],
        untraced: &[R],
        other: impl IntoIterator<Item = &'a R>,
    ) -> Self
    where
        R: 'a,
    {
        let pairs: Vec<(&R, &R)> = untraced.iter().zip(other).collect();
        let ratio = |k| Estimate::of(pairs.iter().map(|(u, t)| t.figure(k) / u.figure(k)));
        Ratios {
            by_figure: keys.iter().map(|&k| (k, ratio(k))).collect(),
            run: PhantomData,
        }
    }

    pub fn get(&self, key: &str) -> Option<&Estimate> {
        self.by_figure.get(key)?.as_ref()
    }
}

/// A figure's ratio, which must be there.
impl<R> Index<&str> for Ratios<R> {
    type Output = Estimate;

    fn index(&self, key: &str) -> &Estimate {
        self.by_figure[key]
            .as_ref()
            .expect("a ratio of that figure")
    }
}

impl<R: Figures> Serialize for Ratios<R> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(None)?;
        for (key, e) in &self.by_figure {
            if R::AT_TOP || e.is_some() {
                map.serialize_entry(key, e)?;
            }
        }
        map.end()
    }
}

/// What every paired suite publishes of one part's configurations:
/// untraced, stalltrace as deployed and with the accounting, the (first)
/// peer, each over the untraced run of the same round, and the processes'
/// own use.
#[derive(Serialize)]
#[serde(bound = "R: Figures")]
pub struct Configurations<R> {
    pub untraced: Side<R>,
    /// Without the accounting: what the ratios and the targets are about.
    pub traced: Side<R>,
    /// With the accounting: shown, judges nothing.
    pub traced_bpf_stats: Side<R>,
    pub peer: Side<R>,
    pub bpf_stats_ratio: Ratios<R>,
    pub peer_ratio: Ratios<R>,
    pub daemon: ProcessResult,
    pub peer_process: ProcessResult,
}

impl<R: Figures> Configurations<R> {
    /// `part`'s configurations, its ratios over `keys`.
    pub fn of<K>(part: &PartRuns<K, R>, keys: &[&'static str]) -> Self {
        let ratio = |other: Vec<&R>| Ratios::of(keys, &part.untraced, other);
        let traced_bpf_stats: Vec<&R> = part.traced_bpf_stats().iter().map(|r| &r.run).collect();
        let peer: Vec<&R> = part.peer(0).iter().map(|r| &r.run).collect();
        Configurations {
            untraced: Side::of(&part.untraced),
            traced: Side::of(part.traced().iter().map(|r| &r.run)),
            traced_bpf_stats: Side::of(traced_bpf_stats.iter().copied()),
            peer: Side::of(peer.iter().copied()),
            bpf_stats_ratio: ratio(traced_bpf_stats),
            peer_ratio: ratio(peer),
            daemon: process(part.traced().iter().map(|r| &r.usage)),
            peer_process: process(part.peer(0).iter().map(|r| &r.usage)),
        }
    }
}

/// A figure's columns in a configurations table: its median, with `digits`
/// decimals, and its min–max in a column of its own when `range` heads one.
pub struct Column {
    pub key: &'static str,
    pub header: &'static str,
    pub digits: usize,
    pub range: Option<&'static str>,
}

/// The headers of a configurations table with `columns`.
pub fn headers(columns: &[Column]) -> Vec<String> {
    let mut out = vec!["config".to_string()];
    for c in columns {
        out.push(c.header.into());
        out.extend(c.range.map(String::from));
    }
    out.extend(["others' CPU % (max)".into(), "steal % (max)".into()]);
    out
}

/// A side's row: each column's median (and min–max), then the neighbours'
/// CPU and the steal time, median (max).
pub fn side_row<R>(label: String, columns: &[Column], side: &Side<R>) -> Vec<String> {
    let mut row = vec![label];
    for c in columns {
        match side.figures.get(c.key) {
            Some(v) => {
                row.push(format!("{:.*}", c.digits, v.median));
                row.extend(c.range.map(|_| range(v, c.digits)));
            }
            None => {
                row.push("–".into());
                row.extend(c.range.map(|_| "–".to_string()));
            }
        }
    }
    let both = |s: &Summary| format!("{:.1} ({:.1})", s.median, s.max);
    row.extend([both(&side.others_user_cpu_pct), both(&side.steal_pct)]);
    row
}

/// A ratio's row: each column's median with its interval and, where the
/// column has a min–max, the ratios' min–max (a median alone otherwise).
pub fn ratio_row<R: Figures>(label: String, columns: &[Column], ratios: &Ratios<R>) -> Vec<String> {
    let mut row = vec![label];
    for c in columns {
        match (ratios.get(c.key), c.range) {
            (Some(e), Some(_)) => row.extend([e.text(3), e.range_text(3)]),
            (Some(e), None) => row.push(format!("{:.3}", e.median)),
            (None, range) => {
                row.push("–".into());
                row.extend(range.map(|_| String::new()));
            }
        }
    }
    row.extend([String::new(), String::new()]);
    row
}
