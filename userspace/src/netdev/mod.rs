//! Netdev family: attaches `ebpf/netdev.bpf.c` and reads link health over
//! netlink; one `netdev` record per interface per interval.

pub mod record;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::time::Duration;

use aya::Btf;
use aya::maps::{MapData, PerCpuHashMap, PerCpuValues};

use crate::abi::{netdev_key, netdev_stats};
use crate::error::UserError;
use crate::hist::KernelHistDelta;
use crate::host::link::{self, LinkHealth};
use crate::host::netns::{NAMED_NETNS_DIR, Netns};
use crate::output::JsonWriter;
use crate::probes::lost::LostCounters;
use crate::probes::{self, AttachedFamily, Ctx, Family, FamilyFailure, ModeChoice};
use record::NetdevRecord;

pub struct NetdevOptions {
    pub mode: ModeChoice,
    /// Only these namespaces; empty: this host's and every one under /run/netns.
    pub netns: Vec<Netns>,
    /// Only these interface names; empty: all.
    pub ifaces: Vec<String>,
    /// Our maps the tcp family's object already has (pinned there, see
    /// `NETDEV_RX_MAPS`): its tcp_probe ends our receive path, so ours is not attached.
    pub rx_in_tcp: Vec<(&'static str, PathBuf)>,
}

/// The maps the tcp family's tcp_probe needs to end our sampled receive path
/// (ebpf/include/netdev_rx.bpf.h: one program per received segment, not two).
pub const NETDEV_RX_MAPS: &[&str] = &["netdev_stats", "netdev_stats_zero", "rx_slots"];

/// (netns inode, ifindex)
type IfaceId = (u32, u32);

#[derive(Default)]
struct Series {
    counters: [u64; 4],
    qdisc: KernelHistDelta,
    xmit: KernelHistDelta,
    rx: KernelHistDelta,
    active_last_interval: bool,
}

pub struct NetdevProbe {
    family: AttachedFamily,
    stats: PerCpuHashMap<MapData, netdev_key, netdev_stats>,
    lost: LostCounters,
    netns: Vec<Netns>,
    ifaces: Vec<String>,
    series: HashMap<IfaceId, Series>,
    /// Last link reading per interface, the baseline of the next delta.
    links: HashMap<IfaceId, LinkHealth>,
    /// Namespaces whose link health cannot be read, reported once each.
    unreadable: HashSet<u32>,
}

impl NetdevProbe {
    pub fn attach(opts: &NetdevOptions, btf: &Btf) -> Result<Self, FamilyFailure> {
        let skip: &[&str] = if opts.rx_in_tcp.is_empty() {
            &[]
        } else {
            &["tcp_probe"]
        };
        let prepare = |ebpf: &mut aya::Ebpf| prepare_entries(ebpf, &opts.netns, &opts.ifaces);
        let setup = probes::Setup {
            pins: &opts.rx_in_tcp,
            skip,
            before_attach: Some(&prepare),
            ..Default::default()
        };
        let mut family = probes::attach_family(probes::embedded("netdev"), opts.mode, &setup, btf)?;
        let ebpf = &mut family.ebpf;
        let maps = (|| -> anyhow::Result<_> {
            Ok((
                probes::take_map(ebpf, "netdev_stats")?,
                LostCounters::take("netdev", ebpf)?,
            ))
        })();
        match maps {
            Ok((stats, lost)) => {
                let mut probe = Self {
                    family,
                    stats,
                    lost,
                    netns: opts.netns.clone(),
                    ifaces: opts.ifaces.clone(),
                    series: HashMap::new(),
                    links: HashMap::new(),
                    unreadable: HashSet::new(),
                };
                // Baseline readings, and the statistics entries created ahead of traffic.
                probe.read_links();
                Ok(probe)
            }
            Err(e) => Err(FamilyFailure {
                hooks: family.hooks.clone(),
                error: UserError::probe_failed("netdev", "its maps", &e.to_string()),
            }),
        }
    }

