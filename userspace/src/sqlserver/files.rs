//! SQL Server's database files, the block devices under them, and where on
//! those devices each file lies: so a `block` record can say what a disk holds
//! (its role) and a `slow_io` record which file the slow I/O touched.

use std::collections::BTreeSet;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::host;
use crate::records::sql::OverlayFile;

/// What a file is to SQL Server, from its name (SQL Server's own conventions).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    Data,
    Log,
    Tempdb,
    Backup,
}

impl Role {
    pub fn name(self) -> &'static str {
        match self {
            Role::Data => "data",
            Role::Log => "log",
            Role::Tempdb => "tempdb",
            Role::Backup => "backup",
        }
    }
}

/// `.mdf`/`.ndf` data, `.ldf` log, tempdb's own files, `.bak`/`.trn` backups.
pub fn classify(path: &Path) -> Option<Role> {
    let name = path.file_name()?.to_string_lossy().to_ascii_lowercase();
    let ext = path.extension()?.to_string_lossy().to_ascii_lowercase();
    let tempdb =
        name.starts_with("tempdb") || name.starts_with("templog") || name.starts_with("tempdev");
    match ext.as_str() {
        "mdf" | "ndf" | "ldf" if tempdb => Some(Role::Tempdb),
        "mdf" | "ndf" => Some(Role::Data),
        "ldf" => Some(Role::Log),
        "bak" | "trn" => Some(Role::Backup),
        _ => None,
    }
}

/// A whole disk (the key of `block` records), by major and first minor.
pub type Disk = (u32, u32);

/// One database file and where it lives.
#[derive(Clone, Debug, Serialize)]
pub struct DbFile {
    pub path: PathBuf,
    pub role: Role,
    /// The whole disks under it: the filesystem's own disk first, then, for
    /// device-mapper and md, the disks under those (as `major:minor`).
    #[serde(serialize_with = "disk_names")]
    pub disks: Vec<Disk>,
    /// On overlayfs (a container's root): where its writes go.
    pub overlay: Option<OverlayFile>,
    /// Its extents on the filesystem's disk, in 512-byte sectors (start, end
    /// exclusive), from FIEMAP. Empty when the filesystem cannot say.
    #[serde(skip)]
    pub extents: Vec<(u64, u64)>,
}

fn disk_names<S: serde::Serializer>(disks: &[Disk], s: S) -> Result<S::Ok, S::Error> {
    s.collect_seq(disks.iter().map(|(ma, mi)| format!("{ma}:{mi}")))
}

impl DbFile {
    /// `path`, a database file as the worker names it (in its own mount
    /// namespace: a container's paths are not the host's), reached `through`
    /// the worker's descriptor (/proc/PID/fd/N): that very file, whatever
    /// stalltrace's own root and mounts hold at that path.
    pub fn locate(path: &Path, through: &Path, role: Role, sys: &Path) -> Option<Self> {
        let meta = std::fs::metadata(through)
            .map_err(|e| closed(path, &e, "stat", "has no disk role"))
            .ok()?;
        if !meta.is_file() {
            return None; // a FIFO or device named like a database file: never opened
        }
        let (mut dev, mut overlay) = (meta.dev(), None);
        if libc::major(dev) == 0 {
            if !host::overlay::is_on_overlay(through) {
                return None; // tmpfs and the like: no block I/O to attribute
            }
            // `through` is /proc/PID/fd/N: the worker's mounts say where its writes go.
            let upper = std::fs::read_to_string(through.parent()?.parent()?.join("mountinfo"))
                .ok()
                .and_then(|mounts| host::overlay::upper_dir(&mounts, path))
                .and_then(|dir| Some((std::fs::metadata(&dir).ok()?.dev(), dir)));
            dev = upper.as_ref().map_or(0, |(upper_dev, _)| *upper_dev);
            overlay = Some(OverlayFile {
                upper_dir: upper.map(|(_, dir)| dir),
            });
        }
        let (major, minor) = (libc::major(dev), libc::minor(dev));
        if major == 0 {
            // On overlayfs with its upper directory out of reach: listed, on no disk.
            return Some(Self {
                path: path.to_path_buf(),
                role,
                disks: Vec::new(),
                overlay,
                extents: Vec::new(),
            });
        }
        let node = sys.join(format!("dev/block/{major}:{minor}"));
        // A partition's sectors are offset from its disk's, and requests carry the disk's.
        let (disk, offset) = if node.join("partition").exists() {
            let start = read_u64(&node.join("start")).unwrap_or(0);
            (parent_disk(&node)?, start)
        } else {
            ((major, minor), 0)
        };
        let mut disks = vec![disk];
        below(sys, disk, &mut disks, 0);
        let extents = fiemap(through)
            .map_err(|e| closed(path, &e, "FIEMAP (open)", "keeps its disk role but has"))
            .ok()
            .flatten()
            .unwrap_or_default()
            .into_iter()
            .map(|(phys, len)| (offset + phys / 512, offset + (phys + len).div_ceil(512)))
            .collect();
        Some(Self {
            path: path.to_path_buf(),
            role,
            disks,
            overlay,
            extents,
        })
    }

