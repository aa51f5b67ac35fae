//! TCP family: attaches `ebpf/tcp.bpf.c`; its ring buffer becomes
//! `tcp_retransmit` records and its per-peer table `tcp_rtt` records. Every
//! interval it also samples the bulk flows over sock_diag (`tcp_flow`, flows.rs).

pub mod flows;

use std::collections::{HashMap, HashSet};
use std::io;
use std::path::Path;
use std::time::Duration;

use aya::maps::{HashMap as BpfHashMap, MapData, PerCpuArray, RingBuf};
use aya::{Btf, Ebpf};

use crate::abi::{self, tcp_peer_key, tcp_peer_stats, tcp_retransmit_event};
use crate::enrich::Tagger;
use crate::error::UserError;
use crate::hist::KernelHistDelta;
use crate::host::process_filter::ProcessFilter;
use crate::output::JsonWriter;
use crate::probes::lost::LostCounters;
use crate::probes::{self, AttachedFamily, Ctx, Family, FamilyFailure, ModeChoice};
use crate::records::tcp::{Connection, TcpRetransmitRecord, TcpRttRecord};
use flows::{FlowOptions, FlowSampler};

pub struct TcpOptions {
    pub mode: ModeChoice,
    /// Only these network namespaces (inodes); empty: all.
    pub netns: Vec<u32>,
    /// Only connections with one of these ports at either end; empty: all.
    pub ports: Vec<u16>,
    /// Only sockets whose owner is one of these processes; empty: all.
    pub processes: ProcessFilter,
    /// The kernel's HZ, to turn the RTO (jiffies) into milliseconds.
    pub hz: u32,
    /// `tcp_flow` records (sock_diag); None: off (`--bulk-mbps 0`).
    pub flows: Option<FlowOptions>,
}

#[derive(Default)]
struct PeerSeries {
    counters: [u64; 6],
    srtt: KernelHistDelta,
}

pub struct TcpProbe {
    family: AttachedFamily,
    events: RingBuf<MapData>,
    peers: BpfHashMap<MapData, tcp_peer_key, tcp_peer_stats>,
    inserts: PerCpuArray<MapData, u64>,
    lost: LostCounters,
    /// By connection: a peer of the kernel's table is one (`tcp_peer_key`).
    series: HashMap<Connection, PeerSeries>,
    inserts_seen: u64,
    /// Idle peers this daemon deleted from the table (not evictions).
    deleted: u64,
    evicted_seen: u64,
    evicted_new: u64,
    hz: u32,
    flows: Option<FlowSampler>,
}

fn fill_filters(ebpf: &mut Ebpf, opts: &TcpOptions) -> Result<(), String> {
    if !opts.netns.is_empty() {
        let mut map: BpfHashMap<_, u32, u8> =
            BpfHashMap::try_from(ebpf.map_mut("netns_filter").ok_or("no netns_filter map")?)
                .map_err(|e| e.to_string())?;
        for ns in &opts.netns {
            map.insert(ns, 1, 0).map_err(|e| e.to_string())?;
        }
    }
    if !opts.ports.is_empty() {
        let mut map: BpfHashMap<_, u16, u8> =
            BpfHashMap::try_from(ebpf.map_mut("port_filter").ok_or("no port_filter map")?)
                .map_err(|e| e.to_string())?;
        for port in &opts.ports {
            map.insert(port, 1, 0).map_err(|e| e.to_string())?;
        }
    }
    if !opts.processes.is_empty() {
        // The sockets they hold already (a listener older than the run): no call may come.
        let max = abi::PROCESS_SOCKETS_MAX as usize;
        let (inodes, more) = opts.processes.socket_inodes(Path::new("/proc"), max);
        if more {
            eprintln!(
                "stalltrace: the watched processes hold more than {max} sockets: the others are \
                 watched from their next send or receive on"
            );
        }
        let mut map: BpfHashMap<_, u64, u8> = BpfHashMap::try_from(
            ebpf.map_mut("process_sockets")
                .ok_or("no process_sockets map")?,
        )
        .map_err(|e| e.to_string())?;
        for inode in &inodes {
            map.insert(inode, 1, 0).map_err(|e| e.to_string())?;
        }
    }
    probes::process_filter::fill(ebpf, &opts.processes)
}

impl TcpProbe {
    pub fn attach(opts: &TcpOptions, btf: &Btf) -> Result<Self, FamilyFailure> {
        let mut globals = vec![
            ("filter_netns", u64::from(!opts.netns.is_empty())),
            ("filter_ports", u64::from(!opts.ports.is_empty())),
        ];
        globals.extend(probes::process_filter::load_globals(&opts.processes));
        let before_attach = |ebpf: &mut Ebpf| fill_filters(ebpf, opts);
        let setup = probes::Setup {
            globals: &globals,
            before_attach: Some(&before_attach),
            ..Default::default()
        };
        let mut family = probes::attach_family(probes::embedded("tcp"), opts.mode, &setup, btf)?;
        let ebpf = &mut family.ebpf;
        let maps = (|| -> anyhow::Result<_> {
            Ok((
                probes::take_map(ebpf, "tcp_events")?,
                probes::take_map(ebpf, "tcp_peers")?,
                probes::take_map(ebpf, "peer_inserts")?,
                LostCounters::take("tcp", ebpf)?,
            ))
        })();
        match maps {
            Ok((events, peers, inserts, lost)) => Ok(Self {
                family,
                events,
                peers,
                inserts,
                lost,
                series: HashMap::new(),
                inserts_seen: 0,
                deleted: 0,
                evicted_seen: 0,
                evicted_new: 0,
                hz: opts.hz,
                flows: opts.flows.clone().map(FlowSampler::new),
            }),
            Err(e) => Err(FamilyFailure {
                hooks: family.hooks.clone(),
                error: UserError::probe_failed("tcp", "its maps", &e.to_string()),
            }),
        }
    }
}

