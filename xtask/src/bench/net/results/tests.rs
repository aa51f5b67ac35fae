mod floor;

use super::*;
use crate::bench::engine::{DaemonLife, Runs};
use crate::bench::net::workload::WORKLOADS;
use crate::bench::net::{Transmits, render};
use crate::bench::paired::Accounted;
use crate::bench::parts::fixtures::{
    self, assert_near, assert_outcome, assert_shows, cost, host, peer_program, settings, tp_btf,
};
use crate::bench::stats::Outcome;
use crate::bench::tracer::StopRecord;

fn run(w: &Workload, first: f64) -> Run {
    let mut figures = BTreeMap::from([
        (w.figures[0].key, first),
        (w.unit_figure, 1000.0),
        ("veth_packets", 40_000.0),
        ("in_segs", 50_000.0),
        ("out_segs", 40_000.0),
    ]);
    figures.insert("retransmits", 0.0);
    Run {
        seconds: 8.0,
        figures,
        others_user_cpu_pct: 1.0,
        steal_pct: 0.5,
    }
}

fn usage(cpu_s: f64) -> crate::bench::paired::ProcessUse {
    fixtures::usage(cpu_s, 8.0, 2048)
}

fn traced(w: &Workload, first: f64, run_count: u64, cpu_s: f64) -> TracedRun {
    TracedRun {
        run: run(w, first),
        programs: vec![
            cost("tcp", "on_tcp_probe", run_count, 200),
            cost("netdev", "on_net_dev_start_xmit", run_count, 100),
            cost("tcp", "on_inet_sock_set_state", run_count / 100, 900),
            cost("block", "on_block_rq_issue", 5, 1000),
        ],
        usage: usage(cpu_s),
    }
}

fn peer(w: &Workload, first: f64, run_count: u64) -> PeerRun {
    PeerRun {
        run: run(w, first),
        programs: vec![peer_program("tcp_retransmit_skb", run_count, 40_000)],
        usage: usage(0.004),
    }
}

/// `rounds` rounds: traced sockperf 3% slower than untraced in every round
/// (missed), traced throughput 1% lower (met), the loss case's peer 100
/// times stalltrace's cost per transaction (met).
fn measured(rounds: usize) -> Measured {
    let workloads = WORKLOADS
        .iter()
        .map(|w| {
            let (base, traced_fig, stats_fig) = if w.higher_is_better {
                (1000.0, 990.0, 900.0)
            } else {
                (100.0, 103.0, 110.0)
            };
            WorkloadRuns {
                part: w,
                untraced: vec![run(w, base); rounds],
                daemons: vec![Accounted {
                    plain: (0..rounds)
                        .map(|_| traced(w, traced_fig, 0, 0.08))
                        .collect(),
                    bpf_stats: (0..rounds)
                        .map(|_| traced(w, stats_fig, 80_000, 0.16))
                        .collect(),
                }],
                peers: vec![Accounted {
                    plain: (0..rounds).map(|_| peer(w, base, 0)).collect(),
                    bpf_stats: (0..rounds).map(|_| peer(w, base, 60_000)).collect(),
                }],
                floor: Vec::new(),
            }
        })
        .collect();
    let runs = Runs {
        parts: workloads,
        daemons: (0..rounds)
            .map(|_| DaemonLife {
                stop: StopRecord {
                    kind: "stop".into(),
                    lost: BTreeMap::new(),
                    records: BTreeMap::from([
                        ("tcp_retransmit".to_string(), 3),
                        ("netdev".to_string(), 7),
                    ]),
                    programs: vec![ProgramCost {
                        recursion_misses: 2,
                        ..cost("tcp", "on_tcp_probe", 0, 0)
                    }],
                },
                lifetime_cpu_s: 0.7,
                output: Transmits {
                    seen: 99,
                    counted: 100,
                },
            })
            .collect(),
        floor: None,
        warnings: Vec::new(),
    };
    Measured {
        runs,
        hooks: vec!["tcp_probe (tp_btf)".into()],
        congestion_control: "bbr".into(),
        unavailable: Vec::new(),
    }
}

/// The results of `m`, aggregated with as many rounds as it has.
fn aggregated(m: &Measured) -> NetResults {
    let rounds = m.runs.parts[0].untraced.len();
    aggregate(&settings(rounds, 8), m, host(), 1.0, Default::default())
}

