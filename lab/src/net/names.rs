//! Unique names, addresses and ports, and the clean-up of namespaces a
//! killed process left behind.

use std::net::{Ipv4Addr, Ipv6Addr};
use std::process::{Command, Stdio};
use std::sync::Once;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::util::sh;

/// Prefix of every namespace name the lab creates: `stlab-{pid}-{n}-{...}`.
pub(crate) const NETNS_PREFIX: &str = "stlab-";

/// Kill whatever still runs in the namespace (a guard leaked by a test), then
/// delete it: a namespace with processes in it would outlive `ip netns del`,
/// veth and all, with no name left to find it by.
pub(crate) fn delete_netns(name: &str) {
    // The lab's callers are Drop guards: nothing to tell, the sweep retries.
    let _ = kill_and_delete_netns(name);
}

/// `delete_netns` for a caller that reports a failure itself (the bench:
/// it prints how to delete the namespace by hand); the error is `ip`'s
/// stderr.
pub fn kill_and_delete_netns(name: &str) -> Result<(), String> {
    if let Ok(out) = Command::new("ip").args(["netns", "pids", name]).output() {
        for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
            if let Ok(pid) = pid.parse::<i32>() {
                // SAFETY: kill(2) on a process inside the caller's own namespace.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
    }
    let out = Command::new("ip")
        .args(["netns", "del", name])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .map_err(|e| format!("cannot run ip netns del {name}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip netns del {name} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Delete lab namespaces left by test processes that no longer exist (killed
/// before their Drop ran), once per process.
pub(crate) fn sweep_stale_namespaces() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| sweep_stale(NETNS_PREFIX, delete_netns));
}

/// Hand `delete` each namespace named `{prefix}{pid}-...` whose creator
/// `pid` no longer exists. Never someone else's live ones: the name carries
/// the creator's pid. The lab and the bench each sweep their own prefix and
/// delete in their own way (the bench says what it deletes).
pub fn sweep_stale(prefix: &str, delete: impl Fn(&str)) {
    let Ok(dir) = std::fs::read_dir("/run/netns") else {
        return;
    };
    for entry in dir.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix(prefix)
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if !process_alive(pid) {
            delete(&name);
        }
    }
}

/// A zombie counts as gone: it holds no namespace, and a test process killed
/// outright stays one until its reaper gets to it.
pub(crate) fn process_alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            let (_, after_comm) = stat.rsplit_once(')')?;
            after_comm
                .split_whitespace()
                .next()
                .map(|state| state != "Z")
        })
        .unwrap_or(false)
}

pub(crate) fn netns_inode(name: &str) -> u64 {
    let out = sh("stat", &["-L", "-c", "%i", &format!("/run/netns/{name}")]);
    out.trim()
        .parse()
        .unwrap_or_else(|e| panic!("inode of {name}: {e}: {out}"))
}

// ---- unique names, addresses and ports -------------------------------------------

/// `sv{pid}n{n}{side}`: at most 2 + 7 + 1 + 4 + 1 = 15 characters, the kernel's limit.
pub(crate) fn veth_name(pid: u32, n: u32, side: char) -> String {
    let name = format!("sv{pid}n{}{side}", n % 10_000);
    assert!(name.len() <= 15, "veth name {name} too long");
    name
}

/// A /30 in 10.200.0.0/16 (16384 of them): 1024 pid slots × 16 pairs per
/// process. Two live test processes collide only if their pids are equal
/// modulo 1024 and they are on the same pair number modulo 16; namespaces keep
/// even that from interfering, but filter records on netns inodes too.
pub(crate) fn v4_pair(pid: u32, n: u32) -> (Ipv4Addr, Ipv4Addr) {
    let slot = (pid % 1024) * 16 + n % 16;
    let net = u32::from(Ipv4Addr::new(10, 200, 0, 0)) | (slot << 2);
    (Ipv4Addr::from(net + 1), Ipv4Addr::from(net + 2))
}

/// A /64 in fd00:5700::/32: bits 32–63 hold 22 bits of pid (pid_max ≤ 2^22)
/// and 10 bits of pair number, so it is unique per live pair.
pub(crate) fn v6_pair(pid: u32, n: u32) -> (Ipv6Addr, Ipv6Addr) {
    let id = ((pid & 0x3f_ffff) << 10) | (n & 0x3ff);
    let addr = |host| Ipv6Addr::new(0xfd00, 0x5700, (id >> 16) as u16, id as u16, 0, 0, 0, host);
    (addr(1), addr(2))
}

/// Ports unique within this process (they need only be unique per namespace,
/// but distinct ports keep records of concurrent servers apart).
pub(crate) fn next_port() -> u16 {
    static N: AtomicU32 = AtomicU32::new(0);
    20_000 + (N.fetch_add(1, Ordering::Relaxed) % 40_000) as u16
}
