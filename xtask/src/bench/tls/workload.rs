//! The tls suite's workload: one simulator per BIO style, `sqlclient`
//! encrypted runs against it, the worker's CPU time around each run, and
//! which uprobes are attached to a worker's libssl (from the owners'
//! /proc/PID/fdinfo: a perf link names the file it probes).

use std::fs;
use std::os::unix::process::CommandExt;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context, bail};
use serde::Serialize;
use stalltrace_lab::Bins;
use stalltrace_lab::sql::{Placement, SMALL_FILES, SqlServerSim};

use super::{BATCH_SQL, Bio, SESSIONS};
use crate::bench::hostcpu::HostCpu;
use crate::bench::tracer;

/// TLS responses per login, besides the batches the client counts: the
/// login response and the answer to the `SELECT @@SPID` every session asks
/// once before its batches (each one `SSL_write`/`SSL_write_ex`; measured:
/// the uprobe programs ran exactly transactions + 2 per login).
pub const RESPONSES_PER_LOGIN: u64 = 2;

/// The simulator of one BIO style, in the host's network namespace on
/// 127.0.0.1 (stopped and its files removed on drop).
pub struct Server {
    pub bio: Bio,
    pub sim: SqlServerSim,
}

impl Server {
    /// `sqlservr --listen 127.0.0.1:0 --data-size-mb 16 --log-size-mb 4 --tls-bio BIO`,
    /// its files in `dir`.
    pub fn start(bins: &Bins, dir: &Path, bio: Bio) -> anyhow::Result<Self> {
        let args: Vec<&str> = SMALL_FILES
            .iter()
            .copied()
            .chain(["--tls-bio", bio.arg()])
            .collect();
        let name = bio.arg();
        // The lab's guard panics on failure: turn that into an error here.
        let sim = catch_unwind(AssertUnwindSafe(|| {
            SqlServerSim::start(
                bins,
                Placement::default(),
                "127.0.0.1:0",
                &dir.join(format!("{name}.mdf")),
                &dir.join(format!("{name}_log.ldf")),
                &args,
            )
        }))
        .map_err(|_| anyhow::anyhow!("sqlservr --tls-bio {name} did not start"))?;
        let server = Server { bio, sim };
        // Every thread of the worker, so the session threads it starts inherit it.
        let tasks = fs::read_dir(format!("/proc/{}/task", server.worker()))
            .context("the worker is gone")?;
        for task in tasks.flatten() {
            if let Some(tid) = task.file_name().to_str().and_then(|t| t.parse().ok()) {
                pin(tid).with_context(|| format!("cannot pin the worker's thread {tid}"))?;
            }
        }
        Ok(server)
    }

    pub fn worker(&self) -> u32 {
        self.sim.worker
    }
}

/// One `sqlclient` run against one server: what the client counted and what
/// the worker used meanwhile.
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct Run {
    pub bio: Bio,
    /// Batches answered (the client's count).
    pub transactions: u64,
    /// Sessions logged in (each one login response and one `SELECT @@SPID` answer more).
    pub logins: u64,
    /// The worker's TLS responses: transactions + [`RESPONSES_PER_LOGIN`] per login.
    pub responses: u64,
    pub tps: f64,
    pub p50_us: u64,
    /// utime + stime of the worker (every thread, exited ones too), from
    /// /proc/PID/stat, over the client's whole run.
    pub worker_cpu_s: f64,
    /// The client's run, launch to exit.
    pub seconds: f64,
    /// Steal time of the host's CPUs meanwhile, in % of the run's CPU time.
    pub steal_pct: f64,
    /// The bench's daemon's uprobe links on this worker's libssl, the fewer
    /// of before and after the run (0 without a daemon).
    pub our_uprobes: usize,
}

impl Run {
    /// The worker's CPU per response, in µs.
    pub fn cpu_us_per_response(&self) -> f64 {
        per_response_us(self.worker_cpu_s, self.responses)
    }
}

/// `cpu_s` of CPU time over `responses`, in µs each (NaN without any).
pub fn per_response_us(cpu_s: f64, responses: u64) -> f64 {
    if responses == 0 {
        return f64::NAN;
    }
    cpu_s * 1e6 / responses as f64
}

/// Transactions + [`RESPONSES_PER_LOGIN`] per login.
pub fn responses(transactions: u64, logins: u64) -> u64 {
    transactions + RESPONSES_PER_LOGIN * logins
}

