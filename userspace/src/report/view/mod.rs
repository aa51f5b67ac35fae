//! What the report says, worded once: every fact of a [`Report`] as the
//! strings a reader sees (units, rounding, plurals, "-" for nothing), built
//! here and laid out by `text` (a terminal) and `html` (a page). A layout
//! decides what to show and where; it does not word a fact itself, so the two
//! cannot drift apart.
//!
//! Every string from the stream passes through [`clean`] here: host names,
//! process names and paths come from the traced host and could carry terminal
//! escape sequences. (HTML escaping is the page template's job.)

mod episodes;
mod header;
mod losses;
mod network;
mod requests;
mod sessions;
mod storage;

pub use episodes::{EpisodeView, IMPACT_MEANS, NO_STALLS, glance};
pub use header::{Header, LOSSES_NONE, STREAM_COMPLETE};
pub use network::{FlowView, IfaceView, LIMITERS, LINK_OK, PeersView};
pub use requests::{RequestsView, TOTAL_MEANS};
pub use sessions::{IN_STALLS_MEANS, SessionRow, TIMEOUT_WAIT_MEANS};
pub use storage::{DiskView, OpView};

use super::merge::MergedHist;
use super::model::Report;
use super::time::latency_us;

/// How percentiles are read, for the closing note of either layout.
pub const PERCENTILES_NOTE: &str =
    "percentiles are nearest rank, reported as bucket midpoints (within 3.2% of the true value)";

/// The whole report, worded.
pub struct View<'a> {
    pub header: Header,
    /// Ranked by impact, rank 1 first.
    pub episodes: Vec<EpisodeView>,
    /// The worst tail per path, for a recording without episodes.
    pub glance: Vec<String>,
    /// Most time lost first.
    pub sessions: Vec<SessionRow>,
    /// Each SQL Server instance's requests.
    pub requests: Vec<RequestsView>,
    pub disks: Vec<DiskView<'a>>,
    pub interfaces: Vec<IfaceView<'a>>,
    pub peers: PeersView,
    pub flows: Vec<FlowView<'a>>,
    /// The run's window, µs since the epoch: the time axis of every chart.
    pub start_us: i64,
    pub end_us: i64,
}

impl<'a> View<'a> {
    pub fn of(report: &'a Report) -> Self {
        Self {
            header: Header::of(report),
            episodes: episodes::of(report),
            glance: glance(report),
            sessions: sessions::of(report),
            requests: requests::of(report),
            disks: storage::of(report),
            interfaces: network::interfaces(report),
            peers: network::peers(report),
            flows: network::flows(report),
            start_us: report.run.start_us,
            end_us: report.run.end_us,
        }
    }
}

/// Control characters (terminal escapes among them) from the host become `?`.
pub fn clean(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

/// `1 interval`, `2 intervals`: a count with its noun in the right number.
pub fn count(n: u64, one: &str, many: &str) -> String {
    format!(
        "{} {}",
        super::time::thousands(n),
        if n == 1 { one } else { many }
    )
}

/// A value that may be missing, as `-`.
pub fn or_dash(v: Option<f64>, fmt: impl Fn(f64) -> String) -> String {
    v.map(fmt).unwrap_or_else(|| "-".into())
}

/// A duration that is zero when nothing happened, as `-` then.
pub fn ms_or_dash(ms: f64) -> String {
    if ms > 0.0 {
        super::time::duration_ms(ms)
    } else {
        "-".into()
    }
}

/// A histogram's summary, each figure worded (`-` when there is none).
#[derive(Clone, Debug, PartialEq)]
pub struct Stats {
    pub count: String,
    pub mean: String,
    pub p50: String,
    pub p90: String,
    pub p99: String,
    pub max: String,
}

impl Stats {
    pub fn of(h: &MergedHist, fmt: fn(f64) -> String) -> Self {
        Self {
            count: super::time::thousands(h.count()),
            mean: or_dash(h.mean(), fmt),
            p50: or_dash(h.percentile(0.5), fmt),
            p90: or_dash(h.percentile(0.9), fmt),
            p99: or_dash(h.percentile(0.99), fmt),
            max: or_dash(h.max(), fmt),
        }
    }

    pub fn latency(h: &MergedHist) -> Self {
        Self::of(h, latency_us)
    }

    /// Requests in flight: whole numbers, except the mean. Above 15 a
    /// bucket spans several counts and its midpoint (what a percentile is)
    /// can fall between two: `81.5 requests` is said as 82.
    pub fn requests(h: &MergedHist) -> Self {
        let whole = |v: f64| v.round().to_string();
        Self {
            mean: or_dash(h.mean(), super::time::sig3),
            ..Self::of(h, whole)
        }
    }

    /// `p50 250 µs, p90 1.67 ms, p99 3.47 ms, max 11 ms`
    pub fn percentiles(&self) -> String {
        format!(
            "p50 {}, p90 {}, p99 {}, max {}",
            self.p50, self.p90, self.p99, self.max
        )
    }
}

#[cfg(test)]
mod tests;
