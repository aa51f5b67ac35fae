//! The soak's verdicts, and how each is judged (the section says the same
//! in words):
//! - flat (RSS, each map): minute 1 is warm-up; of the minutes after it, the
//!   largest value in the last quarter may exceed the largest in the first
//!   quarter by at most a stated slack. Sustained growth of any rate shows as
//!   a last quarter above the first; noise within the slack does not.
//! - books: stalltrace's counts against the kernel's, over the whole run
//!   (load stopped and the host left quiet before the last reading, so the
//!   edges hold nothing in flight) and cumulatively at every minute (where the
//!   last interval not yet written is allowed for). A shortfall is accounted
//!   only as far as `lost` reports drops of that kind.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::figures::{Run, lost_text};
use super::maps::Count;
use crate::bench::publish::Verdict;

/// RSS may grow by this much (or this share) from first to last quarter.
const RSS_SLACK_MIB: f64 = 1.0;
const RSS_SLACK_SHARE: f64 = 0.05;
/// A map's occupancy may move by this much (or share): slot tables hold the
/// I/Os in flight at the moment of the dump.
const MAP_SLACK: f64 = 8.0;
const MAP_SLACK_SHARE: f64 = 0.10;
/// Requests in flight or on the VM's other edges of the window (as the daemon suite).
const IO_MARGIN: i64 = 16;
/// Retransmissions between the last reading of the counters and the stop.
const TCP_MARGIN: i64 = 4;
/// Lost sources that drop a request from `block` counts.
const IO_LOSSES: &[&str] = &[
    "block.request_table_full",
    "block.block_stats_entry_unavailable",
];

/// Largest value of the first and of the last quarter after the warm-up
/// minute; None when there are too few minutes to tell.
fn quarters(v: &[f64]) -> Option<(f64, f64)> {
    let v = if v.len() >= 3 { &v[1..] } else { v };
    if v.len() < 2 {
        return None;
    }
    let q = v.len().div_ceil(4);
    let max = |s: &[f64]| s.iter().copied().fold(f64::MIN, f64::max);
    Some((max(&v[..q]), max(&v[v.len() - q..])))
}

fn flat(v: &[f64], slack: f64, share: f64) -> (bool, String) {
    match quarters(v) {
        None => (true, "too few minutes to judge".into()),
        Some((first, last)) => {
            let allowed = slack.max(share * first);
            (
                last - first <= allowed,
                format!(
                    "first-quarter max {first:.1}, last-quarter max {last:.1} ({:+.1}; allowed +{allowed:.1})",
                    last - first
                ),
            )
        }
    }
}

