//! The lab the end-to-end tests build: loop devices, the stalltrace binary as a
//! child process, fio as the independent oracle, /proc/diskstats, and schema
//! validation of every record read.
//!
//! Everything a test creates has a unique name and is removed by a Drop guard,
//! so a failing (panicking) test still leaves the shared kernel clean.
#![allow(dead_code)] // each test binary uses a different subset

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;

pub mod netlab;
pub mod sqllab;

/// Privileged tests never skip: without root they cannot do their job, so they fail.
pub fn require_root() {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "this test needs root (loop devices, eBPF programs); run `cargo xtask test` as root"
    );
}

pub fn stalltrace_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_stalltrace"))
}

/// A name no other test (or test process) uses.
pub fn unique(prefix: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// Run a command; panic with its stderr if it fails. Returns stdout.
pub fn sh(program: &str, args: &[&str]) -> String {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {program}: {e} (run `cargo xtask setup`)"));
    assert!(
        out.status.success(),
        "{program} {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

// ---- loop devices -------------------------------------------------------------

/// Where the backing file lives: a real disk (ext4 here) or memory.
#[derive(Clone, Copy, Debug)]
pub enum Backing {
    Disk,
    Tmpfs,
}

/// A loop device over a file of real (random) data, detached and deleted on drop.
pub struct LoopDevice {
    pub dev: String,  // "/dev/loop3"
    pub name: String, // "loop3"
    pub major: u32,
    pub minor: u32,
    backing: PathBuf,
}

impl LoopDevice {
    /// `direct_io`: the loop driver reads its file with O_DIRECT, so the device
    /// time is the backing disk's, not the page cache's.
    pub fn new(backing: Backing, size_mib: u32, direct_io: bool) -> Self {
        let dir = match backing {
            Backing::Disk => "/var/tmp",
            Backing::Tmpfs => "/dev/shm",
        };
        Self::new_in(Path::new(dir), size_mib, direct_io)
    }

    /// A loop device over a new file in `dir` (tmpfs or a filesystem that takes O_DIRECT).
    pub fn new_in(dir: &Path, size_mib: u32, direct_io: bool) -> Self {
        let file = dir.join(format!("{}.img", unique("stalltrace-test")));
        // Real data: reads of a sparse file's holes never reach the disk. Written
        // with O_DIRECT so no writeback of it lands in the middle of a measurement
        // (tmpfs takes no O_DIRECT: synchronous writes there).
        let on_tmpfs = dir.starts_with("/dev/shm");
        let oflag = if on_tmpfs {
            "oflag=sync"
        } else {
            "oflag=direct"
        };
        sh(
            "dd",
            &[
                "if=/dev/urandom",
                &format!("of={}", file.display()),
                "bs=1M",
                &format!("count={size_mib}"),
                oflag,
                "status=none",
            ],
        );
        let mut args = vec!["--find", "--show"];
        if direct_io {
            args.push("--direct-io=on");
        }
        let file_arg = file.to_string_lossy().into_owned();
        args.push(&file_arg);
        let out = Command::new("losetup")
            .args(&args)
            .output()
            .expect("losetup");
        if !out.status.success() {
            let _ = std::fs::remove_file(&file);
            panic!("losetup failed: {}", String::from_utf8_lossy(&out.stderr));
        }
        let dev = String::from_utf8_lossy(&out.stdout).trim().to_string();
        let name = dev.trim_start_matches("/dev/").to_string();
        let numbers = std::fs::read_to_string(format!("/sys/block/{name}/dev")).unwrap();
        let (major, minor) = numbers.trim().split_once(':').unwrap();
        let loop_dev = Self {
            dev,
            name,
            major: major.parse().unwrap(),
            minor: minor.parse().unwrap(),
            backing: file,
        };
        // udev's blkid probe of a new device would otherwise land in the measurements.
        let _ = Command::new("udevadm")
            .args(["settle", "--timeout=5"])
            .status();
        loop_dev
    }

    pub fn set_queue(&self, attribute: &str, value: &str) {
        let path = format!("/sys/block/{}/queue/{attribute}", self.name);
        std::fs::write(&path, value).unwrap_or_else(|e| panic!("writing {value} to {path}: {e}"));
    }

    pub fn diskstats(&self) -> DiskStats {
        DiskStats::read(&self.name)
    }

    /// The kernel's own in-flight counts (reads, writes) for this disk.
    pub fn kernel_inflight(&self) -> (u64, u64) {
        let text = std::fs::read_to_string(format!("/sys/block/{}/inflight", self.name)).unwrap();
        let v: Vec<u64> = text
            .split_whitespace()
            .map(|x| x.parse().unwrap())
            .collect();
        (v[0], v[1])
    }
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        let _ = Command::new("losetup").args(["-d", &self.dev]).status();
        let _ = std::fs::remove_file(&self.backing);
        remove_loop_device(self.minor);
    }
}

/// Delete the (detached) loop device itself, so the next test that gets this
/// number gets a new queue. A detached loop device keeps its queue, and on
/// 6.18 a driver tag depth lowered through nr_requests with scheduler `none`
/// does not come back when nr_requests is raised again: a later user of the
/// same loop number would be silently limited.
fn remove_loop_device(minor: u32) {
    const LOOP_CTL_REMOVE: libc::c_ulong = 0x4C81;
    let Ok(ctl) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/loop-control")
    else {
        return;
    };
    for _ in 0..50 {
        // SAFETY: ioctl on a file we own; LOOP_CTL_REMOVE takes the device number by value.
        let rc = unsafe {
            libc::ioctl(
                std::os::fd::AsRawFd::as_raw_fd(&ctl),
                LOOP_CTL_REMOVE,
                minor as libc::c_ulong,
            )
        };
        if rc >= 0 {
            return;
        }
        // EBUSY while udev still has it open after the detach.
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A line of /proc/diskstats, parsed here on purpose rather than with the
/// code under test: it is the independent oracle.
#[derive(Clone, Copy, Debug, Default)]
pub struct DiskStats {
    pub reads_completed: u64,
    pub read_ticks_ms: u64,
    pub writes_completed: u64,
}

impl DiskStats {
    pub fn read(name: &str) -> Self {
        let text = std::fs::read_to_string("/proc/diskstats").unwrap();
        for line in text.lines() {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.get(2) == Some(&name) {
                let n = |i: usize| f[i].parse::<u64>().unwrap();
                return Self {
                    reads_completed: n(3),
                    read_ticks_ms: n(6),
                    writes_completed: n(7),
                };
            }
        }
        panic!("{name} not in /proc/diskstats");
    }
}

// ---- fio ------------------------------------------------------------------------

/// fio's own figures for one job's reads.
#[derive(Debug, Clone)]
pub struct Fio {
    pub ios: u64,
    pub iops: f64,
    pub clat_p50_us: f64,
    pub clat_p99_us: f64,
    pub clat_mean_us: f64,
}

/// fio 4k random reads with O_DIRECT on `dev` for `runtime_s` seconds;
/// `engine` holds the engine and depth options (e.g. `--ioengine=libaio`, `--iodepth=16`).
pub fn randread_4k(dev: &str, engine: &[&str], runtime_s: u32) -> Fio {
    let runtime = format!("--runtime={runtime_s}");
    let mut job = vec![
        "--rw=randread",
        "--bs=4k",
        "--direct=1",
        "--time_based",
        &runtime,
    ];
    job.extend_from_slice(engine);
    fio(dev, &job)
}

/// Run fio against `dev` with `--output-format=json` and the given job options.
pub fn fio(dev: &str, job: &[&str]) -> Fio {
    let mut args = vec![
        "--name=stalltrace-test".to_string(),
        format!("--filename={dev}"),
        "--output-format=json".to_string(),
        "--thread".to_string(), // jobs are threads of this fio process: one pid to match
    ];
    args.extend(job.iter().map(|s| s.to_string()));
    let out = Command::new("fio")
        .args(&args)
        .output()
        .expect("fio (run `cargo xtask setup`)");
    assert!(
        out.status.success(),
        "fio failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: Value = serde_json::from_slice(&out.stdout).expect("fio JSON");
    let read = &json["jobs"][0]["read"];
    let pct = |p: &str| read["clat_ns"]["percentile"][p].as_f64().unwrap() / 1000.0;
    Fio {
        ios: read["total_ios"].as_u64().unwrap(),
        iops: read["iops"].as_f64().unwrap(),
        clat_p50_us: pct("50.000000"),
        clat_p99_us: pct("99.000000"),
        clat_mean_us: read["clat_ns"]["mean"].as_f64().unwrap() / 1000.0,
    }
}

// ---- the stalltrace binary --------------------------------------------------------

fn schema() -> &'static jsonschema::Validator {
    static SCHEMA: OnceLock<jsonschema::Validator> = OnceLock::new();
    SCHEMA.get_or_init(|| {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/schema.json");
        let text = std::fs::read_to_string(&path).expect("docs/schema.json");
        let schema: Value = serde_json::from_str(&text).expect("docs/schema.json is JSON");
        jsonschema::validator_for(&schema).expect("docs/schema.json is a valid JSON Schema")
    })
}

/// Parse JSON lines, validating every one against docs/schema.json.
pub fn parse_records(text: &str) -> Vec<Value> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let v: Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("line {}: not JSON ({e}): {line}", n + 1));
        let errors: Vec<String> = schema()
            .iter_errors(&v)
            .map(|e| format!("{e} at {}", e.instance_path()))
            .collect();
        assert!(
            errors.is_empty(),
            "line {} breaks docs/schema.json: {errors:?}\n{line}",
            n + 1
        );
        out.push(v);
    }
    out
}

/// `stalltrace run` as a child process writing to its own file.
pub struct Tracer {
    child: Option<Child>,
    out: PathBuf,
    stderr: PathBuf,
}

impl Tracer {
    /// Start `stalltrace run --out FILE <args>` and wait for its `start` record.
    pub fn start(args: &[&str]) -> Self {
        Self::start_with_env(args, &[])
    }

    pub fn start_with_env(args: &[&str], env: &[(&str, &str)]) -> Self {
        let out = std::env::temp_dir().join(format!("{}.jsonl", unique("stalltrace-out")));
        let stderr = out.with_extension("stderr");
        let child = Command::new(stalltrace_bin())
            .arg("run")
            .arg("--out")
            .arg(&out)
            .args(args)
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&stderr).unwrap())
            .spawn()
            .expect("spawn stalltrace");
        let mut tracer = Self {
            child: Some(child),
            out,
            stderr,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let text = std::fs::read_to_string(&tracer.out).unwrap_or_default();
            if text
                .lines()
                .next()
                .is_some_and(|l| l.contains(r#""type":"start""#))
            {
                break;
            }
            if let Some(status) = tracer.child.as_mut().unwrap().try_wait().unwrap() {
                panic!(
                    "stalltrace exited before its start record ({status}): {}",
                    tracer.stderr_text()
                );
            }
            assert!(
                Instant::now() < deadline,
                "no start record after 30 s: {}",
                tracer.stderr_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        tracer
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    /// Wait until a record written so far satisfies `what`; return it.
    pub fn wait_for(&mut self, timeout: Duration, what: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + timeout;
        loop {
            let text = std::fs::read_to_string(&self.out).unwrap_or_default();
            // Only whole lines: the last one may be half written.
            let whole = &text[..text.rfind('\n').map_or(0, |i| i + 1)];
            if let Some(found) = whole
                .lines()
                .filter_map(|l| serde_json::from_str::<Value>(l).ok())
                .find(|v| what(v))
            {
                return found;
            }
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("stalltrace exited ({status}): {}", self.stderr_text());
            }
            assert!(
                Instant::now() < deadline,
                "no such record within {timeout:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn stderr_text(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// Send `signal`, wait for exit, and return every record (schema-validated).
    pub fn stop_with(mut self, signal: i32) -> Vec<Value> {
        let mut child = self.child.take().unwrap();
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(child.id() as i32, signal) };
        let deadline = Instant::now() + Duration::from_secs(30);
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("stalltrace did not stop within 30 s of signal {signal}");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        assert!(
            status.success(),
            "stalltrace exited with {status}: {}",
            self.stderr_text()
        );
        parse_records(&std::fs::read_to_string(&self.out).unwrap())
    }

    pub fn stop(self) -> Vec<Value> {
        self.stop_with(libc::SIGINT)
    }
}

impl Drop for Tracer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_file(&self.out);
        let _ = std::fs::remove_file(&self.stderr);
    }
}

// ---- reading records ------------------------------------------------------------

pub fn of_type<'a>(records: &'a [Value], kind: &str) -> Vec<&'a Value> {
    records.iter().filter(|r| r["type"] == kind).collect()
}

/// `block` records of one disk and op, in order.
pub fn block_records<'a>(records: &'a [Value], disk: &str, op: &str) -> Vec<&'a Value> {
    records
        .iter()
        .filter(|r| r["type"] == "block" && r["dev"] == disk && r["op"] == op)
        .collect()
}

