//! `tcp_flow` records: every interval, the bulk TCP flows of each watched
//! network namespace and what limited each, from the kernel's own TCP
//! accounting (sock_diag dumps of established sockets with their tcp_info:
//! busy time, receive-window-limited and send-buffer-limited time).
//!
//! diag.rs reads the dump, table.rs keeps each socket's previous reading and
//! classifies, namespaces.rs finds the namespaces and holds one sock_diag
//! socket in each. Nothing here needs the eBPF side: when sock_diag is not
//! available the tcp family runs on and says so once on stderr, and each
//! namespace it could not sample is counted in `lost`.

mod diag;
mod namespaces;
mod owners;
mod table;

use std::collections::{BTreeMap, HashSet};
use std::io;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Instant;

use crate::enrich::SqlTag;
use crate::host::container;
use crate::host::netns::Netns;
use crate::host::process_filter::ProcessFilter;
use crate::output::JsonWriter;
use crate::probes::Ctx;
use diag::{TcpSocket, Undecodable};
use namespaces::{MAX_NAMESPACES, OpenError, Sockets};
use table::{FlowDelta, FlowTable};

use crate::records::tcp::{Connection, TcpFlowRecord};

/// Loss sources (`lost.by_source`, prefixed `tcp.`).
const OVER_LIMIT: &str = "flow_netns_over_limit";
const UNSAMPLED: &str = "flow_netns_unsampled";
const UNDECODABLE: &str = "flow_socket_undecodable";

/// At most this many distinct problems are printed (each once).
const MAX_WARNINGS: usize = 32;

#[derive(Clone, Debug)]
pub struct FlowOptions {
    /// A flow is bulk when it sends at least this many Mbit/s (> 0).
    pub bulk_mbps: f64,
    /// `--netns`: only these namespaces; empty: every one found.
    pub netns: Vec<Netns>,
    /// `--port`: only connections with one of these ports at either end; empty: all.
    pub ports: Vec<u16>,
    /// `--pid`, `--comm`, `--container`: only flows a watched process holds.
    pub processes: ProcessFilter,
}

pub struct FlowSampler {
    opts: FlowOptions,
    started: Instant,
    sockets: Sockets,
    table: FlowTable,
    warned: HashSet<String>,
    lost: BTreeMap<&'static str, u64>,
}

impl FlowSampler {
    /// Takes the baselines, so the first interval already has records.
    pub fn new(opts: FlowOptions) -> Self {
        let mut sampler = Self {
            opts,
            started: Instant::now(),
            sockets: Sockets::default(),
            table: FlowTable::default(),
            warned: HashSet::new(),
            lost: BTreeMap::new(),
        };
        sampler.sample();
        sampler
    }

    /// Write a `tcp_flow` record for each bulk flow since the last call.
    pub fn collect(&mut self, ts: &str, ctx: &mut Ctx, out: &mut JsonWriter) -> io::Result<()> {
        let flows = self.sample();
        // One pass over /proc, only when a sender idled: who feeds the flow.
        let idle_senders: HashSet<u64> = flows
            .iter()
            .filter(|(_, f)| f.limiter() == table::Limiter::Application && f.socket.ino != 0)
            .map(|(_, f)| f.socket.ino)
            .collect();
        // A process filter needs every flow's holders, and then pays that pass each interval.
        let filtered = !self.opts.processes.is_empty();
        let asked: HashSet<u64> = if filtered {
            flows
                .iter()
                .map(|(_, f)| f.socket.ino)
                .filter(|&ino| ino != 0)
                .collect()
        } else {
            idle_senders.clone()
        };
        let proc = Path::new("/proc");
        let mut holders = owners::holders(proc, &asked);
        for (netns, flow) in flows {
            let pids = holders.remove(&flow.socket.ino).unwrap_or_default();
            if filtered
                && !pids
                    .iter()
                    .any(|&pid| self.opts.processes.matches(proc, pid))
            {
                continue;
            }
            let connection = connection(netns, &flow.socket);
            let sql = ctx
                .sql
                .as_deref()
                .and_then(|sql| sql.tag_socket(flow.socket.ino, &connection));
            let mut r = record(connection, &flow, sql);
            if idle_senders.contains(&flow.socket.ino) {
                r.pids = pids;
                r.container = r
                    .pids
                    .first()
                    .and_then(|pid| container::of_pid(Path::new("/proc"), *pid));
            }
            out.emit(ts, &r)?;
        }
        Ok(())
    }