/// Ratios and targets from the runs without the accounting, each over the
/// untraced run of the same round; program costs from the runs with it
/// (network-path families only); the daemon from the former.
#[test]
fn each_figure_comes_from_its_configuration() {
    let r = aggregated(&measured(6));
    let s = &r.workloads[0];
    assert_near(s.ratio["p50_us"].median, 1.03);
    assert_near(s.configs.bpf_stats_ratio["p50_us"].median, 1.1);
    assert!(s.ratio.get("retransmits").is_none(), "0 untraced: no ratio");
    assert_outcome(&r.targets[0], Outcome::Missed);
    assert!(
        r.targets[0]
            .detail
            .starts_with("missed: the whole 95% interval"),
        "{}",
        r.targets[0].detail
    );
    assert_outcome(&r.targets[1], Outcome::Met);
    assert!(
        r.targets[1].detail.contains("traced lost 1.0%"),
        "{}",
        r.targets[1].detail
    );
    let cpu = s.configs.daemon.cpu_pct_of_one_cpu.clone().unwrap();
    assert_near(cpu.median, 1.0);
    assert_eq!(r.daemon_lives.tcp_retransmit_records.median, 3.0);
    assert_eq!(r.daemon_lives.records.median, 10.0);
    assert_eq!(r.daemon_lives.tx_seen_per_counted.unwrap().median, 0.99);

    assert_eq!(r.programs.len(), 3, "block programs are left out");
    let p = r
        .programs
        .iter()
        .find(|p| p.total.program == "on_tcp_probe")
        .unwrap();
    assert_eq!(p.total.run_count, 6 * 80_000 * 3);
    assert_eq!(p.total.ns_per_event, Some(200.0));
    assert_eq!(p.total.recursion_misses, 12, "from the stop records");
    assert_eq!(p.by_round.clone().unwrap().median, 200.0);
    let b = &p.by_part.by_workload[0];
    assert_near(b.events_per_s, 10_000.0);
    assert_near(b.events_per_unit, 80.0);
    // 80 000 runs x (200 + 100) ns + 800 x 900 ns per 8 s run; per transaction of 1000.
    assert_near(s.bpf.ns_per_unit, 24_720.0);
    assert_near(s.bpf.cpu_pct_of_one_cpu, 0.309);
    // 24.72 µs per round trip of an untraced p50 of 100 µs.
    assert_near(s.bpf.share_of_bound.unwrap(), 0.2472);
    assert_near(r.workloads[1].bpf.share_of_bound.unwrap(), 0.00309);
    assert_eq!(r.workloads[2].bpf.share_of_bound, None);
    // The state changes, per segment either way: 720 000 ns over 90 000 segments.
    assert_near(s.bpf.other_ns_per_segment.clone().unwrap().median, 8.0);
    assert_eq!(s.xmit_runs_per_veth_packet.unwrap().median, 2.0);

    // Per segment: tcp_probe 16 ms over 50 000 received, the transmit hook
    // 8 ms over 40 000 sent: 320 and 200 ns, 3.2% and 2% of a core at 100k/s.
    let st = &r.unit_costs[0];
    assert_eq!(st.tool, "stalltrace");
    let rx = st.per_unit[0].bpf_ns.clone().unwrap();
    assert_near(rx.median, 320.0);
    let tx = st.per_unit[1].pct_of_core_at_100k.clone().unwrap();
    assert_near(tx.median, 2.0);
    assert!(st.measured_at.starts_with("6.") && st.measured_at.ends_with("k received segments/s"));
    let pe = &r.unit_costs[1];
    assert_eq!(
        pe.per_unit[0].bpf_ns.clone().unwrap().median,
        0.0,
        "retransmits are sent"
    );
    assert_near(pe.per_unit[1].bpf_ns.clone().unwrap().median, 60_000.0);

    let loss = r.workloads.iter().find(|w| w.key == "iperf3_loss").unwrap();
    assert!(loss.versus_peer.factor.clone().unwrap().median > 3.0);
    assert_outcome(&r.targets[3], Outcome::Met);

    assert!(r.setup.paired.tracer.contains("--netns CLIENT_NS"));
    assert!(r.setup.iperf3_loss.contains("-b 500M"));
    let md = render::markdown(&r);
    assert_shows(
        &md,
        &[
            "### Targets",
            "sockperf",
            "iperf3_loss",
            "tcp/on_tcp_probe",
            "**missed**",
            "traced/untraced, per round",
            "BPF ns per received segment",
            "% of one core at 100k sent segments/s",
        ],
    );
}

/// Rounds on both sides of the target make no verdict; too few rounds neither.
#[test]
fn straddling_and_too_few_rounds_are_inconclusive() {
    let mut m = measured(6);
    // sockperf: traced 1% faster in half the rounds, 4% slower in the other half.
    for (i, t) in m.runs.parts[0].daemons[0].plain.iter_mut().enumerate() {
        let p50 = if i % 2 == 0 { 99.0 } else { 104.0 };
        t.run.figures.insert("p50_us", p50);
    }
    let r = aggregated(&m);
    assert_outcome(&r.targets[0], Outcome::Inconclusive);
    assert!(
        r.targets[0].detail.contains("straddles 1.020"),
        "{}",
        r.targets[0].detail
    );

    let r = aggregated(&measured(2));
    for v in &r.targets {
        assert_outcome(v, Outcome::Inconclusive);
        assert!(v.detail.contains("needs at least 6"), "{}", v.detail);
    }
}
