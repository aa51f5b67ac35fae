//! `cargo xtask kernels [VERSION...]`: boot Debian cloud kernels under QEMU
//! and run stalltrace's end-to-end checks inside each; print the matrix,
//! write target/kernels/results.json and, when asked, docs/KERNELS.md.
//!
//! Pieces: `fetch` (private apt lists, resolve, download, extract),
//! `initramfs` (+ `cpio`, `init.sh`, `guest.sh`), `qemu` (boot with a
//! wall-clock limit) and `report` (parse markers, matrix, docs).

mod cpio;
mod fetch;
mod initramfs;
mod qemu;
mod report;

use std::cmp::Ordering;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use crate::util;

/// The kernels `cargo xtask test` runs: Debian's LTS lines (bullseye,
/// bookworm, trixie) and the newest 7.x.
pub const TEST_KERNELS: &[&str] = &["5.10", "6.1", "6.12", "7"];

#[derive(clap::Args, Debug, Default)]
pub struct Opts {
    /// Kernels: 5.10, 6.1, 6.12, 6.16 … 6.19, 7 (newest 7.x), newest, or a full
    /// version such as 6.12.107+deb13 [default: 5.10 6.1 6.12 7]
    pub versions: Vec<String>,
    /// Take stalltrace, sqlservr, sqlclient and stalltrace-kernel-checks from
    /// this directory instead of building the workspace (release)
    #[arg(long, value_name = "DIR")]
    pub bin_dir: Option<PathBuf>,
    /// Extra kernel command line (repeatable), e.g. --append lockdown=confidentiality
    #[arg(long, value_name = "PARAM")]
    pub append: Vec<String>,
    /// Run this shell command in the guest instead of the checks (ad hoc);
    /// lines it prints starting with "STALLTRACE-MATRIX {json}" count as results
    #[arg(long, value_name = "SCRIPT")]
    pub exec: Option<String>,
    /// Wall-clock limit per guest, in seconds; QEMU is killed after it
    #[arg(long, default_value_t = 600)]
    pub timeout: u64,
    /// Guests at a time (each is one single-threaded TCG process)
    #[arg(long, default_value_t = 1)]
    pub jobs: usize,
    /// QEMU CPU model for the guests
    #[arg(long, default_value = "max")]
    pub cpu: String,
    /// Guest memory in MiB
    #[arg(long, default_value_t = 2048)]
    pub memory: u32,
    /// Mount bpffs at /sys/fs/bpf in the guest (default: a fresh host without it)
    #[arg(long)]
    pub bpffs: bool,
    /// Refresh the package lists even if they are less than a day old
    #[arg(long)]
    pub refresh: bool,
    /// Write docs/KERNELS.md from this run
    #[arg(long)]
    pub write_docs: bool,
    /// Run every check in raw_tp mode on every kernel, not only on the oldest
    /// of the run (and a few on the newest)
    #[arg(long)]
    pub raw_tp_everywhere: bool,
}

/// Which checks the guest runs in raw_tp mode, the fallback, which reads the
/// same CO-RE-relocated fields on every kernel. All of them on the run's
/// oldest kernel; on its newest (the layouts' other end) [`RAW_TP_NEWEST`];
/// none on the middle ones. Each check loads and verifies the families
/// afresh under TCG, so a full raw_tp pass costs about half what the auto
/// pass does (5.10: 142 s against 252 s on a quiet host, 2026-12-03), and
/// the matrix is most of CI's time. The host's own tests run both modes on its
/// kernel. `--raw-tp-everywhere` runs all of them everywhere.
#[derive(Clone, Copy, Debug, PartialEq)]
enum RawTp {
    None,
    Loading,
    All,
}

impl RawTp {
    fn for_kernel(
        kver: &str,
        oldest: Option<&str>,
        newest: Option<&str>,
        everywhere: bool,
    ) -> Self {
        if everywhere || Some(kver) == oldest {
            RawTp::All
        } else if Some(kver) == newest {
            RawTp::Loading
        } else {
            RawTp::None
        }
    }
}

/// The raw_tp checks on the newest kernel: `cli/check` loads and attaches
/// every family, `block/diskstats` measures one against the kernel.
const RAW_TP_NEWEST: &str = "cli/check block/diskstats";

/// The guest script's settings for `raw_tp`: MODES, and RAW_TP_ONLY (the
/// raw_tp checks, empty for all).
fn guest_modes(raw_tp: RawTp) -> String {
    match raw_tp {
        RawTp::None => "MODES=\"auto\"\n".to_string(),
        RawTp::Loading => format!("MODES=\"auto raw_tp\"\nRAW_TP_ONLY=\"{RAW_TP_NEWEST}\"\n"),
        RawTp::All => "MODES=\"auto raw_tp\"\n".to_string(),
    }
}

