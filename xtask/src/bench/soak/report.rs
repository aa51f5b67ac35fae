//! The soak's figures and how they read: one row per minute, map occupancy
//! per minute, the books at the end (the verdicts are in verdict.rs).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;
use serde_json::Value;

use super::Oracle;
use super::load::{self, ChurnCounts, ClientCounts};
use super::maps::{Count, MapInfo, Usage};
#[cfg(test)]
use super::stream::DiskCounts;
use super::stream::Tally;
use super::verdict::{requests_balance, verdicts};
use crate::bench::publish::{Host, Verdict, load_average};
use crate::bench::table;

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

#[derive(Serialize)]
pub struct Results {
    pub host: Host,
    pub command: String,
    /// The commit the binary was built from, and whether the daemon's
    /// sources (userspace/, ebpf/) had uncommitted changes then.
    pub source: String,
    pub minutes: u64,
    pub wall_time_s: f64,
    pub load: Vec<String>,
    pub verdicts: Vec<Verdict>,
    #[serde(flatten)]
    pub run: Run,
}

impl Results {
    pub fn new(host: Host, minutes: u64, source: String, run: Run) -> Self {
        let load = vec![
            format!(
                "block: `fio --filename=/dev/{} --runtime=... {}` on a loop device (direct I/O) \
                 over {} MiB of random data on a private tmpfs",
                run.fio_dev,
                load::FIO_ARGS.join(" "),
                super::FIO_MIB
            ),
            format!(
                "TCP loss: two network namespaces joined by veth (the lab's NetPair), nftables \
                 `numgen random mod 100 < {}` drop on both sides' input (every packet); \
                 `iperf3 -c SERVER -b {} -4` from one to the other",
                load::LOSS_PERCENT,
                load::IPERF3_RATE
            ),
            format!(
                "SQL Server simulator: `sqlservr {}` in the server namespace, its files on ext4 \
                 on its own loop device ({}); `sqlclient --sessions {} --rate {}` for the whole \
                 soak and, back to back, `sqlclient --sessions {} --rate {} --duration {}` from \
                 the client namespace (through the same loss)",
                load::SIM_SERVER_ARGS.join(" "),
                run.sql_dev,
                load::SESSIONS,
                load::RATE,
                load::SHORT_SESSIONS,
                load::SHORT_RATE,
                load::SHORT_SECS
            ),
            format!(
                "namespace churn: a new pair of namespaces with a veth pair, addresses and one TCP \
                 handshake per family (the lab's NetPair) every {} ms, the oldest removed beyond {}",
                load::CHURN_EVERY.as_millis(),
                load::CHURN_ALIVE
            ),
        ];
        let mut r = Results {
            host,
            command: format!("cargo xtask bench soak --minutes {minutes}"),
            source,
            minutes,
            wall_time_s: 0.0,
            load,
            verdicts: Vec::new(),
            run,
        };
        r.verdicts = verdicts(&r.run);
        r
    }
}

