//! Unique names, addresses and ports, and the clean-up of namespaces a
//! killed process left behind.

use std::net::{Ipv4Addr, Ipv6Addr};
use std::os::unix::fs::MetadataExt;
use std::process::{Command, Stdio};
use std::sync::Once;
use std::sync::atomic::{AtomicU32, Ordering};

use anyhow::Context;

use super::Side;

/// Prefix of every namespace name the lab creates: `stlab-{pid}-{n}-{...}`.
pub(crate) const NETNS_PREFIX: &str = "stlab-";
/// Prefix of the bench's: `stbench-{pid}-{client|server}`.
const BENCH_NETNS_PREFIX: &str = "stbench-";

/// Whose pair it is. Its names, addresses and nftables table say so, and each
/// owner sweeps only its own leftovers: a bench run never deletes a test's
/// namespaces, nor the tests the bench's. The two also tell a failed
/// clean-up differently: a test's guard stays quiet (the next sweep
/// retries), the bench says how to finish by hand.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Owner {
    /// The tests' lab: many pairs per process, `stlab-{pid}-{n}-{a|b}`,
    /// veths `sv{pid}n{n}{a|b}`, IPv4 in 10.200.0.0/16, table `stalltrace_lab`.
    Lab,
    /// `cargo xtask bench`: one pair per process, `stbench-{pid}-{client|server}`
    /// (A is the client), veths `stb{pid}{c|s}`, IPv4 in 10.201.0.0/16, table
    /// `stalltrace_bench`.
    Bench,
}

impl Owner {
    /// The namespace and veth names of `side` of pair number `n` of process `pid`.
    pub(crate) fn names(self, pid: u32, n: u32, side: Side) -> (String, String) {
        match (self, side) {
            (Owner::Lab, Side::A) => (format!("{NETNS_PREFIX}{pid}-{n}-a"), veth_name(pid, n, 'a')),
            (Owner::Lab, Side::B) => (format!("{NETNS_PREFIX}{pid}-{n}-b"), veth_name(pid, n, 'b')),
            // 3 + 7 + 1 = 11 characters at most.
            (Owner::Bench, Side::A) => (
                format!("{BENCH_NETNS_PREFIX}{pid}-client"),
                format!("stb{pid}c"),
            ),
            (Owner::Bench, Side::B) => (
                format!("{BENCH_NETNS_PREFIX}{pid}-server"),
                format!("stb{pid}s"),
            ),
        }
    }

    /// The /16 its IPv4 /30s come from: apart from the other owner's, so an
    /// address in a record or a log says whose pair it was.
    pub(crate) fn v4_net(self) -> Ipv4Addr {
        match self {
            Owner::Lab => Ipv4Addr::new(10, 200, 0, 0),
            Owner::Bench => Ipv4Addr::new(10, 201, 0, 0),
        }
    }

    /// Its nftables table, in each namespace it adds rules to.
    pub fn nft_table(self) -> &'static str {
        match self {
            Owner::Lab => "stalltrace_lab",
            Owner::Bench => "stalltrace_bench",
        }
    }

    /// Kill whatever runs in the namespace and delete it, telling a failure
    /// as this owner does.
    pub(crate) fn delete_netns(self, name: &str) {
        match self {
            Owner::Lab => delete_netns(name),
            Owner::Bench => {
                if let Err(e) = kill_and_delete_netns(name) {
                    eprintln!("bench: {e}; delete it by hand: ip netns del {name}");
                }
            }
        }
    }

    /// Delete this owner's namespaces whose creator is gone, once per process.
    pub(crate) fn sweep_stale_namespaces(self) {
        match self {
            Owner::Lab => sweep_stale_namespaces(),
            Owner::Bench => {
                static ONCE: Once = Once::new();
                ONCE.call_once(|| {
                    sweep_stale(BENCH_NETNS_PREFIX, |name| {
                        eprintln!("bench: deleting {name}, left by a bench that is gone");
                        self.delete_netns(name);
                    })
                });
            }
        }
    }
}

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
pub(crate) fn kill_and_delete_netns(name: &str) -> Result<(), String> {
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
fn sweep_stale(prefix: &str, delete: impl Fn(&str)) {
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
    try_netns_inode(name).unwrap_or_else(|e| panic!("{e:#}"))
}

/// The inode of the namespace's file (followed, as `stat -L` does: the nsfs
/// inode under the bind mount), which is how stalltrace reports a netns.
pub(crate) fn try_netns_inode(name: &str) -> anyhow::Result<u64> {
    let path = format!("/run/netns/{name}");
    Ok(std::fs::metadata(&path)
        .with_context(|| format!("inode of {path}"))?
        .ino())
}

// ---- unique names, addresses and ports -------------------------------------------

/// `sv{pid}n{n}{side}`: at most 2 + 7 + 1 + 4 + 1 = 15 characters, the kernel's limit.
pub(crate) fn veth_name(pid: u32, n: u32, side: char) -> String {
    let name = format!("sv{pid}n{}{side}", n % 10_000);
    assert!(name.len() <= 15, "veth name {name} too long");
    name
}

/// A /30 in the owner's /16 (16384 of them): 1024 pid slots × 16 pairs per
/// process. Two live processes collide only if their pids are equal
/// modulo 1024 and they are on the same pair number modulo 16; namespaces keep
/// even that from interfering, but filter records on netns inodes too.
pub(crate) fn v4_pair(owner: Owner, pid: u32, n: u32) -> (Ipv4Addr, Ipv4Addr) {
    let slot = (pid % 1024) * 16 + n % 16;
    let net = u32::from(owner.v4_net()) | (slot << 2);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_owner_names_its_own_and_fits_the_kernel() {
        let pid = 4_194_304; // pid_max: the longest pid
        assert_eq!(
            Owner::Bench.names(pid, 7, Side::A),
            ("stbench-4194304-client".into(), "stb4194304c".into())
        );
        assert_eq!(
            Owner::Lab.names(pid, 7, Side::B),
            ("stlab-4194304-7-b".into(), "sv4194304n7b".into())
        );
        for owner in [Owner::Lab, Owner::Bench] {
            for side in [Side::A, Side::B] {
                let (_, veth) = owner.names(pid, 9_999, side);
                assert!(veth.len() <= 15, "{veth}");
            }
        }
        assert_eq!(
            v4_pair(Owner::Bench, 1024 + 3, 1),
            (
                Ipv4Addr::new(10, 201, 0, 197),
                Ipv4Addr::new(10, 201, 0, 198)
            )
        );
        assert_eq!(v4_pair(Owner::Lab, 3, 1).0, Ipv4Addr::new(10, 200, 0, 197));
        assert_ne!(Owner::Lab.nft_table(), Owner::Bench.nft_table());
    }
}
