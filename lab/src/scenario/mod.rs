//! The field cases as lab scenarios. Each one builds its situation on the
//! shared kernel, runs `stalltrace run` on it (with filters where useful),
//! tears everything down, and returns an `Outcome`: the stream stalltrace
//! wrote, and what the scenario itself knows (its devices, namespaces, peers,
//! the simulator's sessions, the load generators' own figures), so a test or
//! `cargo xtask lab` can judge what stalltrace concluded.
//!
//! Every scenario has the fault (`Fault::Injected`) and a clean variant
//! (`Fault::Clean`): the same load without the fault, which must give no
//! `stall` record about the scenario's subjects.

pub mod backup;
mod evidence;
pub mod loss;
pub mod queue_depth;
mod requests;
pub mod rtt;
pub mod slow_log;
pub mod throttle;

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde_json::Value;

use crate::Bins;
use crate::net::{NetPair, Side};
use crate::sql::ClientReport;
use crate::tracer::parse_lines;

/// With the fault, or the same load without it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    Injected,
    Clean,
}

/// A scenario `cargo xtask lab` can run by name.
pub struct Scenario {
    pub name: &'static str,
    /// One line: the situation and the fault.
    pub about: &'static str,
    pub run: fn(&Bins, Fault) -> Outcome,
}

/// Every scenario, in the order `cargo xtask lab` lists them.
pub const ALL: &[Scenario] = &[
    Scenario {
        name: "loss",
        about: loss::ABOUT,
        run: loss::run,
    },
    Scenario {
        name: "queue-depth",
        about: queue_depth::ABOUT,
        run: queue_depth::run,
    },
    Scenario {
        name: "throttle",
        about: throttle::ABOUT,
        run: throttle::run,
    },
    Scenario {
        name: "rtt",
        about: rtt::ABOUT,
        run: rtt::run,
    },
    Scenario {
        name: "backup",
        about: backup::ABOUT,
        run: backup::run,
    },
    Scenario {
        name: "slow-log",
        about: slow_log::ABOUT,
        run: slow_log::run,
    },
];

pub fn find(name: &str) -> Option<&'static Scenario> {
    ALL.iter().find(|s| s.name == name)
}

/// An episode a scenario expects with its fault: `kind` and `cause` on the
/// subject whose `field` (`dev`, `iface`, `peer`, `flow`, `worker_pid`) is `value`, in
/// network namespace `netns` when given. A `flow` value matches the end of the
/// record's `flow` (`-> daddr:dport`: the sender's port is the kernel's).
#[derive(Clone, Debug)]
pub struct Expected {
    pub kind: &'static str,
    pub cause: &'static str,
    pub field: &'static str,
    pub value: String,
    pub netns: Option<u64>,
    /// The SQL Server sessions it must name (none: not checked).
    pub sessions: Vec<Session>,
}

impl Expected {
    pub fn matches(&self, stall: &Value) -> bool {
        let subject = match &stall[self.field] {
            Value::String(s) => s.clone(),
            Value::Number(n) => n.to_string(),
            _ => String::new(),
        };
        let on_subject = match self.field {
            "flow" => subject.ends_with(&self.value),
            _ => subject == self.value,
        };
        stall["kind"] == self.kind
            && stall["cause"] == self.cause
            && on_subject
            && self
                .netns
                .is_none_or(|n| stall["netns"].as_u64() == Some(n))
    }

    /// A `requests` episode of the simulator whose worker is `worker`.
    pub fn requests(cause: &'static str, worker: u32, sessions: Vec<Session>) -> Self {
        Self {
            kind: "requests",
            cause,
            field: "worker_pid",
            value: worker.to_string(),
            netns: None,
            sessions,
        }
    }

