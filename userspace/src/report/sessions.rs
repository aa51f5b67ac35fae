//! SQL Server in the report: the instances (`sql_instance`), and the time each
//! session lost. A session shows up in three places — a stall episode's
//! `sessions`, the `sql` tag of its connection's `tcp_retransmit` records, and
//! `sql_session` records (which add its SPID and, with DMV enrichment, who is
//! on it) — and is identified across them by the worker's pid and the client's
//! `addr:port` (a SPID can be reused by a later connection; a 4-tuple cannot
//! while the connection lives).

use std::collections::{BTreeMap, BTreeSet};

use super::network::Waited;
use crate::records;
use crate::records::sql::{SessionKind, SqlTag};

/// What the report reads from a `sql` tag (schema `sql_tag`), or the same facts
/// from a `sql_session` record.
pub trait SessionTag {
    /// A session (it has a client or a SPID), not an instance-wide tag.
    fn is_session(&self) -> bool;
    /// `SPID 51` / `SPID ?` (encrypted, no DMV) / the kind for a non-client session.
    fn spid_label(&self) -> String;
    /// Login, program and database, when DMV enrichment gave them.
    fn who(&self) -> Option<String>;
}

impl SessionTag for SqlTag {
    fn is_session(&self) -> bool {
        self.client.is_some() || self.spid.is_some()
    }

    fn spid_label(&self) -> String {
        match (self.spid, self.kind) {
            (Some(s), _) => format!("SPID {s}"),
            (None, Some(SessionKind::AvailabilityGroup)) => "AG endpoint".into(),
            (None, Some(SessionKind::Backup)) => "backup".into(),
            (None, _) if self.encrypted => "SPID ? (encrypted)".into(),
            (None, _) => "SPID ?".into(),
        }
    }

    fn who(&self) -> Option<String> {
        let parts: Vec<String> = [
            self.login.as_ref().map(|l| format!("login {l}")),
            self.program.as_ref().map(|p| format!("program {p}")),
            self.database.as_ref().map(|d| format!("db {d}")),
        ]
        .into_iter()
        .flatten()
        .collect();
        (!parts.is_empty()).then(|| parts.join(", "))
    }
}

fn key(tag: &SqlTag) -> SessionKey {
    let pid = u64::from(tag.pid);
    match &tag.client {
        Some(c) => SessionKey::Client(pid, c.clone()),
        None => SessionKey::Spid(pid, tag.spid),
    }
}

