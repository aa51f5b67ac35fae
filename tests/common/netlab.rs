//! The network lab of the end-to-end tests: two network namespaces joined by a
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

use std::collections::BTreeMap;
use std::io::Write;
use std::marker::PhantomData;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::sync::Once;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::{sh, unique};

/// Prefix of every namespace name the lab creates: `stlab-{pid}-{n}-{a|b}`.
const NETNS_PREFIX: &str = "stlab-";
/// The lab's nftables table in each namespace.
const NFT_TABLE: &str = "stalltrace_lab";

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
}

/// Two network namespaces joined by a veth pair; both deleted on drop.
pub struct NetPair {
    a: End,
    b: End,
}

impl NetPair {
    /// Create the namespaces, the veth pair (each end created directly inside its
    /// namespace), bring `lo` and the veth up on both sides, add a /30 IPv4 and a
    /// /64 IPv6 address (`nodad`: usable at once) per side, and prove both
    /// families carry a TCP handshake from A to B.
    pub fn new() -> Self {
        super::require_root();
        sweep_stale_namespaces();
        static N: AtomicU32 = AtomicU32::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let pid = std::process::id();
        let (v4a, v4b) = v4_pair(pid, n);
        let (v6a, v6b) = v6_pair(pid, n);
        let end = |side: char, v4, v6| End {
            netns: format!("{NETNS_PREFIX}{pid}-{n}-{side}"),
            veth: veth_name(pid, n, side),
            v4,
            v6,
            inode: 0,
        };
        // The guard exists before anything is created, so a failure half-way
        // through still deletes whatever was made.
        let mut pair = Self {
            a: end('a', v4a, v6a),
            b: end('b', v4b, v6b),
        };
        sh("ip", &["netns", "add", &pair.a.netns]);
        sh("ip", &["netns", "add", &pair.b.netns]);
        pair.a.inode = netns_inode(&pair.a.netns);
        pair.b.inode = netns_inode(&pair.b.netns);
        sh(
            "ip",
            &[
                "link",
                "add",
                &pair.a.veth,
                "netns",
                &pair.a.netns,
                "type",
                "veth",
                "peer",
                "name",
                &pair.b.veth,
                "netns",
                &pair.b.netns,
            ],
        );
        for side in [Side::A, Side::B] {
            pair.configure(side);
        }
        for family in [Family::V4, Family::V6] {
            pair.tcp_ping(Side::A, family);
        }
        pair
    }

    /// `lo` and the veth up, then the addresses, in one `ip -batch` per side.
    fn configure(&self, side: Side) {
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
        sh_stdin("ip", &["-n", &e.netns, "-batch", "-"], &batch);
        // Without this, the ssthresh a lossy run leaves in the namespace's
        // route-metrics cache would shape the next run's start in the same pair.
        self.in_netns(side, || {
            std::fs::write("/proc/sys/net/ipv4/tcp_no_metrics_save", "1")
                .expect("tcp_no_metrics_save");
        });
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

    // ---- running things inside a side ----------------------------------------

    /// `ip netns exec NS args...`, ready to run.
    pub fn command(&self, side: Side, args: &[&str]) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", self.netns(side)]).args(args);
        cmd
    }

    /// Run a command inside a side and return whatever it did.
    pub fn exec_output(&self, side: Side, args: &[&str]) -> Output {
        self.command(side, args)
            .output()
            .unwrap_or_else(|e| panic!("cannot run ip netns exec {args:?}: {e}"))
    }

