//! Compiling the floor's C and holding its programs attached.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::thread::sleep;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use aya::programs::{BtfTracePoint, FEntry, KProbe, Program, RawTracePoint};
use aya::{Btf, Ebpf};

use super::{AttachPoint, Kind, c_source, program_names};
use crate::bench::peers::PeerProgram;
use crate::bench::tracer::Usage;
use crate::bench::tracer::programs::{Counter, Snapshot};
use crate::util;

/// Seen here: 10–50 ms from the last descriptor closing to the program gone.
const GONE_WITHIN: Duration = Duration::from_secs(5);

/// The floor for some attach points, compiled: its C and its object file.
pub struct Object {
    pub points: Vec<AttachPoint>,
    pub source: String,
    path: PathBuf,
}

impl Object {
    /// Generate the C for `points` and compile it into `dir` with clang, with
    /// the flags and headers the daemon's programs are built with
    /// (userspace/build.rs; `CLANG` names another clang).
    pub fn compile(points: &[AttachPoint], dir: &Path) -> anyhow::Result<Self> {
        if points.is_empty() {
            bail!("no hook to put a floor under: the daemon reported none attached");
        }
        let source = c_source(points);
        let src = dir.join("floor.bpf.c");
        let path = dir.join("floor.bpf.o");
        std::fs::write(&src, &source).with_context(|| format!("cannot write {}", src.display()))?;
        let clang = std::env::var("CLANG").unwrap_or_else(|_| "clang".into());
        let out = Command::new(&clang)
            .args(["-target", "bpf", "-D__TARGET_ARCH_x86", "-O2", "-g"])
            .args(["-Wall", "-Werror", "-mcpu=v3"])
            .arg("-I")
            .arg(util::workspace_root().join("ebpf/include"))
            .arg("-c")
            .arg(&src)
            .arg("-o")
            .arg(&path)
            .output()
            .with_context(|| format!("cannot run {clang}: install clang (`cargo xtask setup`)"))?;
        if !out.status.success() {
            bail!(
                "{clang} failed on the floor's C ({}): {}",
                src.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(Object {
            points: points.to_vec(),
            source,
            path,
        })
    }
}

#[cfg(test)]
impl Object {
    /// Its C for `points`, never compiled: what results and render read.
    pub fn uncompiled(points: &[AttachPoint]) -> Self {
        Object {
            points: points.to_vec(),
            source: c_source(points),
            path: PathBuf::new(),
        }
    }
}

/// The floor's programs, loaded and attached by this process. Dropping it
/// detaches and unloads them; so does this process's death, as the kernel
/// closes its descriptors.
pub struct Floor {
    ebpf: Ebpf,
    /// Each program's kernel id and the section it attached at.
    programs: Vec<(u64, String)>,
}

impl Floor {
    /// Load and attach every program of `object`; an error names the hook
    /// and carries the kernel's (the verifier's) reason. Whatever attached
    /// before a failure is detached again as the half-made floor drops.
    pub fn attach(object: &Object) -> anyhow::Result<Self> {
        let ebpf = Ebpf::load_file(&object.path)
            .with_context(|| format!("cannot load the floor ({})", object.path.display()))?;
        let btf = Btf::from_sys_fs().context("cannot read the kernel's BTF")?;
        let mut floor = Floor {
            ebpf,
            programs: Vec::new(),
        };
        for (point, name) in object.points.iter().zip(program_names(&object.points)) {
            let id = floor.attach_one(point, &name, &btf).with_context(|| {
                format!("floor: cannot attach {} ({})", point.section(), point.hook)
            })?;
            floor.programs.push((id, point.section()));
        }
        Ok(floor)
    }

    fn attach_one(&mut self, point: &AttachPoint, name: &str, btf: &Btf) -> anyhow::Result<u64> {
        let program = self
            .ebpf
            .program_mut(name)
            .with_context(|| format!("program {name} missing from the object"))?;
        let target = point.target.as_str();
        match point.kind {
            Kind::TpBtf => {
                let p: &mut BtfTracePoint = program.try_into()?;
                p.load(target, btf)?;
                p.attach()?;
            }
            Kind::RawTp => {
                let p: &mut RawTracePoint = program.try_into()?;
                p.load()?;
                p.attach(target)?;
            }
            Kind::Fentry => {
                let p: &mut FEntry = program.try_into()?;
                p.load(target, btf)?;
                p.attach()?;
            }
            Kind::Kprobe => {
                let p: &mut KProbe = program.try_into()?;
                p.load()?;
                p.attach(target, 0)?;
            }
        }
        Ok(u64::from(program.info()?.id()))
    }

    /// Detach and unload every program, and wait until the kernel has let
    /// them go: it frees them a few ms after their last descriptor closes
    /// (after an RCU grace period), and until then the next block's check
    /// for a quiet host would take them for someone else's hooks.
    pub fn detach(self) -> anyhow::Result<()> {
        let ids = self.prog_ids();
        drop(self);
        let began = Instant::now();
        loop {
            let left = Snapshot::take(&ids)?;
            if left.0.is_empty() {
                return Ok(());
            }
            if began.elapsed() > GONE_WITHIN {
                let ids: Vec<String> = left.0.keys().map(u64::to_string).collect();
                bail!(
                    "the floor's programs {} were still loaded {GONE_WITHIN:?} after it detached them",
                    ids.join(", ")
                );
            }
            sleep(Duration::from_millis(10));
        }
    }

    /// What its process used: nothing to tell apart, the programs are this
    /// process's own (no other process to charge them to).
    pub fn usage() -> Usage {
        Usage {
            cpu_s: 0.0,
            user_s: 0.0,
            peak_rss_kib: 0,
        }
    }

    /// The kernel ids of its programs, for `bpftool prog show` (the counters).
    pub fn prog_ids(&self) -> Vec<u64> {
        self.programs.iter().map(|(id, _)| *id).collect()
    }

    /// Its programs' counters over one run (`delta`, by program id), by
    /// section ("tp_btf/block_rq_issue"); zero unless the accounting was on.
    pub fn costs(&self, delta: &BTreeMap<u64, Counter>) -> Vec<PeerProgram> {
        self.programs
            .iter()
            .map(|(id, section)| {
                let c = delta.get(id);
                PeerProgram {
                    tracepoint: section.clone(),
                    run_count: c.map_or(0, |c| c.run_count),
                    run_time_ns: c.map_or(0, |c| c.run_time_ns),
                }
            })
            .collect()
    }
}

impl Drop for Floor {
    fn drop(&mut self) {
        // Explicitly, so that the programs are gone when the floor's runs
        // end, whatever else still holds the Ebpf's maps.
        for (name, program) in self.ebpf.programs_mut() {
            let unloaded = match program {
                Program::BtfTracePoint(p) => p.unload(),
                Program::RawTracePoint(p) => p.unload(),
                Program::FEntry(p) => p.unload(),
                Program::KProbe(p) => p.unload(),
                _ => Ok(()),
            };
            // NotLoaded: a program after the one that failed to attach.
            if let Err(e) = unloaded
                && !matches!(e, aya::programs::ProgramError::NotLoaded)
            {
                eprintln!("bench: floor: cannot unload {name}: {e}");
            }
        }
    }
}
