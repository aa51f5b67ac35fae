//! Faults during a run, end to end: the tracer killed at any moment, the
//! host's namespaces, interfaces and disks churned by the thousand under it,
//! the SQL Server worker restarted, a ring buffer flooded past its size.
//!
//! Oracles, each independent of stalltrace's code: bpftool and /proc (what is
//! loaded, held, pinned, mounted; map occupancy), the lab's own log of what it
//! created and removed and when, the simulator's and its client's reports,
//! and /proc/diskstats. Everything made here has a pid-unique name and a Drop
//! guard, so a failing test leaves the shared kernel clean.
//!
//! Run as root (`cargo xtask test`); nextest runs them one at a time with the
//! other privileged tests (.config/nextest.toml).

#[path = "faults/churn.rs"]
mod churn;
mod common;
#[path = "faults/ringbuf.rs"]
mod ringbuf;
#[path = "faults/skipped.rs"]
mod skipped;
#[path = "faults/sql.rs"]
mod sql;
#[path = "faults/sweep.rs"]
mod sweep;

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use common::*;
use serde_json::Value;
use stalltrace_lab::kernel_objects as ko;

/// When a record's `ts` says it was written.
fn ts_of(r: &Value) -> SystemTime {
    let text = r["ts"].as_str().expect("ts");
    let t = chrono::DateTime::parse_from_rfc3339(text).expect("RFC 3339 ts");
    SystemTime::UNIX_EPOCH + Duration::from_micros(t.timestamp_micros() as u64)
}

/// `b - a` in ms, negative when b is earlier.
fn ms_between(a: SystemTime, b: SystemTime) -> f64 {
    match b.duration_since(a) {
        Ok(d) => d.as_secs_f64() * 1e3,
        Err(e) => -e.duration().as_secs_f64() * 1e3,
    }
}

// ---- 1. SIGKILL at any moment ------------------------------------------------

/// splitmix64: a seeded sequence, printed so a failing run can be replayed.
struct Rng(u64);

impl Rng {
    fn from_env_or_clock() -> Self {
        let seed = std::env::var("STALLTRACE_FAULT_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                SystemTime::now()
                    .duration_since(SystemTime::UNIX_EPOCH)
                    .unwrap()
                    .as_nanos() as u64
            });
        eprintln!("seed {seed} (STALLTRACE_FAULT_SEED={seed} replays these kill times)");
        Self(seed)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        (z ^ (z >> 31)) % n
    }
}

/// A stalltrace child killed on drop (when a check fails half-way).
struct Daemon {
    child: Child,
    out: PathBuf,
    err: PathBuf,
}

impl Daemon {
    fn spawn() -> Self {
        let out = std::env::temp_dir().join(format!("{}.jsonl", unique("stalltrace-kill")));
        let err = out.with_extension("stderr");
        let child = Command::new(stalltrace_bin())
            .args(["run", "--interval", "200ms", "--out"])
            .arg(&out)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&err).unwrap())
            .spawn()
            .unwrap();
        Self { child, out, err }
    }
    fn started(&self) -> bool {
        std::fs::read_to_string(&self.out).is_ok_and(|t| t.contains(r#""type":"start""#))
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.out);
        let _ = std::fs::remove_file(&self.err);
    }
}

/// Where a daemon was when the kill came (read just before it).
#[derive(Default, Debug)]
struct Tally {
    kills: usize,
    no_bpf_object_yet: usize,
    loading: usize,
    streaming: usize,
    slowest_cleanup_ms: u128,
}

const KILLS_PER_MODE: usize = 26;

