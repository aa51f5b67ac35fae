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
use crate::fio::{Completion, Fio, clat_percentile_us, randread_4k_logged};
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
    let mut completions = Vec::new();
    for &depth in DEPTHS {
        let start = now_ts();
        let numjobs = format!("--numjobs={depth}");
        let (fio, reads) = randread_4k_logged(
            &disk.dev,
            &["--ioengine=psync", &numjobs, "--group_reporting"],
            STEP_SECS,
        );
        completions.extend(reads);
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
    o.confirmed = slow_device_seen_by_fio(&o, &completions);
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

/// The `slow_device` episodes on the sweep's disk that fio's own reads
/// confirm: in one of the intervals the detector judged over its threshold,
/// fio's reads completing in that same interval took at least the threshold
/// at p99 (fio's time holds the device's, so it is never the shorter). Judged
/// per interval, not over the whole episode: an episode runs on past the
/// intervals over the threshold, and a p99 over all of it dilutes the one
/// that was. The loop device's file sits on the host's disk, which can be
/// slow without any fault (another VM on the same storage, 64 reads at once
/// on a small virtual disk): stalltrace is then right to say so, and a clean
/// run is not judged by it. Any other episode, or one fio does not confirm,
/// still fails the clean run.
fn slow_device_seen_by_fio(o: &Outcome, completions: &[Completion]) -> Vec<(String, String)> {
    let ms = |ts: &Value| {
        chrono::DateTime::parse_from_rfc3339(ts.as_str()?)
            .ok()
            .map(|t| t.timestamp_millis())
    };
    let records = parse_lines(&o.stream);
    let mut confirmed = Vec::new();
    for stall in o.ours() {
        if stall["cause"] != "slow_device" {
            continue;
        }
        let Some(p99) = stall["evidence"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|e| e["signal"] == "device_ms_p99")
        else {
            continue;
        };
        let (Some(from), Some(to), Some(threshold)) = (
            ms(&stall["start"]),
            ms(&stall["end"]),
            p99["threshold"].as_f64(),
        ) else {
            continue;
        };
        // (fio's p99, stalltrace's) in the slowest interval the detector judged over
        let worst = records
            .iter()
            .filter(|r| r["type"] == "block" && r["dev"] == stall["dev"])
            .filter(|r| r["device_us"]["p99"].as_f64() >= Some(threshold * 1000.0))
            .filter_map(|r| {
                let ended = ms(&r["ts"])?;
                let began = ended - r["interval_ms"].as_f64()? as i64;
                (ended > from && began < to).then_some((r, began, ended))
            })
            .filter_map(|(r, began, ended)| {
                let fio = clat_percentile_us(completions, began, ended, 99.0)?;
                Some((fio, r["device_us"]["p99"].as_f64()?))
            })
            .max_by(|a, b| a.0.total_cmp(&b.0));
        let Some((fio_p99, device_p99)) = worst else {
            continue;
        };
        if fio_p99 / 1000.0 >= threshold {
            confirmed.push((
                stall["end"].as_str().unwrap_or_default().to_string(),
                format!(
                    "fio's own reads completing in the slowest interval of it took {:.1} ms \
                     at p99 (stalltrace: device {:.1} ms; threshold {threshold} ms): the disk \
                     under {} was slow",
                    fio_p99 / 1000.0,
                    device_p99 / 1000.0,
                    stall["dev"].as_str().unwrap_or("the loop device"),
                ),
            ));
        }
    }
    confirmed
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

#[cfg(test)]
mod tests {
    use super::*;

    const STALL: &str = r#"{"type":"stall","phase":"closed","kind":"storage","cause":"slow_device","dev":"loop0","start":"2026-11-27T17:36:27.815Z","end":"2026-11-27T17:36:28.312Z","evidence":[{"signal":"device_ms_p99","value":22.5,"threshold":20.0,"unit":"ms"}]}"#;
    /// The interval the detector judged over the threshold: the episode's 497 ms.
    const OVER: &str = r#"{"type":"block","dev":"loop0","op":"read","ts":"2026-11-27T17:36:28.312Z","interval_ms":497.0,"device_us":{"p99":22500.0}}"#;
    const START_MS: i64 = 1_795_800_987_815;

    fn clean_run(clat_us: f64) -> (Outcome, Vec<(String, String)>) {
        let mut o = Outcome::new("queue-depth", Fault::Clean, format!("{OVER}\n{STALL}\n"));
        o.devs = vec!["loop0".into()];
        // 200 reads inside the episode, 1.5% of them at `clat_us`; 200 slow ones outside it.
        let mut reads: Vec<Completion> = (0..200)
            .map(|i| Completion {
                at_ms: START_MS + 2 * i,
                clat_us: if i < 3 { clat_us } else { 300.0 },
            })
            .collect();
        reads.extend((0..200).map(|i| Completion {
            at_ms: START_MS + 1_000 + i,
            clat_us: 90_000.0,
        }));
        let confirmed = slow_device_seen_by_fio(&o, &reads);
        (o, confirmed)
    }

    #[test]
    fn an_episode_fio_saw_in_the_same_seconds_is_confirmed() {
        let (mut o, confirmed) = clean_run(25_000.0);
        assert_eq!(confirmed.len(), 1, "{confirmed:?}");
        assert!(confirmed[0].1.contains("25.0 ms at p99"), "{confirmed:?}");
        o.confirmed = confirmed;
        assert_eq!(o.verdict(), Ok(()));
    }

    #[test]
    fn an_episode_fio_did_not_see_fails_the_clean_run() {
        // fio's reads in the episode's window were fast; slow ones outside it do not count.
        let (mut o, confirmed) = clean_run(5_000.0);
        assert!(confirmed.is_empty(), "{confirmed:?}");
        o.confirmed = confirmed;
        assert!(o.verdict().is_err());
    }
}
