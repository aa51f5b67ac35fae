//! Which container a process runs in, from its cgroup path (/proc/PID/cgroup).
//!
//! Every runtime names the cgroup it creates after the container's id, in
//! one of a few shapes that depend on the runtime and on the cgroup driver
//! (systemd: `…/<prefix>-<id>.scope`; cgroupfs: `…/<parent>/<id>` or
//! `…/<prefix>-<id>`); Kubernetes puts a pod's containers under a cgroup
//! named after the pod's UID. Read from the path alone, with no runtime's
//! API: no socket to reach, nothing on the hot path. cgroup v2 gives one
//! path (`0::`); on v1 and hybrid hosts each hierarchy has its own, and a
//! runtime on the cgroupfs driver may leave the process in its service's v2
//! cgroup (`0::/system.slice/containerd.service`) while naming the
//! container in the v1 ones: each path is read, v2's first, and the first
//! that names a container wins.
//!
//! A tracer in a cgroup namespace of its own (a container on cgroup v2 whose
//! runtime made one) sees paths relative to its own cgroup (`/../..`): the
//! components are read all the same, and `cgroup` keeps them as given.

use std::path::Path;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The container a process runs in.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields, rename = "container")]
pub struct Container {
    /// The runtime that made its cgroup; absent where the path gives only the id (a Kubernetes
    /// pod's container under the cgroupfs driver: containerd or cri-dockerd).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime: Option<Runtime>,
    /// The container's full id (64 hex digits; `docker ps` and `podman ps` show its first 12).
    #[schemars(length(equal = 64))]
    pub id: String,
    /// Its name, from its runtime's API socket where stalltrace can read it (podman's, docker's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The UID of the Kubernetes pod it belongs to: a UUID, or 32 hex digits for a static pod
    /// (the kubelet's hash of its manifest).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 32, max = 36))]
    pub pod_uid: Option<String>,
    /// The cgroup path it was read from, as /proc/PID/cgroup gives it (relative to the root of
    /// the hierarchy, or of stalltrace's own cgroup namespace).
    pub cgroup: String,
}

/// The container runtime, by the name its cgroups carry (`docker-`, `libpod-`,
/// `cri-containerd-`, `crio-`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
#[schemars(rename = "container_runtime")]
pub enum Runtime {
    Docker,
    Podman,
    Containerd,
    CriO,
}

impl Container {
    /// The first 12 digits of the id, as `docker ps`, `podman ps` and crictl show it.
    pub fn short_id(&self) -> &str {
        self.id.get(..12).unwrap_or(&self.id)
    }
}

impl Runtime {
    /// Its name in records and reports.
    pub fn name(self) -> &'static str {
        match self {
            Runtime::Docker => "docker",
            Runtime::Podman => "podman",
            Runtime::Containerd => "containerd",
            Runtime::CriO => "cri-o",
        }
    }
}

/// The container of process `pid`, from `proc_root`/PID/cgroup; None for a
/// process in no container (or gone).
pub fn of_pid(proc_root: &Path, pid: u32) -> Option<Container> {
    let text = std::fs::read_to_string(proc_root.join(format!("{pid}/cgroup"))).ok()?;
    of_proc_cgroup(&text)
}

/// The container /proc/PID/cgroup's text names: the first of its paths,
/// v2's, then v1's `name=systemd`, then the other v1 hierarchies', that
/// names one.
fn of_proc_cgroup(text: &str) -> Option<Container> {
    let mut lines: Vec<(&str, &str)> = text
        .lines()
        .filter_map(|l| {
            let mut parts = l.splitn(3, ':');
            let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
            Some((controllers, path))
        })
        .collect();
    // Stable: among the other v1 hierarchies, the file's order.
    lines.sort_by_key(|(c, _)| match *c {
        "" => 0,
        "name=systemd" => 1,
        _ => 2,
    });
    lines.iter().find_map(|(_, path)| of_cgroup(path))
}

/// The container a cgroup path names, if any.
pub fn of_cgroup(path: &str) -> Option<Container> {
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    // The innermost component that names a container: a runtime may nest
    // cgroups of its own under it (crun's systemd subgroup: `…/container`).
    let (index, runtime, id) = parts.iter().enumerate().rev().find_map(|(i, part)| {
        named(part, parts.get(i.wrapping_sub(1)).copied()).map(|(r, id)| (i, r, id))
    })?;
    let pod_uid = parts[..index].iter().rev().find_map(|p| pod_uid(p));
    Some(Container {
        runtime,
        id: id.to_string(),
        name: None,
        pod_uid,
        cgroup: path.to_string(),
    })
}

/// The runtime and id a cgroup's name gives (`parent`: the name above it).
fn named<'a>(part: &'a str, parent: Option<&str>) -> Option<(Option<Runtime>, &'a str)> {
    let name = part.strip_suffix(".scope").unwrap_or(part);
    const PREFIXES: &[(&str, Runtime)] = &[
        ("docker-", Runtime::Docker),
        // A podman container started by a systemd unit (Quadlet, --cgroups=split).
        ("libpod-payload-", Runtime::Podman),
        ("libpod-", Runtime::Podman),
        ("cri-containerd-", Runtime::Containerd),
        ("crio-", Runtime::CriO),
    ];
    for (prefix, runtime) in PREFIXES {
        // `libpod-conmon-<id>`, `crio-conmon-<id>`: the monitor, not the container.
        if let Some(id) = name.strip_prefix(prefix).filter(|id| is_id(id)) {
            return Some((Some(*runtime), id));
        }
    }
    if !is_id(name) {
        return None;
    }
    // cgroupfs: docker's `/docker/<id>`; a Kubernetes pod's `…/pod<uid>/<id>`.
    match parent {
        Some("docker") => Some((Some(Runtime::Docker), name)),
        Some(p) if pod_uid(p).is_some() => Some((None, name)),
        _ => None,
    }
}

fn is_id(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// A pod's UID from its cgroup's name: `pod<uid>` (cgroupfs) or
/// `kubepods[-<class>]-pod<uid with _ for ->.slice` (systemd); a UUID, or
/// a static pod's 32 hex digits.
fn pod_uid(part: &str) -> Option<String> {
    let name = part.strip_suffix(".slice").unwrap_or(part);
    let uid = match name.strip_prefix("pod") {
        Some(uid) => uid.to_string(),
        None => name
            .starts_with("kubepods")
            .then(|| name.rsplit_once("-pod"))??
            .1
            .replace('_', "-"),
    };
    let uuid = uid.len() == 36
        && uid.char_indices().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => c == '-',
            _ => c.is_ascii_hexdigit(),
        });
    let static_pod = uid.len() == 32 && uid.bytes().all(|b| b.is_ascii_hexdigit());
    (uuid || static_pod).then_some(uid)
}

#[cfg(test)]
#[path = "container_tests.rs"]
mod tests;
