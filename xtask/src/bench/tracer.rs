//! One stalltrace daemon for one traced fio run, held as a guard: whatever
//! happens (error, panic, Ctrl-C), `Drop` stops it, so no BPF program stays
//! attached to skew the next untraced round or outlive the bench.

pub mod programs;

use std::fs::{self, File};
use std::io;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};

use super::interrupt;

/// Loading and verifying the programs takes about a second here; allow for a loaded host.
const START_TIMEOUT: Duration = Duration::from_secs(60);
const STOP_TIMEOUT: Duration = Duration::from_secs(30);

/// The flags under test; `--out FILE` is added per run, and [`BPF_STATS`]
/// for the runs that measure each program's cost. `--slow-io-ms` is left at
/// its default (50 ms), as deployed: with it on, every bio's submitter is
/// noted at submission (block_bio_queue), which `--slow-io-ms 0` would skip;
/// the bench's devices are far faster than 50 ms, so no record is sent.
pub const ARGS: &[&str] = &["run", "--interval", "1s"];

/// Turns on the kernel's per-program accounting for the daemon's life. The
/// kernel then wraps every run of every BPF program on the host in two clock
/// reads and a counter update, so the runs that use it are slower than
/// stalltrace as deployed, and are kept apart from the ones that judge IOPS.
pub const BPF_STATS: &str = "--bpf-stats";

/// The command line as published (`--out FILE` standing for the per-run file).
pub fn command_line(bpf_stats: bool) -> String {
    command_line_with(bpf_stats, &[])
}

/// The same, with `filters` (e.g. `--netns NS`) before `--out`.
pub fn command_line_with(bpf_stats: bool, filters: &[&str]) -> String {
    let mut args: Vec<&str> = ARGS.to_vec();
    if bpf_stats {
        args.insert(1, BPF_STATS);
    }
    args.extend(filters);
    format!("stalltrace {} --out FILE", args.join(" "))
}

/// Whether the sysctl that makes the kernel account every BPF program run is
/// on for good: then every traced run pays for bpf_stats, asked for or not.
pub fn bpf_stats_sysctl() -> bool {
    fs::read_to_string("/proc/sys/kernel/bpf_stats_enabled").is_ok_and(|s| s.trim() == "1")
}

pub struct Tracer {
    pid: libc::pid_t,
    reaped: bool,
    out: PathBuf,
    stderr: PathBuf,
    /// The `start` record, as written.
    pub start: serde_json::Value,
}

/// The daemon's usage so far, from /proc.
pub struct Usage {
    /// user + system, all threads (to the ns from schedstat where the kernel
    /// has it, else in clock ticks).
    pub cpu_s: f64,
    /// user only.
    pub user_s: f64,
    /// Peak resident set (VmHWM).
    pub peak_rss_kib: u64,
}

/// What the daemon reported and used, after it exited.
pub struct Finished {
    pub stop: StopRecord,
    /// user + system over its whole life: load, verify and attach included.
    pub lifetime_cpu_s: f64,
}

/// The part of the `stop` record the bench reads; unknown fields are ignored
/// so the record can grow.
#[derive(Deserialize, Debug)]
pub struct StopRecord {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub lost: std::collections::BTreeMap<String, u64>,
    /// Records written, by type.
    #[serde(default)]
    pub records: std::collections::BTreeMap<String, u64>,
    pub programs: Vec<ProgramCost>,
}

#[derive(Deserialize, Serialize, Clone, Debug)]
pub struct ProgramCost {
    pub family: String,
    pub program: String,
    pub run_count: u64,
    pub run_time_ns: u64,
    pub recursion_misses: u64,
}

impl Tracer {
    /// Start `bin` writing to files in `dir`, with `--bpf-stats` when
    /// `bpf_stats` and `filters` (e.g. `--netns NS`); return once its `start`
    /// record is written, i.e. once every probe is attached.
    pub fn start(
        bin: &Path,
        dir: &Path,
        tag: &str,
        bpf_stats: bool,
        filters: &[&str],
    ) -> anyhow::Result<Self> {
        let mut args: Vec<&str> = ARGS.to_vec();
        args.extend(bpf_stats.then_some(BPF_STATS));
        args.extend(filters);
        Self::start_with(bin, dir, tag, &args)
    }

