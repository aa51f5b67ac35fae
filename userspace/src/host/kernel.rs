//! Kernel facts that decide what can be attached.

use std::path::Path;

pub const VMLINUX_BTF: &str = "/sys/kernel/btf/vmlinux";

pub fn release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

pub fn has_btf() -> bool {
    Path::new(VMLINUX_BTF).exists()
}

/// Whether the kernel keeps per-program run time (sysctl kernel.bpf_stats_enabled).
pub fn bpf_stats_enabled() -> bool {
    std::fs::read_to_string("/proc/sys/kernel/bpf_stats_enabled")
        .map(|s| s.trim() == "1")
        .unwrap_or(false)
}
