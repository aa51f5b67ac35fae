//! The join on recorded row sets: what SQL Server's DMVs return for plain
//! sessions, MARS, reused session ids and ports, and the address forms.

use std::net::SocketAddr;

use super::join::*;
use crate::records::sql::SqlTag;
use crate::sqlserver::inventory::{Session, SessionKind};

/// 2025-10-09T08:53:20Z: any fixed time will do.
const T: i64 = 1_760_000_000_000;
const SEC: i64 = 1_000;

fn sock(key: SocketKey, remote: &str, first_seen_ms: i64) -> KnownSocket {
    KnownSocket {
        key,
        remote: remote.parse().unwrap(),
        local_port: 1433,
        first_seen_ms,
        absent_at_ms: None,
    }
}

/// A physical TCP connection row with its session.
fn tcp(session_id: u16, conn: &str, addr: &str, port: u16, connect_time_ms: i64) -> DmvRow {
    DmvRow {
        session_id,
        connection_id: conn.into(),
        parent_connection_id: None,
        connect_time_ms,
        net_transport: "TCP".into(),
        client_net_address: Some(addr.into()),
        client_tcp_port: Some(port),
        local_tcp_port: Some(1433),
        encrypt_option: "FALSE".into(),
        login_name: Some("app".into()),
        program_name: Some("Microsoft SqlClient Data Provider".into()),
        host_name: Some("web1".into()),
        database: Some("sales".into()),
        session_status: Some("sleeping".into()),
        ..Default::default()
    }
}

/// A MARS logical session row on `parent`, as SQL Server shows it: no port.
fn mars(session_id: u16, conn: &str, parent: &str, connect_time_ms: i64) -> DmvRow {
    DmvRow {
        parent_connection_id: Some(parent.into()),
        net_transport: "Session".into(),
        client_tcp_port: None,
        local_tcp_port: None,
        ..tcp(session_id, conn, "10.0.0.7", 0, connect_time_ms)
    }
}

fn ids(sessions: &[DmvSession]) -> Vec<(u16, bool)> {
    sessions.iter().map(|s| (s.session_id, s.mars)).collect()
}

#[test]
fn plain_sessions_land_on_their_sockets() {
    let mut busy = tcp(53, "C2", "10.0.0.8", 50002, T - 60 * SEC);
    busy.session_status = Some("running".into());
    busy.request_status = Some("suspended".into());
    busy.command = Some("SELECT".into());
    busy.wait_type = Some("PAGEIOLATCH_SH".into());
    busy.wait_time_ms = Some(180);
    busy.blocking_session_id = Some(0);
    let rows = vec![tcp(52, "C1", "10.0.0.7", 50001, T - 90 * SEC), busy];
    let sockets = vec![sock(1, "10.0.0.7:50001", T), sock(2, "10.0.0.8:50002", T)];
    let j = join(&rows, &sockets);
    assert_eq!(j.len(), 2);
    let s1 = &j[&1][0];
    assert_eq!(
        (s1.session_id, s1.login.as_str(), s1.database.as_deref()),
        (52, "app", Some("sales"))
    );
    assert_eq!(s1.host.as_deref(), Some("web1"));
    assert_eq!(s1.wait_type, None);
    let s2 = &j[&2][0];
    assert_eq!(s2.session_id, 53);
    assert_eq!(s2.status, "running");
    assert_eq!(s2.command.as_deref(), Some("SELECT"));
    assert_eq!(s2.wait_type.as_deref(), Some("PAGEIOLATCH_SH"));
    assert_eq!(s2.wait_time_ms, Some(180));
    assert_eq!(s2.blocking_session_id, None, "0 means not blocked");
    assert_eq!(s2.connect_time_ms, T - 60 * SEC);
}

#[test]
fn mars_puts_three_sessions_on_one_socket_primary_first() {
    let mut child = mars(61, "L2", "P", T - 10 * SEC);
    child.wait_type = Some("LCK_M_X".into());
    child.request_status = Some("suspended".into());
    child.blocking_session_id = Some(58);
    let rows = vec![
        // Logical rows may come before their parent.
        child,
        mars(60, "L1", "P", T - 20 * SEC),
        tcp(58, "P", "10.0.0.7", 50100, T - 30 * SEC),
        // The first session can also show as a logical row of its own.
        mars(58, "L0", "P", T - 30 * SEC),
    ];
    let j = join(&rows, &[sock(9, "10.0.0.7:50100", T)]);
    assert_eq!(ids(&j[&9]), vec![(58, false), (60, true), (61, true)]);
    let blocked = &j[&9][2];
    assert_eq!(blocked.wait_type.as_deref(), Some("LCK_M_X"));
    assert_eq!(blocked.blocking_session_id, Some(58));
}