/// The connection a peer of the kernel's table is.
fn connection(key: &tcp_peer_key) -> Connection {
    Connection::from_kernel(
        key.netns, key.family, &key.saddr, key.sport, &key.daddr, key.dport,
    )
}

impl Family for TcpProbe {
    fn attached(&self) -> &AttachedFamily {
        &self.family
    }

    fn drain_events(&mut self, ctx: &mut Ctx, out: &mut JsonWriter) -> io::Result<()> {
        for e in probes::ring::drain::<tcp_retransmit_event>(&mut self.events) {
            let ts = ctx.clock.monotonic_to_rfc3339(e.ts_ns);
            let mut record = TcpRetransmitRecord::from_event(&e, self.hz);
            if let Some(sql) = ctx.sql.as_deref_mut() {
                let tag = |sql: &dyn Tagger| sql.tag_socket(e.sock_ino, &record.connection);
                if tag(sql).is_none() {
                    // A session younger than the last discovery: look again (once per drain).
                    sql.missed(record.pid, &ts);
                }
                record.sql = tag(sql);
                if record.sql.is_some()
                    && let Some(v) = sql.retransmit_verdict(e.sock_ino, e.seq, e.ts_ns)
                {
                    record.held_up_response = Some(v.held_up_response);
                    record.request_waited_ms =
                        Some((v.request_waited_ms * 1000.0).round() / 1000.0);
                }
            }
            out.emit(&ts, &record)?;
        }
        Ok(())
    }

    /// One `tcp_rtt` record per peer that had RTT samples or retransmits in the interval.
    fn collect(
        &mut self,
        interval: Duration,
        ts: &str,
        ctx: &mut Ctx,
        out: &mut JsonWriter,
    ) -> io::Result<()> {
        // Entries leave the table when the LRU evicts them (the table is full)
        // or when we delete them (below): inserted - present - deleted = evicted.
        // Inserts read first: one made while the table is read then counts as
        // present too early, never as evicted.
        let inserted: u64 = self
            .inserts
            .get(&0, 0)
            .map(|v| v.iter().sum())
            .unwrap_or(self.inserts_seen);
        let entries: Vec<(tcp_peer_key, tcp_peer_stats)> = self.peers.iter().flatten().collect();
        let evicted = inserted.saturating_sub(entries.len() as u64 + self.deleted);
        let table_full = evicted > self.evicted_seen;
        self.evicted_new += evicted.saturating_sub(self.evicted_seen);
        self.evicted_seen = evicted;
        self.inserts_seen = inserted;

        let present: HashSet<Connection> = entries.iter().map(|(k, _)| connection(k)).collect();
        // Peers the LRU evicted take their baselines with them.
        self.series.retain(|id, _| present.contains(id));
        for (key, stats) in entries {
            let id = connection(&key);
            let seen_before = self.series.contains_key(&id);
            let series = self.series.entry(id).or_default();
            let now = [
                stats.retrans_events,
                stats.retrans_segs,
                stats.rto_timeouts,
                stats.fast,
                stats.tlp,
                stats.syn,
            ];
            let mut delta = [0u64; 6];
            for (d, (n, prev)) in delta.iter_mut().zip(now.iter().zip(series.counters.iter())) {
                // A smaller total: the entry was evicted and created again.
                *d = if n >= prev { n - prev } else { *n };
            }
            series.counters = now;
            let srtt = series.srtt.advance(std::iter::once(&stats.srtt));
            if srtt.count() == 0 && delta.iter().all(|&d| d == 0) {
                // Idle for a whole interval: everything it counted has been
                // reported. Delete it, so the table holds the peers that are
                // active rather than every connection since the start (a host
                // whose clients reconnect would otherwise keep it full, and
                // every new peer would evict one and count a loss). The
                // kernel side makes it again at the peer's next RTT sample
                // or retransmit.
                if seen_before && self.peers.remove(&key).is_ok() {
                    self.deleted += 1;
                    self.series.remove(&id);
                }
                continue;
            }
            let record = TcpRttRecord {
                connection: id,
                interval_ms: interval.as_millis() as u64,
                srtt_us: srtt.to_record(1e-3),
                retransmits: delta[0],
                retrans_segs: delta[1],
                rtos: delta[2],
                fast_retransmits: delta[3],
                tail_loss_probes: delta[4],
                syn_retransmits: delta[5],
                peer_table_full: table_full,
                sql: ctx.sql.as_deref().and_then(|sql| sql.tag_socket(0, &id)),
            };
            out.emit(ts, &record)?;
        }
        if let Some(flows) = self.flows.as_mut() {
            flows.collect(ts, ctx, out)?;
        }
        Ok(())
    }

    fn lost(&mut self) -> Vec<(String, u64)> {
        let mut lost = self.lost.deltas(&self.family.ebpf);
        if self.evicted_new > 0 {
            lost.push(("tcp.peer_table_evicted".into(), self.evicted_new));
            self.evicted_new = 0;
        }
        lost.extend(self.flows.iter_mut().flat_map(FlowSampler::lost));
        lost
    }
}