/// Compare version strings like `sort -V`: digit runs as numbers, the rest as text.
pub fn version_cmp(a: &str, b: &str) -> Ordering {
    fn chunks(s: &str) -> Vec<(bool, &str)> {
        let mut out = Vec::new();
        let mut start = 0;
        let b = s.as_bytes();
        for i in 1..=b.len() {
            if i == b.len() || b[i].is_ascii_digit() != b[start].is_ascii_digit() {
                out.push((b[start].is_ascii_digit(), &s[start..i]));
                start = i;
            }
        }
        out
    }
    let (ca, cb) = (chunks(a), chunks(b));
    for (x, y) in ca.iter().zip(&cb) {
        let o = match (x, y) {
            ((true, p), (true, q)) => p
                .parse::<u64>()
                .unwrap_or(0)
                .cmp(&q.parse::<u64>().unwrap_or(0)),
            ((_, p), (_, q)) => p.cmp(q),
        };
        if o != Ordering::Equal {
            return o;
        }
    }
    ca.len().cmp(&cb.len())
}

/// Project binaries for the guest: (name, host path). stalltrace is required;
/// the simulator and the check binary are taken when present.
fn binaries(opts: &Opts) -> anyhow::Result<Vec<(String, PathBuf)>> {
    let dir = match &opts.bin_dir {
        Some(d) => d.clone(),
        None => {
            util::build_release(&["stalltrace", "stalltrace-sim", "stalltrace-lab"])?;
            std::env::var_os("CARGO_TARGET_DIR")
                .map_or_else(|| util::workspace_root().join("target"), PathBuf::from)
                .join("release")
        }
    };
    let stripped = fetch::cache_root().join("bins");
    std::fs::create_dir_all(&stripped)?;
    let mut bins = Vec::new();
    for name in [
        "stalltrace",
        "sqlservr",
        "sqlclient",
        "stalltrace-kernel-checks",
    ] {
        let host = dir.join(name);
        if !host.is_file() {
            if name == "stalltrace" {
                bail!(
                    "{} not found (--bin-dir or a release build)",
                    host.display()
                );
            }
            eprintln!("kernels: {} not found: not in the guest", host.display());
            continue;
        }
        // Release builds carry debug line tables (profile.release debug = 1);
        // the guest does not need them and they triple the initramfs.
        let out = stripped.join(name);
        util::run(
            "strip",
            &[
                "--strip-debug",
                "-o",
                &out.to_string_lossy(),
                &host.to_string_lossy(),
            ],
        )?;
        bins.push((name.to_string(), out));
    }
    Ok(bins)
}

/// Boot one kernel and collect what it said.
fn run_one(
    k: &fetch::Kernel,
    opts: &Opts,
    bins: &[(String, PathBuf)],
    script: &str,
    qemu: &std::path::Path,
) -> anyhow::Result<report::KernelRun> {
    let dir = qemu::run_dir().join(&k.kver);
    std::fs::create_dir_all(&dir)?;
    let initrd = dir.join("initrd.zst");
    let t0 = Instant::now();
    let payload = initramfs::Payload {
        bins: bins.to_vec(),
        script,
        mount_bpffs: opts.bpffs,
    };
    let missing = initramfs::build(k, &payload, &initrd)?;
    if !missing.is_empty() {
        eprintln!(
            "kernels: {}: modules not found on the host side: {missing:?}",
            k.kver
        );
    }
    eprintln!(
        "kernels: {}: initramfs {} MB in {:.1} s; booting",
        k.kver,
        std::fs::metadata(&initrd)?.len() >> 20,
        t0.elapsed().as_secs_f64()
    );
    // st0: the raw test disk the checks own. st1: ext4 for /var/tmp, made on
    // the host, so the guest has a disk-backed directory that takes O_DIRECT
    // as a real host does (tmpfs refuses O_DIRECT before 6.6).
    let disks = [(dir.join("test.img"), "st0"), (dir.join("var.img"), "st1")];
    for (path, _) in &disks {
        qemu::fresh_disk(path, 1 << 30)?;
    }
    util::run(
        "mkfs.ext4",
        &["-q", "-F", "-L", "vartmp", &disks[1].0.to_string_lossy()],
    )?;
    let log = dir.join("console.log");
    let boot = qemu::Boot {
        vmlinuz: &k.vmlinuz,
        initrd: &initrd,
        disks: &disks,
        append: &opts.append,
        timeout: Duration::from_secs(opts.timeout),
        memory_mb: opts.memory,
        cpu: &opts.cpu,
        qemu,
        console_log: &log,
        label: &k.kver,
    };
    let mut outcome = qemu::boot(&boot)?;
    // Under TCG on this host 6.12 sometimes oopses in early boot (double
    // fault, NULL dereference in ACPI enumeration) before /init, i.e. before
    // anything of ours ran: boot such a guest once more, and say so.
    let mut early_crash = None;
    let reached_init = |o: &qemu::Outcome| {
        o.lines
            .iter()
            .any(|l| l.text.contains("STALLTRACE-MATRIX boot "))
    };
    if !reached_init(&outcome) && !outcome.trouble.is_empty() && !outcome.timed_out {
        let first = outcome.trouble[0].clone();
        eprintln!(
            "kernels: {}: crashed before /init ({first}); booting once more",
            k.kver
        );
        let _ = std::fs::rename(&log, dir.join("console.early-crash.log"));
        early_crash = Some(first);
        for (path, _) in &disks {
            qemu::fresh_disk(path, 1 << 30)?;
        }
        util::run(
            "mkfs.ext4",
            &["-q", "-F", "-L", "vartmp", &disks[1].0.to_string_lossy()],
        )?;
        outcome = qemu::boot(&boot)?;
    }
    for (path, _) in &disks {
        let _ = std::fs::remove_file(path);
    }
    let mut run = report::KernelRun::parse(k.clone(), outcome, &log, opts.exec.is_none());
    run.early_crash = early_crash;
    Ok(run)
}