    pub fn describe(&self) -> String {
        let mut s = format!(
            "a {} episode `{}` on {} {}",
            self.kind, self.cause, self.field, self.value
        );
        if let Some(n) = self.netns {
            let _ = write!(s, " (netns {n})");
        }
        if !self.sessions.is_empty() {
            let _ = write!(s, " naming the {} sessions", self.sessions.len());
        }
        s
    }
}

/// A SQL Server session the simulator opened, as sqlclient reported it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Session {
    /// The `sqlservr` worker's pid.
    pub worker: u32,
    pub spid: u16,
    /// `address:port` of the client end.
    pub client: String,
}

impl Session {
    /// The sessions a SQL client reported opening from `client_ip` to the
    /// simulator whose worker is `worker`.
    pub fn of_client(report: &ClientReport, worker: u32, client_ip: &str) -> Vec<Session> {
        report
            .sessions()
            .into_iter()
            .map(|(port, spid)| Session {
                worker,
                spid,
                client: format!("{client_ip}:{port}"),
            })
            .collect()
    }

    /// The record's `sql` tag names this session.
    pub fn is(&self, tag: &Value) -> bool {
        tag["pid"] == self.worker
            && tag["kind"] == "client"
            && tag["spid"] == self.spid
            && tag["client"] == self.client.as_str()
    }
}

/// What a scenario built, what stalltrace wrote about it, and what it expects.
pub struct Outcome {
    pub scenario: &'static str,
    pub fault: Fault,
    /// The JSON lines `stalltrace run` wrote, as written.
    pub stream: String,
    pub records: Vec<Value>,
    /// The scenario's subjects: its disks, and (in its network namespaces)
    /// its interfaces and peers. A `stall` record on one of the disks or in
    /// one of the namespaces belongs to it.
    pub devs: Vec<String>,
    pub ifaces: Vec<String>,
    pub peers: Vec<String>,
    pub netns: Vec<u64>,
    /// The simulator's sessions, when it ran.
    pub sessions: Vec<Session>,
    /// With the fault: the episodes that must be there.
    pub expected: Vec<Expected>,
    /// The load generators' own figures (fio, sockperf, iperf3, sqlclient, the
    /// receiver), as lines for a person to read.
    pub figures: Vec<String>,
    /// The same figures by name, for tests (e.g. `sockperf_p50_us`).
    pub values: BTreeMap<&'static str, f64>,
    /// The command-line arguments stalltrace ran with (for the report).
    pub args: Vec<String>,
    /// Episodes about the scenario's subjects that the load generator's own
    /// figures confirm happened without the fault (the disk under a loop
    /// device really was that slow): `(the episode's end, why)`. They are
    /// true findings, so a clean run is not judged by them.
    pub confirmed: Vec<(String, String)>,
}

impl Outcome {
    fn new(scenario: &'static str, fault: Fault, stream: String) -> Self {
        let records = parse_lines(&stream);
        Self {
            scenario,
            fault,
            stream,
            records,
            devs: Vec::new(),
            ifaces: Vec::new(),
            peers: Vec::new(),
            netns: Vec::new(),
            sessions: Vec::new(),
            expected: Vec::new(),
            figures: Vec::new(),
            values: BTreeMap::new(),
            args: Vec::new(),
            confirmed: Vec::new(),
        }
    }

    /// The subjects of a pair of namespaces: both ends' addresses, interfaces
    /// and namespaces.
    fn on_pair(&mut self, pair: &NetPair) {
        for side in [Side::A, Side::B] {
            self.peers.push(pair.v4(side).to_string());
            self.ifaces.push(pair.veth(side).into());
            self.netns.push(pair.netns_inode(side));
        }
    }

    /// A named figure; panics naming the scenario if it has none such.
    pub fn value(&self, name: &str) -> f64 {
        *self
            .values
            .get(name)
            .unwrap_or_else(|| panic!("{} has no figure {name}: {:?}", self.scenario, self.values))
    }