/// `sqlclient --encrypt on --sessions N --rate 0 --duration S --batch-sql 'SELECT @@SPID'`
/// against `server`, the worker's CPU read around it; `daemon` is the
/// bench's stalltrace, whose uprobe links on the worker are counted.
pub fn run_client(
    sqlclient: &Path,
    server: &Server,
    runtime_s: u64,
    daemon: Option<u32>,
) -> anyhow::Result<Run> {
    let worker = server.worker();
    let ours = |w: u32| daemon.map_or(0, |d| uprobes_on(&links_of(d), w));
    let links_before = ours(worker);
    let host0 = HostCpu::now();
    let cpu0 = worker_cpu_s(worker)?;
    let began = Instant::now();
    let mut cmd = Command::new(sqlclient);
    cmd.args(["--server", &format!("127.0.0.1:{}", server.sim.port)])
        .args(["--encrypt", "on", "--rate", "0"])
        .args(["--sessions", &SESSIONS.to_string()])
        .args(["--duration", &runtime_s.to_string()])
        .args(["--batch-sql", BATCH_SQL])
        .stdin(Stdio::null())
        .stderr(Stdio::inherit());
    // SAFETY: prctl and sched_setaffinity are async-signal-safe and touch
    // only the child.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            pin(0)
        });
    }
    let out = cmd.output().context("cannot run sqlclient")?;
    let seconds = began.elapsed().as_secs_f64();
    let cpu1 = worker_cpu_s(worker)?;
    let host = HostCpu::now().since(&host0);
    let links_after = ours(worker);
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!("sqlclient failed ({}): {}", out.status, text.trim());
    }
    let report: serde_json::Value = serde_json::from_str(text.trim())
        .with_context(|| format!("sqlclient printed no JSON report: {text}"))?;
    let client = parse_report(&report)?;
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    Ok(Run {
        bio: server.bio,
        responses: responses(client.transactions, client.logins),
        transactions: client.transactions,
        logins: client.logins,
        tps: client.tps,
        p50_us: client.p50_us,
        worker_cpu_s: (cpu1 - cpu0).max(0.0),
        seconds,
        steal_pct: 100.0 * host.steal_s / (seconds * cpus),
        our_uprobes: links_before.min(links_after),
    })
}

/// What the bench reads of sqlclient's report.
#[derive(Debug, PartialEq)]
struct ClientFigures {
    transactions: u64,
    logins: u64,
    tps: f64,
    p50_us: u64,
}

/// The client's figures, or why the run does not count: any error, no
/// transaction, or a session not encrypted as a whole (`full`): then not
/// every response went through `SSL_write`.
fn parse_report(r: &serde_json::Value) -> anyhow::Result<ClientFigures> {
    let n = |k: &str| r[k].as_u64().with_context(|| format!("no `{k}` in {r}"));
    let errors = n("errors")?;
    if errors > 0 {
        bail!(
            "sqlclient counted {errors} error(s): {}",
            r["error_samples"]
        );
    }
    let sessions = r["sessions"].as_array().context("no `sessions`")?;
    if let Some(s) = sessions.iter().find(|s| s["encryption"] != "full") {
        bail!(
            "a session was not encrypted as a whole (encryption {}): not every response \
             went through SSL_write",
            s["encryption"]
        );
    }
    let transactions = n("transactions")?;
    if transactions == 0 || sessions.is_empty() {
        bail!("sqlclient ran no transaction");
    }
    Ok(ClientFigures {
        transactions,
        logins: sessions.len() as u64,
        tps: r["tps"].as_f64().unwrap_or(0.0),
        p50_us: n("p50_us").unwrap_or(0),
    })
}

/// Keep thread `tid` (0: the calling one) on [`CPU`](super::CPU), as `taskset -c` would.
fn pin(tid: libc::pid_t) -> std::io::Result<()> {
    // SAFETY: cpu_set_t is plain data, valid when zeroed; CPU_SET writes
    // within it; sched_setaffinity reads it for the size given.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(super::CPU, &mut set);
        if libc::sched_setaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// utime + stime of `pid` so far, every thread (exited ones included), in
/// seconds (/proc/PID/stat counts in clock ticks: 10 ms here).
pub fn worker_cpu_s(pid: u32) -> anyhow::Result<f64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("the worker (pid {pid}) is gone"))?;
    let (user, system) = tracer::cpu_ticks(&stat).context("unexpected /proc/PID/stat")?;
    Ok((user + system) as f64 * tick_s())
}

/// A clock tick of /proc/PID/stat, in seconds.
pub fn tick_s() -> f64 {
    // SAFETY: sysconf has no preconditions.
    1.0 / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
}

/// A uprobe a process holds through a BPF perf link.
#[derive(Clone, Debug, PartialEq)]
pub struct UprobeLink {
    pub owner: u32,
    pub prog_id: u64,
    /// The file it probes, as the owner opened it (stalltrace opens a
    /// worker's libssl as /proc/WORKER/root/...).
    pub file: String,
}

