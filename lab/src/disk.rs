//! Loop devices over files in memory or on disk, with their queue settings,
//! and /proc/diskstats as the kernel's own account of them.
//!
//! Each device is detached, its backing file deleted, and the device itself
//! removed (LOOP_CTL_REMOVE) on drop, also when a test panics.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::util::{sh, unique};

/// Where the backing file lives: a real disk (ext4 here) or memory.
#[derive(Clone, Copy, Debug)]
pub enum Backing {
    Disk,
    Tmpfs,
}

/// A loop device over a file of real (random) data, detached and deleted on drop.
pub struct LoopDevice {
    pub dev: String,  // "/dev/loop3"
    pub name: String, // "loop3"
    pub major: u32,
    pub minor: u32,
    backing: PathBuf,
}

impl LoopDevice {
    /// `direct_io`: the loop driver reads its file with O_DIRECT, so the device
    /// time is the backing disk's, not the page cache's.
    pub fn new(backing: Backing, size_mib: u32, direct_io: bool) -> Self {
        let dir = match backing {
            Backing::Disk => "/var/tmp",
            Backing::Tmpfs => "/dev/shm",
        };
        Self::new_in(Path::new(dir), size_mib, direct_io)
    }

    /// A loop device over a new file in `dir` (tmpfs or a filesystem that takes O_DIRECT).
    pub fn new_in(dir: &Path, size_mib: u32, direct_io: bool) -> Self {
        let file = dir.join(format!("{}.img", unique("stalltrace-test")));
        // Real data: reads of a sparse file's holes never reach the disk. Written
        // with O_DIRECT so no writeback of it lands in the middle of a measurement
        // (tmpfs takes no O_DIRECT: synchronous writes there).
        let on_tmpfs = dir.starts_with("/dev/shm");
        let oflag = if on_tmpfs {
            "oflag=sync"
        } else {
            "oflag=direct"
        };
        sh(
            "dd",
            &[
                "if=/dev/urandom",
                &format!("of={}", file.display()),
                "bs=1M",
                &format!("count={size_mib}"),
                oflag,
                "status=none",
            ],
        );
        let mut args = vec!["--find", "--show"];
        if direct_io {
            args.push("--direct-io=on");
        }
        let file_arg = file.to_string_lossy().into_owned();
        args.push(&file_arg);
        let out = Command::new("losetup")
            .args(&args)
            .output()
            .expect("losetup");
        if !out.status.success() {
            let _ = std::fs::remove_file(&file);
            panic!("losetup failed: {}", String::from_utf8_lossy(&out.stderr));
        }
        let dev = String::from_utf8_lossy(&out.stdout).trim().to_string();
        let name = dev.trim_start_matches("/dev/").to_string();
        let numbers = std::fs::read_to_string(format!("/sys/block/{name}/dev")).unwrap();
        let (major, minor) = numbers.trim().split_once(':').unwrap();
        let loop_dev = Self {
            dev,
            name,
            major: major.parse().unwrap(),
            minor: minor.parse().unwrap(),
            backing: file,
        };
        // udev's blkid probe of a new device would otherwise land in the measurements.
        let _ = Command::new("udevadm")
            .args(["settle", "--timeout=5"])
            .status();
        loop_dev
    }

    pub fn set_queue(&self, attribute: &str, value: &str) {
        let path = format!("/sys/block/{}/queue/{attribute}", self.name);
        std::fs::write(&path, value).unwrap_or_else(|e| panic!("writing {value} to {path}: {e}"));
    }

    pub fn diskstats(&self) -> DiskStats {
        DiskStats::read(&self.name)
    }

    /// The kernel's own in-flight counts (reads, writes) for this disk.
    pub fn kernel_inflight(&self) -> (u64, u64) {
        let text = std::fs::read_to_string(format!("/sys/block/{}/inflight", self.name)).unwrap();
        let v: Vec<u64> = text
            .split_whitespace()
            .map(|x| x.parse().unwrap())
            .collect();
        (v[0], v[1])
    }
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        // Only while it is still ours: if something else detached it, the
        // number may already serve another test or bench on this kernel, and
        // detaching or removing it would pull that one's disk from under it.
        let backing =
            std::fs::read_to_string(format!("/sys/block/{}/loop/backing_file", self.name))
                .unwrap_or_default();
        if Path::new(backing.trim()) == self.backing {
            let _ = Command::new("losetup").args(["-d", &self.dev]).status();
            remove_loop_device(self.minor);
        }
        let _ = std::fs::remove_file(&self.backing);
    }
}

/// Delete the (detached) loop device itself, so the next test that gets this
/// number gets a new queue. A detached loop device keeps its queue, and on
/// 6.18 a driver tag depth lowered through nr_requests with scheduler `none`
/// does not come back when nr_requests is raised again: a later user of the
/// same loop number would be silently limited.
fn remove_loop_device(minor: u32) {
    const LOOP_CTL_REMOVE: libc::c_ulong = 0x4C81;
    let Ok(ctl) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/loop-control")
    else {
        return;
    };
    for _ in 0..50 {
        // SAFETY: ioctl on a file we own; LOOP_CTL_REMOVE takes the device number by value.
        let rc = unsafe {
            libc::ioctl(
                std::os::fd::AsRawFd::as_raw_fd(&ctl),
                LOOP_CTL_REMOVE,
                minor as libc::c_ulong,
            )
        };
        if rc >= 0 {
            return;
        }
        // EBUSY while udev still has it open after the detach.
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A line of /proc/diskstats, parsed here on purpose rather than with the
/// code under test: it is the independent oracle.
#[derive(Clone, Copy, Debug, Default)]
pub struct DiskStats {
    pub reads_completed: u64,
    /// Bios the block layer merged into a read request it already had.
    pub reads_merged: u64,
    pub read_ticks_ms: u64,
    pub writes_completed: u64,
}

impl DiskStats {
    pub fn read(name: &str) -> Self {
        let text = std::fs::read_to_string("/proc/diskstats").unwrap();
        for line in text.lines() {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.get(2) == Some(&name) {
                let n = |i: usize| f[i].parse::<u64>().unwrap();
                return Self {
                    reads_completed: n(3),
                    reads_merged: n(4),
                    read_ticks_ms: n(6),
                    writes_completed: n(7),
                };
            }
        }
        panic!("{name} not in /proc/diskstats");
    }
}
