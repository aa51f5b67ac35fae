//! Debian cloud kernels: a private apt configuration (never the host's
//! /etc/apt), version resolution, download and extraction, all cached under
//! the kernel cache root and skipped when already there.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime};

use anyhow::{Context, bail};

use super::version_cmp;

/// Every suite a cloud kernel we test comes from: 5.10 (bullseye), 6.1
/// (bookworm), 6.12 (trixie, bookworm-backports), 6.16+ and 7.x (trixie-backports,
/// sid, experimental). The host's debian-archive-keyring (bookworm's 2023.3)
/// verifies all of them as of 2026-11: sid and experimental are still signed
/// with the trixie keys. Should a future suite be signed with a key the host
/// keyring lacks, `apt-get update` fails loudly for it; set
/// STALLTRACE_KERNEL_APT_TRUSTED=1 to fall back to `[trusted=yes]` (plain HTTP,
/// unverified) knowingly.
const SUITES: &[&str] = &[
    "bullseye",
    "bookworm",
    "bookworm-backports",
    "trixie",
    "trixie-backports",
    "sid",
    "experimental",
];
const KEYRING: &str = "/usr/share/keyrings/debian-archive-keyring.gpg";
/// Package lists older than this are refreshed (new point releases appear weekly).
const LISTS_MAX_AGE: Duration = Duration::from_secs(24 * 3600);

/// A kernel ready to boot: its image, its modules directory and the packages
/// it came from.
#[derive(Debug, Clone)]
pub struct Kernel {
    /// What the user asked for ("5.10", "7", "newest", or a full version).
    pub requested: String,
    /// `uname -r`, e.g. 6.12.107+deb13-cloud-amd64.
    pub kver: String,
    /// "name=version" of every .deb used.
    pub packages: Vec<String>,
    pub vmlinuz: PathBuf,
    /// .../lib/modules/<kver> with kernel/ below it.
    pub moddir: PathBuf,
    /// Where modules.builtin and modules.order are (7.x ship them in linux-base).
    pub metadir: Option<PathBuf>,
}

/// Root of the kernel cache: outside the work tree, shared by every checkout.
pub fn cache_root() -> PathBuf {
    if let Some(dir) = std::env::var_os("STALLTRACE_KERNEL_CACHE") {
        return PathBuf::from(dir);
    }
    let home = std::env::var_os("HOME").unwrap_or_else(|| "/root".into());
    Path::new(&home).join(".cache/stalltrace/kernels")
}

struct Apt {
    dir: PathBuf,
}

impl Apt {
    fn new(cache: &Path) -> anyhow::Result<Apt> {
        let dir = cache.join("apt");
        for sub in ["etc", "state/lists/partial", "cache/archives/partial"] {
            std::fs::create_dir_all(dir.join(sub))?;
        }
        let opt = if std::env::var("STALLTRACE_KERNEL_APT_TRUSTED").as_deref() == Ok("1") {
            "trusted=yes".to_string()
        } else {
            format!("signed-by={KEYRING}")
        };
        let list: String = SUITES
            .iter()
            .map(|s| format!("deb [{opt}] http://deb.debian.org/debian {s} main\n"))
            .collect();
        let path = dir.join("etc/sources.list");
        if std::fs::read_to_string(&path).ok().as_deref() != Some(list.as_str()) {
            std::fs::write(&path, list)?;
            // A changed source list invalidates the lists we have.
            let _ = std::fs::remove_file(dir.join("state/updated"));
        }
        Ok(Apt { dir })
    }

    fn cmd(&self, program: &str) -> Command {
        let mut c = Command::new(program);
        let d = self.dir.display();
        c.arg(format!("-o=Dir::Etc::sourcelist={d}/etc/sources.list"))
            .arg("-o=Dir::Etc::sourceparts=-")
            // The cache is usually under /root, which apt's _apt user cannot write.
            .arg("-o=APT::Sandbox::User=root")
            .arg(format!("-o=Dir::State={d}/state"))
            .arg(format!("-o=Dir::Cache={d}/cache"))
            // Only the Packages lists: the host's AppStream (DEP-11) hooks would
            // otherwise fetch ~20 MB of metadata we never read.
            .arg("-o=Acquire::IndexTargets::deb::DEP-11::DefaultEnabled=false")
            .arg("-o=Acquire::IndexTargets::deb::DEP-11-icons::DefaultEnabled=false")
            .arg("-o=Acquire::IndexTargets::deb::DEP-11-icons-small::DefaultEnabled=false")
            .arg("-o=Acquire::IndexTargets::deb::Contents-deb::DefaultEnabled=false");
        c
    }

