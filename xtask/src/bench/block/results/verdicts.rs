//! The block suite's targets, each judged on the 95% interval of its
//! per-round figure (see `stats::judge`): met or missed only when the whole
//! interval is on one side of the target.

use super::{DepthResult, ProgramResult};
use crate::bench::block::{
    Backing, CHEAPEST_PEER_FACTOR_TARGET, NS_PER_EVENT_TARGET, NS_PER_IO_TARGET, Part,
    WORK_OVER_FLOOR_TARGET,
};
use crate::bench::peers;
use crate::bench::publish::Verdict;
use crate::bench::stats::Estimate;
use crate::bench::stats::{Goal, Judgement, Outcome, judge};

/// traced / untraced IOPS of the same round, on `d`'s device at its depth,
/// at least `target`.
pub fn iops(d: &DepthResult, target: f64) -> Verdict {
    let e = d.traced_ratio.get("iops");
    let j = judge(e, Goal::AtLeast(target), 3);
    let allowed_pct = (1.0 - target) * 100.0;
    let detail = match e {
        Some(e) => {
            let moved = if e.median <= 1.0 { "lost" } else { "gained" };
            j.ratio_detail(e, moved, " of IOPS", allowed_pct)
        }
        None => format!("{}: {}", j.outcome.word(), j.why),
    };
    Verdict {
        target: format!(
            "traced (no accounting) / untraced IOPS of the same round at {} >= {target}",
            d.label
        ),
        measured: e.map_or("–".into(), |e| e.text(3)),
        outcome: j.outcome,
        detail,
    }
}

/// The IOPS target of a part that did not run (no verdict).
pub fn not_measured(backing: Backing, iodepth: u32) -> Verdict {
    let label = Part { backing, iodepth }.label();
    Verdict {
        target: format!("traced (no accounting) / untraced IOPS of the same round at {label}"),
        measured: "–".into(),
        outcome: Outcome::Inconclusive,
        detail: format!("not measured: {label} did not run"),
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

/// stalltrace's BPF run time per I/O over the floor's of the same round, at
/// `d`'s depth: the work its programs do beyond what empty ones on the same
/// hooks cost.
pub fn work_over_floor(d: &DepthResult) -> Verdict {
    let e = d.work_over_floor_ns_per_io.as_ref();
    let j = judge(e, Goal::AtMost(WORK_OVER_FLOOR_TARGET), 0);
    let text = |e: Option<&Estimate>| e.map_or("–".into(), |e| format!("{} ns", e.text(0)));
    let detail = match (e, d.floor_ns_per_io.as_ref()) {
        (Some(_), Some(f)) => format!(
            "{}: {}; per I/O, median [95% interval] of rounds: stalltrace {}, the floor {} \
             (empty programs on the same hooks, the same round), stalltrace's work over it {}",
            j.outcome.word(),
            j.why,
            text(d.versus_peer.stalltrace_by_round.as_ref()),
            text(Some(f)),
            text(e),
        ),
        _ => format!("{}: {}", j.outcome.word(), j.why),
    };
    Verdict {
        target: format!(
            "{}: stalltrace's BPF time per I/O over the floor (empty programs on the same \
             hooks, the same round) <= {WORK_OVER_FLOOR_TARGET:.0} ns (per round)",
            d.label
        ),
        measured: text(e),
        outcome: j.outcome,
        detail,
    }
}

/// stalltrace's BPF run time per I/O against the cheaper peer's of each
/// round (issue 30: no more than the cheapest peer's, while timing three
/// phases to their one), at `d`'s depth.
pub fn versus_cheapest(d: &DepthResult) -> Verdict {
    let c = &d.versus_cheapest_peer;
    let mut v = peers::factor_verdict(&c.comparison, &d.label, CHEAPEST_PEER_FACTOR_TARGET);
    let by = |e: Option<&Estimate>| e.map_or("–".into(), |e| format!("{} ns", e.text(0)));
    v.detail += &format!(
        "; \"peer\" is each round's cheaper peer per I/O: bpftrace in {} rounds ({} per I/O), \
         rezolus in {} ({})",
        c.bpftrace_rounds,
        by(d.versus_peer.peer_by_round.as_ref()),
        c.rezolus_rounds,
        d.rezolus
            .as_ref()
            .map_or("not installed".into(), |r| format!(
                "{} per I/O",
                by(r.ns_per_io.as_ref())
            )),
    );
    v
}

/// Every hook's ns/event, round by round: missed when any hook's whole
/// interval is over the target, met when every hook's is under it. A program
/// the daemon runs itself (`run_*`, once an interval, never attached) is no
/// hook: its time is in the per-I/O totals, not judged per event here.
pub fn ns_per_event(programs: &[ProgramResult]) -> Verdict {
    let target = format!("<= {NS_PER_EVENT_TARGET:.0} ns per event, every hook (per round)");
    let programs: Vec<&ProgramResult> = programs
        .iter()
        .filter(|p| !p.total.program.starts_with("run_"))
        .collect();
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
