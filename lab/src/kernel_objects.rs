//! The eBPF objects, pins and mounts a stalltrace process can leave in the
//! kernel, read with bpftool and /proc, independently of stalltrace's code.
//!
//! Other stalltrace processes may run on the same kernel at the same time
//! (other test binaries, other people), so "left behind" means: an object of
//! stalltrace's names, created after a baseline, that no live process holds
//! (a program or link fd, a map fd) and, for a map, that no loaded program
//! uses. Pins and bpffs mounts are looked for by path.

use std::collections::HashSet;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::util::sh;

/// A loaded program: id, name (cut to 15 bytes by the kernel unless BTF names
/// it), and the maps it uses.
#[derive(Clone, Debug)]
pub struct Prog {
    pub id: u64,
    pub name: String,
    pub map_ids: Vec<u64>,
}

/// A map: id, name (cut to 15 bytes by the kernel) and type.
#[derive(Clone, Debug)]
pub struct Map {
    pub id: u64,
    pub name: String,
    pub kind: String,
}

fn bpftool_json(args: &[&str]) -> Vec<Value> {
    let mut all = vec!["--json"];
    all.extend_from_slice(args);
    let text = sh("bpftool", &all);
    match serde_json::from_str(&text) {
        Ok(Value::Array(items)) => items,
        _ => panic!("bpftool {args:?}: not a JSON array: {text}"),
    }
}

pub fn programs() -> Vec<Prog> {
    bpftool_json(&["prog", "show"])
        .iter()
        .map(|p| Prog {
            id: p["id"].as_u64().unwrap(),
            name: p["name"].as_str().unwrap_or("").to_string(),
            map_ids: p["map_ids"]
                .as_array()
                .map(|ids| ids.iter().filter_map(Value::as_u64).collect())
                .unwrap_or_default(),
        })
        .collect()
}

pub fn maps() -> Vec<Map> {
    bpftool_json(&["map", "show"])
        .iter()
        .map(|m| Map {
            id: m["id"].as_u64().unwrap(),
            name: m["name"].as_str().unwrap_or("").to_string(),
            kind: m["type"].as_str().unwrap_or("").to_string(),
        })
        .collect()
}

/// Entries in a map now (`bpftool map dump`).
pub fn map_entries(id: u64) -> usize {
    bpftool_json(&["map", "dump", "id", &id.to_string()]).len()
}

/// The keys of a map now, as bytes (`bpftool map dump`).
pub fn map_keys(id: u64) -> Vec<Vec<u8>> {
    bpftool_json(&["map", "dump", "id", &id.to_string()])
        .iter()
        .map(|e| {
            e["key"]
                .as_array()
                .expect("a key as bytes")
                .iter()
                .map(|b| {
                    let hex = b.as_str().unwrap().trim_start_matches("0x");
                    u8::from_str_radix(hex, 16).unwrap()
                })
                .collect()
        })
        .collect()
}

/// `bpftool map OP id ID key hex .. [value hex ..]`: whether bpftool succeeded.
fn map_op(op: &str, id: u64, key: &[u8], value: Option<&[u8]>) -> bool {
    let mut args = vec!["map".to_string(), op.into(), "id".into(), id.to_string()];
    for (what, bytes) in std::iter::once(("key", key)).chain(value.map(|v| ("value", v))) {
        args.extend([what.to_string(), "hex".into()]);
        args.extend(bytes.iter().map(|b| format!("{b:02x}")));
    }
    std::process::Command::new("bpftool")
        .args(&args)
        .stderr(std::process::Stdio::null())
        .status()
        .unwrap_or_else(|e| panic!("cannot run bpftool: {e}"))
        .success()
}

/// Writes `value` under `key` in map `id`: whether the kernel took it (a
/// full hash map refuses a new key).
pub fn map_update(id: u64, key: &[u8], value: &[u8]) -> bool {
    map_op("update", id, key, Some(value))
}

/// Deletes `key` from map `id`.
pub fn map_delete(id: u64, key: &[u8]) {
    assert!(
        map_op("delete", id, key, None),
        "bpftool map delete id {id} key {key:?} failed"
    );
}

/// Program and map ids held open by processes: program, link and map fds
/// (`prog_id:` / `map_id:` in /proc/PID/fdinfo). `pid`: one process; None: all.
#[derive(Debug, Default)]
pub struct Held {
    pub progs: HashSet<u64>,
    pub maps: HashSet<u64>,
}

