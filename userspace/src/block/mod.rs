//! Block family: attaches `ebpf/block.bpf.c`, turns its per-CPU aggregates into
//! one `block` record per disk and op per interval, and its ring buffer into
//! `slow_io` records.

pub mod record;
pub mod sysfs;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io;
use std::time::Duration;

use aya::Btf;
use aya::maps::{HashMap as BpfHashMap, MapData, MapError, PerCpuHashMap, PerCpuValues, RingBuf};

use crate::abi::{self, block_disk_state, block_key, block_stats, slow_io_event};
use crate::hist::KernelHistDelta;
use crate::host::clock::Clock;
use crate::output::JsonWriter;
use crate::probes::lost::LostCounters;
use crate::probes::{self, AttachedFamily, Family, FamilyFailure, ModeChoice};
use record::{BlockRecord, SlowIoRecord, op_name};
use sysfs::Sysfs;

const NS_TO_US: f64 = 1e-3;

pub struct BlockOptions {
    /// Send I/Os slower than this as `slow_io` records; `None` sends none.
    pub slow_io: Option<Duration>,
    pub mode: ModeChoice,
}

/// Interval-to-interval state of one (disk, op).
#[derive(Default)]
struct Series {
    counters: [u64; 5],
    total: KernelHistDelta,
    tag_wait: KernelHistDelta,
    queue: KernelHistDelta,
    device: KernelHistDelta,
    inflight: KernelHistDelta,
    active_last_interval: bool,
}

pub struct BlockProbe {
    family: AttachedFamily,
    stats: PerCpuHashMap<MapData, block_key, block_stats>,
    disks: BpfHashMap<MapData, u64, block_disk_state>,
    events: RingBuf<MapData>,
    lost: LostCounters,
    series: BTreeMap<(u32, u32, u32), Series>,
    names: HashMap<(u32, u32), String>,
    sysfs: Sysfs,
    /// Disks whose common (disk, op) entries exist in `block_stats`.
    prepared: HashSet<(u32, u32)>,
}

impl BlockProbe {
    pub fn attach(opts: &BlockOptions, btf: &Btf) -> Result<Self, FamilyFailure> {
        let slow_io_ns = opts.slow_io.map_or(0, |d| d.as_nanos() as u64);
        let mut family = probes::attach_family(
            probes::embedded("block"),
            opts.mode,
            &[("slow_io_ns", slow_io_ns)],
            btf,
        )?;
        let taken = Self::take_maps(&mut family);
        match taken {
            Ok((stats, disks, events, lost)) => {
                let mut probe = Self {
                    family,
                    stats,
                    disks,
                    events,
                    lost,
                    series: BTreeMap::new(),
                    names: HashMap::new(),
                    sysfs: Sysfs::default(),
                    prepared: HashSet::new(),
                };
                probe.prepare_disks();
                Ok(probe)
            }
            Err(e) => Err(FamilyFailure {
                hooks: family.hooks.clone(),
                error: crate::error::UserError::probe_failed("block", "its maps", &e.to_string()),
            }),
        }
    }

    #[allow(clippy::type_complexity)]
    fn take_maps(
        family: &mut AttachedFamily,
    ) -> anyhow::Result<(
        PerCpuHashMap<MapData, block_key, block_stats>,
        BpfHashMap<MapData, u64, block_disk_state>,
        RingBuf<MapData>,
        LostCounters,
    )> {
        let ebpf = &mut family.ebpf;
        let mut take = |name: &str| {
            ebpf.take_map(name)
                .ok_or_else(|| anyhow::anyhow!("block object has no map {name}"))
        };
        let stats = PerCpuHashMap::try_from(take("block_stats")?)?;
        let disks = BpfHashMap::try_from(take("block_disks")?)?;
        let events = RingBuf::try_from(take("block_events")?)?;
        let lost = LostCounters::take("block", ebpf)?;
        Ok((stats, disks, events, lost))
    }

    /// Create the read/write/flush entries of every disk with media before its
    /// first I/O. The kernel side creates a missing entry itself, but a per-CPU
    /// value of this size comes from the atomic per-CPU pool there, which can be
    /// empty for a moment (the I/O would then be counted as lost); from here
    /// the allocation may sleep. Called at attach and every interval, for
    /// disks that appear later.
    fn prepare_disks(&mut self) {
        let ncpus = match aya::util::nr_cpus() {
            Ok(n) => n,
            Err(_) => return,
        };
        for (name, major, minor) in self.sysfs.disks_with_media() {
            if self.prepared.contains(&(major, minor)) {
                continue;
            }
            let mut ok = true;
            for op in [abi::BLOCK_OP_READ, abi::BLOCK_OP_WRITE, abi::BLOCK_OP_FLUSH] {
                let key = block_key { major, minor, op };
                let zeroed = PerCpuValues::try_from(vec![block_stats::default(); ncpus]);
                let Ok(zeroed) = zeroed else { return };
                // BPF_NOEXIST: never reset an entry the kernel side already created.
                match self
                    .stats
                    .insert(key, zeroed, u64::from(aya_obj::generated::BPF_NOEXIST))
                {
                    Ok(()) => {}
                    Err(MapError::SyscallError(e))
                        if e.io_error.raw_os_error() == Some(libc::EEXIST) => {}
                    Err(_) => ok = false, // retried next interval
                }
            }
            if ok {
                self.names.insert((major, minor), name);
                self.prepared.insert((major, minor));
            }
        }
    }