    /// Whether `sector` of `disk` belongs to this file.
    pub fn holds(&self, disk: Disk, sector: u64) -> bool {
        self.disks.first() == Some(&disk)
            && self.extents.iter().any(|&(s, e)| (s..e).contains(&sector))
    }
}

/// Says (once) that a database file in a directory closed to stalltrace
/// could not be `what`-ed: reaching it needs CAP_DAC_READ_SEARCH.
fn closed(path: &Path, e: &std::io::Error, what: &str, so: &str) {
    if e.kind() == std::io::ErrorKind::PermissionDenied {
        crate::host::caps::degraded(
            "sqlserver",
            &format!("{what} of database file {} ({e})", path.display()),
            &[crate::host::caps::CAP_DAC_READ_SEARCH],
            &format!("a database file in a directory closed to others {so} and no file per sector"),
        );
    }
}

fn read_u64(path: &Path) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

fn dev_of(node: &Path) -> Option<Disk> {
    let text = std::fs::read_to_string(node.join("dev")).ok()?;
    let (ma, mi) = text.trim().split_once(':')?;
    Some((ma.parse().ok()?, mi.parse().ok()?))
}

/// /sys/dev/block/M:m of a partition links to .../block/sda/sda1: its parent is the disk.
fn parent_disk(partition: &Path) -> Option<Disk> {
    let real = std::fs::canonicalize(partition).ok()?;
    dev_of(real.parent()?)
}

/// Disks under a device-mapper or md device (`slaves/`) or under a loop
/// device (the disk holding its backing file), recursively.
fn below(sys: &Path, disk: Disk, out: &mut Vec<Disk>, depth: u32) {
    if depth > 8 {
        return;
    }
    let node = sys.join(format!("dev/block/{}:{}", disk.0, disk.1));
    let mut found = BTreeSet::new();
    if let Some(backing) = loop_backing_disk(sys, &node) {
        found.insert(backing);
    }
    for entry in std::fs::read_dir(node.join("slaves"))
        .into_iter()
        .flatten()
        .flatten()
    {
        let node = entry.path();
        let Some(dev) = dev_of(&node) else { continue };
        let whole = if node.join("partition").exists() {
            parent_disk(&node).unwrap_or(dev)
        } else {
            dev
        };
        found.insert(whole);
    }
    for d in found {
        if !out.contains(&d) {
            out.push(d);
            below(sys, d, out, depth + 1);
        }
    }
}

/// The whole disk under a loop device's backing file (a regular file on some
/// filesystem): a loop device's I/O becomes that disk's I/O.
fn loop_backing_disk(sys: &Path, node: &Path) -> Option<Disk> {
    let file = std::fs::read_to_string(node.join("loop/backing_file")).ok()?;
    let dev = std::fs::metadata(file.trim_end()).ok()?.dev();
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    if major == 0 {
        return None; // tmpfs: memory, no disk below
    }
    let backing = sys.join(format!("dev/block/{major}:{minor}"));
    if backing.join("partition").exists() {
        parent_disk(&backing)
    } else {
        Some((major, minor))
    }
}

