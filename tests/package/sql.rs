//! A SQL Server in the package test's guest, whose sessions meet loss: what
//! `investigate --last` must find again in the service's own files.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::Value;
use stalltrace_lab::sql::ClientReport;
use stalltrace_lab::systemd_guest::SystemdGuest;

use crate::common::Bins;
use crate::guest::records_of;

/// The statically linked simulator `cargo xtask test` builds (the guest's
/// Debian need not have the host's libssl), or None (locally: the part that
/// needs it says it skipped) when STALLTRACE_SQLSERVR_STATIC is not set.
/// Under CI it fails instead.
pub fn static_sqlservr() -> Option<PathBuf> {
    match std::env::var_os("STALLTRACE_SQLSERVR_STATIC") {
        Some(path) => Some(PathBuf::from(path)),
        None => {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "STALLTRACE_SQLSERVR_STATIC is not set: run the suite with `cargo xtask test` \
                 (CI never skips this part)"
            );
            eprintln!("SKIPPED the SQL Server part: STALLTRACE_SQLSERVR_STATIC not set");
            None
        }
    }
}

/// The loss on the guest's loopback, both ways on the server's port.
const LOSS_PERCENT: u8 = 10;
const SESSIONS: u32 = 4;
const SECS: u32 = 12;

/// Start the simulator in the guest as a transient unit (so the service's
/// discovery sees a sqlservr of the guest's own), wait until the service has
/// found it, then run cleartext sessions from this host in the guest's
/// network namespace under loss. Returns each session's client port and the
/// SPID its `SELECT @@SPID` answered.
pub fn sessions_under_loss(guest: &SystemdGuest, sqlservr: &Path, log: &Path) -> Vec<(u16, u16)> {
    std::fs::copy(sqlservr, guest.path("/usr/local/bin/sqlservr")).unwrap();
    let port = stalltrace_lab::prometheus::free_port();
    let listen = format!("0.0.0.0:{port}");
    guest.sh(&["mkdir", "-p", "/var/opt/mssql/data"]);
    guest.sh(&[
        "systemd-run",
        "--unit=sim-sqlservr",
        "/usr/local/bin/sqlservr",
        "--listen",
        &listen,
        "--data",
        "/var/opt/mssql/data/sales.mdf",
        "--log",
        "/var/opt/mssql/data/sales_log.ldf",
        "--data-size-mb",
        "16",
        "--log-size-mb",
        "4",
        "--no-tls",
    ]);
    await_instance(log, port);

    let rule = format!(
        "table inet stalltrace_package_loss {{\n  chain output {{\n    \
         type filter hook output priority 0;\n    \
         tcp sport {port} numgen random mod 100 < {LOSS_PERCENT} drop\n    \
         tcp dport {port} numgen random mod 100 < {LOSS_PERCENT} drop\n  }}\n}}\n"
    );
    let bins = Bins::beside(crate::common::stalltrace_bin());
    let client = guest
        .in_netns(bins.sqlclient.to_str().unwrap())
        .args(["--server", &format!("127.0.0.1:{port}")])
        .args(["--encrypt", "not-supported"])
        .args(["--sessions", &SESSIONS.to_string(), "--rate", "50"])
        .args(["--duration", &SECS.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("sqlclient");
    // The loss begins after the logins: a session has no SPID before its
    // login response.
    std::thread::sleep(Duration::from_secs(3));
    let mut nft = guest
        .in_netns("nft")
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("nft (run `cargo xtask setup`)");
    use std::io::Write;
    nft.stdin
        .take()
        .unwrap()
        .write_all(rule.as_bytes())
        .unwrap();
    let nft = nft.wait_with_output().unwrap();
    assert!(
        nft.status.success(),
        "nft: {}",
        String::from_utf8_lossy(&nft.stderr)
    );
    let out = client.wait_with_output().unwrap();
    let _ = guest
        .in_netns("nft")
        .args(["delete", "table", "inet", "stalltrace_package_loss"])
        .status();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "sqlclient: {text}");
    let report = ClientReport(serde_json::from_str(text.trim()).unwrap());
    report.sessions()
}

/// Wait (up to 30 s) for the service's `sql_instance` of the simulator.
fn await_instance(log: &Path, port: u16) {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(30) {
        let found = records_of(log).iter().any(|r| {
            r["type"] == "sql_instance"
                && r["tds_ports"]
                    .as_array()
                    .is_some_and(|p| p.iter().any(|p| p == &Value::from(port)))
        });
        if found {
            return;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    panic!("the service found no SQL Server on port {port} within 30 s");
}
