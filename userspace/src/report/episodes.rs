//! Stall episodes: each is written at `open` and again when `closed` (sharing
//! its `id`). Pairing them tells a finished episode from one the recording
//! ended inside (an `open` with no `closed`: the run was killed, or the file
//! was cut), and from one whose opening is not in the file (a `closed` alone:
//! the file starts after it opened).

use std::collections::BTreeMap;

use serde_json::Value;

use super::fields::{f64_of, str_of, text_of, u64_of};
use super::sessions::SqlTag;
use super::time::parse_us;

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
        parts.join(", ")
    }

    /// Sessions hit, counting those the record left out.
    pub fn sessions_hit(&self) -> u64 {
        self.sessions.len() as u64 + self.sessions_omitted
    }
}

/// The parts of one `stall` record the pairing needs.
struct Seen {
    record: Value,
    start_us: i64,
}

#[derive(Default)]
pub struct Episodes {
    open: BTreeMap<u64, Seen>,
    closed: BTreeMap<u64, Seen>,
}

impl Episodes {
    /// A `stall` record. Returns false when it is not one the report can use
    /// (no id, phase or start).
    pub fn add(&mut self, r: &Value) -> bool {
        let (Some(id), Some(phase), Some(start_us)) = (
            u64_of(r, "id"),
            str_of(r, "phase"),
            str_of(r, "start").as_deref().and_then(parse_us),
        ) else {
            return false;
        };
        let seen = Seen {
            record: r.clone(),
            start_us,
        };
        match phase.as_str() {
            // A later record of the same phase replaces the earlier: it knows more.
            "open" => self.open.insert(id, seen),
            "closed" => self.closed.insert(id, seen),
            _ => return false,
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
    let recorded_ms = f64_of(r, "duration_ms").unwrap_or(0.0);
    let (end_us, duration_ms) = match state {
        // Still open: it lasted at least until the recording's end.
        EpisodeState::StillOpen => {
            let end = recording_end_us.max(seen.start_us);
            (end, recorded_ms.max((end - seen.start_us) as f64 / 1000.0))
        }
        _ => {
            let end = str_of(r, "end")
                .as_deref()
                .and_then(parse_us)
                .unwrap_or(seen.start_us + (recorded_ms * 1000.0) as i64);
            (end, recorded_ms)
        }
    };
    let evidence = r
        .get("evidence")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|e| {
                    Some(Evidence {
                        signal: str_of(e, "signal")?,
                        value: e.get("value").and_then(text_of).unwrap_or_default(),
                        threshold: f64_of(e, "threshold"),
                        unit: str_of(e, "unit"),
                        text: str_of(e, "text").unwrap_or_default(),
                    })
                })
                .collect()
        })
        .unwrap_or_default();
    let strings = |key: &str| -> Vec<String> {
        r.get(key)
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|s| s.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default()
    };
    Episode {
        id,
        state,
        kind: str_of(r, "kind").unwrap_or_else(|| "unknown".into()),
        cause: str_of(r, "cause").unwrap_or_else(|| "unknown".into()),
        start_us: seen.start_us,
        end_us,
        duration_ms,
        impact_ms: f64_of(r, "impact_ms").unwrap_or(0.0),
        dev: str_of(r, "dev"),
        role: str_of(r, "role"),
        iface: str_of(r, "iface"),
        peer: str_of(r, "peer"),
        flow: str_of(r, "flow"),
        netns: u64_of(r, "netns"),
        evidence,
        next_step: str_of(r, "next_step").unwrap_or_default(),
        sessions: r
            .get("sessions")
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(SqlTag::from_value).collect())
            .unwrap_or_default(),
        sessions_omitted: u64_of(r, "sessions_omitted").unwrap_or(0),
        files: strings("files"),
    }
}

/// A cause as words: `retransmission_timeouts` -> `retransmission timeouts`.
pub fn cause_words(cause: &str) -> String {
    cause.replace('_', " ")
}
