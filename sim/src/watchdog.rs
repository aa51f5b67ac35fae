//! The watchdog `sqlservr`: SQL Server on Linux starts a parent that only
//! supervises a child of the same binary, and the child does all the work. The
//! parent here re-executes its own binary (so the child's comm is `sqlservr`
//! too) with WORKER_ENV set, forwards SIGTERM and SIGINT to it, and exits with
//! its status. It opens no files and no sockets of its own.
//!
//! With `restart`, a worker that dies of anything but the SIGTERM/SIGINT the
//! watchdog passed on (a crash, SIGKILL) is started again, as a supervisor
//! brings SQL Server back: a new worker pid, the same watchdog, and with
//! `--listen ADDR:0` a new port. Tests use it to restart the worker mid-run.

use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};

use anyhow::Context;

/// Set in the child's environment: "you are the worker".
pub const WORKER_ENV: &str = "STALLTRACE_SIM_WORKER";

/// The worker's pid, for the signal handlers (0 until it exists).
static WORKER: AtomicI32 = AtomicI32::new(0);
/// A SIGTERM or SIGINT was passed on: the worker's exit is a shutdown, not a crash.
static STOPPING: AtomicBool = AtomicBool::new(false);
/// At most this many restarts: a worker that cannot start is not retried forever.
const MAX_RESTARTS: u32 = 100;

/// Whether this process is the worker.
pub fn is_worker() -> bool {
    std::env::var_os(WORKER_ENV).is_some()
}

/// Starts the worker and waits for it (starting it again after a crash when
/// `restart`); returns the exit code to exit with (128 + signal when it was
/// killed, as a shell reports it).
pub fn run_watchdog(restart: bool) -> anyhow::Result<i32> {
    // current_exe resolves /proc/self/exe to the real path: exec'ing
    // "/proc/self/exe" itself would name the child "exe".
    let exe = std::env::current_exe().context("finding our own binary")?;
    for sig in [libc::SIGTERM, libc::SIGINT] {
        // SAFETY: the handler only stores and loads atomics and calls kill(2),
        // all async-signal-safe.
        unsafe {
            signal_hook::low_level::register(sig, move || {
                STOPPING.store(true, Ordering::SeqCst);
                let pid = WORKER.load(Ordering::SeqCst);
                if pid > 0 {
                    libc::kill(pid, sig);
                }
            })
        }
        .context("installing signal handlers")?;
    }
    let mut restarts = 0;
    loop {
        let status = run_worker_once(&exe)?;
        let crashed = status
            .signal()
            .is_some_and(|s| s != libc::SIGTERM && s != libc::SIGINT);
        if restart && crashed && !STOPPING.load(Ordering::SeqCst) && restarts < MAX_RESTARTS {
            restarts += 1;
            eprintln!(
                "sqlservr: worker killed by signal {}; starting it again ({restarts})",
                status.signal().unwrap_or(0)
            );
            continue;
        }
        return Ok(status
            .code()
            .unwrap_or_else(|| 128 + status.signal().unwrap_or(0)));
    }
}

/// One worker's life: start it, wait for it.
fn run_worker_once(exe: &std::path::Path) -> anyhow::Result<std::process::ExitStatus> {
    let parent = std::process::id() as libc::pid_t;
    let mut cmd = Command::new(exe);
    cmd.args(std::env::args_os().skip(1)).env(WORKER_ENV, "1");
    // SAFETY: the closure runs between fork and exec and calls only
    // async-signal-safe functions (prctl, getppid).
    unsafe {
        cmd.pre_exec(move || {
            // If the watchdog dies (even by SIGKILL), the worker gets SIGTERM
            // and shuts down instead of living on unsupervised.
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            if libc::getppid() != parent {
                return Err(std::io::Error::other(
                    "watchdog exited before the worker started",
                ));
            }
            Ok(())
        });
    }
    let mut child = cmd
        .spawn()
        .with_context(|| format!("starting the worker {}", exe.display()))?;
    WORKER.store(child.id() as i32, Ordering::SeqCst);
    // A stop that came while no worker was there to pass it to.
    if STOPPING.load(Ordering::SeqCst) {
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    }
    child.wait().context("waiting for the worker")
}