/// The uprobe links `pid` holds.
pub fn links_of(pid: u32) -> Vec<UprobeLink> {
    let Ok(fds) = fs::read_dir(format!("/proc/{pid}/fd")) else {
        return Vec::new();
    };
    fds.flatten()
        .filter(|fd| fs::read_link(fd.path()).is_ok_and(|t| t.as_os_str() == "anon_inode:bpf_link"))
        .filter_map(|fd| {
            let info = format!("/proc/{pid}/fdinfo/{}", fd.file_name().to_string_lossy());
            let (prog_id, file) = parse_fdinfo(&fs::read_to_string(info).ok()?)?;
            Some(UprobeLink {
                owner: pid,
                prog_id,
                file,
            })
        })
        .collect()
}

/// Every uprobe link on the host, whoever holds it.
pub fn all_links() -> Vec<UprobeLink> {
    fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .flat_map(links_of)
        .collect()
}

/// How many of `links` probe the libssl of `worker` (stalltrace's, through
/// /proc/WORKER/root).
pub fn uprobes_on(links: &[UprobeLink], worker: u32) -> usize {
    let prefix = format!("/proc/{worker}/root/");
    links
        .iter()
        .filter(|l| l.file.starts_with(&prefix) && l.file.contains("libssl"))
        .count()
}

/// A perf link's program and probed file, when it is a uprobe.
fn parse_fdinfo(text: &str) -> Option<(u64, String)> {
    let field = |k: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(k)?.strip_prefix(':'))
            .map(str::trim)
    };
    if field("link_type")? != "perf" || field("event_type")? != "uprobe" {
        return None;
    }
    Some((field("prog_id")?.parse().ok()?, field("name")?.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_uprobe_link_names_its_program_and_file() {
        let uprobe = "pos:\t0\nflags:\t02000000\nmnt_id:\t16\nino:\t1057\nlink_type:\tperf\n\
                      link_id:\t981\nprog_tag:\tdde5dc5c69dbe13b\nprog_id:\t1149\n\
                      name:\t/proc/1691/root/usr/lib/x86_64-linux-gnu/libssl.so.3\n\
                      offset:\t0x35980\nref_ctr_offset:\t0x0\nevent_type:\tuprobe\ncookie:\t0\n";
        let (id, file) = parse_fdinfo(uprobe).unwrap();
        assert_eq!(id, 1149);
        assert_eq!(file, "/proc/1691/root/usr/lib/x86_64-linux-gnu/libssl.so.3");
        let tracing = "link_type:\ttracing\nlink_id:\t5\nprog_id:\t7\nattach_type:\t24\n";
        assert_eq!(parse_fdinfo(tracing), None);
        let kprobe = uprobe.replace("event_type:\tuprobe", "event_type:\tkprobe");
        assert_eq!(parse_fdinfo(&kprobe), None);

        let link = |owner, file: &str| UprobeLink {
            owner,
            prog_id: 1,
            file: file.into(),
        };
        let links = [
            link(7, "/proc/1691/root/usr/lib/x86_64-linux-gnu/libssl.so.3"),
            link(7, "/proc/1691/root/usr/lib/x86_64-linux-gnu/libssl.so.3"),
            link(7, "/proc/16910/root/usr/lib/x86_64-linux-gnu/libssl.so.3"),
            link(8, "/usr/lib/x86_64-linux-gnu/libssl.so.3"),
        ];
        assert_eq!(uprobes_on(&links, 1691), 2, "not 16910's, not a global one");
        assert_eq!(uprobes_on(&links, 16910), 1);
        assert_eq!(uprobes_on(&links, 5), 0);
    }

    #[test]
    fn responses_and_cpu_per_response() {
        assert_eq!(
            responses(13419, 2),
            13423,
            "as the uprobe programs counted them"
        );
        assert!((per_response_us(0.5, 20_000) - 25.0).abs() < 1e-12);
        assert!(per_response_us(0.5, 0).is_nan());
    }

    #[test]
    fn client_reports_that_do_not_count() {
        let ok = serde_json::json!({"transactions": 100, "errors": 0, "tps": 50.0, "p50_us": 40,
            "sessions": [{"encryption": "full"}, {"encryption": "full"}]});
        assert_eq!(
            parse_report(&ok).unwrap(),
            ClientFigures {
                transactions: 100,
                logins: 2,
                tps: 50.0,
                p50_us: 40
            }
        );
        let mut errors = ok.clone();
        errors["errors"] = 3.into();
        assert!(parse_report(&errors).is_err());
        let mut login_only = ok.clone();
        login_only["sessions"][1]["encryption"] = "login_only".into();
        let e = parse_report(&login_only).unwrap_err().to_string();
        assert!(e.contains("login_only"), "{e}");
        let mut none = ok;
        none["transactions"] = 0.into();
        assert!(parse_report(&none).is_err());
    }
}
