//! `sqlservr`: a watchdog that starts a worker of the same name, which keeps
//! O_DIRECT data and log files open and answers TDS clients. See README.md.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Parser;
use stalltrace_sim::server::{ServerConfig, TlsConfig, run_worker};
use stalltrace_sim::tls::{BioStyle, keylog_from_env};
use stalltrace_sim::watchdog::{is_worker, run_watchdog};

/// SQL Server on Linux's kernel-visible footprint: a watchdog parent and a
/// worker child, both `sqlservr`; the worker listens for TDS (with TLS as SQL
/// Server does it) and does O_DIRECT I/O on a .mdf and an .ldf file for every
/// statement.
#[derive(Parser, Debug)]
#[command(name = "sqlservr", version)]
struct Args {
    /// Address and port of the TDS listener (port 0: any free port, printed at start)
    #[arg(long, default_value = "0.0.0.0:1433")]
    listen: SocketAddr,
    /// Data file, created at start (name ending .mdf or .ndf)
    #[arg(long)]
    data: PathBuf,
    /// Log file, created at start (name ending .ldf)
    #[arg(long)]
    log: PathBuf,
    /// Size of the data file in MiB
    #[arg(long, default_value_t = 64)]
    data_size_mb: u64,
    /// Size of the log file in MiB
    #[arg(long, default_value_t = 32)]
    log_size_mb: u64,
    /// Database name sessions are put in (ENVCHANGE after LOGIN7)
    #[arg(long, default_value = "stalltrace")]
    database: String,
    /// Seconds between checkpoint bursts (random data-page writes + fdatasync); 0 = none
    #[arg(long, default_value_t = 0)]
    checkpoint_secs: u64,
    /// Data pages written by each checkpoint burst
    #[arg(long, default_value_t = 256)]
    checkpoint_pages: usize,
    /// The watchdog starts the worker again when it dies of a signal it did
    /// not pass on (a crash, SIGKILL); with port 0 the new worker gets a new port
    #[arg(long)]
    restart_worker: bool,
    /// No TLS: answer every PRELOGIN with ENCRYPT_NOT_SUP (the whole session,
    /// login included, in cleartext)
    #[arg(long, conflicts_with_all = ["force_encryption", "tls_bio"])]
    no_tls: bool,
    /// SQL Server's Force Encryption: encrypt every session whatever the
    /// client asks, and refuse a client that cannot encrypt
    #[arg(long)]
    force_encryption: bool,
    /// How a TDS message is handed to libssl after the handshake: memory
    /// (SSL_write_ex into a memory BIO, then write() by this thread) or
    /// socket (SSL_write on an OpenSSL socket BIO, which sends)
    #[arg(long, value_enum)]
    tls_bio: Option<BioStyle>,
    /// Write the self-signed certificate (PEM) to this file at start, for
    /// clients that must trust it by name (ODBC's ServerCertificate=, which
    /// Encrypt=strict needs)
    #[arg(long, conflicts_with = "no_tls")]
    certificate_out: Option<PathBuf>,
}

fn has_ext(p: &Path, exts: &[&str]) -> bool {
    p.extension()
        .is_some_and(|e| exts.iter().any(|x| e.eq_ignore_ascii_case(x)))
}

fn main() -> ExitCode {
    let args = Args::parse();
    // The tracer tells data from log by extension, as SQL Server's own
    // conventions do; refuse names it could not classify.
    let problem = if !has_ext(&args.data, &["mdf", "ndf"]) {
        Some(format!(
            "--data {}: the name must end in .mdf or .ndf",
            args.data.display()
        ))
    } else if !has_ext(&args.log, &["ldf"]) {
        Some(format!(
            "--log {}: the name must end in .ldf",
            args.log.display()
        ))
    } else if args.data_size_mb == 0 || args.log_size_mb == 0 {
        Some("--data-size-mb and --log-size-mb must be at least 1".into())
    } else {
        None
    };
    if let Some(p) = problem {
        eprintln!("sqlservr: {p}");
        return ExitCode::from(2);
    }
    if !is_worker() {
        return match run_watchdog(args.restart_worker) {
            Ok(code) => ExitCode::from(code.clamp(0, 255) as u8),
            Err(e) => {
                eprintln!("sqlservr: {e:#}");
                ExitCode::FAILURE
            }
        };
    }
    let cfg = ServerConfig {
        listen: args.listen,
        data: args.data,
        log: args.log,
        data_bytes: args.data_size_mb << 20,
        log_bytes: args.log_size_mb << 20,
        database: args.database,
        checkpoint_secs: args.checkpoint_secs,
        checkpoint_pages: args.checkpoint_pages,
        tls: (!args.no_tls).then(|| TlsConfig {
            bio: args.tls_bio.unwrap_or(BioStyle::Memory),
            force_encryption: args.force_encryption,
            // For tests only: every session's secrets, so tshark can decrypt.
            keylog: keylog_from_env(),
            certificate_out: args.certificate_out,
        }),
    };
    match run_worker(&cfg) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sqlservr: {e:#}");
            ExitCode::FAILURE
        }
    }
}
