//! The daemon as the kernel and /proc see it: its BPF maps and how full they
//! are, its resident memory and its CPU time.
//!
//! Its maps are found from its own file descriptors (/proc/PID/fdinfo of
//! each `anon_inode:bpf-map` has the map id): bpftool on this machine is
//! built without the pid iterator, so `bpftool prog/map show` carry no
//! `pids`, and another stalltrace (someone else's test) may be loaded at the
//! same time. The family of a map is that of the programs using it (their
//! ids are in the `start` record); a map the tcp and netdev objects share
//! carries both.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::process::Command;

use anyhow::{Context, bail};
use serde::de::IgnoredAny;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// How a map's occupancy is counted.
#[derive(Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "snake_case")]
pub enum Count {
    /// Hash and LRU hash maps: the entries a dump returns.
    Entries,
    /// Arrays of slots (slots.bpf.h): every index exists, the ones in use
    /// have a non-zero first word (the owner: a bio, a request, a disk).
    Slots,
    /// Not countable, and why.
    Not(String),
}

#[derive(Serialize, Clone, Debug)]
pub struct MapInfo {
    pub id: u64,
    /// "family/name" (bpftool names are cut at 15 characters).
    pub label: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub max_entries: u64,
    pub count: Count,
}

/// Arrays whose values start with an owner word that is zero when free (the
/// slot tables, the disk table, the completion hook's notes of requests it
/// found no slot for).
/// (Kernel map names are cut at 15 characters: `rq_unsettled_key` shows as `rq_unsettled_ke`.)
const SLOT_ARRAYS: &[&str] = &["bio_slots", "rq_slots", "block_disks", "rq_unsettled_ke"];

#[derive(Deserialize)]
struct Shown {
    id: u64,
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    name: String,
    max_entries: u64,
}

#[derive(Deserialize)]
struct Prog {
    id: u64,
    #[serde(default)]
    map_ids: Vec<u64>,
}

