//! SQL Server's records (`sql_instance`, `sql_session`), what they are made
//! of, and the `sql` object other records carry when they belong to SQL
//! Server.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::host::container::Container;

/// A SQL Server instance found on the host (or changed: ports, files, roles), from /proc and
/// /sys alone.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema, PartialEq)]
#[schemars(deny_unknown_fields)]
pub struct Instance {
    /// The worker process (it listens, opens the files, owns the sessions).
    pub pid: u32,
    /// Its watchdog parent `sqlservr`, when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub watchdog_pid: Option<u32>,
    /// The worker's network namespace inode.
    pub netns: u32,
    /// TDS listener ports, as the worker listens on them (or --sql-port).
    pub tds_ports: Vec<u16>,
    /// Availability-group / mirroring endpoint ports (--sql-ag-port, default 5022).
    pub ag_ports: Vec<u16>,
    /// Its open database, log, tempdb and backup files.
    pub files: Vec<FileSummary>,
    /// Role of each disk (`major:minor`) it keeps files on; `mixed` when a disk holds files of
    /// several roles. `block` records of those disks carry it as `role`.
    pub disk_roles: BTreeMap<String, String>,
    /// Whether its encrypted sessions can get their SPID from the plaintext of its `SSL_write`
    /// calls (uprobes on the libssl it maps), and if not, why. Absent when the sqlserver family
    /// was not asked (a record of an older stalltrace).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<TlsSpids>,
    /// The container the worker runs in, from its cgroup; absent on the host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<Container>,
}

/// `--sql-tls`: when the `SSL_write` uprobes that give encrypted sessions their SPIDs are
/// attached to a worker.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema, clap::ValueEnum,
)]
#[serde(rename_all = "kebab-case")]
#[schemars(rename = "tls_policy")]
pub enum TlsPolicy {
    /// While the worker has encrypted sessions without a SPID, and for a minute after.
    #[default]
    OnDemand,
    /// As long as the worker runs: every `SSL_write` of it traps.
    Always,
    /// Never: encrypted sessions get a SPID only from DMV enrichment.
    Off,
}

/// What the `start` record says of SPIDs of encrypted sessions on this host.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema, PartialEq)]
#[schemars(deny_unknown_fields, rename = "sql_tls_start")]
pub struct SqlTlsStart {
    /// `--sql-tls`.
    pub policy: TlsPolicy,
    /// Whether uprobes can be attached here; each worker's `sql_instance` says whether its own
    /// libssl can be watched.
    pub available: bool,
    /// Why not, with the fix.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// Whether a worker's encrypted sessions get their SPID from its TLS plaintext.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
#[schemars(rename = "tls_spids_state")]
pub enum TlsSpidsState {
    /// Its libssl exports `SSL_write` or `SSL_write_ex`: they are watched as `--sql-tls` says.
    Available,
    /// It cannot be watched (no uprobes, no libssl mapped, no such functions, the file
    /// replaced on disk): encrypted sessions have no SPID without `--sql-dmv`.
    Unavailable,
    /// A pairing of plaintext and socket contradicted an earlier one: SPIDs from TLS are not
    /// used for this worker for the rest of the run.
    Disabled,
    /// `--sql-tls off`.
    Off,
}

/// A worker's TLS plaintext as a source of SPIDs.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema, PartialEq)]
#[schemars(deny_unknown_fields, rename = "tls_spids")]
pub struct TlsSpids {
    /// `available`, `unavailable`, `disabled` or `off`.
    pub state: TlsSpidsState,
    /// The libssl it maps (its path in the worker's own mount namespace).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub library: Option<PathBuf>,
    /// Of `SSL_write` and `SSL_write_ex`, those the library exports (each gets a uprobe).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub symbols: Vec<String>,
    /// Why it is not available, and what to do.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl TlsSpids {
    pub fn available(library: &std::path::Path, symbols: &[&str]) -> Self {
        Self {
            state: TlsSpidsState::Available,
            library: Some(library.to_path_buf()),
            symbols: symbols.iter().map(|s| s.to_string()).collect(),
            reason: None,
        }
    }

    pub fn unavailable(library: Option<PathBuf>, why: String) -> Self {
        Self {
            state: TlsSpidsState::Unavailable,
            library,
            symbols: Vec::new(),
            reason: Some(why),
        }
    }

