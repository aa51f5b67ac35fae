//! Boot one kernel under QEMU (TCG: KVM hangs on this class of machine) with
//! a hard wall-clock limit, streaming the serial console to a log while
//! noting when each line arrived and whether the kernel got into trouble.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::Context;

pub struct Boot<'a> {
    pub vmlinuz: &'a Path,
    pub initrd: &'a Path,
    /// Raw images given to the guest as NVMe disks, with their serial numbers
    /// (the guest finds each by serial).
    pub disks: &'a [(PathBuf, &'a str)],
    pub append: &'a [String],
    pub timeout: Duration,
    pub memory_mb: u32,
    pub cpu: &'a str,
    /// The qemu-system-x86_64 binary (fetch::qemu).
    pub qemu: &'a Path,
    pub console_log: &'a Path,
    /// Prefix for progress lines on the host's stderr.
    pub label: &'a str,
}

/// A console line and when it arrived, in seconds since QEMU started.
pub struct Line {
    pub at: f64,
    pub text: String,
}

pub struct Outcome {
    pub lines: Vec<Line>,
    pub timed_out: bool,
    pub wall: f64,
    /// Panics, lockups, oopses and RCU stalls seen on the console.
    pub trouble: Vec<String>,
    /// Kernel warnings (WARNING: CPU: …): reported, not failed on.
    pub warnings: Vec<String>,
    pub qemu_status: String,
}

/// Console text that means the guest kernel is in trouble. Under TCG a
/// soft lockup is also what an over-subscribed host looks like; either way the
/// run is not trustworthy.
const TROUBLE: &[&str] = &[
    "Kernel panic",
    "soft lockup",
    "hard LOCKUP",
    "BUG: ",
    "Oops:",
    "general protection fault",
    "self-detected stall",
    "rcu_preempt detected stalls",
    "rcu_sched detected stalls",
    "hung_task",
    "blocked for more than",
];

/// A sparse, zeroed disk image, recreated for every boot so runs do not see
/// each other's data.
pub fn fresh_disk(path: &Path, bytes: u64) -> anyhow::Result<()> {
    let _ = std::fs::remove_file(path);
    let f = std::fs::File::create(path)?;
    f.set_len(bytes)?;
    Ok(())
}

