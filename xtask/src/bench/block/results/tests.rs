use super::*;
use crate::bench::block::{DepthRuns, render};
use crate::bench::engine::{DaemonLife, Runs};
use crate::bench::floor;
use crate::bench::paired::Accounted;
use crate::bench::parts::fixtures::{
    self, assert_near, assert_outcome, assert_shows, cost, host, peer_program, settings, tp_btf,
};
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
        programs: vec![peer_program("block_rq_issue", run_count, 600)],
        usage: usage(0.005),
    }
}

/// Empty programs on block_rq_issue: `ns` per event, one event per I/O.
fn floor_run(ns: u64) -> PeerRun {
    PeerRun {
        run: fio(80_000.0, 150.0),
        programs: vec![peer_program("tp_btf/block_rq_issue", 800_000, ns)],
        usage: usage(0.0),
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
    let runs = Runs {
        parts: vec![DepthRuns {
            part: crate::bench::block::Part {
                backing: crate::bench::block::Backing::Tmpfs,
                iodepth: 16,
            },
            untraced: vec![fio(100_000.0, 100.0); rounds],
            daemons: vec![Accounted {
                plain: (0..rounds)
                    .map(|i| traced(traced_iops[i % 6], 110.0, 0, 0.01))
                    .collect(),
                bpf_stats: (0..rounds)
                    .map(|_| traced(80_000.0, 150.0, 800_000, 0.02))
                    .collect(),
            }],
            peers: vec![Accounted {
                plain: (0..rounds).map(|_| peer(90_000.0, 0)).collect(),
                bpf_stats: (0..rounds).map(|_| peer(80_000.0, 800_000)).collect(),
            }],
            floor: (0..rounds)
                .map(|i| floor_run([38, 40, 42, 39, 41, 40][i % 6]))
                .collect(),
        }],
        daemons: (0..rounds)
            .map(|i| DaemonLife {
                stop: stop(i as u64),
                lifetime_cpu_s: 0.5,
                output: (),
            })
            .collect(),
        floor: Some(floor::Object::uncompiled(&[tp_btf("block_rq_issue")])),
        warnings: Vec::new(),
    };
    Measured {
        runs,
        direct_io: true,
        disk_direct_io: true,
        hooks: vec!["block_rq_issue (tp_btf)".into()],
        rezolus: false,
        unavailable: Vec::new(),
    }
}

/// The results of `m`, aggregated with as many rounds as it has.
fn aggregated(m: &Measured) -> BlockResults {
    let rounds = m.runs.parts[0].untraced.len();
    aggregate(&settings(rounds, 10), m, host(), 1.0, Default::default())
}

/// The ratios and the target come from the runs without the accounting,
/// each over the untraced run of the same round; the programs' cost from
/// the runs with it; the daemon's figures from the former.
#[test]
fn each_figure_comes_from_its_configuration() {
    let r = aggregated(&measured(6));
    let d = &r.depths[0];
    let iops = d.traced_ratio["iops"].clone();
    assert!((iops.median - 0.9855).abs() < 1e-9, "{}", iops.median);
    assert_eq!(iops.rounds, 6);
    assert_near(iops.ci.unwrap().low, 0.98);
    assert_near(d.traced_ratio["p99_us"].median, 1.1);
    assert_near(d.configs.bpf_stats_ratio["iops"].median, 0.8);
    assert_outcome(&r.targets.iops_ratio_qd16, Outcome::Met);
    let cpu = d.configs.daemon.cpu_pct_of_one_cpu.clone().unwrap();
    assert_near(cpu.median, 0.1);

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
    assert_eq!(p.by_round.clone().unwrap().median, 100.0);
    assert_near(p.by_part.by_depth[0].events_per_s, 80_000.0);
    assert_near(p.by_part.by_depth[0].events_per_io, 1.0);
    // 100 ns per event, one event per I/O, every round: met over its interval.
    assert_outcome(&r.targets.ns_per_event_per_hook, Outcome::Met);
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

    assert_near(d.bpf_ns_per_io, 100.0);
    assert_near(d.peer_ns_per_io, 600.0);
    assert_near(d.versus_peer.factor.clone().unwrap().median, 6.0);
    assert_outcome(&r.targets.versus_peer_qd16, Outcome::Met);
    assert_near(d.configs.peer_ratio["iops"].median, 0.9);
    assert_eq!(r.peer.bpf_stats_rounds, 6);
    assert_eq!(r.lost["block.ring"], 6);

    // Cost per unit of work: 100 ns per I/O is 1% of a core at 100k IOPS.
    let st = &r.unit_costs[0];
    assert_eq!(
        (st.tool.as_str(), st.workload.as_str()),
        ("stalltrace", "fio QD16")
    );
    let pct = st.per_unit[0].pct_of_core_at_100k.clone().unwrap();
    assert_near(pct.median, 1.0);
    assert!(st.measured_at.starts_with("98.") && st.measured_at.ends_with("k IOPS"));
    let pe = &r.unit_costs[2];
    assert_near(pe.per_unit[0].bpf_ns.clone().unwrap().median, 600.0);
    assert_near(pe.process_cpu_pct.clone().unwrap().median, 0.05);

    // The floor: 38–42 ns per I/O round by round, stalltrace's 100 over it
    // taken round by round (100 − 40.5 at the median of 6).
    let f = d.floor_ns_per_io.clone().unwrap();
    assert_eq!((f.min, f.max, f.median), (38.0, 42.0, 40.0));
    let w = d.work_over_floor_ns_per_io.clone().unwrap();
    assert_eq!((w.min, w.max, w.median), (58.0, 62.0, 60.0));
    assert_outcome(&r.targets.work_over_floor_qd16, Outcome::Met);
    assert_eq!(r.targets.work_over_floor_qd16.measured, "60 [58–62] ns");
    let fl = &r.unit_costs[1];
    assert_eq!(fl.tool, crate::bench::unitcost::FLOOR_TOOL);
    assert_eq!(fl.per_unit[0].bpf_ns, d.floor_ns_per_io);
    assert_eq!((fl.process_cpu_pct.clone(), fl.peak_rss_mib), (None, None));
    assert_eq!(
        st.per_unit[0].work_over_floor_ns,
        d.work_over_floor_ns_per_io
    );
    assert_eq!(pe.per_unit[0].work_over_floor_ns, None);
    let floor = r.floor.as_ref().unwrap();
    assert_eq!(floor.programs[0].tracepoint, "tp_btf/block_rq_issue");
    assert_eq!(floor.programs[0].by_round.clone().unwrap().median, 40.0);
    assert_near(d.floor_ratio["iops"].median, 0.8);

    let md = render::markdown(&r);
    for needle in [
        "QD16 traced+bpf-stats/untraced, per round",
        "QD16 floor+bpf-stats/untraced, per round",
        "Floor on this VM",
        "programs: tp_btf/block_rq_issue.",
        "SEC(\"tp_btf/block_rq_issue\")",
        "| tp_btf/block_rq_issue |",
        "QD16 floor 40 [38–42] ns + work 60 [58–62] ns",
        "work over the floor, BPF ns per I/O",
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
    let r = aggregated(&measured(3));
    // Parts the fixture does not have: no verdict either, and saying why.
    for v in [
        &r.targets.iops_ratio_qd1,
        &r.targets.iops_ratio_disk_qd16,
        &r.targets.iops_ratio_disk_qd1,
    ] {
        assert_outcome(v, Outcome::Inconclusive);
        assert!(v.detail.starts_with("not measured"), "{}", v.detail);
    }
    for v in [
        &r.targets.iops_ratio_qd16,
        &r.targets.ns_per_io_qd16,
        &r.targets.ns_per_event_per_hook,
        &r.targets.versus_peer_qd16,
        &r.targets.work_over_floor_qd16,
    ] {
        assert_outcome(v, Outcome::Inconclusive);
        assert!(v.detail.contains("needs at least 6"), "{}", v.detail);
    }
    assert!(render::markdown(&r).contains("**inconclusive**"));
}

/// Without floor runs (none measured) the floor's figures are absent, not
/// zero, and its target has no verdict.
#[test]
fn no_floor_runs_no_floor_figures() {
    let mut m = measured(6);
    m.runs.parts[0].floor.clear();
    m.runs.floor = None;
    let r = aggregated(&m);
    let d = &r.depths[0];
    assert!(d.floor_bpf_stats.is_none() && d.floor_ns_per_io.is_none());
    assert!(d.work_over_floor_ns_per_io.is_none());
    assert_outcome(&r.targets.work_over_floor_qd16, Outcome::Inconclusive);
    assert_eq!(r.unit_costs.len(), 2, "stalltrace and the peer only");
    let md = render::markdown(&r);
    assert!(!md.contains("floor+bpf-stats/untraced"), "{md}");
    assert!(md.contains("Not measured: no traced block ran"), "{md}");
}

/// rezolus beside bpftrace: its own rows, and the target against the
/// cheaper of the two in each round (rezolus at 300 ns per I/O in odd
/// rounds, 900 in even ones; bpftrace always 600; stalltrace 100).
#[test]
fn the_target_takes_the_cheaper_peer_of_each_round() {
    let mut m = measured(6);
    m.rezolus = true;
    let rz = |iops: f64, ns: u64| PeerRun {
        run: fio(iops, 130.0),
        programs: vec![peer_program("block_rq_complete", 800_000, ns)],
        usage: usage(0.002),
    };
    m.runs.parts[0].peers.push(Accounted {
        plain: (0..6).map(|_| rz(95_000.0, 0)).collect(),
        bpf_stats: (0..6)
            .map(|i| rz(80_000.0, if i % 2 == 0 { 300 } else { 900 }))
            .collect(),
    });
    let r = aggregated(&m);
    let d = &r.depths[0];
    let c = &d.versus_cheapest_peer;
    assert_eq!((c.bpftrace_rounds, c.rezolus_rounds), (3, 3));
    // Factors 3 and 6 by turns: the median between, the whole interval >= 1.
    assert_eq!(c.comparison.factor.clone().unwrap().median, 4.5);
    // The cheaper peer's own run of the same round: rezolus 5%, bpftrace 10%.
    let o = c.comparison.peer_overhead.clone().unwrap();
    assert_near(o.min, 0.05);
    assert_near(o.max, 0.1);
    let v = &r.targets.versus_peer_qd16;
    assert_outcome(v, Outcome::Met);
    assert!(v.target.contains("<= the cheapest peer's"), "{}", v.target);
    assert!(v.detail.contains("rezolus in 3"), "{}", v.detail);
    let z = d.rezolus.as_ref().unwrap();
    assert_eq!(z.ns_per_io.clone().unwrap().median, 600.0);
    assert_near(z.ratio["iops"].median, 0.95);
    let row = r.unit_costs.iter().find(|u| u.tool == "rezolus (peer)");
    assert_eq!(row.unwrap().per_unit[0].bpf_ns, z.ns_per_io);
    assert_eq!(r.rezolus.as_ref().unwrap().bpf_stats_rounds, 6);
    let md = render::markdown(&r);
    assert_shows(
        &md,
        &[
            "QD16 rezolus/untraced, per round",
            "| rezolus (peer) ",
            "rezolus program (tracepoint)",
            "[samplers.blockio_latency]",
        ],
    );

    // Not installed: bpftrace alone is the cheapest, and nothing of rezolus shows.
    let r = aggregated(&measured(6));
    let c = &r.depths[0].versus_cheapest_peer;
    assert_eq!((c.bpftrace_rounds, c.rezolus_rounds), (6, 0));
    assert!(r.rezolus.is_none() && r.depths[0].rezolus.is_none());
    assert!(!render::markdown(&r).contains("rezolus program"));
}

/// The disk-backed device's parts: their own rows and a tighter IOPS target,
/// while the cost targets stay on the tmpfs device's QD16.
#[test]
fn the_disk_device_has_its_own_rows_and_target() {
    let mut m = measured(6);
    let mut disk = measured(6).runs.parts.remove(0);
    disk.part = crate::bench::block::Part {
        backing: crate::bench::block::Backing::Disk,
        iodepth: 16,
    };
    // 99.5% of untraced IOPS in every round: met at 0.99.
    for t in &mut disk.daemons[0].plain {
        t.run.iops = 99_500.0;
    }
    m.runs.parts.push(disk);
    let r = aggregated(&m);
    let v = &r.targets.iops_ratio_disk_qd16;
    assert_outcome(v, Outcome::Met);
    assert!(v.target.contains("at disk QD16 >= 0.99"), "{}", v.target);
    // The tmpfs device's 98.0–99.0% would miss 0.99 but meets its own 0.98.
    assert_outcome(&r.targets.iops_ratio_qd16, Outcome::Met);
    assert!(r.targets.ns_per_io_qd16.target.starts_with("QD16:"));
    assert_eq!(r.depths[1].label, "disk QD16");
    let md = render::markdown(&r);
    assert_shows(
        &md,
        &[
            "| disk QD16 traced ",
            "disk QD16 traced/untraced, per round",
            "| fio disk QD16 | stalltrace",
        ],
    );
}
