//! Is the host quiet enough to measure? The kernel is shared: other people's
//! tests attach their own hooks (another stalltrace, bpftrace) for seconds at
//! a time and run their own fio, iperf3 and sockperf, and a hook on every I/O
//! or packet in an "untraced" round would make the baseline a lie. bpftool's
//! list of BPF links tells us about the hooks, /proc about the processes; a
//! disturbed run is run again ([`retry`]), and [`Quiet`] waits for a quiet
//! host before each run, within a budget.

use std::fs;
use std::time::{Duration, Instant};

use crate::util;

use super::hostcpu::HostCpu;
use super::interrupt;

/// A BPF link attached right now: "raw_tracepoint block_rq_issue", and its program.
struct Link {
    what: String,
    prog_id: u64,
}

/// The BPF links attached right now whose target (a tracepoint name, for
/// tp_btf and raw_tp links) satisfies `is_target`. Empty when bpftool is
/// missing or fails: then nothing can be said.
fn links(is_target: impl Fn(&str) -> bool) -> Vec<Link> {
    let Some(text) = util::output("bpftool", &["link", "show", "--json"]) else {
        return Vec::new();
    };
    let links: Vec<serde_json::Value> = serde_json::from_str(&text).unwrap_or_default();
    links
        .iter()
        .filter_map(|link| {
            // tp_btf and raw_tp links name their tracepoint in tp_name; other
            // kinds (perf_event, tracing) use other fields, so look at them all.
            let target = link
                .as_object()?
                .values()
                .filter_map(|v| v.as_str())
                .find(|s| is_target(s))?;
            Some(Link {
                what: format!("{} {target}", link["type"].as_str().unwrap_or("?")),
                prog_id: link["prog_id"].as_u64().unwrap_or(0),
            })
        })
        .collect()
}

fn is_block(target: &str) -> bool {
    target.starts_with("block_") || target.starts_with("block:")
}

/// Tracepoints on the network path: TCP, sockets, devices, receive, qdiscs, skbs.
fn is_net(target: &str) -> bool {
    const PREFIXES: &[&str] = &[
        "tcp_",
        "tcp:",
        "sock_",
        "sock:",
        "inet_sock_",
        "net_dev_",
        "net:",
        "netif_",
        "napi_",
        "napi:",
        "dql_",
        "qdisc_",
        "qdisc:",
        "skb:",
        "kfree_skb",
        "consume_skb",
    ];
    PREFIXES.iter().any(|p| target.starts_with(p))
}

/// Why a run may be disturbed, when links of `kind` ("block-layer") are
/// attached whose programs are not among `ours` (the program ids our own
/// daemon reported in its start record; none in untraced rounds).
fn foreign(kind: &str, found: Vec<Link>, ours: &[u64]) -> Option<String> {
    let total = found.len();
    let theirs: Vec<String> = found
        .into_iter()
        .filter(|l| !ours.contains(&l.prog_id))
        .map(|l| l.what)
        .collect();
    // Another stalltrace holds a dozen or more: name a few.
    const NAMED: usize = 4;
    let mut named = theirs[..theirs.len().min(NAMED)].join(", ");
    if theirs.len() > NAMED {
        named += ", ...";
    }
    (!theirs.is_empty()).then(|| {
        format!(
            "{} {kind} BPF link(s) not ours were attached ({total} in all; theirs: {named})",
            theirs.len(),
        )
    })
}

/// Someone else's block-layer hooks, if any are attached.
pub fn block_disturbance(ours: &[u64]) -> Option<String> {
    foreign("block-layer", links(is_block), ours)
}

/// Someone else's network-path hooks, if any are attached.
pub fn net_disturbance(ours: &[u64]) -> Option<String> {
    foreign("network-path", links(is_net), ours)
}

/// Processes named one of `names` that are not this process's descendants:
/// someone else's load generator competing for the 2 CPUs.
pub fn foreign_processes(names: &[&str]) -> Option<String> {
    let me = std::process::id();
    let theirs: Vec<String> = pids()
        .filter_map(|pid| {
            let comm = fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
            let comm = comm.trim();
            // A zombie left unreaped by its parent uses no CPU and holds nothing.
            (names.contains(&comm) && !descends_from(pid, me) && !zombie(pid))
                .then(|| format!("{comm} ({pid})"))
        })
        .collect();
    (!theirs.is_empty()).then(|| format!("other load was running: {}", theirs.join(", ")))
}