pub fn kernels(opts: &Opts) -> anyhow::Result<()> {
    let started = Instant::now();
    let versions: Vec<String> = if opts.versions.is_empty() {
        TEST_KERNELS.iter().map(|s| s.to_string()).collect()
    } else {
        opts.versions.clone()
    };
    let ks = fetch::prepare(&versions, opts.refresh)?;
    let bins = binaries(opts)?;
    let qemu = fetch::qemu()?;
    let oldest = ks
        .iter()
        .map(|k| k.kver.as_str())
        .min_by(|a, b| version_cmp(a, b));
    let newest = ks
        .iter()
        .map(|k| k.kver.as_str())
        .max_by(|a, b| version_cmp(a, b));
    let script_for = |k: &fetch::Kernel| match &opts.exec {
        Some(cmd) => format!("{cmd}\n"),
        None => {
            let raw_tp = RawTp::for_kernel(&k.kver, oldest, newest, opts.raw_tp_everywhere);
            format!(
                "{}{}",
                guest_modes(raw_tp),
                include_str!("kernels/guest.sh")
            )
        }
    };
    let mut runs: Vec<report::KernelRun> = Vec::new();
    // Guests one after another by default; --jobs N runs N at a time.
    for chunk in ks.chunks(opts.jobs.max(1)) {
        let results: Vec<anyhow::Result<report::KernelRun>> = std::thread::scope(|s| {
            let handles: Vec<_> = chunk
                .iter()
                .map(|k| {
                    let script = script_for(k);
                    let (bins, qemu) = (&bins, &qemu);
                    s.spawn(move || run_one(k, opts, bins, &script, qemu))
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(anyhow::anyhow!("panicked")))
                })
                .collect()
        });
        for (k, r) in chunk.iter().zip(results) {
            runs.push(r.with_context(|| format!("kernel {}", k.kver))?);
        }
    }
    report::print(&runs);
    let total = started.elapsed().as_secs_f64();
    println!("\nkernels: {} guests in {:.0} s", runs.len(), total);
    write_results(&runs, opts, total)?;
    let bad: Vec<&str> = runs
        .iter()
        .filter(|r| !r.ok())
        .map(|r| r.kernel.kver.as_str())
        .collect();
    if !bad.is_empty() {
        bail!("kernel matrix failed on {}", bad.join(", "));
    }
    Ok(())
}

fn write_results(runs: &[report::KernelRun], opts: &Opts, total: f64) -> anyhow::Result<()> {
    let date = util::output("date", &["-u", "+%Y-%m-%d %H:%M UTC"])
        .unwrap_or_default()
        .trim()
        .to_string();
    let dir = util::workspace_root().join("target/kernels");
    std::fs::create_dir_all(&dir)?;
    let json = serde_json::json!({
        "date": date,
        "total_secs": total,
        "append": opts.append,
        "exec": opts.exec,
        "kernels": runs.iter().map(report::KernelRun::json).collect::<Vec<_>>(),
    });
    // The consoles next to the results (the cache's copy is overwritten by the next run).
    for r in runs {
        let _ = std::fs::copy(
            &r.console_log,
            dir.join(format!("{}.console.log", r.kernel.kver)),
        );
    }
    let path = dir.join("results.json");
    std::fs::write(&path, serde_json::to_string_pretty(&json)?)?;
    eprintln!("kernels: results in {}", path.display());
    // The page every run would give, beside the results; --write-docs makes it docs/KERNELS.md.
    let mut command = String::from("cargo xtask kernels");
    for v in &opts.versions {
        command.push(' ');
        command.push_str(v);
    }
    let md = report::markdown(runs, &date, &command);
    std::fs::write(dir.join("KERNELS.md"), &md)?;
    if opts.write_docs {
        let docs = util::workspace_root().join("docs/KERNELS.md");
        std::fs::write(&docs, md)?;
        eprintln!("kernels: wrote {}", docs.display());
    }
    Ok(())
}