pub fn held(pid: Option<u32>) -> Held {
    let mut held = Held::default();
    let procs: Vec<std::path::PathBuf> = match pid {
        Some(pid) => vec![Path::new("/proc").join(pid.to_string())],
        None => std::fs::read_dir("/proc")
            .map(|d| d.flatten().map(|e| e.path()).collect())
            .unwrap_or_default(),
    };
    for proc in procs {
        let Ok(fds) = std::fs::read_dir(proc.join("fdinfo")) else {
            continue;
        };
        for fd in fds.flatten() {
            let text = std::fs::read_to_string(fd.path()).unwrap_or_default();
            for line in text.lines() {
                let id = |v: &str| v.trim().parse::<u64>().ok();
                if let Some(v) = line.strip_prefix("prog_id:").and_then(id) {
                    held.progs.insert(v);
                } else if let Some(v) = line.strip_prefix("map_id:").and_then(id) {
                    held.maps.insert(v);
                }
            }
        }
    }
    held
}

/// The maps a process holds, with their names and types.
pub fn maps_of(pid: u32) -> Vec<Map> {
    let ids = held(Some(pid)).maps;
    maps().into_iter().filter(|m| ids.contains(&m.id)).collect()
}

/// How many perf-event links (kprobes, uprobes) run a program of process
/// `pid` named one of `names` now.
pub fn perf_event_links_of(pid: u32, names: &[&str]) -> usize {
    let held = held(Some(pid)).progs;
    let wanted: HashSet<u64> = programs()
        .into_iter()
        .filter(|p| held.contains(&p.id) && names.iter().any(|n| p.name == n[..n.len().min(15)]))
        .map(|p| p.id)
        .collect();
    bpftool_json(&["link", "show"])
        .iter()
        .filter(|l| {
            l["type"] == "perf_event"
                && l["prog_id"].as_u64().is_some_and(|id| wanted.contains(&id))
        })
        .count()
}

/// stalltrace's programs are `on_<hook>` or `maybe_<hook>` (ebpf/*.bpf.c).
pub fn is_stalltrace_program(name: &str) -> bool {
    name.starts_with("on_") || name.starts_with("maybe_")
}

/// Map names as the kernel shows them: every `} NAME SEC(".maps")` of the
/// eBPF sources (read from the tree, so a new map is covered), cut to 15
/// bytes, and the global-data maps aya creates.
pub fn stalltrace_map_names() -> HashSet<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../ebpf");
    let mut names: HashSet<String> = [".rodata", ".data", ".bss"]
        .into_iter()
        .map(String::from)
        .collect();
    for dir in [root.clone(), root.join("include")] {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
            for line in text.lines() {
                let Some(before) = line.trim().strip_suffix("SEC(\".maps\");") else {
                    continue;
                };
                if let Some(name) = before.trim().strip_prefix('}') {
                    let name = name.trim();
                    names.insert(name[..name.len().min(15)].to_string());
                }
            }
        }
    }
    assert!(
        names.len() > 10,
        "found only {names:?} in {}",
        root.display()
    );
    names
}

/// The highest program and map ids now: objects made later have larger ids.
#[derive(Clone, Copy, Debug)]
pub struct Baseline {
    pub prog: u64,
    pub map: u64,
}

pub fn baseline() -> Baseline {
    Baseline {
        prog: programs().iter().map(|p| p.id).max().unwrap_or(0),
        map: maps().iter().map(|m| m.id).max().unwrap_or(0),
    }
}

/// stalltrace objects made since the baseline that nothing keeps alive.
#[derive(Debug, Default)]
pub struct Leftovers {
    pub programs: Vec<(u64, String)>,
    pub maps: Vec<(u64, String)>,
}

impl Leftovers {
    pub fn is_empty(&self) -> bool {
        self.programs.is_empty() && self.maps.is_empty()
    }
}

pub fn leftovers(since: Baseline, map_names: &HashSet<String>) -> Leftovers {
    let progs = programs();
    let maps = maps();
    // Read last: an fd opened after the lists were taken only hides nothing.
    let held = held(None);
    let used: HashSet<u64> = progs.iter().flat_map(|p| p.map_ids.clone()).collect();
    Leftovers {
        programs: progs
            .into_iter()
            .filter(|p| p.id > since.prog && is_stalltrace_program(&p.name))
            .filter(|p| !held.progs.contains(&p.id))
            .map(|p| (p.id, p.name))
            .collect(),
        maps: maps
            .into_iter()
            .filter(|m| m.id > since.map && map_names.contains(&m.name))
            .filter(|m| !held.maps.contains(&m.id) && !used.contains(&m.id))
            .map(|m| (m.id, m.name))
            .collect(),
    }
}