    /// Dump every watched namespace; the bulk flows since the last dump, by namespace.
    fn sample(&mut self) -> Vec<(u32, FlowDelta)> {
        let selection =
            namespaces::select(&self.opts.netns, &self.sockets.inodes(), MAX_NAMESPACES);
        if selection.over_limit > 0 {
            self.count(OVER_LIMIT, selection.over_limit as u64);
            self.warn(
                OVER_LIMIT.into(),
                format!(
                "{} network namespaces found; tcp_flow samples {MAX_NAMESPACES} and counts the rest \
                 in lost as tcp.{OVER_LIMIT}: name the ones that matter with --netns",
                selection.sample.len() + selection.over_limit
            ),
            );
        }
        for inode in &selection.missing {
            self.count(UNSAMPLED, 1);
            self.warn(
                format!("missing {inode}"),
                format!(
                    "--netns {inode}: no process and no /run/netns name has this namespace, so its \
                 sockets cannot be listed: give a name or a /proc/PID/ns/net path instead"
                ),
            );
        }
        let sampled: HashSet<u32> = selection.sample.iter().map(|c| c.inode).collect();
        self.sockets.retain(&sampled);
        self.table.retain_namespaces(&sampled);

        let bulk_bytes_per_s = self.opts.bulk_mbps * 1e6 / 8.0;
        let mut bulk = Vec::new();
        for candidate in &selection.sample {
            let netns = candidate.inode;
            let socket = match self.sockets.get(candidate) {
                Ok(s) => s,
                Err(OpenError::Gone) => continue,
                Err(OpenError::Failed { kind, message }) => {
                    self.count(UNSAMPLED, 1);
                    self.warn(kind, format!("{message}; no tcp_flow records from it"));
                    continue;
                }
            };
            let mut found = Vec::new();
            let mut undecodable = (0u64, None);
            let ports = &self.opts.ports;
            let dumped = diag::dump(socket, &mut |s| match s {
                Ok(s) if wanted(ports, &s) => found.push(s),
                Ok(_) => {}
                Err(e) => {
                    undecodable.0 += 1;
                    undecodable.1.get_or_insert(e);
                }
            });
            if let Err(e) = dumped {
                self.sockets.close(netns);
                self.count(UNSAMPLED, 1);
                self.warn(
                    format!("dump {e}"),
                    format!(
                        "the sock_diag dump of network namespace {netns} failed ({e}): no tcp_flow \
                     records from it; on a kernel without TCP sock_diag load it \
                     (`modprobe tcp_diag`), or turn tcp_flow off with --bulk-mbps 0"
                    ),
                );
                continue;
            }
            if let (n @ 1.., Some(first)) = undecodable {
                self.count(UNDECODABLE, n);
                self.warn(
                    UNDECODABLE.into(),
                    format!(
                        "sockets whose sock_diag answer could not be read are left out of \
                     tcp_flow and counted in lost as tcp.{UNDECODABLE}; the first: {}",
                        describe(&first)
                    ),
                );
            }
            let now = self.started.elapsed();
            bulk.extend(
                self.table
                    .update(netns, now, found)
                    .into_iter()
                    .filter(|flow| flow.is_bulk(bulk_bytes_per_s))
                    .map(|flow| (netns, flow)),
            );
        }
        bulk
    }

    /// New losses since the last call, as `tcp.<source>`.
    pub fn lost(&mut self) -> Vec<(String, u64)> {
        std::mem::take(&mut self.lost)
            .into_iter()
            .map(|(source, n)| (format!("tcp.{source}"), n))
            .collect()
    }

    fn count(&mut self, source: &'static str, n: u64) {
        *self.lost.entry(source).or_default() += n;
    }

    /// Print a problem once (stderr) per `kind` (the same failure in many
    /// namespaces is one kind), so a run without sock_diag says why it has no
    /// `tcp_flow` records without repeating it every interval.
    fn warn(&mut self, kind: String, message: String) {
        if self.warned.len() < MAX_WARNINGS && self.warned.insert(kind) {
            eprintln!("stalltrace: tcp_flow: {message}");
        }
    }
}

fn wanted(ports: &[u16], s: &TcpSocket) -> bool {
    ports.is_empty() || ports.contains(&s.sport) || ports.contains(&s.dport)
}

fn describe(e: &Undecodable) -> String {
    match e {
        Undecodable::Message(text) => text.clone(),
        Undecodable::TcpInfo(None) => "no tcp_info in the answer".into(),
        Undecodable::TcpInfo(Some(len)) => {
            format!("tcp_info of {len} bytes, too short (a kernel before 4.10?)")
        }
    }
}

/// The connection a socket of `netns`'s dump is.
fn connection(netns: u32, s: &TcpSocket) -> Connection {
    Connection::new(
        netns,
        SocketAddr::new(s.local, s.sport),
        SocketAddr::new(s.remote, s.dport),
    )
}

fn round3(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}