/// Processes named one of `names` that this process started (directly or
/// not) and that are still running: what a bench must not leave behind.
pub fn our_processes(names: &[&str]) -> Vec<String> {
    let me = std::process::id();
    pids()
        .filter(|&pid| pid != me)
        .filter_map(|pid| {
            let comm = fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
            let comm = comm.trim();
            (names.contains(&comm) && descends_from(pid, me))
                .then(|| format!("{comm} pid {pid} still running"))
        })
        .collect()
}

fn pids() -> impl Iterator<Item = u32> {
    fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
}

/// Whether `pid` has exited and waits to be reaped (state Z in /proc/PID/stat).
fn zombie(pid: u32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        s.rfind(')')
            .and_then(|i| s[i + 1..].split_whitespace().next())
            .is_some_and(|state| state == "Z")
    })
}

fn parent(pid: u32) -> Option<u32> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("PPid:"))?
        .trim()
        .parse()
        .ok()
}

fn descends_from(mut pid: u32, ancestor: u32) -> bool {
    // A process tree is shallow; the bound only guards against a /proc race.
    for _ in 0..64 {
        if pid == ancestor {
            return true;
        }
        match parent(pid) {
            Some(p) if p != 0 && p != pid => pid = p,
            _ => return false,
        }
    }
    false
}

/// Waiting for a quiet host, within a budget: up to [`QUIET_BEFORE_SUITE`]
/// before the suite, then up to [`QUIET_PER_RUN`] before each run but no more
/// than [`QUIET_BUDGET`] over all runs, so a neighbour's long build cannot
/// stretch the suite without end (each run is also checked after, and run
/// again when someone else's hooks or load generators were there). What
/// disturbs is the suite's own `disturbance` (given the program ids that
/// are the bench's own), plus user-space CPU of others.
pub struct Quiet {
    spent: Duration,
    disturbance: fn(&[u64]) -> Option<String>,
}

pub const QUIET_BEFORE_SUITE: Duration = Duration::from_secs(10);
pub const QUIET_PER_RUN: Duration = Duration::from_secs(10);
pub const QUIET_BUDGET: Duration = Duration::from_secs(20);
/// More user-space CPU than this from other processes, in % of one CPU, is a busy host.
pub const BUSY_USER_CPU_PCT: f64 = 25.0;
/// How long the host's CPU is watched before each run.
const CPU_SAMPLE: Duration = Duration::from_millis(200);

impl Quiet {
    pub fn new(disturbance: fn(&[u64]) -> Option<String>) -> Self {
        Quiet {
            spent: Duration::ZERO,
            disturbance,
        }
    }