/// Wait until nothing is left (the kernel frees a program after an RCU grace
/// period and a map from a work queue once the last reference goes): how
/// long it took, or what was still there after `within`.
pub fn await_no_leftovers(
    since: Baseline,
    map_names: &HashSet<String>,
    within: Duration,
) -> Result<Duration, Leftovers> {
    let start = Instant::now();
    loop {
        let left = leftovers(since, map_names);
        if left.is_empty() {
            return Ok(start.elapsed());
        }
        if start.elapsed() > within {
            return Err(left);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Entries named `stalltrace-*` in a bpffs directory (none when it does not exist).
pub fn stalltrace_pins(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("stalltrace-"))
                .collect()
        })
        .unwrap_or_default()
}

/// bpffs mounts in a mountinfo file, as "mount point (mount id)".
pub fn bpf_mounts(mountinfo: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(mountinfo)
        .unwrap_or_else(|e| panic!("{}: {e}", mountinfo.display()));
    text.lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let dash = fields.iter().position(|f| *f == "-")?;
            if fields.get(dash + 1) != Some(&"bpf") {
                return None;
            }
            Some(format!("{} ({})", fields.get(4)?, fields.first()?))
        })
        .collect()
}

const BPF_FS: &str = "/sys/fs/bpf";
const BPF_FS_MAGIC: i64 = 0xcafe4a11;

/// Whether /sys/fs/bpf is a bpffs, as the calling thread sees it.
pub fn bpffs_mounted() -> bool {
    // SAFETY: statfs writes into `fs`, valid for writes; all-zero is a valid statfs.
    unsafe {
        let mut fs: libc::statfs = std::mem::zeroed();
        libc::statfs(c"/sys/fs/bpf".as_ptr(), &mut fs) == 0 && fs.f_type as i64 == BPF_FS_MAGIC
    }
}

/// Run `f` on a thread in a mount namespace of its own (a slave of the
/// host's: nothing done in it reaches the host) where /sys/fs/bpf is a fresh
/// bpffs (`bpffs`) or no bpffs at all, whatever the host has. Processes the
/// thread starts inherit that namespace, so `f` can run stalltrace as on a
/// host with or without systemd's bpffs. The namespace, and the bpffs with
/// whatever is pinned in it, goes away when the thread and its children end.
pub fn in_mount_namespace<T: Send>(bpffs: bool, f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|s| {
        s.spawn(|| {
            // SAFETY: plain syscalls on constant strings, for this thread only
            // (unshare(CLONE_NEWNS) gives the calling thread its own fs state).
            unsafe {
                assert_eq!(
                    libc::unshare(libc::CLONE_NEWNS),
                    0,
                    "unshare(CLONE_NEWNS): {}",
                    std::io::Error::last_os_error()
                );
                let rc = libc::mount(
                    c"none".as_ptr(),
                    c"/".as_ptr(),
                    std::ptr::null(),
                    libc::MS_REC | libc::MS_SLAVE,
                    std::ptr::null(),
                );
                assert_eq!(
                    rc,
                    0,
                    "making / a slave: {}",
                    std::io::Error::last_os_error()
                );
                while bpffs_mounted() {
                    let rc = libc::umount2(c"/sys/fs/bpf".as_ptr(), libc::MNT_DETACH);
                    assert_eq!(
                        rc,
                        0,
                        "umount {BPF_FS}: {}",
                        std::io::Error::last_os_error()
                    );
                }
                if bpffs {
                    let rc = libc::mount(
                        c"bpf".as_ptr(),
                        c"/sys/fs/bpf".as_ptr(),
                        c"bpf".as_ptr(),
                        0,
                        std::ptr::null(),
                    );
                    assert_eq!(rc, 0, "mount bpffs: {}", std::io::Error::last_os_error());
                }
            }
            assert_eq!(bpffs_mounted(), bpffs);
            f()
        })
        .join()
        .unwrap_or_else(|e| std::panic::resume_unwind(e))
    })
}
