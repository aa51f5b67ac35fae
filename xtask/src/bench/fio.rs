//! fio as the independent oracle: its own IOPS and completion-latency
//! percentiles, read from its JSON output.

use std::process::Command;
use std::time::Instant;

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};

use super::configs::Figures;
use super::hostcpu::HostCpu;

/// The workload's fixed part; `iodepth`, `runtime` and the device are added per run.
pub const WORKLOAD: &[&str] = &[
    "--rw=randread",
    "--bs=4k",
    "--direct=1",
    "--ioengine=libaio",
    "--time_based",
    // Belt and braces: the bench never writes to the device it reads.
    "--readonly",
    "--output-format=json",
];

#[derive(Serialize, Clone, Copy, Debug, PartialEq)]
pub struct FioRun {
    pub iops: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    /// I/Os completed in the measured window.
    pub ios: u64,
    pub runtime_s: f64,
    /// User-space CPU of every other process on the host while fio ran, in %
    /// of one CPU: a busy neighbour (a build, someone's tests) shows here.
    pub others_user_cpu_pct: f64,
    /// CPU time the hypervisor gave to other guests, in % of one CPU.
    pub steal_pct: f64,
}

impl Figures for FioRun {
    const AT_TOP: bool = true;

    fn figures(&self) -> Vec<(&'static str, f64)> {
        vec![
            ("iops", self.iops),
            ("p50_us", self.p50_us),
            ("p99_us", self.p99_us),
        ]
    }

    fn figure(&self, key: &str) -> f64 {
        match key {
            "iops" => self.iops,
            "p50_us" => self.p50_us,
            "p99_us" => self.p99_us,
            _ => 0.0,
        }
    }

    fn others_user_cpu_pct(&self) -> f64 {
        self.others_user_cpu_pct
    }

    fn steal_pct(&self) -> f64 {
        self.steal_pct
    }
}

pub fn randread(device: &str, iodepth: u32, runtime_s: u64) -> anyhow::Result<FioRun> {
    let before = HostCpu::now();
    let began = Instant::now();
    let out = Command::new("fio")
        .arg("--name=stalltrace-bench")
        .arg(format!("--filename={device}"))
        .arg(format!("--iodepth={iodepth}"))
        .arg(format!("--runtime={runtime_s}s"))
        .args(WORKLOAD)
        .output()
        .context("cannot start fio")?;
    // A Ctrl-C stops fio too; say "interrupted", not "fio failed".
    super::interrupt::check()?;
    if !out.status.success() {
        bail!(
            "fio failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let wall_s = began.elapsed().as_secs_f64();
    let host = HostCpu::now().since(&before);
    let (mut run, fio_usr_pct) = parse(&String::from_utf8_lossy(&out.stdout))?;
    // fio's own user time is the workload; the daemon's is a fraction of a percent.
    run.others_user_cpu_pct = (100.0 * host.user_s / wall_s - fio_usr_pct).max(0.0);
    run.steal_pct = 100.0 * host.steal_s / wall_s;
    Ok(run)
}

#[derive(Deserialize)]
struct Output {
    jobs: Vec<Job>,
}

#[derive(Deserialize)]
struct Job {
    error: i64,
    read: Read,
    /// % of one CPU over the job's run time.
    usr_cpu: f64,
}

#[derive(Deserialize)]
struct Read {
    iops: f64,
    total_ios: u64,
    /// Milliseconds.
    runtime: u64,
    clat_ns: Clat,
}

#[derive(Deserialize)]
struct Clat {
    percentile: std::collections::BTreeMap<String, f64>,
}

/// The run as fio saw it, and fio's own user CPU in % of one CPU.
fn parse(text: &str) -> anyhow::Result<(FioRun, f64)> {
    // fio may print warnings before the JSON document.
    let json = &text[text.find('{').context("no JSON in fio's output")?..];
    let out: Output = serde_json::from_str(json).context("cannot parse fio's JSON output")?;
    let job = out.jobs.first().context("fio reported no job")?;
    if job.error != 0 {
        bail!("fio's job failed with error {}", job.error);
    }
    let pct = |key: &str| {
        job.read
            .clat_ns
            .percentile
            .get(key)
            .map(|ns| ns / 1000.0)
            .with_context(|| format!("fio's output has no clat percentile {key}"))
    };
    let run = FioRun {
        iops: job.read.iops,
        p50_us: pct("50.000000")?,
        p99_us: pct("99.000000")?,
        ios: job.read.total_ios,
        runtime_s: job.read.runtime as f64 / 1000.0,
        others_user_cpu_pct: 0.0,
        steal_pct: 0.0,
    };
    Ok((run, job.usr_cpu))
}

#[cfg(test)]
mod tests {
    #[test]
    fn reads_iops_and_percentiles_after_a_warning_line() {
        let text = r#"fio: some warning
{"jobs":[{"error":0,"usr_cpu":4.5,"read":{"iops":1000.5,"total_ios":10005,"runtime":10000,
 "clat_ns":{"percentile":{"50.000000":84000,"99.000000":276480}}}}]}"#;
        let (run, usr) = super::parse(text).unwrap();
        assert_eq!(usr, 4.5);
        assert_eq!(run.iops, 1000.5);
        assert_eq!(run.p50_us, 84.0);
        assert_eq!(run.p99_us, 276.48);
        assert_eq!(run.ios, 10005);
        assert_eq!(run.runtime_s, 10.0);
    }
}