    /// `apt-get update` when the lists are missing or a day old (or forced).
    fn update(&self, force: bool) -> anyhow::Result<()> {
        let stamp = self.dir.join("state/updated");
        let fresh = std::fs::metadata(&stamp)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| SystemTime::now().duration_since(t).ok())
            .is_some_and(|age| age < LISTS_MAX_AGE);
        if fresh && !force {
            return Ok(());
        }
        eprintln!(
            "kernels: apt-get update (private lists in {})",
            self.dir.display()
        );
        let status = self.cmd("apt-get").args(["-qq", "update"]).status()?;
        if !status.success() && stamp.exists() && !force {
            // Offline with lists from an earlier run: the cached kernels still boot.
            eprintln!(
                "kernels: apt-get update failed ({status}); using the lists from the last update"
            );
            return Ok(());
        }
        if !status.success() {
            bail!(
                "apt-get update for the kernel lists failed ({status}); if a suite's key is \
                 missing from {KEYRING}, STALLTRACE_KERNEL_APT_TRUSTED=1 skips verification"
            );
        }
        std::fs::write(stamp, "")?;
        Ok(())
    }

    fn pkgnames(&self, prefix: &str) -> anyhow::Result<Vec<String>> {
        let out = self.cmd("apt-cache").args(["pkgnames", prefix]).output()?;
        if !out.status.success() {
            bail!(
                "apt-cache pkgnames failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_string)
            .collect())
    }
}

/// The kernel version inside a package name, e.g. linux-image-6.1.0-50-cloud-amd64 → 6.1.0-50.
fn kver_of<'a>(name: &'a str, prefix: &str) -> Option<&'a str> {
    let v = name.strip_prefix(prefix)?.strip_suffix("-cloud-amd64")?;
    // Skip unversioned meta names like linux-image-7.3-cloud-amd64 only when
    // they are not x.y.z: those are ABI aliases of a full version we also see.
    (v.split(['.', '-', '+']).filter(|p| !p.is_empty()).count() >= 3).then_some(v)
}

/// Does a version argument ("5.10", "7", "6.12.107+deb13") select this kernel version?
fn matches(arg: &str, v: &str) -> bool {
    let arg = arg.strip_suffix("-cloud-amd64").unwrap_or(arg);
    v == arg
        || v.strip_prefix(arg)
            .is_some_and(|r| r.starts_with(['.', '-', '+']))
}

#[derive(Clone, Copy)]
enum Layout {
    /// One linux-image package (up to 6.x).
    Image,
    /// linux-binary (vmlinuz) + linux-modules + linux-base (modules.builtin) for 7.x.
    Split,
}

/// Resolve a version argument to (kernel version without -cloud-amd64, layout).
fn resolve(apt: &Apt, arg: &str) -> anyhow::Result<(String, Layout)> {
    let images = apt.pkgnames("linux-image-")?;
    let modules = apt.pkgnames("linux-modules-")?;
    let binaries = apt.pkgnames("linux-binary-")?;
    let mut candidates: Vec<(String, Layout)> = Vec::new();
    for n in &binaries {
        if let Some(v) = kver_of(n, "linux-binary-") {
            // A 7.x kernel is usable only with its modules.
            if modules
                .iter()
                .any(|m| kver_of(m, "linux-modules-") == Some(v))
            {
                candidates.push((v.to_string(), Layout::Split));
            }
        }
    }
    for n in &images {
        if let Some(v) = kver_of(n, "linux-image-") {
            // From 7.x on linux-image is a meta package over binary+modules.
            if !candidates.iter().any(|(c, _)| c == v)
                && !binaries
                    .iter()
                    .any(|b| kver_of(b, "linux-binary-") == Some(v))
            {
                candidates.push((v.to_string(), Layout::Image));
            }
        }
    }
    let pick = |want: &dyn Fn(&str) -> bool| {
        candidates
            .iter()
            .filter(|(v, _)| want(v))
            .max_by(|a, b| version_cmp(&a.0, &b.0))
            .map(|(v, l)| (v.clone(), *l))
    };
    let found = match arg {
        "newest" | "latest" => pick(&|_| true),
        _ => pick(&|v| matches(arg, v)),
    };
    found.with_context(|| format!("no Debian cloud kernel matches {arg:?} in the package lists"))
}

