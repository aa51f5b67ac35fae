//! The DMV query over TDS.
//!
//! Crate: `tiberius` 0.13 (crates.io, MIT/Apache-2.0, needs Rust 1.88). It is
//! the pure-Rust TDS client with years of production use (Prisma's SQL Server
//! driver), and it is maintained: 0.13 added handshake and command timeouts,
//! which a poller that must never hang needs. Microsoft's `mssql-tds` (mssql-rs) is younger
//! (0.x, API still moving); ODBC-based crates need msodbcsql and unixODBC on
//! the host. Features: `tds73` (SQL Server 2008+ types) and `rustls`, which
//! links no system OpenSSL, so the binary still needs nothing at run time
//! (rustls brings aws-lc-rs, built from source by `cc`). `winauth` and
//! `native-tls` (the defaults) are off: SQL logins only. Tiberius is async;
//! stalltrace is not, so a current-thread tokio runtime drives it on the
//! poller's own thread (poller.rs).

use std::net::SocketAddr;
use std::time::Duration;

use tiberius::{AuthMethod, Client, EncryptionLevel, Row};
use tokio::net::TcpStream;
use tokio::runtime::Runtime;
use tokio_util::compat::{Compat, TokioAsyncWriteCompatExt};

use super::config::{DmvConfig, Encrypt};
use super::join::DmvRow;
use super::{DmvError, DmvSource};

/// Every connection SQL Server has, with its session and current request, in
/// one statement (one consistent-enough picture per poll).
///
/// - `connect_time` is the server's local time: shifted to UTC by the server's
///   own offset now, then to ms since the epoch, so the join can compare it with
///   when stalltrace saw a socket (same host, same clock). A connection made
///   before a daylight-saving change on a non-UTC server is off by that hour.
/// - LEFT JOIN on sessions too: a connection whose session is gone or not yet
///   made still names its socket, so its MARS sessions can be placed.
/// - Integers are cast to int (bigint for the time) because tiberius converts
///   each SQL type to exactly one Rust type.
/// - Needs VIEW SERVER STATE (2022: VIEW SERVER PERFORMANCE STATE); without
///   it the DMVs show only the poller's own session.
pub const QUERY: &str = "\
SELECT CAST(c.session_id AS int) AS session_id,
       CONVERT(char(36), c.connection_id) AS connection_id,
       CONVERT(char(36), c.parent_connection_id) AS parent_connection_id,
       DATEDIFF_BIG(millisecond, '19700101', c.connect_time)
         - DATEDIFF_BIG(millisecond, SYSUTCDATETIME(), SYSDATETIME()) AS connect_time_ms,
       c.net_transport, c.client_net_address,
       CAST(c.client_tcp_port AS int) AS client_tcp_port,
       CAST(c.local_tcp_port AS int) AS local_tcp_port,
       c.encrypt_option,
       s.login_name, s.program_name, s.host_name,
       DB_NAME(s.database_id) AS database_name,
       s.status AS session_status,
       r.status AS request_status, r.command, r.wait_type,
       CAST(r.wait_time AS int) AS wait_time,
       CAST(r.blocking_session_id AS int) AS blocking_session_id
FROM sys.dm_exec_connections AS c
LEFT JOIN sys.dm_exec_sessions AS s ON s.session_id = c.session_id
LEFT JOIN sys.dm_exec_requests AS r ON r.session_id = c.session_id";

/// The poller's own session and the client port SQL Server sees for it.
const OWN_SESSION: &str = "\
SELECT CAST(@@SPID AS int), c.client_net_address, CAST(c.client_tcp_port AS int)
FROM sys.dm_exec_connections AS c
WHERE c.session_id = @@SPID AND c.net_transport <> 'Session'";

/// TCP connect, and TLS plus login after it: SQL Server on the same host
/// answers in milliseconds; longer means it is not there.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// The DMV query reads in-memory views: seconds mean SQL Server is stuck, and
/// the poller would rather report that than wait.
const QUERY_TIMEOUT: Duration = Duration::from_secs(15);
/// SQL Server's "Login failed for user".
const LOGIN_FAILED: u32 = 18456;

type TdsClient = Client<Compat<TcpStream>>;

/// A `DmvSource` over a real TDS connection, connected on first poll and again
/// after any failure.
pub struct TdsDmvSource {
    config: DmvConfig,
    rt: Runtime,
    client: Option<TdsClient>,
    local: Option<SocketAddr>,
}

