//! The guest's initramfs: busybox for the shell and coreutils, the host's own
//! tools (with every library `ldd` names) at their host paths, the project's
//! binaries in /usr/local/bin, the few kernel modules the checks need (with
//! their dependencies), and an /init that runs the guest command.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, bail};

use super::cpio::{Archive, guest_path};
use super::fetch::{Kernel, cache_root};

/// Host tools the checks drive. The first group is required; the rest are
/// taken when the host has them (busybox stands in otherwise).
const REQUIRED_TOOLS: &[&str] = &[
    "ip", "tc", "nft", "ss", "fio", "iperf3", "sockperf", "timeout", "bpftool",
];
const OPTIONAL_TOOLS: &[&str] = &[
    "nstat",
    "ethtool",
    "losetup",
    "mount",
    "umount",
    "sysctl",
    "udevadm",
    "mkfs.ext4",
    "blockdev",
    "nsenter",
    "unshare",
    "taskset",
    "stdbuf",
    "dd",
    "kmod",
    "modprobe",
];
/// Data files the tools read: protocol and service names (nft, ss), iproute2's
/// tables, and tc's netem distribution tables.
const HOST_DATA: &[&str] = &[
    "/etc/protocols",
    "/etc/services",
    "/etc/iproute2",
    "/usr/share/iproute2",
    "/usr/lib/x86_64-linux-gnu/tc",
];
/// Modules (=m in Debian's cloud configs) the checks need: veth pairs between
/// namespaces, nft random drops, tbf/netem qdiscs, sock_diag for ss and
/// stalltrace's tcp_info poller, loop devices. NVMe and the serial console are
/// built in; no guest NIC is used, so virtio_net is not needed.
pub const MODULES: &[&str] = &[
    "veth",
    "nf_tables",
    "nft_numgen",
    "sch_tbf",
    "sch_netem",
    "inet_diag",
    "tcp_diag",
    "udp_diag",
    "loop",
];

pub struct Payload<'a> {
    /// Project binaries: (name in /usr/local/bin, host path).
    pub bins: Vec<(String, PathBuf)>,
    /// Shell script run by /init once the guest is up.
    pub script: &'a str,
    /// Mount bpffs at /sys/fs/bpf (a fresh host usually has it via systemd;
    /// the default leaves it unmounted to test that stalltrace copes).
    pub mount_bpffs: bool,
}

fn which(tool: &str) -> Option<PathBuf> {
    let path = std::env::var("PATH").unwrap_or_default();
    path.split(':')
        .chain(["/usr/local/sbin", "/usr/sbin", "/sbin", "/usr/bin", "/bin"])
        .map(|d| Path::new(d).join(tool))
        .find(|p| p.is_file())
}

/// Libraries (and the loader) a dynamic executable needs, from `ldd`.
fn libraries(bin: &Path) -> Vec<PathBuf> {
    let Ok(out) = Command::new("ldd").arg(bin).output() else {
        return Vec::new();
    };
    // A static binary: ldd fails ("not a dynamic executable"); nothing to add.
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let l = l.trim();
            let path = match l.split_once("=>") {
                Some((_, rhs)) => rhs.split_whitespace().next()?,
                None => l.split_whitespace().next()?,
            };
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect()
}

/// A host executable at its host path, with its libraries.
fn add_executable(a: &mut Archive, bin: &Path) -> anyhow::Result<()> {
    a.host_path(bin)?;
    for lib in libraries(bin) {
        a.host_path(&lib)?;
    }
    Ok(())
}

/// A tree with lib/modules/<kver> made of hard links to the extracted
/// package, plus the depmod indexes: host kmod (30) only looks in
/// <base>/lib/modules, while trixie-era packages ship /usr/lib/modules.
fn module_root(k: &Kernel) -> anyhow::Result<PathBuf> {
    let root = cache_root().join("modroot").join(&k.kver);
    let dir = root.join("lib/modules").join(&k.kver);
    if dir.join("modules.dep.bin").is_file() {
        return Ok(root);
    }
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&dir)?;
    let status = Command::new("cp")
        .arg("-al")
        .arg(k.moddir.join("kernel"))
        .arg(dir.join("kernel"))
        .status()?;
    if !status.success() {
        bail!("cp -al of {} failed", k.moddir.display());
    }
    if let Some(meta) = &k.metadir {
        for f in [
            "modules.builtin",
            "modules.builtin.modinfo",
            "modules.order",
        ] {
            if meta.join(f).is_file() {
                std::fs::copy(meta.join(f), dir.join(f))?;
            }
        }
    }
    let status = Command::new("depmod")
        .arg("-b")
        .arg(&root)
        .arg(&k.kver)
        .status()
        .context("depmod (kmod) is needed: cargo xtask setup")?;
    if !status.success() {
        bail!("depmod -b {} {} failed", root.display(), k.kver);
    }
    Ok(root)
}

/// Module name of a modules.dep path: kernel/net/sched/sch_tbf.ko.xz → sch_tbf.
fn module_name(rel: &str) -> String {
    let file = rel.rsplit('/').next().unwrap_or(rel);
    file.split(".ko").next().unwrap_or(file).replace('-', "_")
}