/// Download (apt-get download, into the cache) and extract one package;
/// returns (extracted root, "name=version").
fn fetch_pkg(apt: &Apt, cache: &Path, name: &str) -> anyhow::Result<(PathBuf, String)> {
    let debs = cache.join("debs");
    std::fs::create_dir_all(&debs)?;
    let find = || -> anyhow::Result<Option<PathBuf>> {
        let prefix = format!("{name}_");
        let mut found = Vec::new();
        for e in std::fs::read_dir(&debs)? {
            let p = e?.path();
            let f = p.file_name().unwrap().to_string_lossy().into_owned();
            if f.starts_with(&prefix) && f.ends_with(".deb") {
                found.push(p);
            }
        }
        found.sort();
        Ok(found.pop())
    };
    let deb = match find()? {
        Some(d) => d,
        None => {
            eprintln!("kernels: downloading {name}");
            let status = apt
                .cmd("apt-get")
                .args(["-qq", "download", name])
                .current_dir(&debs)
                .status()?;
            if !status.success() {
                bail!("apt-get download {name} failed ({status})");
            }
            find()?
                .with_context(|| format!("{name}: downloaded but no .deb in {}", debs.display()))?
        }
    };
    let stem = deb.file_stem().unwrap().to_string_lossy().into_owned();
    let version = stem.split('_').nth(1).unwrap_or("?").to_string();
    let root = cache.join("x").join(&stem);
    if !root.exists() {
        extract_into(&[deb], &cache.join("x").join(format!(".{stem}.tmp")), &root)?;
    }
    // The deb's version uses %3a for an epoch's colon; kernels have none.
    Ok((root, format!("{name}={}", version.replace("%3a", ":"))))
}

/// The directory lib/modules/<kver> inside an extracted package, whichever of
/// /lib or /usr/lib it uses.
fn modules_dir(root: &Path, kver: &str) -> Option<PathBuf> {
    ["lib/modules", "usr/lib/modules"]
        .iter()
        .map(|d| root.join(d).join(kver))
        .find(|p| p.is_dir())
}

/// The QEMU the guests boot with: bookworm-backports' (10.x), downloaded
/// with the private lists and extracted into the cache, never installed.
/// Under single-threaded TCG, bookworm's own QEMU 7.2 crashed the 6.12 guest
/// in about one boot of three (a NULL dereference in kernfs during ACPI
/// set-up, a double fault in get_random_u32, a segfaulting /init); 10.x did
/// not in the boots tried. Its libraries and firmware are the ones bookworm's
/// qemu-system-x86 brings (cargo xtask setup installs it). `$STALLTRACE_QEMU`
/// overrides the binary.
pub fn qemu() -> anyhow::Result<PathBuf> {
    if let Ok(path) = std::env::var("STALLTRACE_QEMU") {
        return Ok(PathBuf::from(path));
    }
    let cache = cache_root();
    let apt = Apt::new(&cache)?;
    apt.update(false)?;
    let out = apt
        .cmd("apt-cache")
        .args(["madison", "qemu-system-x86"])
        .output()?;
    let version = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains("bookworm-backports"))
        .filter_map(|l| l.split('|').nth(1).map(|v| v.trim().to_string()))
        .next()
        .context("no qemu-system-x86 in bookworm-backports")?;
    let root = cache
        .join("qemu")
        .join(version.replace([':', '~', '+'], "_"));
    let binary = root.join("usr/bin/qemu-system-x86_64");
    if binary.is_file() {
        return Ok(binary);
    }
    let debs = cache.join("qemu/debs");
    let _ = std::fs::remove_dir_all(&debs);
    std::fs::create_dir_all(&debs)?;
    eprintln!("kernels: downloading qemu-system-x86 {version} (bookworm-backports)");
    let pkgs: Vec<String> = ["qemu-system-x86", "qemu-system-common", "qemu-system-data"]
        .iter()
        .map(|p| format!("{p}={version}"))
        .collect();
    let status = apt
        .cmd("apt-get")
        .arg("-qq")
        .arg("download")
        .args(&pkgs)
        .current_dir(&debs)
        .status()?;
    if !status.success() {
        bail!("apt-get download {pkgs:?} failed ({status})");
    }
    let debs: Vec<PathBuf> = std::fs::read_dir(&debs)?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()?;
    extract_into(&debs, &root.with_extension("tmp"), &root)?;
    Ok(binary)
}