pub fn sum_field(records: &[&Value], field: &str) -> u64 {
    records.iter().map(|r| r[field].as_u64().unwrap()).sum()
}

/// A histogram rebuilt from the `[low, high, count]` buckets of many records.
/// Percentiles here are computed independently of stalltrace's own code.
#[derive(Default, Debug)]
pub struct Buckets(std::collections::BTreeMap<(u64, u64), u64>);

impl Buckets {
    pub fn merge(records: &[&Value], field: &str) -> Self {
        let mut b = Self::default();
        for r in records {
            for bucket in r[field]["buckets"].as_array().unwrap() {
                let lo = (bucket[0].as_f64().unwrap() * 1000.0).round() as u64;
                let hi = (bucket[1].as_f64().unwrap() * 1000.0).round() as u64;
                *b.0.entry((lo, hi)).or_default() += bucket[2].as_u64().unwrap();
            }
        }
        b
    }

    pub fn count(&self) -> u64 {
        self.0.values().sum()
    }

    /// Mean from bucket midpoints (within the bucket error of the true mean).
    pub fn mean(&self) -> f64 {
        let total: f64 = self
            .0
            .iter()
            .map(|(&(lo, hi), &n)| (lo + hi) as f64 / 2.0 * n as f64)
            .sum();
        total / self.count() as f64 / 1000.0
    }