impl TdsDmvSource {
    pub fn new(config: DmvConfig) -> Result<Self, DmvError> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .build()
            .map_err(|e| DmvError::Setup(format!("cannot start the DMV poller's runtime: {e}")))?;
        Ok(Self {
            config,
            rt,
            client: None,
            local: None,
        })
    }

    /// This end of the connection, once connected.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.local
    }

    /// `@@SPID` of the poller's session, with the client address and port SQL
    /// Server records for it: the live test finds itself with these.
    pub fn own_session(&mut self) -> Result<(u16, Option<String>, Option<u16>), DmvError> {
        let rows = self.run(OWN_SESSION)?;
        let row = rows
            .first()
            .ok_or_else(|| DmvError::Query("no connection row for @@SPID".into()))?;
        let spid = int(row, 0)?
            .and_then(|v| u16::try_from(v).ok())
            .unwrap_or(0);
        Ok((spid, text(row, 1)?, port(row, 2)?))
    }

    fn run(&mut self, sql: &str) -> Result<Vec<Row>, DmvError> {
        if self.client.is_none() {
            let (client, local) = self.rt.block_on(connect(&self.config))?;
            self.client = Some(client);
            self.local = Some(local);
        }
        let client = self.client.as_mut().expect("connected above");
        let result = self.rt.block_on(async {
            match tokio::time::timeout(QUERY_TIMEOUT, async {
                client.simple_query(sql).await?.into_first_result().await
            })
            .await
            {
                Ok(r) => r.map_err(|e| classify(&e, "the DMV query")),
                Err(_) => Err(DmvError::Timeout(format!(
                    "the DMV query took longer than {}s",
                    QUERY_TIMEOUT.as_secs()
                ))),
            }
        });
        if result.is_err() {
            // Whatever state the stream is in, start over on the next poll.
            self.client = None;
            self.local = None;
        }
        result
    }
}

impl DmvSource for TdsDmvSource {
    fn poll(&mut self) -> Result<Vec<DmvRow>, DmvError> {
        self.run(QUERY)?.iter().map(dmv_row).collect()
    }
}

async fn connect(cfg: &DmvConfig) -> Result<(TdsClient, SocketAddr), DmvError> {
    let mut tds = tiberius::Config::new();
    tds.host(&cfg.host);
    tds.port(cfg.port);
    tds.database(&cfg.database);
    tds.application_name("stalltrace");
    tds.authentication(AuthMethod::sql_server(&cfg.user, cfg.password.expose()));
    tds.encryption(match cfg.encrypt {
        Encrypt::Off => EncryptionLevel::Off,
        Encrypt::On => EncryptionLevel::On,
        Encrypt::Required => EncryptionLevel::Required,
    });
    if cfg.trust_server_certificate {
        tds.trust_cert();
    }
    tds.handshake_timeout(Some(CONNECT_TIMEOUT));
    tds.command_timeout(Some(QUERY_TIMEOUT));
    let addr = tds.get_addr();
    let tcp = match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(&addr)).await {
        Ok(Ok(tcp)) => tcp,
        Ok(Err(e)) => return Err(DmvError::Connect(format!("{addr}: {e}"))),
        Err(_) => {
            return Err(DmvError::Connect(format!(
                "{addr}: no answer within {}s",
                CONNECT_TIMEOUT.as_secs()
            )));
        }
    };
    let _ = tcp.set_nodelay(true);
    let local = tcp
        .local_addr()
        .map_err(|e| DmvError::Connect(format!("{addr}: {e}")))?;
    let client = Client::connect(tds, tcp.compat_write())
        .await
        .map_err(|e| classify(&e, &format!("logging in to {addr}")))?;
    Ok((client, local))
}

/// Sort a tiberius error into the kinds the poller reports.
fn classify(e: &tiberius::error::Error, doing: &str) -> DmvError {
    use tiberius::error::Error as E;
    let what = format!("{doing}: {e}");
    match e {
        E::Io {
            kind: std::io::ErrorKind::TimedOut,
            ..
        } => DmvError::Timeout(what),
        E::Io { .. } => DmvError::Connect(what),
        E::Tls(_) => DmvError::Tls(what),
        // The server cannot encrypt (or not as asked): a TLS setting to change.
        E::Protocol(m) if m.contains("encryption") => DmvError::Tls(what),
        E::Server(t) if t.code() == LOGIN_FAILED => DmvError::Login(what),
        E::Routing { .. } => DmvError::Setup(format!(
            "{what} (redirection, as Azure SQL does, is not supported: give the final server)"
        )),
        _ => DmvError::Query(what),
    }
}

