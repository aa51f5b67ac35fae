//! fio as load and as the independent oracle of latency and IOPS.

use std::process::Command;

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
