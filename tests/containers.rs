//! SQL Server in a container: the simulator under podman (runc), from an
//! image built from Debian's packages (its own libssl), in a container with
//! its own cgroup and mount and pid namespaces, its log on a volume (a
//! directory of the host mounted at /var/opt/mssql, a path the host does not
//! have) and its data file on the container's overlay root, its TDS port in
//! a network namespace of the lab. stalltrace runs on the host: with no
//! container option it finds the instance and names the container on every
//! record about it; with `--container` or `--pid` it keeps to that process.
//!
//! Oracles: podman's own id for the container (`--cidfile`) and its upper
//! directory (`podman inspect`), sqlclient's report (each session's SPID and
//! client port), the files the test put on the volume, and a run with no
//! filter beside the limited ones. The simulator's account of its worker's
//! pid is translated to the host's by the worker's NSpid (the lab's
//! `SqlServerSim::worker`).

mod common;

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::time::Duration;

use common::netlab::{NetPair, Side};
use common::sqllab::{Cgroup, Placement, SMALL_FILES, SlowDisk, SqlClientRun, SqlServerSim};
use common::*;
use serde_json::Value;
use stalltrace_lab::container::{PodmanApi, SimContainer};
use stalltrace_lab::prometheus::{free_port, get};
use stalltrace_lab::scenario::ScratchDir;