    /// Run a command inside a side; panic with its stderr if it fails. Returns stdout.
    pub fn exec(&self, side: Side, args: &[&str]) -> String {
        let out = self.exec_output(side, args);
        assert!(
            out.status.success(),
            "{args:?} in {} failed ({}): {}{}",
            self.netns(side),
            out.status,
            String::from_utf8_lossy(&out.stderr),
            String::from_utf8_lossy(&out.stdout),
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Start a long-running command inside a side. The guard kills it on drop; it
    /// borrows the pair so it cannot outlive the namespace it runs in. The child
    /// also dies with the thread that spawned it (PR_SET_PDEATHSIG), so a test
    /// process killed outright leaves no server behind; spawn from the thread
    /// that keeps the guard (not inside `in_netns` or a short-lived thread).
    pub fn spawn(&self, side: Side, args: &[&str]) -> Background<'_> {
        let log = std::env::temp_dir().join(format!("{}.log", unique("stalltrace-netlab")));
        let file = std::fs::File::create(&log).expect("netlab log file");
        let mut cmd = self.command(side, args);
        cmd.stdin(Stdio::null())
            .stdout(file.try_clone().unwrap())
            .stderr(file);
        // SAFETY: prctl is async-signal-safe and touches only the child.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot spawn {args:?}: {e}"));
        Background {
            child,
            log,
            what: format!("{args:?} in {}", self.netns(side)),
            _pair: PhantomData,
        }
    }

    /// Run `f` on a thread that has entered the side's namespace (setns affects
    /// only that thread). Sockets made inside stay in that namespace wherever
    /// they are used afterwards.
    pub fn in_netns<T: Send>(&self, side: Side, f: impl FnOnce() -> T + Send) -> T {
        let path = format!("/run/netns/{}", self.netns(side));
        let ns = std::fs::File::open(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        std::thread::scope(|s| {
            let thread = s.spawn(|| {
                // SAFETY: setns on a descriptor we own, for this thread only.
                let rc = unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) };
                assert_eq!(rc, 0, "setns {path}: {}", std::io::Error::last_os_error());
                f()
            });
            thread
                .join()
                .unwrap_or_else(|e| std::panic::resume_unwind(e))
        })
    }

    /// The reachability check (there is no `ping` here): a TCP handshake from
    /// `from` to a listener on the peer's address. Returns how long it took;
    /// panics if it does not complete within 5 s.
    pub fn tcp_ping(&self, from: Side, family: Family) -> Duration {
        let to = from.peer();
        let addr = SocketAddr::new(self.addr(to, family), 0);
        let listener = self.in_netns(to, || TcpListener::bind(addr).expect("bind"));
        let target = listener.local_addr().unwrap();
        self.in_netns(from, || {
            let start = Instant::now();
            TcpStream::connect_timeout(&target, Duration::from_secs(5))
                .unwrap_or_else(|e| panic!("no TCP handshake {target} from {from:?}: {e}"));
            start.elapsed()
        })
    }

