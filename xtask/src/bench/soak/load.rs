//! The soak's load, built from the lab's pieces (loop devices, `NetPair`,
//! nftables loss, iperf3, the SQL Server simulator): what runs at once, and
//! the two loops that keep churning (network namespaces; short SQL Server
//! client runs, so sessions open and close all the time).
//!
//! The lab panics on any failure. Inside the churn loops a failure is caught
//! and counted (a namespace that could not be made on a loaded host is not
//! the daemon's problem, but the count is published); everywhere else it
//! unwinds through the guards, which remove what was built.

use std::collections::VecDeque;
use std::fs::File;
use std::os::unix::process::CommandExt;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::sleep;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde::Serialize;
use stalltrace_lab::Bins;
use stalltrace_lab::net::{Background, Iperf3Server, NetPair, Owner, Side};
use stalltrace_lab::sql::{Placement, SqlClientRun};

/// Random loss on both sides' input, every packet (skbs, see lab/src/net).
pub const LOSS_PERCENT: u8 = 2;
/// Paced: an unpaced iperf3 over veth is CPU-bound and would take one of the
/// two CPUs from everything else for the whole soak.
pub const IPERF3_RATE: &str = "50M";
pub const FIO_ARGS: &[&str] = &[
    "--rw=randrw",
    "--rwmixread=70",
    "--bs=4k",
    "--direct=1",
    "--ioengine=libaio",
    "--iodepth=8",
    // Reads, writes per second: a steady load, not a flat-out one (the host is shared).
    "--rate_iops=2100,900",
    "--time_based",
    "--output-format=json",
    // The job as a thread of the one process: a forked job process would not
    // die with it (PR_SET_PDEATHSIG is not inherited) and would keep the
    // loop device busy after a failure.
    "--thread",
];
pub const SIM_SERVER_ARGS: &[&str] = &[
    "--data-size-mb",
    "64",
    "--log-size-mb",
    "16",
    "--checkpoint-secs",
    "20",
];
/// The long-lived client: sessions and transactions per second (all sessions).
pub const SESSIONS: u32 = 8;
pub const RATE: u32 = 200;
/// The short client runs, back to back.
pub const SHORT_SESSIONS: u32 = 4;
pub const SHORT_RATE: u32 = 40;
pub const SHORT_SECS: u32 = 10;
/// Namespace churn: a new pair every period; the oldest removed once more
/// than this many are alive (each lives ~2 s: a couple of daemon intervals).
pub const CHURN_ALIVE: usize = 4;
pub const CHURN_EVERY: Duration = Duration::from_millis(500);

/// fio in the background, stopped with SIGINT (then it writes its report).
pub struct Fio {
    child: Option<Child>,
    report: PathBuf,
}

impl Fio {
    pub fn start(device: &str, secs: u64, dir: &Path) -> anyhow::Result<Self> {
        let report = dir.join("fio.json");
        let mut cmd = Command::new("fio");
        cmd.arg("--name=stalltrace-soak")
            .arg(format!("--filename={device}"))
            .arg(format!("--runtime={secs}s"))
            .args(FIO_ARGS)
            .stdin(Stdio::null())
            .stdout(File::create(&report)?)
            .stderr(Stdio::null());
        // SAFETY: prctl is async-signal-safe and touches only the child. fio
        // dies with xtask even when xtask is killed outright.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let child = cmd.spawn().context("cannot start fio")?;
        Ok(Fio {
            child: Some(child),
            report,
        })
    }

    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| c.try_wait().ok().flatten().is_none())
    }

    /// Stop it and return the I/Os it completed (reads + writes), as fio counts them.
    pub fn stop(mut self) -> anyhow::Result<u64> {
        let mut child = self.child.take().expect("running");
        // SAFETY: kill(2) on our own unreaped child.
        unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
        let until = Instant::now() + Duration::from_secs(20);
        while child.try_wait()?.is_none() {
            if Instant::now() > until {
                let _ = child.kill();
                let _ = child.wait();
                bail!("fio did not stop within 20 s of SIGINT");
            }
            sleep(Duration::from_millis(50));
        }
        let text = std::fs::read_to_string(&self.report)?;
        let json: serde_json::Value = serde_json::from_str(&text[text.find('{').unwrap_or(0)..])
            .context("fio printed no JSON report")?;
        let job = &json["jobs"][0];
        Ok(["read", "write"]
            .iter()
            .map(|op| job[op]["total_ios"].as_u64().unwrap_or(0))
            .sum())
    }
}

