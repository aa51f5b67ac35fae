//! `queue-depth`: the HBA-queue-depth story. A sweep of concurrent 4k random
//! reads (fio, 1 to 64 at once) against a loop device whose queue allows only
//! 4 requests (`nr_requests` 4, scheduler `none`): past 4, in flight stays at
//! the limit, IOPS stop growing, and the latency fio sees grows with the
//! waiting in front of the device (tag wait), not in it. Clean: the same
//! sweep with the default queue.
//!
//! The depth is fio's `numjobs` with synchronous I/O (psync): on this 2-vCPU
//! VM one libaio job cannot keep 32 requests in the kernel (its submit/reap
//! loop holds most of them in user space), 32 threads with one I/O each can.

use std::fmt::Write as _;
use std::time::Duration;

use serde_json::Value;

use super::{Expected, Fault, INTERVAL, Outcome, now_ts};
use crate::disk::{Backing, LoopDevice};
use crate::fio::{Fio, randread_4k};
use crate::records::{Buckets, block_records};
use crate::tracer::Tracer;
use crate::{Bins, parse_lines};

pub const ABOUT: &str =
    "fio 4k random reads at 1, 4, 16, 32, 64 in flight on a loop device; fault: nr_requests 4";

/// Concurrent reads at each step of the sweep.
pub const DEPTHS: &[u32] = &[1, 4, 16, 32, 64];
const STEP_SECS: u32 = 2;
/// Between steps, longer than an interval: no interval holds two steps.
const GAP: Duration = Duration::from_millis(700);
const LIMIT: &str = "4";

/// One step of the sweep: fio's figures and stalltrace's for the same seconds.
pub struct Step {
    pub depth: u32,
    pub fio: Fio,
    pub inflight: Option<Buckets>,
    pub tag_wait: Option<Buckets>,
    pub device: Option<Buckets>,
    pub latency: Option<Buckets>,
}

pub fn run(bins: &Bins, fault: Fault) -> Outcome {
    let (outcome, _) = sweep(bins, fault);
    outcome
}

/// The sweep, with its steps for callers that judge the bend themselves.
pub fn sweep(bins: &Bins, fault: Fault) -> (Outcome, Vec<Step>) {
    crate::require_root();
    bins.check();
    let disk = LoopDevice::new(Backing::Disk, 256, true);
    disk.set_queue("scheduler", "none");
    if fault == Fault::Injected {
        disk.set_queue("nr_requests", LIMIT);
    }
    let nr_requests =
        std::fs::read_to_string(format!("/sys/block/{}/queue/nr_requests", disk.name))
            .unwrap_or_default()
            .trim()
            .to_string();
    let args = ["--interval", INTERVAL, "--slow-io-ms", "0"];
    let tracer = Tracer::start(&bins.stalltrace, &args);
    let mut windows = Vec::new();
    let mut runs = Vec::new();
    for &depth in DEPTHS {
        let start = now_ts();
        let numjobs = format!("--numjobs={depth}");
        let fio = randread_4k(
            &disk.dev,
            &["--ioengine=psync", &numjobs, "--group_reporting"],
            STEP_SECS,
        );
        std::thread::sleep(GAP);
        windows.push(start);
        runs.push((depth, fio));
    }
    std::thread::sleep(Duration::from_millis(600));
    let stream = tracer.stop_text();
    let records = parse_lines(&stream);
    let reads = block_records(&records, &disk.name, "read");
    let mut steps = Vec::new();
    for (i, (depth, fio)) in runs.into_iter().enumerate() {
        let from = windows[i].as_str();
        let to = windows.get(i + 1).map(String::as_str);
        let mine: Vec<&Value> = reads
            .iter()
            .copied()
            .filter(|r| {
                let ts = r["ts"].as_str().unwrap_or_default();
                ts > from && to.is_none_or(|to| ts <= to) && r["count"].as_u64() > Some(0)
            })
            .collect();
        let merge = |field: &str| (!mine.is_empty()).then(|| Buckets::merge(&mine, field));
        steps.push(Step {
            depth,
            fio,
            inflight: merge("inflight"),
            tag_wait: merge("tag_wait_us"),
            device: merge("device_us"),
            latency: merge("latency_us"),
        });
    }

    let mut o = Outcome::new("queue-depth", fault, stream);
    o.args = args.iter().map(|s| s.to_string()).collect();
    o.devs = vec![disk.name.clone()];
    o.figures = vec![
        format!(
            "{}: loop device over a file on disk (direct I/O), scheduler none, nr_requests {nr_requests}",
            disk.name
        ),
        String::new(),
    ];
    o.figures.extend(table(&steps).lines().map(String::from));
    if fault == Fault::Injected {
        o.expected = vec![Expected {
            kind: "storage",
            cause: "queue_full",
            field: "dev",
            value: disk.name.clone(),
            netns: None,
            sessions: Vec::new(),
        }];
    }
    (o, steps)
}

/// The sweep as a table: fio's own figures, then stalltrace's for the same
/// seconds (whole-step histograms re-merged from the records' buckets).
pub fn table(steps: &[Step]) -> String {
    let mut t = String::new();
    let _ = writeln!(
        t,
        "{:>6} │ {:>8} {:>10} {:>10} │ {:>9} {:>6} {:>10} {:>10} {:>11}",
        "depth",
        "fio IOPS",
        "clat p50",
        "clat p99",
        "inflight",
        "max",
        "tag wait",
        "device",
        "latency p99"
    );
    let _ = writeln!(
        t,
        "{:>6} │ {:>8} {:>10} {:>10} │ {:>9} {:>6} {:>10} {:>10} {:>11}",
        "", "", "µs", "µs", "p50", "", "mean µs", "mean µs", "µs"
    );
    for s in steps {
        let p = |b: &Option<Buckets>, f: &dyn Fn(&Buckets) -> f64| {
            b.as_ref()
                .filter(|b| b.count() > 0)
                .map_or("-".to_string(), |b| format!("{:.0}", f(b)))
        };
        let _ = writeln!(
            t,
            "{:>6} │ {:>8.0} {:>10.0} {:>10.0} │ {:>9} {:>6} {:>10} {:>10} {:>11}",
            s.depth,
            s.fio.iops,
            s.fio.clat_p50_us,
            s.fio.clat_p99_us,
            p(&s.inflight, &|b| b.percentile(0.5)),
            p(&s.inflight, &|b| b.max()),
            p(&s.tag_wait, &|b| b.mean()),
            p(&s.device, &|b| b.mean()),
            p(&s.latency, &|b| b.percentile(0.99)),
        );
    }
    t
}