    /// Nearest-rank percentile as the bucket midpoint, in the field's unit.
    pub fn percentile(&self, q: f64) -> f64 {
        let total = self.count();
        assert!(total > 0, "empty histogram");
        let rank = ((q * total as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (&(lo, hi), &n) in &self.0 {
            seen += n;
            if seen >= rank {
                return (lo + hi) as f64 / 2.0 / 1000.0;
            }
        }
        unreachable!()
    }

    /// Upper edge of the highest non-empty bucket, in the field's unit.
    pub fn max(&self) -> f64 {
        self.0
            .keys()
            .next_back()
            .map(|&(_, hi)| hi as f64 / 1000.0)
            .unwrap()
    }

    /// Samples in buckets entirely at or above `v` / touching `v` or above.
    pub fn count_at_least(&self, v: f64) -> (u64, u64) {
        let v = (v * 1000.0).round() as u64;
        let surely = self
            .0
            .iter()
            .filter(|((lo, _), _)| *lo >= v)
            .map(|(_, n)| n)
            .sum();
        let maybe = self
            .0
            .iter()
            .filter(|((_, hi), _)| *hi >= v)
            .map(|(_, n)| n)
            .sum();
        (surely, maybe)
    }
}

/// Relative error of one bucket: a reported midpoint is within half of it.
pub const HIST_BUCKET_ERROR: f64 = 1.0 / 16.0;
