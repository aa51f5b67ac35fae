//! A network the bench owns outright: two network namespaces, a client and a
//! server, joined by a veth pair, with an IPv4 /30 of its own in 10.201.0.0/16.
//! Nothing is routed outside the pair: each veth end is created directly in
//! its namespace, so the root namespace never sees it, and there is no
//! default route.
//!
//! The kernel is shared with other people's tests, so names and addresses are
//! unique per bench process (its pid), and `Drop` kills whatever still runs in
//! the namespaces and deletes them (the veth and any nftables table go with
//! them), on error, on panic and after Ctrl-C (see `interrupt`). Servers die
//! with the bench even when it is killed outright (PR_SET_PDEATHSIG); the
//! namespaces of a bench killed outright are deleted by the next bench.
//!
//! The same gotchas as the tests' lab (tests/common/netlab.rs) apply: a
//! namespace inherits the root's congestion control (bbr here); unpaced iperf3
//! over veth is CPU-bound and retransmits without any injected loss; nft drops
//! count skbs, and with veth's default TSO/GSO one dropped skb is many
//! segments; sockperf 3.7 has no IPv6 and exits 0 even when it could not
//! connect.

use std::fs::{self, File};
use std::io::{self, Write};
use std::marker::PhantomData;
use std::net::Ipv4Addr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use stalltrace_lab::net::{
    dropped_by_rules, kill_and_delete_netns, parse_proc_net_counters, sweep_stale,
};

use super::{interrupt, tracer};

/// Prefix of every namespace the bench creates: `stbench-{pid}-{client|server}`.
const NETNS_PREFIX: &str = "stbench-";
/// The bench's nftables table (in the server's namespace only).
pub const NFT_TABLE: &str = "stalltrace_bench";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    Client,
    Server,
}

struct End {
    netns: String,
    veth: String,
    addr: Ipv4Addr,
    /// Made by us, so ours to delete.
    created: bool,
}

pub struct NetPair {
    client: End,
    server: End,
}

impl NetPair {
    pub fn create() -> anyhow::Result<Self> {
        sweep_stale_namespaces();
        let pid = std::process::id();
        let (client_addr, server_addr) = v4_pair(pid);
        let end = |side: &str, addr| End {
            netns: format!("{NETNS_PREFIX}{pid}-{side}"),
            veth: veth_name(pid, &side[..1]),
            addr,
            created: false,
        };
        // The guard exists before anything is made, so a failure half-way
        // through deletes whatever was.
        let mut pair = NetPair {
            client: end("client", client_addr),
            server: end("server", server_addr),
        };
        for e in [&mut pair.client, &mut pair.server] {
            run("ip", &["netns", "add", &e.netns])?;
            e.created = true;
        }
        let (c, s) = (&pair.client, &pair.server);
        run(
            "ip",
            &[
                "link", "add", &c.veth, "netns", &c.netns, "type", "veth", "peer", "name", &s.veth,
                "netns", &s.netns,
            ],
        )?;
        for side in [Side::Client, Side::Server] {
            let e = pair.end(side);
            let batch = format!(
                "link set lo up\nlink set {veth} up\naddr add {addr}/30 dev {veth}\n",
                veth = e.veth,
                addr = e.addr
            );
            run_stdin("ip", &["-n", &e.netns, "-batch", "-"], &batch)?;
            // Without this, the ssthresh a lossy run leaves in the namespace's
            // route-metrics cache would shape the next run's start.
            pair.exec(side, &["sysctl", "-qw", "net.ipv4.tcp_no_metrics_save=1"])?;
        }
        Ok(pair)
    }

    fn end(&self, side: Side) -> &End {
        match side {
            Side::Client => &self.client,
            Side::Server => &self.server,
        }
    }

    pub fn netns(&self, side: Side) -> &str {
        &self.end(side).netns
    }

    pub fn veth(&self, side: Side) -> &str {
        &self.end(side).veth
    }

    pub fn addr(&self, side: Side) -> Ipv4Addr {
        self.end(side).addr
    }

