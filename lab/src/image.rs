//! The container image: Debian's minimal base (mmdebstrap, from Debian's
//! packages only) with stalltrace's .deb installed by dpkg, imported into
//! podman. `cargo xtask package --image` and tests/package.rs build it here,
//! and deploy/kubernetes/daemonset.yaml runs it.

use std::path::Path;
use std::process::{Command, Output};

use crate::systemd_guest::DEBIAN_SUITE;

/// The capabilities the container is given instead of `privileged`: the same
/// set as packaging/stalltrace.service (packaging/README.md says what each is
/// for). CAP_SYS_ADMIN is also what podman's and containerd's default seccomp
/// profiles ask before they allow bpf() and perf_event_open().
pub const CAPABILITIES: &[&str] = &[
    "CAP_BPF",
    "CAP_PERFMON",
    "CAP_SYS_ADMIN",
    "CAP_SYS_PTRACE",
    "CAP_DAC_READ_SEARCH",
];

/// A podman image, removed on drop unless kept.
pub struct Image {
    pub tag: String,
    keep: bool,
}

impl Image {
    /// Build the image from `deb` and import it into podman as `tag`.
    pub fn build(deb: &Path, tag: &str) -> Self {
        let tar = std::env::temp_dir().join(format!("{}.tar", crate::unique("stalltrace-image")));
        let deb_name = deb.file_name().unwrap().to_string_lossy().into_owned();
        let copy_in = format!("--customize-hook=copy-in {} /tmp", deb.display());
        let install = format!("--customize-hook=chroot \"$1\" dpkg -i /tmp/{deb_name}");
        let remove = format!("--customize-hook=rm \"$1\"/tmp/{deb_name}");
        let tar_arg = tar.to_string_lossy().into_owned();
        let built = run(
            "mmdebstrap",
            &[
                "--quiet",
                "--variant=minbase",
                // The package's dependencies, as dpkg (unlike apt) does not
                // fetch them: its postinst creates its user with systemd-sysusers
                // (the standalone one instead of all of systemd), and procps
                // has the unit's /bin/kill.
                "--include=systemd-standalone-sysusers,procps",
                &copy_in,
                &install,
                &remove,
                DEBIAN_SUITE,
                &tar_arg,
            ],
        );
        if !built.status.success() {
            let _ = std::fs::remove_file(&tar);
            panic!(
                "mmdebstrap of the image failed: {}",
                String::from_utf8_lossy(&built.stderr)
            );
        }
        let imported = run(
            "podman",
            &[
                "import",
                "--change",
                "ENTRYPOINT [\"/usr/bin/stalltrace\"]",
                "--change",
                "CMD [\"run\"]",
                &tar_arg,
                tag,
            ],
        );
        let _ = std::fs::remove_file(&tar);
        assert!(
            imported.status.success(),
            "podman import failed: {}",
            String::from_utf8_lossy(&imported.stderr)
        );
        Self {
            tag: tag.to_string(),
            keep: false,
        }
    }

    /// Leave the image in podman's store when this goes (`cargo xtask package --image`).
    pub fn keep(mut self) -> String {
        self.keep = true;
        self.tag.clone()
    }

    /// `podman run` of the image as the DaemonSet runs it: the host's PID and
    /// network namespaces, every capability dropped but [`CAPABILITIES`],
    /// /sys/kernel/btf read-only; `args` go to `stalltrace`. The command
    /// is podman's; the caller spawns it.
    pub fn command(&self, args: &[&str]) -> Command {
        let caps = format!("--cap-add={}", CAPABILITIES.join(","));
        let mut cmd = crate::container::podman_run();
        cmd.args([
            "--pid=host",
            "--network=host",
            "--cap-drop=all",
            &caps,
            // The DaemonSet's readOnlyRootFilesystem and allowPrivilegeEscalation: false.
            "--read-only",
            "--security-opt=no-new-privileges",
            "--volume=/sys/kernel/btf:/sys/kernel/btf:ro",
            &self.tag,
        ]);
        cmd.args(args);
        cmd
    }
}

impl Drop for Image {
    fn drop(&mut self) {
        if !self.keep {
            let _ = run("podman", &["rmi", "--force", &self.tag]);
        }
    }
}

fn run(program: &str, args: &[&str]) -> Output {
    Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {program}: {e} (run `cargo xtask setup`)"))
}