pub fn verdicts(r: &Run) -> Vec<Verdict> {
    let mut out = Vec::new();
    let rss: Vec<f64> = r.rows.iter().map(|m| m.rss_mib).collect();
    let (ok, measured) = flat(&rss, RSS_SLACK_MIB, RSS_SLACK_SHARE);
    let first = rss.first().copied().unwrap_or(0.0);
    let last = rss.last().copied().unwrap_or(0.0);
    out.push(Verdict {
        target: format!(
            "RSS flat: last-quarter max VmRSS ≤ first-quarter max + max({RSS_SLACK_MIB} MiB, {:.0}%) \
             (minute 1 is warm-up)",
            RSS_SLACK_SHARE * 100.0
        ),
        measured,
        outcome: ok.into(),
        detail: format!(
            "VmRSS first {first:.1}, last {last:.1}, max {:.1} MiB; peak (VmHWM) {:.1} MiB",
            rss.iter().copied().fold(0.0, f64::max),
            r.peak_rss_mib
        ),
    });
    for m in r.maps.iter().filter(|m| !matches!(m.count, Count::Not(_))) {
        let v: Vec<f64> = r
            .rows
            .iter()
            .filter_map(|row| row.occupancy.get(&m.label).copied().flatten())
            .map(|n| n as f64)
            .collect();
        let max = v.iter().copied().fold(0.0, f64::max);
        let (ok, measured) = flat(&v, MAP_SLACK, MAP_SLACK_SHARE);
        let bound = max <= m.max_entries as f64;
        let lru = m.kind.starts_with("lru");
        let mut detail = format!("max {max:.0} of {}", m.max_entries);
        if max as u64 >= m.max_entries {
            detail += if lru {
                ": at its bound, evicting the least recently used"
            } else {
                ": full, further inserts fail (see `lost`)"
            };
        }
        if v.len() < r.rows.len() {
            let _ = write!(
                detail,
                "; {} minute(s) could not be dumped",
                r.rows.len() - v.len()
            );
        }
        out.push(Verdict {
            target: format!(
                "{} ({}, {} entries) bounded and flat: ≤ max_entries, last-quarter max ≤ \
                 first-quarter max + max({MAP_SLACK}, {:.0}%)",
                m.label,
                m.kind,
                m.max_entries,
                MAP_SLACK_SHARE * 100.0
            ),
            measured,
            outcome: (ok && bound).into(),
            detail,
        });
    }
    for dev in [&r.fio_dev, &r.sql_dev] {
        out.push(disk_verdict(r, dev));
    }
    let t = &r.total;
    let rb_lost = t.lost_of(&["tcp.retransmit_ringbuf_full"]) as i64;
    let could_carry = rb_lost * t.max_segs.max(1) as i64;
    // Host-wide (lost is not per namespace): other people's sockets may add to it.
    let unseen = t.lost_of(&["tcp.retransmit_unseen_segs"]) as i64;
    let d = t.sent_segs as i64 - r.kernel.retrans_segs as i64;
    let minute_worst = r
        .rows
        .iter()
        .map(|m| m.difference.retrans_segs)
        .max_by_key(|d| d.abs());
    out.push(Verdict {
        target: format!(
            "retransmissions delivered: the segments of tcp_retransmit records in the soak's \
             namespaces that were sent (by `err`, the kernel's rule) = RetransSegs \
             (±{TCP_MARGIN}); a shortfall only up to tcp.retransmit_ringbuf_full × the most \
             segments one record carried, plus tcp.retransmit_unseen_segs (host-wide)"
        ),
        measured: format!("{} vs {} ({d:+})", t.sent_segs, r.kernel.retrans_segs),
        outcome: (d <= TCP_MARGIN && d >= -(TCP_MARGIN + could_carry + unseen)).into(),
        detail: format!(
            "{} records; segments by err: {}; ring-buffer losses {rb_lost} (could carry \
             {could_carry} segments); unseen segments {unseen}; nftables dropped {} packets; \
             largest cumulative difference at a minute {}",
            t.retransmits,
            lost_text(&t.segs_by_err),
            r.nft_dropped,
            minute_worst.map_or("–".into(), |d| format!("{d:+}"))
        ),
    });
    let d = t.counted_segs as i64 - r.kernel.retrans_segs as i64;
    out.push(Verdict {
        target: format!(
            "`counted` right: the segments of records marked `counted` = RetransSegs \
             (±{TCP_MARGIN}), as docs/records.md says; a shortfall only as for delivery above"
        ),
        measured: format!("{} vs {} ({d:+})", t.counted_segs, r.kernel.retrans_segs),
        outcome: (d <= TCP_MARGIN && d >= -(TCP_MARGIN + could_carry + unseen)).into(),
        detail: format!(
            "{} records not marked counted ({} segments; by err: {}); tcp_rtt retrans_segs {}",
            t.uncounted,
            t.uncounted_segs,
            lost_text(&t.uncounted_by_err),
            t.rtt_retrans_segs
        ),
    });
    let d = t.rtt_retrans_segs as i64 - r.kernel.retrans_segs as i64;
    out.push(Verdict {
        target: format!(
            "per-peer books: the `tcp_rtt` records' retrans_segs in the soak's namespaces = \
             RetransSegs (±{TCP_MARGIN}): kernel counters, with the segments no record carried"
        ),
        measured: format!(
            "{} vs {} ({d:+})",
            t.rtt_retrans_segs, r.kernel.retrans_segs
        ),
        outcome: (d.abs() <= TCP_MARGIN).into(),
        detail: format!("unseen segments (host-wide) {unseen}"),
    });
    let d = t.syn_retransmits as i64 - r.kernel.syn_retrans as i64;
    out.push(Verdict {
        target: format!(
            "SYN and SYN-ACK retransmissions: `syn` records = TCPSynRetrans (±{TCP_MARGIN}); a \
             shortfall only up to tcp.retransmit_ringbuf_full"
        ),
        measured: format!("{} vs {} ({d:+})", t.syn_retransmits, r.kernel.syn_retrans),
        outcome: (d <= TCP_MARGIN && d >= -(TCP_MARGIN + rb_lost)).into(),
        detail: "connections opened through the loss: the short sqlclient runs".into(),
    });
    // TCPTimeouts also counts the timeouts of connections not yet established
    // (SYN, SYN-ACK), which stalltrace records as `syn`, and timeouts that
    // ended a connection without a retransmission.
    let d = t.timer_rtos as i64 - r.kernel.timeouts as i64;
    let syn = t.syn_retransmits as i64;
    out.push(Verdict {
        target: format!(
            "retransmission timeouts: timer `rto` records ≤ TCPTimeouts (+{TCP_MARGIN}) and at \
             least TCPTimeouts − `syn` records (the kernel counts SYN and SYN-ACK timeouts there \
             too) − {TCP_MARGIN}, a further shortfall only up to tcp.retransmit_ringbuf_full"
        ),
        measured: format!("{} vs {} ({d:+})", t.timer_rtos, r.kernel.timeouts),
        outcome: (d <= TCP_MARGIN && d >= -(TCP_MARGIN + rb_lost + syn)).into(),
        detail: format!(
            "`syn` records {syn}; per-peer counters (tcp_rtt rtos) {}",
            t.rtt_rtos
        ),
    });
    let mut mismatched: Vec<String> = Vec::new();
    let keys = |a: &BTreeMap<String, u64>, b: &BTreeMap<String, u64>| {
        a.keys()
            .chain(b.keys())
            .cloned()
            .collect::<std::collections::BTreeSet<String>>()
    };
    let mut stream_records = t.records.clone();
    stream_records.remove("stop");
    for (what, a, b) in [
        ("records", &stream_records, &r.stop_records),
        ("lost", &t.lost, &r.stop_lost),
    ] {
        for k in keys(a, b) {
            let (x, y) = (
                a.get(&k).copied().unwrap_or(0),
                b.get(&k).copied().unwrap_or(0),
            );
            if x != y {
                mismatched.push(format!("{what} {k}: file {x}, stop {y}"));
            }
        }
    }
    out.push(Verdict {
        target: "the stream is whole: records in the file by type = the stop record's `records`; \
                 `lost` records summed = the stop record's `lost`; every line readable"
            .into(),
        measured: format!(
            "{} records, {} lost in all",
            t.total_records(),
            t.lost.values().sum::<u64>()
        ),
        outcome: (mismatched.is_empty() && t.unreadable == 0).into(),
        detail: if mismatched.is_empty() && t.unreadable == 0 {
            format!("lost by source: {}", lost_text(&t.lost))
        } else {
            format!(
                "{}; unreadable lines {}",
                mismatched.join(", "),
                t.unreadable
            )
        },
    });
    out
}