    /// `ip netns exec NS args...`, ready to run.
    pub fn command(&self, side: Side, args: &[&str]) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", self.netns(side)]).args(args);
        cmd
    }

    /// Run a command inside `side`; its stdout, or an error with its stderr.
    pub fn exec(&self, side: Side, args: &[&str]) -> anyhow::Result<String> {
        let out = self
            .command(side, args)
            .output()
            .with_context(|| format!("cannot run {args:?} in {}", self.netns(side)))?;
        if !out.status.success() {
            bail!(
                "{} in {} failed ({}): {}",
                args.join(" "),
                self.netns(side),
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Start a server inside `side` (its output to `log`), returned once
    /// something listens on TCP `port` there. The guard kills it on drop and
    /// borrows the pair, so it cannot outlive its namespace.
    pub fn server(
        &self,
        side: Side,
        port: u16,
        args: &[String],
        log: &Path,
    ) -> anyhow::Result<Server<'_>> {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let file = File::create(log).with_context(|| format!("cannot create {}", log.display()))?;
        let mut cmd = self.command(side, &args);
        cmd.stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file);
        // SAFETY: prctl is async-signal-safe and touches only the child.
        // `ip netns exec` execs the server in place, so the signal reaches it.
        unsafe {
            cmd.pre_exec(
                || match libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) {
                    0 => Ok(()),
                    _ => Err(io::Error::last_os_error()),
                },
            );
        }
        let child = cmd
            .spawn()
            .with_context(|| format!("cannot start {args:?}"))?;
        let mut server = Server {
            child,
            side,
            port,
            args: args.iter().map(|s| s.to_string()).collect(),
            log: log.to_path_buf(),
            what: format!("{} in {}", args.join(" "), self.netns(side)),
            _pair: PhantomData,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        let filter = format!(":{port}");
        loop {
            interrupt::check()?;
            let listening = self.exec(side, &["ss", "-Hltn", "sport", "=", &filter])?;
            if !listening.trim().is_empty() {
                return Ok(server);
            }
            if let Some(status) = server.child.try_wait()? {
                bail!(
                    "{} exited ({status}) before listening: {}",
                    server.what,
                    server.log_tail()
                );
            }
            if Instant::now() > deadline {
                bail!(
                    "{} not listening on {port} after 10 s: {}",
                    server.what,
                    server.log_tail()
                );
            }
            sleep(Duration::from_millis(20));
        }
    }

    /// Start `server` again, the same way (after it died: someone else's
    /// cleanup may kill processes it does not know).
    pub fn restart<'a>(&'a self, server: &mut Server<'a>) -> anyhow::Result<()> {
        let (side, port, args, log) = (
            server.side,
            server.port,
            server.args.clone(),
            server.log.clone(),
        );
        *server = self.server(side, port, &args, &log)?;
        Ok(())
    }

    /// Drop `percent` % of the TCP packets to `dport` arriving at `side` (nft
    /// `numgen random` on the input hook, in the bench's own table): loss on
    /// the wire to the sender. The same rule in the sender's output hook would
    /// be a local send failure, not loss. Other ports are untouched.
    pub fn drop_random(&self, side: Side, percent: u8, dport: u16) -> anyhow::Result<()> {
        if !(1..100).contains(&percent) {
            bail!("drop_random: {percent}% is not between 1 and 99");
        }
        let script = format!(
            "add table inet {NFT_TABLE}\n\
             add chain inet {NFT_TABLE} input {{ type filter hook input priority filter; policy accept; }}\n\
             add rule inet {NFT_TABLE} input tcp dport {dport} numgen random mod 100 < {percent} counter drop\n"
        );
        let ns = self.netns(side).to_string();
        run_stdin("ip", &["netns", "exec", &ns, "nft", "-f", "-"], &script)
    }

    /// Packets (skbs) the bench's rules have dropped at `side` so far.
    pub fn dropped_packets(&self, side: Side) -> anyhow::Result<u64> {
        let text = self.exec(side, &["nft", "-j", "list", "table", "inet", NFT_TABLE])?;
        let json: serde_json::Value =
            serde_json::from_str(&text).context("nft -j printed no JSON")?;
        Ok(dropped_by_rules(&json))
    }

    /// Packets `side`'s veth has sent so far, as the kernel counts them (`ip -s link`).
    pub fn tx_packets(&self, side: Side) -> anyhow::Result<u64> {
        let text = self.exec(side, &["ip", "-s", "-j", "link", "show", self.veth(side)])?;
        let json: serde_json::Value =
            serde_json::from_str(&text).context("ip -j printed no JSON")?;
        json[0]["stats64"]["tx"]["packets"]
            .as_u64()
            .with_context(|| format!("no tx packets for {} in: {text}", self.veth(side)))
    }

    /// TCP segments `side`'s namespace has received and sent so far, as the
    /// kernel counts them (InSegs and OutSegs of /proc/net/snmp there: MSS-sized
    /// segments, so a TSO or GRO packet counts as the segments it carries).
    pub fn tcp_segments(&self, side: Side) -> anyhow::Result<(u64, u64)> {
        let text = self.exec(side, &["cat", "/proc/net/snmp"])?;
        snmp_tcp_segments(&text).with_context(|| {
            format!(
                "no Tcp InSegs/OutSegs in {}'s /proc/net/snmp",
                self.netns(side)
            )
        })
    }

    /// The namespaces' names, to check after drop that they are gone.
    pub fn names(&self) -> [String; 2] {
        [self.client.netns.clone(), self.server.netns.clone()]
    }
}

impl Drop for NetPair {
    fn drop(&mut self) {
        for end in [&self.client, &self.server] {
            if end.created {
                delete_netns(&end.netns);
            }
        }
    }
}

/// InSegs and OutSegs from /proc/net/snmp's `Tcp:` header and value lines,
/// by the lab's parser of those counters.
fn snmp_tcp_segments(text: &str) -> Option<(u64, u64)> {
    let counters = parse_proc_net_counters(text);
    Some((
        *counters.0.get("Tcp.InSegs")?,
        *counters.0.get("Tcp.OutSegs")?,
    ))
}