    /// Wait until something listens on TCP `port` in `side`; panic with the
    /// server's log if it exits or 10 s pass first.
    fn wait_listening(&self, side: Side, port: u16, server: &mut Background) {
        let filter = format!(":{port}");
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let out = self.exec(side, &["ss", "-Hltn", "sport", "=", &filter]);
            if !out.trim().is_empty() {
                return;
            }
            assert!(
                server.is_running(),
                "{} exited before listening: {}",
                server.what,
                server.log()
            );
            assert!(
                Instant::now() < deadline,
                "{} not listening on {port} after 10 s: {}",
                server.what,
                server.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    // ---- loss and blackholes (nftables, receiving side) ------------------------

    /// Drop `percent` % of the packets arriving at `side` (nft `numgen random`
    /// on the input hook, IPv4 and IPv6), only TCP/UDP to or from `port` when
    /// given. Loss on the receiving side is loss on the wire to the sender; the
    /// same rule in the sender's output hook would be a local send failure.
    /// Counts skbs, not wire segments: see the notes at the top of this file.
    pub fn drop_random(&self, side: Side, percent: u8, port: Option<u16>) {
        assert!(percent <= 100, "percent {percent} > 100");
        // nft rejects `< 100` (the value exceeds `mod 100`'s range).
        let chance = match percent {
            100 => "counter drop".to_string(),
            _ => format!("numgen random mod 100 < {percent} counter drop"),
        };
        let rules = match port {
            // Matching dport and sport in two rules: a packet with both equal to
            // `port` would roll twice; no test connection looks like that.
            Some(port) => format!(
                "add rule inet {NFT_TABLE} input meta l4proto {{ tcp, udp }} th dport {port} {chance}\n\
                 add rule inet {NFT_TABLE} input meta l4proto {{ tcp, udp }} th sport {port} {chance}\n"
            ),
            // Neighbour discovery stays exempt (inserted at the head of the chain):
            // losing it stalls every flow for seconds, which is not packet loss.
            None => format!(
                "insert rule inet {NFT_TABLE} input icmpv6 type {{ nd-neighbor-solicit, nd-neighbor-advert }} accept\n\
                 add rule inet {NFT_TABLE} input {chance}\n"
            ),
        };
        self.nft(side, &rules);
    }

    /// Drop every TCP/UDP packet to or from `port` arriving at `side`. Call it on
    /// both sides to cut a connection in both directions.
    pub fn blackhole(&self, side: Side, port: u16) {
        self.nft(
            side,
            &format!(
                "add rule inet {NFT_TABLE} input meta l4proto {{ tcp, udp }} th dport {port} counter drop\n\
                 add rule inet {NFT_TABLE} input meta l4proto {{ tcp, udp }} th sport {port} counter drop\n"
            ),
        );
    }

    /// Remove every drop rule of `side` (and their counters).
    pub fn clear_drops(&self, side: Side) {
        // Created and deleted in one transaction: deleting is no error when
        // no rule was ever added.
        self.nft(side, &format!("delete table inet {NFT_TABLE}\n"));
    }

    /// Packets (skbs) the lab's rules dropped at `side` since they were added.
    pub fn dropped_packets(&self, side: Side) -> u64 {
        let out = self.exec_output(side, &["nft", "-j", "list", "table", "inet", NFT_TABLE]);
        if !out.status.success() {
            return 0; // no rules yet
        }
        let json: Value = serde_json::from_slice(&out.stdout).expect("nft -j output");
        json["nftables"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|item| item["rule"]["expr"].as_array())
            .filter(|exprs| exprs.iter().any(|x| x.get("drop").is_some()))
            .flat_map(|exprs| exprs.iter())
            .filter_map(|x| x["counter"]["packets"].as_u64())
            .sum()
    }

    /// Apply an nft script to `side`, creating the lab's table and input chain
    /// first (`add` is idempotent), all in one transaction.
    fn nft(&self, side: Side, rules: &str) {
        let script = format!(
            "add table inet {NFT_TABLE}\n\
             add chain inet {NFT_TABLE} input {{ type filter hook input priority filter; policy accept; }}\n\
             {rules}"
        );
        sh_stdin(
            "ip",
            &["netns", "exec", self.netns(side), "nft", "-f", "-"],
            &script,
        );
    }

    // ---- rate limits and offloads (tc, ethtool) --------------------------------

    /// Shape `side`'s veth egress with tbf, e.g. `limit_rate(A, "20mbit", "64kb",
    /// "200ms")`. Replaces any root qdisc, with counters starting at zero.
    pub fn limit_rate(&self, side: Side, rate: &str, burst: &str, latency: &str) {
        self.clear_qdisc(side);
        let dev = self.veth(side);
        self.exec(
            side,
            &[
                "tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate", rate, "burst", burst,
                "latency", latency,
            ],
        );
    }

    /// Back to the veth default (`noqueue`).
    pub fn clear_qdisc(&self, side: Side) {
        // Fails when there is no root qdisc to delete; that is the wanted state.
        let _ = self.exec_output(
            side,
            &["tc", "qdisc", "del", "dev", self.veth(side), "root"],
        );
    }

    /// The root qdisc of `side`'s veth, from `tc -s -j qdisc show`: the oracle
    /// for backlog and qdisc drops. Sample it from another thread
    /// (`std::thread::scope`) while a load runs to see the backlog.
    pub fn qdisc_stats(&self, side: Side) -> QdiscStats {
        let out = self.exec(
            side,
            &["tc", "-s", "-j", "qdisc", "show", "dev", self.veth(side)],
        );
        parse_tc_qdisc(&out).unwrap_or_else(|| panic!("no root qdisc in: {out}"))
    }

    /// Turn TSO and GSO of `side`'s veth on or off. Off, every skb the sender's
    /// TCP hands down is one MSS segment, so one nft drop is one lost segment.
    pub fn set_segmentation_offload(&self, side: Side, on: bool) {
        let state = if on { "on" } else { "off" };
        self.exec(
            side,
            &["ethtool", "-K", self.veth(side), "tso", state, "gso", state],
        );
    }

    // ---- kernel counters ---------------------------------------------------------

    /// /proc/net/snmp and /proc/net/netstat as seen inside `side`, keyed
    /// "Tcp.RetransSegs", "TcpExt.TCPTimeouts", ... (not `nstat`: its history
    /// file is shared between namespaces).
    pub fn counters(&self, side: Side) -> Counters {
        let text = self.exec(side, &["cat", "/proc/net/snmp", "/proc/net/netstat"]);
        parse_proc_net_counters(&text)
    }

    // ---- iperf3 ----------------------------------------------------------------

    /// `iperf3 -s` inside `side` on a port of its own (listening on IPv4 and
    /// IPv6), returned once it accepts connections.
    pub fn iperf3_server(&self, side: Side) -> Iperf3Server<'_> {
        let port = next_port();
        let mut process = self.spawn(side, &["iperf3", "-s", "-p", &port.to_string()]);
        self.wait_listening(side, port, &mut process);
        Iperf3Server {
            side,
            port,
            _process: process,
        }
    }

    /// Run an iperf3 client from the server's peer for `secs` seconds to the
    /// server side's address of `family`, with `extra` options (e.g.
    /// `-b 200M`, `-R`, `-P 4`), and return iperf3's own figures. Unpaced it
    /// retransmits without any loss (see the top of this file). Killed if it
    /// runs 30 s past `secs`.
    pub fn iperf3(
        &self,
        server: &Iperf3Server,
        family: Family,
        secs: u32,
        extra: &[&str],
    ) -> Iperf3 {
        let addr = self.addr(server.side, family).to_string();
        let (port, secs_s, limit) = (
            server.port.to_string(),
            secs.to_string(),
            (secs + 30).to_string(),
        );
        let family_flag = match family {
            Family::V4 => "-4",
            Family::V6 => "-6",
        };
        let mut args = vec![
            "timeout",
            "-s",
            "KILL",
            &limit,
            "iperf3",
            "-c",
            &addr,
            "-p",
            &port,
            "-t",
            &secs_s,
            "-J",
            family_flag,
        ];
        args.extend_from_slice(extra);
        let out = self.exec_output(server.side.peer(), &args);
        let text = String::from_utf8_lossy(&out.stdout);
        let json: Value = serde_json::from_str(&text).unwrap_or_else(|e| {
            panic!(
                "iperf3 ({}) printed no JSON ({e}): {text}{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            )
        });
        assert!(
            out.status.success() && json.get("error").is_none(),
            "iperf3 failed ({}): {}",
            out.status,
            json["error"]
        );
        Iperf3::from_json(json)
    }

    // ---- sockperf ----------------------------------------------------------------

    /// `sockperf server --tcp` on `side`'s IPv4 address (sockperf 3.7 has no
    /// IPv6), returned once it accepts connections.
    pub fn sockperf_server(&self, side: Side) -> SockperfServer<'_> {
        let port = next_port();
        let addr = self.v4(side).to_string();
        let mut process = self.spawn(
            side,
            &[
                "sockperf",
                "server",
                "--tcp",
                "-i",
                &addr,
                "-p",
                &port.to_string(),
            ],
        );
        self.wait_listening(side, port, &mut process);
        SockperfServer {
            side,
            port,
            _process: process,
        }
    }

    /// `sockperf ping-pong --tcp --full-rtt` from the server's peer for `secs`
    /// seconds at `mps` messages per second (None: as fast as it can). Every
    /// figure returned is the application round trip in µs.
    pub fn sockperf(&self, server: &SockperfServer, secs: u32, mps: Option<u32>) -> Sockperf {
        let addr = self.v4(server.side).to_string();
        let mps = format!("--mps={}", mps.map_or("max".to_string(), |n| n.to_string()));
        let (port, secs_s, limit) = (
            server.port.to_string(),
            secs.to_string(),
            (secs + 30).to_string(),
        );
        let out = self.exec_output(
            server.side.peer(),
            &[
                "timeout",
                "-s",
                "KILL",
                &limit,
                "sockperf",
                "ping-pong",
                "--tcp",
                "-i",
                &addr,
                "-p",
                &port,
                "-t",
                &secs_s,
                &mps,
                "--full-rtt",
            ],
        );
        // sockperf exits 0 even when it could not connect: judge by the output.
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        parse_sockperf(&text)
            .unwrap_or_else(|| panic!("sockperf ({}) gave no statistics:\n{text}", out.status))
    }
}

impl Drop for NetPair {
    fn drop(&mut self) {
        for end in [&self.a, &self.b] {
            delete_netns(&end.netns);
        }
    }
}

/// Kill whatever still runs in the namespace (a guard leaked by a test), then
/// delete it: a namespace with processes in it would outlive `ip netns del`,
/// veth and all, with no name left to find it by.
fn delete_netns(name: &str) {
    if let Ok(out) = Command::new("ip").args(["netns", "pids", name]).output() {
        for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
            if let Ok(pid) = pid.parse::<i32>() {
                // SAFETY: kill(2) on a process inside the lab's own namespace.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
    }
    let _ = Command::new("ip")
        .args(["netns", "del", name])
        .stderr(Stdio::null())
        .status();
}

/// Delete lab namespaces left by test processes that no longer exist (killed
/// before their Drop ran), once per process.
fn sweep_stale_namespaces() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let Ok(dir) = std::fs::read_dir("/run/netns") else {
            return;
        };
        for entry in dir.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some(pid) = name
                .strip_prefix(NETNS_PREFIX)
                .and_then(|rest| rest.split('-').next())
                .and_then(|pid| pid.parse::<u32>().ok())
            else {
                continue;
            };
            if !process_alive(pid) {
                delete_netns(&name);
            }
        }
    });
}

