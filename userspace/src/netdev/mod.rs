//! Netdev family: attaches `ebpf/netdev.bpf.c` and reads link health over
//! netlink; one `netdev` record per interface per interval.

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
use crate::host::netns::{self, NAMED_NETNS_DIR, Netns, is_ns_file};
use crate::output::JsonWriter;
use crate::probes::lost::LostCounters;
use crate::probes::{self, AttachedFamily, Ctx, Family, FamilyFailure, ModeChoice};
use crate::records::netdev::NetdevRecord;

pub struct NetdevOptions {
    pub mode: ModeChoice,
    /// Only these namespaces; empty: this host's and every one under /run/netns.
    pub netns: Vec<Netns>,
    /// Only these interface names; empty: all.
    pub ifaces: Vec<String>,
    /// The kernel's HZ: the transmit hooks' sampling floor (one sample per
    /// CPU per 10 ms, netdev.bpf.c) is counted in jiffies.
    pub hz: u32,
}

/// (netns inode, ifindex)
type IfaceId = (u32, u32);

/// An interval's link readings: (id, delta since the last reading or None on
/// the first, name) of each interface, and the namespaces read.
type Readings = (Vec<(IfaceId, Option<LinkHealth>, String)>, HashSet<u32>);

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
}

/// The load-time globals at `hz` (`check` loads the host's).
pub fn load_globals(hz: u32) -> [(&'static str, u64); 1] {
    // HZ / 100 + 1 ticks, counted whole: about 10 ms at any HZ.
    [("tx_floor_jiffies", u64::from(hz / 100) + 1)]
}

impl NetdevProbe {
    pub fn attach(opts: &NetdevOptions, btf: &Btf) -> Result<Self, FamilyFailure> {
        let globals = load_globals(opts.hz);
        let prepare = |ebpf: &mut aya::Ebpf| prepare_entries(ebpf, &opts.netns, &opts.ifaces);
        let setup = probes::Setup {
            globals: &globals,
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
                };
                // Baseline readings, and the statistics entries created ahead of traffic.
                let _ = probe.read_links();
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

    /// Read every watched interface's link health now. A namespace that
    /// cannot be read (deleted meanwhile, or not to be entered) is skipped:
    /// its interfaces' records carry no `link`.
    fn read_links(&mut self) -> Readings {
        let mut out = Vec::new();
        let mut read = HashSet::new();
        for (inode, path) in self.namespaces() {
            let Ok(readings) = link::read_all_in_netns(&path) else {
                continue;
            };
            read.insert(inode);
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
        (out, read)
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
        // The kernel's table first, then the namespaces: the reading goes a
        // namespace at a time and takes seconds on a loaded host with a
        // thousand of them. Read the other way round, the table would hold
        // interfaces made during the reading, named in a record stamped
        // before they existed; this way one made after the stamp waits for
        // the next interval.
        let kernel: Vec<(netdev_key, PerCpuValues<netdev_stats>)> =
            self.stats.iter().flatten().collect();
        let (readings, read) = self.read_links();
        let mut links: BTreeMap<IfaceId, (Option<LinkHealth>, String)> = readings
            .into_iter()
            .map(|(id, delta, name)| (id, (delta, name)))
            .collect();
        // Which namespaces exist: asked only about those of entries never read.
        let mut live: Option<HashSet<u32>> = None;
        let links_now: HashSet<IfaceId> = links.keys().copied().collect();
        let mut forget = Vec::new();
        for (key, per_cpu) in kernel {
            let id = (key.netns, key.ifindex);
            let present = links.contains_key(&id);
            // Known: read, now or in an earlier interval (so it has a name).
            // Known but not read now: gone (deleted, moved to another
            // namespace, or its namespace deleted). Never read: in a namespace
            // not watched (or not to be entered), or made and gone between
            // two readings (its namespace too).
            let known = self.links.contains_key(&id);
            let (link, name) = match links.remove(&id) {
                Some(found) => found,
                None => (
                    None,
                    self.links
                        .get(&id)
                        .map(|l| l.name.clone())
                        .unwrap_or_default(),
                ),
            };
            let namespace_gone = !known
                && !present
                && !read.contains(&key.netns)
                && !live
                    .get_or_insert_with(netns::live_inodes)
                    .contains(&key.netns);
            let gone = (known && !present) || namespace_gone;
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
            // A statistics entry lives as long as its interface (the table
            // holds 256, and a host that makes and deletes namespaces would
            // fill it with the dead): one that is gone is deleted after this
            // interval's record, and so is an idle one that a namespace read
            // now does not have (the reading is after its last packet; one
            // made since is not idle). An idle entry has nothing unreported.
            // Entries of namespaces that exist but are not read (--netns, no
            // name) stay: deleting them would make the kernel side allocate
            // them again at their next packet.
            if gone || (!present && !active && read.contains(&key.netns)) {
                forget.push((key, id));
            }
            // The interval after activity shows it drained, unless it is gone.
            let emit = active || (series.active_last_interval && !gone);
            series.active_last_interval = active;
            if !emit
                || (known && !self.wanted(&name))
                // an interface we cannot name cannot match --iface
                || (!known && !self.ifaces.is_empty())
                || (!self.netns.is_empty() && !self.netns.iter().any(|n| n.inode == key.netns))
            {
                continue;
            }
            let record = NetdevRecord {
                iface: if name.is_empty() {
                    format!("if{}", key.ifindex)
                } else {
                    name
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
            out.emit(ts, &record)?;
        }
        for (key, id) in forget {
            let _ = self.stats.remove(&key);
            self.series.remove(&id);
            self.links.remove(&id);
        }
        // Readings of interfaces gone without a statistics entry.
        self.links.retain(|id, _| links_now.contains(id));
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
            if let Ok(meta) = std::fs::metadata(entry.path())
                && is_ns_file(&entry.path())
            {
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

/// `--iface`, before anything attaches: each name is an interface of a
/// watched namespace now (a misspelt one would watch nothing, silently).
/// Namespaces given by inode alone cannot be listed: then nothing is refused.
pub fn check_ifaces(netns: &[Netns], ifaces: &[String]) -> Result<(), UserError> {
    if ifaces.is_empty() || netns.iter().any(|n| n.path.is_none()) {
        return Ok(());
    }
    let present: HashSet<String> = namespaces_of(netns)
        .iter()
        .flat_map(|(_, path)| link::read_all_in_netns(path).unwrap_or_default())
        .map(|reading| reading.name)
        .collect();
    let missing: Vec<&str> = ifaces
        .iter()
        .filter(|i| !present.contains(*i))
        .map(String::as_str)
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    Err(UserError::new(
        format!(
            "--iface {}: no such interface in the watched network namespaces",
            missing.join(", ")
        ),
        "give a name `ip link` lists (or `ip -n NETNS link` for a namespace of --netns)",
    ))
}

/// Create the statistics entries of every interface netdev watches in
/// `ebpf`'s `netdev_stats` before the programs that would create them attach.
/// Interfaces that appear later get theirs each interval. Namespaces that
/// cannot be read are skipped here (reported by the interval's link reading).
fn prepare_entries(ebpf: &mut aya::Ebpf, netns: &[Netns], ifaces: &[String]) -> Result<(), String> {
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