/// Whether a disk's requests balance against diskstats: not on a disk that
/// takes flushes (see `diskstats` in soak.rs); there its flushes and bytes do.
pub fn requests_balance(r: &Run, dev: &str) -> bool {
    r.kernel.disks.get(dev).is_none_or(|k| k.flushes == 0)
}

/// A disk's books: requests (or, on a disk that takes flushes, flushes and
/// bytes) over the run and at every minute. A shortfall is accounted only as
/// far as `lost` counts dropped requests (host-wide) and, for bytes, as far as
/// the unseen completions (no size known) can have carried.
fn disk_verdict(r: &Run, dev: &str) -> Verdict {
    let io_lost = r.total.lost_of(IO_LOSSES) as i64;
    let k = r.kernel.disks.get(dev).copied().unwrap_or_default();
    let o = r.total.disks.get(dev).copied().unwrap_or_default();
    let per_request = r.max_request_bytes.get(dev).copied().unwrap_or(0) as i64;
    let by_requests = requests_balance(r, dev);
    // (what, index in Differences, ours, kernel, shortfall accounted, margin)
    let books: Vec<(&str, usize, u64, u64, i64, i64)> = if by_requests {
        vec![("requests", 0, o.requests, k.requests, io_lost, IO_MARGIN)]
    } else {
        vec![
            ("flushes", 1, o.flushes, k.flushes, io_lost, IO_MARGIN),
            (
                "bytes",
                2,
                o.bytes,
                k.bytes,
                // Completions the kernel ran no hook for are in `count` without bytes.
                (io_lost + o.unseen as i64 + r.total.lost_of(&["block.kernel_skipped"]) as i64)
                    * per_request,
                IO_MARGIN * 4096,
            ),
        ]
    };
    let mut met = true;
    let (mut measured, mut outside) = (Vec::new(), Vec::new());
    for (what, i, ours, kernel, accounted, margin) in books {
        let d = ours as i64 - kernel as i64;
        met &= d <= margin && d >= -(margin + accounted);
        measured.push(format!("{what} {ours} vs {kernel} ({d:+})"));
        for m in &r.rows {
            let Some(diff) = m.difference.disks.get(dev) else {
                continue;
            };
            let this = m.kernel.disks.get(dev).copied().unwrap_or_default();
            // The last interval (1 s) not yet written when the minute was read: 2 s of its rate.
            let rate = [this.requests, this.flushes, this.bytes][i] as i64 / 30;
            let allowed = rate + margin;
            if diff[i] > allowed || diff[i] < -(allowed + accounted) {
                outside.push(format!(
                    "{what} at minute {}: {:+} (±{allowed})",
                    m.minute, diff[i]
                ));
            }
        }
    }
    met &= outside.is_empty();
    Verdict {
        target: if by_requests {
            format!(
                "{dev}: block records' reads and writes (count + completions_unseen) = \
                 /proc/diskstats reads + writes, ±{IO_MARGIN} over the run, ± 2 s of I/O at each \
                 minute; a shortfall only as far as `lost` counts dropped requests"
            )
        } else {
            format!(
                "{dev} (takes flushes): flush requests = diskstats flushes (±{IO_MARGIN}) and \
                 bytes read + written = diskstats sectors × 512, over the run and at each minute \
                 (± 2 s of I/O); a shortfall only as far as `lost` counts dropped requests and, in \
                 bytes, the unseen and kernel-skipped completions × max_sectors_kb"
            )
        },
        measured: measured.join("; "),
        outcome: met.into(),
        detail: format!(
            "requests {} vs diskstats {} (never equal on a disk that takes flushes); completions \
             unseen {}; lost that drops requests {io_lost} (host-wide); minutes outside the \
             bound: {}",
            o.requests,
            k.requests,
            o.unseen,
            if outside.is_empty() {
                "none".into()
            } else {
                outside.join(", ")
            }
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flat_compares_quarters_after_warm_up() {
        // Minute 1 (100) is warm-up; 8 minutes after it: quarters of 2.
        let v = [100.0, 30.0, 31.0, 30.5, 30.0, 31.0, 30.0, 30.5, 31.5];
        assert_eq!(quarters(&v), Some((31.0, 31.5)));
        assert!(flat(&v, 1.0, 0.05).0);
        let growing: Vec<f64> = (0..20).map(|i| 30.0 + i as f64 * 0.5).collect();
        assert!(!flat(&growing, 1.0, 0.05).0);
        assert_eq!(quarters(&[5.0]), None);
    }
}
