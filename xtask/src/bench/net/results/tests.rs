use super::*;
use crate::bench::net::workload::WORKLOADS;
use crate::bench::net::{WorkloadRuns, render};
use crate::bench::tracer::StopRecord;

fn run(w: &Workload, first: f64) -> Run {
    let mut figures = BTreeMap::from([
        (w.figures[0].key, first),
        (w.unit_figure, 1000.0),
        ("veth_packets", 40_000.0),
    ]);
    figures.insert("retransmits", 0.0);
    Run {
        seconds: 8.0,
        figures,
        others_user_cpu_pct: 1.0,
        steal_pct: 0.5,
    }
}

fn traced(w: &Workload, first: f64, run_count: u64, cpu_s: f64) -> TracedRun {
    TracedRun {
        run: run(w, first),
        stop: StopRecord {
            kind: "stop".into(),
            lost: BTreeMap::new(),
            records: BTreeMap::from([("tcp_retransmit".to_string(), 3), ("netdev".to_string(), 7)]),
            programs: vec![
                ProgramCost {
                    family: "tcp".into(),
                    program: "on_tcp_probe".into(),
                    run_count,
                    run_time_ns: run_count * 200,
                    recursion_misses: 0,
                },
                ProgramCost {
                    family: "netdev".into(),
                    program: "on_net_dev_start_xmit".into(),
                    run_count,
                    run_time_ns: run_count * 100,
                    recursion_misses: 0,
                },
                ProgramCost {
                    family: "block".into(),
                    program: "on_block_rq_issue".into(),
                    run_count: 5,
                    run_time_ns: 5000,
                    recursion_misses: 0,
                },
            ],
        },
        cpu_in_window_s: cpu_s,
        window_s: 8.0,
        lifetime_cpu_s: cpu_s,
        peak_rss_kib: 2048,
        tx_seen: 99,
        tx_counted: 100,
    }
}

/// Ratios and targets from the runs without --bpf-stats, program costs
/// from the runs with it (network-path families only), the daemon from the former.
#[test]
fn each_figure_comes_from_its_configuration() {
    let runs: Vec<WorkloadRuns> = WORKLOADS
        .iter()
        .map(|w| {
            let (base, traced_fig, stats_fig) = if w.higher_is_better {
                (1000.0, 990.0, 900.0)
            } else {
                (100.0, 103.0, 110.0)
            };
            WorkloadRuns {
                workload: w,
                untraced: vec![run(w, base); 3],
                traced: (0..3).map(|_| traced(w, traced_fig, 0, 0.08)).collect(),
                traced_bpf_stats: (0..3).map(|_| traced(w, stats_fig, 80_000, 0.16)).collect(),
                peer: (0..3)
                    .map(|_| crate::bench::net::PeerRun {
                        run: run(w, base),
                        programs: Vec::new(),
                    })
                    .collect(),
                peer_bpf_stats: Vec::new(),
            }
        })
        .collect();
    let m = Measured {
        workloads: runs,
        hooks: vec!["tcp_probe (tp_btf)".into()],
        congestion_control: "bbr".into(),
        warnings: Vec::new(),
        unavailable: Vec::new(),
    };
    let settings = Settings {
        rounds: 3,
        runtime_s: 8,
    };
    let host = Host {
        date: "today".into(),
        kernel: "6.18".into(),
        cpu_model: "test".into(),
        cpus: 2,
    };
    let r = aggregate(&settings, &m, host, 1.0, [String::new(), String::new()]);
    let s = &r.workloads[0];
    assert!((s.ratio["p50_us"] - 1.03).abs() < 1e-9);
    assert!((s.bpf_stats_ratio["p50_us"] - 1.1).abs() < 1e-9);
    assert!(!s.ratio.contains_key("retransmits"), "0 untraced: no ratio");
    assert!(!r.targets[0].met, "{}", r.targets[0].detail);
    assert!(
        r.targets[0].detail.starts_with("missed by 1.0 points"),
        "{}",
        r.targets[0].detail
    );
    assert!(r.targets[1].met, "{}", r.targets[1].detail);
    assert!(
        r.targets[1].detail.starts_with("met with 1.0 points"),
        "{}",
        r.targets[1].detail
    );
    assert!((s.daemon.cpu_pct_of_one_cpu.median - 1.0).abs() < 1e-9);
    assert_eq!(s.daemon.tcp_retransmit_records.median, 3.0);
    assert_eq!(s.daemon.records.median, 10.0);

    assert_eq!(r.programs.len(), 2, "block programs are left out");
    let p = r.programs.iter().find(|p| p.total.family == "tcp").unwrap();
    assert_eq!(p.total.run_count, 3 * 80_000 * 3);
    assert_eq!(p.total.ns_per_event, Some(200.0));
    let b = &p.by_workload[0];
    assert!((b.events_per_s - 10_000.0).abs() < 1e-9);
    assert!((b.events_per_unit - 80.0).abs() < 1e-9);
    // 80 000 runs x (200 + 100) ns per 8 s run = 0.3% of a CPU; 24 µs per transaction.
    assert!((s.bpf.cpu_pct_of_one_cpu - 0.3).abs() < 1e-9);
    assert!((s.bpf.ns_per_unit - 24_000.0).abs() < 1e-9);
    // 24 µs per round trip of an untraced p50 of 100 µs.
    assert!((s.bpf.share_of_bound.unwrap() - 0.24).abs() < 1e-9);
    assert!((r.workloads[1].bpf.share_of_bound.unwrap() - 0.003).abs() < 1e-9);
    assert_eq!(r.workloads[2].bpf.share_of_bound, None);
    assert_eq!(s.xmit_runs_per_veth_packet.unwrap().median, 2.0);
    assert_eq!(s.tx_seen_per_counted.traced.unwrap().median, 0.99);

    assert!(r.setup.tracer.contains("--netns CLIENT_NS"));
    assert!(r.setup.iperf3_loss.contains("-b 500M"));
    let md = render::markdown(&r);
    for needle in [
        "### Targets",
        "sockperf",
        "iperf3_loss",
        "tcp/on_tcp_probe",
        "**missed**",
    ] {
        assert!(md.contains(needle), "{needle}");
    }
}