#[test]
fn mars_children_of_an_unknown_connection_stay_unplaced() {
    let rows = vec![
        tcp(58, "P", "10.0.0.7", 50100, T - 30 * SEC),
        mars(60, "L1", "P", T - 20 * SEC),
        mars(70, "L9", "GONE", T - 20 * SEC),
    ];
    let j = join(&rows, &[sock(9, "10.0.0.7:50100", T)]);
    assert_eq!(ids(&j[&9]), vec![(58, false), (60, true)]);
}

#[test]
fn a_reused_session_id_follows_the_new_connection() {
    // Session 55 ended on port 50001; SQL Server gave 55 to a new connection
    // from port 50002. The inventory still lists the old socket.
    let old = sock(1, "10.0.0.7:50001", T);
    let new = sock(2, "10.0.0.7:50002", T + 40 * SEC);
    let before = vec![tcp(55, "A", "10.0.0.7", 50001, T - 5 * SEC)];
    let after = vec![tcp(55, "B", "10.0.0.7", 50002, T + 39 * SEC)];

    let j = join(&before, std::slice::from_ref(&old));
    assert_eq!(j[&1][0].connect_time_ms, T - 5 * SEC);

    let j = join(&after, &[old, new]);
    assert!(
        !j.contains_key(&1),
        "the old socket keeps nothing of the new 55"
    );
    let s = &j[&2][0];
    assert_eq!((s.session_id, s.connect_time_ms), (55, T + 39 * SEC));
}

#[test]
fn a_connection_younger_than_the_socket_is_not_its() {
    // The client reused port 50001 after stalltrace saw the first socket; the
    // inventory has not refreshed yet, the DMVs already show the newcomer.
    let rows = vec![tcp(55, "B", "10.0.0.7", 50001, T + 30 * SEC)];
    assert!(join(&rows, &[sock(1, "10.0.0.7:50001", T)]).is_empty());
    // Within the clock slack it still matches: first_seen is stamped after
    // the connect.
    let rows = vec![tcp(55, "B", "10.0.0.7", 50001, T + SEC)];
    assert_eq!(join(&rows, &[sock(1, "10.0.0.7:50001", T)]).len(), 1);
}

#[test]
fn a_snapshot_older_than_the_socket_is_not_its() {
    // A new socket on a reused port, absent at T+19 s and seen at T+20 s; the
    // latest snapshot still shows the old connection on that port.
    let mut s = sock(3, "10.0.0.7:50001", T + 20 * SEC);
    s.absent_at_ms = Some(T + 19 * SEC);
    let stale = vec![tcp(55, "A", "10.0.0.7", 50001, T - 5 * SEC)];
    assert!(join(&stale, std::slice::from_ref(&s)).is_empty());
    let fresh = vec![tcp(57, "C", "10.0.0.7", 50001, T + 19 * SEC + 500)];
    assert_eq!(join(&fresh, &[s])[&3][0].session_id, 57);
}

#[test]
fn of_two_connections_on_one_tuple_the_later_wins() {
    let rows = vec![
        tcp(55, "A", "10.0.0.7", 50001, T - 50 * SEC),
        tcp(56, "B", "10.0.0.7", 50001, T - 2 * SEC),
    ];
    let j = join(&rows, &[sock(1, "10.0.0.7:50001", T)]);
    assert_eq!(ids(&j[&1]), vec![(56, false)]);
}

#[test]
fn sessions_without_a_known_socket_are_left_out() {
    let mut shm = tcp(51, "S", "<local machine>", 0, T - SEC);
    shm.net_transport = "Shared memory".into();
    shm.client_tcp_port = None;
    let mut pipe = tcp(54, "N", "<named pipe>", 0, T - SEC);
    pipe.net_transport = "Named pipe".into();
    pipe.client_tcp_port = None;
    let rows = vec![
        shm,
        pipe,
        tcp(52, "C1", "10.0.0.7", 50001, T - SEC),
        // A port the inventory does not know (e.g. opened after its refresh).
        tcp(53, "C2", "10.0.0.7", 50003, T - SEC),
        // The right client, but another instance's listener.
        DmvRow {
            local_tcp_port: Some(1434),
            ..tcp(56, "C3", "10.0.0.9", 50004, T - SEC)
        },
    ];
    let sockets = vec![sock(1, "10.0.0.7:50001", T), sock(4, "10.0.0.9:50004", T)];
    let j = join(&rows, &sockets);
    assert_eq!(j.len(), 1);
    assert_eq!(ids(&j[&1]), vec![(52, false)]);
}

#[test]
fn a_connection_without_a_session_names_nobody() {
    let mut row = tcp(0, "C", "10.0.0.7", 50001, T - SEC);
    row.login_name = None;
    assert!(join(&[row], &[sock(1, "10.0.0.7:50001", T)]).is_empty());
}