/// SIGKILL during start-up, attach and streaming, at random moments, half on
/// a host with a bpffs at /sys/fs/bpf and half without: afterwards no program
/// or map of stalltrace's is left, nothing is pinned (the daemon pins
/// nothing; a pin would outlive the kill), no bpffs mount changed.
#[test]
fn sigkill_at_any_moment_leaves_nothing_behind() {
    require_root();
    let mut rng = Rng::from_env_or_clock();
    let map_names = ko::stalltrace_map_names();
    let since = ko::baseline();
    let host_mounts = ko::bpf_mounts(Path::new("/proc/1/mountinfo"));
    let host_bpffs = Path::new("/proc/1/root/sys/fs/bpf");
    // How long this machine takes to stream: the kills spread over start-up,
    // attach and the first intervals whatever the load.
    let launched = Instant::now();
    let first = Daemon::spawn();
    while !first.started() {
        assert!(
            launched.elapsed() < Duration::from_secs(30),
            "no start record in 30 s"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let to_start = launched.elapsed();
    drop(first);
    let span_ms = (to_start.as_millis() as u64 * 8 / 5).max(1500);
    eprintln!("start record after {to_start:?}: kills spread over 0–{span_ms} ms after spawn");

    let mut tally = Tally::default();
    for bpffs in [true, false] {
        ko::in_mount_namespace(bpffs, || {
            let own_mounts = ko::bpf_mounts(Path::new("/proc/thread-self/mountinfo"));
            for _ in 0..KILLS_PER_MODE {
                let delay = Duration::from_millis(rng.below(span_ms + 1));
                let mut daemon = Daemon::spawn();
                let pid = daemon.child.id();
                let spawned = Instant::now();
                std::thread::sleep(delay);
                let what = format!(
                    "kill {} ({}bpffs, {:?} after spawn)",
                    tally.kills + 1,
                    if bpffs { "" } else { "no " },
                    spawned.elapsed()
                );
                let held = ko::held(Some(pid));
                let started = daemon.started();
                // SAFETY: kill(2) on our own child.
                unsafe { libc::kill(pid as i32, libc::SIGKILL) };
                let status = daemon.child.wait().unwrap();
                assert_eq!(
                    status.signal(),
                    Some(libc::SIGKILL),
                    "{what}: the daemon ended by itself ({status}): {}",
                    std::fs::read_to_string(&daemon.err).unwrap_or_default()
                );
                tally.kills += 1;
                match (started, held.progs.len() + held.maps.len()) {
                    (true, _) => tally.streaming += 1,
                    (false, 0) => tally.no_bpf_object_yet += 1,
                    _ => tally.loading += 1,
                }
                // Pins are never cleaned up by the kernel: nothing may wait.
                let pins = ko::stalltrace_pins(Path::new("/sys/fs/bpf"));
                assert!(
                    pins.is_empty(),
                    "{what}: left pinned in /sys/fs/bpf: {pins:?}"
                );
                let host_pins: Vec<String> = ko::stalltrace_pins(host_bpffs)
                    .into_iter()
                    .filter(|p| p.starts_with(&format!("stalltrace-{pid}-")))
                    .collect();
                assert!(
                    host_pins.is_empty(),
                    "{what}: pinned in the host's bpffs: {host_pins:?}"
                );
                let mounts = ko::bpf_mounts(Path::new("/proc/thread-self/mountinfo"));
                assert_eq!(mounts, own_mounts, "{what}: bpffs mounts changed");
                let mounts = ko::bpf_mounts(Path::new("/proc/1/mountinfo"));
                assert_eq!(
                    mounts, host_mounts,
                    "{what}: the host's bpffs mounts changed"
                );
                match ko::await_no_leftovers(since, &map_names, Duration::from_secs(10)) {
                    Ok(took) => {
                        tally.slowest_cleanup_ms = tally.slowest_cleanup_ms.max(took.as_millis())
                    }
                    Err(left) => panic!("{what}: still there 10 s later: {left:?}"),
                }
            }
        });
    }
    eprintln!("{tally:?}");
    assert_eq!(tally.kills, 2 * KILLS_PER_MODE);
    assert!(
        tally.streaming > 0 && tally.loading > 0,
        "the kills missed attach or streaming: {tally:?}"
    );
}