fn dmv_row(row: &Row) -> Result<DmvRow, DmvError> {
    Ok(DmvRow {
        session_id: int(row, 0)?
            .and_then(|v| u16::try_from(v).ok())
            .unwrap_or(0),
        connection_id: text(row, 1)?.unwrap_or_default(),
        parent_connection_id: text(row, 2)?,
        connect_time_ms: row
            .try_get::<i64, _>(3)
            .map_err(|e| DmvError::Query(format!("connect_time_ms: {e}")))?
            .unwrap_or(0),
        net_transport: text(row, 4)?.unwrap_or_default(),
        client_net_address: text(row, 5)?,
        client_tcp_port: port(row, 6)?,
        local_tcp_port: port(row, 7)?,
        encrypt_option: text(row, 8)?.unwrap_or_default(),
        login_name: text(row, 9)?,
        program_name: text(row, 10)?,
        host_name: text(row, 11)?,
        database: text(row, 12)?,
        session_status: text(row, 13)?,
        request_status: text(row, 14)?,
        command: text(row, 15)?.map(|c| c.trim_end().to_string()),
        wait_type: text(row, 16)?,
        wait_time_ms: int(row, 17)?,
        blocking_session_id: int(row, 18)?.and_then(|v| i16::try_from(v).ok()),
    })
}

fn text(row: &Row, i: usize) -> Result<Option<String>, DmvError> {
    row.try_get::<&str, _>(i)
        .map(|v| v.map(str::to_string))
        .map_err(|e| DmvError::Query(format!("column {i}: {e}")))
}

fn int(row: &Row, i: usize) -> Result<Option<i32>, DmvError> {
    row.try_get::<i32, _>(i)
        .map_err(|e| DmvError::Query(format!("column {i}: {e}")))
}

fn port(row: &Row, i: usize) -> Result<Option<u16>, DmvError> {
    Ok(int(row, i)?.and_then(|v| u16::try_from(v).ok()))
}

#[cfg(test)]
mod tests {
    use super::super::config::ENV_CONN;
    use super::super::join::{KnownSocket, client_ip, join};
    use super::*;

    /// A config for a port on this host, where no SQL Server runs in tests.
    fn local(port: u16) -> DmvConfig {
        DmvConfig::parse_file(&format!("port = {port}\nuser = u\npassword = p"), "test").unwrap()
    }

    #[test]
    fn a_refused_connection_is_a_connect_error_and_is_retried() {
        // Bind and close: nothing listens on that port any more.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut source = TdsDmvSource::new(local(port)).unwrap();
        for _ in 0..2 {
            let e = source.poll().unwrap_err();
            assert_eq!(e.kind(), "connect", "{e}");
            assert!(e.to_string().contains(&format!("127.0.0.1:{port}")), "{e}");
        }
        assert!(source.local_addr().is_none());
    }

    #[test]
    fn a_server_that_hangs_up_is_a_connect_error() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = std::thread::spawn(move || {
            // Accept the one connection and close it before any prelogin reply.
            drop(listener.accept());
        });
        let e = TdsDmvSource::new(local(port)).unwrap().poll().unwrap_err();
        server.join().unwrap();
        assert!(matches!(e, DmvError::Connect(_)), "{e:?}");
        assert!(!e.to_string().contains("password"), "{e}");
    }

    /// Against a real SQL Server, only when one is named in the environment:
    /// none can be installed on the build machines.
    #[test]
    fn live_poll_finds_its_own_session() {
        if std::env::var_os(ENV_CONN).is_none() {
            println!(
                "skipped: set {ENV_CONN}='Server=tcp:HOST,1433;User Id=...;Password=...;TrustServerCertificate=true' to run against a real SQL Server"
            );
            return;
        }
        let config = DmvConfig::from_env().unwrap_or_else(|e| panic!("{e}"));
        let mut source = TdsDmvSource::new(config.clone()).unwrap();
        let rows = source.poll().unwrap_or_else(|e| panic!("{e}"));
        let (spid, addr, port) = source.own_session().unwrap_or_else(|e| panic!("{e}"));
        assert!(spid > 0);
        let mine = rows
            .iter()
            .find(|r| r.session_id == spid && r.net_transport != "Session")
            .unwrap_or_else(|| panic!("session {spid} not among {} rows", rows.len()));
        assert_eq!(mine.client_tcp_port, port);
        assert_eq!(mine.login_name.as_deref(), Some(config.user.as_str()));
        assert_eq!(mine.program_name.as_deref(), Some("stalltrace"));
        // The join finds it on the socket SQL Server sees (which is this
        // end unless a NAT, such as a container port mapping, sits between).
        let now = chrono::Utc::now().timestamp_millis();
        let remote = SocketAddr::new(client_ip(addr.as_deref().unwrap()).unwrap(), port.unwrap());
        let socket = KnownSocket {
            key: 1,
            remote,
            local_port: mine.local_tcp_port.unwrap(),
            first_seen_ms: now,
            absent_at_ms: None,
        };
        let joined = join(&rows, &[socket]);
        assert_eq!(joined[&1][0].session_id, spid);
        assert!(source.local_addr().is_some());
        println!(
            "live: session {spid} from {remote} (this end {:?}), {} rows",
            source.local_addr(),
            rows.len()
        );
    }
}
