//! Hosts on one Ethernet segment: a namespace per host, each joined by a veth
//! pair to a Linux bridge in a switch namespace of its own. A shaper on one
//! host's uplink is then shared by everything that host sends, to every peer
//! (as PAUSE frames or a policer would share it on a real switch port).
//!
//! Names are unique per switch (`stlab-{pid}-s{n}-...`, veths `sv{pid}s{n}{h|p}{i}`)
//! and the addresses (10.201.{n}.{host+1}/24) exist only inside the switch's
//! namespaces, which nothing routes to. `Drop` deletes every namespace, also
//! when a test panics; the namespaces of a process killed outright are swept
//! by the next lab (`NetPair::new` or `Switch::new`) in any process.

use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::process::Output;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use super::names::{NETNS_PREFIX, delete_netns, netns_inode, sweep_stale_namespaces};
use super::run::{Background, exec_in, exec_output_in, in_netns_named, spawn_in};
use super::tc::{QdiscStats, parse_tc_qdisc};
use crate::util::{sh, sh_stdin};

/// One host on the switch.
pub struct Host {
    pub netns: String,
    /// The host's end of its uplink.
    pub veth: String,
    /// The switch's end (a bridge port).
    pub port: String,
    pub v4: Ipv4Addr,
    pub inode: u64,
}

/// A bridge and its hosts; every namespace deleted on drop.
pub struct Switch {
    netns: String,
    hosts: Vec<Host>,
}

impl Switch {
    /// A switch with `hosts` hosts (at most 9), each up with its address, and
    /// host 0 proven to reach every other one with a TCP handshake.
    pub fn new(hosts: usize) -> Self {
        assert!((2..=9).contains(&hosts), "2 to 9 hosts");
        crate::require_root();
        sweep_stale_namespaces();
        static N: AtomicU32 = AtomicU32::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed) % 250;
        let pid = std::process::id();
        let mut sw = Self {
            netns: format!("{NETNS_PREFIX}{pid}-s{n}-sw"),
            hosts: Vec::new(),
        };
        sh("ip", &["netns", "add", &sw.netns]);
        sh_stdin(
            "ip",
            &["-n", &sw.netns, "-batch", "-"],
            "link set lo up\nlink add br0 type bridge stp_state 0 forward_delay 0\nlink set br0 up\n",
        );
        for i in 0..hosts {
            let host = Host {
                netns: format!("{NETNS_PREFIX}{pid}-s{n}-h{i}"),
                veth: format!("sv{pid}s{n}h{i}"),
                port: format!("sv{pid}s{n}p{i}"),
                v4: Ipv4Addr::new(10, 201, n as u8, i as u8 + 1),
                inode: 0,
            };
            assert!(host.veth.len() <= 15 && host.port.len() <= 15);
            sh("ip", &["netns", "add", &host.netns]);
            sw.hosts.push(host);
            let host = sw.hosts.last_mut().unwrap();
            host.inode = netns_inode(&host.netns);
            sh(
                "ip",
                &[
                    "link",
                    "add",
                    &host.veth,
                    "netns",
                    &host.netns,
                    "type",
                    "veth",
                    "peer",
                    "name",
                    &host.port,
                    "netns",
                    &sw.netns,
                ],
            );
            sh_stdin(
                "ip",
                &["-n", &sw.netns, "-batch", "-"],
                &format!("link set {p} master br0\nlink set {p} up\n", p = host.port),
            );
            sh_stdin(
                "ip",
                &["-n", &host.netns, "-batch", "-"],
                &format!(
                    "link set lo up\nlink set {v} up\naddr add {a}/24 dev {v}\n",
                    v = host.veth,
                    a = host.v4
                ),
            );
            in_netns_named(&host.netns, || {
                std::fs::write("/proc/sys/net/ipv4/tcp_no_metrics_save", "1")
                    .expect("tcp_no_metrics_save");
            });
        }
        for to in 1..hosts {
            sw.tcp_ping(0, to);
        }
        sw
    }

    pub fn host(&self, i: usize) -> &Host {
        &self.hosts[i]
    }

    /// The switch's own namespace (the bridge).
    pub fn switch_netns(&self) -> &str {
        &self.netns
    }

    pub fn exec(&self, host: usize, args: &[&str]) -> String {
        exec_in(&self.hosts[host].netns, args)
    }

    pub fn exec_output(&self, host: usize, args: &[&str]) -> Output {
        exec_output_in(&self.hosts[host].netns, args)
    }

    /// A long-running command on a host, killed on drop (see `NetPair::spawn`).
    pub fn spawn(&self, host: usize, args: &[&str]) -> Background<'_> {
        spawn_in(self, &self.hosts[host].netns, args)
    }

    pub fn in_netns<T: Send>(&self, host: usize, f: impl FnOnce() -> T + Send) -> T {
        in_netns_named(&self.hosts[host].netns, f)
    }

    /// A TCP handshake from one host to another; panics after 5 s.
    pub fn tcp_ping(&self, from: usize, to: usize) -> Duration {
        let addr = SocketAddr::from((self.hosts[to].v4, 0));
        let listener = self.in_netns(to, || TcpListener::bind(addr).expect("bind"));
        let target = listener.local_addr().unwrap();
        self.in_netns(from, || {
            let start = std::time::Instant::now();
            TcpStream::connect_timeout(&target, Duration::from_secs(5))
                .unwrap_or_else(|e| panic!("no TCP handshake {target} from host {from}: {e}"));
            start.elapsed()
        })
    }

    /// Shape what `host` sends (its uplink's egress) with tbf.
    pub fn limit_rate(&self, host: usize, rate: &str, burst: &str, latency: &str) {
        let dev = self.hosts[host].veth.clone();
        let _ = self.exec_output(host, &["tc", "qdisc", "del", "dev", &dev, "root"]);
        self.exec(
            host,
            &[
                "tc", "qdisc", "add", "dev", &dev, "root", "tbf", "rate", rate, "burst", burst,
                "latency", latency,
            ],
        );
    }

    /// The root qdisc of `host`'s uplink (`tc -s -j qdisc show`).
    pub fn qdisc_stats(&self, host: usize) -> QdiscStats {
        let dev = self.hosts[host].veth.clone();
        let out = self.exec(host, &["tc", "-s", "-j", "qdisc", "show", "dev", &dev]);
        parse_tc_qdisc(&out).unwrap_or_else(|| panic!("no root qdisc in: {out}"))
    }
}

impl Drop for Switch {
    fn drop(&mut self) {
        for h in &self.hosts {
            delete_netns(&h.netns);
        }
        delete_netns(&self.netns);
    }
}
