//! Errors a user sees: one line naming the problem and the fix.

use std::fmt;

/// A failure the user can act on. Printed as `stalltrace: <problem>: <fix>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserError {
    pub problem: String,
    pub fix: String,
}

impl UserError {
    pub fn new(problem: impl Into<String>, fix: impl Into<String>) -> Self {
        Self {
            problem: one_line(problem.into()),
            fix: one_line(fix.into()),
        }
    }

    /// Not allowed to load and attach the probes. `before_5_11`: whether the
    /// kernel is older than 5.11 (None: unknown), where BPF maps are charged
    /// to RLIMIT_MEMLOCK and raising it needs CAP_SYS_RESOURCE.
    pub fn not_privileged(missing: &str, before_5_11: Option<bool>) -> Self {
        let memlock = match before_5_11 {
            Some(false) => "",
            Some(true) => {
                ", and CAP_SYS_RESOURCE on this kernel (before 5.11) unless RLIMIT_MEMLOCK is already unlimited"
            }
            None => ", and CAP_SYS_RESOURCE if the kernel is older than 5.11",
        };
        Self::new(
            format!(
                "not allowed to load eBPF programs, which every probe family needs (missing {missing})"
            ),
            format!(
                "run as root, e.g. `sudo stalltrace ...`, or grant CAP_BPF and CAP_PERFMON{memlock}; `stalltrace check` lists every capability stalltrace uses"
            ),
        )
    }

    pub fn no_btf() -> Self {
        Self::new(
            "this kernel exposes no BTF (/sys/kernel/btf/vmlinux is missing)",
            "use a kernel built with CONFIG_DEBUG_INFO_BTF=y: the default on Debian 11+, RHEL 8.2+, SLES 15 SP2+ and Ubuntu 20.10+; on Ubuntu 20.04 install the HWE kernel (linux-generic-hwe-20.04, 5.15)",
        )
    }

    pub fn lockdown_confidentiality() -> Self {
        Self::new(
            "kernel lockdown is in confidentiality mode, which forbids eBPF programs to read kernel memory (every stalltrace probe does)",
            "boot without lockdown=confidentiality: integrity mode, the Secure Boot default of Debian, Ubuntu, RHEL and SLES, allows tracing",
        )
    }

    pub fn no_ring_buffer(kernel: &str) -> Self {
        Self::new(
            format!("kernel {kernel} has no BPF ring buffer (Linux 5.8 and later have it)"),
            "use a 5.10 or later kernel (RHEL 8.6+ and 9, SLES 15 SP3+, Ubuntu 20.04's HWE kernel 5.15, Debian 11+)",
        )
    }

    pub fn probe_failed(family: &str, hook: &str, why: &str) -> Self {
        Self::new(
            format!("the {family} probe could not attach to {hook}: {why}"),
            format!(
                "run `stalltrace check` for what this kernel supports; pass --degrade to run without the {family} family"
            ),
        )
    }
}

impl fmt::Display for UserError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.problem, self.fix)
    }
}

impl std::error::Error for UserError {}

/// Kernel and library messages can span lines; a user error never does.
fn one_line(s: String) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_one_line_with_problem_and_fix() {
        let e =
            UserError::probe_failed("block", "block_rq_issue", "Invalid argument\n(os error 22)");
        let s = e.to_string();
        assert!(!s.contains('\n'));
        assert!(s.contains("block_rq_issue"));
        assert!(s.contains("--degrade"));
        let e = UserError::not_privileged("CAP_BPF", Some(false)).to_string();
        assert!(e.contains("sudo") && e.contains("CAP_BPF"), "{e}");
        assert!(
            !e.contains("CAP_SYS_RESOURCE"),
            "not needed since 5.11: {e}"
        );
        let e = UserError::not_privileged("CAP_BPF", Some(true)).to_string();
        assert!(
            e.contains("CAP_SYS_RESOURCE on this kernel (before 5.11)"),
            "{e}"
        );
        assert!(
            UserError::no_btf()
                .to_string()
                .contains("CONFIG_DEBUG_INFO_BTF")
        );
    }
}