/// The file's extents on its filesystem's device as (physical byte offset,
/// length); an error only when it cannot be opened. FS_IOC_FIEMAP by hand: a few lines of ioctl, where the crates that
/// wrap it are unmaintained.
fn fiemap(path: &Path) -> std::io::Result<Option<Vec<(u64, u64)>>> {
    const FS_IOC_FIEMAP: libc::c_ulong = 0xC020_660B; // _IOWR('f', 11, struct fiemap)
    const FIEMAP_FLAG_SYNC: u32 = 1;
    const MAX_EXTENTS: usize = 512;
    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    struct Extent {
        logical: u64,
        physical: u64,
        length: u64,
        reserved64: [u64; 2],
        flags: u32,
        reserved: [u32; 3],
    }
    #[repr(C)]
    struct Fiemap {
        start: u64,
        length: u64,
        flags: u32,
        mapped_extents: u32,
        extent_count: u32,
        reserved: u32,
        extents: [Extent; MAX_EXTENTS],
    }
    let file = std::fs::File::open(path)?;
    let mut map = Box::new(Fiemap {
        start: 0,
        length: u64::MAX,
        flags: FIEMAP_FLAG_SYNC,
        mapped_extents: 0,
        extent_count: MAX_EXTENTS as u32,
        reserved: 0,
        extents: [Extent::default(); MAX_EXTENTS],
    });
    // SAFETY: FS_IOC_FIEMAP fills at most extent_count extents of the struct we own.
    let rc = unsafe { libc::ioctl(file.as_raw_fd(), FS_IOC_FIEMAP, &mut *map as *mut Fiemap) };
    if rc != 0 {
        return Ok(None); // the filesystem cannot say
    }
    let n = (map.mapped_extents as usize).min(MAX_EXTENTS);
    Ok(Some(
        map.extents[..n]
            .iter()
            .map(|e| (e.physical, e.length))
            .collect(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_follow_sql_server_file_names() {
        let role = |p: &str| classify(Path::new(p));
        assert_eq!(role("/var/opt/mssql/data/sales.mdf"), Some(Role::Data));
        assert_eq!(role("/data/SALES_2.NDF"), Some(Role::Data));
        assert_eq!(role("/log/sales_log.ldf"), Some(Role::Log));
        assert_eq!(role("/var/opt/mssql/data/tempdb.mdf"), Some(Role::Tempdb));
        assert_eq!(role("/var/opt/mssql/data/templog.ldf"), Some(Role::Tempdb));
        assert_eq!(
            role("/var/opt/mssql/data/tempdb_mssql_2.ndf"),
            Some(Role::Tempdb)
        );
        assert_eq!(role("/backup/sales_full.bak"), Some(Role::Backup));
        assert_eq!(role("/var/opt/mssql/log/errorlog"), None);
        assert_eq!(role("/etc/passwd"), None);
    }

    #[test]
    fn locates_a_file_on_its_disk() {
        // A file on the machine's disk (ext4 here), with extents once written and synced.
        let path =
            Path::new("/var/tmp").join(format!("stalltrace-fiemap-{}.mdf", std::process::id()));
        std::fs::write(&path, vec![7u8; 1 << 20]).unwrap();
        let f = DbFile::locate(&path, &path, Role::Data, Path::new("/sys"));
        std::fs::remove_file(&path).unwrap();
        let f = f.expect("a file on a block device");
        assert!(!f.disks.is_empty());
        // tmpfs has no extents; a real filesystem has at least one.
        if let Some(&(s, e)) = f.extents.first() {
            assert!(e > s);
            assert!(f.holds(f.disks[0], s));
            assert!(!f.holds(f.disks[0], e));
        }
    }
}
