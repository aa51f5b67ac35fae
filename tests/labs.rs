//! The field cases end to end: each lab scenario (lab/src/scenario/, the same
//! ones `cargo xtask lab NAME` runs) with its fault, where the `stall` records
//! must name the right cause on the right subject (and, where SQL Server
//! sessions are hit, the right sessions), and clean, where no `stall` record
//! may be about the scenario's subjects unless the load generator's own
//! figures confirm it (others on the shared kernel are printed, not judged). Every record is checked against docs/schema.json,
//! and the load generators' own figures (ODBC Driver 18, fio, iperf3, sockperf,
//! the backup's receiver) confirm that the fault was there, or was not.
//!
//! Run as root (`cargo xtask test`); nextest runs them one at a time with the
//! other privileged tests (.config/nextest.toml).

mod common;

use common::*;
use serde_json::Value;
use stalltrace_lab::scenario::{self, Fault, Outcome};

/// Validate the stream, print what a person would want to see, and return it.
fn checked(o: Outcome) -> Outcome {
    parse_records(&o.stream);
    eprintln!("{} ({:?}):", o.scenario, o.fault);
    for line in &o.figures {
        eprintln!("  {line}");
    }
    for s in o.episodes() {
        eprintln!("  episode: {}", scenario::summary(s));
    }
    eprintln!("  {}", o.conclusion());
    let wrong = o.evidence_not_in_records();
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    o
}

fn assert_expected(o: &Outcome) {
    if let Err(why) = o.verdict() {
        panic!("{}: {why}", o.scenario);
    }
}

/// No episode about the scenario's subjects, but those its load generator's
/// own figures confirm (the host's disk really was slow: printed, not judged).
fn assert_clean(o: &Outcome) {
    let (confirmed, ours): (Vec<&Value>, Vec<&Value>) = o
        .ours()
        .into_iter()
        .partition(|s| o.confirmation(s).is_some());
    for s in confirmed {
        eprintln!(
            "  (true without the fault, not judged: {}: {})",
            scenario::summary(s),
            o.confirmation(s).unwrap_or_default()
        );
    }
    assert!(
        ours.is_empty(),
        "{} without its fault: stall episodes about its subjects: {ours:#?}",
        o.scenario
    );
    for s in o.others() {
        eprintln!(
            "  (elsewhere on this kernel, not judged: {})",
            scenario::summary(s)
        );
    }
}

fn evidence<'a>(stall: &'a Value, signal: &str) -> Option<&'a Value> {
    stall["evidence"]
        .as_array()?
        .iter()
        .find(|e| e["signal"] == signal)
        .map(|e| &e["value"])
}

// ---- loss ------------------------------------------------------------------------

/// 5% loss on the client link: the server's retransmission timeouts to the
/// client's address are one `network` episode, and it names exactly the
/// sessions the ODBC client opened (SPID from its `SELECT @@SPID`, client
/// port from the kernel), although the driver encrypts them (Encrypt=yes).
#[test]
fn loss_names_retransmission_timeouts_and_the_sessions_hit() {
    require_root();
    let o = checked(scenario::loss::run(&bins(), Fault::Injected));
    assert_eq!(
        o.sessions.len(),
        4,
        "the ODBC client's sessions: {:?}",
        o.sessions
    );
    assert_expected(&o);
    // Only the simulator's sessions, each as its client knows it.
    let e = &o.expected[0];
    for episode in o.found(e) {
        for tag in episode["sessions"].as_array().unwrap() {
            assert!(
                o.sessions.iter().any(|s| s.is(tag)),
                "a session the ODBC client did not open: {tag}"
            );
        }
        // A timer RTO, or a connection stuck as long: the 200 ms the transactions felt.
        let waited = ["rto_ms_max", "stalled_ms_max"]
            .iter()
            .filter_map(|s| evidence(episode, s)?.as_f64())
            .fold(0.0, f64::max);
        assert!(waited >= 200.0, "{episode}");
    }
}

#[test]
fn loss_clean_has_no_stall() {
    require_root();
    let o = checked(scenario::loss::run(&bins(), Fault::Clean));
    assert_clean(&o);
}

// ---- queue depth -----------------------------------------------------------------

/// nr_requests 4 under 1..64 concurrent reads: never more than 4 in flight,
/// the waiting moves in front of the device, and a `queue_full` episode on it.
#[test]
fn queue_depth_limit_is_queue_full() {
    require_root();
    let (o, steps) = scenario::queue_depth::sweep(&bins(), Fault::Injected);
    let o = checked(o);
    assert_expected(&o);
    for s in &steps {
        let inflight = s.inflight.as_ref().expect("block records for every step");
        assert!(inflight.max() <= 4.0, "depth {}: {inflight:?}", s.depth);
    }
    let deep = steps.iter().find(|s| s.depth == 32).unwrap();
    let (tag, device) = (
        deep.tag_wait.as_ref().unwrap().mean(),
        deep.device.as_ref().unwrap().mean(),
    );
    assert!(
        tag >= 2.0 * device,
        "32 deep on 4 tags: tag wait {tag:.0} µs should dwarf the device's {device:.0} µs"
    );
}

#[test]
fn queue_depth_clean_has_no_stall() {
    require_root();
    let (o, steps) = scenario::queue_depth::sweep(&bins(), Fault::Clean);
    let o = checked(o);
    assert_clean(&o);
    let deep = steps.last().unwrap();
    assert!(
        deep.inflight.as_ref().unwrap().max() > 4.0,
        "with the default queue more than 4 should be in flight"
    );
}