/// Whether a namespace of that name exists (`ip netns list` reads the same directory).
pub fn netns_exists(name: &str) -> bool {
    Path::new("/run/netns").join(name).exists()
}

/// Kill whatever still runs in the namespace, then delete it (lab's
/// clean-up); a failure is told with how to finish by hand.
fn delete_netns(name: &str) {
    if let Err(e) = kill_and_delete_netns(name) {
        eprintln!("bench: {e}; delete it by hand: ip netns del {name}");
    }
}

/// Delete the namespaces of benches that no longer exist (killed before their
/// Drop ran), as the lab sweeps its own.
fn sweep_stale_namespaces() {
    sweep_stale(NETNS_PREFIX, |name| {
        eprintln!("bench: deleting {name}, left by a bench that is gone");
        delete_netns(name);
    });
}

/// `stb{pid}{c|s}`: at most 3 + 7 + 1 = 11 characters (the kernel allows 15).
fn veth_name(pid: u32, side: &str) -> String {
    format!("stb{pid}{side}")
}

/// A /30 in 10.201.0.0/16 (the tests' lab uses 10.200.0.0/16), by pid. Two
/// live benches with pids equal modulo 16384 would share addresses, but in
/// separate namespaces even that does not interfere.
fn v4_pair(pid: u32) -> (Ipv4Addr, Ipv4Addr) {
    let slot = pid % 16384;
    let net = u32::from(Ipv4Addr::new(10, 201, 0, 0)) | (slot << 2);
    (Ipv4Addr::from(net + 1), Ipv4Addr::from(net + 2))
}

/// A process running inside a namespace of the pair, killed and reaped on drop.
pub struct Server<'a> {
    child: Child,
    side: Side,
    port: u16,
    args: Vec<String>,
    log: PathBuf,
    what: String,
    _pair: PhantomData<&'a NetPair>,
}

impl Server<'_> {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Its user CPU seconds so far (0 once it is gone).
    pub fn user_s(&self) -> f64 {
        tracer::process_user_s(self.pid()).unwrap_or(0.0)
    }

    /// Still running?
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// What it is: "iperf3 -s -p 5201 in NS".
    pub fn what(&self) -> &str {
        &self.what
    }

    pub fn log_tail(&self) -> String {
        let text = fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(5)..].join(" / ")
    }
}

impl Drop for Server<'_> {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn run(program: &str, args: &[&str]) -> anyhow::Result<()> {
    run_stdin(program, args, "")
}

/// Run a command with `input` on its stdin; an error with its stderr when it fails.
fn run_stdin(program: &str, args: &[&str], input: &str) -> anyhow::Result<()> {
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot start {program}"))?;
    let written = child
        .stdin
        .take()
        .expect("piped")
        .write_all(input.as_bytes());
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!(
            "{program} {} failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    written.with_context(|| format!("cannot write to {program}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tcp_segments_from_snmp() {
        let text = "Ip: Forwarding DefaultTTL\nIp: 1 64\n\
            Tcp: RtoAlgorithm RtoMin RtoMax MaxConn ActiveOpens PassiveOpens AttemptFails \
            EstabResets CurrEstab InSegs OutSegs RetransSegs InErrs OutRsts InCsumErrors\n\
            Tcp: 1 200 120000 -1 3 2 0 0 1 4711 4242 7 0 1 0\n\
            Udp: InDatagrams\nUdp: 5\n";
        assert_eq!(snmp_tcp_segments(text), Some((4711, 4242)));
        assert_eq!(snmp_tcp_segments("Tcp: InSegs\n"), None);
    }

    #[test]
    fn names_and_addresses_fit() {
        assert_eq!(veth_name(4_194_304, "c"), "stb4194304c");
        assert!(veth_name(4_194_304, "s").len() <= 15);
        let (c, s) = v4_pair(16384 + 3);
        assert_eq!(
            (c, s),
            (Ipv4Addr::new(10, 201, 0, 13), Ipv4Addr::new(10, 201, 0, 14))
        );
        let (c, s) = v4_pair(16383);
        assert_eq!(
            (c, s),
            (
                Ipv4Addr::new(10, 201, 255, 253),
                Ipv4Addr::new(10, 201, 255, 254)
            )
        );
    }

    #[test]
    fn drops_are_summed_over_drop_rules_only() {
        let json: serde_json::Value = serde_json::from_str(
            r#"{"nftables":[{"metainfo":{}},{"table":{"name":"t"}},
            {"rule":{"expr":[{"match":{}},{"counter":{"packets":7,"bytes":1}},{"drop":null}]}},
            {"rule":{"expr":[{"counter":{"packets":100,"bytes":1}},{"accept":null}]}}]}"#,
        )
        .unwrap();
        assert_eq!(dropped_by_rules(&json), 7);
    }
}