    pub fn off() -> Self {
        Self {
            state: TlsSpidsState::Off,
            library: None,
            symbols: Vec::new(),
            reason: None,
        }
    }
}

/// Where a session's SPID came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
#[schemars(rename = "spid_source")]
pub enum SpidSource {
    /// A server TDS packet header the worker sent on the wire (an unencrypted session, or one
    /// encrypted for its login only).
    TdsHeader,
    /// A server TDS packet header in the plaintext of the worker's `SSL_write` (an encrypted
    /// session), tied to the socket by the TLS record the same thread sent next.
    TlsPlaintext,
    /// SQL Server's DMVs (`--sql-dmv`).
    Dmv,
}

/// One open file of a SQL Server instance.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema, PartialEq)]
#[schemars(deny_unknown_fields, rename = "file_summary")]
pub struct FileSummary {
    /// File path.
    pub path: PathBuf,
    /// From SQL Server's file naming: .mdf/.ndf data, .ldf log, tempdb's files, .bak/.trn
    /// backups.
    pub role: String,
    /// The whole disks under it (`major:minor`): the filesystem's, then for device-mapper and md
    /// the disks under those. On overlayfs, the upper directory's filesystem's; empty when that
    /// directory is out of stalltrace's reach.
    pub disks: Vec<String>,
    /// Present when the file is on overlayfs (a container's root rather than a volume): its
    /// writes go to the upper directory, and SQL Server's I/O then also pays for the overlay
    /// (a copy-up of the whole file when it is first opened for writing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overlay: Option<OverlayFile>,
}

/// Where the writes of a file on overlayfs go.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema, PartialEq)]
#[schemars(deny_unknown_fields, rename = "overlay_file")]
pub struct OverlayFile {
    /// The overlay's upper directory, as its mounter (the container runtime) named it; absent
    /// when stalltrace cannot reach it (e.g. stalltrace itself in a container).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upper_dir: Option<PathBuf>,
}

/// What a SQL Server connection is: `client` (to a TDS listener), `availability_group` (an
/// availability-group or mirroring endpoint connection), `backup` (to an SMB or NFS share).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
#[schemars(rename = "session_kind")]
pub enum SessionKind {
    /// A client connected to a TDS listener.
    Client,
    /// An availability-group or mirroring endpoint connection.
    AvailabilityGroup,
    /// A connection to a file share (SMB, NFS): backups.
    Backup,
}

impl SessionKind {
    /// The name the records use.
    pub fn name(self) -> &'static str {
        match self {
            SessionKind::Client => "client",
            SessionKind::AvailabilityGroup => "availability_group",
            SessionKind::Backup => "backup",
        }
    }
}

/// A connection of a SQL Server worker: a client session, an availability-group connection, or
/// a backup share connection.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema, PartialEq)]
#[schemars(deny_unknown_fields)]
pub struct Session {
    /// The instance's worker process.
    pub pid: u32,
    /// Network namespace inode.
    pub netns: u32,
    /// What the connection is.
    pub kind: SessionKind,
    /// Local end (`addr:port`).
    pub local: SocketAddr,
    /// Remote end (`addr:port`): the client of a client session.
    pub remote: SocketAddr,
    /// Socket inode (as in /proc/PID/fd).
    pub sock_ino: u64,
    /// When stalltrace first saw it (sessions older than stalltrace have no earlier time). It
    /// cannot know the connect time of a session older than itself.
    pub first_seen: String,
    /// Its SPID, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spid: Option<u16>,
    /// Where `spid` came from; present with it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spid_source: Option<SpidSource>,
    /// Its TDS stream is TLS on the wire: its SPID, if any, came from the TLS plaintext or the
    /// DMVs.
    pub encrypted: bool,
    /// Present for a connection using MARS (its TDS travels inside SMP, seen in what the server
    /// sends): several requests can be in flight on it, so none of them is timed in
    /// `sql_requests`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub mars: bool,
    /// DMV enrichment (`--sql-dmv`): the sessions on this connection, its own first, then MARS
    /// sessions. An `identified` record follows when they change. What SQL Server's DMVs say
    /// about the sessions on this connection.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dmv: Vec<DmvSession>,
    /// The last refresh that did not see this socket (UTC ms): its connection
    /// is younger than that. None for a socket there at stalltrace's start.
    #[serde(skip)]
    #[schemars(skip)]
    pub absent_at_ms: Option<i64>,
}

