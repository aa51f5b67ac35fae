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
}

impl SqlTag {
    pub fn for_session(s: &Session) -> Self {
        Self {
            pid: s.pid,
            kind: Some(s.kind),
            spid: s.spid,
            client: Some(s.remote.to_string()),
            encrypted: s.encrypted,
        }
    }

    pub fn for_instance(pid: u32) -> Self {
        Self {
            pid,
            ..Default::default()
        }
    }
}
