//! A scratch block device the bench owns outright: a private tmpfs on a
//! unique directory, and on it the lab crate's loop device (a file of real,
//! random data, with direct I/O; detached, its file deleted and the device
//! removed on drop). tmpfs keeps the backing store in memory, so fio measures
//! the block layer and stalltrace's hooks, not a disk.
//!
//! The same on a file on the VM's own disk (`create_on_disk`): no tmpfs,
//! the loop device reading the file with direct I/O, so that the device's
//! service time is a real disk's.
//!
//! The kernel is shared with other people's tests, so everything here is
//! uniquely named and `Drop` undoes whatever was set up, on error and on panic.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::thread::sleep;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use stalltrace_lab::LoopDevice;

use super::interrupt;

pub struct LoopDisk {
    dir: PathBuf,
    mounted: bool,
    device: Option<LoopDevice>,
    /// Whether the loop driver reads the backing file with O_DIRECT (sysfs
    /// `loop/dio`); when refused it reads through the page cache, which is
    /// cheaper per I/O.
    pub direct_io: bool,
}

/// Room for the image plus stalltrace's output files.
const SLACK_MIB: u64 = 64;

impl LoopDisk {
    /// On a private tmpfs: the worst case, where the hooks' cost is as
    /// large a share of each I/O as it can be.
    pub fn create(size_mib: u64) -> anyhow::Result<Self> {
        Self::create_in("/tmp", true, size_mib)
    }

    /// On a file on the VM's own disk (/var/tmp, not a tmpfs), read with
    /// direct I/O: each I/O then waits for a real device's service time, as
    /// on a host the tracer is deployed on.
    pub fn create_on_disk(size_mib: u64) -> anyhow::Result<Self> {
        Self::create_in("/var/tmp", false, size_mib)
    }

    /// A fresh directory under `parent`, a tmpfs on it when `tmpfs`, and
    /// the loop device on a file there.
    fn create_in(parent: &str, tmpfs: bool, size_mib: u64) -> anyhow::Result<Self> {
        let dir = PathBuf::from(format!("{parent}/stalltrace-bench-{}", std::process::id()));
        // create_dir (not _all) fails if it exists: never adopt someone else's directory.
        fs::create_dir(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let mut disk = LoopDisk {
            dir,
            mounted: false,
            device: None,
            direct_io: false,
        };
        let dir = disk.dir.to_string_lossy().into_owned();
        if tmpfs {
            let opts = format!("size={}m,mode=0700", size_mib + SLACK_MIB);
            // The source name makes a leftover easy to spot in `mount` output.
            // Not --make-private afterwards: the mount has already propagated to
            // peer namespaces, and only a shared umount removes those copies too.
            run(
                "mount",
                &["-t", "tmpfs", "-o", &opts, "stalltrace-bench", &dir],
            )?;
            disk.mounted = true;
        }

        eprintln!("bench: writing {size_mib} MiB of random data to a loop device in {dir}");
        let size = u32::try_from(size_mib).context("disk size")?;
        // The lab's loop device panics on failure (it is test code); its
        // guard and ours still run as the panic unwinds.
        let device = LoopDevice::new_in(&disk.dir, size, true);
        // A Ctrl-C stops dd too: say "interrupted".
        interrupt::check()?;
        // Ask the kernel what it did: losetup may only warn when direct I/O is refused.
        disk.direct_io = fs::read_to_string(format!("/sys/block/{}/loop/dio", device.name))
            .is_ok_and(|s| s.trim() == "1");
        disk.device = Some(device);
        Ok(disk)
    }

    pub fn device(&self) -> &str {
        &self.device.as_ref().expect("set by create").dev
    }

    /// The scratch directory (on the tmpfs): removed with the disk.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for LoopDisk {
    fn drop(&mut self) {
        if let Some(device) = self.device.take() {
            let backing = format!("/sys/block/{}/loop/backing_file", device.name);
            drop(device);
            // If something still has it open (udev probing a new loop device does),
            // the kernel defers the detach to the last close: wait for that, or
            // the backing file keeps the tmpfs busy.
            wait_until(Duration::from_secs(10), || !Path::new(&backing).exists());
        }
        if self.mounted {
            let dir = self.dir.to_string_lossy().into_owned();
            let unmounted = wait_until(Duration::from_secs(5), || {
                run("umount", &[&dir]).is_ok() || !is_mounted(&self.dir)
            });
            if !unmounted {
                // Last resort: take it out of the tree now; the kernel frees the
                // tmpfs when its last user (a lingering loop device) lets go.
                eprintln!("bench: {dir} busy; unmounting lazily");
                let _ = run("umount", &["-l", &dir]);
            }
        }
        if let Err(e) = fs::remove_dir_all(&self.dir) {
            eprintln!("bench: cannot remove {}: {e}", self.dir.display());
        }
    }
}

pub fn is_mounted(dir: &Path) -> bool {
    let dir = dir.to_string_lossy();
    fs::read_to_string("/proc/self/mounts")
        .is_ok_and(|m| m.lines().any(|l| l.split(' ').nth(1) == Some(&*dir)))
}

/// Loop devices whose backing file lies under `dir` (`losetup -a` lines).
pub fn loops_under(dir: &Path) -> Vec<String> {
    let dir = dir.to_string_lossy();
    crate::util::output("losetup", &["-a"])
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains(&*dir))
        .map(str::to_string)
        .collect()
}

fn wait_until(limit: Duration, mut done: impl FnMut() -> bool) -> bool {
    let until = Instant::now() + limit;
    loop {
        if done() {
            return true;
        }
        if Instant::now() >= until {
            return false;
        }
        sleep(Duration::from_millis(100));
    }
}

fn run(program: &str, args: &[&str]) -> anyhow::Result<()> {
    capture(program, args).map(drop)
}

/// Stdout of a command, trimmed; its stderr in the error when it fails.
fn capture(program: &str, args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new(program)
        .args(args)
        .output()
        .with_context(|| format!("cannot start {program}"))?;
    if !out.status.success() {
        bail!(
            "{program} {} failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}