impl Drop for Fio {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// `iperf3 -c` from side A to the server on side B, paced, for `secs`.
pub fn iperf3_client<'p>(pair: &'p NetPair, server: &Iperf3Server, secs: u64) -> Background<'p> {
    let addr = pair.v4(Side::B).to_string();
    let (port, secs) = (server.port.to_string(), secs.to_string());
    pair.spawn(
        Side::A,
        &[
            "iperf3",
            "-c",
            &addr,
            "-p",
            &port,
            "-t",
            &secs,
            "-b",
            IPERF3_RATE,
            "-4",
            "-i",
            "60",
        ],
    )
}

/// The long-lived client, from side A to the simulator on `server`.
pub fn sql_client(bins: &Bins, pair: &NetPair, server: &str, secs: u64) -> SqlClientRun {
    let place = Placement::in_netns(pair.netns(Side::A));
    SqlClientRun::start(bins, place, server, SESSIONS, RATE, secs as u32)
}

/// Sets the flag when dropped, so the loops also stop when the soak unwinds.
pub struct StopOnDrop<'a>(pub &'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

#[derive(Default, Serialize)]
pub struct ChurnCounts {
    pub made: AtomicU64,
    pub removed: AtomicU64,
    pub failed: AtomicU64,
}

/// Make a namespace pair (veth, addresses, one TCP handshake per family, as
/// `NetPair::new` does) every [`CHURN_EVERY`], removing the oldest beyond
/// [`CHURN_ALIVE`], until `stop`.
pub fn churn(stop: &AtomicBool, c: &ChurnCounts) {
    let mut alive = VecDeque::new();
    while !stop.load(Ordering::SeqCst) {
        // Made as the tests' lab makes them (its names, its sweep): the churn
        // reproduces what a test run does to the host.
        match NetPair::try_new(Owner::Lab) {
            Ok(pair) => {
                alive.push_back(pair);
                c.made.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => {
                eprintln!("bench: namespace churn: {e:#}");
                c.failed.fetch_add(1, Ordering::Relaxed);
            }
        }
        while alive.len() > CHURN_ALIVE {
            drop(alive.pop_front());
            c.removed.fetch_add(1, Ordering::Relaxed);
        }
        nap(stop, CHURN_EVERY);
    }
    c.removed.fetch_add(alive.len() as u64, Ordering::Relaxed);
}

#[derive(Default, Serialize)]
pub struct ClientCounts {
    pub runs: AtomicU64,
    pub failed: AtomicU64,
    pub transactions: AtomicU64,
    pub errors: AtomicU64,
}

/// Short `sqlclient` runs from `netns` to `server`, back to back, until `stop`.
pub fn session_churn(bins: &Bins, netns: &str, server: &str, stop: &AtomicBool, c: &ClientCounts) {
    while !stop.load(Ordering::SeqCst) {
        let place = Placement::in_netns(netns);
        let mut run =
            SqlClientRun::start(bins, place, server, SHORT_SESSIONS, SHORT_RATE, SHORT_SECS);
        while run.is_running() && !stop.load(Ordering::SeqCst) {
            sleep(Duration::from_millis(100));
        }
        if stop.load(Ordering::SeqCst) {
            break; // dropped: killed
        }
        c.runs.fetch_add(1, Ordering::Relaxed);
        match catch_unwind(AssertUnwindSafe(|| run.finish())) {
            Ok(report) => {
                c.transactions
                    .fetch_add(report.transactions(), Ordering::Relaxed);
                c.errors.fetch_add(report.errors(), Ordering::Relaxed);
            }
            Err(_) => {
                c.failed.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// Sleep `d`, waking early when `stop` is set.
fn nap(stop: &AtomicBool, d: Duration) {
    let until = Instant::now() + d;
    while Instant::now() < until && !stop.load(Ordering::SeqCst) {
        sleep(Duration::from_millis(50));
    }
}