// ---- throttle --------------------------------------------------------------------

/// Two streams through one 40 Mbit/s uplink: `tx_throttled` on that uplink,
/// with the tbf's queue as evidence.
#[test]
fn throttle_is_tx_throttled_on_the_uplink() {
    require_root();
    let o = checked(scenario::throttle::run(&bins(), Fault::Injected));
    assert_expected(&o);
    let total: f64 = o.value("received_mbps_1") + o.value("received_mbps_2");
    assert!(total <= 40.0 * 1.1, "the streams got {total:.1} Mbit/s");
    for episode in o.found(&o.expected[0]) {
        let wait = evidence(episode, "qdisc_wait_ms_p99").expect("qdisc wait evidence");
        assert!(wait.as_f64().unwrap() >= 20.0, "{episode}");
        let backlog = evidence(episode, "qdisc_backlog_bytes").expect("qdisc backlog evidence");
        assert!(backlog.as_u64().unwrap() > 0, "{episode}");
    }
}

#[test]
fn throttle_clean_has_no_stall() {
    require_root();
    let o = checked(scenario::throttle::run(&bins(), Fault::Clean));
    assert_clean(&o);
    for stream in ["received_mbps_1", "received_mbps_2"] {
        assert!(o.value(stream) >= 90.0, "{stream}: {}", o.value(stream));
    }
}

// ---- rtt -------------------------------------------------------------------------

/// Requests behind a bulk stream in one shaped queue: `tx_throttled`, and the
/// round trip stalltrace saw (kernel srtt) is sockperf's, tens of ms.
#[test]
fn rtt_behind_a_bulk_stream_is_tx_throttled() {
    require_root();
    let o = checked(scenario::rtt::run(&bins(), Fault::Injected));
    assert_expected(&o);
    let (app, kernel) = (o.value("sockperf_p50_us"), o.value("srtt_p50_us"));
    assert!(app >= 10_000.0, "sockperf p50 {app:.0} µs: no bufferbloat");
    assert!(
        (0.5..=1.5).contains(&(kernel / app)),
        "srtt p50 {kernel:.0} µs vs sockperf p50 {app:.0} µs"
    );
}

#[test]
fn rtt_clean_has_no_stall() {
    require_root();
    let o = checked(scenario::rtt::run(&bins(), Fault::Clean));
    assert_clean(&o);
    let app = o.value("sockperf_p50_us");
    assert!(
        app < 5_000.0,
        "sockperf p50 {app:.0} µs without a bulk stream"
    );
}

// ---- backup ----------------------------------------------------------------------

/// A backup held back by the network and one held back by its disk, side by
/// side: `network_limited` (with the shaper's `tx_throttled`) vs
/// `application_limited`, whose evidence names the slow disk's episode.
#[test]
fn backup_tells_network_limited_from_disk_limited() {
    require_root();
    let o = checked(scenario::backup::run(&bins(), Fault::Injected));
    assert_expected(&o);
    assert!(o.value("network_mbps") <= 20.0 * 1.05);
    let slow_dev = o
        .expected
        .iter()
        .find(|e| e.cause == "slow_device")
        .unwrap()
        .value
        .clone();
    let app = o
        .expected
        .iter()
        .find(|e| e.cause == "application_limited")
        .unwrap();
    for episode in o.found(app) {
        assert_eq!(
            evidence(episode, "storage_episode"),
            Some(&Value::from(slow_dev.clone())),
            "{episode}"
        );
    }
}

#[test]
fn backup_clean_has_no_stall() {
    require_root();
    let o = checked(scenario::backup::run(&bins(), Fault::Clean));
    assert_clean(&o);
}

// ---- slow log --------------------------------------------------------------------

/// The log disk throttled to a few writes a second: the clients' requests are
/// slow with the time on the server's side, and the `requests` episode says
/// so (`server_io`), naming the worker's writes to the log file, never the
/// network.
#[test]
fn slow_log_is_server_io_naming_the_log_writes() {
    require_root();
    let o = checked(scenario::slow_log::run(&bins(), Fault::Injected));
    assert_expected(&o);
    for episode in o.found(&o.expected[0]) {
        let files = episode["files"].as_array().expect("files of the episode");
        assert!(
            files
                .iter()
                .any(|f| f.as_str().is_some_and(|f| f.ends_with("/sales_log.ldf"))),
            "the log file's writes are not named: {episode}"
        );
        let slowest = evidence(episode, "slow_io_ms_max").and_then(Value::as_f64);
        assert!(
            slowest.is_some_and(|ms| ms >= 20.0),
            "the slowest log write: {episode}"
        );
        for tag in episode["sessions"].as_array().unwrap() {
            assert!(
                o.sessions.iter().any(|s| s.is(tag)),
                "a session the client did not open: {tag}"
            );
        }
    }
    // Not the network: no requests episode blames delivery.
    let blamed: Vec<&Value> = o
        .ours()
        .into_iter()
        .filter(|s| s["kind"] == "requests" && s["cause"] == "network_delivery")
        .collect();
    assert!(blamed.is_empty(), "{blamed:#?}");
}

#[test]
fn slow_log_clean_has_no_stall() {
    require_root();
    let o = checked(scenario::slow_log::run(&bins(), Fault::Clean));
    assert_clean(&o);
}
