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

/// The kernel lockdown mode in force (`none`, `integrity`, `confidentiality`),
/// from securityfs or, where that is not mounted, the kernel command line.
pub fn lockdown() -> Option<String> {
    if let Ok(text) = std::fs::read_to_string("/sys/kernel/security/lockdown") {
        // "none integrity [confidentiality]": the bracketed one is in force.
        return text
            .split_whitespace()
            .find_map(|w| w.strip_prefix('[')?.strip_suffix(']'))
            .map(str::to_string);
    }
    let cmdline = std::fs::read_to_string("/proc/cmdline").ok()?;
    cmdline
        .split_whitespace()
        .find_map(|w| w.strip_prefix("lockdown="))
        .map(str::to_string)
}

/// Whether the kernel keeps per-program run time (sysctl kernel.bpf_stats_enabled).
pub fn bpf_stats_enabled() -> bool {
    std::fs::read_to_string("/proc/sys/kernel/bpf_stats_enabled")
        .map(|s| s.trim() == "1")
        .unwrap_or(false)
}

/// The kernel's timer frequency (CONFIG_HZ), which jiffies-based values
/// (a TCP retransmission timeout) need to become time. Read from the kernel's
/// own config (/proc/config.gz, else /boot/config-RELEASE); BPF cannot read it
/// here (aya 0.14 has no `__kconfig` support). Returns (hz, where it came from).
pub fn hz() -> (u32, &'static str) {
    use std::io::Read;
    let mut text = String::new();
    if let Ok(file) = std::fs::File::open("/proc/config.gz")
        && flate2::read::GzDecoder::new(file)
            .read_to_string(&mut text)
            .is_ok()
        && let Some(hz) = config_hz(&text)
    {
        return (hz, "/proc/config.gz");
    }
    if let Ok(text) = std::fs::read_to_string(format!("/boot/config-{}", release()))
        && let Some(hz) = config_hz(&text)
    {
        return (hz, "/boot/config");
    }
    (250, "assumed (no kernel config found)")
}

fn config_hz(config: &str) -> Option<u32> {
    config
        .lines()
        .find_map(|l| l.strip_prefix("CONFIG_HZ="))
        .and_then(|v| v.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_config_hz() {
        assert_eq!(config_hz("CONFIG_HZ_250=y\nCONFIG_HZ=250\n"), Some(250));
        assert_eq!(config_hz("# CONFIG_HZ_1000 is not set\n"), None);
        assert!(hz().0 >= 100);
    }
}
