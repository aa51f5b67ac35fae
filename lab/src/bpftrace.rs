//! bpftrace as an oracle beside the tracer: a script of the test's own on the
//! kernel's tracepoints, for a span stalltrace does not time itself.
//!
//! It runs in a mount namespace of its own with tracefs mounted there:
//! bpftrace finds tracepoints through tracefs, which a fresh host need not
//! have mounted, and the host's mounts stay as they were. It is stopped with
//! SIGINT, on which bpftrace prints its maps; it dies with the test.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::util::{ScratchDir, die_with_parent};

/// How long bpftrace may take to attach every probe (it compiles the script
/// with LLVM first: seconds on a busy 2-vCPU host).
const ATTACH_TIMEOUT: Duration = Duration::from_secs(60);

/// A running bpftrace script, killed on drop if not stopped.
pub struct Bpftrace {
    child: Option<Child>,
    dir: ScratchDir,
}

impl Bpftrace {
    /// Start `script`, which must print "ready" from its BEGIN probe (BEGIN
    /// runs once every probe is attached); return once it has.
    pub fn start(script: &str) -> Self {
        let dir = ScratchDir::new("/tmp");
        let bt = dir.0.join("oracle.bt");
        fs::write(&bt, script).expect("write the bpftrace script");
        let mut cmd = Command::new("bpftrace");
        cmd.args(["-B", "line"])
            .arg(&bt)
            .stdin(Stdio::null())
            .stdout(File::create(dir.0.join("out")).expect("bpftrace's output file"))
            .stderr(File::create(dir.0.join("err")).expect("bpftrace's error file"));
        die_with_parent(&mut cmd);
        with_own_tracefs(&mut cmd);
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("bpftrace: {e} (the tests need it installed)"));
        let mut oracle = Self {
            child: Some(child),
            dir,
        };
        let started = Instant::now();
        while !oracle.output().lines().any(|l| l == "ready") {
            let child = oracle.child.as_mut().expect("running");
            if let Some(status) = child.try_wait().expect("wait for bpftrace") {
                panic!(
                    "bpftrace exited ({status}) before it attached: {}",
                    oracle.errors().trim()
                );
            }
            assert!(
                started.elapsed() < ATTACH_TIMEOUT,
                "bpftrace did not attach within {ATTACH_TIMEOUT:?}: {}",
                oracle.errors().trim()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        oracle
    }

    /// Stop it and return its scalar maps (`@name: value` lines, by name
    /// without the `@`), e.g. a `count()` or a `sum()`.
    pub fn stop(mut self) -> BTreeMap<String, i64> {
        let mut child = self.child.take().expect("running");
        // SAFETY: kill(2) on our own child's pid, not yet reaped.
        unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
        let status = child.wait().expect("wait for bpftrace");
        assert!(
            status.success(),
            "bpftrace: {status}: {}",
            self.errors().trim()
        );
        self.output()
            .lines()
            .filter_map(|line| {
                let (name, value) = line.strip_prefix('@')?.split_once(": ")?;
                Some((name.to_string(), value.trim().parse().ok()?))
            })
            .collect()
    }

    fn output(&self) -> String {
        fs::read_to_string(self.dir.0.join("out")).unwrap_or_default()
    }

    fn errors(&self) -> String {
        fs::read_to_string(self.dir.0.join("err")).unwrap_or_default()
    }
}

impl Drop for Bpftrace {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Run `cmd` (a bpftrace, or what starts one) in a mount namespace of its
/// own with tracefs at /sys/kernel/tracing (see the module's comment).
pub fn with_own_tracefs(cmd: &mut Command) {
    // SAFETY: unshare and mount are async-signal-safe system calls and read
    // only the constant strings passed to them.
    unsafe {
        cmd.pre_exec(|| {
            if libc::unshare(libc::CLONE_NEWNS) != 0 {
                return Err(io::Error::last_os_error());
            }
            let none = std::ptr::null();
            // Private first, so that the mount below stays in this namespace.
            if libc::mount(
                c"none".as_ptr(),
                c"/".as_ptr(),
                none,
                libc::MS_REC | libc::MS_PRIVATE,
                none.cast(),
            ) != 0
            {
                return Err(io::Error::last_os_error());
            }
            // EBUSY: already mounted there (the host had it); that serves.
            if libc::mount(
                c"tracefs".as_ptr(),
                c"/sys/kernel/tracing".as_ptr(),
                c"tracefs".as_ptr(),
                0,
                none.cast(),
            ) != 0
                && io::Error::last_os_error().raw_os_error() != Some(libc::EBUSY)
            {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
}