    /// Start `bin` with exactly `args` (then `--out FILE`), as [`Tracer::start`].
    pub fn start_with(bin: &Path, dir: &Path, tag: &str, args: &[&str]) -> anyhow::Result<Self> {
        let out = dir.join(format!("{tag}.jsonl"));
        let stderr = dir.join(format!("{tag}.stderr"));
        let mut cmd = Command::new(bin);
        cmd.args(args)
            .arg("--out")
            .arg(&out)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(File::create(&stderr)?);
        // SAFETY: prctl is async-signal-safe and touches no memory of ours.
        // If xtask is killed outright, the daemon gets SIGINT and detaches.
        unsafe {
            cmd.pre_exec(|| match libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGINT) {
                0 => Ok(()),
                _ => Err(io::Error::last_os_error()),
            });
        }
        let child = cmd
            .spawn()
            .with_context(|| format!("cannot start {}", bin.display()))?;
        // Reaped with wait4 below, which also yields its rusage; dropping a
        // std Child neither waits for nor kills it.
        let mut tracer = Tracer {
            pid: child.id() as libc::pid_t,
            reaped: false,
            out,
            stderr,
            start: serde_json::Value::Null,
        };
        tracer.start = tracer.wait_for("its start record", |t| match t.first_record() {
            Some(start) if start["type"] != "start" => {
                bail!("stalltrace's first record is not `start`: {start}")
            }
            found => Ok(found),
        })?;
        Ok(tracer)
    }

    /// Poll `found` until it yields, failing if the daemon exits or
    /// `START_TIMEOUT` passes first; `what` names what was awaited.
    fn wait_for<T>(
        &mut self,
        what: &str,
        mut found: impl FnMut(&Self) -> anyhow::Result<Option<T>>,
    ) -> anyhow::Result<T> {
        let began = Instant::now();
        loop {
            interrupt::check()?;
            if let Some(v) = found(self)? {
                return Ok(v);
            }
            if let Some((status, _)) = self.try_reap() {
                bail!(
                    "stalltrace exited ({}) before writing {what}: {}",
                    describe(status),
                    self.stderr_tail()
                );
            }
            if began.elapsed() > START_TIMEOUT {
                bail!("stalltrace had not written {what} after {START_TIMEOUT:?}");
            }
            sleep(Duration::from_millis(20));
        }
    }

    pub fn usage(&self) -> anyhow::Result<Usage> {
        process_usage(self.pid as u32).with_context(|| {
            format!(
                "stalltrace (pid {}) has exited: {}",
                self.pid,
                self.stderr_tail()
            )
        })
    }

    /// The hooks of `family` it attached, as its start record lists them:
    /// "tcp_probe (tp_btf)".
    pub fn hooks_of(&self, family: &str) -> Vec<String> {
        self.attached()
            .filter(|p| p["family"] == family)
            .map(|p| {
                // What served it (a stand-in function on a kernel without the
                // tracepoint, or `prog_run`), its mode in an older record.
                let via = p["via"].as_str().or(p["mode"].as_str()).unwrap_or("?");
                format!("{} ({via})", p["hook"].as_str().unwrap_or("?"))
            })
            .collect()
    }

    /// The families it attached hooks of, in start-record order.
    pub fn families(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for f in self.attached().filter_map(|p| p["family"].as_str()) {
            if !out.iter().any(|o| o == f) {
                out.push(f.to_string());
            }
        }
        out
    }

    /// The ids of the programs it attached (every family): how its BPF links
    /// are told from anyone else's.
    pub fn prog_ids(&self) -> Vec<u64> {
        self.attached()
            .filter_map(|p| p["program_id"].as_u64())
            .collect()
    }

    /// Its attached programs as (program id, family, hook), one per id (a
    /// program attached at two hooks is listed at the first).
    pub fn attached_programs(&self) -> Vec<(u64, String, String)> {
        let mut out: Vec<(u64, String, String)> = Vec::new();
        for p in self.attached() {
            let Some(id) = p["program_id"].as_u64() else {
                continue;
            };
            if out.iter().any(|(i, _, _)| *i == id) {
                continue;
            }
            let text = |k: &str| p[k].as_str().unwrap_or("?").to_string();
            out.push((id, text("family"), text("hook")));
        }
        out
    }

    fn attached(&self) -> impl Iterator<Item = &serde_json::Value> {
        self.start["probes"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|p| p["attached"] == true)
    }

    /// SIGINT, wait for a clean exit, and read the `stop` record (the last line).
    pub fn stop(mut self) -> anyhow::Result<Finished> {
        // SAFETY: kill has no memory-safety preconditions; pid is our unreaped child.
        unsafe { libc::kill(self.pid, libc::SIGINT) };
        let (status, usage) = self.wait(STOP_TIMEOUT).with_context(|| {
            format!("stalltrace did not exit within {STOP_TIMEOUT:?} of SIGINT; killed it")
        })?;
        if !(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0) {
            bail!(
                "stalltrace exited with {}: {}",
                describe(status),
                self.stderr_tail()
            );
        }
        let text = fs::read_to_string(&self.out)?;
        let last = text.lines().rfind(|l| !l.trim().is_empty()).unwrap_or("");
        let stop: StopRecord = serde_json::from_str(last)
            .with_context(|| format!("stalltrace's last line is not a stop record: {last}"))?;
        if stop.kind != "stop" {
            bail!("stalltrace's last record is `{}`, not `stop`", stop.kind);
        }
        let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
        Ok(Finished {
            stop,
            lifetime_cpu_s: seconds(usage.ru_utime) + seconds(usage.ru_stime),
        })
    }

    /// Wait until it has written a `sql_instance` record for `worker`: it
    /// tells the kernel side a worker exists only at its first collection,
    /// so a run started before that would measure a host without SQL Server.
    pub fn wait_for_sql_worker(&mut self, worker: u32) -> anyhow::Result<()> {
        let what = format!("a sql_instance record for the SQL Server worker (pid {worker})");
        self.wait_for(&what, |t| {
            let text = fs::read_to_string(&t.out).unwrap_or_default();
            Ok(text
                .lines()
                .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
                .any(|r| r["type"] == "sql_instance" && r["pid"] == worker)
                .then_some(()))
        })
    }

    /// Its process id (the soak reads its /proc entries and BPF maps).
    pub fn pid(&self) -> u32 {
        self.pid as u32
    }

    /// The file it writes its records to.
    pub fn out(&self) -> &Path {
        &self.out
    }

    fn first_record(&self) -> Option<serde_json::Value> {
        let text = fs::read_to_string(&self.out).ok()?;
        // Only a complete line: the writer may be mid-record.
        let (line, _) = text.split_once('\n')?;
        serde_json::from_str(line).ok()
    }

    fn try_reap(&mut self) -> Option<(libc::c_int, libc::rusage)> {
        let mut status = 0;
        // SAFETY: rusage is plain data, valid when zeroed; both pointers outlive the call.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        let rc = unsafe { libc::wait4(self.pid, &mut status, libc::WNOHANG, &mut usage) };
        if rc == 0 {
            return None;
        }
        // rc == -1 means it is not our child any more: nothing left to wait for.
        self.reaped = true;
        Some((status, usage))
    }

    /// Wait up to `limit`; after that SIGKILL it, reap it, and return None.
    fn wait(&mut self, limit: Duration) -> Option<(libc::c_int, libc::rusage)> {
        let until = Instant::now() + limit;
        while Instant::now() < until {
            if let Some(done) = self.try_reap() {
                return Some(done);
            }
            sleep(Duration::from_millis(20));
        }
        // SAFETY: as in stop(); a blocking wait4 after SIGKILL returns promptly.
        unsafe {
            libc::kill(self.pid, libc::SIGKILL);
            libc::waitpid(self.pid, std::ptr::null_mut(), 0);
        }
        self.reaped = true;
        None
    }

    fn stderr_tail(&self) -> String {
        let text = fs::read_to_string(&self.stderr).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(5)..].join(" / ")
    }
}