/// Fill what `tag` lacks from `other` (the same session seen elsewhere: the
/// same pid, as the key says).
fn fill_from(tag: &mut SqlTag, other: &SqlTag) {
    fn fill<T: Clone>(a: &mut Option<T>, b: &Option<T>) {
        if a.is_none() {
            a.clone_from(b);
        }
    }
    fill(&mut tag.kind, &other.kind);
    fill(&mut tag.spid, &other.spid);
    fill(&mut tag.client, &other.client);
    fill(&mut tag.login, &other.login);
    fill(&mut tag.program, &other.program);
    fill(&mut tag.database, &other.database);
    fill(&mut tag.wait_type, &other.wait_type);
    if tag.mars_spids.is_empty() {
        tag.mars_spids.clone_from(&other.mars_spids);
    }
    tag.encrypted |= other.encrypted;
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum SessionKey {
    Client(u64, String),
    Spid(u64, Option<u16>),
}

/// What one session lost over the run.
#[derive(Clone, Debug, Default)]
pub struct SessionImpact {
    pub tag: SqlTag,
    /// Ids of the stall episodes that name it.
    pub episodes: Vec<u64>,
    /// Summed length of those episodes: time it spent inside a stall.
    pub stall_ms: f64,
    /// Retransmission timeouts and tail-loss probes its connection waited
    /// out (`rto_ms` of each timer-fired retransmission, `probe_after_ms` of
    /// each probe): time lost, measured on the connection itself.
    pub timeout_wait_ms: f64,
    pub retransmits: u64,
    pub retrans_segs: u64,
    pub rtos: u64,
}

impl SessionImpact {
    /// What sessions are ranked by.
    pub fn weight(&self) -> f64 {
        self.stall_ms + self.timeout_wait_ms
    }
}

/// A SQL Server instance, as its latest `sql_instance` record describes it.
#[derive(Clone, Debug, Default)]
pub struct Instance {
    pub pid: u64,
    pub watchdog_pid: Option<u64>,
    pub tds_ports: Vec<u64>,
    pub ag_ports: Vec<u64>,
    /// (path, role)
    pub files: Vec<(String, String)>,
    /// `major:minor` -> role
    pub disk_roles: BTreeMap<String, String>,
    /// Slow I/Os the worker submitted (`slow_io` with its `sql` tag), by file
    /// (`""` when the file is not known).
    pub slow_ios_by_file: BTreeMap<String, u64>,
    /// Client sessions seen open (`sql_session` records).
    pub sessions_seen: usize,
    /// The container it runs in.
    pub container: Option<crate::host::container::Container>,
}

#[derive(Default)]
pub struct Sessions {
    instances: BTreeMap<u64, Instance>,
    /// Everything known about each session, from every record naming it.
    known: BTreeMap<SessionKey, SqlTag>,
    impact: BTreeMap<SessionKey, SessionImpact>,
    opened: BTreeMap<u64, BTreeSet<String>>,
}

impl Sessions {
    pub fn instance(&mut self, r: &records::sql::SqlInstanceRecord) {
        let pid = u64::from(r.pid);
        let ports = |ports: &[u16]| ports.iter().copied().map(u64::from).collect();
        let inst = self.instances.entry(pid).or_default();
        inst.pid = pid;
        inst.watchdog_pid = r.watchdog_pid.map(u64::from);
        inst.tds_ports = ports(&r.tds_ports);
        inst.ag_ports = ports(&r.ag_ports);
        inst.files = r
            .files
            .iter()
            .map(|f| (f.path.to_string_lossy().into_owned(), f.role.clone()))
            .collect();
        inst.disk_roles = r.disk_roles.clone();
        inst.container = r.container.clone();
    }

    /// A `sql_session` record: what it says about who the session is.
    pub fn session(&mut self, r: &records::sql::SqlSessionRecord) {
        // The tag the tracer puts on the session's own records.
        let tag = SqlTag::for_session(&r.session);
        if let Some(client) = &tag.client
            && tag.kind.is_none_or(|k| k == SessionKind::Client)
        {
            self.opened
                .entry(u64::from(tag.pid))
                .or_default()
                .insert(client.clone());
        }
        self.learn(&tag);
    }

    /// Later records know more (a SPID read after the first packets, DMV fields):
    /// keep the newest value of each field.
    fn learn(&mut self, tag: &SqlTag) {
        let known = self.known.entry(key(tag)).or_default();
        let mut newer = tag.clone();
        fill_from(&mut newer, known);
        *known = newer;
    }

    fn impact(&mut self, tag: &SqlTag) -> &mut SessionImpact {
        self.learn(tag);
        let entry = self
            .impact
            .entry(key(tag))
            .or_insert_with(|| SessionImpact {
                tag: SqlTag::for_instance(tag.pid),
                ..SessionImpact::default()
            });
        fill_from(&mut entry.tag, tag);
        entry
    }

    /// A `tcp_retransmit` record carrying a session's `sql` tag.
    pub fn retransmit(&mut self, tag: &SqlTag, segs: u64, waited: Option<Waited>) {
        if !tag.is_session() {
            return;
        }
        let s = self.impact(tag);
        s.retransmits += 1;
        s.retrans_segs += segs;
        if let Some(waited) = waited {
            s.rtos += u64::from(matches!(waited, Waited::Timeout(_)));
            s.timeout_wait_ms += waited.ms();
        }
    }

    /// A stall episode that names `tag` among the sessions it hit.
    pub fn hit(&mut self, tag: &SqlTag, episode: u64, duration_ms: f64) {
        if !tag.is_session() {
            return;
        }
        let s = self.impact(tag);
        if !s.episodes.contains(&episode) {
            s.episodes.push(episode);
            s.stall_ms += duration_ms;
        }
    }

    /// `tag` with what other records said about the same session (its SPID,
    /// who is on it): an episode's list names sessions as fully as the table.
    pub fn enriched(&self, tag: &SqlTag) -> SqlTag {
        let mut t = tag.clone();
        if let Some(known) = self.known.get(&key(tag)) {
            fill_from(&mut t, known);
        }
        t
    }

    /// A slow I/O the instance's worker submitted.
    pub fn slow_io(&mut self, pid: u64, file: Option<String>) {
        let inst = self.instances.entry(pid).or_insert_with(|| Instance {
            pid,
            ..Default::default()
        });
        *inst
            .slow_ios_by_file
            .entry(file.unwrap_or_default())
            .or_default() += 1;
    }

    /// Sessions ranked by time lost (stall time + timeout wait), then retransmits;
    /// each with everything any record said about it.
    pub fn finish(mut self) -> (Vec<Instance>, Vec<SessionImpact>) {
        for (pid, clients) in &self.opened {
            if let Some(inst) = self.instances.get_mut(pid) {
                inst.sessions_seen = clients.len();
            }
        }
        let mut impacts: Vec<SessionImpact> = std::mem::take(&mut self.impact)
            .into_iter()
            .map(|(key, mut s)| {
                if let Some(known) = self.known.get(&key) {
                    let mut tag = known.clone();
                    fill_from(&mut tag, &s.tag);
                    s.tag = tag;
                }
                s.episodes.sort_unstable();
                s
            })
            .collect();
        impacts.sort_by(|a, b| {
            b.weight()
                .total_cmp(&a.weight())
                .then(b.retransmits.cmp(&a.retransmits))
                .then(a.tag.spid.cmp(&b.tag.spid))
        });
        (self.instances.into_values().collect(), impacts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::records::sql::{DmvSession, Session, SessionEvent, SqlSessionRecord};
    use serde_json::{Value, json};

    /// A `sql` tag as records carry it.
    fn tag(v: Value) -> SqlTag {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn one_session_across_records_is_one_row_with_everything_known() {
        let mut s = Sessions::default();
        s.session(&SqlSessionRecord {
            event: SessionEvent::Identified,
            session: Session {
                pid: 10,
                netns: 1,
                kind: SessionKind::Client,
                local: "10.0.0.1:1433".parse().unwrap(),
                remote: "10.0.0.9:50000".parse().unwrap(),
                sock_ino: 77,
                first_seen: "2026-11-22T10:00:00.100000Z".into(),
                spid: Some(51),
                spid_source: None,
                encrypted: false,
                mars: false,
                dmv: vec![DmvSession {
                    session_id: 51,
                    connect_time_ms: 1_795_341_600_000,
                    login: "app".into(),
                    program: Some("OrderSvc".into()),
                    status: "running".into(),
                    ..DmvSession::default()
                }],
                absent_at_ms: None,
            },
        });
        let t = tag(json!({"pid": 10, "kind": "client", "spid": 51, "client": "10.0.0.9:50000"}));
        s.retransmit(&t, 2, None);
        s.retransmit(&t, 1, Some(Waited::Timeout(204.0)));
        s.retransmit(&t, 1, Some(Waited::Probe(408.0)));
        s.hit(&t, 3, 1500.0);
        s.hit(&t, 3, 1500.0); // named twice in one episode: counted once
        // Same connection, SPID not in this tag: still the same session.
        s.hit(
            &tag(json!({"pid": 10, "client": "10.0.0.9:50000"})),
            4,
            500.0,
        );
        let (_, impacts) = s.finish();
        assert_eq!(impacts.len(), 1);
        let i = &impacts[0];
        assert_eq!(i.retransmits, 3);
        assert_eq!(i.retrans_segs, 4);
        // The probe's wait is time lost, not a timeout.
        assert_eq!(i.rtos, 1);
        assert_eq!(i.timeout_wait_ms, 612.0);
        assert_eq!(i.episodes, vec![3, 4]);
        assert_eq!(i.stall_ms, 2000.0);
        assert_eq!(i.tag.spid, Some(51));
        assert_eq!(i.tag.login.as_deref(), Some("app"));
        assert_eq!(i.tag.who().as_deref(), Some("login app, program OrderSvc"));
    }

    #[test]
    fn sessions_rank_by_time_lost_and_instance_tags_are_not_sessions() {
        let mut s = Sessions::default();
        let a = tag(json!({"pid": 1, "spid": 51, "client": "c:1"}));
        let b = tag(json!({"pid": 1, "spid": 52, "client": "c:2"}));
        s.retransmit(&a, 1, Some(Waited::Timeout(200.0)));
        s.hit(&b, 1, 900.0);
        s.retransmit(&tag(json!({"pid": 1})), 1, Some(Waited::Timeout(1000.0)));
        let (_, impacts) = s.finish();
        let spids: Vec<_> = impacts.iter().map(|i| i.tag.spid).collect();
        assert_eq!(spids, vec![Some(52), Some(51)]);
    }
}