    /// The namespaces to read: the ones asked for, else this host's and every named one.
    fn namespaces(&self) -> Vec<(u32, PathBuf)> {
        namespaces_of(&self.netns)
    }

    fn wanted(&self, name: &str) -> bool {
        wanted(&self.ifaces, name)
    }

    /// Read every watched interface's link health now; returns (id, delta since the
    /// last reading or None on the first, name).
    fn read_links(&mut self) -> Vec<(IfaceId, Option<LinkHealth>, String)> {
        let mut out = Vec::new();
        for (inode, path) in self.namespaces() {
            let readings = match link::read_all_in_netns(&path) {
                Ok(r) => r,
                Err(_) => {
                    self.unreadable.insert(inode);
                    continue;
                }
            };
            for reading in readings {
                if !self.wanted(&reading.name) {
                    continue;
                }
                let id = (inode, reading.ifindex);
                self.prepare(id);
                let delta = self.links.get(&id).map(|prev| link::delta(prev, &reading));
                out.push((id, delta, reading.name.clone()));
                self.links.insert(id, reading);
            }
        }
        out
    }

    /// Create an interface's statistics entry before its first packet (one
    /// that appeared since the programs attached).
    fn prepare(&mut self, id: IfaceId) {
        prepare_entry(&mut self.stats, id);
    }
}

impl Family for NetdevProbe {
    fn attached(&self) -> &AttachedFamily {
        &self.family
    }

    fn drain_events(&mut self, _ctx: &mut Ctx, _out: &mut JsonWriter) -> io::Result<()> {
        Ok(())
    }

    fn collect(
        &mut self,
        interval: Duration,
        ts: &str,
        _ctx: &mut Ctx,
        out: &mut JsonWriter,
    ) -> io::Result<()> {
        let mut links: BTreeMap<IfaceId, (Option<LinkHealth>, String)> = self
            .read_links()
            .into_iter()
            .map(|(id, delta, name)| (id, (delta, name)))
            .collect();
        let kernel: Vec<(netdev_key, PerCpuValues<netdev_stats>)> =
            self.stats.iter().flatten().collect();
        for (key, per_cpu) in kernel {
            let id = (key.netns, key.ifindex);
            let (link, name) = links.remove(&id).unwrap_or((None, String::new()));
            let known = self.links.contains_key(&id);
            if known && !self.wanted(&name) {
                continue;
            }
            if !known && !self.ifaces.is_empty() {
                continue; // an interface we cannot name cannot match --iface
            }
            if !self.netns.is_empty() && !self.netns.iter().any(|n| n.inode == key.netns) {
                continue;
            }
            let series = self.series.entry(id).or_default();
            let sum = |f: fn(&netdev_stats) -> u64| per_cpu.iter().map(f).sum::<u64>();
            let now = [
                sum(|s| s.tx_busy),
                sum(|s| s.tx_timeouts),
                sum(|s| s.tx_stalls),
                sum(|s| s.qdisc_untimed),
            ];
            let mut delta = [0u64; 4];
            for (d, (n, p)) in delta.iter_mut().zip(now.iter().zip(series.counters.iter())) {
                *d = n.wrapping_sub(*p);
            }
            series.counters = now;
            let qdisc = series.qdisc.advance(per_cpu.iter().map(|s| &s.qdisc));
            let xmit = series.xmit.advance(per_cpu.iter().map(|s| &s.xmit));
            let rx = series.rx.advance(per_cpu.iter().map(|s| &s.rx));
            let counters = link.as_ref().and_then(|l| l.counters);
            let packets = counters.map_or(0, |c| c.rx_packets + c.tx_packets);
            let active = packets > 0
                || delta.iter().any(|&d| d > 0)
                || qdisc.count() + xmit.count() + rx.count() > 0;
            let emit = active || series.active_last_interval;
            series.active_last_interval = active;
            if !emit {
                continue;
            }
            let record = NetdevRecord {
                iface: if known {
                    name
                } else {
                    format!("if{}", key.ifindex)
                },
                ifindex: key.ifindex,
                netns: key.netns,
                interval_ms: interval.as_millis() as u64,
                rx_packets: counters.map(|c| c.rx_packets),
                rx_bytes: counters.map(|c| c.rx_bytes),
                tx_packets: counters.map(|c| c.tx_packets),
                tx_bytes: counters.map(|c| c.tx_bytes),
                qdisc_us: qdisc.to_record(1e-3),
                xmit_us: xmit.to_record(1e-3),
                rx_us: rx.to_record(1e-3),
                tx_busy: delta[0],
                tx_timeouts: delta[1],
                tx_stalls: delta[2],
                qdisc_untimed: delta[3],
                link,
            };
            out.emit("netdev", ts, &record)?;
        }
        Ok(())
    }

