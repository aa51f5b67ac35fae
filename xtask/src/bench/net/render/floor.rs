//! The floor in the net section: its setup line, and what it cost.

use std::fmt::Write;

use super::super::results::NetResults;
use crate::bench::floor::Description;
use crate::bench::net::segments::Direction;
use crate::bench::stats::Estimate;
use crate::bench::table;

/// The heading's anchor (the block section has its own "Floor on this VM").
const ANCHOR: &str = "#network-floor-on-this-vm";

/// The setup line: how the floor ran, what each program does, and where.
pub fn setup_line(r: &NetResults) -> String {
    Description::setup_line(
        r.floor.as_ref().map(|f| &f.description),
        r.setup.paired.floor,
        ("Network floor on this VM", ANCHOR),
        "unit",
    )
}

fn est(e: &Option<Estimate>) -> String {
    e.as_ref().map_or("–".into(), |e| e.text(0))
}

/// Floor and work per unit on each workload, in words: "sockperf: per
/// received segment floor 90 [85–95] ns + work 400 [380–420] ns, ...".
pub fn per_unit_text(r: &NetResults) -> String {
    let Some(f) = &r.floor else {
        return "not measured".into();
    };
    f.workloads
        .iter()
        .map(|w| {
            let one = |unit: &str, floor: &Option<Estimate>, work: &Option<Estimate>| {
                format!("per {unit} floor {} ns + work {} ns", est(floor), est(work))
            };
            format!(
                "{}: {}; {}; {}",
                w.workload,
                one(
                    "received segment",
                    &w.floor_ns_per_received_segment,
                    &w.work_over_floor_ns_per_received_segment
                ),
                one(
                    "sent segment",
                    &w.floor_ns_per_sent_segment,
                    &w.work_over_floor_ns_per_sent_segment
                ),
                one(w.unit, &w.floor_ns_per_unit, &w.work_over_floor_ns_per_unit),
            )
        })
        .collect::<Vec<_>>()
        .join(". ")
}

fn path(d: Direction) -> &'static str {
    match d {
        Direction::Receive => "receive",
        Direction::Send => "send",
        Direction::Other => "neither",
    }
}

/// The "Network floor on this VM" subsection: the floor per unit and per
/// hook, the target it is for, and its C.
pub fn section(s: &mut String, r: &NetResults) {
    *s += "\n### Network floor on this VM\n\n";
    let Some(f) = &r.floor else {
        *s += "Not measured: no traced block ran, so no hooks were known.\n";
        return;
    };
    let _ = writeln!(
        s,
        "Measured by this suite, in each round's traced block right after the daemon stopped: \
         one program per network-path attach point the daemon used, with the same attach \
         type, each doing {}, with the kernel's accounting on. It is what the accounting \
         charges a program on those hooks that does only what any timing hook does at least; \
         what stalltrace's programs are charged beyond it (\"work\") is their own. Each floor \
         program counts on the path of stalltrace's program on the same hook (receive per \
         segment received, send per segment sent, as in the table above; per transaction, \
         every program). Round by round, median [95% interval]: {}.\n\n\
         Target (issue 30): the network path at the floor plus half of today's work. Today's \
         work is what these rows measure for the first time, so the target has no number yet \
         and nothing here is judged against it.\n",
        f.description.body,
        per_unit_text(r),
    );
    let negative = f.workloads.iter().any(|w| {
        [
            &w.work_over_floor_ns_per_received_segment,
            &w.work_over_floor_ns_per_sent_segment,
            &w.work_over_floor_ns_per_unit,
        ]
        .iter()
        .any(|e| e.as_ref().is_some_and(|e| e.median < 0.0))
    });
    if negative {
        // Seen on the first run: stalltrace's sampled hooks under the floor.
        *s += "\nWhere the work is negative, stalltrace's programs cost less than the floor's \
               on the same hooks: its per-packet netdev hooks time one packet in 64 per CPU and \
               read no clock on the others (ebpf/netdev.bpf.c), while every floor program \
               reads the clock on every event. On those hooks this floor is not a lower \
               bound; one without the clock read would be.\n\n";
    }
    let rows: Vec<Vec<String>> = f
        .programs
        .iter()
        .map(|p| {
            vec![
                p.cost.tracepoint.clone(),
                p.stalltrace_program.clone().unwrap_or_else(|| "–".into()),
                path(p.path).into(),
                p.cost
                    .ns_per_event
                    .map_or("–".into(), |ns| format!("{ns:.0}")),
                p.cost.by_round.as_ref().map_or("–".into(), |e| e.text(0)),
                p.cost.run_count.to_string(),
            ]
        })
        .collect();
    *s += &table::markdown(
        &[
            "floor program",
            "stalltrace's on the hook",
            "path",
            "ns/event",
            "per round: median [95% CI]",
            "runs",
        ],
        &rows,
    );
    let _ = writeln!(
        s,
        "\nstalltrace's ns/event (the programs' table above) includes this floor, so each \
         hook's own work is its ns/event less the floor's on the same hook. {}",
        f.description.source_text()
    );
}
