//! Which SQL Server sessions run on which socket: DMV rows joined to the
//! sockets the inventory found, by the client's address and port. Pure, so it
//! is tested on recorded row sets (dmv/join_tests.rs).
//!
//! Rules:
//! - A physical connection row (TCP, with a client address and port) belongs to
//!   the socket whose remote end is that address and port (IPv4, IPv6 and
//!   v4-mapped compare equal) and whose local port is the row's
//!   `local_tcp_port`. Shared memory (`<local machine>`) and named pipes have
//!   no socket.
//! - MARS: the logical rows (`net_transport = 'Session'`) name their physical
//!   connection in `parent_connection_id`; they ride on its socket, after the
//!   physical connection's own session.
//! - Reuse: SQL Server hands a closed session's id to the next connection and
//!   the client's kernel reuses ports, so a row is only a socket's if its
//!   connection began while that socket could have been connecting: not after
//!   stalltrace first saw the socket, and not before the last inventory refresh
//!   that did not see it. A session is known by (session_id, connect_time).

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};

pub use crate::records::sql::DmvSession;

use crate::sqlserver::inventory::Session;

/// One row of the DMV query (client.rs): a connection, its session, and its
/// current request if it has one. Plain data so that tests can record them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DmvRow {
    pub session_id: u16,
    /// `sys.dm_exec_connections.connection_id`, as text.
    pub connection_id: String,
    /// For a MARS logical session: the physical connection's `connection_id`.
    pub parent_connection_id: Option<String>,
    /// `connect_time` in UTC, ms since the Unix epoch (the query converts it
    /// from the server's local time).
    pub connect_time_ms: i64,
    /// `TCP`, `Session` (MARS), `Shared memory`, `Named pipe`.
    pub net_transport: String,
    /// As SQL Server prints it: `10.1.2.3`, `fe80::1%2`, `<local machine>`.
    pub client_net_address: Option<String>,
    pub client_tcp_port: Option<u16>,
    pub local_tcp_port: Option<u16>,
    pub encrypt_option: String,
    /// None when the connection has no session (yet, or any more).
    pub login_name: Option<String>,
    pub program_name: Option<String>,
    pub host_name: Option<String>,
    pub database: Option<String>,
    pub session_status: Option<String>,
    pub request_status: Option<String>,
    pub command: Option<String>,
    pub wait_type: Option<String>,
    pub wait_time_ms: Option<i32>,
    /// 0 when not blocked; negative values are SQL Server's special owners
    /// (-2 orphaned distributed transaction, -3 deferred recovery, -4 latch).
    pub blocking_session_id: Option<i16>,
}

/// The socket inode, as the inventory keys sessions.
pub type SocketKey = u64;

/// A socket stalltrace knows, as the join needs it.
#[derive(Clone, Debug, PartialEq)]
pub struct KnownSocket {
    pub key: SocketKey,
    /// The client end.
    pub remote: SocketAddr,
    /// SQL Server's end (its TDS port).
    pub local_port: u16,
    /// When stalltrace first saw it, UTC ms since the epoch.
    pub first_seen_ms: i64,
    /// The last inventory refresh that did not see it (None when it was there
    /// when stalltrace started): its connection cannot be older than that.
    pub absent_at_ms: Option<i64>,
}

impl KnownSocket {
    /// From an inventory session; `absent_at_ms` as in the field.
    pub fn from_session(s: &Session, absent_at_ms: Option<i64>) -> Option<Self> {
        let first_seen = chrono::DateTime::parse_from_rfc3339(&s.first_seen).ok()?;
        Some(Self {
            key: s.sock_ino,
            remote: s.remote,
            local_port: s.local.port(),
            first_seen_ms: first_seen.timestamp_millis(),
            absent_at_ms,
        })
    }
}

/// Datetime conversion (3.33 ms ticks, whole-ms arithmetic) and the
/// inventory's own stamping leave a little play at both ends of a window.
pub const CLOCK_SLACK_MS: i64 = 2_000;

/// The sessions on each known socket, the physical connection's first.
/// Sockets with no session are absent.
pub fn join(rows: &[DmvRow], sockets: &[KnownSocket]) -> HashMap<SocketKey, Vec<DmvSession>> {
    let mut by_remote: HashMap<(IpAddr, u16), Vec<&KnownSocket>> = HashMap::new();
    for s in sockets {
        by_remote
            .entry((s.remote.ip().to_canonical(), s.remote.port()))
            .or_default()
            .push(s);
    }

    // Physical connections first, so that MARS children find their parent.
    let mut physical: HashMap<SocketKey, &DmvRow> = HashMap::new();
    for row in rows.iter().filter(|r| !is_logical(r)) {
        if let Some(s) = socket_of(row, &by_remote) {
            // Two connections on one socket's tuple in one snapshot cannot both
            // be live: the later one is the socket's.
            let e = physical.entry(s.key).or_insert(row);
            if row.connect_time_ms > e.connect_time_ms {
                *e = row;
            }
        }
    }
    let socket_of_connection: HashMap<&str, SocketKey> = physical
        .iter()
        .map(|(k, r)| (r.connection_id.as_str(), *k))
        .collect();

    let mut out: HashMap<SocketKey, Vec<(bool, &DmvRow)>> = HashMap::new();
    for (key, row) in &physical {
        out.entry(*key).or_default().push((false, row));
    }
    for row in rows.iter().filter(|r| is_logical(r)) {
        let key = row
            .parent_connection_id
            .as_deref()
            .and_then(|p| socket_of_connection.get(p).copied())
            // A logical row that carries its own address, with a parent not in
            // this snapshot, is still placed by the address rules.
            .or_else(|| socket_of(row, &by_remote).map(|s| s.key));
        if let Some(key) = key {
            out.entry(key).or_default().push((true, row));
        }
    }

    out.into_iter()
        .filter_map(|(key, mut rows)| {
            // Primary first, then MARS sessions by age; requests of one session
            // (duplicated by the LEFT JOIN) after its first row.
            rows.sort_by_key(|(mars, r)| (*mars, r.connect_time_ms, r.session_id));
            let mut sessions: Vec<DmvSession> = Vec::new();
            for (mars, row) in rows {
                if let Some(same) = sessions.iter_mut().find(|s| s.session_id == row.session_id) {
                    // The physical row and a logical row can both name the
                    // first session; a later duplicate may carry the request.
                    if same.request_status.is_none() && row.request_status.is_some() {
                        fill_request(same, row);
                    }
                    continue;
                }
                if let Some(s) = session_of(row, mars) {
                    sessions.push(s);
                }
            }
            (!sessions.is_empty()).then_some((key, sessions))
        })
        .collect()
}

