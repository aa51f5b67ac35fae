//! `sqlserver/spid`: two simulator servers in one namespace, one doing TLS
//! through memory BIOs and one through a socket BIO, and in the other
//! namespace a session of each kind: cleartext and `Encrypt=on` to the
//! first, `on` and TDS 8.0 `strict` to the second; 10% loss on the client's
//! link. Every retransmission the server's namespace counts is in a
//! `tcp_retransmit` naming its session's SPID (as `SELECT @@SPID` answered
//! sqlclient on that connection) and client port, whether the SPID came from
//! a header on the wire or from the TLS plaintext (uprobes on SSL_write).
//! The loss begins once every session has logged in (the kernel's count of
//! data segments from each client says so): before its login response, a
//! session has no SPID on the wire to name.
//! Each session's requests are timed (sql_requests.rs). Two MARS sessions
//! beside them (cleartext and `on`, to the first server): named from the TDS
//! header after the SMP one, on the wire and in the TLS plaintext, said to be
//! MARS, and never timed.
//! Bounds of tests/sqlserver.rs and tests/sqltls.rs (there: more sessions,
//! FreeTDS and Microsoft's ODBC driver; here: one sqlclient session of each
//! kind at 50 tps for 20 s, for the slow guest).

use std::collections::BTreeMap;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::net::stop;
use super::run::lost_by_family;
use super::sql_requests::{Session, judge_requests};
use super::{Judge, Opts, Run};
use crate::net::{NetPair, Side, delta};
use crate::sql::{
    ClientReport, LOGGED_IN_SEGS, Placement, SqlClientRun, SqlServerSim, segments_in,
};
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
/// The MARS sessions' `--encrypt`, to the memory-BIO server, at half the
/// rate: each of their transactions is two requests.
const MARS_SESSIONS: [&str; 2] = ["not-supported", "on"];
/// How long each client runs. The loss lasts from the last login to the
/// clients' end, and a guest's logins took 4 s or more: with 12 s, a 6.1 and
/// a 7.3 guest in one CI run saw 16 and 19 segments lost, too few to judge.
const SECS: u32 = 20;
/// The loss on the client's link once every session has logged in.
const LOSS_PERCENT: u8 = 10;
/// How long the sessions may take to connect and log in (TLS under TCG).
const LOGIN_WITHIN: Duration = Duration::from_secs(60);

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
    let mars_clients: Vec<(&str, SqlClientRun)> = MARS_SESSIONS
        .iter()
        .map(|&encrypt| {
            let server = format!("{}:{}", pair.v4(Side::B), port_of("memory"));
            let client = SqlClientRun::sqlclient_mars(
                &opts.bins,
                client_side,
                &server,
                encrypt,
                [1, RATE_PER_SESSION / 2, SECS],
            );
            (encrypt, client)
        })
        .collect();
    // Loss once every session has logged in. What the server sends before
    // its login response (the SYN-ACK, the pre-login answer, the TLS
    // handshake, TLS 1.3's session tickets) carries no SPID, in the clear or
    // in TLS, so its retransmission cannot name one. In a guest the TLS
    // handshakes take long enough that loss begun once TCP connected hit
    // them: once in 31 runs, a strict session's fast retransmission of 510
    // bytes (its two TLS 1.3 session tickets, 255 bytes each, which the
    // server sends before the pre-login answer and the login response).
    let at_loss = {
        let deadline = Instant::now() + LOGIN_WITHIN;
        loop {
            let per_port: Vec<(usize, BTreeMap<u16, u64>)> = ["memory", "socket"]
                .iter()
                .map(|bio| {
                    let mars = if *bio == "memory" {
                        MARS_SESSIONS.len()
                    } else {
                        0
                    };
                    let expected = SESSIONS.iter().filter(|(b, _)| b == bio).count() + mars;
                    (expected, segments_in(&pair, port_of(bio)))
                })
                .collect();
            let logged_in = per_port.iter().all(|(expected, segments)| {
                segments.len() >= *expected && segments.values().all(|&n| n >= LOGGED_IN_SEGS)
            });
            let segments: BTreeMap<u16, u64> = per_port.into_iter().flat_map(|(_, s)| s).collect();
            if logged_in {
                break segments;
            }
            if let Some(ended) = clients.iter_mut().position(|c| !c.2.is_running()) {
                let (bio, encrypt, _) = &clients[ended];
                return judge.fail(format!(
                    "sqlclient --encrypt {encrypt} ({bio}) ended before every session logged in \
                     (the server's data segments in by client port: {segments:?})"
                ));
            }
            if Instant::now() > deadline {
                return judge.fail(format!(
                    "the sessions did not all log in within {LOGIN_WITHIN:?} (the server's data \
                     segments in by client port: {segments:?})"
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    let loss_from = chrono::Utc::now();
    pair.drop_random(Side::A, LOSS_PERCENT, None);
    judge.note(format!(
        "loss from {} on, with the server's data segments in by client port {at_loss:?}",
        loss_from.to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
    ));
    let reports: Vec<(&str, &str, ClientReport)> = clients
        .into_iter()
        .map(|(bio, encrypt, client)| (bio, encrypt, client.finish()))
        .collect();
    let mars_reports: Vec<(&str, ClientReport)> = mars_clients
        .into_iter()
        .map(|(encrypt, client)| (encrypt, client.finish()))
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
    let memory_worker = servers
        .iter()
        .find(|(b, _)| *b == "memory")
        .unwrap()
        .1
        .worker;
    for (encrypt, report) in &mars_reports {
        let Some(&(port, spid)) = report.sessions().first() else {
            judge.fail(format!(
                "sqlclient --mars --encrypt {encrypt}: no session: {}",
                report.0
            ));
            continue;
        };
        judge.expect(report.errors() == 0, || {
            format!("sqlclient --mars --encrypt {encrypt}: {}", report.0)
        });
        let remote = format!("{client_ip}:{port}");
        let said = session_records.iter().any(|r| {
            r["pid"] == memory_worker
                && r["remote"] == remote.as_str()
                && r["spid"] == spid
                && r["mars"] == true
        });
        judge.expect(said, || {
            format!("no sql_session for {remote} (MARS, {encrypt}) with SPID {spid} and mars")
        });
        let timed = of_type(&records, "sql_requests")
            .iter()
            .filter_map(|r| r["by_session"].as_array())
            .flatten()
            .filter(|s| s["client"] == remote.as_str())
            .count();
        judge.expect(timed == 0, || {
            format!("{remote} (MARS, {encrypt}): requests timed in {timed} sql_requests records")
        });
        figures.push(format!(
            "MARS {encrypt}: SPID {spid}, {} transactions, {} retransmit records",
            report.transactions(),
            retransmits.iter().filter(|r| r["dport"] == port).count()
        ));
        by_bio.entry("memory").or_default().insert(port, spid);
    }
    let timed: Vec<Session> = reports
        .iter()
        .map(|(bio, encrypt, report)| Session {
            worker: servers.iter().find(|(b, _)| b == bio).unwrap().1.worker,
            encrypt,
            report,
        })
        .collect();
    judge_requests(judge, &records, &timed, &retransmits);
    judge.note(format!(
        "{}; {} retransmit records, {counted} counted segments vs server RetransSegs {kernel}",
        figures.join(", "),
        retransmits.len()
    ));
    // Each worker's TLS as its last `sql_instance` says: watchable (as
    // tests/sqltls.rs requires: no "no SPIDs from TLS"), not given up on
    // after a contradicting pairing.
    let instances = of_type(&records, "sql_instance");
    for (bio, sim) in &servers {
        let tls = instances
            .iter()
            .rev()
            .find(|r| r["pid"] == sim.worker)
            .map(|r| &r["tls"]);
        let Some(tls) = tls else {
            judge.fail(format!(
                "no sql_instance for the {bio}-BIO worker {}",
                sim.worker
            ));
            continue;
        };
        let state = tls["state"].as_str().unwrap_or("absent");
        let symbols: Vec<&str> = tls["symbols"]
            .as_array()
            .map_or(Vec::new(), |a| a.iter().filter_map(Value::as_str).collect());
        judge.note(format!(
            "{bio}-BIO worker TLS {state}: {} of {}",
            symbols.join(" and "),
            tls["library"].as_str().unwrap_or("no library")
        ));
        judge.expect(state == "available", || {
            format!("the {bio}-BIO worker's TLS is {state}: {tls}")
        });
    }
    // What the sqlserver family declared (TLS writes it could not pair):
    // figures, the sessions' SPIDs above are the bound.
    let (lost, _) = lost_by_family(&records, "sqlserver");
    judge.note(format!(
        "sqlserver lost: {}",
        if lost.is_empty() {
            "nothing".to_string()
        } else {
            lost.join(", ")
        }
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
        // When it left against the loss and its session: the data segments
        // the server had received on it when the loss began, and its
        // `sql_session` records.
        let when = wrong.first().map_or(String::new(), |r| {
            let port = r["dport"].as_u64().unwrap_or(0) as u16;
            let remote = format!("{client_ip}:{port}");
            let events: Vec<String> = session_records
                .iter()
                .filter(|s| s["remote"] == remote.as_str())
                .map(|s| format!("{} {} spid {}", s["ts"], s["event"], s["spid"]))
                .collect();
            format!(
                "; the loss began {}, when the server had received {:?} data segments on it; \
                 its sql_session records: {}",
                loss_from.to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
                at_loss.get(&port),
                events.join(", ")
            )
        });
        format!(
            "{} retransmits do not name their session (SPID, client port), {strays} from no \
             server, e.g. {}{when}",
            wrong.len(),
            wrong.first().map_or(String::new(), |r| r.to_string())
        )
    });
}
