//! How the soak's figures read: the results as stored, their summary for
//! docs/benchmarks.json, and the markdown (the figures are in figures.rs,
//! the verdicts in verdict.rs).

use std::fmt::Write as _;

use serde::Serialize;
use serde_json::Value;

use super::figures::{Run, lost_text};
use super::load;
use super::maps::{Count, MapInfo};
use super::verdict::{requests_balance, verdicts};
use crate::bench::publish::{Host, Verdict};
use crate::bench::table;

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
