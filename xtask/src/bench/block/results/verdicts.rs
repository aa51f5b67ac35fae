//! The block suite's targets, each judged on the 95% interval of its
//! per-round figure (see `stats::judge`): met or missed only when the whole
//! interval is on one side of the target.

use super::{DepthResult, ProgramResult};
use crate::bench::block::{IOPS_RATIO_TARGET, NS_PER_EVENT_TARGET, NS_PER_IO_TARGET};
use crate::bench::publish::Verdict;
use crate::bench::stats::Estimate;
use crate::bench::stats::{Goal, Judgement, Outcome, judge};

/// traced / untraced IOPS of the same round, at `d`'s depth.
pub fn iops(d: &DepthResult) -> Verdict {
    let e = d.traced_ratio.iops.as_ref();
    let j = judge(e, Goal::AtLeast(IOPS_RATIO_TARGET), 3);
    let allowed_pct = (1.0 - IOPS_RATIO_TARGET) * 100.0;
    let detail = match e {
        Some(e) => format!(
            "{}: {}; at the median traced {} {:.1}% of IOPS ({allowed_pct:.0}% allowed); \
             per-round ratios min–max {}",
            j.outcome.word(),
            j.why,
            if e.median <= 1.0 { "lost" } else { "gained" },
            (1.0 - e.median).abs() * 100.0,
            e.range_text(3)
        ),
        None => format!("{}: {}", j.outcome.word(), j.why),
    };
    Verdict {
        target: format!(
            "traced (no accounting) / untraced IOPS of the same round at QD{} >= {IOPS_RATIO_TARGET}",
            d.iodepth
        ),
        measured: e.map_or("–".into(), |e| e.text(3)),
        outcome: j.outcome,
        detail,
    }
}

/// Every program's BPF run time together per I/O fio completed at `iodepth`,
/// round by round (the accounting runs).
pub fn ns_per_io(ns_by_round: Option<&Estimate>, iodepth: u32) -> Verdict {
    let j = judge(ns_by_round, Goal::AtMost(NS_PER_IO_TARGET), 0);
    Verdict {
        target: format!(
            "QD{iodepth}: every program's BPF time together per I/O <= {NS_PER_IO_TARGET:.0} ns (per round)"
        ),
        measured: ns_by_round.map_or("–".into(), |e| format!("{} ns", e.text(0))),
        outcome: j.outcome,
        detail: format!("{}: {}", j.outcome.word(), j.why),
    }
}

/// Every hook's ns/event, round by round: missed when any hook's whole
/// interval is over the target, met when every hook's is under it.
pub fn ns_per_event(programs: &[ProgramResult]) -> Verdict {
    let target = format!("<= {NS_PER_EVENT_TARGET:.0} ns per event, every hook (per round)");
    let judged: Vec<(&str, f64, String, Judgement)> = programs
        .iter()
        .filter_map(|p| {
            let e = p.by_round.as_ref()?;
            Some((
                p.total.program.as_str(),
                e.median,
                e.text(0),
                judge(Some(e), Goal::AtMost(NS_PER_EVENT_TARGET), 0),
            ))
        })
        .collect();
    let idle: Vec<&str> = programs
        .iter()
        .filter(|p| p.by_round.is_none())
        .map(|p| p.total.program.as_str())
        .collect();
    let Some((worst, _, worst_text, _)) = judged.iter().max_by(|a, b| a.1.total_cmp(&b.1)) else {
        return Verdict {
            target,
            measured: "no program ran".into(),
            outcome: Outcome::Inconclusive,
            detail: "not measured: no program counted a run in the accounting runs".into(),
        };
    };
    let with = |o: Outcome| -> Vec<String> {
        judged
            .iter()
            .filter(|(_, _, _, j)| j.outcome == o)
            .map(|(p, _, text, _)| format!("{p} {text}"))
            .collect()
    };
    let (missed, unsure) = (with(Outcome::Missed), with(Outcome::Inconclusive));
    let outcome = if !missed.is_empty() {
        Outcome::Missed
    } else if unsure.is_empty() {
        Outcome::Met
    } else {
        Outcome::Inconclusive
    };
    let mut detail = match outcome {
        Outcome::Met => format!(
            "met: every hook's whole 95% interval is <= {NS_PER_EVENT_TARGET:.0} ns; worst \
             {worst} {worst_text} ns"
        ),
        Outcome::Missed => format!(
            "missed: {} of {} hooks over {NS_PER_EVENT_TARGET:.0} ns over their whole 95% \
             interval (median [interval], ns): {}",
            missed.len(),
            judged.len(),
            missed.join(", ")
        ),
        Outcome::Inconclusive => format!(
            "inconclusive: no hook's whole 95% interval is over {NS_PER_EVENT_TARGET:.0} ns, \
             but not every hook's is under it"
        ),
    };
    if !unsure.is_empty() {
        let first_why = judged
            .iter()
            .find(|(_, _, _, j)| j.outcome == Outcome::Inconclusive)
            .map_or("", |(_, _, _, j)| j.why.as_str());
        detail += &format!(
            "; no verdict for {} (median [interval], ns; the first: {first_why})",
            unsure.join(", ")
        );
    }
    if !idle.is_empty() {
        detail += &format!("; never ran: {}", idle.join(", "));
    }
    Verdict {
        target,
        measured: format!("worst {worst_text} ns ({worst})"),
        outcome,
        detail,
    }
}