/// The maps process `pid` holds, labelled with the families (from `start`'s
/// probes) whose programs use them.
pub fn discover(pid: u32, start: &Value) -> anyhow::Result<Vec<MapInfo>> {
    let ids = held_map_ids(pid)?;
    if ids.is_empty() {
        bail!("stalltrace (pid {pid}) holds no BPF map");
    }
    let family_of_prog: BTreeMap<u64, String> = start["probes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| Some((p["program_id"].as_u64()?, p["family"].as_str()?.to_string())))
        .collect();
    let progs: Vec<Prog> = bpftool(&["prog", "show"])?;
    let mut families: BTreeMap<u64, BTreeSet<String>> = BTreeMap::new();
    for p in &progs {
        if let Some(f) = family_of_prog.get(&p.id) {
            for m in &p.map_ids {
                families.entry(*m).or_default().insert(f.clone());
            }
        }
    }
    let shown: Vec<Shown> = bpftool(&["map", "show"])?;
    let mut maps: Vec<MapInfo> = shown
        .into_iter()
        .filter(|m| ids.contains(&m.id))
        .map(|m| {
            // "unused": no attached program refers to it.
            let fam = families.get(&m.id).map_or("unused".to_string(), |f| {
                f.iter().cloned().collect::<Vec<_>>().join("+")
            });
            MapInfo {
                id: m.id,
                label: format!("{fam}/{}", m.name),
                count: how_to_count(&m.kind, &m.name),
                kind: m.kind,
                max_entries: m.max_entries,
            }
        })
        .collect();
    // Each object has its own lost_counts, scratch and .rodata: tell them apart.
    let labels: Vec<String> = maps.iter().map(|m| m.label.clone()).collect();
    for m in &mut maps {
        if labels.iter().filter(|l| **l == m.label).count() > 1 {
            m.label = format!("{}#{}", m.label, m.id);
        }
    }
    maps.sort_by(|a, b| a.label.cmp(&b.label));
    Ok(maps)
}

fn how_to_count(kind: &str, name: &str) -> Count {
    let not = |why: &str| Count::Not(why.to_string());
    match kind {
        "hash" | "lru_hash" | "percpu_hash" | "lru_percpu_hash" => Count::Entries,
        "array" if SLOT_ARRAYS.contains(&name) => Count::Slots,
        "array" if name.starts_with('.') => not("constants set at load"),
        "array" => not("fixed array: every index always exists (a zero or scratch value)"),
        "percpu_array" => not("per-CPU array: fixed size (scratch words or loss counters)"),
        "ringbuf" => not("ring buffer: sized in bytes, not entries; overflow is counted in `lost`"),
        "sk_storage" => {
            not("socket-local storage: freed with each socket; bpftool cannot iterate it")
        }
        other => Count::Not(format!("{other}: not counted")),
    }
}

/// Map ids behind process `pid`'s file descriptors.
fn held_map_ids(pid: u32) -> anyhow::Result<BTreeSet<u64>> {
    let dir = format!("/proc/{pid}/fd");
    let mut ids = BTreeSet::new();
    for e in fs::read_dir(&dir).with_context(|| format!("cannot list {dir}"))? {
        let e = e?;
        if fs::read_link(e.path()).is_ok_and(|l| l.to_string_lossy() == "anon_inode:bpf-map") {
            let info = fs::read_to_string(format!(
                "/proc/{pid}/fdinfo/{}",
                e.file_name().to_string_lossy()
            ))
            .unwrap_or_default();
            ids.extend(
                info.lines()
                    .find_map(|l| l.strip_prefix("map_id:"))
                    .and_then(|v| v.trim().parse::<u64>().ok()),
            );
        }
    }
    Ok(ids)
}

#[derive(Deserialize)]
struct SlotEntry {
    /// The value as bpftool prints it: one "0xNN" per byte.
    value: Vec<String>,
}

/// Entries in use of every countable map, by label; None where a dump failed.
pub fn occupancy(maps: &[MapInfo]) -> BTreeMap<String, Option<u64>> {
    maps.iter()
        .filter(|m| !matches!(m.count, Count::Not(_)))
        .map(|m| {
            let id = m.id.to_string();
            let args = ["map", "dump", "id", id.as_str()];
            let n = match m.count {
                Count::Entries => bpftool::<Vec<IgnoredAny>>(&args).map(|v| v.len() as u64),
                _ => bpftool::<Vec<SlotEntry>>(&args).map(|v| {
                    v.iter()
                        .filter(|e| e.value.iter().take(8).any(|b| b != "0x00"))
                        .count() as u64
                }),
            };
            if let Err(e) = &n {
                eprintln!("soak: cannot count {}: {e:#}", m.label);
            }
            (m.label.clone(), n.ok())
        })
        .collect()
}

fn bpftool<T: for<'de> Deserialize<'de>>(args: &[&str]) -> anyhow::Result<T> {
    let out = Command::new("bpftool")
        .arg("-j")
        .args(args)
        .output()
        .context("cannot run bpftool")?;
    if !out.status.success() {
        bail!(
            "bpftool {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    serde_json::from_slice(&out.stdout)
        .with_context(|| format!("cannot read bpftool {}'s JSON", args.join(" ")))
}

/// The daemon's memory and CPU so far.
pub struct Usage {
    pub rss_kib: u64,
    pub hwm_kib: u64,
    /// utime + stime, all threads, seconds.
    pub cpu_s: f64,
}

pub fn usage(pid: u32) -> anyhow::Result<Usage> {
    let status = fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("stalltrace (pid {pid}) is gone"))?;
    let stat = fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let kib = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
    };
    // A zombie has no memory lines: it has exited.
    let (Some(rss_kib), Some(hwm_kib)) = (kib("VmRSS:"), kib("VmHWM:")) else {
        bail!("stalltrace (pid {pid}) has exited");
    };
    let (user, system) =
        super::super::tracer::cpu_ticks(&stat).context("unexpected /proc/PID/stat")?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Ok(Usage {
        rss_kib,
        hwm_kib,
        cpu_s: (user + system) as f64 / hz,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_hashes_and_slot_arrays_only() {
        assert_eq!(how_to_count("lru_hash", "tcp_peers"), Count::Entries);
        assert_eq!(how_to_count("percpu_hash", "block_stats"), Count::Entries);
        assert_eq!(how_to_count("array", "rq_slots"), Count::Slots);
        assert!(matches!(how_to_count("array", ".rodata"), Count::Not(_)));
        assert!(matches!(
            how_to_count("percpu_array", "lost_counts"),
            Count::Not(_)
        ));
        assert!(matches!(
            how_to_count("sk_storage", "sock_owners"),
            Count::Not(_)
        ));
    }
}
