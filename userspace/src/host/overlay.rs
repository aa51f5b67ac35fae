//! overlayfs, a container's root: a file on it has no block device of its
//! own (stat gives the overlay's anonymous one); what it writes goes to the
//! upper directory's filesystem, so that directory's disk is the file's.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

/// statfs(2) f_type of overlayfs.
const OVERLAYFS_SUPER_MAGIC: i64 = 0x794c_7630;

/// Whether the open file at `path` lives on overlayfs.
pub fn is_on_overlay(path: &Path) -> bool {
    let Ok(file) = File::open(path) else {
        return false;
    };
    // SAFETY: fstatfs writes into `fs`, valid for writes; all-zero is a valid statfs.
    unsafe {
        let mut fs: libc::statfs = std::mem::zeroed();
        libc::fstatfs(file.as_raw_fd(), &mut fs) == 0 && fs.f_type as i64 == OVERLAYFS_SUPER_MAGIC
    }
}

/// The upper directory of the overlay mount that holds `path` as the
/// process whose /proc/PID/mountinfo is `mountinfo` names it: the innermost
/// overlay mount point above `path`. The directory is as it was given to
/// mount(2), i.e. a path in the mounter's (the runtime's) namespace.
pub fn upper_dir(mountinfo: &str, path: &Path) -> Option<PathBuf> {
    mountinfo
        .lines()
        .filter_map(|line| {
            let (mount, sb) = line.split_once(" - ")?;
            let mount_point = unescape(mount.split(' ').nth(4)?);
            let mut sb = sb.split(' ');
            if sb.next()? != "overlay" {
                return None;
            }
            let options = sb.nth(1)?;
            let upper = options
                .split(',')
                .find_map(|o| o.strip_prefix("upperdir="))?;
            path.starts_with(&mount_point)
                .then(|| (mount_point.len(), PathBuf::from(unescape(upper))))
        })
        .max_by_key(|(depth, _)| *depth)
        .map(|(_, upper)| upper)
}

/// mountinfo's octal escapes (`\040` for a space, `\054` for a comma).
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|d| bytes[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)))
            .map(|d| d.iter().fold(0u8, |n, c| n.wrapping_mul(8) + (c - b'0')));
        match octal {
            Some(byte) => {
                out.push(byte);
                i += 4;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A podman container's root (runc, overlay driver) and a volume on it.
    const MOUNTINFO: &str = "\
1290 1200 0:91 / / rw,relatime - overlay overlay rw,lowerdir=/var/lib/containers/storage/overlay/l/ABC,upperdir=/var/lib/containers/storage/overlay/0f3e/diff,workdir=/var/lib/containers/storage/overlay/0f3e/work
1291 1290 254:0 /var/tmp/vol /var/opt/mssql rw,relatime - ext4 /dev/vda rw
1292 1290 0:92 / /proc rw,nosuid,nodev,noexec,relatime - proc proc rw
1293 1290 0:93 / /srv/odd\\040dir rw - overlay overlay rw,upperdir=/var/lib/x\\054y/diff,workdir=/w
";

    #[test]
    fn the_innermost_overlay_above_the_path_gives_the_upper_dir() {
        let upper = |p: &str| upper_dir(MOUNTINFO, Path::new(p));
        assert_eq!(
            upper("/var/opt/mssql-log/sales_log.ldf"),
            Some(PathBuf::from(
                "/var/lib/containers/storage/overlay/0f3e/diff"
            ))
        );
        // Under the odd mount point, escapes undone.
        assert_eq!(
            upper("/srv/odd dir/x.mdf"),
            Some(PathBuf::from("/var/lib/x,y/diff"))
        );
    }

    #[test]
    fn a_host_mountinfo_without_overlay_gives_nothing() {
        let host = "25 1 254:0 / / rw,relatime - ext4 /dev/vda rw\n";
        assert_eq!(upper_dir(host, Path::new("/var/opt/mssql/x.mdf")), None);
    }
}
