//! The floor in the net suite's results: its programs counted on the path
//! of stalltrace's program on the same hook, and the work over it.

use super::*;
use crate::bench::floor::Object;
use crate::bench::net::segments::Direction;
use crate::bench::unitcost::FLOOR_TOOL;

fn floor_run(w: &Workload) -> PeerRun {
    let p = |hook: &str, run_count, ns| peer_program(&format!("tp_btf/{hook}"), run_count, ns);
    PeerRun {
        run: run(w, 100.0),
        programs: vec![
            p("tcp_probe", 80_000, 50),
            p("net_dev_start_xmit", 80_000, 40),
            p("inet_sock_set_state", 800, 60),
        ],
        usage: usage(0.0),
    }
}

#[test]
fn the_floor_counts_on_stalltraces_paths_and_work_is_taken_over_it() {
    let mut m = measured(6);
    let points = [
        tp_btf("tcp_probe"),
        tp_btf("net_dev_start_xmit"),
        tp_btf("inet_sock_set_state"),
    ];
    m.runs.floor = Some(Object::uncompiled(&points));
    for w in &mut m.runs.parts {
        w.floor = (0..6).map(|_| floor_run(w.part)).collect();
    }
    let r = aggregated(&m);
    let f = r.floor.as_ref().unwrap();
    let path = |section: &str| {
        let p = f.programs.iter().find(|p| p.cost.tracepoint == section);
        (p.unwrap().path, p.unwrap().stalltrace_program.clone())
    };
    // tcp_probe by the daemon's on_tcp_probe; the others (no program of the
    // daemon's in the fixture's stop record) by their hook's own name.
    assert_eq!(
        path("tp_btf/tcp_probe"),
        (Direction::Receive, Some("on_tcp_probe".into()))
    );
    assert_eq!(path("tp_btf/net_dev_start_xmit"), (Direction::Send, None));
    assert_eq!(path("tp_btf/inet_sock_set_state"), (Direction::Other, None));

    // 4 ms over 50 000 received segments, 3.2 ms over 40 000 sent: 80 ns
    // each, under stalltrace's 320 and 200; per transaction of 1000, every
    // program: 7248 ns under 24 720.
    let s = &f.workloads[0];
    assert_eq!(s.workload, "sockperf");
    let median = |e: &Option<crate::bench::stats::Estimate>| e.as_ref().unwrap().median;
    assert_near(median(&s.floor_ns_per_received_segment), 80.0);
    assert_near(median(&s.floor_ns_per_sent_segment), 80.0);
    assert_near(median(&s.floor_ns_per_unit), 7248.0);
    assert_near(median(&s.work_over_floor_ns_per_received_segment), 240.0);
    assert_near(median(&s.work_over_floor_ns_per_sent_segment), 120.0);
    assert_near(median(&s.work_over_floor_ns_per_unit), 17_472.0);

    let st = &r.unit_costs[0];
    assert_eq!(st.tool, "stalltrace");
    assert_near(median(&st.per_unit[0].work_over_floor_ns), 240.0);
    let fl = &r.unit_costs[1];
    assert_eq!(fl.tool, FLOOR_TOOL);
    assert_near(median(&fl.per_unit[1].bpf_ns), 80.0);
    assert!(fl.peak_rss_mib.is_none());

    let md = render::markdown(&r);
    assert_shows(
        &md,
        &[
            "work over the floor, BPF ns per received segment",
            "### Network floor on this VM",
            "per received segment floor 80 [80–80] ns + work 240 [240–240] ns",
            "per round trip floor 7248 [7248–7248] ns + work 17472 [17472–17472] ns",
            "no number yet",
            "SEC(\"tp_btf/net_dev_start_xmit\")",
        ],
    );
    // Table cells are padded: find the rows, then their cells.
    let row = |a: &str, b: &str| md.lines().find(|l| l.contains(a) && l.contains(b)).unwrap();
    assert!(
        row("| sockperf", FLOOR_TOOL).contains(" 80 [80–80] |"),
        "{md}"
    );
    let probe = row("| tp_btf/tcp_probe ", "|");
    assert!(
        probe.contains("on_tcp_probe") && probe.contains("receive"),
        "{probe}"
    );
    // Without floor runs: no floor rows, no work column.
    let r = aggregated(&measured(6));
    assert!(r.floor.is_none());
    let md = render::markdown(&r);
    assert!(!md.contains("over the floor, BPF ns"), "{md}");
    assert!(md.contains("Floor: not measured"), "{md}");
}