impl Drop for Tracer {
    fn drop(&mut self) {
        if self.reaped {
            return;
        }
        eprintln!("bench: stopping stalltrace (pid {})", self.pid);
        // SAFETY: as in stop().
        unsafe { libc::kill(self.pid, libc::SIGINT) };
        self.wait(Duration::from_secs(10));
    }
}

/// utime and stime (fields 14 and 15) of /proc/PID/stat, in clock ticks. The
/// command name (field 2) may hold spaces and parentheses, so count from its
/// closing parenthesis.
pub fn cpu_ticks(stat: &str) -> Option<(u64, u64)> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    Some((fields.get(11)?.parse().ok()?, fields.get(12)?.parse().ok()?))
}

/// Any process's usage so far (the daemon's, a peer's); an error once it has
/// exited (a zombie has no memory left to report).
pub fn process_usage(pid: u32) -> anyhow::Result<Usage> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let status = fs::read_to_string(format!("/proc/{pid}/status"))?;
    let (user, system) = cpu_ticks(&stat).context("unexpected /proc/PID/stat")?;
    let ticks_s = (user + system) as f64 / clock_ticks();
    Ok(Usage {
        // To the ns where the kernel keeps schedstat: a 1 s run is 100 ticks.
        cpu_s: super::hostcpu::process_cpu_s(pid).unwrap_or(ticks_s),
        user_s: user as f64 / clock_ticks(),
        peak_rss_kib: vm_hwm_kib(&status).context("no VmHWM: it has exited")?,
    })
}

