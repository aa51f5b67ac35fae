//! Block devices as sysfs describes them: names and queue limits.

use std::path::{Path, PathBuf};

pub use crate::records::block::QueueLimits;

/// Root of sysfs; tests point it at a fixture tree.
#[derive(Clone, Debug)]
pub struct Sysfs {
    root: PathBuf,
}

impl Default for Sysfs {
    fn default() -> Self {
        Self {
            root: PathBuf::from("/sys"),
        }
    }
}

impl Sysfs {
    pub fn at(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    /// Kernel name of a disk (`loop3`, `nvme0n1`), from /sys/dev/block/MAJ:MIN.
    pub fn disk_name(&self, major: u32, minor: u32) -> Option<String> {
        let link = std::fs::read_link(self.root.join(format!("dev/block/{major}:{minor}"))).ok()?;
        Some(link.file_name()?.to_string_lossy().into_owned())
    }

    /// Whole disks with a non-zero size: `(name, major, first minor)`.
    pub fn disks_with_media(&self) -> Vec<(String, u32, u32)> {
        let Ok(dir) = std::fs::read_dir(self.root.join("block")) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for entry in dir.flatten() {
            let base = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            let size = read_u64(&base.join("size")).unwrap_or(0);
            let dev = read(&base.join("dev"));
            let Some((major, minor)) = dev.as_deref().and_then(|d| d.split_once(':')) else {
                continue;
            };
            if let (Ok(major), Ok(minor), true) = (major.parse(), minor.parse(), size > 0) {
                out.push((name, major, minor));
            }
        }
        out.sort();
        out
    }

    /// Whether `disk` is request-based (blk-mq: it has an `mq` directory): its
    /// I/O reaches the request hooks. Bio-based disks (device-mapper, md,
    /// zram) complete bios only.
    pub fn request_based(&self, disk: &str) -> bool {
        self.root.join("block").join(disk).join("mq").is_dir()
    }

    /// The whole disk `spec` names, as `(name, major, first minor)`: a name in
    /// /sys/class/block (`sda`, `nvme0n1`, `dm-0`), a /dev path (symlinks
    /// such as /dev/disk/by-id/... followed), or `MAJOR:MINOR`. A partition
    /// names the disk it is on (records are per whole disk).
    pub fn whole_disk(&self, spec: &str) -> Option<(String, u32, u32)> {
        let is_dev_number = spec
            .split_once(':')
            .is_some_and(|(a, b)| a.parse::<u32>().is_ok() && b.parse::<u32>().is_ok());
        let device = if is_dev_number {
            self.root.join("dev/block").join(spec)
        } else {
            let name = if spec.starts_with('/') {
                let node = std::fs::canonicalize(spec).ok()?;
                node.file_name()?.to_string_lossy().into_owned()
            } else {
                spec.to_string()
            };
            if name.is_empty() || name.contains('/') || name.starts_with('.') {
                return None;
            }
            self.root.join("class/block").join(name)
        };
        let mut dir = std::fs::canonicalize(device).ok()?;
        if dir.join("partition").exists() {
            dir = dir.parent()?.to_path_buf();
        }
        let dev = read(&dir.join("dev"))?;
        let (major, minor) = dev.split_once(':')?;
        let name = dir.file_name()?.to_string_lossy().into_owned();
        Some((name, major.parse().ok()?, minor.parse().ok()?))
    }

    /// The kernel's own count of requests in flight (reads, writes): `/sys/block/X/inflight`.
    /// For blk-mq disks it only counts requests with I/O accounting on.
    pub fn kernel_inflight(&self, disk: &str) -> Option<(u64, u64)> {
        let text = read(&self.root.join("block").join(disk).join("inflight"))?;
        let mut it = text.split_whitespace().map(|v| v.parse::<u64>());
        match (it.next(), it.next()) {
            (Some(Ok(r)), Some(Ok(w))) => Some((r, w)),
            _ => None,
        }
    }

    /// Whether the disk keeps I/O statistics (`queue/iostats`).
    pub fn io_accounting(&self, disk: &str) -> Option<bool> {
        read_u64(&self.root.join("block").join(disk).join("queue/iostats")).map(|v| v == 1)
    }

    pub fn queue_limits(&self, disk: &str) -> QueueLimits {
        let base = self.root.join("block").join(disk);
        let mq = base.join("mq");
        let nr_hw_queues = std::fs::read_dir(&mq).ok().map(|d| d.count() as u64);
        QueueLimits {
            scheduler: read(&base.join("queue/scheduler"))
                .as_deref()
                .and_then(active_scheduler),
            nr_requests: read_u64(&base.join("queue/nr_requests")),
            hw_queue_depth: read_u64(&mq.join("0/nr_tags")),
            nr_hw_queues: nr_hw_queues.filter(|&n| n > 0),
            device_queue_depth: read_u64(&base.join("device/queue_depth")),
        }
    }
}

fn read(path: &Path) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_string())
}