/// A zombie counts as gone: it holds no namespace, and a test process killed
/// outright stays one until its reaper gets to it.
fn process_alive(pid: u32) -> bool {
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

fn netns_inode(name: &str) -> u64 {
    let out = sh("stat", &["-L", "-c", "%i", &format!("/run/netns/{name}")]);
    out.trim()
        .parse()
        .unwrap_or_else(|e| panic!("inode of {name}: {e}: {out}"))
}

/// Like `sh`, with `input` on the command's stdin.
fn sh_stdin(program: &str, args: &[&str], input: &str) -> String {
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {program}: {e}"));
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{program} {args:?} failed: {}\ninput:\n{input}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

// ---- unique names, addresses and ports -------------------------------------------

/// `sv{pid}n{n}{side}`: at most 2 + 7 + 1 + 4 + 1 = 15 characters, the kernel's limit.
fn veth_name(pid: u32, n: u32, side: char) -> String {
    let name = format!("sv{pid}n{}{side}", n % 10_000);
    assert!(name.len() <= 15, "veth name {name} too long");
    name
}

/// A /30 in 10.200.0.0/16 (16384 of them): 1024 pid slots × 16 pairs per
/// process. Two live test processes collide only if their pids are equal
/// modulo 1024 and they are on the same pair number modulo 16; namespaces keep
/// even that from interfering, but filter records on netns inodes too.
fn v4_pair(pid: u32, n: u32) -> (Ipv4Addr, Ipv4Addr) {
    let slot = (pid % 1024) * 16 + n % 16;
    let net = u32::from(Ipv4Addr::new(10, 200, 0, 0)) | (slot << 2);
    (Ipv4Addr::from(net + 1), Ipv4Addr::from(net + 2))
}

/// A /64 in fd00:5700::/32: bits 32–63 hold 22 bits of pid (pid_max ≤ 2^22)
/// and 10 bits of pair number, so it is unique per live pair.
fn v6_pair(pid: u32, n: u32) -> (Ipv6Addr, Ipv6Addr) {
    let id = ((pid & 0x3f_ffff) << 10) | (n & 0x3ff);
    let addr = |host| Ipv6Addr::new(0xfd00, 0x5700, (id >> 16) as u16, id as u16, 0, 0, 0, host);
    (addr(1), addr(2))
}

/// Ports unique within this process (they need only be unique per namespace,
/// but distinct ports keep records of concurrent servers apart).
fn next_port() -> u16 {
    static N: AtomicU32 = AtomicU32::new(0);
    20_000 + (N.fetch_add(1, Ordering::Relaxed) % 40_000) as u16
}

// ---- background processes --------------------------------------------------------

/// A process running inside a side, killed (and reaped) on drop.
pub struct Background<'a> {
    child: Child,
    log: PathBuf,
    what: String,
    _pair: PhantomData<&'a NetPair>,
}

impl Background<'_> {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn is_running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    /// Its stdout and stderr so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Background<'_> {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.log);
    }
}

