//! End to end: sqlservr's process tree and kernel-visible footprint, and
//! sqlclient's sessions and report against it.

mod common;

use std::collections::{BTreeSet, HashSet};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{Server, alive, comm, wait_timeout};
use serde_json::Value;

/// Inodes of the TCP sockets listening on `port` (/proc/net/tcp and tcp6).
fn listening_inodes(port: u16) -> HashSet<u64> {
    let mut out = HashSet::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            let local_port = f[1]
                .rsplit(':')
                .next()
                .and_then(|p| u16::from_str_radix(p, 16).ok());
            // st 0A is TCP_LISTEN; field 9 is the inode.
            if local_port == Some(port) && f[3] == "0A" {
                out.insert(f[9].parse().unwrap());
            }
        }
    }
    out
}

/// What a process's fds point at: socket inodes and file paths, with each
/// file's open flags (from fdinfo).
fn fds(pid: u32) -> (HashSet<u64>, Vec<(PathBuf, u32)>) {
    let (mut sockets, mut files) = (HashSet::new(), Vec::new());
    for e in std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
    {
        let Ok(target) = std::fs::read_link(e.path()) else {
            continue;
        };
        let t = target.to_string_lossy();
        if let Some(inode) = t.strip_prefix("socket:[").and_then(|s| s.strip_suffix(']')) {
            sockets.insert(inode.parse().unwrap());
        } else if target.is_absolute() {
            let info = std::fs::read_to_string(format!(
                "/proc/{pid}/fdinfo/{}",
                e.file_name().to_string_lossy()
            ))
            .unwrap_or_default();
            let flags = info
                .lines()
                .find_map(|l| l.strip_prefix("flags:"))
                .map(|f| u32::from_str_radix(f.trim(), 8).unwrap())
                .unwrap_or(0);
            files.push((target, flags));
        }
    }
    (sockets, files)
}

/// The parent pid from /proc/PID/stat (after the parenthesised comm).
fn ppid(pid: u32) -> u32 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    after.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[test]
fn process_tree_files_sessions_and_report() {
    let mut srv = Server::start("e2e");

    // Watchdog and worker, both named sqlservr, one the parent of the other.
    assert_eq!(comm(srv.parent).as_deref(), Some("sqlservr"));
    assert_eq!(comm(srv.worker).as_deref(), Some("sqlservr"));
    assert_ne!(srv.parent, srv.worker);
    assert_eq!(ppid(srv.worker), srv.parent);

    // Only the worker holds the listening socket and the database files.
    let listen = listening_inodes(srv.port);
    assert_eq!(listen.len(), 1, "one listener on port {}", srv.port);
    let (worker_socks, worker_files) = fds(srv.worker);
    let (parent_socks, parent_files) = fds(srv.parent);
    assert!(listen.is_subset(&worker_socks), "worker holds the listener");
    assert!(listen.is_disjoint(&parent_socks), "watchdog does not");
    for path in [&srv.data, &srv.log] {
        let open = worker_files
            .iter()
            .find(|(p, _)| p == path)
            .unwrap_or_else(|| panic!("worker has {path:?} open"));
        assert_ne!(
            open.1 & libc::O_DIRECT as u32,
            0,
            "{path:?} opened with O_DIRECT"
        );
        assert!(
            !parent_files.iter().any(|(p, _)| p == path),
            "watchdog has {path:?} open"
        );
    }
    assert_eq!(std::fs::metadata(&srv.data).unwrap().len(), 16 << 20);
    assert_eq!(std::fs::metadata(&srv.log).unwrap().len(), 8 << 20);

    // 3 sessions at 200 tps for 2 s.
    let mut client = Command::new(env!("CARGO_BIN_EXE_sqlclient"))
        .args([
            "--server",
            &srv.addr(),
            "--sessions",
            "3",
            "--rate",
            "200",
            "--duration",
            "2",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let status = wait_timeout(&mut client, Duration::from_secs(120));
    if status.is_none() {
        let _ = client.kill();
        panic!("sqlclient did not finish in 120 s");
    }
    let out = client.wait_with_output().unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(status.unwrap().success(), "sqlclient failed: {text}");
    assert_eq!(text.lines().count(), 1, "one JSON line: {text}");
    let r: Value = serde_json::from_str(&text).unwrap();

    assert_eq!(r["errors"], 0, "{text}");
    let sessions = r["sessions"].as_array().unwrap();
    assert_eq!(sessions.len(), 3, "{text}");
    let spids: BTreeSet<u64> = sessions
        .iter()
        .map(|s| s["spid"].as_u64().unwrap())
        .collect();
    let ports: BTreeSet<u64> = sessions
        .iter()
        .map(|s| s["client_port"].as_u64().unwrap())
        .collect();
    assert_eq!(spids.len(), 3, "distinct SPIDs: {text}");
    assert!(
        spids.iter().all(|s| *s >= 51),
        "user SPIDs start at 51: {text}"
    );
    assert_eq!(ports.len(), 3, "distinct client ports: {text}");
    assert!(!ports.contains(&0));
    // The schedule is 3 × 134 = 402; a slow disk (every transaction waits
    // for fdatasync) may cost some, never add.
    let n = r["transactions"].as_u64().unwrap();
    assert!((200..=402).contains(&n), "transactions {n}: {text}");
    let per_session: u64 = sessions
        .iter()
        .map(|s| s["transactions"].as_u64().unwrap())
        .sum();
    assert_eq!(per_session, n);
    let (p50, p99, max) = (
        r["p50_us"].as_u64().unwrap(),
        r["p99_us"].as_u64().unwrap(),
        r["max_us"].as_u64().unwrap(),
    );
    assert!(0 < p50 && p50 <= p99 && p99 <= max, "{text}");

    // SIGTERM: the watchdog forwards it, the worker shuts down, both exit 0.
    let st = srv
        .terminate(Duration::from_secs(20))
        .expect("sqlservr did not exit on SIGTERM");
    assert!(st.success(), "exit status {st:?}");
    assert!(!alive(srv.worker), "worker is gone");
    assert!(listening_inodes(srv.port).is_empty());
}

#[test]
fn worker_exits_when_the_watchdog_is_killed() {
    let mut srv = Server::start("pdeath");
    common::signal(srv.parent, libc::SIGKILL);
    let _ = srv.child.wait();
    // The worker gets SIGTERM from the kernel (PR_SET_PDEATHSIG) and shuts down.
    let gone = (0..500).any(|_| {
        std::thread::sleep(Duration::from_millis(20));
        !alive(srv.worker)
    });
    assert!(gone, "worker {} outlived its watchdog", srv.worker);
}

#[test]
fn bad_file_names_are_refused() {
    let out = Command::new(env!("CARGO_BIN_EXE_sqlservr"))
        .args([
            "--data",
            "/nonexistent/x.dat",
            "--log",
            "/nonexistent/x.ldf",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains(".mdf"));
}