fn read_u64(path: &Path) -> Option<u64> {
    read(path)?.parse().ok()
}

/// `none [mq-deadline] kyber` -> `mq-deadline`; a single entry is the active one.
fn active_scheduler(line: &str) -> Option<String> {
    let mut words = line.split_whitespace();
    let all: Vec<&str> = words.by_ref().collect();
    if let Some(active) = all.iter().find(|w| w.starts_with('[')) {
        return Some(active.trim_matches(|c| c == '[' || c == ']').to_string());
    }
    (all.len() == 1).then(|| all[0].to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scheduler_line_is_parsed() {
        assert_eq!(
            active_scheduler("none [mq-deadline] kyber bfq"),
            Some("mq-deadline".into())
        );
        assert_eq!(active_scheduler("[none] mq-deadline"), Some("none".into()));
        assert_eq!(active_scheduler("none"), Some("none".into()));
        assert_eq!(active_scheduler(""), None);
    }

    #[test]
    fn a_disk_is_named_by_its_name_a_partition_or_its_numbers() {
        let root = tempfile::tempdir().unwrap();
        let sys = root.path();
        let sda = sys.join("devices/pci0/block/sda");
        std::fs::create_dir_all(sda.join("sda1")).unwrap();
        std::fs::write(sda.join("dev"), "8:0\n").unwrap();
        std::fs::write(sda.join("sda1/dev"), "8:1\n").unwrap();
        std::fs::write(sda.join("sda1/partition"), "1\n").unwrap();
        std::fs::create_dir_all(sys.join("class/block")).unwrap();
        std::fs::create_dir_all(sys.join("dev/block")).unwrap();
        let link = |target: &Path, at: PathBuf| std::os::unix::fs::symlink(target, at).unwrap();
        link(&sda, sys.join("class/block/sda"));
        link(&sda.join("sda1"), sys.join("class/block/sda1"));
        link(&sda, sys.join("dev/block/8:0"));
        link(&sda.join("sda1"), sys.join("dev/block/8:1"));
        let sysfs = Sysfs::at(sys);
        let sda = Some(("sda".to_string(), 8, 0));
        for spec in ["sda", "sda1", "8:0", "8:1"] {
            assert_eq!(sysfs.whole_disk(spec), sda, "{spec}");
        }
        for spec in ["sdb", "9:0", "", "../sda", "/nonexistent/sda"] {
            assert_eq!(sysfs.whole_disk(spec), None, "{spec}");
        }
    }

    #[test]
    fn limits_read_from_a_sysfs_tree() {
        let root = std::env::temp_dir().join(format!("stalltrace-sysfs-{}", std::process::id()));
        let disk = root.join("block/sdz");
        std::fs::create_dir_all(disk.join("queue")).unwrap();
        std::fs::create_dir_all(disk.join("mq/0")).unwrap();
        std::fs::create_dir_all(disk.join("mq/1")).unwrap();
        std::fs::create_dir_all(disk.join("device")).unwrap();
        std::fs::write(disk.join("queue/scheduler"), "[none] mq-deadline\n").unwrap();
        std::fs::write(disk.join("queue/nr_requests"), "64\n").unwrap();
        std::fs::write(disk.join("mq/0/nr_tags"), "128\n").unwrap();
        std::fs::write(disk.join("device/queue_depth"), "32\n").unwrap();
        std::fs::write(disk.join("dev"), "8:0\n").unwrap();
        std::fs::write(disk.join("size"), "2048\n").unwrap();
        std::fs::write(disk.join("inflight"), "       0        3\n").unwrap();
        std::fs::write(disk.join("queue/iostats"), "1\n").unwrap();
        std::fs::create_dir_all(root.join("block/loop7")).unwrap();
        std::fs::write(root.join("block/loop7/dev"), "7:7\n").unwrap();
        std::fs::write(root.join("block/loop7/size"), "0\n").unwrap();
        std::fs::create_dir_all(root.join("dev/block")).unwrap();
        std::os::unix::fs::symlink("../../block/sdz", root.join("dev/block/8:0")).unwrap();

        let sys = Sysfs::at(&root);
        assert_eq!(sys.disk_name(8, 0).as_deref(), Some("sdz"));
        assert_eq!(sys.disk_name(8, 16), None);
        assert_eq!(sys.disks_with_media(), [("sdz".to_string(), 8, 0)]);
        assert_eq!(sys.kernel_inflight("sdz"), Some((0, 3)));
        assert_eq!(sys.io_accounting("sdz"), Some(true));
        assert_eq!(sys.kernel_inflight("loop7"), None);
        let q = sys.queue_limits("sdz");
        std::fs::remove_dir_all(&root).unwrap();
        assert_eq!(
            q,
            QueueLimits {
                scheduler: Some("none".into()),
                nr_requests: Some(64),
                hw_queue_depth: Some(128),
                nr_hw_queues: Some(2),
                device_queue_depth: Some(32),
            }
        );
    }
}
