//! A DMV settings file systemd handed to the service with LoadCredential=.
//!
//! systemd copies the credential into $CREDENTIALS_DIRECTORY, a directory
//! of root's on a file system mounted for this unit alone, read-only. The
//! copy is chowned to the unit's user (systemd 252) or stays root's with the
//! user let in by an ACL, whose mask shows as group read (newer systemd):
//! either is as private as `check_private` asks, so its owner (root) and
//! group bits are not held against it. Everything that makes it private is
//! checked, not assumed from the variable, which whoever runs stalltrace by
//! hand can set: the directory is root's and closed to writers, it is a mount
//! of its own, the open file is on that mount (a path swapped meanwhile
//! would lead elsewhere), and the file is root's or this user's.

use std::fs::{File, Metadata};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// Whether `file`, opened from `path`, is this unit's systemd credential.
pub(super) fn is_systemd_credential(path: &Path, file: &File, me: u32) -> bool {
    let Some(dir) = std::env::var_os("CREDENTIALS_DIRECTORY") else {
        return false;
    };
    let canonical = |p: &Path| std::fs::canonicalize(p).ok();
    let (Some(dir), Some(parent)) = (
        canonical(Path::new(&dir)),
        path.parent().and_then(canonical),
    ) else {
        return false;
    };
    if dir != parent {
        return false;
    }
    let (Ok(dir_meta), Some(Ok(above)), Ok(file_meta)) = (
        std::fs::symlink_metadata(&dir),
        dir.parent().map(std::fs::metadata),
        file.metadata(),
    ) else {
        return false;
    };
    trusted(&dir_meta, above.dev(), &file_meta, me)
}

/// The checks of [`is_systemd_credential`] on what stat said.
fn trusted(dir: &Metadata, dev_above: u64, file: &Metadata, me: u32) -> bool {
    facts_trusted(
        DirFacts {
            is_dir: dir.is_dir(),
            uid: dir.uid(),
            mode: dir.mode(),
            dev: dir.dev(),
            dev_above,
        },
        file.dev(),
        file.uid(),
        me,
    )
}

#[derive(Clone, Copy)]
struct DirFacts {
    is_dir: bool,
    uid: u32,
    mode: u32,
    dev: u64,
    /// The device of the directory it is in: another one makes it a mount point.
    dev_above: u64,
}

fn facts_trusted(dir: DirFacts, file_dev: u64, file_uid: u32, me: u32) -> bool {
    dir.is_dir
        && dir.uid == 0
        && dir.mode & 0o022 == 0
        && dir.dev != dir.dev_above
        && file_dev == dir.dev
        && (file_uid == 0 || file_uid == me)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_root_mount_closed_to_writers_holding_the_open_file_is_trusted() {
        // As systemd makes it: /run/credentials/stalltrace.service, root's,
        // 0500, a ramfs or tmpfs of its own; the copy root's (ACL) or ours.
        let systemd = DirFacts {
            is_dir: true,
            uid: 0,
            mode: 0o040500,
            dev: 77,
            dev_above: 25,
        };
        assert!(facts_trusted(systemd, 77, 0, 997));
        assert!(facts_trusted(systemd, 77, 997, 997));
        // Someone else's file, a file elsewhere (path swapped), a directory
        // that is no mount, is not root's, or others may write.
        assert!(!facts_trusted(systemd, 77, 1000, 997));
        assert!(!facts_trusted(systemd, 25, 0, 997));
        assert!(!facts_trusted(
            DirFacts {
                dev_above: 77,
                ..systemd
            },
            77,
            0,
            997
        ));
        assert!(!facts_trusted(
            DirFacts {
                uid: 997,
                ..systemd
            },
            77,
            997,
            997
        ));
        assert!(!facts_trusted(
            DirFacts {
                mode: 0o041777,
                ..systemd
            },
            77,
            0,
            997
        ));
        assert!(!facts_trusted(
            DirFacts {
                is_dir: false,
                ..systemd
            },
            77,
            0,
            997
        ));
    }

    #[test]
    fn a_directory_that_is_no_mount_is_not_trusted_whatever_the_variable_says() {
        // /tmp is root's but open to writers; a directory made here is no mount.
        let dir = std::env::temp_dir().join(format!("stalltrace-cred-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("stalltrace-sql-dmv");
        std::fs::write(&path, "host = x\n").unwrap();
        let file = File::open(&path).unwrap();
        let above = std::fs::metadata(std::env::temp_dir()).unwrap();
        let ok = trusted(
            &std::fs::symlink_metadata(&dir).unwrap(),
            above.dev(),
            &file.metadata().unwrap(),
            0,
        );
        let _ = std::fs::remove_dir_all(&dir);
        assert!(!ok);
    }
}
