//! `--prometheus` read by a real Prometheus (Debian's package, started by the
//! test on loopback ports of its own), checked against the kernel's own
//! counters (/proc/diskstats), against the JSON stream of the same run, and
//! by `promtool`; the deployable rules in deploy/prometheus/ unit-tested
//! by `promtool test rules`; and every query of the Grafana dashboard
//! (deploy/grafana/) run against those rules after a lossy SQL Server run.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use common::netlab::{Family, NetPair, Side, delta};
use common::requests::sim_found_by;
use common::sqllab::{Placement, SqlClientRun};
use common::*;
use serde_json::Value;
use stalltrace_lab::prometheus::{Prometheus, free_port, get};
use stalltrace_lab::scenario::ScratchDir;

/// The octave (`le` = 2^k − 1 ns) a latency in seconds falls in: the
/// metrics' histogram buckets. (An upper edge itself belongs to its octave:
/// the small allowance keeps float rounding from pushing it into the next.)
fn octave(seconds: f64) -> i32 {
    ((seconds * 1e9 + 1.0).log2() - 1e-9).ceil() as i32
}

fn promtool(args: &[&str], stdin: Option<&str>) -> (bool, String) {
    let mut child = Command::new("promtool")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run promtool (`cargo xtask setup` installs it): {e}"));
    {
        use std::io::Write;
        let mut input = child.stdin.take().unwrap();
        if let Some(text) = stdin {
            input.write_all(text.as_bytes()).unwrap();
        }
    }
    let out = child.wait_with_output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// A block load while Prometheus scrapes: the request counter equals the
/// stream's `count` and /proc/diskstats' delta, the p99 from the buckets lands
/// in the bucket of the stream's p99, and the scrape passes `promtool check metrics`.
#[test]
fn a_real_prometheus_reads_block_figures_that_match_diskstats_and_the_stream() {
    require_root();
    let disk = LoopDevice::new(Backing::Disk, 256, true);
    disk.set_queue("scheduler", "none");
    let before = disk.diskstats();
    let listen = format!("127.0.0.1:{}", free_port());
    let tracer = Tracer::start(&[
        "--interval",
        "1s",
        "--slow-io-ms",
        "0",
        "--prometheus",
        &listen,
    ]);
    let prometheus = Prometheus::start(&listen);
    prometheus.wait_scraped_after(SystemTime::now());
    let fio = randread_4k(&disk.dev, &["--ioengine=libaio", "--iodepth=16"], 4);
    let after = disk.diskstats();
    // The interval holding the last completions is written, then scraped.
    std::thread::sleep(Duration::from_millis(2500));
    prometheus.wait_scraped_after(SystemTime::now());
    let dev = &disk.name;
    let requests = prometheus.value(&format!(
        "sum(stalltrace_block_requests_total{{device=\"{dev}\"}})"
    ));
    let p99 = prometheus.value(&format!(
        "histogram_quantile(0.99, sum by (le) (stalltrace_block_latency_seconds_bucket{{device=\"{dev}\",op=\"read\"}}))"
    ));
    let scrape = get(&format!("http://{listen}/metrics")).expect("a scrape of /metrics");
    let records = tracer.stop();

    let kernel = (after.reads_completed + after.writes_completed)
        - (before.reads_completed + before.writes_completed);
    let streamed: u64 = of_type(&records, "block")
        .iter()
        .filter(|r| r["dev"] == dev.as_str())
        .map(|r| r["count"].as_u64().unwrap())
        .sum();
    let reads = block_records(&records, dev, "read");
    let stream_p99_s = Buckets::merge(&reads, "latency_us").percentile(0.99) / 1e6;
    eprintln!(
        "Prometheus: {requests} requests, p99 {p99} s; stream: {streamed} requests, p99 {stream_p99_s} s; \
         diskstats {kernel}; fio {} I/Os; scrape {} bytes",
        fio.ios,
        scrape.len()
    );
    assert!(fio.ios > 1000, "fio did too little to compare: {fio:?}");
    assert_eq!(
        requests, streamed as f64,
        "the metrics and the stream count the same requests"
    );
    let apart = (requests - kernel as f64).abs() / kernel as f64;
    assert!(
        apart <= 0.01,
        "{requests} requests vs diskstats {kernel}: {:.2}% apart",
        apart * 100.0
    );
    // Both pick the bucket that holds the 99th percentile's rank: the
    // octave of the stream's fine bucket.
    assert_eq!(
        octave(p99),
        octave(stream_p99_s),
        "histogram_quantile p99 {p99} s is not in the bucket of the stream's {stream_p99_s} s"
    );
    let (ok, lint) = promtool(&["check", "metrics"], Some(&scrape));
    assert!(ok, "promtool check metrics: {lint}");
    assert!(
        scrape.contains("stalltrace_program_runs_total{family=\"block\""),
        "{scrape}"
    );
}

/// Loss on a veth pair while Prometheus scrapes: retransmitted segments by kind
/// and by peer (`--prometheus-peers`) and retransmission timeouts are exactly
/// what the stream's records carry, and the segments, with those `lost` says
/// had no record, are the sender namespace's RetransSegs.
#[test]
fn a_real_prometheus_counts_the_retransmissions_the_stream_records() {
    require_root();
    let pair = NetPair::new();
    let server = pair.iperf3_server(Side::B);
    pair.drop_random(Side::B, 2, Some(server.port));
    let port = server.port.to_string();
    let listen = format!("127.0.0.1:{}", free_port());
    let tracer = Tracer::start(&[
        "--interval",
        "500ms",
        "--slow-io-ms",
        "0",
        "--netns",
        pair.netns(Side::A),
        "--port",
        &port,
        "--prometheus",
        &listen,
        "--prometheus-peers",
        "4",
    ]);
    let prometheus = Prometheus::start(&listen);
    let before = pair.counters(Side::A);
    pair.iperf3(&server, Family::V4, 4, &["-b", "200M"]);
    // Until the connections' last retransmissions (of a FIN, say) are written.
    let retransmits = |t: &Tracer| {
        t.records_so_far()
            .iter()
            .filter(|r| r["type"] == "tcp_retransmit")
            .count()
    };
    let mut seen = retransmits(&tracer);
    let mut quiet_since = Instant::now();
    while quiet_since.elapsed() < Duration::from_secs(3) {
        std::thread::sleep(Duration::from_millis(250));
        let now = retransmits(&tracer);
        if now != seen {
            (seen, quiet_since) = (now, Instant::now());
        }
    }
    let after = pair.counters(Side::A);
    prometheus.wait_scraped_after(SystemTime::now());
    let by_kind = prometheus.query("sum by (kind) (stalltrace_tcp_retransmitted_segments_total)");
    let unseen = prometheus
        .query("sum(stalltrace_lost_total{source=\"tcp.retransmit_unseen_segs\"})")
        .first()
        .map_or(0.0, |(_, v)| *v);
    let timeouts = prometheus
        .query("sum(stalltrace_tcp_retransmission_timeouts_total)")
        .first()
        .map_or(0.0, |(_, v)| *v);
    let segs_by_peer =
        prometheus.query("sum by (peer) (stalltrace_tcp_peer_retransmitted_segments_total)");
    let timeouts_by_peer =
        prometheus.query("sum by (peer) (stalltrace_tcp_peer_retransmission_timeouts_total)");
    let records = tracer.stop();

    let events = of_type(&records, "tcp_retransmit");
    let k = delta(&before, &after);
    let mut kinds: Vec<&str> = events
        .iter()
        .filter(|r| r["err"] == 0)
        .filter_map(|r| r["kind"].as_str())
        .collect();
    kinds.sort_unstable();
    kinds.dedup();
    eprintln!(
        "Prometheus {by_kind:?}, timeouts {timeouts}; stream {} records",
        events.len()
    );
    assert!(
        events.len() > 10,
        "too little loss to compare: {} records",
        events.len()
    );
    for kind in &kinds {
        let streamed = sum_segs(&events, |r| r["kind"] == *kind && r["err"] == 0);
        let scraped = by_kind
            .iter()
            .find(|(labels, _)| labels["kind"] == *kind)
            .map_or(0.0, |(_, v)| *v);
        assert_eq!(
            scraped, streamed as f64,
            "{kind} segments: metrics vs stream"
        );
    }
    // Every kind is shown from the start, at 0 where none happened.
    let nonzero = by_kind.iter().filter(|(_, v)| *v > 0.0).count();
    assert_eq!(
        nonzero,
        kinds.len(),
        "kinds in the metrics: {by_kind:?} vs {kinds:?}"
    );
    // The kernel's own count, which the stream's records were not made from.
    let scraped: f64 = by_kind.iter().map(|(_, v)| v).sum();
    assert_eq!(
        scraped + unseen,
        k.get("Tcp.RetransSegs") as f64,
        "retransmitted segments in the metrics ({scraped}, and {unseen} without a record) vs RetransSegs"
    );
    let sent_timer_rtos = events
        .iter()
        .filter(|r| r["kind"] == "rto" && r["timer"] == true && r["err"] == 0)
        .count();
    assert_eq!(
        timeouts, sent_timer_rtos as f64,
        "retransmission timeouts: metrics vs stream"
    );
    // Per peer: one peer here (the iperf3 server), under the cap of 4.
    let mut peers: Vec<&str> = events.iter().filter_map(|r| r["daddr"].as_str()).collect();
    peers.sort_unstable();
    peers.dedup();
    let mut scraped_peers: Vec<&str> = segs_by_peer
        .iter()
        .filter_map(|(labels, _)| labels["peer"].as_str())
        .collect();
    scraped_peers.sort_unstable();
    assert_eq!(scraped_peers, peers, "peers in the metrics vs the stream");
    for peer in peers {
        let of_peer = |labels: &Value| labels["peer"] == peer;
        let sent = |r: &Value| r["daddr"] == peer && r["err"] == 0;
        let scraped = segs_by_peer
            .iter()
            .find(|(l, _)| of_peer(l))
            .map(|(_, v)| *v);
        assert_eq!(
            scraped,
            Some(sum_segs(&events, sent) as f64),
            "segments to {peer}"
        );
        let rtos = events
            .iter()
            .filter(|r| sent(r) && r["kind"] == "rto" && r["timer"] == true)
            .count();
        let scraped = timeouts_by_peer
            .iter()
            .find(|(l, _)| of_peer(l))
            .map(|(_, v)| *v);
        assert_eq!(scraped, Some(rtos as f64), "timeouts to {peer}");
    }
    assert!(
        sent_timer_rtos as u64 <= k.get("TcpExt.TCPTimeouts"),
        "{sent_timer_rtos} timer retransmissions, the kernel counted {} timeouts",
        k.get("TcpExt.TCPTimeouts")
    );
}

/// The deployable scrape config, recording and alert rules pass promtool,
/// and every alert's unit tests (deploy/prometheus/rules_test.yml) hold.
#[test]
fn the_deployed_prometheus_rules_pass_promtool() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/prometheus");
    let path = |f: &str| dir.join(f).display().to_string();
    for args in [
        vec!["check", "config", "--syntax-only", &path("prometheus.yml")],
        vec!["check", "rules", &path("rules.yml")],
        vec!["test", "rules", &path("rules_test.yml")],
    ] {
        let (ok, text) = promtool(&args, None);
        eprintln!("promtool {}: {text}", args.join(" "));
        assert!(ok, "promtool {}: {text}", args.join(" "));
    }
}