    /// Every `closed` stall record (each episode once, with its totals; the
    /// run's end closes those still open).
    pub fn episodes(&self) -> Vec<&Value> {
        self.records
            .iter()
            .filter(|r| r["type"] == "stall" && r["phase"] == "closed")
            .collect()
    }

    /// The episode is about one of the scenario's subjects: a network or
    /// bulk-flow episode in one of its namespaces (interfaces, peers and flows
    /// live in those; addresses may repeat in other labs' namespaces), a
    /// storage episode on one of its disks, a requests episode of the
    /// simulator whose sessions it opened.
    pub fn is_ours(&self, stall: &Value) -> bool {
        if let Some(pid) = stall["worker_pid"].as_u64() {
            return self.sessions.iter().any(|s| u64::from(s.worker) == pid);
        }
        match stall["netns"].as_u64() {
            Some(n) => self.netns.contains(&n),
            None => stall["dev"]
                .as_str()
                .is_some_and(|d| self.devs.iter().any(|x| x == d)),
        }
    }

    /// Episodes about the scenario's subjects.
    pub fn ours(&self) -> Vec<&Value> {
        self.episodes()
            .into_iter()
            .filter(|s| self.is_ours(s))
            .collect()
    }

    /// Episodes about anything else on the shared kernel.
    pub fn others(&self) -> Vec<&Value> {
        self.episodes()
            .into_iter()
            .filter(|s| !self.is_ours(s))
            .collect()
    }

    /// The episodes matching `e`.
    pub fn found(&self, e: &Expected) -> Vec<&Value> {
        self.episodes()
            .into_iter()
            .filter(|s| e.matches(s))
            .collect()
    }

    /// Whether stalltrace concluded what the scenario expects: with the fault,
    /// every expected episode (naming every expected session); clean, no
    /// episode about the scenario's subjects. Err says what is missing.
    pub fn verdict(&self) -> Result<(), String> {
        let mut missing = Vec::new();
        match self.fault {
            Fault::Injected => {
                for e in &self.expected {
                    let found = self.found(e);
                    if found.is_empty() {
                        missing.push(format!("no {}", e.describe()));
                        continue;
                    }
                    let named = |s: &Session| {
                        found.iter().any(|f| {
                            f["sessions"]
                                .as_array()
                                .into_iter()
                                .flatten()
                                .any(|t| s.is(t))
                        })
                    };
                    let unnamed: Vec<String> = e
                        .sessions
                        .iter()
                        .filter(|s| !named(s))
                        .map(|s| format!("SPID {} ({})", s.spid, s.client))
                        .collect();
                    if !unnamed.is_empty() {
                        missing.push(format!(
                            "{} does not name {}",
                            e.describe(),
                            unnamed.join(", ")
                        ));
                    }
                }
            }
            Fault::Clean => {
                for s in self.ours() {
                    if self.confirmation(s).is_none() {
                        missing.push(format!("unexpected {}", summary(s)));
                    }
                }
            }
        }
        if missing.is_empty() {
            Ok(())
        } else {
            Err(missing.join("; "))
        }
    }

    /// The one-paragraph conclusion: what stalltrace found, what was expected.
    /// Why the load generator's own figures confirm episode `stall`, if they do.
    pub fn confirmation(&self, stall: &Value) -> Option<&str> {
        let end = stall["end"].as_str()?;
        self.confirmed
            .iter()
            .find(|(e, _)| e == end)
            .map(|(_, why)| why.as_str())
    }