fn is_logical(row: &DmvRow) -> bool {
    row.net_transport.eq_ignore_ascii_case("session") || row.parent_connection_id.is_some()
}

/// The known socket a row's client address and port (and time) point at.
fn socket_of<'a>(
    row: &DmvRow,
    by_remote: &HashMap<(IpAddr, u16), Vec<&'a KnownSocket>>,
) -> Option<&'a KnownSocket> {
    let ip = client_ip(row.client_net_address.as_deref()?)?;
    let port = row.client_tcp_port?;
    by_remote
        .get(&(ip, port))?
        .iter()
        .copied()
        .find(|s| row.local_tcp_port.is_none_or(|p| p == s.local_port) && in_window(row, s))
}

/// Could this row's connection be the one that made the socket?
fn in_window(row: &DmvRow, s: &KnownSocket) -> bool {
    let t = row.connect_time_ms;
    // Began after the socket was already there: a later connection on a reused
    // client port (the old socket closed since the inventory looked).
    if t > s.first_seen_ms + CLOCK_SLACK_MS {
        return false;
    }
    // Began before the socket existed: an earlier connection on the same port,
    // still in a DMV snapshot taken before it closed.
    s.absent_at_ms.is_none_or(|a| t >= a - CLOCK_SLACK_MS)
}

/// SQL Server's `client_net_address`: an IPv4 or IPv6 literal, maybe with an
/// IPv6 zone (`%2`); `<local machine>` and `<named pipe>` are not on TCP.
/// v4-mapped addresses compare as IPv4, as the inventory's do.
pub fn client_ip(addr: &str) -> Option<IpAddr> {
    let addr = addr.trim();
    let addr = addr.split_once('%').map_or(addr, |(a, _zone)| a);
    addr.parse::<IpAddr>().ok().map(|ip| ip.to_canonical())
}

fn session_of(row: &DmvRow, mars: bool) -> Option<DmvSession> {
    // A connection whose session is gone (or not yet made) has nothing to say.
    let login = row.login_name.clone()?;
    let mut s = DmvSession {
        session_id: row.session_id,
        connect_time_ms: row.connect_time_ms,
        mars,
        login,
        program: row.program_name.clone().filter(|p| !p.is_empty()),
        host: row.host_name.clone().filter(|h| !h.is_empty()),
        database: row.database.clone(),
        status: row.session_status.clone().unwrap_or_default(),
        ..Default::default()
    };
    fill_request(&mut s, row);
    Some(s)
}

fn fill_request(s: &mut DmvSession, row: &DmvRow) {
    s.request_status = row.request_status.clone();
    s.command = row.command.clone();
    s.wait_type = row.wait_type.clone().filter(|w| !w.is_empty());
    s.wait_time_ms = row.wait_time_ms.filter(|_| s.wait_type.is_some());
    s.blocking_session_id = row.blocking_session_id.filter(|b| *b != 0);
}

/// Put DMV rows on the sessions they join to (and clear those they no longer
/// do). Returns the sessions whose DMV identity changed: who is on the
/// connection, not what it waits on (that changes at every poll).
pub fn apply_dmv_rows(rows: &[DmvRow], mut sessions: Vec<&mut Session>) -> Vec<Session> {
    let sockets: Vec<KnownSocket> = sessions
        .iter()
        .filter_map(|s| KnownSocket::from_session(s, s.absent_at_ms))
        .collect();
    let mut joined = join(rows, &sockets);
    let mut changed = Vec::new();
    for session in sessions.iter_mut() {
        let fresh = joined.remove(&session.sock_ino).unwrap_or_default();
        let news = !same_people(&fresh, &session.dmv);
        session.dmv = fresh;
        if news {
            changed.push(session.clone());
        }
    }
    changed
}

/// Whether two DMV views of a connection name the same sessions, logins,
/// programs and databases.
fn same_people(a: &[DmvSession], b: &[DmvSession]) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|(x, y)| {
            x.session_id == y.session_id
                && x.connect_time_ms == y.connect_time_ms
                && x.login == y.login
                && x.program == y.program
                && x.database == y.database
        })
}