/// Under 5% loss on the client link (encrypted sessions) and with the log's
/// disk slowed down for the container's cgroup: the instance says its
/// container (runtime, id, cgroup), its image's libssl, and its files as it
/// names them, the log on the volume's disk and the data file on the
/// overlay's upper directory's; every retransmission on its sessions names
/// the SPID (from the TLS plaintext) and the container, and its slow log
/// writes name the file and the container.
#[test]
fn a_sql_server_in_a_container_is_named_by_its_container() {
    require_root();
    let pair = NetPair::new();
    let volume = SlowDisk::new(32);
    let container = SimContainer::new(&[(&volume.upper.dir, "/var/opt/mssql")]);
    // Where stalltrace asks podman for the container's name.
    let _api = PodmanApi::start();
    let listen = format!("127.0.0.1:{}", free_port());
    let mut tracer = Tracer::start(&[
        "--interval",
        "500ms",
        "--slow-io-ms",
        "5",
        "--prometheus",
        &listen,
        "--prometheus-containers",
        "4",
    ]);
    let log = volume.upper.path("sales_log.ldf");
    // As the worker names it; the host has no such file.
    let log_inside = "/var/opt/mssql/sales_log.ldf";
    assert_eq!(container.inside(&log).to_str(), Some(log_inside));
    assert!(!std::path::Path::new(log_inside).exists());
    // The data file in the container's own root (overlayfs), on no volume.
    let data_inside = "/var/opt/sales.mdf";
    let sim = SqlServerSim::start(
        &bins(),
        Placement {
            netns: Some(pair.netns(Side::B)),
            container: Some(&container),
            ..Default::default()
        },
        "0.0.0.0:0",
        std::path::Path::new(data_inside),
        &log,
        SMALL_FILES,
    );
    // The container's name comes from podman's API, asked off the records'
    // path: records made before its answer lack it (records.md). A new
    // `sql_instance` says it once it is in; the load starts after that.
    let named = tracer.wait_for(Duration::from_secs(20), |r| {
        r["type"] == "sql_instance"
            && r["pid"] == sim.worker
            && r["container"]["name"] == container.name.as_str()
    });
    let named_from = named["seqno"].as_u64().expect("a seqno");
    let id = container.id();

    // Loss first, at full speed; then the slow log, with fewer commits.
    let server = format!("{}:{}", pair.v4(Side::B), sim.port);
    let client_side = Placement::in_netns(pair.netns(Side::A));
    // Encrypted, as today's drivers are: the SPIDs come from the worker's
    // SSL_write, i.e. from uprobes on the image's own libssl.
    let mut client = SqlClientRun::sqlclient(&bins(), client_side, &server, "on", 4, 300, 5);
    client.wait_for_sessions(&pair, sim.port, 4, Duration::from_secs(20));
    pair.drop_random(Side::A, 5, Some(sim.port));
    let report = client.finish();
    pair.clear_drops(Side::A);
    // The container's own cgroup, as podman made it: 5 writes a second,
    // fewer than the client commits, so every log write waits its turn.
    volume.slow_down(&Cgroup::of_process(sim.worker), 5);
    let slow_commits = SqlClientRun::start(&bins(), client_side, &server, 2, 10, 3).finish();
    assert_eq!(slow_commits.errors(), 0, "sqlclient: {}", slow_commits.0);
    std::thread::sleep(Duration::from_millis(1200));
    let scrape = get(&format!("http://{listen}/metrics")).expect("a scrape of /metrics");
    let records = tracer.stop();
    assert_eq!(report.errors(), 0, "sqlclient: {}", report.0);
    let sessions: BTreeMap<u16, u16> = report.sessions().into_iter().collect();
    assert_eq!(sessions.len(), 4, "sqlclient sessions: {}", report.0);

    // The instance, with podman's container.
    let instance = of_type(&records, "sql_instance")
        .into_iter()
        .rfind(|r| r["pid"] == sim.worker)
        .expect("a sql_instance of the worker");
    let said = &instance["container"];
    eprintln!("sql_instance container: {said}");
    assert_eq!(said["id"], id.as_str(), "{instance}");
    assert_eq!(said["runtime"], "podman", "{instance}");
    assert_eq!(said["name"], container.name.as_str(), "{instance}");
    assert!(
        said["cgroup"]
            .as_str()
            .unwrap()
            .contains(&format!("libpod-{id}")),
        "{instance}"
    );
    // Its libssl is the image's (Debian's libssl3), in its own mount namespace.
    let tls = &instance["tls"];
    assert_eq!(tls["state"], "available", "{instance}");
    let library = tls["library"].as_str().unwrap_or_default();
    assert!(library.contains("libssl.so.3"), "{instance}");
    let disk = format!("{}:{}", volume.upper.disk.major, volume.upper.disk.minor);
    assert!(
        instance["files"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f["path"] == log_inside
                && f["role"] == "log"
                && f["disks"][0] == disk.as_str()),
        "the log file on the volume's disk {disk}: {instance}"
    );

    // The data file on the overlay: its writes go to the upper directory
    // podman made for the container, on that directory's disk.
    let upper = podman_upper_dir(&id);
    let upper_dev = std::fs::metadata(&upper).unwrap().dev();
    let upper_disk = format!("{}:{}", libc::major(upper_dev), libc::minor(upper_dev));
    let data = instance["files"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["path"] == data_inside)
        .unwrap_or_else(|| panic!("no {data_inside} in {instance}"));
    eprintln!("data file: {data}; podman's upper directory {upper} on {upper_disk}");
    assert_eq!(data["role"], "data", "{data}");
    assert_eq!(data["overlay"]["upper_dir"], upper.as_str(), "{data}");
    // This VM's root filesystem is on a whole disk (no partition).
    assert_eq!(data["disks"][0], upper_disk.as_str(), "{data}");

    // Every retransmission on its sessions: the SPID and the container.
    let client_ip = pair.v4(Side::A).to_string();
    let retransmits: Vec<&Value> = retransmits_in(&records, pair.netns_inode(Side::B))
        .into_iter()
        .filter(|r| r["sport"] == sim.port)
        .collect();
    assert!(
        retransmits.len() >= 5,
        "too little loss to judge: {}",
        retransmits.len()
    );
    let wrong: Vec<&&Value> = retransmits
        .iter()
        .filter(|r| {
            let port = r["dport"].as_u64().unwrap() as u16;
            let sql = &r["sql"];
            !(sessions.get(&port).is_some_and(|&spid| sql["spid"] == spid)
                && sql["spid_source"] == "tls_plaintext"
                && sql["client"] == format!("{client_ip}:{port}").as_str()
                && sql["container"] == id.as_str())
        })
        .collect();
    eprintln!("{} retransmits on the sessions", retransmits.len());
    assert!(
        wrong.is_empty(),
        "{} of {} retransmits do not name their SPID and container: {:?}",
        wrong.len(),
        retransmits.len(),
        &wrong[..wrong.len().min(3)]
    );

    // The worker's slow I/O: its log writes name the file and the container.
    let slow: Vec<&Value> = of_type(&records, "slow_io")
        .into_iter()
        .filter(|r| r["pid"] == sim.worker)
        .collect();
    let on_log = slow.iter().filter(|r| r["file"] == log_inside).count();
    eprintln!(
        "{} slow I/Os of the worker, {on_log} on the log",
        slow.len()
    );
    assert!(on_log > 0, "no slow write names {log_inside}: {slow:?}");
    // Per container in /metrics (--prometheus-containers), as the stream has it.
    let scraped = |name: &str| -> f64 {
        let series = format!("{name}{{container=\"{}\"}} ", &id[..12]);
        scrape
            .lines()
            .find_map(|l| l.strip_prefix(series.as_str()))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {series} in the scrape"))
    };
    let sent_segments: u64 = of_type(&records, "tcp_retransmit")
        .iter()
        .filter(|r| r["sql"]["container"] == id.as_str() && r["err"] == 0)
        .map(|r| r["segs"].as_u64().unwrap())
        .sum();
    let containers_slow = of_type(&records, "slow_io")
        .iter()
        .filter(|r| r["container"]["id"] == id.as_str())
        .count();
    eprintln!("metrics: {sent_segments} segments, {containers_slow} slow I/Os of the container");
    assert_eq!(
        scraped("stalltrace_container_retransmitted_segments_total"),
        sent_segments as f64
    );
    assert_eq!(
        scraped("stalltrace_container_slow_ios_total"),
        containers_slow as f64
    );
    // Before the name was in (e.g. a slow write of the data file while the
    // worker started, on a busy host): no name or the container's; after, the
    // container's on every one.
    for r in &slow {
        assert_eq!(r["container"]["id"], id.as_str(), "{r}");
        assert_eq!(r["sql"]["container"], id.as_str(), "{r}");
        let name = &r["container"]["name"];
        if r["seqno"].as_u64().expect("a seqno") > named_from {
            assert_eq!(name, container.name.as_str(), "{r}");
        } else {
            assert!(name.is_null() || name == container.name.as_str(), "{r}");
        }
    }
    assert!(
        slow.iter()
            .any(|r| r["file"] == log_inside && r["seqno"].as_u64() > Some(named_from)),
        "no slow write of the log after the name was in: {slow:?}"
    );
}

