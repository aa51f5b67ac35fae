//! The network lab: two network namespaces joined by a
//! veth pair, loss and blackholes injected with nftables on the receiving side,
//! rate limits with tc tbf, iperf3 and sockperf as load and as oracles, and the
//! kernel's own counters (/proc/net/snmp, /proc/net/netstat, `tc -s`) parsed
//! here, independently of the crate under test.
//!
//! Names (netns, veth), IPv4 /30s, IPv6 /64s and ports are unique per pair (pid
//! and a counter), so tests may run in parallel on the shared kernel. Nothing is
//! routed outside the pair: both veth ends live in the lab's namespaces from the
//! moment they are created, and the root namespace never sees them. `Drop`
//! removes everything, also when a test panics.
//!
//! The tests and `cargo xtask bench` share this pair. The tests use the
//! panicking calls (`NetPair::new`, `exec`, ...); the bench, which must say
//! what failed and still clean up, uses the `try_` ones that return errors
//! (`NetPair::try_new(Owner::Bench)`, `try_exec`, `try_server`, ...). The
//! panicking calls are those with the error turned into a panic. [`Owner`]
//! keeps the two apart on the shared kernel: names, addresses and stale sweeps.
//!
//! What test writers must know (measured on the 2-vCPU 6.18 VM, with other
//! test suites running at the same time):
//! - `NetPair::new` takes ~20 ms (5 pairs in 97 ms), including one TCP
//!   handshake per family to prove the link; drop takes ~12 ms. A namespace
//!   inherits the root's sysctls at creation: congestion control is `bbr` here,
//!   not cubic; set it with `exec(side, &["sysctl", "-w", ...])` if it matters.
//! - There is no `ping` binary on these machines: `tcp_ping` is the reachability
//!   check (a TCP handshake made from inside the namespaces).
//! - An unpaced iperf3 over veth is CPU-bound (~10 Gbit/s) and, with the 2 vCPUs
//!   shared, the receiver falls behind and packets are reordered: *without any
//!   injected loss* 3 s runs showed 315 to 13 906 RetransSegs (fast retransmits
//!   later undone by DSACK, TCPSACKReorder, TCPSpuriousRtxHostQueues) and ~20
//!   TCPLossProbes. Paced with `-b 200M` or `-b 500M` the same runs showed 0–2.
//!   Pace the sender (`iperf3(.., &["-b", "200M"])` or `limit_rate`) in every
//!   test that counts retransmits.
//! - nft drops count *skbs*, not wire segments. With veth's default offloads
//!   (TSO/GSO on, GRO off) a sender's skbs cross the veth whole, so one drop is
//!   many lost segments: 2 % drop at 200 Mbit/s dropped 35 skbs and gave 959
//!   RetransSegs (~27 each; unpaced, ~44 each). After
//!   `set_segmentation_offload(sender, false)` each skb is one MSS segment as on
//!   a real wire: 1 034 drops gave 1 034 retransmits (iperf3) and 1 042
//!   RetransSegs.
//! - tbf with a small burst or latency drops in the sender's own qdisc (a local
//!   drop, yet TCP retransmits it): 20mbit with burst 4kb and latency 50ms dropped
//!   2 134 packets in 3 s (iperf3: 2 805 retransmits); with burst 64kb and
//!   latency 200ms it dropped none, held up to ~275 KB (64 packets) of backlog,
//!   and the receiver got 19.2 Mbit/s. Use burst >= 64kb (one GSO skb) and
//!   latency >= 200ms unless drops are wanted. Compare rates with iperf3's
//!   *received* figure: the sent one counts what sat in buffers at the end.
//! - sockperf 3.7 has no IPv6 (`-i` rejects the address) and exits 0 even when it
//!   could not connect; `sockperf` therefore panics when the output has no
//!   statistics. By default sockperf reports half the round trip ("avg-latency",
//!   its source divides by 2); this lab always passes `--full-rtt`, so every
//!   `Sockperf` figure is the application round trip. Of `-t N` seconds, ~0.45 s
//!   (warm-up, cool-down) are left out of the statistics.
//! - Latency tails are noisy under parallel tests: at 1000 msg/s a p50 of
//!   31–55 µs came with a p99 of 4–5 ms. Compare medians, or compare with an
//!   oracle measured over the same seconds.
//! - An iperf3 server runs one test at a time: one server per concurrent client.
//! - `Tcp.*` counters of /proc/net/snmp cover IPv4 and IPv6 alike; they are per
//!   namespace, so the sender's side holds the retransmits.
//! - Guards borrow the pair, so servers stop before the namespaces go. A test
//!   process killed outright (no Drop) leaves its namespaces; its servers die
//!   with it (PR_SET_PDEATHSIG), and the next `NetPair::new` in any test process
//!   deletes namespaces whose creator is gone.

mod counters;
mod iperf;
mod names;
mod nft;
mod run;
mod server;
mod sockperf;
mod switch;
mod tc;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::atomic::{AtomicU32, Ordering};

use anyhow::Context;

pub use counters::{Counters, delta, parse_proc_net_counters};
pub use iperf::{Iperf3, Iperf3Server};
pub use names::Owner;
pub(crate) use names::next_port;
pub use nft::dropped_by_rules;
pub use run::{
    Background, command_in, exec_in, exec_output_in, in_netns_named, spawn_in, spawn_with,
    try_exec_in, try_in_netns_named, wait_listening_in,
};
pub use server::Server;
pub use sockperf::{Sockperf, SockperfServer, parse_sockperf};
pub use switch::{Host, Switch};
pub use tc::{QdiscStats, parse_tc_qdisc};