#[test]
fn ipv6_and_v4_mapped_addresses_match() {
    let rows = vec![
        tcp(60, "A", "2001:db8::5", 50010, T - SEC),
        tcp(61, "B", "fe80::1%2", 50011, T - SEC),
        // SQL Server prints IPv4 clients of its dual-stack listener as IPv4;
        // the kernel (tcp6 table) shows them v4-mapped.
        tcp(62, "C", "10.0.0.7", 50012, T - SEC),
        // And the other way round.
        tcp(63, "D", "::ffff:10.0.0.8", 50013, T - SEC),
    ];
    let sockets = vec![
        sock(1, "[2001:db8::5]:50010", T),
        sock(2, "[fe80::1]:50011", T),
        sock(3, "[::ffff:10.0.0.7]:50012", T),
        sock(4, "10.0.0.8:50013", T),
    ];
    let j = join(&rows, &sockets);
    let got: Vec<u16> = (1..=4).map(|k| j[&k][0].session_id).collect();
    assert_eq!(got, vec![60, 61, 62, 63]);
}

#[test]
fn client_addresses_parse_as_sql_server_prints_them() {
    assert_eq!(client_ip("10.1.2.3"), Some("10.1.2.3".parse().unwrap()));
    assert_eq!(
        client_ip("::ffff:10.1.2.3"),
        Some("10.1.2.3".parse().unwrap())
    );
    assert_eq!(client_ip("fe80::1%eth0"), Some("fe80::1".parse().unwrap()));
    assert_eq!(client_ip("<local machine>"), None);
    assert_eq!(client_ip(""), None);
}

#[test]
fn a_socket_from_the_inventory() {
    use crate::sqlserver::inventory::{Session, SessionKind};
    let s = Session {
        pid: 10,
        netns: 1,
        kind: SessionKind::Client,
        local: "10.0.0.1:1433".parse().unwrap(),
        remote: "10.0.0.7:50001".parse().unwrap(),
        sock_ino: 777,
        first_seen: "2025-10-09T08:53:20.250000Z".into(),
        spid: None,
        spid_source: None,
        encrypted: false,
        mars: false,
        dmv: Vec::new(),
        absent_at_ms: None,
    };
    let k = KnownSocket::from_session(&s, Some(T - SEC)).unwrap();
    assert_eq!((k.key, k.local_port), (777, 1433));
    assert_eq!(k.first_seen_ms, T + 250);
    assert_eq!(k.absent_at_ms, Some(T - SEC));
}

fn session(ino: u64, client_port: u16) -> Session {
    Session {
        pid: 10,
        netns: 1,
        kind: SessionKind::Client,
        local: "10.0.0.1:1433".parse().unwrap(),
        remote: SocketAddr::new("10.0.0.7".parse().unwrap(), client_port),
        sock_ino: ino,
        first_seen: "2025-10-09T08:53:20.000000Z".into(),
        spid: None,
        spid_source: None,
        encrypted: true,
        mars: false,
        dmv: Vec::new(),
        absent_at_ms: None,
    }
}

fn row(spid: u16, client_port: u16, wait: &str) -> DmvRow {
    DmvRow {
        session_id: spid,
        connection_id: format!("C{spid}"),
        connect_time_ms: 1_760_000_000_000 - 60_000,
        net_transport: "TCP".into(),
        client_net_address: Some("10.0.0.7".into()),
        client_tcp_port: Some(client_port),
        local_tcp_port: Some(1433),
        encrypt_option: "TRUE".into(),
        login_name: Some("app".into()),
        program_name: Some("OrderService".into()),
        database: Some("sales".into()),
        session_status: Some("running".into()),
        wait_type: Some(wait.into()),
        ..Default::default()
    }
}

#[test]
fn dmv_rows_name_encrypted_sessions_and_only_identity_is_news() {
    let (mut a, mut b) = (session(1, 50001), session(2, 50002));
    let changed = apply_dmv_rows(&[row(57, 50001, "WRITELOG")], vec![&mut a, &mut b]);
    assert_eq!(changed.len(), 1, "only the joined session changed");
    // An encrypted session's SPID and login come from the DMVs.
    let tag = SqlTag::for_session(&a);
    assert_eq!(tag.spid, Some(57));
    assert_eq!(tag.login.as_deref(), Some("app"));
    assert_eq!(tag.wait_type.as_deref(), Some("WRITELOG"));
    assert_eq!(SqlTag::for_session(&b).spid, None);

    // A new wait is not news; the tag follows it all the same.
    let changed = apply_dmv_rows(&[row(57, 50001, "ASYNC_NETWORK_IO")], vec![&mut a]);
    assert!(changed.is_empty());
    assert_eq!(
        SqlTag::for_session(&a).wait_type.as_deref(),
        Some("ASYNC_NETWORK_IO")
    );

    // The connection gone from the DMVs: its DMV fields go too, and that is news.
    let changed = apply_dmv_rows(&[], vec![&mut a]);
    assert_eq!(changed.len(), 1);
    assert!(a.dmv.is_empty());
}
