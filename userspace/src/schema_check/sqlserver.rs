//! The sqlserver family's records, `sql_instance` and `sql_session`, as
//! discovery writes them, and `sql_requests`.

use crate::records::Examples;
use crate::records::sql::SqlInstanceRecord;
use crate::records::sql::{
    DmvSession, FileSummary, Instance, Session, SessionEvent, SessionKind, SpidSource,
    SqlSessionRecord, TlsSpids, TlsSpidsState,
};
use crate::records::sql_requests::{
    RequestCounts, SessionRequests, SlowRequest, SqlRequestsRecord,
};

/// When the examples' sessions and requests were first seen.
const EXAMPLE_TS: &str = "2026-12-04T10:00:00.000000Z";

/// An instance with its watchdog, one without, and one too long for a line.
impl Examples for SqlInstanceRecord {
    fn examples() -> Vec<Self> {
        let mut all = Vec::new();
        let instance = Instance {
            pid: 4242,
            watchdog_pid: Some(4240),
            netns: 4026531840,
            tds_ports: vec![1433],
            ag_ports: vec![5022],
            files: vec![
                FileSummary {
                    path: "/var/opt/mssql/data/sales.mdf".into(),
                    role: "data".into(),
                    disks: vec!["259:0".into()],
                    overlay: None,
                },
                // In a container's root rather than on a volume.
                FileSummary {
                    path: "/var/opt/mssql/log/sales_log.ldf".into(),
                    role: "log".into(),
                    disks: vec!["254:0".into()],
                    overlay: Some(crate::records::sql::OverlayFile {
                        upper_dir: Some("/var/lib/containers/storage/overlay/0f3e/diff".into()),
                    }),
                },
            ],
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
            container: None,
        };
        all.push(instance.clone());
        // No watchdog; a statically linked TLS; in a Kubernetes pod.
        let orphan = Instance {
            watchdog_pid: None,
            container: Some(super::tcp::in_a_pod()),
            tls: Some(TlsSpids::unavailable(None, "it maps no libssl.so".into())),
            ..instance.clone()
        };
        all.push(orphan);
        for state in [TlsSpidsState::Disabled, TlsSpidsState::Off] {
            let tls = TlsSpids {
                state,
                ..TlsSpids::off()
            };
            let instance = Instance {
                tls: Some(tls),
                ..instance.clone()
            };
            all.push(instance);
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
                    overlay: None,
                })
                .collect(),
            ..instance.clone()
        };
        all.push(many_files);
        all
    }
}

/// A client session as it opens, then identified (SPID and DMV).
impl Examples for SqlSessionRecord {
    fn examples() -> Vec<Self> {
        let mut all = Vec::new();
        let ts = EXAMPLE_TS;
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
            mars: false,
            dmv: Vec::new(),
            absent_at_ms: None,
        };
        let open = SqlSessionRecord {
            event: SessionEvent::Open,
            session: session.clone(),
        };
        all.push(open);
        // Encrypted, its SPID read in the TLS plaintext.
        let tls = SqlSessionRecord {
            event: SessionEvent::Identified,
            session: Session {
                spid: Some(58),
                spid_source: Some(SpidSource::TlsPlaintext),
                encrypted: true,
                mars: true,
                ..session.clone()
            },
        };
        all.push(tls);
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
        all.push(identified);
        all
    }
}

/// An interval of 4 sessions, one of them hit by a retransmission timeout; and
/// one of login exchanges only.
impl Examples for SqlRequestsRecord {
    fn examples() -> Vec<Self> {
        let mut all = Vec::new();
        let ts = EXAMPLE_TS;
        let us = |values: &[(u64, u64)]| {
            let mut h = crate::hist::Histogram::default();
            for &(v, n) in values {
                h.record(v * 1000, n);
            }
            h.to_record(1e-3)
        };
        let slow = SlowRequest {
            arrived: ts.to_string(),
            total_us: 212_480,
            server_us: 310,
            delivery_us: 212_170,
            retransmits: 1,
            response_bytes: 61,
        };
        let session = SessionRequests {
            spid: 53,
            client: Some("10.1.2.4:50123".parse().unwrap()),
            requests: 50,
            retransmitted: 1,
            slow: 1,
            slowest: slow.clone(),
        };
        let record = SqlRequestsRecord {
            interval_ms: 1000,
            pid: 4242,
            counts: RequestCounts {
                requests: 200,
                retransmitted: 1,
                slow: 1,
                slow_retransmitted: 1,
                slow_ms: 200,
                without_spid: 0,
            },
            total_us: us(&[(420, 199), (212_480, 1)]),
            server_us: us(&[(310, 200)]),
            delivery_us: us(&[(110, 199), (212_170, 1)]),
            sessions: 4,
            mars_sessions: 2,
            // A session whose client discovery had not seen.
            by_session: vec![
                session.clone(),
                SessionRequests {
                    spid: 54,
                    client: None,
                    retransmitted: 0,
                    slow: 0,
                    slowest: SlowRequest {
                        total_us: 650,
                        server_us: 520,
                        delivery_us: 130,
                        retransmits: 0,
                        ..slow
                    },
                    ..session
                },
            ],
        };
        all.push(record.clone());
        let logins = SqlRequestsRecord {
            counts: RequestCounts {
                without_spid: 6,
                slow_ms: 200,
                ..RequestCounts::default()
            },
            total_us: us(&[]),
            server_us: us(&[]),
            delivery_us: us(&[]),
            sessions: 0,
            mars_sessions: 0,
            by_session: Vec::new(),
            ..record
        };
        all.push(logins);
        all
    }
}