    /// Wait until the host is quiet: no `disturbance` (the programs `ours`
    /// are the bench's own daemon's or peer's) and little user-space CPU
    /// (sampled for [`CPU_SAMPLE`] while no client of ours runs; a daemon or
    /// bpftrace of ours may, using a fraction of a percent). None when it
    /// is; else why not, once the time allowed has passed: then the caller
    /// measures anyway.
    pub fn wait(&mut self, limit: Duration, ours: &[u64]) -> anyhow::Result<Option<String>> {
        let began = Instant::now();
        let mut said = began;
        loop {
            interrupt::check()?;
            let cpu = HostCpu::now();
            std::thread::sleep(CPU_SAMPLE);
            let busy = 100.0 * HostCpu::now().since(&cpu).user_s / CPU_SAMPLE.as_secs_f64();
            let why = (self.disturbance)(ours).or_else(|| {
                (busy > BUSY_USER_CPU_PCT)
                    .then(|| format!("other processes used {busy:.0}% of a CPU in user space"))
            });
            let waited = began.elapsed();
            let Some(why) = why else {
                return Ok(None);
            };
            if waited > limit {
                return Ok(Some(why));
            }
            if said.elapsed() >= Duration::from_secs(15) {
                eprintln!("bench: waiting for a quiet host: {why}");
                said = Instant::now();
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// Before a run: what is left of the budget, at most [`QUIET_PER_RUN`].
    pub fn before_run(&mut self, ours: &[u64]) -> anyhow::Result<Option<String>> {
        let began = Instant::now();
        let limit = QUIET_PER_RUN.min(QUIET_BUDGET.saturating_sub(self.spent));
        let why = self.wait(limit, ours)?;
        // The first sample always takes CPU_SAMPLE; only the waiting beyond it counts.
        self.spent += began.elapsed().saturating_sub(CPU_SAMPLE);
        Ok(why)
    }

    /// How long the runs have waited for a quiet host so far (beyond the samples).
    pub fn spent(&self) -> Duration {
        self.spent
    }
}

/// How often a disturbed run is tried again; the last attempt is kept, with
/// a warning next to the figures.
pub const ATTEMPTS: usize = 3;

/// Run `run` until it reports no disturbance (its second value), at most
/// [`ATTEMPTS`] times, waiting between attempts for the disturbance to pass.
pub fn retry<T>(
    label: &str,
    warnings: &mut Vec<String>,
    mut run: impl FnMut() -> anyhow::Result<(T, Option<String>)>,
) -> anyhow::Result<T> {
    for attempt in 1.. {
        interrupt::check()?;
        match run()? {
            (result, None) => return Ok(result),
            (result, Some(why)) if attempt >= ATTEMPTS => {
                let w = format!("{label}: kept after {ATTEMPTS} attempts although {why}");
                eprintln!("bench: warning: {w}");
                warnings.push(w);
                return Ok(result);
            }
            (_, Some(why)) => {
                eprintln!("bench: {label}: {why}; waiting, then running it again");
                // Other people's tests hold their hooks for seconds: let them finish.
                std::thread::sleep(std::time::Duration::from_secs(5));
            }
        }
    }
    unreachable!("the loop returns by its last attempt")
}

/// [`retry`], and an attempt that fails (not by an interrupt) is also tried
/// again, up to [`ATTEMPTS`] in all, the last error returned: on a shared
/// host someone else's cleanup may kill a client or a server mid-run.
pub fn retry_failures<T>(
    label: &str,
    warnings: &mut Vec<String>,
    mut run: impl FnMut() -> anyhow::Result<(T, Option<String>)>,
) -> anyhow::Result<T> {
    let mut failed = 0;
    retry(label, &mut *warnings, || {
        loop {
            match run() {
                Ok(done) => return Ok(done),
                Err(e) => {
                    interrupt::check()?;
                    failed += 1;
                    if failed >= ATTEMPTS {
                        return Err(e.context(format!("{label}: failed {ATTEMPTS} times")));
                    }
                    eprintln!("bench: {label}: failed ({e:#}); trying again");
                    std::thread::sleep(std::time::Duration::from_secs(2));
                }
            }
        }
    })
    .inspect(|_| {
        if failed > 0 {
            let w = format!("{label}: failed {failed} time(s) before it ran");
            warnings.push(w);
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn net_tracepoints_are_told_from_others() {
        for t in [
            "tcp_probe",
            "net_dev_xmit",
            "netif_rx_entry",
            "sock_recv_length",
            "tcp:tcp_probe",
        ] {
            assert!(is_net(t), "{t}");
        }
        for t in ["block_rq_issue", "sched_switch", "raw_tracepoint"] {
            assert!(!is_net(t), "{t}");
        }
    }

    #[test]
    fn only_links_of_other_programs_disturb() {
        let found = || {
            vec![
                Link {
                    what: "raw_tracepoint tcp_probe".into(),
                    prog_id: 7,
                },
                Link {
                    what: "raw_tracepoint net_dev_xmit".into(),
                    prog_id: 8,
                },
            ]
        };
        assert_eq!(foreign("network-path", found(), &[7, 8]), None);
        let why = foreign("network-path", found(), &[7]).unwrap();
        assert!(
            why.starts_with("1 network-path") && why.contains("net_dev_xmit"),
            "{why}"
        );
        assert!(foreign("network-path", found(), &[]).is_some());
    }

    #[test]
    fn this_process_descends_from_itself_and_not_from_a_child() {
        let me = std::process::id();
        assert!(descends_from(me, me));
        assert!(!descends_from(1, me));
        assert!(!zombie(me), "a running process is no zombie");
    }
}