pub fn boot(b: &Boot) -> anyhow::Result<Outcome> {
    let mut cmdline = vec![
        "console=ttyS0".to_string(),
        // Reboot (so QEMU exits, -no-reboot) at once on a panic.
        "panic=-1".into(),
        "quiet".into(),
        "rdinit=/init".into(),
        // QEMU 10's NVMe controller says it may share its namespaces, so the
        // kernel makes a multipath head (nvme0n1, bio-based) over a hidden
        // path device (nvme0c0n1) where the requests are: the checks compare
        // one disk's requests with its diskstats, so the guest gets the plain
        // single-path disk a host without NVMe multipath has.
        "nvme_core.multipath=N".into(),
    ];
    cmdline.extend(b.append.iter().cloned());
    let mut child = Command::new(b.qemu)
        // One TCG thread for the whole VM: multi-threaded TCG soft-locks the
        // guests on this 2-core host.
        .args(["-accel", "tcg,thread=single", "-cpu", b.cpu, "-smp", "2"])
        .args(["-m", &b.memory_mb.to_string()])
        .args([
            "-nographic",
            "-no-reboot",
            "-nodefaults",
            "-serial",
            "stdio",
        ])
        .arg("-kernel")
        .arg(b.vmlinuz)
        .arg("-initrd")
        .arg(b.initrd)
        .args(["-append", &cmdline.join(" ")])
        .args(b.disks.iter().enumerate().flat_map(|(i, (path, serial))| {
            [
                "-drive".to_string(),
                format!("file={},if=none,id=d{i},format=raw", path.display()),
                "-device".to_string(),
                format!("nvme,serial={serial},drive=d{i}"),
            ]
        }))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("cannot start qemu-system-x86_64 (cargo xtask setup installs it)")?;
    let start = Instant::now();
    let stdout = child.stdout.take().unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = mpsc::channel::<Line>();
    let reader = std::thread::spawn(move || {
        let mut r = BufReader::new(stdout);
        let mut buf = Vec::new();
        // Lines may end in \r\n and may hold bytes that are not UTF-8 (early boot).
        while r.read_until(b'\n', &mut buf).is_ok_and(|n| n > 0) {
            let text = String::from_utf8_lossy(&buf)
                .trim_end_matches(['\r', '\n'])
                .replace('\r', "");
            buf.clear();
            let at = start.elapsed().as_secs_f64();
            if tx.send(Line { at, text }).is_err() {
                break;
            }
        }
    });
    let err_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut BufReader::new(stderr), &mut s);
        s
    });

    let mut log = std::io::BufWriter::new(std::fs::File::create(b.console_log)?);
    let deadline = start + b.timeout;
    let mut out = Outcome {
        lines: Vec::new(),
        timed_out: false,
        wall: 0.0,
        trouble: Vec::new(),
        warnings: Vec::new(),
        qemu_status: String::new(),
    };
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) => {
                writeln!(log, "[{:8.3}] {}", line.at, line.text)?;
                if is_kernel_message(&line.text) && TROUBLE.iter().any(|t| line.text.contains(t)) {
                    eprintln!("kernels: {}: console: {}", b.label, line.text);
                    out.trouble.push(line.text.clone());
                } else if is_kernel_message(&line.text) && line.text.contains("WARNING: CPU:") {
                    out.warnings.push(line.text.clone());
                } else if let Some(m) = line.text.find("STALLTRACE-MATRIX ") {
                    progress(b.label, line.at, &line.text[m + 18..]);
                }
                out.lines.push(line);
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                out.timed_out = true;
                eprintln!(
                    "kernels: {}: no power-off after {} s: killing QEMU (pid {})",
                    b.label,
                    b.timeout.as_secs(),
                    child.id()
                );
                let _ = child.kill();
                break;
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
    let status = child.wait()?;
    out.wall = start.elapsed().as_secs_f64();
    let _ = reader.join();
    let qemu_err = err_reader.join().unwrap_or_default();
    if !qemu_err.trim().is_empty() {
        writeln!(log, "--- qemu stderr ---\n{qemu_err}")?;
    }
    log.flush()?;
    out.qemu_status = if out.timed_out {
        format!("killed after {} s timeout", b.timeout.as_secs())
    } else if status.success() {
        "exited".into()
    } else {
        format!("{status}: {}", qemu_err.trim())
    };
    Ok(out)
}

/// Does the line carry a printk timestamp ("[   12.345678] ")? Only kernel
/// messages are searched for trouble, not what the checks print.
fn is_kernel_message(text: &str) -> bool {
    text.match_indices('[').any(|(i, _)| {
        let rest = &text[i + 1..];
        rest.find(']').is_some_and(|end| {
            let stamp = &rest[..end];
            stamp.contains('.')
                && stamp.bytes().any(|b| b.is_ascii_digit())
                && stamp
                    .bytes()
                    .all(|b| b == b' ' || b == b'.' || b.is_ascii_digit())
        })
    })
}

/// A short progress note on the host's stderr for each marker line, so a
/// long matrix run shows where it is.
fn progress(label: &str, at: f64, marker: &str) {
    if marker.starts_with("out ") {
        return;
    }
    let short: String = marker.chars().take(160).collect();
    eprintln!("kernels: {label} [{at:6.1}s] {short}");
}

/// The last `n` console lines, for a failure report.
pub fn tail(lines: &[Line], n: usize) -> Vec<String> {
    lines[lines.len().saturating_sub(n)..]
        .iter()
        .map(|l| l.text.clone())
        .collect()
}

pub fn run_dir() -> PathBuf {
    super::fetch::cache_root().join("run")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_messages_by_timestamp() {
        assert!(is_kernel_message(
            "[    1.308555] BUG: kernel NULL pointer dereference"
        ));
        assert!(is_kernel_message(
            "\u{1b}c\u{1b}[?7l\u{1b}[2J[    1.3] Kernel panic - not syncing"
        ));
        assert!(!is_kernel_message("kernel-checks: detail BUG: something"));
        assert!(!is_kernel_message(
            "STALLTRACE-MATRIX {\"detail\":\"[none]\"}"
        ));
    }
}
