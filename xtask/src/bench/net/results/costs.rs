//! The net suite's cost per received and per sent segment (stalltrace's, the
//! floor's under it and the peer's, on each workload), and what each round's
//! daemon did over its life.

use super::floor::{self, PerRound};
use super::{Lives, Side, WorkloadResult};
use crate::bench::net::{Measured, segments};
use crate::bench::stats::Summary;
use crate::bench::unitcost::{PerUnit, UnitCost, rate_text};

/// Cost per received and per sent segment, stalltrace's, the floor's and
/// the peer's, on each workload.
pub fn unit_costs(m: &Measured, results: &[WorkloadResult]) -> Vec<UnitCost> {
    let paths = floor::paths(m);
    let mut out = Vec::new();
    for (runs, r) in m.runs.parts.iter().zip(results) {
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
        let (rx, tx, _) = super::per_segment(
            runs.traced_bpf_stats()
                .iter()
                .map(|t| (&t.run, segments::split(super::net_programs(t)))),
        );
        let PerRound {
            floor: [floor_rx, floor_tx, _],
            work: [work_rx, work_tx, _],
        } = floor::per_round(&paths, runs);
        // Without floor runs, no work column (rather than one of "–").
        let work = |u: PerUnit, w: Vec<f64>| {
            if runs.floor.is_empty() {
                u
            } else {
                u.with_work_over_floor(w)
            }
        };
        let workload = runs.part.key;
        out.push(UnitCost::of_process(
            workload,
            "stalltrace",
            vec![
                work(PerUnit::new("received segment", rx), work_rx),
                work(PerUnit::new("sent segment", tx), work_tx),
            ],
            &r.configs.daemon,
            rx_rate(&r.configs.traced),
        ));
        if !runs.floor.is_empty() {
            let floor = vec![
                PerUnit::new("received segment", floor_rx),
                PerUnit::new("sent segment", floor_tx),
            ];
            out.push(UnitCost::floor(workload, floor));
        }
        let (rx, tx, _) = super::per_segment(runs.peer_bpf_stats(0).iter().map(|p| {
            let programs = p
                .programs
                .iter()
                .map(|q| (q.tracepoint.as_str(), q.run_time_ns));
            (&p.run, segments::split(programs))
        }));
        out.push(UnitCost::of_process(
            workload,
            "bpftrace (peer)",
            vec![
                PerUnit::new("received segment", rx),
                PerUnit::new("sent segment", tx),
            ],
            &r.configs.peer_process,
            rx_rate(&r.configs.peer),
        ));
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
        .runs
        .daemons
        .iter()
        .filter(|l| l.output.counted > 0)
        .map(|l| l.output.seen as f64 / l.output.counted as f64)
        .collect();
    Lives {
        lifetime_cpu_s: of(m.runs.daemons.iter().map(|l| l.lifetime_cpu_s).collect()),
        records: of(m
            .runs
            .daemons
            .iter()
            .map(|l| l.stop.records.values().sum::<u64>() as f64)
            .collect()),
        tcp_retransmit_records: of(m
            .runs
            .daemons
            .iter()
            .map(|l| l.stop.records.get("tcp_retransmit").copied().unwrap_or(0) as f64)
            .collect()),
        tx_seen_per_counted: Summary::of(&coverage),
    }
}
