//! The usual peers (BCC's tools, the bpftrace package's scripts): whether
//! they can run on this host, found out at run time and published with the
//! reason, not assumed.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde::Serialize;

use crate::util;

/// A peer that could not run here, and why, as found at run time.
#[derive(Serialize, Clone, Debug)]
pub struct Unavailable {
    pub tool: String,
    /// Where it was looked for or what was run.
    pub tried: String,
    pub verdict: String,
}

/// Try the usual peers of `tools` (BCC's `<tool>-bpfcc` or `<tool>`, and
/// the bpftrace package's `<tool>.bt`): what happened to each.
pub fn unavailable(tools: &[&str]) -> Vec<Unavailable> {
    let mut out = Vec::new();
    let host = host_facts();
    for tool in tools {
        // BCC: the Debian name, the upstream name, the upstream install dir.
        let candidates = [
            format!("{tool}-bpfcc"),
            format!("/usr/sbin/{tool}-bpfcc"),
            format!("/usr/share/bcc/tools/{tool}"),
        ];
        let found = candidates.iter().find(|c| {
            if c.starts_with('/') {
                Path::new(c).is_file()
            } else {
                which(c).is_some()
            }
        });
        out.push(match found {
            None => Unavailable {
                tool: format!("BCC {tool}"),
                tried: candidates.join(", "),
                verdict: format!("not installed; could not run here anyway: {host}"),
            },
            Some(path) => {
                let path = which(path).unwrap_or_else(|| PathBuf::from(path));
                let tried = format!("timeout {TRY_S} {}", path.display());
                Unavailable {
                    tool: format!("BCC {tool}"),
                    verdict: try_run(&path, &[], &tried),
                    tried,
                }
            }
        });
        let bt = PathBuf::from(format!("/usr/sbin/{tool}.bt"));
        if bt.is_file() {
            let tried = format!("timeout {TRY_S} bpftrace {}", bt.display());
            out.push(Unavailable {
                tool: format!("bpftrace {tool}.bt"),
                verdict: try_run(Path::new("bpftrace"), &[bt.to_str().unwrap_or("")], &tried),
                tried,
            });
        }
    }
    out
}

/// What this host lacks that kprobe-based and header-compiling tools need.
fn host_facts() -> String {
    let release = fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mut lacks = Vec::new();
    let kprobes = [
        "/sys/kernel/tracing/kprobe_events",
        "/sys/kernel/debug/tracing/kprobe_events",
    ];
    // Only a mounted tracefs tells: a fresh host may have none mounted.
    let tracefs_mounted = [
        "/sys/kernel/tracing/events",
        "/sys/kernel/debug/tracing/events",
    ]
    .iter()
    .any(|p| Path::new(p).exists());
    if tracefs_mounted && !kprobes.iter().any(|p| Path::new(p).exists()) {
        lacks.push("no kprobes (no kprobe_events in tracefs)".to_string());
    }
    let headers = format!("/lib/modules/{}/build", release.trim());
    if !Path::new(&headers).exists() && !Path::new("/sys/kernel/kheaders.tar.xz").exists() {
        lacks.push(format!(
            "no kernel headers ({headers} and /sys/kernel/kheaders.tar.xz absent)"
        ));
    }
    if util::output("python3", &["-c", "import bcc"]).is_none() {
        lacks.push("no python3 bcc module".into());
    }
    if lacks.is_empty() {
        "this host has kprobes and headers".into()
    } else {
        lacks.join("; ")
    }
}

fn which(name: &str) -> Option<PathBuf> {
    if name.starts_with('/') {
        return Path::new(name).is_file().then(|| PathBuf::from(name));
    }
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .chain(["/usr/sbin", "/sbin"])
        .map(|d| Path::new(d).join(name))
        .find(|p| p.is_file())
}

/// How long a usual peer is given to attach (bpftrace's tools attach within a second).
const TRY_S: u64 = 4;

/// Run a peer for at most [`TRY_S`] s; what it said, in one line.
fn try_run(program: &Path, args: &[&str], tried: &str) -> String {
    let mut cmd = Command::new("timeout");
    cmd.args(["-s", "INT", &TRY_S.to_string()])
        .arg(program)
        .args(args)
        .stdin(Stdio::null());
    super::with_own_tracefs(&mut cmd);
    let out = cmd.output();
    let out = match out {
        Ok(o) => o,
        Err(e) => return format!("could not start: {e}"),
    };
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    summarize(&text, out.status, tried)
}

/// What a peer's output says about why it cannot trace here, in one line.
fn summarize(text: &str, status: std::process::ExitStatus, tried: &str) -> String {
    // Probes it could not attach: bpftrace says "could not attach probe
    // kprobe:X, skipping" (and runs on, tracing nothing) or "Error attaching
    // probe: 'kprobe:X'" (and exits).
    let mut probes: Vec<String> = text
        .lines()
        .filter_map(|l| {
            let rest = l
                .split_once("could not attach probe ")
                .map(|(_, r)| r)
                .or_else(|| l.split_once("Error attaching probe: ").map(|(_, r)| r))?;
            Some(
                rest.trim()
                    .trim_end_matches(", skipping.")
                    .trim_matches('\'')
                    .to_string(),
            )
        })
        .collect();
    probes.sort();
    probes.dedup();
    let no_kprobe_events = text.contains("kprobe_events): No such file");
    if !probes.is_empty() {
        return format!(
            "cannot trace on this kernel: {} could not attach{}",
            probes.join(", "),
            if no_kprobe_events {
                " (no kprobe_events in tracefs: this kernel has no kprobes)"
            } else {
                ""
            }
        );
    }
    // Otherwise the error lines, shortest form.
    let why: Vec<String> = text
        .lines()
        .map(str::trim)
        .filter(|l| {
            let l = l.to_lowercase();
            (l.contains("error") || l.contains("kprobe") || l.contains("failed"))
                && !l.contains("rlimit_memlock")
        })
        .map(|l| l.trim_start_matches("ERROR: ").to_string())
        .collect();
    if why.is_empty() {
        format!(
            "ran for {TRY_S} s ({status}) and reported no error: it may work here, but this \
             suite does not measure it ({tried})"
        )
    } else {
        let mut said: Vec<String> = why.into_iter().take(3).collect();
        said.dedup();
        format!("cannot run on this kernel: {}", said.join(" / "))
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::process::ExitStatusExt;

    #[test]
    fn kprobe_failures_are_named() {
        let text = "/usr/sbin/biolatency.bt:17-19: WARNING: blk_account_io_start is not traceable\n\
                    Attaching 6 probes...\n\
                    create_probe_event: open(/sys/kernel/tracing/kprobe_events): No such file or directory\n\
                    WARNING: could not attach probe kprobe:blk_account_io_done, skipping.\n\
                    WARNING: could not attach probe kprobe:blk_account_io_start, skipping.\n";
        let s = super::summarize(text, std::process::ExitStatus::from_raw(0), "x");
        assert_eq!(
            s,
            "cannot trace on this kernel: kprobe:blk_account_io_done, kprobe:blk_account_io_start \
             could not attach (no kprobe_events in tracefs: this kernel has no kprobes)"
        );
        let text = "ERROR: Error attaching probe: 'kprobe:tcp_retransmit_skb'\n";
        let s = super::summarize(text, std::process::ExitStatus::from_raw(0), "x");
        assert!(
            s.contains("kprobe:tcp_retransmit_skb could not attach"),
            "{s}"
        );
    }
}