use crate::util::{try_sh, try_sh_stdin};
use names::{try_netns_inode, v4_pair, v6_pair};

/// One end of the pair. `A` is the client side, `B` the server side.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    A,
    B,
}

impl Side {
    /// The other end.
    pub fn peer(self) -> Side {
        match self {
            Side::A => Side::B,
            Side::B => Side::A,
        }
    }
}

/// Which address of a side to use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    V4,
    V6,
}

struct End {
    netns: String,
    veth: String,
    v4: Ipv4Addr,
    v6: Ipv6Addr,
    inode: u64,
    /// Made by this pair, so its to delete: a name already taken is someone
    /// else's namespace.
    created: bool,
}

/// Two network namespaces joined by a veth pair; both deleted on drop.
pub struct NetPair {
    owner: Owner,
    a: End,
    b: End,
}

impl NetPair {
    /// A pair of the tests' lab (see [`NetPair::try_new`]); panics on any failure.
    // Not a Default: it builds things on the shared kernel (and needs root).
    #[allow(clippy::new_without_default)]
    pub fn new() -> Self {
        crate::require_root();
        Self::try_new(Owner::Lab).unwrap_or_else(|e| panic!("{e:#}"))
    }

    /// Create the namespaces, the veth pair (each end created directly inside its
    /// namespace), bring `lo` and the veth up on both sides, add a /30 IPv4 and a
    /// /64 IPv6 address (`nodad`: usable at once) per side, and prove both
    /// families carry a TCP handshake from A to B. First, once per process,
    /// delete the `owner`'s namespaces whose creator is gone.
    pub fn try_new(owner: Owner) -> anyhow::Result<Self> {
        owner.sweep_stale_namespaces();
        static N: AtomicU32 = AtomicU32::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let pid = std::process::id();
        let (v4a, v4b) = v4_pair(owner, pid, n);
        let (v6a, v6b) = v6_pair(pid, n);
        let end = |side, v4, v6| {
            let (netns, veth) = owner.names(pid, n, side);
            End {
                netns,
                veth,
                v4,
                v6,
                inode: 0,
                created: false,
            }
        };
        // The guard exists before anything is created, so a failure half-way
        // through still deletes whatever was made.
        let mut pair = Self {
            owner,
            a: end(Side::A, v4a, v6a),
            b: end(Side::B, v4b, v6b),
        };
        for e in [&mut pair.a, &mut pair.b] {
            try_sh("ip", &["netns", "add", &e.netns])?;
            e.created = true;
            e.inode = try_netns_inode(&e.netns)?;
        }
        let (a, b) = (&pair.a, &pair.b);
        try_sh(
            "ip",
            &[
                "link", "add", &a.veth, "netns", &a.netns, "type", "veth", "peer", "name", &b.veth,
                "netns", &b.netns,
            ],
        )?;
        for side in [Side::A, Side::B] {
            pair.configure(side)?;
        }
        for family in [Family::V4, Family::V6] {
            pair.try_tcp_ping(Side::A, family)?;
        }
        Ok(pair)
    }

    /// `lo` and the veth up, then the addresses, in one `ip -batch` per side.
    fn configure(&self, side: Side) -> anyhow::Result<()> {
        let e = self.end(side);
        let batch = format!(
            "link set lo up\n\
             link set {veth} up\n\
             addr add {v4}/30 dev {veth}\n\
             addr add {v6}/64 dev {veth} nodad\n",
            veth = e.veth,
            v4 = e.v4,
            v6 = e.v6,
        );
        try_sh_stdin("ip", &["-n", &e.netns, "-batch", "-"], &batch)?;
        // Without this, the ssthresh a lossy run leaves in the namespace's
        // route-metrics cache would shape the next run's start in the same pair.
        self.try_in_netns(side, || {
            std::fs::write("/proc/sys/net/ipv4/tcp_no_metrics_save", "1")
        })?
        .with_context(|| format!("tcp_no_metrics_save in {}", e.netns))
    }

    /// Whose pair it is.
    pub fn owner(&self) -> Owner {
        self.owner
    }

    fn end(&self, side: Side) -> &End {
        match side {
            Side::A => &self.a,
            Side::B => &self.b,
        }
    }

    /// The namespace's name (for `ip netns exec`).
    pub fn netns(&self, side: Side) -> &str {
        &self.end(side).netns
    }

    /// The namespace's inode number, which is how stalltrace reports a netns.
    pub fn netns_inode(&self, side: Side) -> u64 {
        self.end(side).inode
    }

    /// The side's veth interface name (≤ 15 characters).
    pub fn veth(&self, side: Side) -> &str {
        &self.end(side).veth
    }

    pub fn v4(&self, side: Side) -> Ipv4Addr {
        self.end(side).v4
    }

    pub fn v6(&self, side: Side) -> Ipv6Addr {
        self.end(side).v6
    }

    pub fn addr(&self, side: Side, family: Family) -> IpAddr {
        match family {
            Family::V4 => IpAddr::V4(self.v4(side)),
            Family::V6 => IpAddr::V6(self.v6(side)),
        }
    }
}

impl Drop for NetPair {
    fn drop(&mut self) {
        for end in [&self.a, &self.b] {
            if end.created {
                self.owner.delete_netns(&end.netns);
            }
        }
    }
}
