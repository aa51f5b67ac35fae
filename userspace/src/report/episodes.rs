//! Stall episodes: each is written at `open` and again when `closed` (sharing
//! its `id`). Pairing them tells a finished episode from one the recording
//! ended inside (an `open` with no `closed`: the run was killed, or the file
//! was cut), and from one whose opening is not in the file (a `closed` alone:
//! the file starts after it opened).

use std::collections::BTreeMap;

use serde_json::Value;

use super::time::parse_us;
use crate::records::sql::SqlTag;
use crate::records::stall::{Phase, StallRecord};

#[derive(Clone, Debug, PartialEq)]
pub struct Evidence {
    pub signal: String,
    /// The value as text (numbers as written, `half`, `true`).
    pub value: String,
    pub threshold: Option<f64>,
    pub unit: Option<String>,
    pub text: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EpisodeState {
    /// Opened and closed in this file.
    Closed,
    /// Opened, never closed: still open when the recording ended.
    StillOpen,
    /// Closed, its opening not in this file.
    ClosedOnly,
}

#[derive(Clone, Debug)]
pub struct Episode {
    pub id: u64,
    pub state: EpisodeState,
    pub kind: String,
    pub cause: String,
    pub start_us: i64,
    /// End of the episode; for one still open, the end of the recording (it
    /// lasted at least until then).
    pub end_us: i64,
    pub duration_ms: f64,
    pub impact_ms: f64,
    pub dev: Option<String>,
    pub role: Option<String>,
    pub iface: Option<String>,
    pub peer: Option<String>,
    pub flow: Option<String>,
    pub netns: Option<u64>,
    /// Requests: the SQL Server instance's worker.
    pub worker_pid: Option<u32>,
    pub evidence: Vec<Evidence>,
    pub next_step: String,
    pub sessions: Vec<SqlTag>,
    pub sessions_omitted: u64,
    pub files: Vec<String>,
}

impl Episode {
    /// Where it happened: `loop0 (log)`, `eth0 peer 10.0.0.9`, a flow.
    pub fn place(&self) -> String {
        let mut parts = Vec::new();
        if let Some(d) = &self.dev {
            parts.push(match &self.role {
                Some(r) => format!("disk {d} ({r})"),
                None => format!("disk {d}"),
            });
        }
        if let Some(i) = &self.iface {
            parts.push(format!("iface {i}"));
        }
        if let Some(p) = &self.peer {
            parts.push(format!("peer {p}"));
        }
        if let Some(f) = &self.flow {
            parts.push(format!("flow {f}"));
        }
        if let Some(pid) = self.worker_pid {
            parts.push(format!("SQL Server pid {pid}"));
        }
        parts.join(", ")
    }

    /// Sessions hit, counting those the record left out.
    pub fn sessions_hit(&self) -> u64 {
        self.sessions.len() as u64 + self.sessions_omitted
    }
}

/// The parts of one `stall` record the pairing needs.
struct Seen {
    record: StallRecord,
    start_us: i64,
}

#[derive(Default)]
pub struct Episodes {
    open: BTreeMap<u64, Seen>,
    closed: BTreeMap<u64, Seen>,
}

impl Episodes {
    /// A `stall` record. Returns false when it is not one the report can use
    /// (its start is not a time).
    pub fn add(&mut self, r: &StallRecord) -> bool {
        let Some(start_us) = parse_us(&r.start) else {
            return false;
        };
        let seen = Seen {
            record: r.clone(),
            start_us,
        };
        match r.phase {
            // A later record of the same phase replaces the earlier: it knows more.
            Phase::Open => self.open.insert(r.id, seen),
            Phase::Closed => self.closed.insert(r.id, seen),
        };
        true
    }

    /// Every episode, ranked by impact (then length, then id); `end_us` is the
    /// last time the recording covers.
    pub fn finish(self, end_us: i64) -> Vec<Episode> {
        let Self { mut open, closed } = self;
        let mut out: Vec<Episode> = closed
            .into_iter()
            .map(|(id, seen)| {
                let state = match open.remove(&id) {
                    Some(_) => EpisodeState::Closed,
                    None => EpisodeState::ClosedOnly,
                };
                episode(id, state, &seen, end_us)
            })
            .collect();
        out.extend(
            open.into_iter()
                .map(|(id, seen)| episode(id, EpisodeState::StillOpen, &seen, end_us)),
        );
        out.sort_by(|a, b| {
            b.impact_ms
                .total_cmp(&a.impact_ms)
                .then(b.duration_ms.total_cmp(&a.duration_ms))
                .then(a.id.cmp(&b.id))
        });
        out
    }
}

fn episode(id: u64, state: EpisodeState, seen: &Seen, recording_end_us: i64) -> Episode {
    let r = &seen.record;
    let recorded_ms = r.duration_ms;
    let (end_us, duration_ms) = match state {
        // Still open: it lasted at least until the recording's end.
        EpisodeState::StillOpen => {
            let end = recording_end_us.max(seen.start_us);
            (end, recorded_ms.max((end - seen.start_us) as f64 / 1000.0))
        }
        _ => {
            let end = r
                .end
                .as_deref()
                .and_then(parse_us)
                .unwrap_or(seen.start_us + (recorded_ms * 1000.0) as i64);
            (end, recorded_ms)
        }
    };
    let evidence = r
        .evidence
        .iter()
        .map(|e| Evidence {
            signal: e.signal.clone(),
            value: text_of(&e.value).unwrap_or_default(),
            threshold: e.threshold,
            unit: e.unit.clone(),
            text: e.text.clone(),
        })
        .collect();
    Episode {
        id,
        state,
        kind: r.kind.name().to_string(),
        cause: r.cause.name(),
        start_us: seen.start_us,
        end_us,
        duration_ms,
        impact_ms: r.impact_ms,
        dev: r.subject.dev.clone(),
        role: r.role.clone(),
        iface: r.subject.iface.clone(),
        peer: r.subject.peer.clone(),
        flow: r.subject.flow.clone(),
        netns: r.subject.netns,
        worker_pid: r.subject.worker_pid,
        evidence,
        next_step: r.next_step.clone(),
        sessions: r.sessions.clone(),
        sessions_omitted: r.sessions_omitted.map_or(0, u64::from),
        files: r.files.clone(),
    }
}

/// An evidence value (the record keeps it as JSON: a number, a word such as
/// `half`, or a flag), as text.
fn text_of(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

/// A cause as words: `retransmission_timeouts` -> `retransmission timeouts`.
pub fn cause_words(cause: &str) -> String {
    cause.replace('_', " ")
}
