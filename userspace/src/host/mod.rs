//! What stalltrace reads about the host from /proc and /sys (never from the
//! probes): identity, privileges, kernel features, clocks.

pub mod btf_names;
pub mod caps;
pub mod clock;
pub mod container;
pub mod container_lookup;
pub mod kernel;
pub mod link;
pub mod netlink;
pub mod netns;
pub mod overlay;
pub mod process_filter;
pub mod procfs;

/// The host name records carry (`host` field).
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}
