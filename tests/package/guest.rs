//! What tests/package.rs reads off the guest, /proc and the kernel.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::Value;
use stalltrace_lab::kernel_objects::{self, Baseline};
use stalltrace_lab::systemd_guest::SystemdGuest;

use crate::common::parse_records;

/// The service's main process, from the guest's /proc.
#[derive(Debug)]
pub struct Service {
    pub pid: u32,
    pub uid: u32,
    pub cap_eff: u64,
    pub cap_bnd: u64,
    pub no_new_privs: bool,
}

/// Wait (up to 30 s) until systemd says the service is active and the
/// process has written its `start` record; panics with the journal if not.
pub fn await_active(guest: &SystemdGuest) -> Service {
    let start = Instant::now();
    let log = guest.path("/var/log/stalltrace/stalltrace.jsonl");
    while start.elapsed() < Duration::from_secs(30) {
        let active = guest.exec(&["systemctl", "is-active", "stalltrace"]);
        let pid: u32 = guest
            .sh(&[
                "systemctl",
                "show",
                "--property=MainPID",
                "--value",
                "stalltrace",
            ])
            .trim()
            .parse()
            .unwrap_or(0);
        let started = std::fs::read_to_string(&log).is_ok_and(|t| t.contains("\"type\":\"start\""));
        if active.status.success() && pid != 0 && started {
            let status = guest.sh(&["cat", &format!("/proc/{pid}/status")]);
            let field = |name: &str| {
                status
                    .lines()
                    .find_map(|l| l.strip_prefix(name))
                    .unwrap_or_else(|| panic!("{name} not in {status}"))
                    .split_whitespace()
                    .next()
                    .unwrap()
                    .to_string()
            };
            return Service {
                pid,
                uid: field("Uid:").parse().unwrap(),
                cap_eff: status_hex(&status, "CapEff:"),
                cap_bnd: status_hex(&status, "CapBnd:"),
                no_new_privs: field("NoNewPrivs:") == "1",
            };
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    let journal = guest.exec(&["journalctl", "--unit=stalltrace", "--no-pager"]);
    panic!(
        "stalltrace.service is not running after 30 s:\n{}",
        String::from_utf8_lossy(&journal.stdout)
    );
}

/// A capability set field of /proc/PID/status (hex).
pub fn status_hex(status: &str, field: &str) -> u64 {
    let hex = status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .unwrap_or_else(|| panic!("{field} not in {status}"));
    u64::from_str_radix(hex.trim(), 16).unwrap()
}

/// The capability names of a unit setting (`AmbientCapabilities=...`).
pub fn unit_capabilities<'a>(unit: &'a str, setting: &str) -> Vec<&'a str> {
    let prefix = format!("{setting}=");
    let names: Vec<&str> = unit
        .lines()
        .filter_map(|l| l.strip_prefix(prefix.as_str()))
        .flat_map(str::split_whitespace)
        .collect();
    assert!(!names.is_empty(), "no {setting}= in the unit");
    names
}

/// The bit mask of capability names, from capability(7)'s numbers.
pub fn capability_mask(names: &[&str]) -> u64 {
    names
        .iter()
        .map(|name| {
            let bit = match *name {
                "CAP_DAC_READ_SEARCH" => 2,
                "CAP_NET_ADMIN" => 12,
                "CAP_SYS_PTRACE" => 19,
                "CAP_SYS_ADMIN" => 21,
                "CAP_SYS_RESOURCE" => 24,
                "CAP_PERFMON" => 38,
                "CAP_BPF" => 39,
                other => panic!("capability {other} is not in the test's table"),
            };
            1u64 << bit
        })
        .fold(0, |mask, bit| mask | bit)
}

/// Two seconds of iperf3 over the guest's loopback; returns the port.
pub fn tcp_load(guest: &SystemdGuest) -> u16 {
    let port = stalltrace_lab::prometheus::free_port();
    let port_arg = port.to_string();
    let mut server = guest
        .in_netns("iperf3")
        .args(["--server", "--one-off", "--port", &port_arg])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("iperf3 (run `cargo xtask setup`)");
    std::thread::sleep(Duration::from_millis(500));
    let client = guest
        .in_netns("iperf3")
        .args(["--client", "127.0.0.1", "--port", &port_arg, "--time", "2"])
        .output()
        .expect("iperf3");
    let _ = server.kill();
    let _ = server.wait();
    assert!(
        client.status.success(),
        "iperf3 in the guest: {}",
        String::from_utf8_lossy(&client.stderr)
    );
    port
}

/// Every whole record of a file the service may still be writing (a last
/// line without its newline is left for later), checked against
/// docs/schema.json.
pub fn records_of(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    parse_records(whole_lines(&text))
}

fn whole_lines(text: &str) -> &str {
    text.rfind('\n').map_or("", |end| &text[..=end])
}

/// The `start` record that heads the file after a reopen (up to 10 s).
pub fn await_start_record(path: &Path) -> Value {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(10) {
        if let Some(first) = std::fs::read_to_string(path)
            .ok()
            .and_then(|t| whole_lines(&t).lines().next().map(str::to_string))
        {
            let record: Value = serde_json::from_str(&first).unwrap();
            assert_eq!(
                record["type"], "start",
                "a reopened file begins with `start`"
            );
            return record;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("{} has no record 10 s after the rotation", path.display());
}

/// No stalltrace program or map made since `before` is left in the kernel
/// without a living process holding it (a tracer another test runs at the
/// same time holds its own; the stopped service's would be held by nothing).
pub fn assert_nothing_left(before: Baseline, map_names: &std::collections::HashSet<String>) {
    if let Err(left) =
        kernel_objects::await_no_leftovers(before, map_names, Duration::from_secs(10))
    {
        panic!("left in the kernel: {left:?}");
    }
}

/// The journal's lines of the service that say it goes without something
/// (a capability lacking or refused): under the unit's sandbox there must be
/// none.
pub fn degradations(journal: &str) -> Vec<&str> {
    journal
        .lines()
        .filter(|l| l.contains("needs CAP_") || l.contains("refused although"))
        .collect()
}

/// The host pid of the process a container of `image` runs.
pub fn container_pid(image: &str) -> Option<u32> {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(10) {
        let ids = stalltrace_lab::sh(
            "podman",
            &["ps", "--quiet", "--filter", &format!("ancestor={image}")],
        );
        if let Some(id) = ids.lines().next() {
            let pid = stalltrace_lab::sh("podman", &["inspect", "--format", "{{.State.Pid}}", id]);
            if let Ok(pid) = pid.trim().parse::<u32>()
                && pid != 0
            {
                return Some(pid);
            }
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    None
}
