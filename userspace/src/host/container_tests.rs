//! Cgroup paths as each runtime and driver writes them (from their sources
//! and documentation, and this VM's podman), and /proc/PID/cgroup of v1,
//! hybrid and v2 hosts.

use super::*;

const ID: &str = "2e2222c3a81289eb9bef02d9d669e8d0e12c6b9fa0470ae84110ead8628cfd5d";
const POD: &str = "0f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b";
const STATIC_POD: &str = "6f1e2d3c4b5a69788a9b0c1d2e3f4a5b";
const POD_SYSTEMD: &str = "0f1e2d3c_4b5a_6978_8a9b_0c1d2e3f4a5b";

fn said(path: &str) -> Option<(Option<Runtime>, String, Option<String>)> {
    of_cgroup(path).map(|c| {
        assert_eq!(c.cgroup, path);
        (c.runtime, c.id, c.pod_uid)
    })
}

#[test]
fn each_runtime_and_driver_names_its_containers() {
    use Runtime::*;
    let cases = [
        // docker: systemd and cgroupfs drivers
        (
            format!("/system.slice/docker-{ID}.scope"),
            Some(Docker),
            None,
        ),
        (format!("/docker/{ID}"), Some(Docker), None),
        // podman: as root (systemd), rootless, cgroupfs (this VM), --cgroups=split
        (
            format!("/machine.slice/libpod-{ID}.scope"),
            Some(Podman),
            None,
        ),
        (
            format!("/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{ID}.scope"),
            Some(Podman),
            None,
        ),
        (format!("/libpod_parent/libpod-{ID}"), Some(Podman), None),
        (
            format!("/machine.slice/libpod-{ID}.scope/container"),
            Some(Podman),
            None,
        ),
        // podman run by a systemd unit (Quadlet)
        (
            format!("/system.slice/mssql.service/libpod-payload-{ID}"),
            Some(Podman),
            None,
        ),
        // containerd under Kubernetes: systemd and cgroupfs drivers
        (
            format!(
                "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{POD_SYSTEMD}.slice/cri-containerd-{ID}.scope"
            ),
            Some(Containerd),
            Some(POD),
        ),
        (
            format!("/kubepods/burstable/pod{POD}/{ID}"),
            None,
            Some(POD),
        ),
        (format!("/kubepods/pod{POD}/{ID}"), None, Some(POD)),
        // CRI-O: systemd (a guaranteed pod) and cgroupfs
        (
            format!("/kubepods.slice/kubepods-pod{POD_SYSTEMD}.slice/crio-{ID}.scope"),
            Some(CriO),
            Some(POD),
        ),
        (
            format!("/kubepods/besteffort/pod{POD}/crio-{ID}"),
            Some(CriO),
            Some(POD),
        ),
        // a static pod (its UID the kubelet's hash of the manifest)
        (
            format!("/kubepods/burstable/pod{STATIC_POD}/{ID}"),
            None,
            Some(STATIC_POD),
        ),
    ];
    for (path, runtime, pod) in cases {
        assert_eq!(
            said(&path),
            Some((runtime, ID.to_string(), pod.map(str::to_string))),
            "{path}"
        );
    }
}

#[test]
fn what_is_no_container_names_none() {
    for path in [
        "/".to_string(),
        "/system.slice/ssh.service".to_string(),
        "/user.slice/user-0.slice/session-3.scope".to_string(),
        // the monitors, not the containers
        format!("/machine.slice/libpod-conmon-{ID}.scope"),
        format!("/kubepods.slice/kubepods-pod{POD_SYSTEMD}.slice/crio-conmon-{ID}.scope"),
        // a pod's own cgroup, no container in it
        format!("/kubepods/burstable/pod{POD}"),
        // an id-like name under no known parent
        format!("/elsewhere/{ID}"),
        // one digit short
        format!("/docker/{}", &ID[1..]),
    ] {
        assert_eq!(said(&path), None, "{path}");
    }
}

#[test]
fn the_proc_file_of_each_hierarchy_gives_the_container() {
    let container = format!("/libpod_parent/libpod-{ID}");
    let id = |text: &str| of_proc_cgroup(text).map(|c| c.id);
    // v2 only
    assert_eq!(id(&format!("0::{container}\n")), Some(ID.to_string()));
    // hybrid, with v2 unused (this VM's podman): the v1 paths
    let hybrid =
        format!("9:name=systemd:{container}\n4:memory:/process_api/x\n1:cpu:{container}\n0::/\n");
    assert_eq!(id(&hybrid), Some(ID.to_string()));
    // hybrid, docker on cgroupfs: v2 left at the runtime's service
    let docker = format!(
        "1:name=systemd:/docker/{ID}\n2:memory:/docker/{ID}\n0::/system.slice/containerd.service\n"
    );
    assert_eq!(id(&docker), Some(ID.to_string()));
    // v1 without name=systemd
    assert_eq!(
        id(&format!("3:cpuset:/\n2:memory:{container}\n")),
        Some(ID.to_string())
    );
    // from inside a cgroup namespace of the tracer's own (relative paths)
    let relative = format!(
        "0::/../../kubepods.slice/kubepods-pod{POD_SYSTEMD}.slice/cri-containerd-{ID}.scope\n"
    );
    let c = of_proc_cgroup(&relative).unwrap();
    assert_eq!((c.id.as_str(), c.pod_uid.as_deref()), (ID, Some(POD)));
    // a host process everywhere at the root, or in a service
    assert_eq!(id("1:cpu:/\n0::/\n"), None);
    assert_eq!(id("0::/system.slice/ssh.service\n"), None);
}

#[test]
fn a_process_is_read_from_its_proc_file() {
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir(root.path().join("42")).unwrap();
    std::fs::write(
        root.path().join("42/cgroup"),
        format!("0::/system.slice/docker-{ID}.scope\n"),
    )
    .unwrap();
    let container = of_pid(root.path(), 42).unwrap();
    assert_eq!(
        (container.runtime, container.id.as_str()),
        (Some(Runtime::Docker), ID)
    );
    assert_eq!(of_pid(root.path(), 43), None);
}

#[test]
fn a_runtime_s_name_is_the_one_records_carry() {
    for runtime in [
        Runtime::Docker,
        Runtime::Podman,
        Runtime::Containerd,
        Runtime::CriO,
    ] {
        assert_eq!(serde_json::to_value(runtime).unwrap(), runtime.name());
    }
}
