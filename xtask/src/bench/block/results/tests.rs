use super::*;
use crate::bench::block::{DaemonLife, DepthRuns, render};
use crate::bench::parts::fixtures::{self, cost, host};
use crate::bench::peers::PeerProgram;
use crate::bench::stats::Outcome;
use crate::bench::tracer::{ProgramCost, StopRecord};

fn fio(iops: f64, p99_us: f64) -> FioRun {
    FioRun {
        iops,
        p50_us: p99_us / 2.0,
        p99_us,
        ios: (iops * 10.0) as u64,
        runtime_s: 10.0,
        others_user_cpu_pct: 0.0,
        steal_pct: 0.0,
    }
}

fn usage(cpu_s: f64) -> crate::bench::paired::ProcessUse {
    fixtures::usage(cpu_s, 10.0, 1024)
}

fn traced(iops: f64, p99_us: f64, run_count: u64, cpu_s: f64) -> TracedRun {
    TracedRun {
        run: fio(iops, p99_us),
        programs: vec![
            cost("block", "on_block_rq_issue", run_count, 100),
            cost("block", "on_block_bio_complete", 0, 0),
            // Other families run for the VM's own traffic: not the block suite's.
            cost("tcp", "on_tcp_probe", run_count, 1000),
        ],
        usage: usage(cpu_s),
    }
}

fn peer(iops: f64, run_count: u64) -> PeerRun {
    PeerRun {
        run: fio(iops, 120.0),
        programs: vec![PeerProgram {
            tracepoint: "block_rq_issue".into(),
            run_count,
            run_time_ns: run_count * 600,
        }],
        usage: usage(0.005),
    }
}

fn stop(recursion: u64) -> StopRecord {
    StopRecord {
        kind: "stop".into(),
        lost: BTreeMap::from([("block.ring".to_string(), 1)]),
        records: BTreeMap::new(),
        programs: vec![ProgramCost {
            recursion_misses: recursion,
            ..cost("block", "on_block_rq_issue", 0, 0)
        }],
    }
}

/// 6 rounds at QD16: traced keeps 98–99% of IOPS in every round, so the
/// target's whole interval is above 0.97.
fn measured(rounds: usize) -> Measured {
    let traced_iops = [98_000.0, 98_500.0, 99_000.0, 98_200.0, 98_800.0, 98_600.0];
    Measured {
        depths: vec![DepthRuns {
            part: 16,
            untraced: vec![fio(100_000.0, 100.0); rounds],
            traced: (0..rounds)
                .map(|i| traced(traced_iops[i % 6], 110.0, 0, 0.01))
                .collect(),
            traced_bpf_stats: (0..rounds)
                .map(|_| traced(80_000.0, 150.0, 800_000, 0.02))
                .collect(),
            peer: (0..rounds).map(|_| peer(90_000.0, 0)).collect(),
            peer_bpf_stats: (0..rounds).map(|_| peer(80_000.0, 800_000)).collect(),
        }],
        daemons: (0..rounds)
            .map(|i| DaemonLife {
                stop: stop(i as u64),
                lifetime_cpu_s: 0.5,
            })
            .collect(),
        direct_io: true,
        hooks: vec!["block_rq_issue (tp_btf)".into()],
        warnings: Vec::new(),
        unavailable: Vec::new(),
    }
}