    fn disk_name(&mut self, major: u32, minor: u32) -> String {
        let sysfs = &self.sysfs;
        self.names
            .entry((major, minor))
            .or_insert_with(|| {
                sysfs
                    .disk_name(major, minor)
                    .unwrap_or_else(|| format!("{major}:{minor}"))
            })
            .clone()
    }
}

impl Family for BlockProbe {
    fn attached(&self) -> &AttachedFamily {
        &self.family
    }

    /// Emit `slow_io` records for every event waiting in the ring buffer.
    fn drain_events(&mut self, clock: &Clock, out: &mut JsonWriter) -> io::Result<()> {
        let mut events = Vec::new();
        while let Some(item) = self.events.next() {
            if item.len() >= std::mem::size_of::<slow_io_event>() {
                // SAFETY: the ring buffer holds a slow_io_event written by block.bpf.c
                // (length checked); read_unaligned makes no alignment assumption.
                events.push(unsafe {
                    std::ptr::read_unaligned(item.as_ptr().cast::<slow_io_event>())
                });
            }
        }
        for e in events {
            let dev = self.disk_name(e.major, e.minor);
            let ts = clock.monotonic_to_rfc3339(e.ts_ns);
            out.emit("slow_io", &ts, &SlowIoRecord::from_event(&e, dev))?;
        }
        Ok(())
    }

    /// Emit one `block` record per (disk, op) that saw I/O in this interval or the
    /// one before (so the interval after a load ends shows it drained), or whose
    /// disk still has requests in flight.
    fn collect(&mut self, interval: Duration, ts: &str, out: &mut JsonWriter) -> io::Result<()> {
        self.prepare_disks();
        let mut inflight_now: HashMap<(u32, u32), i64> = HashMap::new();
        for item in self.disks.iter().flatten() {
            let (id, state) = item;
            inflight_now.insert(((id >> 32) as u32, id as u32), state.inflight);
        }
        let snapshot: Vec<_> = self.stats.iter().flatten().collect();
        let mut records = Vec::new();
        for (key, per_cpu) in snapshot {
            let series = self
                .series
                .entry((key.major, key.minor, key.op))
                .or_default();
            let counters = [
                per_cpu.iter().map(|s| s.requests).sum::<u64>(),
                per_cpu.iter().map(|s| s.bytes).sum(),
                per_cpu.iter().map(|s| s.bios).sum(),
                per_cpu.iter().map(|s| s.requeues).sum(),
                per_cpu.iter().map(|s| s.errors).sum(),
            ];
            let mut delta = [0u64; 5];
            for i in 0..5 {
                delta[i] = counters[i].wrapping_sub(series.counters[i]);
            }
            series.counters = counters;
            let total = series.total.advance(per_cpu.iter().map(|s| &s.total));
            let tag_wait = series.tag_wait.advance(per_cpu.iter().map(|s| &s.tag_wait));
            let queue = series.queue.advance(per_cpu.iter().map(|s| &s.queue));
            let device = series.device.advance(per_cpu.iter().map(|s| &s.device));
            let inflight = series.inflight.advance(per_cpu.iter().map(|s| &s.inflight));

            let active = delta.iter().any(|&d| d > 0)
                || [&total, &tag_wait, &queue, &device, &inflight]
                    .iter()
                    .any(|h| h.count() > 0);
            let now = inflight_now
                .get(&(key.major, key.minor))
                .copied()
                .unwrap_or(0);
            let emit = active || series.active_last_interval || now != 0;
            series.active_last_interval = active;
            if !emit {
                continue;
            }
            records.push((key, delta, total, tag_wait, queue, device, inflight, now));
        }
        for (key, delta, total, tag_wait, queue, device, inflight, now) in records {
            let dev = self.disk_name(key.major, key.minor);
            let record = BlockRecord {
                queue_limit: self.sysfs.queue_limits(&dev),
                dev,
                major: key.major,
                minor: key.minor,
                op: op_name(key.op),
                interval_ms: interval.as_millis() as u64,
                count: delta[0],
                bytes: delta[1],
                bios: delta[2],
                requeues: delta[3],
                errors: delta[4],
                latency_us: total.to_record(NS_TO_US),
                tag_wait_us: tag_wait.to_record(NS_TO_US),
                queue_us: queue.to_record(NS_TO_US),
                device_us: device.to_record(NS_TO_US),
                inflight: inflight.to_record(1.0),
                inflight_now: now,
                role: None,
            };
            out.emit("block", ts, &record)?;
        }
        Ok(())
    }

    fn lost(&mut self) -> Vec<(String, u64)> {
        self.lost.deltas(&self.family.ebpf)
    }
}
