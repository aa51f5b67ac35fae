//! fio as load and as the independent oracle of latency and IOPS.

use std::io::Write;
use std::process::{Child, Command, Stdio};

use serde_json::Value;

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

/// One read as fio saw it complete: when (Unix time, ms) and how long it took
/// from its submission (fio's `clat`).
#[derive(Debug, Clone, Copy)]
pub struct Completion {
    pub at_ms: i64,
    pub clat_us: f64,
}

/// [`randread_4k`] that also keeps every read fio completed (its per-I/O
/// `clat` log, stamped with the wall clock), so that any window of the run can
/// be judged by fio's own figures.
pub fn randread_4k_logged(dev: &str, engine: &[&str], runtime_s: u32) -> (Fio, Vec<Completion>) {
    let dir = crate::util::ScratchDir::new("/tmp");
    let prefix = dir.0.join("fio");
    let log = format!("--write_lat_log={}", prefix.display());
    let mut job = engine.to_vec();
    job.extend([log.as_str(), "--log_avg_msec=0", "--log_unix_epoch=1"]);
    let figures = randread_4k(dev, &job, runtime_s);
    let mut completions = Vec::with_capacity(figures.ios as usize);
    for entry in std::fs::read_dir(&dir.0)
        .expect("fio's log directory")
        .flatten()
    {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with("fio_clat.") {
            continue;
        }
        let text = std::fs::read_to_string(entry.path()).expect("fio's clat log");
        // "time_ms, clat_ns, direction, block size, offset[, priority]"
        completions.extend(text.lines().filter_map(|line| {
            let mut fields = line.split(',').map(str::trim);
            let at_ms = fields.next()?.parse().ok()?;
            let clat_ns: f64 = fields.next()?.parse().ok()?;
            Some(Completion {
                at_ms,
                clat_us: clat_ns / 1000.0,
            })
        }));
    }
    assert!(
        !completions.is_empty(),
        "fio wrote no clat log in {}",
        dir.0.display()
    );
    (figures, completions)
}

/// fio's `p`th percentile of the completion latency (µs) of the reads that
/// completed in `[from_ms, to_ms]`; `None` if none did.
pub fn clat_percentile_us(
    completions: &[Completion],
    from_ms: i64,
    to_ms: i64,
    p: f64,
) -> Option<f64> {
    let mut clat: Vec<f64> = completions
        .iter()
        .filter(|c| (from_ms..=to_ms).contains(&c.at_ms))
        .map(|c| c.clat_us)
        .collect();
    if clat.is_empty() {
        return None;
    }
    clat.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * clat.len() as f64).ceil() as usize;
    Some(clat[rank.clamp(1, clat.len()) - 1])
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

/// fio reading `dev` at random for `seconds` once released: a shell that
/// waits, then execs `fio` (fio, or a link to it whose name is then the
/// process's; `--thread`: its I/O runs in that process), so its pid is known
/// before the I/O starts. `own_mount_namespace`: started by `unshare -m`, as
/// a container's processes are. Killed if dropped unwaited.
pub struct HeldFio(Child);

impl HeldFio {
    pub fn new(fio: &str, dev: &str, seconds: u32, own_mount_namespace: bool) -> Self {
        let job = "read _ && exec \"$2\" --name=held --filename=\"$0\" --rw=randread --bs=4k \
                   --direct=1 --ioengine=psync --thread --time_based --runtime=\"$1\" >/dev/null";
        let mut cmd = if own_mount_namespace {
            let mut cmd = Command::new("unshare");
            cmd.args(["-m", "sh"]);
            cmd
        } else {
            Command::new("sh")
        };
        let child = cmd
            .args(["-c", job, dev, &seconds.to_string(), fio])
            .stdin(Stdio::piped())
            .spawn()
            .expect("sh and fio");
        Self(child)
    }

    pub fn pid(&self) -> u32 {
        self.0.id()
    }

    pub fn release(&mut self) {
        let _ = writeln!(self.0.stdin.as_mut().unwrap());
    }

    /// Waits for fio to finish; an error unless it succeeded.
    pub fn wait(&mut self) -> Result<(), String> {
        let status = self.0.wait().map_err(|e| e.to_string())?;
        status
            .success()
            .then_some(())
            .ok_or_else(|| format!("fio: {status}"))
    }
}

impl Drop for HeldFio {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}
