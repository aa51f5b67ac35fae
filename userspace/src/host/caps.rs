//! Privilege check before anything is loaded, so the user gets a clear reason
//! instead of the kernel's EPERM from the middle of a load.

use crate::error::UserError;

const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

/// Effective capability set of this process, from /proc/self/status.
pub fn effective() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    parse_cap_eff(&status).unwrap_or(0)
}

fn parse_cap_eff(status: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
}

/// Loading tracing programs needs CAP_SYS_ADMIN, or CAP_BPF with CAP_PERFMON (5.8+).
pub fn require_tracing_privileges() -> Result<(), UserError> {
    check(effective())
}

fn check(caps: u64) -> Result<(), UserError> {
    let has = |c: u32| caps & (1u64 << c) != 0;
    if has(CAP_SYS_ADMIN) || (has(CAP_BPF) && has(CAP_PERFMON)) {
        return Ok(());
    }
    let missing = match (has(CAP_BPF), has(CAP_PERFMON)) {
        (false, false) => "CAP_BPF and CAP_PERFMON, or CAP_SYS_ADMIN",
        (false, true) => "CAP_BPF",
        _ => "CAP_PERFMON",
    };
    Err(UserError::not_privileged(missing))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_cap_eff_and_judges_it() {
        let status = "Name:\tx\nCapEff:\t000001ffffffffff\nCapBnd:\t0\n";
        assert_eq!(parse_cap_eff(status), Some(0x1ff_ffff_ffff));
        assert!(check(0x1ff_ffff_ffff).is_ok());
        assert!(check(1 << CAP_SYS_ADMIN).is_ok());
        assert!(check((1 << CAP_BPF) | (1 << CAP_PERFMON)).is_ok());
        let e = check(1 << CAP_BPF).unwrap_err();
        assert!(e.problem.contains("CAP_PERFMON"), "{e}");
        assert!(check(0).unwrap_err().to_string().contains("root"));
    }
}