/// What SQL Server's DMVs (sys.dm_exec_connections, sys.dm_exec_sessions,
/// sys.dm_exec_requests) say about one session on a connection, at the last poll.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields, rename = "dmv_session")]
pub struct DmvSession {
    /// The session id (SPID).
    pub session_id: u16,
    /// When the connection (or MARS session) was made, UTC ms since the epoch; with the id, what
    /// names a session (ids are reused).
    pub connect_time_ms: i64,
    /// Present for a MARS session sharing the connection with the first one (the primary one).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub mars: bool,
    /// Login name.
    pub login: String,
    /// Program name the client reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub program: Option<String>,
    /// Host name the client reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// Current database.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub database: Option<String>,
    /// Session status: `running`, `sleeping`, `dormant`, ...
    pub status: String,
    /// The current request's status, when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_status: Option<String>,
    /// The current request's command (`SELECT`, `INSERT`, ...; never SQL text).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    /// What the current request waits on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_type: Option<String>,
    /// For how long, in ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_time_ms: Option<i32>,
    /// The session blocking it, when one does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blocking_session_id: Option<i16>,
}

/// `sql_instance`: an instance found, or changed (ports, files, roles).
pub type SqlInstanceRecord = Instance;

/// What happened to a session.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
#[schemars(rename = "session_event")]
pub enum SessionEvent {
    /// First seen.
    Open,
    /// Its SPID (or encryption) became known.
    Identified,
    /// Gone.
    Closed,
}

/// `sql_session`: a connection of a SQL Server worker: a client session, an availability-group
/// connection, or a backup share connection. Written when a session opened, learned its SPID,
/// or closed.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct SqlSessionRecord {
    /// `open`: first seen; `identified`: its SPID (or encryption) became known; `closed`: gone.
    pub event: SessionEvent,
    #[serde(flatten)]
    pub session: Session,
}

/// The SQL Server session (or instance) a record belongs to, when it belongs to one.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[schemars(deny_unknown_fields, rename = "sql_tag")]
pub struct SqlTag {
    /// The instance's worker process.
    pub pid: u32,
    /// The session's kind; absent for an instance-wide record (a slow I/O submitted by the
    /// worker).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<SessionKind>,
    /// The session's SPID, when known: from the TDS headers the server sends, on the wire or in
    /// its TLS plaintext, else from DMV enrichment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spid: Option<u16>,
    /// Where `spid` came from; present with it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spid_source: Option<SpidSource>,
    /// The remote end (`addr:port`): the client of a client session.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client: Option<String>,
    /// Present for a session whose TDS stream is TLS on the wire.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub encrypted: bool,
    /// DMV enrichment (`--sql-dmv`): the connection's own session's login.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub login: Option<String>,
    /// DMV enrichment: its program name (as the client reported it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub program: Option<String>,
    /// DMV enrichment: its current database.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub database: Option<String>,
    /// DMV enrichment: what its request waited on at the last poll (e.g. `WRITELOG`,
    /// `ASYNC_NETWORK_IO`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_type: Option<String>,
    /// DMV enrichment: the other sessions multiplexed on the same connection (MARS).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mars_spids: Vec<u16>,
    /// The id of the container the instance runs in (its `sql_instance` has the runtime, pod and
    /// cgroup); absent on the host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(equal = 64))]
    pub container: Option<String>,
}

impl SqlTag {
    pub fn for_session(s: &Session) -> Self {
        let own = s.dmv.first();
        // The session's settled SPID, else the DMVs' (joined since it was settled).
        let (spid, spid_source) = match (s.spid, own) {
            (Some(spid), _) => (Some(spid), s.spid_source),
            (None, Some(d)) => (Some(d.session_id), Some(SpidSource::Dmv)),
            (None, None) => (None, None),
        };
        Self {
            pid: s.pid,
            kind: Some(s.kind),
            spid,
            spid_source,
            client: Some(s.remote.to_string()),
            encrypted: s.encrypted,
            login: own.map(|d| d.login.clone()),
            program: own.and_then(|d| d.program.clone()),
            database: own.and_then(|d| d.database.clone()),
            wait_type: own.and_then(|d| d.wait_type.clone()),
            mars_spids: s.dmv.iter().skip(1).map(|d| d.session_id).collect(),
            container: None, // the instance's, which the session does not hold
        }
    }

    pub fn for_instance(pid: u32) -> Self {
        Self {
            pid,
            ..Default::default()
        }
    }
}
