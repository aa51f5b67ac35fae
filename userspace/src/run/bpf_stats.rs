//! `run --bpf-stats`: the kernel's per-program run-time accounting, on for
//! the run only.

use std::os::fd::OwnedFd;

use crate::error::UserError;
use crate::{host, probes};

/// Turns on the kernel's per-program run-time accounting for as long as the
/// returned fd lives; None when sysctl kernel.bpf_stats_enabled has it on already.
pub(super) fn enable() -> Result<Option<OwnedFd>, UserError> {
    let e = match aya::sys::enable_stats(aya::sys::Stats::RunTime) {
        Ok(fd) => return Ok(Some(fd)),
        Err(_) if host::kernel::bpf_stats_enabled() => return Ok(None),
        Err(e) => e,
    };
    let (needs, fix) = if host::caps::has(host::caps::CAP_SYS_ADMIN) {
        ("", "drop --bpf-stats, or use a kernel of 5.8 or later")
    } else {
        (
            " (BPF_ENABLE_STATS needs CAP_SYS_ADMIN, which this process lacks)",
            "grant CAP_SYS_ADMIN, drop --bpf-stats, or have root turn the statistics on for all with `sysctl kernel.bpf_stats_enabled=1`",
        )
    };
    let why = probes::describe(&e);
    Err(UserError::new(
        format!("--bpf-stats: cannot turn on BPF run-time statistics{needs}: {why}"),
        fix,
    ))
}
