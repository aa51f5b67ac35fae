//! SQL Server records (schema v1: `sql_instance`, `sql_session`) and the `sql`
//! object other records carry when they belong to SQL Server.

use serde::Serialize;

use super::inventory::{Instance, Session, SessionKind};

/// An instance found (or changed: ports, files, roles).
#[derive(Serialize)]
pub struct SqlInstanceRecord<'a> {
    #[serde(flatten)]
    pub instance: &'a Instance,
}

/// A session opened, learned its SPID, or closed.
#[derive(Serialize)]
pub struct SqlSessionRecord<'a> {
    /// `open`, `identified` (its SPID became known) or `closed`.
    pub event: &'static str,
    #[serde(flatten)]
    pub session: &'a Session,
}

/// Which SQL Server session (or instance) a record belongs to.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct SqlTag {
    /// The instance's worker pid.
    pub pid: u32,
    /// `client`, `availability_group` or `backup`; absent for an instance-wide
    /// record (a slow I/O of the worker).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kind: Option<SessionKind>,
    /// The session's SPID, when known (TDS header or DMV).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub spid: Option<u16>,
    /// The client end (`addr:port`) of a client session; the remote end otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client: Option<String>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub encrypted: bool,
    /// From the DMVs (`--sql-dmv`), for the connection's own session.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub login: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub program: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub database: Option<String>,
    /// What the session waited on at the last DMV poll.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wait_type: Option<String>,
    /// The other sessions multiplexed on the connection (MARS).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub mars_spids: Vec<u16>,
}

impl SqlTag {
    pub fn for_session(s: &Session) -> Self {
        let own = s.dmv.first();
        Self {
            pid: s.pid,
            kind: Some(s.kind),
            // The TDS header's SPID, else the DMVs' (an encrypted session's only source).
            spid: s.spid.or(own.map(|d| d.session_id)),
            client: Some(s.remote.to_string()),
            encrypted: s.encrypted,
            login: own.map(|d| d.login.clone()),
            program: own.and_then(|d| d.program.clone()),
            database: own.and_then(|d| d.database.clone()),
            wait_type: own.and_then(|d| d.wait_type.clone()),
            mars_spids: s.dmv.iter().skip(1).map(|d| d.session_id).collect(),
        }
    }

    pub fn for_instance(pid: u32) -> Self {
        Self {
            pid,
            ..Default::default()
        }
    }
}
