//! `sqlclient`: N TDS sessions sending SQL batches at a set total rate; prints
//! one JSON line with latency percentiles and each session's SPID (from the
//! LOGINACK header and from `SELECT @@SPID`), port and encryption.

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use stalltrace_sim::client::{ClientConfig, Encrypt, run};

/// Drives a TDS server (the simulator's sqlservr) with SQL batches and reports
/// per-transaction latency as one JSON line on stdout.
#[derive(Parser, Debug)]
#[command(name = "sqlclient", version)]
struct Args {
    /// Server address, ADDR:PORT
    #[arg(long)]
    server: String,
    /// Concurrent sessions (TDS connections)
    #[arg(long, default_value_t = 1)]
    sessions: usize,
    /// Total transactions per second over all sessions (0 = unpaced)
    #[arg(long, default_value_t = 100.0)]
    rate: f64,
    /// Seconds to send for
    #[arg(long, default_value_t = 10.0)]
    duration: f64,
    /// Text of each SQL batch
    #[arg(long, default_value = "SELECT 1")]
    batch_sql: String,
    /// Login name sent in LOGIN7
    #[arg(long, default_value = "stalltrace")]
    user: String,
    /// Application name sent in LOGIN7 (program_name in SQL Server's DMVs)
    #[arg(long, default_value = "stalltrace-sqlclient")]
    app: String,
    /// Database asked for in LOGIN7
    #[arg(long, default_value = "stalltrace")]
    database: String,
    /// Seconds to wait for a connect, a write or a whole response
    #[arg(long, default_value_t = 30.0)]
    timeout: f64,
    /// TDS packet size asked for in LOGIN7
    #[arg(long, default_value_t = 4096)]
    packet_size: u32,
    /// Encryption asked for, as ODBC's Encrypt= (no certificate check, as
    /// TrustServerCertificate=yes): not-supported (no TLS), off (TLS for the
    /// login only), on (the whole session), strict (TDS 8.0: TLS first)
    #[arg(long, value_enum, default_value_t = Encrypt::NotSupported)]
    encrypt: Encrypt,
    /// MARS: every request on two logical sessions of its connection at
    /// once (`SELECT @@SPID` too, not the login): two requests in flight
    #[arg(long)]
    mars: bool,
    /// Milliseconds each session waits after its login before its first
    /// request, as a pooled connection opened ahead of use does
    #[arg(long, default_value_t = 0)]
    idle_after_login_ms: u64,
}

fn main() -> ExitCode {
    let a = Args::parse();
    if !(a.duration > 0.0 && a.duration.is_finite() && a.timeout > 0.0 && a.timeout.is_finite()) {
        eprintln!("sqlclient: --duration and --timeout must be positive numbers of seconds");
        return ExitCode::from(2);
    }
    // The password comes from the environment, never argv (it shows in ps).
    let password = std::env::var("SQLCLIENT_PASSWORD").unwrap_or_default();
    let cfg = ClientConfig {
        server: a.server,
        sessions: a.sessions,
        rate: a.rate,
        duration: Duration::from_secs_f64(a.duration),
        sql: a.batch_sql,
        user: a.user,
        password,
        app: a.app,
        database: a.database,
        timeout: Duration::from_secs_f64(a.timeout),
        packet_size: a.packet_size,
        encrypt: a.encrypt,
        mars: a.mars,
        idle_after_login: Duration::from_millis(a.idle_after_login_ms),
    };
    match run(&cfg) {
        Ok(report) => {
            println!(
                "{}",
                serde_json::to_string(&report).expect("report serialises")
            );
            // Nothing got through at all: say so in the exit code too.
            if report.transactions == 0 {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            }
        }
        Err(e) => {
            eprintln!("sqlclient: {e:#}");
            ExitCode::from(2)
        }
    }
}