/// The ratios and the target come from the runs without the accounting,
/// each over the untraced run of the same round; the programs' cost from
/// the runs with it; the daemon's figures from the former.
#[test]
fn each_figure_comes_from_its_configuration() {
    let settings = Settings {
        rounds: 6,
        runtime_s: 10,
    };
    let r = aggregate(&settings, &measured(6), host(), 1.0, Default::default());
    let d = &r.depths[0];
    let iops = d.traced_ratio.iops.unwrap();
    assert!((iops.median - 0.9855).abs() < 1e-9, "{}", iops.median);
    assert_eq!(iops.rounds, 6);
    assert!((iops.ci.unwrap().low - 0.98).abs() < 1e-9);
    assert!((d.traced_ratio.p99_us.unwrap().median - 1.1).abs() < 1e-9);
    assert!((d.bpf_stats_ratio.iops.unwrap().median - 0.8).abs() < 1e-9);
    assert_eq!(r.targets.iops_ratio_qd16.outcome, Outcome::Met);
    let cpu = d.daemon.cpu_pct_of_one_cpu.unwrap();
    assert!((cpu.median - 0.1).abs() < 1e-9);

    let p = r
        .programs
        .iter()
        .find(|p| p.total.program == "on_block_rq_issue")
        .unwrap();
    assert_eq!(r.programs.len(), 2, "the tcp program is left out");
    assert_eq!(p.total.run_count, 6 * 800_000);
    assert_eq!(p.total.ns_per_event, Some(100.0));
    assert_eq!(
        p.total.recursion_misses, 15,
        "from the stop records: 0+1+...+5"
    );
    assert_eq!(p.by_round.unwrap().median, 100.0);
    assert!((p.by_depth[0].events_per_s - 80_000.0).abs() < 1e-9);
    assert!((p.by_depth[0].events_per_io - 1.0).abs() < 1e-9);
    // 100 ns per event, one event per I/O, every round: met over its interval.
    assert_eq!(r.targets.ns_per_event_per_hook.outcome, Outcome::Met);
    let idle = r
        .programs
        .iter()
        .find(|p| p.total.program == "on_block_bio_complete")
        .unwrap();
    assert_eq!(idle.by_round, None);
    assert!(
        r.targets
            .ns_per_event_per_hook
            .detail
            .contains("never ran: on_block_bio_complete")
    );

    assert!((d.bpf_ns_per_io - 100.0).abs() < 1e-9);
    assert!((d.peer_ns_per_io - 600.0).abs() < 1e-9);
    assert!((d.versus_peer.factor.unwrap().median - 6.0).abs() < 1e-9);
    assert_eq!(r.targets.versus_peer_qd16.outcome, Outcome::Met);
    assert!((d.peer_ratio.iops.unwrap().median - 0.9).abs() < 1e-9);
    assert_eq!(r.peer.bpf_stats_rounds, 6);
    assert_eq!(r.lost["block.ring"], 6);

    // Cost per unit of work: 100 ns per I/O is 1% of a core at 100k IOPS.
    let st = &r.unit_costs[0];
    assert_eq!(
        (st.tool.as_str(), st.workload.as_str()),
        ("stalltrace", "fio QD16")
    );
    let pct = st.per_unit[0].pct_of_core_at_100k.unwrap();
    assert!((pct.median - 1.0).abs() < 1e-9);
    assert!(st.measured_at.starts_with("98.") && st.measured_at.ends_with("k IOPS"));
    let pe = &r.unit_costs[1];
    assert!((pe.per_unit[0].bpf_ns.unwrap().median - 600.0).abs() < 1e-9);
    assert!((pe.process_cpu_pct.unwrap().median - 0.05).abs() < 1e-9);

    let md = render::markdown(&r);
    for needle in [
        "QD16 traced+bpf-stats/untraced, per round",
        "Floor on this VM",
        "measured separately (not by this suite)",
        "Cost per unit of work",
        "% of one core at 100k I/Os/s",
        "**met**",
    ] {
        assert!(
            md.to_lowercase().contains(&needle.to_lowercase()),
            "{needle}"
        );
    }
}

/// Three rounds cannot give a 95% interval: every target that rests on
/// rounds says so instead of judging.
#[test]
fn too_few_rounds_judge_nothing() {
    let settings = Settings {
        rounds: 3,
        runtime_s: 10,
    };
    let r = aggregate(&settings, &measured(3), host(), 1.0, Default::default());
    for v in [
        &r.targets.iops_ratio_qd16,
        &r.targets.iops_ratio_qd1,
        &r.targets.ns_per_io_qd16,
        &r.targets.ns_per_event_per_hook,
        &r.targets.versus_peer_qd16,
    ] {
        assert_eq!(v.outcome, Outcome::Inconclusive, "{}", v.target);
        assert!(v.detail.contains("needs at least 6"), "{}", v.detail);
    }
    assert!(render::markdown(&r).contains("**inconclusive**"));
}
