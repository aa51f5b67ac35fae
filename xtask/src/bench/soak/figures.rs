//! What the soak measured: one row per minute (the stream, the kernel's
//! counts and their difference, process and map figures) and the whole run.
//! How it reads is report.rs's; what it means, verdict.rs's.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::Value;

use super::Oracle;
use super::load::{ChurnCounts, ClientCounts};
use super::maps::{MapInfo, Usage};
#[cfg(test)]
use super::stream::DiskCounts;
use super::stream::Tally;
use crate::bench::publish::load_average;

/// Cumulative since the load started: stalltrace's count − the kernel's.
#[derive(Serialize, Default, Clone, Debug)]
pub struct Differences {
    /// Per disk: requests, flushes, bytes.
    pub disks: BTreeMap<String, [i64; 3]>,
    /// Sent segments (by `err`) − RetransSegs, and counted segments − RetransSegs.
    pub retrans_segs: i64,
    pub counted_segs: i64,
    pub timer_rtos: i64,
    pub syn_retransmits: i64,
}

pub fn differences(t: &Tally, k: &Oracle) -> Differences {
    let d = |a: u64, b: u64| a as i64 - b as i64;
    Differences {
        disks: k
            .disks
            .iter()
            .map(|(dev, k)| {
                let o = t.disks.get(dev).copied().unwrap_or_default();
                let diff = [
                    d(o.requests, k.requests),
                    d(o.flushes, k.flushes),
                    d(o.bytes, k.bytes),
                ];
                (dev.clone(), diff)
            })
            .collect(),
        retrans_segs: d(t.sent_segs, k.retrans_segs),
        counted_segs: d(t.counted_segs, k.retrans_segs),
        timer_rtos: d(t.timer_rtos, k.timeouts),
        syn_retransmits: d(t.syn_retransmits, k.syn_retrans),
    }
}

#[derive(Serialize)]
pub struct Minute {
    pub minute: u64,
    pub rss_mib: f64,
    pub peak_rss_mib: f64,
    /// utime + stime over the minute, % of one CPU.
    pub cpu_pct: f64,
    pub load_average: String,
    /// The stream written in this minute.
    pub stream: Tally,
    /// The kernel's counts in this minute.
    pub kernel: Oracle,
    pub difference: Differences,
    /// Entries in use per countable map (None: its dump failed).
    pub occupancy: BTreeMap<String, Option<u64>>,
    pub netns_made: u64,
}

impl Minute {
    pub fn new(
        minute: u64,
        (before, now, seconds): (&Usage, &Usage, f64),
        stream: Tally,
        kernel: Oracle,
        difference: Differences,
        occupancy: BTreeMap<String, Option<u64>>,
        netns_made: u64,
    ) -> Self {
        Minute {
            minute,
            rss_mib: now.rss_kib as f64 / 1024.0,
            peak_rss_mib: now.hwm_kib as f64 / 1024.0,
            cpu_pct: 100.0 * (now.cpu_s - before.cpu_s) / seconds,
            load_average: load_average(),
            stream,
            kernel,
            difference,
            occupancy,
            netns_made,
        }
    }

    pub fn progress(&self) -> String {
        format!(
            "minute {}: RSS {:.1} MiB, CPU {:.2}%, {} records, lost {}, disks Δ (requests, \
             flushes, bytes) {:?}, retransmitted segs {} (Δ {:+}), {} namespaces made",
            self.minute,
            self.rss_mib,
            self.cpu_pct,
            self.stream.total_records(),
            lost_text(&self.stream.lost),
            self.difference.disks,
            self.kernel.retrans_segs,
            self.difference.retrans_segs,
            self.netns_made
        )
    }
}

/// Everything the soak measured, as built by soak.rs.
#[derive(Serialize)]
pub struct Run {
    pub daemon: String,
    pub families: Vec<String>,
    pub fio_dev: String,
    pub sql_dev: String,
    pub max_request_bytes: BTreeMap<String, u64>,
    pub maps: Vec<MapInfo>,
    pub rows: Vec<Minute>,
    /// The whole stream, and the kernel's counts from the start of the load
    /// to the quiet end.
    pub total: Tally,
    pub kernel: Oracle,
    /// The daemon's own totals (its `stop` record).
    pub stop_records: BTreeMap<String, u64>,
    pub stop_lost: BTreeMap<String, u64>,
    pub lifetime_cpu_s: f64,
    pub peak_rss_mib: f64,
    pub fio_ios: u64,
    pub nft_dropped: u64,
    pub iperf_restarts: u64,
    pub long_client: Option<Value>,
    pub churn: ChurnCounts,
    pub clients: ClientCounts,
    /// Distinct lines the daemon wrote to stderr (at most 20).
    pub daemon_stderr: Vec<String>,
    pub warnings: Vec<String>,
}

pub fn lost_text(lost: &BTreeMap<String, u64>) -> String {
    if lost.is_empty() {
        return "–".into();
    }
    lost.iter()
        .map(|(k, v)| format!("{k} {v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn differences_are_stalltrace_minus_kernel() {
        let mut t = Tally::default();
        let c = |requests, bytes| DiskCounts {
            requests,
            flushes: 0,
            bytes,
            unseen: 0,
        };
        t.disks.insert("loop1".into(), c(90, 4096));
        t.sent_segs = 12;
        let k = Oracle {
            disks: BTreeMap::from([("loop1".to_string(), c(100, 8192))]),
            retrans_segs: 10,
            timeouts: 0,
            syn_retrans: 0,
        };
        let d = differences(&t, &k);
        assert_eq!((d.disks["loop1"], d.retrans_segs), ([-10, 0, -4096], 2));
    }
}