/// The upper directory of container `id`'s root, as podman says it.
fn podman_upper_dir(id: &str) -> String {
    let out = std::process::Command::new("podman")
        .args(["inspect", "--format", "{{.GraphDriver.Data.UpperDir}}", id])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "podman inspect: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// Retransmissions in `records` of the server's namespace, by the server's port.
fn retransmits_by_port(records: &[Value], netns: u64) -> BTreeMap<u64, usize> {
    let mut by_port = BTreeMap::new();
    for r in of_type(records, "tcp_retransmit") {
        let port = if r["netns"] == netns {
            r["sport"].as_u64().unwrap()
        } else {
            0 // another namespace's: the clients'
        };
        *by_port.entry(port).or_default() += 1;
    }
    by_port
}

/// Two simulators under 5% loss, one in a container and one on the host, and
/// three runs at once: one with no filter, one `--container NAME`, one
/// `--pid` of the host's worker. Each limited run finds only its instance and
/// has exactly the unlimited run's retransmissions of its worker's sessions,
/// and no other (none of the other worker's, none of the clients').
///
/// Oracle: the unlimited run, whose retransmissions match the kernel's
/// counters in tests/net.rs and tests/sqlserver.rs; it shows the other
/// worker's sessions lost segments in the same seconds.
#[test]
fn a_run_limited_to_a_container_or_a_pid_writes_only_its_processes() {
    require_root();
    let pair = NetPair::new();
    let volume = ScratchDir::new("/var/tmp");
    let host_files = ScratchDir::new("/var/tmp");
    let container = SimContainer::new(&[(&volume.0, "/var/opt/mssql")]);
    let _api = PodmanApi::start();
    let in_container = Placement {
        netns: Some(pair.netns(Side::B)),
        container: Some(&container),
        ..Default::default()
    };
    let contained = SqlServerSim::start(
        &bins(),
        in_container,
        "0.0.0.0:0",
        &volume.0.join("sales.mdf"),
        &volume.0.join("sales_log.ldf"),
        SMALL_FILES,
    );
    let hosted = SqlServerSim::start_small(
        &bins(),
        Placement::in_netns(pair.netns(Side::B)),
        &host_files.0,
        &[],
    );
    let common = ["--interval", "500ms", "--slow-io-ms", "0"];
    let worker = hosted.worker.to_string();
    let mut all = Tracer::start(&common);
    // By name: resolved through podman's API.
    let mut only_container =
        Tracer::start(&[&common[..], &["--container", &container.name]].concat());
    let mut only_pid = Tracer::start(&[&common[..], &["--pid", &worker]].concat());
    for (tracer, workers) in [
        (&mut all, vec![contained.worker, hosted.worker]),
        (&mut only_container, vec![contained.worker]),
        (&mut only_pid, vec![hosted.worker]),
    ] {
        for pid in workers {
            tracer.wait_for(Duration::from_secs(10), |r| {
                r["type"] == "sql_instance" && r["pid"] == pid
            });
        }
    }

    let client_side = Placement::in_netns(pair.netns(Side::A));
    let mut clients = Vec::new();
    for sim in [&contained, &hosted] {
        let server = format!("{}:{}", pair.v4(Side::B), sim.port);
        let mut client = SqlClientRun::start(&bins(), client_side, &server, 2, 300, 5);
        client.wait_for_sessions(&pair, sim.port, 2, Duration::from_secs(20));
        clients.push(client);
    }
    pair.drop_random(Side::A, 5, None);
    for client in clients {
        let report = client.finish();
        assert_eq!(report.errors(), 0, "sqlclient: {}", report.0);
    }
    pair.clear_drops(Side::A);
    // Nothing left to send again when the runs end, one after the other.
    for port in [contained.port, hosted.port] {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            let filter = format!("sport = :{port}");
            let left = pair.exec(Side::B, &["ss", "-Htn", "state", "all", &filter]);
            let busy: Vec<&str> = left
                .lines()
                .filter(|l| !l.starts_with("LISTEN") && !l.starts_with("TIME-WAIT"))
                .collect();
            if busy.is_empty() {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "still open: {busy:?}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    std::thread::sleep(Duration::from_millis(1200));
    let (all, only_container, only_pid) = (all.stop(), only_container.stop(), only_pid.stop());

    let netns = pair.netns_inode(Side::B);
    let (c_port, h_port) = (u64::from(contained.port), u64::from(hosted.port));
    let everything = retransmits_by_port(&all, netns);
    eprintln!(
        "retransmits by server port (0: the clients'): all {everything:?}, --container {:?}, --pid {:?}",
        retransmits_by_port(&only_container, netns),
        retransmits_by_port(&only_pid, netns)
    );
    let at = |port| everything.get(&port).copied().unwrap_or(0);
    assert!(
        at(c_port) >= 5 && at(h_port) >= 5,
        "too little loss to judge: {everything:?}"
    );
    for (records, port, worker, filter) in [
        (&only_container, c_port, contained.worker, "--container"),
        (&only_pid, h_port, hosted.worker, "--pid"),
    ] {
        let lost: Vec<&Value> = of_type(records, "lost")
            .into_iter()
            .chain(of_type(&all, "lost"))
            .map(|r| &r["by_source"])
            .collect();
        eprintln!("{filter}: lost, then the unlimited run's: {lost:?}");
        assert_eq!(
            retransmits_by_port(records, netns),
            BTreeMap::from([(port, at(port))]),
            "{filter}: its worker's retransmissions, all of them, and no other"
        );
        let instances: Vec<u64> = of_type(records, "sql_instance")
            .iter()
            .filter_map(|r| r["pid"].as_u64())
            .collect();
        assert!(
            instances.iter().all(|&pid| pid == u64::from(worker)),
            "{filter}: instances {instances:?}, only {worker} expected"
        );
        assert!(
            of_type(records, "tcp_retransmit")
                .iter()
                .all(|r| r["pid"] == worker),
            "{filter}: a retransmit names another process"
        );
    }
    assert_eq!(
        only_container[0]["filters"]["containers"],
        serde_json::json!([container.id()])
    );
}