/// What the endpoint says to a client that asks for something else, and a
/// port already taken is a clean error before anything attaches.
#[test]
fn the_endpoint_refuses_what_it_does_not_serve_and_a_taken_port_is_one_line() {
    require_root();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let out = Command::new(stalltrace_bin())
        .args(["run", "--duration", "1s", "--prometheus", &addr])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(stderr.contains(&format!("--prometheus {addr}")), "{stderr}");
    assert!(
        out.stdout.is_empty(),
        "nothing is written before the port is bound"
    );

    let listen = format!("127.0.0.1:{}", free_port());
    let tracer = Tracer::start(&["--interval", "1s", "--prometheus", &listen]);
    let index = get(&format!("http://{listen}/")).unwrap();
    assert!(index.contains("/metrics"), "{index}");
    let missing = get(&format!("http://{listen}/nothing")).unwrap_err();
    assert!(missing.contains("404"), "{missing}");
    let records: Vec<Value> = tracer.stop();
    assert_eq!(records[0]["prometheus"], listen.as_str(), "{}", records[0]);
}

/// Every query of the Grafana dashboard (deploy/grafana/stalltrace.json):
/// its panels' and its annotation's, with `$instance` as "All" selects it.
fn dashboard_queries() -> Vec<(String, String)> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/grafana/stalltrace.json");
    let text = std::fs::read_to_string(&path).expect("deploy/grafana/stalltrace.json");
    let dashboard: Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    let all = |expr: &str| expr.replace("$instance", ".+");
    let mut queries = Vec::new();
    let mut ids = std::collections::BTreeSet::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        let title = panel["title"].as_str().expect("a panel title");
        assert!(
            ids.insert(panel["id"].as_u64().expect("a panel id")),
            "{title}: id used twice"
        );
        for target in panel["targets"].as_array().into_iter().flatten() {
            assert_eq!(target["datasource"]["uid"], "${datasource}", "{title}");
            let expr = target["expr"].as_str().expect("a target's expr");
            assert!(
                expr.contains("instance=~\"$instance\""),
                "{title}: not per host: {expr}"
            );
            queries.push((title.to_string(), all(expr)));
        }
    }
    for annotation in dashboard["annotations"]["list"]
        .as_array()
        .expect("annotations")
    {
        let name = annotation["name"].as_str().expect("an annotation name");
        queries.push((
            name.to_string(),
            all(annotation["expr"].as_str().expect("its expr")),
        ));
    }
    queries
}

