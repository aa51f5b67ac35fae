//! `sqlserver/spid`: two simulator servers in one namespace, one doing TLS
//! through memory BIOs and one through a socket BIO, and in the other
//! namespace a session of each kind: cleartext and `Encrypt=on` to the
//! first, `on` and TDS 8.0 `strict` to the second; 8% loss on the client's
//! link. Every retransmission the server's namespace counts is in a
//! `tcp_retransmit` naming its session's SPID (as `SELECT @@SPID` answered
//! sqlclient on that connection) and client port, whether the SPID came from
//! a header on the wire or from the TLS plaintext (uprobes on SSL_write).
//! Bounds of tests/sqlserver.rs and tests/sqltls.rs (there: more sessions,
//! FreeTDS and Microsoft's ODBC driver; here: one sqlclient session of each
//! kind at 50 tps for 12 s, for the slow guest).

use std::collections::BTreeMap;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;

use super::net::stop;
use super::{Judge, Opts, Run};
use crate::net::{NetPair, Side, delta};
use crate::sql::{ClientReport, Placement, SqlClientRun, SqlServerSim};
use crate::util::unique;
use crate::{SqlSide, of_type, retransmits_in};

/// Each session: the BIO style of the server it goes to, and its `--encrypt`.
const SESSIONS: [(&str, &str); 4] = [
    ("memory", "not-supported"),
    ("memory", "on"),
    ("socket", "on"),
    ("socket", "strict"),
];
const RATE_PER_SESSION: u32 = 50;
const SECS: u32 = 12;

/// A directory for the simulator's files, removed on drop.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A directory whose filesystem takes O_DIRECT (the simulator opens its files
/// so): /var/tmp, else the temp dir (tmpfs takes it from 6.6 on).
fn scratch() -> Result<Scratch, String> {
    let mut tried = Vec::new();
    for base in [Path::new("/var/tmp"), &std::env::temp_dir()] {
        if !base.is_dir() {
            continue;
        }
        let dir = base.join(unique("kernel-checks-sql"));
        if std::fs::create_dir(&dir).is_err() {
            continue;
        }
        let dir = Scratch(dir);
        let probe = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .custom_flags(libc::O_DIRECT)
            .open(dir.0.join("probe"));
        match probe {
            Ok(_) => return Ok(dir),
            Err(e) => tried.push(format!("{}: {e}", base.display())),
        }
    }
    Err(format!(
        "no directory takes O_DIRECT for the simulator's files ({}); tmpfs takes it from 6.6 on",
        tried.join(", ")
    ))
}