// ---- iperf3 ------------------------------------------------------------------------

/// A running `iperf3 -s`; stopped on drop.
pub struct Iperf3Server<'a> {
    pub side: Side,
    pub port: u16,
    _process: Background<'a>,
}

/// iperf3's own end-of-test figures (`-J`), as it reports them.
#[derive(Debug, Clone)]
pub struct Iperf3 {
    pub sent_bytes: u64,
    pub sent_bps: f64,
    pub received_bytes: u64,
    pub received_bps: f64,
    /// TCP only: the sender's retransmitted segments (tcpi_total_retrans).
    pub retransmits: Option<u64>,
    /// The whole report, for anything else.
    pub json: Value,
}

impl Iperf3 {
    fn from_json(json: Value) -> Self {
        let end = &json["end"];
        let num = |v: &Value| {
            v.as_f64()
                .unwrap_or_else(|| panic!("iperf3 JSON lacks a figure: {end}"))
        };
        Self {
            sent_bytes: num(&end["sum_sent"]["bytes"]) as u64,
            sent_bps: num(&end["sum_sent"]["bits_per_second"]),
            received_bytes: num(&end["sum_received"]["bytes"]) as u64,
            received_bps: num(&end["sum_received"]["bits_per_second"]),
            retransmits: end["sum_sent"]["retransmits"].as_u64(),
            json,
        }
    }
}

