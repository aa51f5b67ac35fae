//! Ctrl-C during a bench must still detach the loop device and unmount the
//! tmpfs, so SIGINT and SIGTERM only raise a flag here. The bench checks it
//! between steps and returns an error, which unwinds through the guards that
//! clean up. A Ctrl-C from the terminal also reaches fio and stalltrace (same
//! process group), so whatever step is running ends promptly on its own.

use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::bail;

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

pub fn install() {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        // Children get default dispositions back at exec, so fio and stalltrace
        // still stop on SIGINT.
        unsafe { libc::signal(sig, on_signal as *const () as libc::sighandler_t) };
    }
}

/// Err once SIGINT or SIGTERM has arrived.
pub fn check() -> anyhow::Result<()> {
    if INTERRUPTED.load(Ordering::SeqCst) {
        bail!("bench interrupted; cleaned up, no figures written");
    }
    Ok(())
}
