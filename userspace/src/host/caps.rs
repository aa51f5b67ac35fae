//! Capabilities: the ones stalltrace uses and what each one serves, whether
//! this process has them, the privilege check before anything is loaded (so
//! the user gets a clear reason instead of the kernel's EPERM from the middle
//! of a load), and the one line a run prints when a feature goes without one.

use std::collections::HashSet;
use std::sync::{Mutex, OnceLock};

use crate::error::UserError;

/// A Linux capability, by its number in include/uapi/linux/capability.h
/// (the `libc` crate has no constants for them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cap {
    pub name: &'static str,
    pub number: u32,
}

pub const CAP_DAC_READ_SEARCH: Cap = Cap {
    name: "CAP_DAC_READ_SEARCH",
    number: 2,
};
pub const CAP_SYS_PTRACE: Cap = Cap {
    name: "CAP_SYS_PTRACE",
    number: 19,
};
pub const CAP_SYS_ADMIN: Cap = Cap {
    name: "CAP_SYS_ADMIN",
    number: 21,
};
pub const CAP_SYS_RESOURCE: Cap = Cap {
    name: "CAP_SYS_RESOURCE",
    number: 24,
};
pub const CAP_PERFMON: Cap = Cap {
    name: "CAP_PERFMON",
    number: 38,
};
pub const CAP_BPF: Cap = Cap {
    name: "CAP_BPF",
    number: 39,
};

/// What a capability serves, and what a run without it loses.
pub struct Use {
    pub cap: Cap,
    pub serves: &'static str,
    pub without: &'static str,
}

const REFUSED: &str =
    "run and check refuse to start (CAP_SYS_ADMIN stands in for CAP_BPF and CAP_PERFMON)";

/// Every capability stalltrace uses, as measured: a run as an unprivileged
/// user with one of them removed at a time, each family checked. Nothing
/// needs CAP_NET_ADMIN (netlink and sock_diag dumps are unprivileged).
pub const USES: &[Use] = &[
    Use {
        cap: CAP_BPF,
        serves: "every family: loading the eBPF programs, maps and BTF",
        without: REFUSED,
    },
    Use {
        cap: CAP_PERFMON,
        serves: "every family: attaching the tracing programs and reading kernel memory in them",
        without: REFUSED,
    },
    Use {
        cap: CAP_SYS_ADMIN,
        serves: "setns into other network namespaces (tcp_flow, netdev link health), \
                 --bpf-stats, uprobes on SQL Server's SSL_write (encrypted sessions' SPIDs)",
        without: "no tcp_flow records and no netdev link health from other network namespaces \
                  (a SQL Server container's); --bpf-stats refused; encrypted SQL Server sessions \
                  get no SPID without --sql-dmv (perf's uprobes need CAP_SYS_ADMIN again since \
                  Linux 6.16 and its 2025 stable updates)",
    },
    Use {
        cap: CAP_SYS_PTRACE,
        serves: "reading other users' /proc/PID/fd links and /proc/PID/ns/net \
                 (sqlserver discovery, tcp_flow pids and namespaces)",
        without: "a sqlservr run by another user is not found (no sql_instance, sql_session, \
                  sql tags, disk roles or slow_io files); tcp_flow without pids, and without \
                  the namespaces that have no /run/netns name",
    },
    Use {
        cap: CAP_DAC_READ_SEARCH,
        serves: "listing other users' /proc/PID/fd; stat and FIEMAP of database files \
                 in directories closed to others (sqlserver files and disk roles)",
        without: "a sqlservr run by another user is not found (as for CAP_SYS_PTRACE); \
                  tcp_flow without pids; database files in closed directories without \
                  disk role or file per sector",
    },
];

/// Only kernels before 5.11 charge BPF memory to RLIMIT_MEMLOCK.
const MEMLOCK: Use = Use {
    cap: CAP_SYS_RESOURCE,
    serves: "raising RLIMIT_MEMLOCK, which this kernel (before 5.11) charges BPF maps to",
    without: "loading fails unless RLIMIT_MEMLOCK is already unlimited \
              (systemd: LimitMEMLOCK=infinity)",
};

fn bit(cap: Cap) -> u64 {
    1u64 << cap.number
}

/// Effective capability set of this process, from /proc/self/status.
pub fn effective() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    parse_cap_eff(&status).unwrap_or(0)
}

/// [`effective`], read once: stalltrace never changes its own capabilities.
fn effective_once() -> u64 {
    static CAPS: OnceLock<u64> = OnceLock::new();
    *CAPS.get_or_init(effective)
}

/// Whether this process has `cap` in its effective set.
pub fn has(cap: Cap) -> bool {
    effective_once() & bit(cap) != 0
}

fn parse_cap_eff(status: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
}

/// Whether kernel `release` (`uname -r`) is older than 5.11; None when it
/// cannot be read.
pub fn before_5_11(release: &str) -> Option<bool> {
    let mut parts = release.split(['.', '-']);
    let major: u32 = parts.next()?.parse().ok()?;
    let minor: u32 = parts.next()?.parse().ok()?;
    Some((major, minor) < (5, 11))
}

