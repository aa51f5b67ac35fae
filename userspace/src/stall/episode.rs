//! Episodes: a subject's findings over consecutive intervals, opened at the
//! first, closed once the subject has been quiet for the recovery time.

use serde_json::Value;

use super::interval::{Finding, Tally};
use super::network::same_session;
use crate::records::sql::SqlTag;
use crate::records::stall::{Cause, Evidence, Kind, MAX_SESSIONS, Phase, StallRecord, Subject};

pub struct Episode {
    pub id: u64,
    pub kind: Kind,
    pub subject: Subject,
    start: String,
    start_ms: f64,
    /// End of the last interval with a finding.
    end: String,
    end_ms: f64,
    /// Quiet time since then.
    pub quiet_ms: f64,
    intervals: u32,
    cause: Cause,
    impact_ms: f64,
    role: Option<String>,
    evidence: Vec<Evidence>,
    next_step: String,
    sessions: Vec<SqlTag>,
    sessions_omitted: u32,
    files: Vec<String>,
    /// Summed over every interval with a finding, whatever its cause.
    tally: Tally,
}

impl Episode {
    /// `start_ms`/`end_ms`: the interval's bounds on the run's clock, for durations.
    pub fn open(id: u64, f: Finding, start: &str, start_ms: f64, end: &str, end_ms: f64) -> Self {
        let mut e = Self {
            id,
            kind: f.kind,
            subject: f.subject.clone(),
            start: start.to_string(),
            start_ms,
            end: end.to_string(),
            end_ms,
            quiet_ms: 0.0,
            intervals: 0,
            cause: f.cause,
            impact_ms: 0.0,
            role: None,
            evidence: Vec::new(),
            next_step: String::new(),
            sessions: Vec::new(),
            sessions_omitted: 0,
            files: Vec::new(),
            tally: Tally::default(),
        };
        e.add(f, end, end_ms);
        e
    }

    /// Another interval with a finding. The record shows the evidence of the
    /// strongest cause seen, each signal from its worst interval.
    pub fn add(&mut self, f: Finding, end: &str, end_ms: f64) {
        self.end = end.to_string();
        self.end_ms = end_ms;
        self.quiet_ms = 0.0;
        self.intervals += 1;
        self.impact_ms += f.impact_ms;
        self.tally.rtos += f.tally.rtos;
        self.tally.rto_wait_ms += f.tally.rto_wait_ms;
        self.tally.late_probes += f.tally.late_probes;
        self.tally.probe_wait_ms += f.tally.probe_wait_ms;
        self.tally.retransmitted_segs += f.tally.retransmitted_segs;
        if f.role.is_some() {
            self.role = f.role;
        }
        if f.cause > self.cause || self.evidence.is_empty() {
            self.cause = f.cause;
            self.evidence = f.evidence;
            self.next_step = f.next_step;
        } else if f.cause == self.cause {
            // Same cause: each signal shows its worst interval.
            for new in f.evidence {
                match self.evidence.iter_mut().find(|e| e.signal == new.signal) {
                    Some(old) if larger(&new.value, &old.value) => *old = new,
                    Some(_) => {}
                    None => self.evidence.push(new),
                }
            }
        }
        for s in f.sessions {
            if self.sessions.iter().any(|k| same_session(k, &s)) {
                continue;
            }
            if self.sessions.len() < MAX_SESSIONS {
                self.sessions.push(s);
            } else {
                self.sessions_omitted += 1;
            }
        }
        for file in f.files {
            if !self.files.contains(&file) {
                self.files.push(file);
            }
        }
    }

    pub fn record(&self, phase: Phase) -> StallRecord {
        let mut evidence = self.evidence.clone();
        // The whole episode's toll, beside each signal's worst interval.
        if self.intervals > 1 && self.tally.rtos > 0 {
            evidence.push(
                Evidence::new(
                    "rto_wait_ms_total",
                    (self.tally.rto_wait_ms * 1000.0).round() / 1000.0,
                    format!(
                        "in the whole episode: {} retransmission timeout(s) made connections wait \
                         {:.0} ms in all",
                        self.tally.rtos, self.tally.rto_wait_ms
                    ),
                )
                .unit("ms"),
            );
        }
        if self.intervals > 1 && self.tally.late_probes > 0 {
            evidence.push(
                Evidence::new(
                    "probe_wait_ms_total",
                    (self.tally.probe_wait_ms * 1000.0).round() / 1000.0,
                    format!(
                        "in the whole episode: {} late tail-loss probe(s) made connections wait \
                         {:.0} ms in all",
                        self.tally.late_probes, self.tally.probe_wait_ms
                    ),
                )
                .unit("ms"),
            );
        }
        if self.intervals > 1 && self.tally.retransmitted_segs > 0 {
            evidence.push(
                Evidence::new(
                    "retransmitted_segs_total",
                    self.tally.retransmitted_segs,
                    format!(
                        "in the whole episode: {} segments retransmitted",
                        self.tally.retransmitted_segs
                    ),
                )
                .unit("count"),
            );
        }
        if self.intervals > 1 {
            evidence.push(Evidence::new(
                "intervals",
                self.intervals,
                format!("over the threshold in {} intervals", self.intervals),
            ));
        }
        StallRecord {
            id: self.id,
            phase,
            start: self.start.clone(),
            end: (phase == Phase::Closed).then(|| self.end.clone()),
            duration_ms: ((self.end_ms - self.start_ms).max(0.0) * 1000.0).round() / 1000.0,
            kind: self.kind,
            cause: self.cause,
            subject: self.subject.clone(),
            role: self.role.clone(),
            impact_ms: (self.impact_ms * 1000.0).round() / 1000.0,
            evidence,
            next_step: self.next_step.clone(),
            sessions: self.sessions.clone(),
            sessions_omitted: (self.sessions_omitted > 0).then_some(self.sessions_omitted),
            files: self.files.clone(),
        }
    }
}

fn larger(a: &Value, b: &Value) -> bool {
    match (a.as_f64(), b.as_f64()) {
        (Some(a), Some(b)) => a > b,
        _ => false,
    }
}
