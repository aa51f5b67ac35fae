//! Maps that two families' objects share (netdev's receive-path maps, used by
//! the tcp object's tcp_probe), and the bpffs they are shared through.

use std::path::{Path, PathBuf};

/// Maps two families' objects share, pinned in bpffs only while they load.
///
/// aya creates a map at its pin path the first time and opens the pinned one
/// after that, so the second object gets the first one's map. The pins are
/// removed when this is dropped (the maps live on with the programs using
/// them), and any left by an earlier daemon with the same pid are removed
/// first.
///
/// The pins go in a bpffs of the daemon's own: it mounts one at /sys/fs/bpf
/// in a mount namespace of its own, which nobody else sees and which goes
/// away with the daemon, pins and all, even when it is killed (SIGKILL) while
/// they exist. Pins in the host's bpffs (systemd mounts one) would outlive
/// such a kill and keep their maps in the kernel until another daemon starts
/// (tests/faults.rs kills daemons in that window). Only without the
/// privilege for the mount (CAP_SYS_ADMIN) is the host's bpffs used, if
/// there is one; else nothing is shared.
pub struct SharedMaps {
    pins: Vec<(&'static str, PathBuf)>,
    /// Why no private bpffs was mounted, when the host's is used instead.
    private_failed: Option<String>,
}

const BPF_FS: &str = "/sys/fs/bpf";
const BPF_FS_MAGIC: i64 = 0xcafe4a11;

impl SharedMaps {
    /// The pins, or why nothing can be shared: no private bpffs could be
    /// mounted (the reason, naming CAP_SYS_ADMIN when that is what is
    /// missing) and the host has none at /sys/fs/bpf.
    pub fn new(names: &[&'static str]) -> Result<Self, String> {
        // What a daemon that had to pin in the host's bpffs left when killed.
        if is_bpffs(Path::new(BPF_FS)) {
            remove_dead_daemons_pins(Path::new(BPF_FS));
        }
        let private_failed = mount_private_bpffs().err();
        if let Some(why) = &private_failed
            && !is_bpffs(Path::new(BPF_FS))
        {
            return Err(format!("{why}, and {BPF_FS} is no bpffs"));
        }
        let pid = std::process::id();
        let pins: Vec<_> = names
            .iter()
            .map(|name| {
                (
                    *name,
                    Path::new(BPF_FS).join(format!("stalltrace-{pid}-{name}")),
                )
            })
            .collect();
        for (_, path) in &pins {
            let _ = std::fs::remove_file(path);
        }
        Ok(Self {
            pins,
            private_failed,
        })
    }

    /// Why the maps could not be shared through these pins (the host's
    /// bpffs took none, or an object could not reuse them).
    pub fn why_unshared(&self) -> String {
        match &self.private_failed {
            Some(why) => format!("{why}, and pinning in the host's {BPF_FS} failed"),
            None => "the second object could not reuse the pinned maps".into(),
        }
    }

    pub fn pins(&self) -> &[(&'static str, PathBuf)] {
        &self.pins
    }

    /// The line a run prints when netdev's receive path could not share
    /// tcp's tcp_probe: `why` the maps were not shared.
    pub fn unshared_warning(why: &str) -> String {
        format!(
            "netdev: its receive path attached a tcp_probe program of its own beside tcp's \
             (one more program on that tracepoint, the same records), because the two \
             families could not share their maps: {why}"
        )
    }
}

impl Drop for SharedMaps {
    fn drop(&mut self) {
        for (_, path) in &self.pins {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// Pins a daemon killed while it loaded (SIGKILL, so no Drop) left behind:
/// `stalltrace-<pid>-<map>` whose pid is gone. They would keep their maps
/// alive in the kernel until the next boot.
fn remove_dead_daemons_pins(bpffs: &Path) {
    let Ok(dir) = std::fs::read_dir(bpffs) else {
        return;
    };
    for entry in dir.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix("stalltrace-"))
            .and_then(|rest| rest.split_once('-'))
            .and_then(|(pid, _)| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if !Path::new("/proc").join(pid.to_string()).exists() {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

fn is_bpffs(path: &Path) -> bool {
    let Ok(c_path) = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()) else {
        return false;
    };
    // SAFETY: statfs writes into `fs`, which is valid for writes and all-zero is a valid statfs.
    unsafe {
        let mut fs: libc::statfs = std::mem::zeroed();
        libc::statfs(c_path.as_ptr(), &mut fs) == 0 && fs.f_type as i64 == BPF_FS_MAGIC
    }
}

/// Mount a bpffs at /sys/fs/bpf that only this process sees: a mount
/// namespace of its own (for the calling thread and the threads it starts
/// after; the loading thread is the one that needs it), slave to the host's
/// so namespaces and disks mounted later still show, and the bpffs in it
/// (over the host's, if it has one). When any step is not allowed, nothing
/// is mounted and the error says which step, and names CAP_SYS_ADMIN when
/// this process lacks it.
fn mount_private_bpffs() -> Result<(), String> {
    let none = c"none";
    let bpf = c"bpf";
    let fs = c"/sys/fs/bpf";
    let failed = |step: &str| {
        let e = std::io::Error::last_os_error();
        let cap = if crate::host::caps::has(crate::host::caps::CAP_SYS_ADMIN) {
            ""
        } else {
            " (it needs CAP_SYS_ADMIN, which this process lacks)"
        };
        Err(format!(
            "mounting a private bpffs failed at {step}: {e}{cap}"
        ))
    };
    // SAFETY: plain syscalls on constant, NUL-terminated strings; failure is returned.
    unsafe {
        if libc::unshare(libc::CLONE_NEWNS) != 0 {
            return failed("unshare(CLONE_NEWNS)");
        }
        // Without this our mount would propagate to the host's namespace: stop there.
        if libc::mount(
            none.as_ptr(),
            c"/".as_ptr(),
            std::ptr::null(),
            libc::MS_REC | libc::MS_SLAVE,
            std::ptr::null(),
        ) != 0
        {
            return failed("making / a slave mount");
        }
        // A /sys without fs/bpf: systemd-nspawn's with --private-network is a
        // tmpfs of chosen sysfs parts (found by tests/package.rs, where the
        // service then loaded a second tcp_probe). A tmpfs over /sys/fs, in
        // this namespace only, holds the mount point; nothing of stalltrace
        // reads /sys/fs.
        if !Path::new(BPF_FS).is_dir() {
            if libc::mount(
                c"tmpfs".as_ptr(),
                c"/sys/fs".as_ptr(),
                c"tmpfs".as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                c"mode=0755,size=64k".as_ptr().cast(),
            ) != 0
            {
                return failed("mount -t tmpfs /sys/fs (there is no /sys/fs/bpf)");
            }
            if libc::mkdir(fs.as_ptr(), 0o700) != 0 {
                return failed("mkdir /sys/fs/bpf");
            }
        }
        if libc::mount(bpf.as_ptr(), fs.as_ptr(), bpf.as_ptr(), 0, std::ptr::null()) != 0 {
            return failed("mount -t bpf");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_pins_of_daemons_that_are_gone_are_removed() {
        let dir = std::env::temp_dir().join(format!("stalltrace-pins-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        // pid_max is at most 2^22: this pid cannot be running.
        let names = [
            "stalltrace-4999999-netdev_stats".to_string(),
            format!("stalltrace-{}-netdev_stats", std::process::id()),
            "stalltrace-notapid-x".to_string(),
            "someone-else".to_string(),
        ];
        for n in &names {
            std::fs::write(dir.join(n), b"").unwrap();
        }
        remove_dead_daemons_pins(&dir);
        let mut left: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        std::fs::remove_dir_all(&dir).unwrap();
        let mut expected = names[1..].to_vec();
        expected.sort();
        assert_eq!(left, expected, "only the dead daemon's pin goes");
    }
}
