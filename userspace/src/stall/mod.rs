//! Stall detection: the daemon's records of each interval become episodes
//! (`stall` records) with a likely cause, the evidence for it, what to check
//! next, and the SQL Server sessions it hit.
//!
//! The detector reads the records the writer made, typed, in the stream's
//! order, so what it concludes can be checked against the stream itself: a
//! recording read back from its lines makes the same episodes
//! (replay_tests.rs). Rules, one module
//! per path: network.rs (per peer: retransmission timeouts, loss, the
//! duplex-mismatch signature; per interface: a stuck transmit queue, PAUSE
//! frames, a shaping qdisc), storage.rs (per disk: the queue in front of the
//! device is full, or the device is slow), flows.rs (a bulk flow held back by
//! its receiver, the network, or a sender waiting on a slow disk),
//! requests.rs (a SQL Server instance's requests slow, and whether the time
//! went to the network's delivery, its disks, or the server itself).

mod episode;
#[cfg(test)]
pub(crate) mod fixtures;
mod flows;
mod interval;
mod network;
#[cfg(test)]
mod replay_tests;
mod requests;
mod storage;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;

use crate::output::Tapped;
use crate::records::AnyRecord;
pub use crate::records::stall::{DEFAULT_RECOVER, Thresholds};
use crate::records::stall::{Kind, Phase, StallRecord, Subject};
use episode::Episode;
use interval::{Interval, SqlState};

/// Which records the detector reads, and which of them come one per kernel
/// event (capped per interval by the writer's tap) rather than one per
/// subject per interval. Must list every type `Interval::new` reads.
pub fn tapped(kind: &str) -> Tapped {
    match kind {
        "slow_io" | "tcp_retransmit" => Tapped::Event,
        "block" | "tcp_rtt" | "netdev" | "tcp_flow" | "sql_instance" | "sql_session"
        | "sql_requests" => Tapped::Aggregate,
        _ => Tapped::No,
    }
}

pub struct Detector {
    th: Thresholds,
    sql: SqlState,
    open: BTreeMap<(Kind, Subject), Episode>,
    next_id: u64,
    /// The run's clock: milliseconds of intervals seen so far.
    clock_ms: f64,
    /// End of the last interval (the next one's start).
    last_end: String,
}

impl Detector {
    /// `started`: when the run began (the first interval's start).
    pub fn new(th: Thresholds, started: &str) -> Self {
        Self {
            th,
            sql: SqlState::default(),
            open: BTreeMap::new(),
            next_id: 1,
            clock_ms: 0.0,
            last_end: started.to_string(),
        }
    }

    /// One interval's records (everything written in it), ending at `end`
    /// after `len_ms`. Returns the `stall` records to write: episodes that
    /// opened, and episodes that closed.
    pub fn interval(
        &mut self,
        records: Vec<AnyRecord>,
        end: &str,
        len_ms: f64,
    ) -> Vec<StallRecord> {
        let start = std::mem::replace(&mut self.last_end, end.to_string());
        let start_ms = self.clock_ms;
        self.clock_ms += len_ms;
        let end_ms = self.clock_ms;
        let iv = Interval::new(len_ms, records, &mut self.sql);

        let mut findings = network::peers(&iv, &self.th);
        findings.extend(network::interfaces(&iv, &self.th));
        findings.extend(storage::disks(&iv, &self.sql, &self.th));
        let bulk = flows::bulk(&iv, &self.sql, &findings, &self.th);
        findings.extend(bulk);
        let slow_requests = requests::slow(&iv, &self.sql, &findings);
        findings.extend(slow_requests);

        let mut out = Vec::new();
        let mut seen = Vec::new();
        for f in findings {
            let key = (f.kind, f.subject.clone());
            seen.push(key.clone());
            match self.open.get_mut(&key) {
                Some(e) => e.add(f, end, end_ms),
                None => {
                    let e = Episode::open(self.next_id, f, &start, start_ms, end, end_ms);
                    self.next_id += 1;
                    out.push(e.record(Phase::Open));
                    self.open.insert(key, e);
                }
            }
        }
        let recover_ms = self.th.recover_ms;
        let mut closed = Vec::new();
        for (key, e) in &mut self.open {
            if !seen.contains(key) {
                e.quiet_ms += len_ms;
                if e.quiet_ms >= recover_ms {
                    closed.push(key.clone());
                }
            }
        }
        for key in closed {
            if let Some(e) = self.open.remove(&key) {
                out.push(e.record(Phase::Closed));
            }
        }
        out
    }

    /// The run ended: close every open episode.
    pub fn finish(&mut self) -> Vec<StallRecord> {
        let mut open: Vec<Episode> = std::mem::take(&mut self.open).into_values().collect();
        open.sort_by_key(|e| e.id);
        open.iter().map(|e| e.record(Phase::Closed)).collect()
    }
}