/// Loading tracing programs needs CAP_SYS_ADMIN, or CAP_BPF with CAP_PERFMON (5.8+).
pub fn require_tracing_privileges() -> Result<(), UserError> {
    check(effective(), &crate::host::kernel::release())
}

fn check(caps: u64, release: &str) -> Result<(), UserError> {
    let has = |c: Cap| caps & bit(c) != 0;
    if has(CAP_SYS_ADMIN) || (has(CAP_BPF) && has(CAP_PERFMON)) {
        return Ok(());
    }
    let missing = match (has(CAP_BPF), has(CAP_PERFMON)) {
        (false, false) => "CAP_BPF and CAP_PERFMON, or CAP_SYS_ADMIN",
        (false, true) => "CAP_BPF",
        _ => "CAP_PERFMON",
    };
    Err(UserError::not_privileged(missing, before_5_11(release)))
}

/// `stalltrace check`'s capabilities section for the effective set `caps` on
/// kernel `release`: one line per capability used, whether this process has
/// it, and for a missing one what it costs.
pub fn report(caps: u64, release: &str) -> Vec<String> {
    let has = |c: Cap| caps & bit(c) != 0;
    let old = before_5_11(release);
    let mut uses: Vec<&Use> = USES.iter().collect();
    if old != Some(false) {
        uses.push(&MEMLOCK);
    }
    let mut lines = vec!["capabilities (the effective set of this process)".to_string()];
    for u in uses {
        let stand_in = [CAP_BPF, CAP_PERFMON].contains(&u.cap) && has(CAP_SYS_ADMIN);
        let state = match (has(u.cap), stand_in) {
            (true, _) => format!("yes      {}", u.serves),
            (false, true) => format!("no       {} (CAP_SYS_ADMIN stands in)", u.serves),
            (false, false) => format!("MISSING  {}; without it: {}", u.serves, u.without),
        };
        lines.push(format!("  {:<20} {state}", u.cap.name));
    }
    let memlock = match old {
        Some(false) => "CAP_SYS_RESOURCE on this kernel (5.11+), ",
        _ => "",
    };
    lines.push(format!(
        "  not needed: CAP_NET_ADMIN, {memlock}CAP_NET_BIND_SERVICE (with a --prometheus port of 1024 or above)"
    ));
    lines
}

/// Says once on stderr that `feature` goes without something because the
/// kernel refused `what`: `consequence` is what the run lacks for it. The line
/// names the capabilities of `needs` this process lacks or, when it has them
/// all, the other refusers: a Linux security module (a container runtime's
/// AppArmor profile denies ptrace-reads of the host's /proc whatever the
/// capabilities) or a sandbox (ProtectProc=, hidepid).
pub fn degraded(feature: &str, what: &str, needs: &[Cap], consequence: &str) {
    say_once(
        feature,
        consequence,
        degraded_line(effective_once(), feature, what, needs, consequence),
    );
}

/// As [`degraded`], but silent when this process has every capability of
/// `needs`: for scans of every process, where one that is exiting or in the
/// middle of an exec is refused for a moment whatever the privileges (seen
/// in the suite's namespace churn), so a refusal despite the capabilities
/// says nothing about a security module.
pub fn degraded_if_lacking(feature: &str, what: &str, needs: &[Cap], consequence: &str) {
    let caps = effective_once();
    if needs.iter().any(|c| caps & bit(*c) == 0) {
        say_once(
            feature,
            consequence,
            degraded_line(caps, feature, what, needs, consequence),
        );
    }
}

fn say_once(feature: &str, consequence: &str, line: String) {
    static SAID: Mutex<Option<HashSet<String>>> = Mutex::new(None);
    let key = format!("{feature}\0{consequence}");
    let mut said = SAID.lock().unwrap_or_else(|p| p.into_inner());
    if said.get_or_insert_with(HashSet::new).insert(key) {
        eprintln!("stalltrace: {line}");
    }
}

fn degraded_line(caps: u64, feature: &str, what: &str, needs: &[Cap], consequence: &str) -> String {
    let lacking: Vec<&str> = needs
        .iter()
        .filter(|c| caps & bit(**c) == 0)
        .map(|c| c.name)
        .collect();
    let needed: Vec<&str> = needs.iter().map(|c| c.name).collect();
    if lacking.is_empty() {
        return UserError::new(
            format!(
                "{feature}: {what} was refused although this process has {}: a Linux \
                 security module (AppArmor, SELinux) or a sandbox (ProtectProc=, hidepid) \
                 refuses it",
                and_list(&needed)
            ),
            format!("{consequence} (allow it in that profile to have it)"),
        )
        .to_string();
    }
    let lacks = if needed == lacking {
        format!("{}, which this process lacks", and_list(&needed))
    } else {
        format!(
            "{}; this process lacks {}",
            and_list(&needed),
            and_list(&lacking)
        )
    };
    UserError::new(
        format!("{feature}: {what} needs {lacks}"),
        format!("{consequence} (grant {} to have it)", and_list(&lacking)),
    )
    .to_string()
}

