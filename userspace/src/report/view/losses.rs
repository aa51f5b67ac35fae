//! The header's loss line, in proportion: each source with the share of what
//! it belongs to that is missing and which figures it touches, so that ten
//! skipped completions out of two million do not read like a broken run.

use super::{clean, count};
use crate::report::model::Report;
use crate::report::time::thousands;

/// Below this share of their whole, in every source, losses are minor: the
/// figures they touch are off by less than their own rounding.
const MINOR_SHARE: f64 = 0.001;

#[derive(Clone, Debug, PartialEq)]
pub struct LossView {
    /// `LOST in 2 intervals: block.kernel_skipped 10 of 2,203,112 block completions (0.00045%): …`
    pub text: String,
    /// Some source lost 0.1% or more of its whole, or a whole the report cannot
    /// weigh: shown as a warning. Otherwise a plain line.
    pub serious: bool,
}

/// What one source's losses belong to and which figures they leave incomplete.
struct Weight {
    /// The whole (losses included) and its name; `None`: not in the stream.
    of: Option<(u64, &'static str)>,
    touches: &'static str,
}

fn weigh(source: &str, lost: u64, report: &Report) -> Weight {
    let completions: u64 = report.disks.iter().map(|d| d.requests()).sum();
    let slow_ios: u64 = report.disks.iter().map(|d| d.slow_io_count).sum();
    let rt = &report.retransmits;
    let of = |n: u64, what| (n > 0).then_some((n, what));
    let (of, touches) = match source {
        "block.slow_io_ringbuf_full" => (
            of(slow_ios + lost, "slow I/Os"),
            "missing from the slow I/O lists; in the histograms",
        ),
        "block.kernel_skipped" => (
            of(completions, "block completions"),
            "in the counts, without latency samples",
        ),
        "block.bio_table_full" | "block.bio_chain_truncated" => (
            of(completions, "block completions"),
            "bios without a latency sample",
        ),
        "block.request_table_full"
        | "block.stale_slot_displaced"
        | "block.block_stats_entry_unavailable" => (
            of(completions, "block completions"),
            "requests without device or queue time",
        ),
        "block.disk_table_full" => (None, "disks without an in-flight gauge"),
        "tcp.retransmit_ringbuf_full" => (
            of(rt.events + lost, "retransmit events"),
            "missing from the retransmit lists; in the per-peer counters",
        ),
        "tcp.retransmit_unseen_segs" => (
            of(rt.segs + lost, "retransmitted segments"),
            "in the per-peer counters, without an event",
        ),
        "tcp.peer_table_evicted" => (None, "peers' RTT figures for an interval"),
        s if s.starts_with("tcp.flow_") => (None, "bulk flows left out"),
        s if s.starts_with("sqlserver.") => (None, "sessions without a SPID"),
        "stall.records" => (
            of(rt.events + slow_ios, "per-event records"),
            "not weighed by the stall detector",
        ),
        crate::records::OUTPUT_LOST => (
            of(report.stream.lines as u64 + lost, "records"),
            "records missing from the stream",
        ),
        s if s.starts_with("block.recursion_miss.") => (
            of(completions, "block completions"),
            "probe runs the kernel skipped",
        ),
        s if s.contains(".recursion_miss.") => (None, "probe runs the kernel skipped"),
        _ => (None, "see records.md"),
    };
    Weight { of, touches }
}

/// `0.00045%`, `1.2%`: two significant digits, whatever the size.
fn percent(part: u64, whole: u64) -> String {
    let pct = 100.0 * part as f64 / whole as f64;
    let decimals = if pct >= 10.0 {
        0
    } else {
        (1 - pct.log10().floor() as i32).clamp(1, 8) as usize
    };
    format!("{pct:.decimals$}%")
}

pub fn of(report: &Report) -> Option<LossView> {
    let l = &report.losses;
    if !l.any() {
        return None;
    }
    let mut serious = false;
    let parts: Vec<String> = l
        .by_source
        .iter()
        .filter(|(_, n)| **n > 0)
        .map(|(source, &n)| {
            let w = weigh(source, n, report);
            let share = match w.of {
                Some((whole, what)) => {
                    serious |= n as f64 >= MINOR_SHARE * whole as f64;
                    format!(" of {} {what} ({})", thousands(whole), percent(n, whole))
                }
                None => {
                    serious = true;
                    String::new()
                }
            };
            format!("{} {}{share}: {}", clean(source), thousands(n), w.touches)
        })
        .collect();
    let lead = if serious {
        "LOST"
    } else {
        "lost, a small share"
    };
    Some(LossView {
        text: format!(
            "{lead} in {}: {}",
            count(l.intervals, "interval", "intervals"),
            parts.join("; ")
        ),
        serious,
    })
}

#[cfg(test)]
mod tests {
    use super::percent;

    #[test]
    fn shares_keep_two_significant_digits() {
        assert_eq!(percent(10, 2_203_112), "0.00045%");
        assert_eq!(percent(1, 75), "1.3%");
        assert_eq!(percent(1, 7), "14%");
        assert_eq!(percent(1, 1), "100%");
    }
}