    fn lost(&mut self) -> Vec<(String, u64)> {
        self.lost.deltas(&self.family.ebpf)
    }
}

/// `netns` as asked for, else this host's namespace and every named one.
fn namespaces_of(netns: &[Netns]) -> Vec<(u32, PathBuf)> {
    if !netns.is_empty() {
        return netns
            .iter()
            .filter_map(|n| n.path.clone().map(|p| (n.inode, p)))
            .collect();
    }
    let mut out = Vec::new();
    let host = PathBuf::from("/proc/self/ns/net");
    if let Ok(meta) = std::fs::metadata(&host) {
        out.push((meta.ino() as u32, host));
    }
    if let Ok(dir) = std::fs::read_dir(NAMED_NETNS_DIR) {
        for entry in dir.flatten() {
            if let Ok(meta) = std::fs::metadata(entry.path()) {
                let inode = meta.ino() as u32;
                if !out.iter().any(|(i, _)| *i == inode) {
                    out.push((inode, entry.path()));
                }
            }
        }
    }
    out
}

fn wanted(ifaces: &[String], name: &str) -> bool {
    ifaces.is_empty() || ifaces.iter().any(|i| i == name)
}

/// Create an interface's statistics entry ahead of its traffic: the kernel
/// side would have to allocate it from the atomic per-CPU pool, which can be
/// empty for a moment (the packet's measurement is then counted lost; see the
/// block family).
fn prepare_entry<T: std::borrow::BorrowMut<MapData>>(
    stats: &mut PerCpuHashMap<T, netdev_key, netdev_stats>,
    (netns, ifindex): IfaceId,
) {
    let key = netdev_key { netns, ifindex };
    if stats.get(&key, 0).is_ok() {
        return;
    }
    let Ok(ncpus) = aya::util::nr_cpus() else {
        return;
    };
    if let Ok(zeroed) = PerCpuValues::try_from(vec![netdev_stats::default(); ncpus]) {
        // BPF_NOEXIST: never reset an entry the kernel side created meanwhile.
        let _ = stats.insert(key, zeroed, u64::from(aya_obj::generated::BPF_NOEXIST));
    }
}

/// Create the statistics entries of every interface netdev watches in
/// `ebpf`'s `netdev_stats` before any program that creates them attaches:
/// netdev's own object, or the tcp object that shares the map and attaches
/// first (NETDEV_RX_MAPS). Interfaces that appear later get theirs each
/// interval. Namespaces that cannot be read are skipped here (reported by
/// the interval's link reading).
pub fn prepare_entries(
    ebpf: &mut aya::Ebpf,
    netns: &[Netns],
    ifaces: &[String],
) -> Result<(), String> {
    let map = ebpf
        .map_mut("netdev_stats")
        .ok_or("the object has no map netdev_stats")?;
    let mut stats: PerCpuHashMap<&mut MapData, netdev_key, netdev_stats> =
        PerCpuHashMap::try_from(map).map_err(|e| e.to_string())?;
    for (inode, path) in namespaces_of(netns) {
        for reading in link::read_all_in_netns(&path).unwrap_or_default() {
            if wanted(ifaces, &reading.name) {
                prepare_entry(&mut stats, (inode, reading.ifindex));
            }
        }
    }
    Ok(())
}
