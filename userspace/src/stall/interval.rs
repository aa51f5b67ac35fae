//! One interval's records, grouped by type, and what the detector remembers
//! about SQL Server between intervals.

use std::collections::BTreeMap;

use crate::records::AnyRecord;
use crate::records::block::{BlockRecord, SlowIoRecord};
use crate::records::netdev::NetdevRecord;
use crate::records::sql::{SessionEvent, SessionKind, SqlInstanceRecord, SqlSessionRecord, SqlTag};
use crate::records::sql_requests::SqlRequestsRecord;
use crate::records::stall::{Cause, Evidence, Kind, Subject};
use crate::records::tcp::{TcpFlowRecord, TcpRetransmitRecord, TcpRttRecord};

/// The records of one interval the rules read.
#[derive(Default)]
pub struct Interval {
    pub len_ms: f64,
    pub blocks: Vec<BlockRecord>,
    pub slow_ios: Vec<SlowIoRecord>,
    pub retransmits: Vec<TcpRetransmitRecord>,
    pub rtts: Vec<TcpRttRecord>,
    pub netdevs: Vec<NetdevRecord>,
    pub flows: Vec<TcpFlowRecord>,
    pub requests: Vec<SqlRequestsRecord>,
}

impl Interval {
    /// Sorts the records the rules read by type (`super::tapped` must name
    /// every type read here); SQL Server's go into `sql`, which outlives the
    /// interval.
    pub fn new(len_ms: f64, records: Vec<AnyRecord>, sql: &mut SqlState) -> Self {
        let mut iv = Self {
            len_ms,
            ..Default::default()
        };
        for r in records {
            match r {
                AnyRecord::Block(b) => iv.blocks.push(b),
                AnyRecord::SlowIo(s) => iv.slow_ios.push(s),
                AnyRecord::TcpRetransmit(t) => iv.retransmits.push(t),
                AnyRecord::TcpRtt(t) => iv.rtts.push(t),
                AnyRecord::Netdev(n) => iv.netdevs.push(n),
                AnyRecord::TcpFlow(f) => iv.flows.push(f),
                AnyRecord::SqlInstance(i) => sql.instance(i),
                AnyRecord::SqlSession(s) => sql.session(s),
                AnyRecord::SqlRequests(q) => iv.requests.push(q),
                // The run's own records, and a family's no rule reads.
                _ => {}
            }
        }
        iv
    }

    /// The `major:minor` of disk `dev`, from this interval's block records.
    pub fn disk_key(&self, dev: &str) -> Option<String> {
        self.blocks
            .iter()
            .find(|b| b.dev == dev)
            .map(|b| format!("{}:{}", b.major, b.minor))
    }
}

/// SQL Server as the stream described it so far: which disks each instance
/// keeps files on, and its open sessions.
#[derive(Default)]
pub struct SqlState {
    /// Worker pid -> `major:minor` -> role.
    disk_roles: BTreeMap<u32, BTreeMap<String, String>>,
    /// Socket inode -> the session's `sql` tag, as the other records carry it.
    sessions: BTreeMap<u64, SqlTag>,
}

impl SqlState {
    fn instance(&mut self, i: SqlInstanceRecord) {
        self.disk_roles.insert(i.pid, i.disk_roles);
    }

    fn session(&mut self, r: SqlSessionRecord) {
        let s = r.session;
        if r.event == SessionEvent::Closed {
            self.sessions.remove(&s.sock_ino);
        } else {
            // What the session record says of itself, not what the DMVs add.
            let tag = SqlTag {
                pid: s.pid,
                kind: Some(s.kind),
                spid: s.spid,
                spid_source: s.spid_source,
                client: Some(s.remote.to_string()),
                encrypted: s.encrypted,
                ..Default::default()
            };
            self.sessions.insert(s.sock_ino, tag);
        }
    }

