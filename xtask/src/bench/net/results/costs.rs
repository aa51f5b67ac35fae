//! The net suite's cost per received and per sent segment (stalltrace's and
//! the peer's, on each workload), and what each round's daemon did over its life.

use super::{Lives, Side, WorkloadResult, net_programs, per_segment};
use crate::bench::net::{Measured, segments};
use crate::bench::stats::Summary;
use crate::bench::unitcost::{PerUnit, UnitCost, rate_text};

/// Cost per received and per sent segment, stalltrace's and the peer's, on each workload.
pub fn unit_costs(m: &Measured, results: &[WorkloadResult]) -> Vec<UnitCost> {
    let mut out = Vec::new();
    for (runs, r) in m.workloads.iter().zip(results) {
        let rx_rate = |side: &Side| {
            let runs = &side.runs;
            let rates: Vec<f64> = runs
                .iter()
                .map(|r| r.figure("in_segs") / r.seconds)
                .collect();
            format!(
                "{} received segments/s",
                rate_text(Summary::of(&rates).map_or(0.0, |s| s.median))
            )
        };
        let (rx, tx, _) = per_segment(
            runs.traced_bpf_stats
                .iter()
                .map(|t| (&t.run, segments::split(net_programs(t)))),
        );
        out.push(UnitCost {
            workload: runs.part.key.to_string(),
            tool: "stalltrace".into(),
            per_unit: vec![
                PerUnit::new("received segment", rx),
                PerUnit::new("sent segment", tx),
            ],
            process_cpu_pct: r.daemon.cpu_pct_of_one_cpu,
            measured_at: rx_rate(&r.traced),
            peak_rss_mib: r.daemon.peak_rss_mib,
        });
        let (rx, tx, _) = per_segment(runs.peer_bpf_stats.iter().map(|p| {
            let programs = p
                .programs
                .iter()
                .map(|q| (q.tracepoint.as_str(), q.run_time_ns));
            (&p.run, segments::split(programs))
        }));
        out.push(UnitCost {
            workload: runs.part.key.to_string(),
            tool: "bpftrace (peer)".into(),
            per_unit: vec![
                PerUnit::new("received segment", rx),
                PerUnit::new("sent segment", tx),
            ],
            process_cpu_pct: r.peer_process.cpu_pct_of_one_cpu,
            measured_at: rx_rate(&r.peer),
            peak_rss_mib: r.peer_process.peak_rss_mib,
        });
    }
    out
}

pub fn lives(m: &Measured) -> Lives {
    let of = |v: Vec<f64>| {
        Summary::of(&v).unwrap_or(Summary {
            median: 0.0,
            min: 0.0,
            max: 0.0,
        })
    };
    let coverage: Vec<f64> = m
        .daemons
        .iter()
        .filter(|l| l.tx_counted > 0)
        .map(|l| l.tx_seen as f64 / l.tx_counted as f64)
        .collect();
    Lives {
        lifetime_cpu_s: of(m.daemons.iter().map(|l| l.lifetime_cpu_s).collect()),
        records: of(m
            .daemons
            .iter()
            .map(|l| l.stop.records.values().sum::<u64>() as f64)
            .collect()),
        tcp_retransmit_records: of(m
            .daemons
            .iter()
            .map(|l| l.stop.records.get("tcp_retransmit").copied().unwrap_or(0) as f64)
            .collect()),
        tx_seen_per_counted: Summary::of(&coverage),
    }
}
