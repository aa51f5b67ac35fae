//! Block family: attaches `ebpf/block.bpf.c`, turns its per-CPU aggregates into
//! one `block` record per disk and op per interval, and its ring buffer into
//! `slow_io` records.

pub mod fast;
pub mod interval;
pub mod prepare;
pub mod reconcile;
pub mod settle;
pub mod stamps;
pub mod sweep;
pub mod sysfs;

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::io;
use std::path::Path;
use std::time::{Duration, Instant};

use aya::Btf;
use aya::maps::{Array, HashMap as BpfHashMap, MapData, PerCpuArray, PerCpuHashMap, RingBuf};

use crate::abi::{
    self, bio_slot, block_disk, block_key, block_rq_slot, block_stats, slow_io_event,
};
use crate::error::UserError;
use crate::host::container_lookup;
use crate::host::process_filter::ProcessFilter;
use crate::output::JsonWriter;
use crate::probes::lost::LostCounters;
use crate::probes::{self, AttachedFamily, Ctx, Family, FamilyFailure, ModeChoice};
use crate::records::block::{BlockOp, BlockRecord, SlowIoRecord};
use fast::FastDisks;
use interval::{Interval, Series};
use reconcile::Settled;
use settle::SettlePass;
use sysfs::Sysfs;

const NS_TO_US: f64 = 1e-3;

/// `lost` source: request completions the kernel did not run the completion
/// hook for (docs/records.md).
pub const KERNEL_SKIPPED: &str = "block.kernel_skipped";

/// The maps the daemon reads.
struct Maps {
    stats: PerCpuHashMap<MapData, block_key, block_stats>,
    stats_fast: PerCpuArray<MapData, block_stats>,
    disks: Array<MapData, block_disk>,
    bio_slots: Array<MapData, bio_slot>,
    rq_slots: Array<MapData, block_rq_slot>,
    unsettled_keys: Array<MapData, u64>,
    unsettled_times: Array<MapData, u64>,
    unsettled: BpfHashMap<MapData, block_key, u64>,
    events: RingBuf<MapData>,
    lost: LostCounters,
}

pub struct BlockOptions {
    /// Send I/Os slower than this as `slow_io` records; `None` sends none.
    pub slow_io: Option<Duration>,
    pub mode: ModeChoice,
    /// `--disk`: only these disks (major, first minor) are traced; empty: every disk.
    pub disks: Vec<(u32, u32)>,
    /// `--pid`, `--comm`, `--container`: only these processes' I/O
    /// sends slow_io events; the histograms stay the whole disk's.
    pub processes: ProcessFilter,
}

/// `--disk` specs as whole disks (major, first minor), each once; a spec
/// that names no disk, or more disks than the kernel's table holds, is an
/// error before anything attaches.
pub fn resolve_disks(specs: &[String]) -> Result<Vec<(u32, u32)>, UserError> {
    let sysfs = Sysfs::default();
    let mut disks: Vec<(u32, u32)> = Vec::new();
    for spec in specs {
        let (_, major, minor) = sysfs.whole_disk(spec).ok_or_else(|| {
            UserError::new(
                format!("--disk {spec}: no such disk in /sys/class/block"),
                "name a disk as lsblk lists it (sda, nvme0n1), a /dev path, or MAJOR:MINOR",
            )
        })?;
        if !disks.contains(&(major, minor)) {
            disks.push((major, minor));
        }
    }
    let max = abi::BLOCK_SELECTED_DISKS_MAX as usize;
    if disks.len() > max {
        return Err(UserError::new(
            format!(
                "--disk names {} disks; at most {max} can be selected",
                disks.len()
            ),
            "name fewer disks, or none to trace every disk",
        ));
    }
    Ok(disks)
}

pub struct BlockProbe {
    family: AttachedFamily,
    maps: Maps,
    unsettled_seen: HashMap<(u32, u32, u32), u64>,
    /// Completions the kernel did not run the hook for, settled this interval.
    kernel_skipped: u64,
    series: BTreeMap<(u32, u32, u32), Series>,
    names: HashMap<(u32, u32), String>,
    /// `slow_io`'s submitters' containers.
    containers: container_lookup::Cache,
    sysfs: Sysfs,
    /// `--disk`: the only disks traced; None: every disk.
    selected: Option<HashSet<(u32, u32)>>,
    /// Disks whose common (disk, op) entries exist in `block_stats`.
    prepared: HashSet<(u32, u32)>,
    /// When stale slots were last freed (sweep.rs).
    last_sweep: Instant,
    /// Ends, once an interval, the lives of requests the kernel freed unseen (settle.rs).
    settle: Option<SettlePass>,
    /// The disks whose statistics are in `block_stats_fast` (fast.rs).
    fast: FastDisks,
}