// ---- sockperf ----------------------------------------------------------------------

/// A running `sockperf server --tcp`; stopped on drop.
pub struct SockperfServer<'a> {
    pub side: Side,
    pub port: u16,
    _process: Background<'a>,
}

/// sockperf's statistics of one ping-pong run: round trips in µs (`--full-rtt`).
#[derive(Debug, Clone, Default)]
pub struct Sockperf {
    pub observations: u64,
    pub avg_us: f64,
    pub min_us: f64,
    pub max_us: f64,
    /// (percentile, µs) as printed: 25, 50, 75, 90, 99, 99.9, 99.99, 99.999.
    pub percentiles: Vec<(f64, f64)>,
}

impl Sockperf {
    /// One of the printed percentiles, e.g. `percentile(99.0)`.
    pub fn percentile(&self, p: f64) -> f64 {
        self.percentiles
            .iter()
            .find(|(q, _)| (q - p).abs() < 1e-6)
            .map(|&(_, v)| v)
            .unwrap_or_else(|| panic!("sockperf printed no percentile {p}: {self:?}"))
    }
}

/// Parse sockperf 3.7's client summary of a `--full-rtt` run, which looks like
/// this (colour escapes removed). Without `--full-rtt` sockperf prints
/// "avg-latency" and every figure is half the round trip; such output is
/// refused (None) so the two are never mixed up.
/// ```text
/// sockperf: ====> avg-rtt=200.181 (std-dev=652.896)
/// sockperf: Total 1547 observations; each percentile contains 15.47 observations
/// sockperf: ---> <MAX> observation = 5259.648
/// sockperf: ---> percentile 99.999 = 5259.648
/// ...
/// sockperf: ---> percentile 25.000 =   34.541
/// sockperf: ---> <MIN> observation =   14.852
/// ```
pub fn parse_sockperf(text: &str) -> Option<Sockperf> {
    let mut s = Sockperf::default();
    let (mut avg, mut min, mut max, mut total) = (None, None, None, None);
    for line in strip_ansi(text).lines() {
        let line = line.trim_start_matches("sockperf:").trim();
        let value_after = |sep: &str| {
            line.split_once(sep)
                .and_then(|(_, v)| v.split_whitespace().next()?.parse::<f64>().ok())
        };
        if line.starts_with("====> avg-rtt=") {
            avg = value_after("avg-rtt=");
        } else if let Some(rest) = line.strip_prefix("Total ") {
            total = rest.split_whitespace().next().and_then(|n| n.parse().ok());
        } else if line.starts_with("---> <MAX>") {
            max = value_after("=");
        } else if line.starts_with("---> <MIN>") {
            min = value_after("=");
        } else if let Some(rest) = line.strip_prefix("---> percentile ") {
            let (p, v) = rest.split_once('=')?;
            s.percentiles
                .push((p.trim().parse().ok()?, v.trim().parse().ok()?));
        }
    }
    s.avg_us = avg?;
    s.min_us = min?;
    s.max_us = max?;
    s.observations = total?;
    (!s.percentiles.is_empty()).then_some(s)
}

