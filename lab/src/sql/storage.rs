//! Filesystems on loop devices for the simulator's files, and a blkio cgroup
//! that makes one of those devices slow.
//!
//! Every guard undoes what it made on drop, in the order the fields are
//! declared, so a failing test leaves no mount, loop device or cgroup.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::disk::{Backing, LoopDevice};
use crate::util::{sh, unique};

/// An ext4 filesystem on a loop device, mounted on a directory of its own.
pub struct Mounted {
    pub dir: PathBuf,
    pub disk: LoopDevice,
}

impl Mounted {
    pub fn new(disk: LoopDevice) -> Self {
        // Initialised now, so no lazy-init writes from ext4lazyinit land in a test.
        sh(
            "mkfs.ext4",
            &[
                "-q",
                "-F",
                "-E",
                "lazy_itable_init=0,lazy_journal_init=0",
                &disk.dev,
            ],
        );
        let dir = std::env::temp_dir().join(unique("stalltrace-mnt"));
        std::fs::create_dir(&dir).unwrap();
        let mounted = Self { dir, disk };
        sh(
            "mount",
            &[&mounted.disk.dev, &mounted.dir.to_string_lossy()],
        );
        mounted
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        // A loop device detached from a file on this filesystem lets go of the
        // file asynchronously: busy for a moment.
        for _ in 0..100 {
            let ok = Command::new("umount")
                .arg(&self.dir)
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if ok || !is_mount_point(&self.dir) {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = std::fs::remove_dir(&self.dir);
    }
}

fn is_mount_point(dir: &Path) -> bool {
    let dir = dir.to_string_lossy();
    std::fs::read_to_string("/proc/self/mounts")
        .unwrap_or_default()
        .lines()
        .any(|l| l.split_whitespace().nth(1) == Some(&*dir))
}

/// A blkio cgroup (cgroup v1 `blkio`, or v2 `io`) whose members' writes to a
/// device are throttled.
///
/// Why this makes a device slow as the block layer sees it: the throttle holds
/// bios before they reach a device's queue, so it is invisible on the
/// throttled device itself. Stacked under a loop device with direct I/O, whose
/// worker submits in the cgroup of the I/O it serves, the wait lands inside
/// the upper device's issue → complete time: a slow disk, as SQL Server sees one.
pub struct Cgroup {
    dir: PathBuf,
    v2: bool,
    /// Made by the lab, and removed when dropped; else another's (a container's).
    owned: bool,
}

impl Cgroup {
    // Not a Default: it builds things on the shared kernel (and needs root).
    #[allow(clippy::new_without_default)]
    pub fn new() -> Self {
        let v1 = Path::new("/sys/fs/cgroup/blkio");
        let v2_roots = ["/sys/fs/cgroup/unified", "/sys/fs/cgroup"];
        let (parent, v2) = if v1.join("cgroup.procs").exists() {
            (v1.to_path_buf(), false)
        } else if let Some(root) = v2_roots.iter().map(Path::new).find(|r| {
            std::fs::read_to_string(r.join("cgroup.subtree_control"))
                .is_ok_and(|c| c.split_whitespace().any(|x| x == "io"))
        }) {
            (root.to_path_buf(), true)
        } else {
            panic!("no blkio (v1) or io (v2) cgroup controller to throttle a device with");
        };
        let dir = parent.join(unique("stalltrace-test"));
        std::fs::create_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        Self {
            dir,
            v2,
            owned: true,
        }
    }

    /// The cgroup process `pid` is in (its blkio one on v1), to throttle a
    /// device for it: a container's, which its runtime removes.
    pub fn of_process(pid: u32) -> Self {
        let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
        let path = |controllers: &str| {
            text.lines().find_map(|l| {
                let mut parts = l.splitn(3, ':');
                let (_, c, path) = (parts.next()?, parts.next()?, parts.next()?);
                (c == controllers).then(|| path.trim_start_matches('/').to_string())
            })
        };
        let blkio = Path::new("/sys/fs/cgroup/blkio");
        let (dir, v2) = match path("blkio") {
            Some(p) if blkio.join("cgroup.procs").exists() => (blkio.join(p), false),
            _ => (
                Path::new("/sys/fs/cgroup").join(path("").expect("a v2 cgroup")),
                true,
            ),
        };
        assert!(dir.is_dir(), "{} of pid {pid}", dir.display());
        Self {
            dir,
            v2,
            owned: false,
        }
    }

    pub(crate) fn procs_file(&self) -> File {
        std::fs::OpenOptions::new()
            .write(true)
            .open(self.dir.join("cgroup.procs"))
            .unwrap()
    }

    /// Allow the members at most `iops` writes per second to `disk`.
    pub fn limit_write_iops(&self, disk: &LoopDevice, iops: u32) {
        self.limit(disk, "write", iops);
    }

    /// Allow the members at most `iops` reads per second from `disk`.
    pub fn limit_read_iops(&self, disk: &LoopDevice, iops: u32) {
        self.limit(disk, "read", iops);
    }

    fn limit(&self, disk: &LoopDevice, op: &str, iops: u32) {
        let (file, value) = if self.v2 {
            (
                "io.max".to_string(),
                format!("{}:{} {}iops={iops}", disk.major, disk.minor, &op[..1]),
            )
        } else {
            (
                format!("blkio.throttle.{op}_iops_device"),
                format!("{}:{} {iops}", disk.major, disk.minor),
            )
        };
        std::fs::write(self.dir.join(&file), &value)
            .unwrap_or_else(|e| panic!("writing {value} to {file}: {e}"));
    }

    /// Make `cmd` join this cgroup before it execs.
    pub fn enter_on_exec(&self, cmd: &mut Command) {
        use std::os::fd::AsRawFd;
        use std::os::unix::process::CommandExt;
        let procs = self.procs_file();
        // SAFETY: write(2) of a static buffer is async-signal-safe; "0" is
        // the writing process itself, so the child joins before it execs.
        unsafe {
            cmd.pre_exec(move || {
                if libc::write(procs.as_raw_fd(), b"0".as_ptr().cast(), 1) != 1 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        if !self.owned {
            return;
        }
        // Empty once its processes are gone (the guards declared after it).
        for _ in 0..50 {
            if std::fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// A slow disk for SQL Server's log: ext4 on a loop device (direct I/O) whose
/// backing file lives on a second, throttled loop device.
pub struct SlowDisk {
    pub upper: Mounted,
    pub lower: Mounted,
}

impl SlowDisk {
    pub fn new(size_mib: u32) -> Self {
        let lower = Mounted::new(LoopDevice::new(Backing::Tmpfs, size_mib * 2, false));
        let upper = Mounted::new(LoopDevice::new_in(&lower.dir, size_mib, true));
        Self { upper, lower }
    }

    /// Throttle the lower device's writes for the cgroup's processes.
    pub fn slow_down(&self, cgroup: &Cgroup, write_iops: u32) {
        cgroup.limit_write_iops(&self.lower.disk, write_iops);
    }

    /// Throttle the lower device's reads for the cgroup's processes.
    pub fn slow_down_reads(&self, cgroup: &Cgroup, read_iops: u32) {
        cgroup.limit_read_iops(&self.lower.disk, read_iops);
    }
}