    /// Whether the instance whose worker is `pid` keeps files on `disk` (`major:minor`).
    pub fn keeps_files_on(&self, pid: u32, disk: &str) -> bool {
        self.disk_roles
            .get(&pid)
            .is_some_and(|roles| roles.contains_key(disk))
    }

    /// The open session of the instance whose worker is `pid` with SPID `spid`.
    pub fn session_with_spid(&self, pid: u32, spid: u16) -> Option<&SqlTag> {
        self.sessions
            .values()
            .find(|tag| tag.pid == pid && tag.spid == Some(spid))
    }

    /// Client sessions open on the instances that keep files on `disk`.
    pub fn sessions_on_disk(&self, disk: &str) -> Vec<SqlTag> {
        let pids: Vec<u32> = self
            .disk_roles
            .iter()
            .filter(|(_, roles)| roles.contains_key(disk))
            .map(|(pid, _)| *pid)
            .collect();
        self.sessions
            .values()
            .filter(|tag| pids.contains(&tag.pid) && tag.kind == Some(SessionKind::Client))
            .cloned()
            .collect()
    }
}

/// A finding's impact, as time: the interval's length times the share
/// (0..=1) of the subject's work the cause held back in it. An episode sums
/// them over its intervals, so its impact reads as the time the subject was as
/// good as stopped, never more than the episode lasted, and episodes of
/// different kinds rank on one scale (docs/records.md, `impact_ms`).
pub fn held_back_ms(len_ms: f64, share: f64) -> f64 {
    if share.is_finite() {
        len_ms * share.clamp(0.0, 1.0)
    } else {
        0.0
    }
}

/// What one rule concluded about one subject in one interval.
#[derive(Clone, Debug)]
pub struct Finding {
    pub kind: Kind,
    pub subject: Subject,
    pub cause: Cause,
    pub role: Option<String>,
    pub impact_ms: f64,
    pub evidence: Vec<Evidence>,
    pub next_step: String,
    pub sessions: Vec<SqlTag>,
    pub files: Vec<String>,
    /// Counts the episode sums over its intervals (evidence shows each
    /// signal's worst interval; an SRE also wants the episode's whole toll).
    pub tally: Tally,
}

impl Finding {
    /// A finding with no role, sessions, files or tally: the rules add those
    /// they know with the `with_` methods.
    pub fn new(
        kind: Kind,
        subject: Subject,
        cause: Cause,
        impact_ms: f64,
        evidence: Vec<Evidence>,
        next_step: String,
    ) -> Self {
        Self {
            kind,
            subject,
            cause,
            role: None,
            impact_ms,
            evidence,
            next_step,
            sessions: Vec::new(),
            files: Vec::new(),
            tally: Tally::default(),
        }
    }

    /// The role of the disk it is about (`data`, `log`, ...).
    pub fn with_role(self, role: Option<String>) -> Self {
        Self { role, ..self }
    }

    /// The SQL Server sessions it hit.
    pub fn with_sessions(self, sessions: Vec<SqlTag>) -> Self {
        Self { sessions, ..self }
    }

    /// The files of the slow I/Os it saw.
    pub fn with_files(self, files: Vec<String>) -> Self {
        Self { files, ..self }
    }

    /// What it adds to its episode's totals.
    pub fn with_tally(self, tally: Tally) -> Self {
        Self { tally, ..self }
    }

    /// Its strongest evidence, in words: what another finding quotes of it.
    pub fn headline(&self) -> &str {
        self.evidence.first().map_or("", |e| e.text.as_str())
    }
}

/// What a finding adds to its episode's totals.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Tally {
    /// Retransmission timer expiries.
    pub rtos: u64,
    /// Time those timeouts made the connections wait.
    pub rto_wait_ms: f64,
    /// Tail-loss probes sent after the stall threshold, and their waits.
    pub late_probes: u64,
    pub probe_wait_ms: f64,
    pub retransmitted_segs: u64,
}