fn strip_ansi(text: &str) -> String {
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

// ---- kernel counters ---------------------------------------------------------------

/// Kernel SNMP/netstat counters of one namespace, "Group.Name" → value.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counters(pub BTreeMap<String, u64>);

impl Counters {
    /// A counter's value; panics on a name the kernel does not have (a typo
    /// would otherwise read as a silent 0).
    pub fn get(&self, name: &str) -> u64 {
        *self
            .0
            .get(name)
            .unwrap_or_else(|| panic!("no counter {name}"))
    }
}

/// `after - before` for every counter of `after` (0 where a counter went back).
pub fn delta(before: &Counters, after: &Counters) -> Counters {
    Counters(
        after
            .0
            .iter()
            .map(|(k, &v)| (k.clone(), v.saturating_sub(*before.0.get(k).unwrap_or(&0))))
            .collect(),
    )
}

/// Parse /proc/net/snmp and /proc/net/netstat text: each group is a line of
/// names followed by a line of values, both starting with "Group:". Signed
/// values (only Tcp.MaxConn, constant -1) are left out.
pub fn parse_proc_net_counters(text: &str) -> Counters {
    let mut map = BTreeMap::new();
    let mut lines = text.lines();
    while let (Some(names), Some(values)) = (lines.next(), lines.next()) {
        let (group, names) = names.split_once(':').expect("Group: header line");
        let (group2, values) = values.split_once(':').expect("Group: value line");
        assert_eq!(group, group2, "unpaired lines in /proc/net counters");
        for (name, value) in names.split_whitespace().zip(values.split_whitespace()) {
            if let Ok(v) = value.parse::<u64>() {
                map.insert(format!("{group}.{name}"), v);
            }
        }
    }
    Counters(map)
}

// ---- tc qdisc stats ------------------------------------------------------------------

/// A qdisc's statistics from `tc -s -j qdisc show`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QdiscStats {
    pub kind: String,
    pub bytes: u64,
    pub packets: u64,
    pub drops: u64,
    pub overlimits: u64,
    pub requeues: u64,
    /// Bytes queued right now.
    pub backlog_bytes: u64,
    /// Packets queued right now.
    pub qlen: u64,
}

/// The root qdisc of `tc -s -j qdisc show dev X` output.
pub fn parse_tc_qdisc(json: &str) -> Option<QdiscStats> {
    let all: Value = serde_json::from_str(json).ok()?;
    let root = all.as_array()?.iter().find(|q| q["root"] == true)?;
    let n = |k: &str| root[k].as_u64().unwrap_or(0);
    Some(QdiscStats {
        kind: root["kind"].as_str()?.to_string(),
        bytes: n("bytes"),
        packets: n("packets"),
        drops: n("drops"),
        overlimits: n("overlimits"),
        requeues: n("requeues"),
        backlog_bytes: n("backlog"),
        qlen: n("qlen"),
    })
}
