//! The sqlserver family's records, `sql_instance` and `sql_session`, as
//! discovery writes them.

use crate::output::JsonWriter;
use crate::records::sql::{
    DmvSession, FileSummary, Instance, Session, SessionEvent, SessionKind, SpidSource,
    SqlSessionRecord, TlsSpids, TlsSpidsState,
};

/// An instance with its watchdog, one without, and one too long for a line.
pub(super) fn sql_instance(w: &mut JsonWriter, ts: &str) {
    let instance = Instance {
        pid: 4242,
        watchdog_pid: Some(4240),
        netns: 4026531840,
        tds_ports: vec![1433],
        ag_ports: vec![5022],
        files: vec![FileSummary {
            path: "/var/opt/mssql/data/sales.mdf".into(),
            role: "data".into(),
            disks: vec!["259:0".into()],
        }],
        disk_roles: [
            ("259:0".to_string(), "data".to_string()),
            ("259:1".to_string(), "mixed".to_string()),
        ]
        .into_iter()
        .collect(),
        tls: Some(TlsSpids::available(
            std::path::Path::new("/usr/lib/x86_64-linux-gnu/libssl.so.3"),
            &["SSL_write", "SSL_write_ex"],
        )),
    };
    w.emit(ts, &instance).unwrap();
    // No watchdog; a statically linked TLS.
    let orphan = Instance {
        watchdog_pid: None,
        tls: Some(TlsSpids::unavailable(None, "it maps no libssl.so".into())),
        ..instance.clone()
    };
    w.emit(ts, &orphan).unwrap();
    for state in [TlsSpidsState::Disabled, TlsSpidsState::Off] {
        let tls = TlsSpids {
            state,
            ..TlsSpids::off()
        };
        let instance = Instance {
            tls: Some(tls),
            ..instance.clone()
        };
        w.emit(ts, &instance).unwrap();
    }
    // An instance of 150 databases: longer than a line, written in parts;
    // from a stalltrace that did not say its TLS.
    let many_files = Instance {
        tls: None,
        files: (0..300)
            .map(|i| FileSummary {
                path: format!("/var/opt/mssql/data/tenant_{i:04}.mdf").into(),
                role: "data".into(),
                disks: vec!["259:0".into()],
            })
            .collect(),
        ..instance.clone()
    };
    w.emit(ts, &many_files).unwrap();
}

/// A client session as it opens, then identified (SPID and DMV).
pub(super) fn sql_session(w: &mut JsonWriter, ts: &str) {
    let mut session = Session {
        pid: 4242,
        netns: 4026531840,
        kind: SessionKind::Client,
        local: "10.1.2.3:1433".parse().unwrap(),
        remote: "10.1.2.4:50123".parse().unwrap(),
        sock_ino: 912_345,
        first_seen: ts.to_string(),
        spid: None,
        spid_source: None,
        encrypted: false,
        dmv: Vec::new(),
        absent_at_ms: None,
    };
    let open = SqlSessionRecord {
        event: SessionEvent::Open,
        session: session.clone(),
    };
    w.emit(ts, &open).unwrap();
    // Encrypted, its SPID read in the TLS plaintext.
    let tls = SqlSessionRecord {
        event: SessionEvent::Identified,
        session: Session {
            spid: Some(58),
            spid_source: Some(SpidSource::TlsPlaintext),
            encrypted: true,
            ..session.clone()
        },
    };
    w.emit(ts, &tls).unwrap();
    session.spid = Some(57);
    session.spid_source = Some(SpidSource::TdsHeader);
    // With DMV enrichment: the connection's session and a MARS one.
    session.dmv = vec![
        DmvSession {
            session_id: 57,
            connect_time_ms: 1_760_000_000_000,
            login: "app_user".into(),
            program: Some("OrderService".into()),
            host: Some("app01".into()),
            database: Some("sales".into()),
            status: "running".into(),
            request_status: Some("suspended".into()),
            command: Some("SELECT".into()),
            wait_type: Some("ASYNC_NETWORK_IO".into()),
            wait_time_ms: Some(12),
            blocking_session_id: Some(0),
            ..Default::default()
        },
        DmvSession {
            session_id: 61,
            connect_time_ms: 1_760_000_000_500,
            mars: true,
            login: "app_user".into(),
            status: "sleeping".into(),
            ..Default::default()
        },
    ];
    let identified = SqlSessionRecord {
        event: SessionEvent::Identified,
        session,
    };
    w.emit(ts, &identified).unwrap();
}
