//! Optional DMV enrichment (off by default): who is on each SQL Server socket,
//! from SQL Server itself. A poller thread runs one query over
//! `sys.dm_exec_connections` ⋈ `sys.dm_exec_sessions` ⋈ `sys.dm_exec_requests`
//! every few seconds (client.rs); the daemon takes the latest rows without
//! waiting (poller.rs) and joins them to the sockets the inventory found, by the
//! client's address and port (join.rs). That adds session ids, login, program,
//! database and the current wait to what the kernel shows, including sessions
//! whose TDS traffic is encrypted (no SPID in the headers).
//!
//! Credentials come from a private file or the environment (config.rs). The
//! query sits behind `DmvSource`, so the join is tested on recorded rows; the
//! one live test runs only when `STALLTRACE_SQL_CONN` names a server.
//!
//! Wiring (for the daemon): `DmvConfig::from_file(path)` or
//! `DmvConfig::from_env()`, then `Dmv::start(config)`; each interval,
//! `dmv.take_status()` (write each change once), and
//! `join(&dmv.latest()?.rows, &sockets)` with `KnownSocket::from_session`.

pub mod client;
pub mod config;
pub mod join;
#[cfg(test)]
mod join_tests;
pub mod poller;

pub use client::TdsDmvSource;
pub use config::{DmvConfig, Encrypt, Secret};
pub use join::{DmvRow, DmvSession, KnownSocket, SocketKey, apply_dmv_rows, join};
pub use poller::{Dmv, DmvSnapshot, DmvStatus};

use crate::error::UserError;

/// Where DMV rows come from: SQL Server (`TdsDmvSource`) or, in tests, a
/// recording.
pub trait DmvSource {
    fn poll(&mut self) -> Result<Vec<DmvRow>, DmvError>;
}

/// Why a poll failed. Messages carry the server's and the driver's words,
/// never the password (the driver never echoes it).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DmvError {
    #[error("the DMV poller cannot start: {0}")]
    Setup(String),
    #[error("cannot reach SQL Server for DMV polling: {0}")]
    Connect(String),
    #[error("TLS with SQL Server failed for DMV polling: {0}")]
    Tls(String),
    #[error("SQL Server refused the DMV poller's login: {0}")]
    Login(String),
    #[error("SQL Server did not answer the DMV poller in time: {0}")]
    Timeout(String),
    #[error("the DMV query failed: {0}")]
    Query(String),
}

impl DmvError {
    /// A stable name for the kind of failure: a change of kind is news, a
    /// change of wording is not.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Setup(_) => "setup",
            Self::Connect(_) => "connect",
            Self::Tls(_) => "tls",
            Self::Login(_) => "login",
            Self::Timeout(_) => "timeout",
            Self::Query(_) => "query",
        }
    }

    /// The problem with its fix, as every stalltrace error reads.
    pub fn to_user_error(&self) -> UserError {
        let fix = match self {
            Self::Setup(_) => "check the DMV settings; run without DMV polling meanwhile",
            Self::Connect(_) => {
                "check host and port in the DMV settings and that SQL Server listens on TCP there"
            }
            Self::Tls(_) => {
                "install a certificate this host trusts on SQL Server, or set trust_server_certificate = true (TrustServerCertificate=true) for its self-signed one; if it cannot encrypt at all, set encrypt = off"
            }
            Self::Login(_) => {
                "check user and password in the DMV settings; the login needs VIEW SERVER STATE"
            }
            Self::Timeout(_) => "check that SQL Server is responsive; polling goes on",
            Self::Query(_) => {
                "GRANT VIEW SERVER STATE (SQL Server 2022: VIEW SERVER PERFORMANCE STATE) to the DMV login"
            }
        };
        UserError::new(self.to_string(), fix)
    }
}