/// Modules for the guest: the ones the checks load explicitly plus all of
/// kernel/net (so nft expressions, qdiscs and the like autoload through
/// /sbin/modprobe as on a real host: 5.10's nft `counter` is its own module),
/// each with its dependencies, and the depmod indexes.
fn add_modules(a: &mut Archive, k: &Kernel) -> anyhow::Result<Vec<String>> {
    let root = module_root(k)?;
    let dir = root.join("lib/modules").join(&k.kver);
    let guest_dir = format!("usr/lib/modules/{}", k.kver);
    let dep = std::fs::read_to_string(dir.join("modules.dep"))?;
    let builtin = std::fs::read_to_string(dir.join("modules.builtin")).unwrap_or_default();
    let mut found: Vec<&str> = Vec::new();
    let mut files: Vec<&str> = Vec::new();
    for line in dep.lines() {
        // "kernel/a.ko.xz: kernel/b.ko.xz kernel/c.ko.xz" (dependencies are transitive).
        let Some((module, deps)) = line.split_once(':') else {
            continue;
        };
        let name = module_name(module);
        let explicit = MODULES.iter().find(|m| **m == name);
        if explicit.is_none() && !module.starts_with("kernel/net/") {
            continue;
        }
        found.extend(explicit);
        files.push(module);
        files.extend(deps.split_whitespace());
    }
    files.sort_unstable();
    files.dedup();
    for rel in files {
        a.host_file_at(&format!("{guest_dir}/{rel}"), &dir.join(rel))?;
    }
    for e in std::fs::read_dir(&dir)? {
        let p = e?.path();
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        if name.starts_with("modules.") && p.is_file() {
            a.host_file_at(&format!("{guest_dir}/{name}"), &p)?;
        }
    }
    let builtin: Vec<String> = builtin.lines().map(module_name).collect();
    Ok(MODULES
        .iter()
        .filter(|m| !found.contains(m) && !builtin.iter().any(|b| b == *m))
        .map(|m| m.to_string())
        .collect())
}

fn init_script(mount_bpffs: bool) -> String {
    let bpffs = if mount_bpffs {
        "mount -t bpf bpffs /sys/fs/bpf"
    } else {
        "# bpffs deliberately not mounted (a fresh host before systemd mounts it)"
    };
    include_str!("init.sh")
        .replace("@BPFFS@", bpffs)
        .replace("@MODULES@", &MODULES.join(" "))
}

/// Build the compressed initramfs for one kernel at `out`. Returns the
/// modules that could not be resolved on the host (the guest reports them too).
pub fn build(k: &Kernel, payload: &Payload, out: &Path) -> anyhow::Result<Vec<String>> {
    let mut a = Archive::new();
    for tool in REQUIRED_TOOLS {
        let p =
            which(tool).with_context(|| format!("{tool} is not installed: cargo xtask setup"))?;
        add_executable(&mut a, &p)?;
    }
    for tool in OPTIONAL_TOOLS {
        if let Some(p) = which(tool) {
            add_executable(&mut a, &p)?;
        }
    }
    for d in HOST_DATA {
        let p = Path::new(d);
        if p.is_dir() {
            a.host_tree(p)?;
        } else if p.is_file() {
            a.host_path(p)?;
        }
    }
    for (name, host) in &payload.bins {
        a.host_file_at(&format!("usr/local/bin/{name}"), host)?;
        for lib in libraries(host) {
            a.host_path(&lib)?;
        }
    }
    // busybox last: its applets fill only the names the host tools left free
    // (so `sh` is busybox's ash, `ip` is iproute2's).
    let busybox = which("busybox").context("busybox is not installed: cargo xtask setup")?;
    if !libraries(&busybox).is_empty() {
        bail!("{} is dynamic: install busybox-static", busybox.display());
    }
    a.host_file_at("usr/bin/busybox", &busybox)?;
    let list = Command::new(&busybox).arg("--list-full").output()?;
    for applet in String::from_utf8_lossy(&list.stdout).lines() {
        let g = guest_path(&Path::new("/").join(applet));
        if !a.contains(&g) {
            a.symlink(&g, "/usr/bin/busybox");
        }
    }
    let missing = add_modules(&mut a, k)?;
    a.inline("init", 0o755, init_script(payload.mount_bpffs));
    a.inline("guest.sh", 0o755, payload.script);
    a.inline("etc/passwd", 0o644, "root:x:0:0:root:/root:/bin/sh\n");
    a.inline("etc/group", 0o644, "root:x:0:\n");
    a.inline("etc/hosts", 0o644, "127.0.0.1 localhost\n::1 localhost\n");
    a.dir("root");
    a.dir("var/tmp");
    a.symlink("var/run", "../run");
    a.dir("sys/fs/cgroup");

    // zstd: every kernel here has CONFIG_RD_ZSTD=y and it unpacks fastest under TCG.
    let file = std::fs::File::create(out)?;
    let mut z = Command::new("zstd")
        .args(["-q", "-3", "-T0", "-c"])
        .stdin(Stdio::piped())
        .stdout(file)
        .spawn()
        .context("zstd is needed: cargo xtask setup")?;
    let mut stdin = std::io::BufWriter::new(z.stdin.take().unwrap());
    a.write(&mut stdin)?;
    // Flush, then close zstd's stdin so it finishes.
    drop(stdin.into_inner().map_err(|e| e.into_error())?);
    if !z.wait()?.success() {
        bail!("zstd failed writing {}", out.display());
    }
    Ok(missing)
}