    pub fn conclusion(&self) -> String {
        let ours = self.ours();
        let found = if ours.is_empty() {
            "no stall episode about this scenario's disks, interfaces, peers or namespaces"
                .to_string()
        } else {
            ours.iter()
                .map(|s| summary(s))
                .collect::<Vec<_>>()
                .join("; ")
        };
        let expected = match self.fault {
            Fault::Clean => {
                "no stall episode about them (the same load without the fault)".to_string()
            }
            Fault::Injected => self
                .expected
                .iter()
                .map(Expected::describe)
                .collect::<Vec<_>>()
                .join("; "),
        };
        let verdict = match self.verdict() {
            Ok(()) => "As expected.".to_string(),
            Err(why) => format!("NOT as expected: {why}."),
        };
        let mut text = format!("stalltrace found: {found}. Expected: {expected}. {verdict}");
        if let Some(requests) = self.requests_line() {
            let _ = write!(text, " The clients' requests: {requests}.");
        }
        for why in ours.iter().filter_map(|s| self.confirmation(s)) {
            let _ = write!(text, " Confirmed without the fault: {why}.");
        }
        let others = self.others();
        if !others.is_empty() {
            let _ = write!(
                text,
                " Elsewhere on this kernel (not this scenario's): {}.",
                others
                    .iter()
                    .map(|s| summary(s))
                    .collect::<Vec<_>>()
                    .join("; ")
            );
        }
        text
    }
}

/// The scenario's `requests` episodes that its SQL client's own clock
/// confirms: the client saw a request take at least the episode's threshold
/// in the run (`client_max_us`; the client keeps no per-request times, so
/// the run, not the episode's seconds).
pub fn slow_requests_seen_by_client(
    o: &Outcome,
    client_max_us: f64,
    client: &str,
) -> Vec<(String, String)> {
    o.ours()
        .into_iter()
        .filter(|stall| stall["kind"] == "requests")
        .filter_map(|stall| {
            let threshold = stall["evidence"]
                .as_array()?
                .iter()
                .find(|e| e["signal"] == "slowest_request_ms")?["threshold"]
                .as_f64()?;
            (client_max_us / 1000.0 >= threshold).then(|| {
                (
                    stall["end"].as_str().unwrap_or_default().to_string(),
                    format!(
                        "{client}'s own slowest request took {:.1} ms (threshold {threshold} ms)",
                        client_max_us / 1000.0
                    ),
                )
            })
        })
        .collect()
}

/// One episode in a line: kind, cause, subject, duration, sessions.
pub fn summary(stall: &Value) -> String {
    let subject = ["dev", "iface", "peer", "flow"]
        .iter()
        .find_map(|f| stall[*f].as_str().map(|v| format!("{f} {v}")))
        .or_else(|| {
            let pid = stall["worker_pid"].as_u64()?;
            Some(format!("SQL Server pid {pid}"))
        })
        .unwrap_or_else(|| "?".into());
    let sessions = stall["sessions"].as_array().map_or(0, Vec::len);
    let mut s = format!(
        "{} `{}` on {subject} for {:.1} s",
        stall["kind"].as_str().unwrap_or("?"),
        stall["cause"].as_str().unwrap_or("?"),
        stall["duration_ms"].as_f64().unwrap_or(0.0) / 1000.0,
    );
    if let Some(e) = stall["evidence"].get(0) {
        let _ = write!(s, " ({})", e["text"].as_str().unwrap_or(""));
    }
    if sessions > 0 {
        let spids: Vec<String> = stall["sessions"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|t| t["spid"].as_u64().map(|n| n.to_string()))
            .collect();
        let _ = write!(
            s,
            ", hitting {sessions} SQL Server session(s) (SPID {})",
            spids.join(", ")
        );
    }
    s
}

/// The wall clock as records write `ts`, for windows over a recording.
pub fn now_ts() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
}

pub use crate::util::ScratchDir;

/// stalltrace's interval in every scenario: short, so a few seconds of load
/// give several intervals.
pub const INTERVAL: &str = "500ms";

/// `stalltrace run`'s arguments in the network scenarios: the scenario's
/// interval, every slow I/O reported, and only the scenario's namespaces.
pub fn tracer_args<'a>(netns: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec!["--interval", INTERVAL, "--slow-io-ms", "0"];
    for ns in netns {
        args.extend(["--netns", ns]);
    }
    args
}