/// User CPU seconds of any process so far; None once it is gone.
pub fn process_user_s(pid: u32) -> Option<f64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    Some(cpu_ticks(&stat)?.0 as f64 / clock_ticks())
}

/// stalltrace daemons this process started that are still running.
pub fn our_daemons_left() -> Vec<String> {
    let me = std::process::id().to_string();
    fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == "stalltrace")
        })
        .filter(|pid| {
            let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
            status
                .lines()
                .any(|l| l.split_whitespace().eq(["PPid:", &me]))
        })
        .map(|pid| format!("stalltrace pid {pid} still running"))
        .collect()
}

fn vm_hwm_kib(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn clock_ticks() -> f64 {
    // SAFETY: sysconf has no preconditions.
    (unsafe { libc::sysconf(libc::_SC_CLK_TCK) }) as f64
}

fn describe(status: libc::c_int) -> String {
    if libc::WIFEXITED(status) {
        format!("exit status {}", libc::WEXITSTATUS(status))
    } else if libc::WIFSIGNALED(status) {
        format!("signal {}", libc::WTERMSIG(status))
    } else {
        format!("wait status {status}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_ticks_survive_odd_command_names() {
        let stat = "42 (a) b (c)) S 1 42 42 0 -1 4194560 100 0 0 0 7 3 0 0 20 0 1 0 5 0";
        assert_eq!(cpu_ticks(stat), Some((7, 3)));
    }

    #[test]
    fn command_line_with_and_without_bpf_stats() {
        assert_eq!(
            command_line(false),
            "stalltrace run --interval 1s --out FILE"
        );
        assert_eq!(
            command_line(true),
            "stalltrace run --bpf-stats --interval 1s --out FILE"
        );
        assert_eq!(
            command_line_with(false, &["--netns", "NS"]),
            "stalltrace run --interval 1s --netns NS --out FILE"
        );
    }

    #[test]
    fn vm_hwm_in_kib() {
        let status = "Name:\tstalltrace\nVmPeak:\t  9000 kB\nVmHWM:\t   12345 kB\n";
        assert_eq!(vm_hwm_kib(status), Some(12345));
    }
}