/// The dashboard against a real Prometheus evaluating the deployed rules,
/// after a run with every figure it draws: a simulator's sessions under 5%
/// loss of what the server sends and one second of all of it
/// (retransmissions and timeouts, by peer; requests of 200 ms and more; a
/// stall episode), its files on the host's disk. Each panel's query and the annotation's, run over the run as
/// Grafana draws them (a range query), give a value above 0 at some point:
/// a counter that only exists at 0 does not pass. The losses panel has
/// series exactly when the stream had a `lost` record by then. No Grafana
/// runs here, and no schema of Grafana's is at hand offline: the JSON's
/// shape is checked as the queries are read.
#[test]
fn every_panel_of_the_grafana_dashboard_draws_from_the_deployed_rules() {
    require_root();
    let pair = NetPair::new();
    let files = ScratchDir::new("/var/tmp");
    let listen = format!("127.0.0.1:{}", free_port());
    let mut tracer = Tracer::start(&[
        "--interval",
        "500ms",
        "--slow-io-ms",
        "0",
        "--bpf-stats",
        "--prometheus",
        &listen,
        "--prometheus-peers",
        "4",
    ]);
    let rules = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/prometheus/rules.yml");
    let prometheus = Prometheus::start_with_rules(&listen, Some(&rules));
    let began = unix_seconds(SystemTime::now());
    let sim = sim_found_by(&mut tracer, &pair, &files, &[]);
    let server = format!("{}:{}", pair.v4(Side::B), sim.port);
    let mut client = SqlClientRun::start(
        &bins(),
        Placement::in_netns(pair.netns(Side::A)),
        &server,
        4,
        50,
        15,
    );
    client.wait_for_logins(&pair, sim.port, 4, Duration::from_secs(20));
    pair.drop_random(Side::A, 5, Some(sim.port));
    // A second in which nothing the server sends arrives: retransmission
    // timeouts for certain. Random loss alone does not always give one (the
    // tail-loss probe repairs most single losses before the timer would).
    std::thread::sleep(Duration::from_secs(4));
    pair.drop_random(Side::A, 100, Some(sim.port));
    std::thread::sleep(Duration::from_secs(1));
    pair.clear_drops(Side::A);
    pair.drop_random(Side::A, 5, Some(sim.port));
    let report = client.finish();
    pair.clear_drops(Side::A);
    assert_eq!(report.errors(), 0, "sqlclient: {}", report.0);
    // The last interval written, scraped after that, and the rules evaluated on it.
    std::thread::sleep(Duration::from_secs(1));
    let so_far = tracer.records_so_far();
    prometheus.wait_scraped_after(SystemTime::now());
    std::thread::sleep(Duration::from_secs(2));
    let ended = unix_seconds(SystemTime::now());
    let answers: Vec<(String, String, usize, f64)> = dashboard_queries()
        .into_iter()
        .map(|(title, expr)| {
            let series = prometheus.query_range(&expr, began, ended, 1.0);
            let top = series
                .iter()
                .flat_map(|(_, values)| values.iter().copied())
                .filter(|v| v.is_finite())
                .fold(f64::NAN, f64::max);
            (title, expr, series.len(), top)
        })
        .collect();
    let records = tracer.stop();
    drop(sim);
    for (title, expr, n, top) in &answers {
        eprintln!("{n:>3} series, max {top:<10.3e} {title}: {expr}");
    }
    let lost = of_type(&so_far, "lost")
        .iter()
        .any(|r| r["by_source"].as_object().is_some_and(|s| !s.is_empty()));
    let timeouts = of_type(&records, "tcp_retransmit")
        .iter()
        .filter(|r| r["kind"] == "rto" && r["timer"] == true)
        .count();
    let episodes = of_type(&records, "stall").len();
    eprintln!("stream: {timeouts} retransmission timeouts, {episodes} stall records, lost: {lost}");
    assert!(
        timeouts > 0 && episodes > 0,
        "the run lacked a figure the dashboard draws"
    );
    for (title, expr, n, top) in &answers {
        if title == "Events lost since start" {
            assert_eq!(
                *n > 0,
                lost,
                "{title}: {n} series, the stream lost records: {lost}"
            );
        } else {
            assert!(*top > 0.0, "{title}: nothing above 0 from {expr}");
        }
    }
}

fn unix_seconds(t: SystemTime) -> f64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}