pub fn spid(opts: &Opts, judge: &mut Judge) {
    opts.bins.check();
    let files = match scratch() {
        Ok(f) => f,
        Err(e) => return judge.fail(e),
    };
    let pair = NetPair::new();
    let args = ["--degrade", "--netns", pair.netns(Side::B)];
    let mut run = match Run::start(opts, &args) {
        Ok(run) => run,
        Err(e) => return judge.fail(e),
    };
    if !judge.families_attached(&run.start, &["sqlserver", "tcp"]) {
        return;
    }
    judge.note(format!(
        "uprobes: {}",
        run.start["sql_tls"]["reason"]
            .as_str()
            .unwrap_or("available")
    ));
    let server_side = Placement::in_netns(pair.netns(Side::B));
    let mut servers = Vec::new();
    for bio in ["memory", "socket"] {
        let dir = files.0.join(bio);
        if let Err(e) = std::fs::create_dir(&dir) {
            return judge.fail(format!("{}: {e}", dir.display()));
        }
        let sim = SqlServerSim::start_small(&opts.bins, server_side, &dir, &["--tls-bio", bio]);
        // Sessions opened once stalltrace knows the worker (the kernel reads
        // the SPID from each one's first response).
        let found = run.wait_for(Duration::from_secs(60), |r| {
            r["type"] == "sql_instance" && r["pid"] == sim.worker
        });
        if let Err(e) = found {
            return judge.fail(format!("no sql_instance for worker {}: {e}", sim.worker));
        }
        servers.push((bio, sim));
    }
    let port_of = |bio: &str| servers.iter().find(|(b, _)| *b == bio).unwrap().1.port;
    let client_side = Placement::in_netns(pair.netns(Side::A));
    let before = pair.counters(Side::B);
    let mut clients: Vec<(&str, &str, SqlClientRun)> = SESSIONS
        .iter()
        .map(|&(bio, encrypt)| {
            let server = format!("{}:{}", pair.v4(Side::B), port_of(bio));
            let client = SqlClientRun::sqlclient(
                &opts.bins,
                client_side,
                &server,
                encrypt,
                1,
                RATE_PER_SESSION,
                SECS,
            );
            (bio, encrypt, client)
        })
        .collect();
    // Loss once the sessions exist: a lost SYN-ACK belongs to no session yet.
    for bio in ["memory", "socket"] {
        clients[0]
            .2
            .wait_for_sessions(&pair, port_of(bio), 2, Duration::from_secs(60));
    }
    pair.drop_random(Side::A, 8, None);
    let reports: Vec<(&str, &str, ClientReport)> = clients
        .into_iter()
        .map(|(bio, encrypt, client)| (bio, encrypt, client.finish()))
        .collect();
    pair.clear_drops(Side::A);
    let after = pair.counters(Side::B);
    std::thread::sleep(Duration::from_millis(2200));
    let Some(records) = stop(judge, run) else {
        return;
    };

    let client_ip = pair.v4(Side::A).to_string();
    let retransmits = retransmits_in(&records, pair.netns_inode(Side::B));
    let counted: u64 = retransmits
        .iter()
        .filter(|r| r["counted"] == true)
        .map(|r| r["segs"].as_u64().unwrap_or(0))
        .sum();
    let kernel = delta(&before, &after).get("Tcp.RetransSegs");
    let session_records = of_type(&records, "sql_session");
    let mut by_bio: BTreeMap<&str, BTreeMap<u16, u16>> = BTreeMap::new();
    let mut figures = Vec::new();
    for (bio, encrypt, report) in &reports {
        judge.expect(report.errors() == 0, || {
            format!(
                "sqlclient --encrypt {encrypt} to the {bio}-BIO server: {}",
                report.0
            )
        });
        let sessions = report.sessions();
        let Some(&(port, spid)) = sessions.first() else {
            judge.fail(format!(
                "sqlclient --encrypt {encrypt} ({bio}): no session: {}",
                report.0
            ));
            continue;
        };
        let worker = servers.iter().find(|(b, _)| b == bio).unwrap().1.worker;
        let source = if *encrypt == "not-supported" {
            "tds_header"
        } else {
            "tls_plaintext"
        };
        let remote = format!("{client_ip}:{port}");
        let named = session_records.iter().any(|r| {
            r["pid"] == worker
                && r["remote"] == remote.as_str()
                && r["spid"] == spid
                && r["spid_source"] == source
        });
        judge.expect(named, || {
            format!(
                "no sql_session for {remote} ({encrypt}, {bio} BIO) with SPID {spid} from {source}"
            )
        });
        let hit = retransmits.iter().filter(|r| r["dport"] == port).count();
        figures.push(format!(
            "{encrypt}/{bio}: SPID {spid} ({source}), {} transactions, p99 {} us, {hit} retransmit records",
            report.transactions(),
            report.0["p99_us"]
        ));
        by_bio.entry(bio).or_default().insert(port, spid);
    }
    judge.note(format!(
        "{}; {} retransmit records, {counted} counted segments vs server RetransSegs {kernel}",
        figures.join(", "),
        retransmits.len()
    ));
    if !judge.expect(kernel >= 20, || {
        format!("too little loss to judge: {kernel} segments (need 20)")
    }) {
        return;
    }
    let off = (counted as f64 - kernel as f64).abs() / kernel as f64;
    judge.expect(off <= 0.05, || {
        format!(
            "counted segments {counted} vs RetransSegs {kernel}: {:.1}% apart (bound 5%)",
            off * 100.0
        )
    });
    // And each one names its session: the server it left, the SPID and client port.
    let mut wrong: Vec<&Value> = Vec::new();
    for (bio, sim) in &servers {
        let empty = BTreeMap::new();
        let side = SqlSide {
            worker: sim.worker,
            server_port: sim.port,
            client_ip: &client_ip,
            sessions: by_bio.get(bio).unwrap_or(&empty),
        };
        let mine: Vec<&Value> = retransmits
            .iter()
            .copied()
            .filter(|r| r["sport"] == sim.port)
            .collect();
        wrong.extend(side.misnamed(&mine));
    }
    let strays = retransmits
        .iter()
        .filter(|r| servers.iter().all(|(_, sim)| r["sport"] != sim.port))
        .count();
    judge.note(format!(
        "{} of {} retransmits name their session",
        retransmits.len() - wrong.len() - strays,
        retransmits.len()
    ));
    judge.expect(wrong.is_empty() && strays == 0, || {
        format!(
            "{} retransmits do not name their session (SPID, client port), {strays} from no \
             server, e.g. {}",
            wrong.len(),
            wrong.first().map_or(String::new(), |r| r.to_string())
        )
    });
}