/// Extract `debs` into `tmp`, then rename it to `root`, so an interrupted run
/// leaves no half tree where a later one would take it for whole.
fn extract_into(debs: &[PathBuf], tmp: &Path, root: &Path) -> anyhow::Result<()> {
    let _ = std::fs::remove_dir_all(tmp);
    std::fs::create_dir_all(tmp)?;
    for deb in debs {
        let status = Command::new("dpkg-deb")
            .arg("-x")
            .arg(deb)
            .arg(tmp)
            .status()?;
        if !status.success() {
            bail!("dpkg-deb -x {} failed ({status})", deb.display());
        }
    }
    std::fs::rename(tmp, root)?;
    Ok(())
}

/// Resolve, download and extract every requested kernel.
pub fn prepare(args: &[String], refresh: bool) -> anyhow::Result<Vec<Kernel>> {
    let cache = cache_root();
    let apt = Apt::new(&cache)?;
    apt.update(refresh)?;
    let mut kernels = Vec::new();
    for arg in args {
        let (v, layout) = resolve(&apt, arg)?;
        let kver = format!("{v}-cloud-amd64");
        let names: Vec<String> = match layout {
            Layout::Image => vec![format!("linux-image-{kver}")],
            Layout::Split => ["binary", "modules", "base"]
                .iter()
                .map(|p| format!("linux-{p}-{kver}"))
                .collect(),
        };
        let mut roots = Vec::new();
        let mut packages = Vec::new();
        for n in &names {
            let (root, pv) = fetch_pkg(&apt, &cache, n)?;
            roots.push(root);
            packages.push(pv);
        }
        let vmlinuz = roots
            .iter()
            .flat_map(|r| {
                [
                    r.join("boot").join(format!("vmlinuz-{kver}")),
                    r.join("usr/lib/modules").join(&kver).join("vmlinuz"),
                ]
            })
            .find(|p| p.is_file())
            .with_context(|| format!("{kver}: no vmlinuz in {names:?}"))?;
        let moddir = roots
            .iter()
            .filter_map(|r| modules_dir(r, &kver))
            .find(|d| d.join("kernel").is_dir())
            .with_context(|| format!("{kver}: no modules in {names:?}"))?;
        let metadir = roots
            .iter()
            .filter_map(|r| modules_dir(r, &kver))
            .find(|d| d.join("modules.builtin").is_file());
        kernels.push(Kernel {
            requested: arg.clone(),
            kver,
            packages,
            vmlinuz,
            moddir,
            metadir,
        });
    }
    Ok(kernels)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_arguments_match_by_component() {
        assert!(matches("5.10", "5.10.0-32"));
        assert!(matches("6.1", "6.1.0-50"));
        assert!(!matches("6.1", "6.12.107+deb13"));
        assert!(matches("7", "7.3.4+deb13"));
        assert!(matches("6.12.107+deb13-cloud-amd64", "6.12.107+deb13"));
    }

    #[test]
    fn package_names_give_full_versions_only() {
        assert_eq!(
            kver_of("linux-image-6.1.0-50-cloud-amd64", "linux-image-"),
            Some("6.1.0-50")
        );
        assert_eq!(kver_of("linux-image-7.3-cloud-amd64", "linux-image-"), None);
        assert_eq!(kver_of("linux-image-cloud-amd64", "linux-image-"), None);
    }
}