/// The record of one bulk flow.
fn record(connection: Connection, flow: &FlowDelta, sql: Option<SqlTag>) -> TcpFlowRecord {
    let (s, d) = (&flow.socket, &flow.delta);
    let secs = flow.interval.as_secs_f64();
    let ms = |us: u64| round3(us as f64 / 1000.0);
    TcpFlowRecord {
        connection,
        sock_ino: (s.ino != 0).then_some(s.ino),
        interval_ms: flow.interval.as_millis() as u64,
        bytes_acked: d.bytes_acked,
        bytes_received: d.bytes_received,
        send_mbps: round3(d.bytes_acked as f64 * 8.0 / secs / 1e6),
        delivery_mbps: round3(s.info.delivery_rate as f64 * 8.0 / 1e6),
        busy_ms: ms(d.busy_us),
        rwnd_limited_ms: ms(d.rwnd_limited_us),
        sndbuf_limited_ms: ms(d.sndbuf_limited_us),
        retrans_segs: d.retrans_segs,
        data_segs_out: Some(d.data_segs_out),
        srtt_us: f64::from(s.info.rtt_us),
        cwnd: s.info.snd_cwnd,
        limiter: flow.limiter(),
        pids: Vec::new(),
        container: None,
        sql,
    }
}

#[cfg(test)]
mod tests {
    use std::net::{IpAddr, Ipv4Addr};
    use std::time::Duration;

    use super::diag::TcpInfo;
    use super::table::Counters;
    use super::*;
    use crate::records::tcp::{IpFamily, Limiter};

    #[test]
    fn a_record_from_a_delta() {
        let flow = FlowDelta {
            socket: TcpSocket {
                local: IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)),
                sport: 5022,
                remote: IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2)),
                dport: 41_000,
                ino: 0,
                cookie: 9,
                info: TcpInfo {
                    rtt_us: 1234,
                    snd_cwnd: 40,
                    delivery_rate: 2_500_000,
                    ..Default::default()
                },
            },
            delta: Counters {
                bytes_acked: 2_500_000,
                bytes_received: 1_000,
                busy_us: 498_000,
                rwnd_limited_us: 250_000,
                sndbuf_limited_us: 4_000,
                retrans_segs: 3,
                data_segs_out: 1_800,
            },
            interval: Duration::from_millis(1000),
        };
        let r = record(connection(4026531840, &flow.socket), &flow, None);
        assert_eq!(r.send_mbps, 20.0);
        assert_eq!(r.delivery_mbps, 20.0);
        assert_eq!(
            (r.busy_ms, r.rwnd_limited_ms, r.sndbuf_limited_ms),
            (498.0, 250.0, 4.0)
        );
        assert_eq!(r.limiter, Limiter::Receiver);
        assert_eq!(
            (r.sock_ino, r.interval_ms, r.srtt_us, r.cwnd),
            (None, 1000, 1234.0, 40)
        );
        let c = r.connection;
        assert_eq!(
            (c.family, c.saddr.to_string(), c.dport),
            (IpFamily::Ipv4, "10.0.0.1".to_string(), 41_000)
        );
    }

    #[test]
    fn a_namespace_that_cannot_be_sampled_is_lost_every_interval_and_said_once() {
        let mut sampler = FlowSampler::new(FlowOptions {
            bulk_mbps: 8.0,
            // An inode no namespace has, given bare: nothing names it.
            netns: vec![Netns {
                spec: "1".into(),
                inode: 1,
                path: None,
            }],
            ports: Vec::new(),
            processes: ProcessFilter::default(),
        });
        // The baseline at attach tried it once already.
        assert_eq!(
            sampler.lost(),
            [("tcp.flow_netns_unsampled".to_string(), 1)]
        );
        for _ in 0..3 {
            assert!(sampler.sample().is_empty());
            assert_eq!(
                sampler.lost(),
                [("tcp.flow_netns_unsampled".to_string(), 1)]
            );
        }
        assert_eq!(sampler.warned.len(), 1, "{:?}", sampler.warned);
        assert_eq!(sampler.warned.iter().next().unwrap(), "missing 1");
    }

    #[test]
    fn the_port_filter_matches_either_end() {
        let s = TcpSocket {
            local: IpAddr::V4(Ipv4Addr::LOCALHOST),
            sport: 5022,
            remote: IpAddr::V4(Ipv4Addr::LOCALHOST),
            dport: 40_000,
            ino: 1,
            cookie: 1,
            info: TcpInfo::default(),
        };
        assert!(wanted(&[], &s));
        assert!(wanted(&[1433, 5022], &s));
        assert!(wanted(&[40_000], &s));
        assert!(!wanted(&[1433], &s));
    }
}
