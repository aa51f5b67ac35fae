//! The net suite's ratio targets, each judged on the 95% interval of its
//! per-round ratio (see `stats::judge`): met or missed only when the whole
//! interval is on one side of the target.

use super::WorkloadResult;
use crate::bench::net::workload::Workload;
use crate::bench::net::{NS_PER_SENT_SEGMENT_TARGET, RATIO_TARGET};
use crate::bench::publish::Verdict;
use crate::bench::stats::{Goal, judge};
use crate::bench::unitcost::UnitCost;

/// The target on a workload's first figure: within 2% of untraced, each
/// traced run over the untraced run of the same round.
pub fn ratio(w: &Workload, r: &WorkloadResult) -> Verdict {
    let fig = &w.figures[0];
    let name = match w.key {
        "sockperf" => "sockperf round-trip p50".to_string(),
        "iperf3" => "iperf3 unpaced received throughput".to_string(),
        key => format!("{key} received throughput"),
    };
    let goal = if w.higher_is_better {
        Goal::AtLeast(1.0 - RATIO_TARGET)
    } else {
        Goal::AtMost(1.0 + RATIO_TARGET)
    };
    let e = r.ratio.get(fig.key);
    let j = judge(e, goal, 3);
    let allowed = RATIO_TARGET * 100.0;
    let detail = match e {
        Some(e) => {
            let moved = match (w.higher_is_better, e.median >= 1.0) {
                (true, true) => "gained",
                (true, false) => "lost",
                (false, true) => "added",
                (false, false) => "took off",
            };
            j.ratio_detail(e, moved, "", allowed)
        }
        None => format!(
            "{}: {} (the untraced figure was 0 in every round)",
            j.outcome.word(),
            j.why
        ),
    };
    Verdict {
        target: format!(
            "{name}, traced / untraced of the same round {}",
            goal.text(2)
        ),
        measured: e.map_or("no figure".into(), |e| e.text(3)),
        outcome: j.outcome,
        detail,
    }
}

/// stalltrace's send-path programs together per segment sent on `workload`
/// (segments, not TSO super-packets: on sockperf's small messages each
/// segment is a packet of its own).
pub fn ns_per_sent_segment(costs: &[UnitCost], workload: &str) -> Verdict {
    let e = costs
        .iter()
        .find(|u| u.tool == "stalltrace" && u.workload == workload)
        .and_then(|u| u.per_unit.iter().find(|p| p.unit == "sent segment"))
        .and_then(|p| p.bpf_ns.as_ref());
    let j = judge(e, Goal::AtMost(NS_PER_SENT_SEGMENT_TARGET), 0);
    Verdict {
        target: format!(
            "{workload}: every send-path program's BPF time together per segment sent <= \
             {NS_PER_SENT_SEGMENT_TARGET:.0} ns (per round)"
        ),
        measured: e.map_or("–".into(), |e| format!("{} ns", e.text(0))),
        outcome: j.outcome,
        detail: format!("{}: {}", j.outcome.word(), j.why),
    }
}