fn and_list(names: &[&str]) -> String {
    match names {
        [] => String::new(),
        [one] => one.to_string(),
        [rest @ .., last] => format!("{} and {last}", rest.join(", ")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: u64 = 0x1ff_ffff_ffff;

    #[test]
    fn parses_cap_eff_and_judges_it() {
        let status = "Name:\tx\nCapEff:\t000001ffffffffff\nCapBnd:\t0\n";
        assert_eq!(parse_cap_eff(status), Some(ALL));
        assert!(check(ALL, "6.18.0").is_ok());
        assert!(check(bit(CAP_SYS_ADMIN), "6.18.0").is_ok());
        assert!(check(bit(CAP_BPF) | bit(CAP_PERFMON), "6.18.0").is_ok());
        let e = check(bit(CAP_BPF), "6.18.0").unwrap_err();
        assert!(e.problem.contains("CAP_PERFMON"), "{e}");
        assert!(check(0, "6.18.0").unwrap_err().to_string().contains("root"));
    }

    #[test]
    fn the_hint_names_cap_sys_resource_only_before_5_11() {
        assert_eq!(before_5_11("5.10.0-28-amd64"), Some(true));
        assert_eq!(before_5_11("5.11.0"), Some(false));
        assert_eq!(before_5_11("6.18.44-fc-v669"), Some(false));
        assert_eq!(before_5_11("4.18.0-553.el8_10.x86_64"), Some(true));
        assert_eq!(before_5_11("unknown"), None);
        let new = check(bit(CAP_PERFMON), "6.1.0").unwrap_err().to_string();
        assert!(
            new.contains("CAP_BPF") && !new.contains("CAP_SYS_RESOURCE"),
            "{new}"
        );
        let old = check(bit(CAP_PERFMON), "5.10.0").unwrap_err().to_string();
        assert!(
            old.contains("CAP_SYS_RESOURCE") && old.contains("5.11"),
            "{old}"
        );
        let unknown = check(0, "unknown").unwrap_err().to_string();
        assert!(unknown.contains("CAP_SYS_RESOURCE if"), "{unknown}");
    }

    #[test]
    fn the_report_says_what_a_missing_capability_costs() {
        let all = report(ALL, "6.18.0");
        assert!(
            all[1..USES.len() + 1].iter().all(|l| l.contains(" yes ")),
            "{all:#?}"
        );
        assert!(all.last().unwrap().contains("CAP_NET_ADMIN"));
        assert!(!all.iter().any(|l| l.contains("MISSING")));
        let no_admin = report(ALL & !bit(CAP_SYS_ADMIN), "6.18.0");
        let line = no_admin
            .iter()
            .find(|l| l.contains("CAP_SYS_ADMIN "))
            .unwrap();
        assert!(
            line.contains("MISSING") && line.contains("tcp_flow"),
            "{line}"
        );
        // CAP_SYS_ADMIN stands in for CAP_BPF: not missing then.
        let no_bpf = report(ALL & !bit(CAP_BPF), "6.18.0");
        let line = no_bpf.iter().find(|l| l.contains("CAP_BPF ")).unwrap();
        assert!(
            line.contains("stands in") && !line.contains("MISSING"),
            "{line}"
        );
        // Before 5.11 CAP_SYS_RESOURCE is one of them.
        let old = report(0, "5.10.0");
        assert!(
            old.iter()
                .any(|l| l.contains("CAP_SYS_RESOURCE ") && l.contains("MISSING"))
        );
        assert!(old.iter().filter(|l| l.contains("MISSING")).count() == USES.len() + 1);
    }

    #[test]
    fn a_degradation_names_the_capability_lacking_and_the_feature() {
        let needs = [CAP_DAC_READ_SEARCH, CAP_SYS_PTRACE];
        let line = degraded_line(
            ALL & !bit(CAP_SYS_PTRACE),
            "sqlserver",
            "reading /proc/7/fd",
            &needs,
            "not found",
        );
        assert_eq!(
            line,
            "sqlserver: reading /proc/7/fd needs CAP_DAC_READ_SEARCH and CAP_SYS_PTRACE; \
             this process lacks CAP_SYS_PTRACE: not found (grant CAP_SYS_PTRACE to have it)"
        );
        let line = degraded_line(0, "netdev", "setns", &[CAP_SYS_ADMIN], "no link");
        assert!(
            line.contains("needs CAP_SYS_ADMIN, which this process lacks"),
            "{line}"
        );
        // Refused with every capability in hand: someone else refused it.
        let line = degraded_line(ALL, "sqlserver", "reading /proc/7/fd", &needs, "not found");
        assert!(
            line.contains(
                "refused although this process has CAP_DAC_READ_SEARCH and CAP_SYS_PTRACE"
            ) && line.contains("AppArmor")
                && line.contains("not found (allow it in that profile"),
            "{line}"
        );
        assert_eq!(and_list(&["A", "B", "C"]), "A, B and C");
    }
}