/// The matrix as the last step of `cargo xtask test`. STALLTRACE_SKIP_KERNELS=1
/// skips it on a developer machine (loudly); CI always runs it.
pub fn after_tests() -> anyhow::Result<()> {
    if std::env::var("STALLTRACE_SKIP_KERNELS").as_deref() == Ok("1") {
        if std::env::var("CI").as_deref() == Ok("true") {
            bail!(
                "STALLTRACE_SKIP_KERNELS=1 is refused when CI=true: CI always runs the kernel matrix"
            );
        }
        eprintln!("\n{}", "!".repeat(72));
        eprintln!(
            "!! STALLTRACE_SKIP_KERNELS=1: the kernel matrix (5.10, 6.1, 6.12, 7.x) was SKIPPED."
        );
        eprintln!(
            "!! Nothing was checked on any kernel but this host's. Run `cargo xtask kernels`."
        );
        eprintln!("{}\n", "!".repeat(72));
        return Ok(());
    }
    // One guest at a time: in a trial with two at a time on this 2-CPU host
    // (and tests running beside them for part of it), each check ran about
    // 2.5 times slower, longer in all than one after the other. The limit per guest is for a guest that hangs, not a slow
    // one: under TCG the same checks take up to 1.7 times as long from one
    // day's host to another's (a 6.1 guest needed about 620 s), so 600 s
    // was a coin toss.
    let defaults = || Opts {
        timeout: 1200,
        jobs: 1,
        memory: 2048,
        cpu: "max".into(),
        ..Opts::default()
    };
    // Booted with lockdown=confidentiality, stalltrace must refuse with one
    // line. First, and on one kernel: the matrix after it keeps
    // target/kernels/results.json.
    kernels(&Opts {
        versions: vec![LOCKDOWN_KERNEL.into()],
        append: vec!["lockdown=confidentiality".into()],
        exec: Some(LOCKDOWN_CHECK.into()),
        ..defaults()
    })?;
    kernels(&defaults())
}

/// The kernel the lockdown refusal is checked on.
const LOCKDOWN_KERNEL: &str = "6.1";

/// The guest command for it: the one check that needs such a boot.
const LOCKDOWN_CHECK: &str = "B=/usr/local/bin; $B/stalltrace-kernel-checks --stalltrace $B/stalltrace \
    --sqlservr $B/sqlservr --sqlclient $B/sqlclient --disk \"$STALLTRACE_TEST_DISK\" \
    --mode auto --only cli/lockdown";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_tp_runs_in_full_on_the_oldest_and_in_part_on_the_newest() {
        let (old, new) = (Some("5.10.0-32"), Some("7.3.4"));
        assert_eq!(RawTp::for_kernel("5.10.0-32", old, new, false), RawTp::All);
        assert_eq!(RawTp::for_kernel("7.3.4", old, new, false), RawTp::Loading);
        assert_eq!(RawTp::for_kernel("6.1.0-50", old, new, false), RawTp::None);
        assert_eq!(RawTp::for_kernel("6.1.0-50", old, new, true), RawTp::All);
        // One kernel is both ends: all of them.
        assert_eq!(RawTp::for_kernel("7.3.4", new, new, false), RawTp::All);
        assert_eq!(guest_modes(RawTp::None), "MODES=\"auto\"\n");
        assert!(guest_modes(RawTp::All).ends_with("raw_tp\"\n"));
        assert!(guest_modes(RawTp::Loading).contains(&format!("RAW_TP_ONLY=\"{RAW_TP_NEWEST}\"")));
        // Names the guest's checks know (it refuses any other `--only`).
        use stalltrace_lab::kernel_checks::CHECKS;
        for name in RAW_TP_NEWEST.split(' ') {
            assert!(CHECKS.iter().any(|c| c.name == name), "{name}");
        }
    }

    #[test]
    fn versions_sort_like_sort_v() {
        assert_eq!(
            version_cmp("6.12.107+deb13", "6.12.95+deb12"),
            Ordering::Greater
        );
        assert_eq!(
            version_cmp("7.3.4+deb13", "7.2.13+deb14"),
            Ordering::Greater
        );
        assert_eq!(version_cmp("5.10.0-32", "5.10.0-30"), Ordering::Greater);
        assert_eq!(version_cmp("6.1.0-50", "6.1.0-50"), Ordering::Equal);
    }
}
