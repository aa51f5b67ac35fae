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
