//! `filters/process`: the process filters load and hold on this kernel, in
//! this mode. Two fio processes read the guest's disk, one of them in a
//! mount namespace and a cgroup of its own named as a docker container's;
//! a run with `--container`, `--pid` and `--comm` (each must match, so the
//! block and tcp objects load with every check of process_filter.bpf.h)
//! has slow_io of that process only. The semantics of each filter alone are
//! tests/filters.rs's and tests/containers.rs's.

use std::collections::BTreeMap;
use std::path::PathBuf;

use super::{Judge, Opts, Run};
use crate::fio::HeldFio;
use crate::of_type;

/// A cgroup named as docker names a container's (`docker-<64 hex>.scope`),
/// removed when dropped.
struct FakeContainer {
    id: String,
    dir: PathBuf,
}

impl FakeContainer {
    fn new() -> Result<Self, String> {
        if !std::path::Path::new("/sys/fs/cgroup/cgroup.procs").exists() {
            return Err("/sys/fs/cgroup is not a cgroup v2 hierarchy".into());
        }
        let id = format!("{:016x}", std::process::id()).repeat(4);
        let dir = PathBuf::from(format!("/sys/fs/cgroup/docker-{id}.scope"));
        std::fs::create_dir(&dir).map_err(|e| format!("mkdir {}: {e}", dir.display()))?;
        Ok(Self { id, dir })
    }

    fn enter(&self, pid: u32) -> Result<(), String> {
        std::fs::write(self.dir.join("cgroup.procs"), pid.to_string())
            .map_err(|e| format!("moving {pid} into {}: {e}", self.dir.display()))
    }
}

impl Drop for FakeContainer {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.dir);
    }
}

pub fn process(opts: &Opts, judge: &mut Judge) {
    let container = match FakeContainer::new() {
        Ok(c) => c,
        Err(e) => return judge.fail(e),
    };
    let mut watched = HeldFio::new("fio", &opts.disk, 2, true);
    let mut other = HeldFio::new("fio", &opts.disk, 2, false);
    if let Err(e) = container.enter(watched.pid()) {
        return judge.fail(e);
    }
    let pid = watched.pid().to_string();
    let filters = [
        "--container",
        &container.id[..12],
        "--pid",
        &pid,
        "--comm",
        "fio",
    ];
    // Every I/O slower than 1 µs is a slow_io: there are plenty of each.
    let run = match Run::start_with(
        opts,
        &["--interval", "1s", "--slow-io-ms", "0.001"],
        &filters,
    ) {
        Ok(run) => run,
        Err(e) => return judge.fail(e),
    };
    if !judge.families_attached(&run.start, &["block", "tcp"]) {
        return;
    }
    // The filters' code must load where the families load without it.
    let fell_back: Vec<String> = run.start["families"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|f| ["block", "tcp"].contains(&f["family"].as_str().unwrap_or_default()))
        .filter(|f| f.get("fallback_reason").is_some())
        .map(|f| f.to_string())
        .collect();
    if matches!(opts.mode, super::Mode::Auto)
        && !judge.expect(fell_back.is_empty(), || format!("fell back: {fell_back:?}"))
    {
        return;
    }
    watched.release();
    other.release();
    let fio = [watched.wait(), other.wait()]
        .into_iter()
        .collect::<Result<Vec<_>, _>>();
    std::thread::sleep(std::time::Duration::from_millis(2500));
    let records = match run.stop() {
        Ok(r) => r,
        Err(e) => return judge.fail(e),
    };
    if let Err(e) = fio {
        return judge.fail(e);
    }
    let mut by_pid: BTreeMap<u64, usize> = BTreeMap::new();
    for r in of_type(&records, "slow_io") {
        *by_pid.entry(r["pid"].as_u64().unwrap_or(0)).or_default() += 1;
    }
    judge.note(format!(
        "slow_io by submitter {by_pid:?}; fio {pid} watched, {} not",
        other.pid()
    ));
    let watched_pid = u64::from(watched.pid());
    judge.expect(by_pid.get(&watched_pid).is_some_and(|&n| n > 0), || {
        format!("no slow_io of the watched fio {watched_pid}")
    });
    judge.expect(by_pid.keys().all(|&p| p == watched_pid), || {
        format!("slow_io of other processes: {by_pid:?}")
    });
}