/// What `--publish` stores under docs/benchmarks.json's `soak` key: the
/// verdicts and the per-minute process and map figures; the books in full
/// stay in target/bench/soak.json (an hour of them would triple that file).
pub fn summary(r: &Results) -> Value {
    let rows: Vec<Value> = r
        .run
        .rows
        .iter()
        .map(|m| {
            serde_json::json!({
                "minute": m.minute,
                "rss_mib": m.rss_mib,
                "cpu_pct": m.cpu_pct,
                "load_average": m.load_average,
                "records": m.stream.total_records(),
                "lost": m.stream.lost,
                "occupancy": m.occupancy,
            })
        })
        .collect();
    serde_json::json!({
        "host": r.host,
        "command": r.command,
        "source": r.source,
        "minutes": r.minutes,
        "wall_time_s": r.wall_time_s,
        "daemon": r.run.daemon,
        "verdicts": r.verdicts,
        "minutes_figures": rows,
        "full_results": "target/bench/soak.json of the run",
    })
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

pub fn markdown(r: &Results) -> String {
    let (h, run) = (&r.host, &r.run);
    let mut s = String::new();
    let cpu: Vec<f64> = run.rows.iter().map(|m| m.cpu_pct).collect();
    let mean = cpu.iter().sum::<f64>() / cpu.len().max(1) as f64;
    let _ = writeln!(
        s,
        "## soak: every family under load for {} minutes\n\n\
         {}\n\
         - Command: `{}` (took {:.0} s; not part of `bench all`); binary built from {}\n\
         - Daemon: `{}` (families: {}), one process for the whole soak, recording the whole \
         host; CPU {:.2}% of one CPU on average (max {:.2}% in a minute), {:.1} CPU s over its \
         life\n\
         - The host was shared: other people's tests ran beside the soak (see the load \
         average per minute); the daemon recorded their I/O and traffic too, which is why \
         the books below count only the soak's own disks and namespaces.",
        r.minutes,
        h.line(),
        r.command,
        r.wall_time_s,
        r.source,
        run.daemon,
        run.families.join(", "),
        mean,
        cpu.iter().copied().fold(0.0, f64::max),
        run.lifetime_cpu_s
    );
    for l in &r.load {
        let _ = writeln!(s, "- Load, {l}");
    }
    let c = &run.churn;
    let _ = writeln!(
        s,
        "- Load generators' own counts: fio {} I/Os; namespace pairs made {}, removed {}, failed \
         {}; short sqlclient runs {} ({} failed, {} transactions, {} errors); long sqlclient {}; \
         iperf3 restarts {}\n",
        run.fio_ios,
        c.made.load(std::sync::atomic::Ordering::Relaxed),
        c.removed.load(std::sync::atomic::Ordering::Relaxed),
        c.failed.load(std::sync::atomic::Ordering::Relaxed),
        run.clients.runs.load(std::sync::atomic::Ordering::Relaxed),
        run.clients
            .failed
            .load(std::sync::atomic::Ordering::Relaxed),
        run.clients
            .transactions
            .load(std::sync::atomic::Ordering::Relaxed),
        run.clients
            .errors
            .load(std::sync::atomic::Ordering::Relaxed),
        run.long_client.as_ref().map_or("–".into(), |v| format!(
            "{} transactions, {} errors, p99 {} µs",
            v["transactions"], v["errors"], v["p99_us"]
        )),
        run.iperf_restarts
    );
    s += "### Verdict\n\n";
    s += &Verdict::table(&r.verdicts);
    s += "\n### Per minute\n\n";
    let cell = |kernel: u64, ours: u64, d: i64| format!("{kernel} / {ours} ({d:+})");
    // Per disk: requests where they balance, else flushes and MiB.
    let mut disk_cols: Vec<(String, &str, usize)> = Vec::new();
    for dev in [&run.fio_dev, &run.sql_dev] {
        if requests_balance(run, dev) {
            disk_cols.push((format!("{dev} I/Os: diskstats / records (Δ)"), dev, 0));
        } else {
            disk_cols.push((format!("{dev} flushes: diskstats / records (Δ)"), dev, 1));
            disk_cols.push((format!("{dev} MiB: diskstats / records (Δ KiB)"), dev, 2));
        }
    }
    let rows: Vec<Vec<String>> = run
        .rows
        .iter()
        .map(|m| {
            let mut row = vec![
                m.minute.to_string(),
                format!("{:.1}", m.rss_mib),
                format!("{:.2}", m.cpu_pct),
                m.load_average.clone(),
                m.stream.total_records().to_string(),
                lost_text(&m.stream.lost),
            ];
            for (_, dev, i) in &disk_cols {
                let k = m.kernel.disks.get(*dev).copied().unwrap_or_default();
                let o = m.stream.disks.get(*dev).copied().unwrap_or_default();
                let d = m.difference.disks.get(*dev).map_or(0, |d| d[*i]);
                row.push(match i {
                    0 => cell(k.requests, o.requests, d),
                    1 => cell(k.flushes, o.flushes, d),
                    _ => format!(
                        "{:.1} / {:.1} ({:+})",
                        k.bytes as f64 / 1048576.0,
                        o.bytes as f64 / 1048576.0,
                        d / 1024
                    ),
                });
            }
            row.extend([
                cell(
                    m.kernel.retrans_segs,
                    m.stream.sent_segs,
                    m.difference.retrans_segs,
                ),
                cell(
                    m.kernel.timeouts,
                    m.stream.timer_rtos,
                    m.difference.timer_rtos,
                ),
                m.stream.rtt_retrans_segs.to_string(),
                m.netns_made.to_string(),
            ]);
            row
        })
        .collect();
    let mut headers = vec!["min", "VmRSS MiB", "CPU %", "load avg", "records", "lost"];
    headers.extend(disk_cols.iter().map(|(h, _, _)| h.as_str()));
    headers.extend([
        "RetransSegs / segs sent (Δ)",
        "TCPTimeouts / timer RTOs (Δ)",
        "tcp_rtt retrans_segs",
        "netns made",
    ]);
    s += &table::markdown(&headers, &rows);
    s += "\nΔ is cumulative since the load started (stalltrace − kernel): at a minute it \
          leaves out the interval not yet written.\n\n### BPF map occupancy per minute\n\n";
    let counted: Vec<&MapInfo> = run
        .maps
        .iter()
        .filter(|m| !matches!(m.count, Count::Not(_)))
        .collect();
    let headers: Vec<String> = std::iter::once("min".to_string())
        .chain(
            counted
                .iter()
                .map(|m| format!("{} ({})", m.label, m.max_entries)),
        )
        .collect();
    let rows: Vec<Vec<String>> = run
        .rows
        .iter()
        .map(|row| {
            std::iter::once(row.minute.to_string())
                .chain(counted.iter().map(|m| {
                    row.occupancy
                        .get(&m.label)
                        .copied()
                        .flatten()
                        .map_or("–".into(), |n| n.to_string())
                }))
                .collect()
        })
        .collect();
    let headers: Vec<&str> = headers.iter().map(String::as_str).collect();
    s += &table::markdown(&headers, &rows);
    s += "\nHash and LRU maps: entries a `bpftool map dump` returns; slot arrays (bio_slots, \
          rq_slots, block_disks, rq_unsettled_key): entries whose first word (the owner) is set. \
          Not counted:\n\n";
    for m in &run.maps {
        if let Count::Not(why) = &m.count {
            let _ = writeln!(
                s,
                "- {} ({}, {} entries): {why}",
                m.label, m.kind, m.max_entries
            );
        }
    }
    s += "\n### Notes\n\n\
          - RSS and occupancy are judged from minute 2 on (minute 1 is warm-up): the largest \
          value in the last quarter of those minutes against the largest in the first quarter, \
          with the slack the verdict states, so growth at any steady rate shows and noise within \
          the slack does not.\n\
          - The books close after the load stopped and the host was quiet for a few intervals: \
          nothing of the soak's was in flight at either edge. Lost sources are host-wide, so a \
          shortfall on the soak's disks or namespaces is accounted only up to the `lost` of that \
          kind from anyone's.\n";
    if !run.daemon_stderr.is_empty() {
        let _ = writeln!(
            s,
            "- The daemon's stderr (each line once): {}",
            run.daemon_stderr
                .iter()
                .map(|l| format!("`{l}`"))
                .collect::<Vec<_>>()
                .join("; ")
        );
    }
    for w in &run.warnings {
        let _ = writeln!(s, "- Warning: {w}.");
    }
    s
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