/// The load-time globals of a run with `slow_io` (`check` loads a default run's).
/// `disks`: how many disks --disk names (0: every disk is traced).
pub fn load_globals(slow_io: Option<Duration>, disks: usize) -> [(&'static str, u64); 4] {
    [
        ("slow_io_ns", slow_io.map_or(0, |d| d.as_nanos() as u64)),
        // Our own I/O (e.g. the --out stream on a traced disk) sends no slow_io events.
        ("self_tgid", u64::from(std::process::id())),
        ("disk_filter", disks as u64),
        ("fault_skip_writes", u64::from(fault_skip_writes())),
    ]
}

/// Fault injection for the tests of skipped completions:
/// `STALLTRACE_FAULT_SKIP_COMPLETIONS=writes` makes the completion hook do
/// nothing for every write, as when the kernel does not run it. Never set in
/// production: said on stderr whenever it is on, so that nobody runs with
/// writes untimed unawares.
fn fault_skip_writes() -> bool {
    let on = std::env::var("STALLTRACE_FAULT_SKIP_COMPLETIONS").is_ok_and(|v| v == "writes");
    if on {
        eprintln!(
            "stalltrace: STALLTRACE_FAULT_SKIP_COMPLETIONS=writes: the block family skips every \
             write's completion (fault injection for tests); unset it to measure writes"
        );
    }
    on
}

impl BlockProbe {
    pub fn attach(opts: &BlockOptions, btf: &Btf) -> Result<Self, FamilyFailure> {
        let mut globals = load_globals(opts.slow_io, opts.disks.len()).to_vec();
        globals.extend(probes::process_filter::load_globals(&opts.processes));
        let selected: Option<HashSet<(u32, u32)>> =
            (!opts.disks.is_empty()).then(|| opts.disks.iter().copied().collect());
        // The disks present now get their entries before any hook can run.
        let fast = RefCell::new(FastDisks::choose(&Sysfs::default(), |disk| {
            selected.as_ref().is_none_or(|s| s.contains(disk))
        }));
        let prepare = |ebpf: &mut aya::Ebpf| {
            prepare::before_attach(
                ebpf,
                btf,
                &opts.processes,
                selected.as_ref(),
                &mut fast.borrow_mut(),
            )
        };
        let max_entries = [(fast::MAP, fast.borrow().entries())];
        let setup = probes::Setup {
            globals: &globals,
            before_attach: Some(&prepare),
            max_entries: &max_entries,
        };
        let mut family = probes::attach_family(probes::embedded("block"), opts.mode, &setup, btf)?;
        let taken = Self::take_maps(&mut family);
        match taken {
            Ok(maps) => {
                let settle = SettlePass::of(&family);
                let mut probe = Self {
                    family,
                    maps,
                    unsettled_seen: HashMap::new(),
                    kernel_skipped: 0,
                    series: BTreeMap::new(),
                    names: HashMap::new(),
                    containers: container_lookup::Cache::default(),
                    sysfs: Sysfs::default(),
                    selected,
                    prepared: HashSet::new(),
                    last_sweep: Instant::now(),
                    settle,
                    fast: fast.into_inner(),
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

    fn take_maps(family: &mut AttachedFamily) -> anyhow::Result<Maps> {
        let ebpf = &mut family.ebpf;
        Ok(Maps {
            stats: probes::take_map(ebpf, "block_stats")?,
            stats_fast: probes::take_map(ebpf, fast::MAP)?,
            disks: probes::take_map(ebpf, "block_disks")?,
            bio_slots: probes::take_map(ebpf, "bio_slots")?,
            rq_slots: probes::take_map(ebpf, "rq_slots")?,
            unsettled_keys: probes::take_map(ebpf, "rq_unsettled_key")?,
            unsettled_times: probes::take_map(ebpf, "rq_unsettled_ns")?,
            unsettled: probes::take_map(ebpf, "block_unsettled")?,
            events: probes::take_map(ebpf, "block_events")?,
            lost: LostCounters::take("block", ebpf)?,
        })
    }

    /// Create the read/write/flush entries of every disk with media before its
    /// first I/O. The kernel side creates a missing entry itself, but a per-CPU
    /// value of this size comes from the atomic per-CPU pool there, which can be
    /// empty for a moment (the I/O would then be counted as lost); from here
    /// the allocation may sleep. Called before the programs attach (so the
    /// disks present at start never lose their first I/Os), then at every
    /// interval for disks that appear later.
    /// Returns the disks with media present now.
    fn prepare_disks(&mut self) -> HashSet<(u32, u32)> {
        let mut present = HashSet::new();
        for (name, major, minor) in self.sysfs.disks_with_media() {
            if self
                .selected
                .as_ref()
                .is_some_and(|s| !s.contains(&(major, minor)))
            {
                continue;
            }
            present.insert((major, minor));
            let fast = self.fast.has((major, minor));
            if self.prepared.contains(&(major, minor))
                || (!fast && !prepare::prepare_disk(&mut self.maps.stats, major, minor))
            {
                continue; // done already, or retried next interval
            }
            self.names.insert((major, minor), name);
            self.prepared.insert((major, minor));
        }
        present
    }

    /// Forget the disks in neither `present` nor `in_stream` (gone or without
    /// media, and with nothing left to say: their last records are written,
    /// and what was left in flight on them was settled before them), here and
    /// in the kernel's tables, so that disks created and deleted by the
    /// thousand never fill them (sweep.rs).
    fn forget_gone_disks(
        &mut self,
        present: &HashSet<(u32, u32)>,
        in_stream: &HashSet<(u32, u32)>,
    ) {
        let known = self.series.keys().map(|&(major, minor, _)| (major, minor));
        let gone: Vec<(u32, u32)> = sweep::gone(known, present)
            .into_iter()
            .filter(|d| !in_stream.contains(d))
            .collect();
        if gone.is_empty() {
            return;
        }
        // Looked at again: a loop device detached and attached again since
        // `present` was read has the kernel writing its entries already, and
        // zeroing them would lose what it wrote.
        let back: HashSet<(u32, u32)> = self
            .sysfs
            .disks_with_media()
            .into_iter()
            .map(|(_, major, minor)| (major, minor))
            .collect();
        for disk in gone.into_iter().filter(|d| !back.contains(d)) {
            let index = sweep::disk_index(&self.maps.disks, sweep::disk_id(disk));
            sweep::forget_disk(
                &mut self.maps.stats,
                &mut self.maps.unsettled,
                &mut self.maps.disks,
                disk,
                index,
            );
            self.fast.forget(&mut self.maps.stats_fast, disk);
            self.series
                .retain(|&(major, minor, _), _| (major, minor) != disk);
            self.unsettled_seen
                .retain(|&(major, minor, _), _| (major, minor) != disk);
            self.names.remove(&disk);
            self.prepared.remove(&disk);
        }
    }

    /// Free stale slots once per SWEEP_EVERY (sweep.rs).
    fn sweep_stale_slots(&mut self) {
        if self.last_sweep.elapsed() < sweep::SWEEP_EVERY {
            return;
        }
        self.last_sweep = Instant::now();
        let now_ns = crate::host::clock::monotonic_ns();
        sweep::sweep(
            &mut self.maps.bio_slots,
            &mut self.maps.rq_slots,
            &mut self.maps.unsettled_keys,
            &mut self.maps.unsettled_times,
            now_ns,
        );
    }

    /// Each disk's in-flight gauge, after settling the requests of idle disks
    /// whose completion the hooks never settled (see reconcile.rs) when the
    /// settle pass is not there to settle them request by request; a disk that
    /// is gone (not in `present`, and not in sysfs now) has nothing in flight either. Returns the
    /// gauges and what was settled by (major, minor, op).
    #[allow(clippy::type_complexity)]
    fn inflight_after_settling(
        &mut self,
        busy: &HashSet<(u32, u32)>,
        present: &HashSet<(u32, u32)>,
    ) -> (HashMap<(u32, u32), i64>, HashMap<(u32, u32, u32), Settled>) {
        let mut gauges = HashMap::new();
        let mut settled = HashMap::new();
        let mut unsettled = None;
        let table: Vec<(u32, block_disk)> = self
            .maps
            .disks
            .iter()
            .enumerate()
            .filter_map(|(i, d)| d.ok().map(|d| (i as u32, d)))
            .filter(|(_, d)| d.id != 0)
            .collect();
        for (index, disk) in table {
            let key = ((disk.id >> 32) as u32, disk.id as u32);
            let mut inflight = disk.inflight;
            if inflight > 0 && !busy.contains(&key) {
                let name = self.disk_name(key.0, key.1);
                // Gone: not listed at the start of this interval, and not there now
                // (a disk made since, already with a request in flight, is not gone).
                let gone = !present.contains(&key) && self.sysfs.disk_name(key.0, key.1).is_none();
                // With the settle pass, only a gone disk: the idle test is the
                // weaker one (a disk whose completions the kernel all skipped for
                // an interval looks idle to it, and its gauge would be zeroed
                // under requests still in flight).
                let idle = self.settle.is_none() && reconcile::kernel_says_idle(&self.sysfs, &name);
                if gone || idle {
                    let unsettled = unsettled.get_or_insert_with(|| {
                        reconcile::unsettled(&self.maps.unsettled_keys, &self.maps.unsettled_times)
                    });
                    for (op, n) in reconcile::settle(
                        &mut self.maps.rq_slots,
                        &mut self.maps.disks,
                        unsettled,
                        index,
                        disk.id,
                    ) {
                        settled.insert((key.0, key.1, op), n);
                    }
                    inflight = 0;
                }
            }
            gauges.insert(key, inflight);
        }
        (gauges, settled)
    }

    /// Every (disk, op)'s per-CPU running totals, from `block_stats` and the
    /// fast disks' array (fast.rs), summed where a (disk, op) is in both.
    fn statistics(&self) -> Vec<(block_key, Vec<block_stats>)> {
        let mut all: BTreeMap<(u32, u32, u32), (block_key, Vec<block_stats>)> = BTreeMap::new();
        let hashed = self.maps.stats.iter().flatten();
        let hashed = hashed.map(|(key, values)| (key, values.iter().copied().collect()));
        for (key, per_cpu) in hashed.chain(self.fast.read(&self.maps.stats_fast)) {
            match all.get_mut(&(key.major, key.minor, key.op)) {
                Some((_, sum)) => fast::merge(sum, &per_cpu),
                None => {
                    all.insert((key.major, key.minor, key.op), (key, per_cpu));
                }
            }
        }
        all.into_values().collect()
    }

    /// Per (disk, op): completions the hook left unsettled, found out since the last call.
    fn unsettled_deltas(&mut self) -> HashMap<(u32, u32, u32), u64> {
        let mut deltas = HashMap::new();
        for (key, total) in self.maps.unsettled.iter().flatten() {
            let id = (key.major, key.minor, key.op);
            let seen = self.unsettled_seen.entry(id).or_default();
            if total != *seen {
                deltas.insert(id, total.wrapping_sub(*seen));
            }
            *seen = total;
        }
        deltas
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
    fn drain_events(&mut self, ctx: &mut Ctx, out: &mut JsonWriter) -> io::Result<()> {
        for e in probes::ring::drain::<slow_io_event>(&mut self.maps.events) {
            let dev = self.disk_name(e.major, e.minor);
            let ts = ctx.clock.monotonic_to_rfc3339(e.ts_ns);
            let mut record = SlowIoRecord::from_event(&e, dev);
            if let Some(sql) = ctx.sql.as_deref_mut() {
                if sql.tag_process(e.tgid).is_none() {
                    // A `sqlservr` younger than the last discovery: look again.
                    sql.missed(Some(e.tgid), &ts);
                }
                let disk = (e.major, e.minor);
                record.file = sql.file_at(disk, e.sector).map(|p| p.display().to_string());
                record.sql = sql.tag_process(e.tgid);
            }
            record.container = self.containers.of_pid(Path::new("/proc"), e.tgid);
            out.emit(&ts, &record)?;
        }
        Ok(())
    }

    /// Emit one `block` record per (disk, op) that saw I/O in this interval or the
    /// one before (so the interval after a load ends shows it drained), or whose
    /// disk still has requests in flight.
    fn collect(
        &mut self,
        interval: Duration,
        ts: &str,
        ctx: &mut Ctx,
        out: &mut JsonWriter,
    ) -> io::Result<()> {
        let present = self.prepare_disks();
        // First, so that what it settles is in this interval's counts and gauges.
        if let Some(settle) = &self.settle
            && let Err(e) = settle.run(&self.family.ebpf)
        {
            // Said once, then left off: what it settles is then settled at idle (reconcile.rs).
            eprintln!(
                "stalltrace: block: running {} failed ({e}); it is off for the rest of the run",
                settle::HOOK
            );
            self.settle = None;
        }
        let intervals: Vec<(block_key, Interval)> = self
            .statistics()
            .into_iter()
            .map(|(key, per_cpu)| {
                let series = self
                    .series
                    .entry((key.major, key.minor, key.op))
                    .or_default();
                (key, series.advance(&per_cpu))
            })
            .collect();
        let busy: HashSet<(u32, u32)> = intervals
            .iter()
            .filter(|(_, i)| i.did_io())
            .map(|(k, _)| (k.major, k.minor))
            .collect();
        let (inflight_now, settled) = self.inflight_after_settling(&busy, &present);
        let unsettled = self.unsettled_deltas();
        let mut in_stream = HashSet::new();
        let intervals: Vec<_> = intervals
            .into_iter()
            .map(|(key, iv)| {
                let id = (key.major, key.minor, key.op);
                let idle = settled.get(&id).copied().unwrap_or_default();
                // Completions the hook did not settle are completions all the same
                // (the kernel counts them): in `count`, without histogram samples.
                let skipped = iv.skipped + idle.skipped;
                let unsettled = unsettled.get(&id).copied().unwrap_or(0) + idle.unsettled;
                let active = iv.is_active() || skipped + unsettled > 0;
                (key, iv, skipped, unsettled, active)
            })
            .collect();
        // An op with no I/O says nothing, but a disk's in-flight gauge must be
        // said while requests are in flight: by its ops that speak anyway, or
        // by one of its idle ones when none does (a disk that stopped
        // completing what it was given).
        let speaking: HashSet<(u32, u32)> = intervals
            .iter()
            .filter(|(key, _, _, _, active)| {
                *active || self.series[&(key.major, key.minor, key.op)].active_last_interval
            })
            .map(|(key, ..)| (key.major, key.minor))
            .collect();
        let mut gauge_said = HashSet::new();

        for (key, iv, skipped, unsettled, active) in intervals {
            let disk = (key.major, key.minor);
            let now = inflight_now.get(&disk).copied().unwrap_or(0);
            self.kernel_skipped += skipped;
            let series = self
                .series
                .get_mut(&(key.major, key.minor, key.op))
                .expect("advanced above");
            let says_gauge = now != 0 && !speaking.contains(&disk) && gauge_said.insert(disk);
            let emit = active || series.active_last_interval || says_gauge;
            series.active_last_interval = active;
            if !emit {
                continue;
            }
            in_stream.insert((key.major, key.minor));
            let dev = self.disk_name(key.major, key.minor);
            let record = BlockRecord {
                queue_limit: self.sysfs.queue_limits(&dev),
                dev,
                major: key.major,
                minor: key.minor,
                op: BlockOp::from_kernel(key.op),
                interval_ms: interval.as_millis() as u64,
                count: iv.requests + skipped + unsettled,
                bytes: iv.bytes,
                bios: iv.bios,
                requeues: iv.requeues,
                errors: iv.errors,
                completions_unseen: unsettled,
                latency_us: iv.total.to_record(NS_TO_US),
                tag_wait_us: iv.tag_wait.to_record(NS_TO_US),
                queue_us: iv.queue.to_record(NS_TO_US),
                device_us: iv.device.to_record(NS_TO_US),
                inflight: iv.inflight.to_record(1.0),
                inflight_now: now,
                role: ctx
                    .sql
                    .as_deref()
                    .and_then(|sql| sql.disk_role((key.major, key.minor)))
                    .map(str::to_string),
            };
            out.emit(ts, &record)?;
        }
        self.forget_gone_disks(&present, &in_stream);
        self.sweep_stale_slots();
        Ok(())
    }

    fn lost(&mut self) -> Vec<(String, u64)> {
        let mut lost = self.maps.lost.deltas(&self.family.ebpf);
        // Not a kernel-side drop counter: collect() found these settling requests.
        let skipped = std::mem::take(&mut self.kernel_skipped);
        if skipped > 0 {
            lost.push((KERNEL_SKIPPED.to_string(), skipped));
        }
        lost
    }
}
