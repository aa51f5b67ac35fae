//! One interval's records, grouped by type, and what the detector remembers
//! about SQL Server between intervals.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use super::record::{Cause, Evidence, Kind, Subject};
use super::views::{Block, Flow, Netdev, Retransmit, Rtt, SlowIo, SqlInstance, SqlSession};

/// The records of one interval the rules read.
#[derive(Default)]
pub struct Interval {
    pub len_ms: f64,
    pub blocks: Vec<Block>,
    pub slow_ios: Vec<SlowIo>,
    pub retransmits: Vec<Retransmit>,
    pub rtts: Vec<Rtt>,
    pub netdevs: Vec<Netdev>,
    pub flows: Vec<Flow>,
    /// Records of a type the rules read that did not have the expected shape.
    pub unreadable: u64,
    /// Why, for the first of each type.
    pub why_unreadable: Vec<(String, String)>,
}

impl Interval {
    pub fn new(len_ms: f64, records: &[Value], sql: &mut SqlState) -> Self {
        let mut iv = Self {
            len_ms,
            ..Default::default()
        };
        for r in records {
            let kind = r["type"].as_str().unwrap_or_default();
            let read = match kind {
                "block" => push(&mut iv.blocks, r),
                "slow_io" => push(&mut iv.slow_ios, r),
                "tcp_retransmit" => push(&mut iv.retransmits, r),
                "tcp_rtt" => push(&mut iv.rtts, r),
                "netdev" => push(&mut iv.netdevs, r),
                "tcp_flow" => push(&mut iv.flows, r),
                "sql_instance" => sql.instance(r),
                "sql_session" => sql.session(r),
                _ => Ok(()),
            };
            if let Err(e) = read {
                iv.unreadable += 1;
                if !iv.why_unreadable.iter().any(|(k, _)| k == kind) {
                    iv.why_unreadable.push((kind.to_string(), e.to_string()));
                }
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

fn push<T: DeserializeOwned>(into: &mut Vec<T>, r: &Value) -> Result<(), serde_json::Error> {
    into.push(T::deserialize(r)?);
    Ok(())
}

/// SQL Server as the stream described it so far: which disks each instance
/// keeps files on, and its open sessions.
#[derive(Default)]
pub struct SqlState {
    /// Worker pid -> `major:minor` -> role.
    disk_roles: BTreeMap<u64, BTreeMap<String, String>>,
    /// Socket inode -> the session's `sql` tag, as the other records carry it.
    sessions: BTreeMap<u64, (u64, Value)>,
}

impl SqlState {
    fn instance(&mut self, r: &Value) -> Result<(), serde_json::Error> {
        let i = SqlInstance::deserialize(r)?;
        self.disk_roles.insert(i.pid, i.disk_roles);
        Ok(())
    }

    fn session(&mut self, r: &Value) -> Result<(), serde_json::Error> {
        let s = SqlSession::deserialize(r)?;
        if s.event == "closed" {
            self.sessions.remove(&s.sock_ino);
        } else {
            let mut tag = json!({"pid": s.pid, "kind": s.kind, "client": s.remote});
            if let Some(spid) = s.spid {
                tag["spid"] = spid.into();
            }
            if s.encrypted {
                tag["encrypted"] = true.into();
            }
            self.sessions.insert(s.sock_ino, (s.pid, tag));
        }
        Ok(())
    }

    /// Whether the instance whose worker is `pid` keeps files on `disk` (`major:minor`).
    pub fn keeps_files_on(&self, pid: u64, disk: &str) -> bool {
        self.disk_roles
            .get(&pid)
            .is_some_and(|roles| roles.contains_key(disk))
    }

    /// Client sessions open on the instances that keep files on `disk`.
    pub fn sessions_on_disk(&self, disk: &str) -> Vec<Value> {
        let pids: Vec<u64> = self
            .disk_roles
            .iter()
            .filter(|(_, roles)| roles.contains_key(disk))
            .map(|(pid, _)| *pid)
            .collect();
        self.sessions
            .values()
            .filter(|(pid, tag)| pids.contains(pid) && tag["kind"] == "client")
            .map(|(_, tag)| tag.clone())
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
    pub sessions: Vec<Value>,
    pub files: Vec<String>,
    /// Counts the episode sums over its intervals (evidence shows each
    /// signal's worst interval; an SRE also wants the episode's whole toll).
    pub tally: Tally,
}

/// What a finding adds to its episode's totals.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Tally {
    /// Retransmission timer expiries.
    pub rtos: u64,
    /// Time those timeouts made the connections wait.
    pub rto_wait_ms: f64,
    pub retransmitted_segs: u64,
}
