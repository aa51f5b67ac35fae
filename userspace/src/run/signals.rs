//! The run's signals: SIGINT and SIGTERM end it, SIGHUP reopens `--out`.
//! Each also wakes the run loop at once (a self-pipe), rather than at its
//! next 100 ms poll: between logrotate's rename and the reopen, lines still
//! go to the renamed file, and a shipper that finds the file renamed in that
//! window may never read them (rsyslog's imfile, docs/shipping.md), so the
//! window is kept as short as the loop can make it.

use std::io::Read;
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context;

pub struct Signals {
    /// SIGINT, SIGTERM: end the run.
    stop: Arc<AtomicBool>,
    /// SIGHUP: reopen `--out`. Registered whatever the output: a HUP
    /// (logrotate, a closed terminal) must never end the run.
    reopen: Arc<AtomicBool>,
    /// The self-pipe's read end: a byte arrives with each signal.
    wake: UnixStream,
}

impl Signals {
    pub fn install() -> anyhow::Result<Self> {
        let (wake, ring) = UnixStream::pair().context("creating the signal pipe")?;
        let signals = Self {
            stop: Arc::new(AtomicBool::new(false)),
            reopen: Arc::new(AtomicBool::new(false)),
            wake,
        };
        for (sig, flag) in [
            (signal_hook::consts::SIGINT, &signals.stop),
            (signal_hook::consts::SIGTERM, &signals.stop),
            (signal_hook::consts::SIGHUP, &signals.reopen),
        ] {
            // The flag first: the loop reads it once the byte woke it.
            signal_hook::flag::register(sig, Arc::clone(flag))
                .context("installing signal handlers")?;
            let ring = ring.try_clone().context("creating the signal pipe")?;
            signal_hook::low_level::pipe::register(sig, ring)
                .context("installing signal handlers")?;
        }
        Ok(signals)
    }

    /// Sleep for `d`, or until a signal comes. The pipe is emptied before
    /// the caller reads the flags, so a signal during its work wakes the next
    /// sleep instead of being lost.
    pub fn sleep(&self, d: Duration) {
        if d.is_zero() {
            return;
        }
        if self.wake.set_read_timeout(Some(d)).is_err() {
            std::thread::sleep(d);
            return;
        }
        // A signal ends the wait either way: as the byte its handler wrote,
        // or as EINTR when it was delivered to this thread mid-call (the byte
        // then wakes the next sleep at once, a harmless spurious wake-up).
        // A timeout is WouldBlock; nothing else can happen to this socket.
        let mut bytes = [0u8; 64];
        let _ = (&self.wake).read(&mut bytes);
    }

    /// SIGHUP came since the last call.
    pub fn take_reopen(&self) -> bool {
        self.reopen.swap(false, Ordering::Relaxed)
    }

    /// SIGINT or SIGTERM came.
    pub fn stopping(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }
}
