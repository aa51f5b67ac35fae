//! Stall episodes, ranked by impact, and what a recording without any says
//! instead.

use super::{clean, count, or_dash};
use crate::records::sql::SqlTag;
use crate::report::episodes::{Episode, EpisodeState, cause_words};
use crate::report::model::Report;
use crate::report::network::Interface;
use crate::report::sessions::SessionTag;
use crate::report::storage::DiskOp;
use crate::report::time::{clock, duration_ms, latency_us, rfc3339};

/// Said when the recording holds no episode.
pub const NO_STALLS: &str = "No stalls: no stall episode in this recording.";
/// What an episode's impact is, said wherever episodes are ranked by it: it
/// is not the episode's length (a 3 s episode may have cost 2 ms).
pub const IMPACT_MEANS: &str = "impact: the time lost, summed over what the episode hit (retransmission timeouts waited, I/O time above the device's usual), not its length";

/// When an episode was, and whether the recording saw all of it.
#[derive(Clone, Debug, PartialEq)]
pub struct When {
    pub start: String,
    pub end: String,
    /// `3 s`; for one still open, how long until the recording ended.
    pub length: String,
    pub state: EpisodeState,
}

impl When {
    /// What the recording did not see of it.
    pub fn note(&self) -> Option<&'static str> {
        match self.state {
            EpisodeState::Closed => None,
            EpisodeState::StillOpen => Some("STILL OPEN when the recording ended"),
            EpisodeState::ClosedOnly => Some("its opening is not in this file"),
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct EvidenceView {
    /// The detector's sentence, or `signal = value` when it wrote none.
    pub text: String,
    /// `signal = value unit (threshold t)`: the measurement behind the sentence.
    pub detail: String,
}

#[derive(Clone, Debug, PartialEq)]
pub struct EpisodeView {
    /// 1 = most impact.
    pub rank: usize,
    pub id: u64,
    /// The kind as the stream names it (`bulk_flow`): a key for styles.
    pub kind: String,
    /// `network`, `bulk flow`.
    pub kind_words: String,
    /// `retransmission timeouts`.
    pub cause_words: String,
    pub impact: String,
    pub when: When,
    pub start_us: i64,
    pub end_us: i64,
    /// RFC 3339, for machine-readable attributes.
    pub start_iso: String,
    pub end_iso: String,
    /// `disk loop0 (log), peer 10.0.0.9`; empty when the record names no place.
    pub place: String,
    /// The disk and interface it is about, as the storage and network views name them.
    pub dev: Option<String>,
    pub iface: Option<String>,
    /// The SQL Server instance whose requests it is about, by its worker's pid.
    pub worker_pid: Option<u32>,
    pub evidence: Vec<EvidenceView>,
    pub next_step: String,
    /// Sessions hit, counting those the record left out.
    pub sessions_hit: u64,
    /// Each session named, then `and N more` for those left out.
    pub sessions: Vec<String>,
    pub files: Vec<String>,
}

pub fn of(report: &Report) -> Vec<EpisodeView> {
    report
        .episodes
        .iter()
        .enumerate()
        .map(|(i, e)| episode(i + 1, e))
        .collect()
}

fn episode(rank: usize, e: &Episode) -> EpisodeView {
    let mut sessions: Vec<String> = e.sessions.iter().map(session_name).collect();
    if e.sessions_omitted > 0 {
        sessions.push(format!("and {} more", e.sessions_omitted));
    }
    EpisodeView {
        rank,
        id: e.id,
        kind: clean(&e.kind),
        kind_words: clean(&cause_words(&e.kind)),
        cause_words: clean(&cause_words(&e.cause)),
        impact: duration_ms(e.impact_ms),
        when: When {
            start: clock(e.start_us),
            end: clock(e.end_us),
            length: duration_ms(e.duration_ms),
            state: e.state,
        },
        start_us: e.start_us,
        end_us: e.end_us,
        start_iso: rfc3339(e.start_us),
        end_iso: rfc3339(e.end_us),
        place: clean(&e.place()),
        dev: e.dev.as_deref().map(clean),
        iface: e.iface.as_deref().map(clean),
        worker_pid: e.worker_pid,
        evidence: e
            .evidence
            .iter()
            .map(|ev| {
                let measured = format!("{} = {}", ev.signal, ev.value);
                EvidenceView {
                    text: clean(if ev.text.is_empty() {
                        &measured
                    } else {
                        &ev.text
                    }),
                    detail: clean(&format!(
                        "{measured}{}{}",
                        ev.unit
                            .as_ref()
                            .map(|u| format!(" {u}"))
                            .unwrap_or_default(),
                        ev.threshold
                            .map(|t| format!(" (threshold {t})"))
                            .unwrap_or_default()
                    )),
                }
            })
            .collect(),
        next_step: clean(&e.next_step),
        sessions_hit: e.sessions_hit(),
        sessions,
        files: e.files.iter().map(|f| clean(f)).collect(),
    }
}

/// `SPID 51 from 10.0.0.9:50000 (login app, program OrderSvc)`
pub fn session_name(t: &SqlTag) -> String {
    let mut s = t.spid_label();
    if let Some(c) = &t.client {
        s.push_str(&format!(" from {}", clean(c)));
    }
    if let Some(who) = t.who() {
        s.push_str(&format!(" ({})", clean(&who)));
    }
    s
}

/// The clean case still says where things stood: the worst tail per path.
pub fn glance(report: &Report) -> Vec<String> {
    let mut lines = Vec::new();
    let p99 = |h: &crate::report::MergedHist| h.percentile(0.99);
    if let Some((d, op)) = report
        .disks
        .iter()
        .flat_map(|d| d.ops.iter().map(move |op| (d, op)))
        .filter(|(_, op)| op.latency.count() > 0)
        .max_by(|a, b| {
            let p = |x: &DiskOp| p99(&x.latency).unwrap_or(0.0);
            p(a.1).total_cmp(&p(b.1))
        })
    {
        lines.push(format!(
            "slowest storage tail: {} {} p99 {}",
            clean(&d.dev),
            clean(&op.op),
            or_dash(p99(&op.latency), latency_us)
        ));
    }
    if let Some(i) = report
        .interfaces
        .iter()
        .filter(|i| i.qdisc.count() > 0)
        .max_by(|a, b| {
            let p = |x: &Interface| p99(&x.qdisc).unwrap_or(0.0);
            p(a).total_cmp(&p(b))
        })
    {
        lines.push(format!(
            "longest transmit queue wait: {} p99 {}",
            clean(&i.iface),
            or_dash(p99(&i.qdisc), latency_us)
        ));
    }
    let rt = &report.retransmits;
    lines.push(format!(
        "TCP: {}, {} waited out",
        count(rt.events, "retransmission", "retransmissions"),
        count(
            rt.timeouts,
            "retransmission timeout",
            "retransmission timeouts"
        )
    ));
    lines
}
