//! Host-wide CPU time, to say how much of it went to someone else while a
//! workload ran: a busy neighbour (a build, someone's tests) or the
//! hypervisor (steal).

/// Host-wide CPU seconds from the first line of /proc/stat.
pub struct HostCpu {
    /// user + nice, all CPUs.
    pub user_s: f64,
    /// Time the hypervisor ran something else while this guest wanted to run.
    pub steal_s: f64,
}

impl HostCpu {
    pub fn now() -> Self {
        let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
        let ticks: Vec<f64> = stat
            .lines()
            .next()
            .unwrap_or_default()
            .split_whitespace()
            .skip(1)
            .map(|v| v.parse().unwrap_or(0.0))
            .collect();
        // SAFETY: sysconf has no preconditions.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
        let field = |i: usize| ticks.get(i).copied().unwrap_or(0.0) / hz;
        // Fields: user nice system idle iowait irq softirq steal ...
        HostCpu {
            user_s: field(0) + field(1),
            steal_s: field(7),
        }
    }

    pub fn since(&self, earlier: &Self) -> Self {
        HostCpu {
            user_s: self.user_s - earlier.user_s,
            steal_s: self.steal_s - earlier.steal_s,
        }
    }
}

/// User CPU seconds of this process's children that have been waited for
/// (and of their own waited-for descendants): a client's share, when it is
/// the only child reaped between two readings.
pub fn children_user_s() -> f64 {
    // SAFETY: rusage is plain data, valid when zeroed; the pointer outlives the call.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut usage) };
    usage.ru_utime.tv_sec as f64 + usage.ru_utime.tv_usec as f64 / 1e6
}

/// CPU time (user + system) of every thread of `pid` so far, in seconds, to
/// the nanosecond: the sum of each thread's run time in /proc/PID/task/*/schedstat.
/// /proc/PID/stat counts in clock ticks (10 ms here), 1% of a one-second run,
/// more than a daemon uses in it. None where schedstat is missing (a kernel
/// without CONFIG_SCHED_INFO) or the process is gone. A thread that exits
/// between two readings takes its time with it: the daemon's threads live as
/// long as it does.
pub fn process_cpu_s(pid: u32) -> Option<f64> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    let mut ns = 0u64;
    let mut any = false;
    for task in tasks.flatten() {
        // A thread that exited since the listing: its time is gone either way.
        let Ok(text) = std::fs::read_to_string(task.path().join("schedstat")) else {
            continue;
        };
        ns += schedstat_run_ns(&text)?;
        any = true;
    }
    any.then(|| ns as f64 / 1e9)
}

/// The first field of a schedstat line: time on the CPU, in ns.
fn schedstat_run_ns(text: &str) -> Option<u64> {
    text.split_whitespace().next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    #[test]
    fn schedstat_first_field_and_this_process() {
        assert_eq!(super::schedstat_run_ns("706069 78677 2\n"), Some(706069));
        assert_eq!(super::schedstat_run_ns(""), None);
        // This test process has run, so it has a run time (where schedstat exists).
        if std::path::Path::new("/proc/self/schedstat").exists() {
            let s = super::process_cpu_s(std::process::id()).unwrap();
            assert!(s > 0.0, "{s}");
        }
    }
}
