//! Small process helpers every part of the lab uses.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

use anyhow::{Context, bail};

/// The lab needs root (loop devices, namespaces, eBPF programs): without it,
/// it fails, never skips.
pub fn require_root() {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "the lab needs root (loop devices, network namespaces, eBPF programs): run it as root \
         (`cargo xtask test`, `cargo xtask lab`)"
    );
}

/// A name no other test (or test process) uses.
pub fn unique(prefix: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// Run a command; panic with its stderr if it fails. Returns stdout.
pub fn sh(program: &str, args: &[&str]) -> String {
    try_sh(program, args).unwrap_or_else(|e| panic!("{e:#}"))
}

/// Like `sh`, with `input` on the command's stdin.
pub fn sh_stdin(program: &str, args: &[&str], input: &str) -> String {
    try_sh_stdin(program, args, input).unwrap_or_else(|e| panic!("{e:#}"))
}

/// `sh` for a caller that reports failures itself (the bench): an error
/// with the command's stderr.
pub fn try_sh(program: &str, args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new(program)
        .args(args)
        .output()
        .with_context(|| format!("cannot run {program} (run `cargo xtask setup`)"))?;
    stdout_of(program, args, out, "")
}

/// `sh_stdin` for a caller that reports failures itself.
pub fn try_sh_stdin(program: &str, args: &[&str], input: &str) -> anyhow::Result<String> {
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot run {program} (run `cargo xtask setup`)"))?;
    // Written whole before the output is read: the inputs are short scripts,
    // well within a pipe's buffer.
    let written = child
        .stdin
        .take()
        .expect("stdin is piped")
        .write_all(input.as_bytes());
    let out = child.wait_with_output()?;
    let stdout = stdout_of(program, args, out, &format!("\ninput:\n{input}"))?;
    written.with_context(|| format!("cannot write to {program}"))?;
    Ok(stdout)
}

/// The command's stdout, or an error with its stderr (and `more`, what was
/// fed to it) when it failed.
fn stdout_of(program: &str, args: &[&str], out: Output, more: &str) -> anyhow::Result<String> {
    if !out.status.success() {
        bail!(
            "{program} {args:?} failed ({}): {}{more}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Make `cmd`'s process get SIGKILL when the thread that starts it ends (the
/// kernel's parent-death signal follows the thread): a test killed by its
/// runner's timeout must not leave a tracer attached. Start it from the
/// thread that outlives it.
pub fn die_with_parent(cmd: &mut Command) -> &mut Command {
    use std::os::unix::process::CommandExt;
    // SAFETY: prctl is async-signal-safe and touches only the child.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) == 0 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            }
        })
    }
}

/// Text without its terminal escapes (sockperf colours its summary even
/// into a pipe), for the parsers of the lab and the bench alike.
pub fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // CSI: ESC '[' parameters, ended by a letter.
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// A daemon's guard on drop (the lab's tracer and the kernel checks' run
/// alike): kill and reap the child if it still runs, then remove its files.
pub(crate) fn kill_and_remove(child: Option<std::process::Child>, files: &[&std::path::Path]) {
    if let Some(mut child) = child {
        let _ = child.kill();
        let _ = child.wait();
    }
    for file in files {
        let _ = std::fs::remove_file(file);
    }
}

/// A directory removed (with what is in it) on drop.
pub struct ScratchDir(pub PathBuf);

impl ScratchDir {
    pub fn new(parent: &str) -> Self {
        let dir = std::path::Path::new(parent).join(unique("stalltrace-lab"));
        std::fs::create_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        Self(dir)
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
