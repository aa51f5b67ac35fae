//! The binary's behaviour at its edges: errors are one line naming the problem
//! and the fix, with a non-zero exit and nothing left attached; signals stop it
//! cleanly; `check` reports every hook.

mod common;

use std::process::{Command, Output};

use common::*;

fn stalltrace(args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(stalltrace_bin())
        .args(args)
        .envs(env.iter().copied())
        .output()
        .unwrap()
}

fn one_line_error(out: &Output) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(
        stderr.lines().count(),
        1,
        "expected exactly one line on stderr, got: {stderr:?}"
    );
    assert!(stderr.starts_with("stalltrace: "), "{stderr}");
    assert!(
        out.stdout.is_empty(),
        "nothing may be streamed on error: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    stderr
}

/// (id, name) of every loaded BPF program, from bpftool (independent of stalltrace).
fn loaded_programs() -> Vec<(u64, String)> {
    let json: serde_json::Value =
        serde_json::from_str(&sh("bpftool", &["--json", "prog", "show"])).unwrap();
    json.as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["id"].as_u64().unwrap(),
                p["name"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}

/// Ids of the BPF programs some live process holds (a program fd, or a link
/// fd: both show `prog_id:` in /proc/PID/fdinfo). A program nobody holds that
/// stays loaded is pinned or leaked.
fn held_programs() -> std::collections::HashSet<u64> {
    let mut held = std::collections::HashSet::new();
    for proc in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(fds) = std::fs::read_dir(proc.path().join("fdinfo")) else {
            continue;
        };
        for fd in fds.flatten() {
            let text = std::fs::read_to_string(fd.path()).unwrap_or_default();
            held.extend(
                text.lines()
                    .filter_map(|l| l.strip_prefix("prog_id:"))
                    .filter_map(|v| v.trim().parse::<u64>().ok()),
            );
        }
    }
    held
}

/// Programs matching `gone` must disappear: the kernel frees a program after an
/// RCU grace period once its last fd is closed, so allow it a moment.
fn wait_until_unloaded(what: &str, gone: impl Fn(&(u64, String)) -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let left: Vec<_> = loaded_programs().into_iter().filter(&gone).collect();
        if left.is_empty() {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{what}: still loaded 5 s after exit: {left:?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

#[test]
fn a_report_window_that_is_no_time_is_one_line() {
    let dir = stalltrace_lab::ScratchDir::new("/tmp");
    let file = dir.0.join("run.jsonl");
    std::fs::write(&file, "").unwrap();
    let file = file.to_str().unwrap();
    for (args, says) in [
        (
            &["report", file, "--since", "yesterday"][..],
            "\"yesterday\" is not a time",
        ),
        (
            &["report", file, "--since", "1m ago", "--until", "2h ago"][..],
            "is after --until",
        ),
    ] {
        let out = stalltrace(args, &[]);
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        let line = one_line_error(&out);
        assert!(line.contains(says) && line.contains("--help"), "{line}");
    }
}

#[test]
fn a_bad_flag_is_one_line_and_exit_2() {
    let out = stalltrace(&["run", "--interval", "fast"], &[]);
    assert_eq!(out.status.code(), Some(2));
    let line = one_line_error(&out);
    assert!(
        line.contains("--interval") && line.contains("--help"),
        "{line}"
    );
}

#[test]
fn without_privileges_it_says_so_and_attaches_nothing() {
    require_root();
    // The same binary as an unprivileged user: no capabilities at all.
    let out = Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--inh-caps=-all",
        ])
        .arg(stalltrace_bin())
        .args(["run", "--duration", "1s"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let line = one_line_error(&out);
    assert!(line.contains("not allowed to load eBPF programs"), "{line}");
    assert!(line.contains("CAP_BPF") && line.contains("sudo"), "{line}");
    // CAP_SYS_RESOURCE only matters where BPF memory is charged to RLIMIT_MEMLOCK.
    let release = sh("uname", &["-r"]);
    let mut v = release
        .split(['.', '-'])
        .map(|n| n.parse::<u32>().unwrap_or(0));
    let before_5_11 = (v.next().unwrap_or(0), v.next().unwrap_or(0)) < (5, 11);
    assert_eq!(
        line.contains("CAP_SYS_RESOURCE"),
        before_5_11,
        "{release}: {line}"
    );
}

/// The binary as user nobody with exactly the capabilities `caps` (setpriv's
/// names: `bpf`, `perfmon`, ...), inheritable, ambient and bounding.
fn as_nobody_with(caps: &[&str], args: &[&str]) -> Output {
    let set: Vec<String> = std::iter::once("-all".to_string())
        .chain(caps.iter().map(|c| format!("+{c}")))
        .collect();
    let set = set.join(",");
    Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .args([
            format!("--inh-caps={set}"),
            format!("--ambient-caps={set}"),
            format!("--bounding-set={set}"),
        ])
        .arg("--")
        .arg(stalltrace_bin())
        .args(args)
        .output()
        .unwrap()
}

/// With CAP_BPF and CAP_PERFMON but not CAP_SYS_ADMIN, as user nobody:
/// `check` lists what that costs, `--bpf-stats` is refused with one line
/// naming it, and a run goes on and names it for the part that goes without
/// (no link health from the interfaces of another network namespace: setns);
/// nothing stays attached after.
#[test]
fn a_missing_capability_is_named_with_what_it_serves() {
    require_root();
    let caps = ["bpf", "perfmon"];
    let check = as_nobody_with(&caps, &["check"]);
    let text = String::from_utf8_lossy(&check.stdout);
    assert!(check.status.success(), "{text}");
    let line = |cap: &str| {
        text.lines()
            .find(|l| l.trim_start().starts_with(&format!("{cap} ")))
            .unwrap_or_else(|| panic!("no {cap} line in:\n{text}"))
    };
    assert!(text.contains("\ncapabilities"), "{text}");
    assert!(line("CAP_BPF").contains(" yes "), "{text}");
    let admin = line("CAP_SYS_ADMIN");
    assert!(
        admin.contains("MISSING") && admin.contains("tcp_flow"),
        "{admin}"
    );
    assert!(line("CAP_SYS_PTRACE").contains("MISSING"), "{text}");

    if sh("sysctl", &["-n", "kernel.bpf_stats_enabled"]).trim() != "1" {
        let out = as_nobody_with(&caps, &["run", "--duration", "1s", "--bpf-stats"]);
        assert_eq!(out.status.code(), Some(1));
        let line = one_line_error(&out);
        assert!(
            line.contains("--bpf-stats") && line.contains("CAP_SYS_ADMIN"),
            "{line}"
        );
    }

    // A named network namespace, whose link health netdev reads by entering it.
    let pair = netlab::NetPair::new();
    let out = as_nobody_with(&caps, &["run", "--duration", "1s"]);
    drop(pair);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.lines().all(|l| l.starts_with("stalltrace: ")),
        "{stderr}"
    );
    assert!(
        stderr.lines().any(|l| l.starts_with("stalltrace: netdev:")
            && l.contains("setns")
            && l.contains("CAP_SYS_ADMIN")),
        "{stderr}"
    );
    let records = parse_records(&String::from_utf8(out.stdout).unwrap());
    let start = of_type(&records, "start")[0];
    let probes = start["probes"].as_array().unwrap();
    assert!(
        probes
            .iter()
            .any(|p| p["family"] == "netdev" && p["hook"] == "tcp_probe" && p["attached"] == true),
        "{start}"
    );
    let ids: Vec<u64> = probes
        .iter()
        .filter_map(|p| p["program_id"].as_u64())
        .collect();
    wait_until_unloaded("the run's programs", |(id, _)| ids.contains(id));
}

#[test]
fn an_unwritable_output_fails_before_attaching() {
    require_root();
    let out = stalltrace(
        &[
            "run",
            "--duration",
            "1s",
            "--out",
            "/proc/stalltrace-cannot-write-here",
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(1));
    let line = one_line_error(&out);
    assert!(
        line.contains("cannot write /proc/stalltrace-cannot-write-here") && line.contains("--out"),
        "{line}"
    );
}

/// What names nothing on this host is refused before anything attaches: a
/// misspelt interface, a pid that does not exist, one that listens on no TCP
/// port (no SQL Server worker), port 0.
#[test]
fn targets_that_do_not_exist_are_refused_before_attaching() {
    require_root();
    let pid_max: u32 = std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let mut idle = Command::new("sleep").arg("30").spawn().unwrap();
    let idle_pid = idle.id().to_string();
    let absent_pid = (pid_max + 1).to_string();
    let runs: Vec<_> = [
        (
            &["--iface", "stalltrace-nosuchif"][..],
            "--iface stalltrace-nosuchif: no such interface",
        ),
        (&["--sql-pid", &absent_pid][..], "no such process"),
        (
            &["--sql-pid", &idle_pid][..],
            "(sleep) listens on no TCP port",
        ),
    ]
    .into_iter()
    .map(|(flags, needle)| {
        let out = stalltrace(&[&["run", "--duration", "1s"][..], flags].concat(), &[]);
        (format!("{flags:?}"), needle, out)
    })
    .collect();
    // Gone before any assertion can fail.
    let _ = idle.kill();
    let _ = idle.wait();
    for (flags, needle, out) in runs {
        assert_eq!(out.status.code(), Some(1), "{flags}");
        let line = one_line_error(&out);
        assert!(line.contains(needle), "{flags}: {line}");
    }
    let out = stalltrace(&["run", "--port", "0"], &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(one_line_error(&out).contains("1 to 65535"));
}

/// `investigate --out` writes the file as `run --out` does: created 0640
/// (the stream names hosts, peers and files), appended to, never truncated.
#[test]
fn investigate_writes_its_recording_as_run_does() {
    require_root();
    let dir = stalltrace_lab::ScratchDir::new("/tmp");
    let path = dir.0.join("recording.jsonl");
    let path_arg = path.to_string_lossy().into_owned();
    for _ in 0..2 {
        let out = stalltrace(
            &["investigate", "--duration", "1s", "--out", &path_arg],
            &[],
        );
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o640);
    let text = std::fs::read_to_string(&path).unwrap();
    let starts = text
        .lines()
        .filter(|l| l.contains(r#""type":"start""#))
        .count();
    assert_eq!(starts, 2, "the second run appended to the first: {text}");
}

/// `--out-max-mb` renames files: a device (here /dev/null, in containers
/// /dev/stdout) is refused before anything attaches, and is left where it is.
#[test]
fn rotating_what_is_no_regular_file_is_refused_before_attaching() {
    require_root();
    let out = stalltrace(
        &[
            "run",
            "--duration",
            "1s",
            "--out",
            "/dev/null",
            "--out-max-mb",
            "1",
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(1));
    let line = one_line_error(&out);
    assert!(
        line.contains("/dev/null is no regular file") && line.contains("--out-max-mb"),
        "{line}"
    );
    assert!(!std::path::Path::new("/dev/null.1").exists());
}

#[test]
fn dmv_settings_others_can_read_are_refused_before_attaching() {
    require_root();
    use std::os::unix::fs::PermissionsExt;
    let path = std::env::temp_dir().join(format!("{}.conf", unique("stalltrace-dmv")));
    std::fs::write(
        &path,
        "host = 127.0.0.1\nuser = stalltrace\npassword = s3cret-value\n",
    )
    .unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = stalltrace(
        &[
            "run",
            "--duration",
            "1s",
            "--sql-dmv",
            &path.to_string_lossy(),
        ],
        &[],
    );
    let _ = std::fs::remove_file(&path);
    assert_eq!(out.status.code(), Some(1));
    let line = one_line_error(&out);
    assert!(line.contains("chmod 600"), "{line}");
    assert!(
        !line.contains("s3cret-value"),
        "the password leaked: {line}"
    );
}

#[test]
fn a_probe_that_cannot_attach_is_named_and_nothing_stays_attached() {
    require_root();
    let before: Vec<u64> = loaded_programs().into_iter().map(|(id, _)| id).collect();
    let out = stalltrace(
        &["run", "--duration", "1s"],
        &[("STALLTRACE_FAULT_MISSING_HOOK", "block_rq_issue")],
    );
    assert_eq!(out.status.code(), Some(1));
    let line = one_line_error(&out);
    assert!(line.contains("block_rq_issue"), "{line}");
    assert!(
        line.contains("tp_btf") && line.contains("raw_tp"),
        "both attempts named: {line}"
    );
    assert!(line.contains("stalltrace check"), "{line}");
    // Every program this run loaded is gone: no program loaded since it
    // started stays without a live holder. (Another tracer running on the host
    // meanwhile holds its own programs.)
    let max_before = before.iter().max().copied().unwrap_or(0);
    wait_until_unloaded("block programs of the failed run", |(id, name)| {
        *id > max_before && name.starts_with("on_block_") && !held_programs().contains(id)
    });
    // With --degrade the run goes on without the block family, and says so.
    let out = stalltrace(
        &["run", "--duration", "1s", "--degrade"],
        &[("STALLTRACE_FAULT_MISSING_HOOK", "block_rq_issue")],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let records = parse_records(&String::from_utf8(out.stdout).unwrap());
    let families = &of_type(&records, "start")[0]["families"];
    let block = families
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["family"] == "block")
        .unwrap();
    assert_eq!(block["attached"], false, "{families}");
    assert!(
        block["error"].as_str().unwrap().contains("block_rq_issue"),
        "{families}"
    );
    assert!(
        families
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f["family"] == "tcp" && f["attached"] == true),
        "{families}"
    );
}

#[test]
fn sigterm_writes_stop_and_detaches_every_program() {
    require_root();
    let tracer = Tracer::start(&["--interval", "200ms"]);
    std::thread::sleep(std::time::Duration::from_millis(500));
    let records = tracer.stop_with(libc::SIGTERM);
    let start = of_type(&records, "start")[0];
    let stop = of_type(&records, "stop");
    assert_eq!(stop.len(), 1);
    assert_eq!(stop[0]["reason"], "signal");
    assert_eq!(
        records.last().unwrap()["type"],
        "stop",
        "stop is the last record"
    );
    let ids: Vec<u64> = start["probes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            p["program_id"]
                .as_u64()
                .expect("attached probes carry their program id")
        })
        .collect();
    // Every family's programs: block 5 and its settle pass, tcp 5, netdev 9,
    // sqlserver 4 (on this kernel all load).
    assert_eq!(ids.len(), 24, "{start}");
    wait_until_unloaded("the run's programs", |(id, _)| ids.contains(id));
}

#[test]
fn duration_ends_the_run_with_a_stop_record() {
    require_root();
    let out = stalltrace(&["run", "--duration", "1s", "--interval", "250ms"], &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let records = parse_records(&String::from_utf8(out.stdout).unwrap());
    assert_eq!(records.first().unwrap()["type"], "start");
    let stop = records.last().unwrap();
    assert_eq!(stop["type"], "stop");
    assert_eq!(stop["reason"], "duration");
    let elapsed = stop["elapsed_ms"].as_u64().unwrap();
    assert!(
        (1000..3000).contains(&elapsed),
        "elapsed {elapsed} ms for --duration 1s"
    );
    // Every interval leaves a record at its end, a `heartbeat` when it has
    // nothing else to say: a quiet host never reads as a dead tracer. (The
    // host is shared with other tests: a SQL Server simulator's `sql_requests`
    // or an episode may be all an interval has to say.)
    let interval_scoped = [
        "block",
        "netdev",
        "tcp_rtt",
        "tcp_flow",
        "sql_requests",
        "stall",
        "lost",
        "heartbeat",
    ];
    let ends: std::collections::BTreeSet<&str> = records
        .iter()
        .filter(|r| interval_scoped.contains(&r["type"].as_str().unwrap_or("")))
        .map(|r| r["ts"].as_str().unwrap())
        .collect();
    assert!(
        ends.len() >= 4,
        "interval ends {ends:?} in a 1 s run of 250 ms intervals"
    );
    for r in records.iter().filter(|r| r["type"] == "heartbeat") {
        let others = records
            .iter()
            .filter(|o| {
                o["ts"] == r["ts"] && interval_scoped.contains(&o["type"].as_str().unwrap_or(""))
            })
            .count();
        assert_eq!(
            others, 1,
            "a heartbeat beside other records of its interval: {r}"
        );
    }
}

#[test]
fn check_lists_every_hook_in_both_modes() {
    require_root();
    let out = stalltrace(&["check"], &[]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The verdict first: the SRE reads one line before the details.
    assert!(
        text.starts_with("verdict     ready: every family attaches as `run` attaches it ("),
        "{text}"
    );
    // This kernel has BTF and tp_btf, so every family must take that, the
    // cheapest flavour: a tp_btf object the verifier refuses only makes `run`
    // fall back to raw_tp, which fails nothing and costs the tcp family twice
    // as much per socket call.
    let modes = text.lines().next().unwrap_or_default();
    for family in ["block", "netdev", "sqlserver", "tcp"] {
        assert!(
            modes.contains(&format!("{family} tp_btf")),
            "{family} does not attach in tp_btf here: {text}"
        );
    }
    for hook in [
        "block_bio_queue",
        "block_rq_issue",
        "block_rq_requeue",
        "block_rq_complete",
        "block_bio_complete",
    ] {
        assert_eq!(
            text.matches(&format!("{hook} ")).count(),
            2,
            "{hook} in tp_btf and raw_tp:\n{text}"
        );
    }
    // The kernel's own block stamps, from its BTF: this kernel keeps the
    // allocation's, which the block family reads instead of a hook.
    assert!(
        text.contains("request allocated  rq->start_time_ns: yes"),
        "{text}"
    );
    assert!(
        text.contains("hooks attached in tp_btf") && text.contains("hooks attached in raw_tp"),
        "{text}"
    );
    // Every program it loaded, in both modes, well inside the verifier's
    // limit (this kernel reports what the verifier walked).
    let loaded: Vec<&str> = text
        .lines()
        .filter(|l| l.contains(" attached: ") || l.contains(" loaded: "))
        .collect();
    assert!(loaded.len() >= 40, "{text}");
    for line in loaded {
        let walked: u64 = line
            .split_once(" instructions verified")
            .and_then(|(head, _)| head.rsplit(' ').next()?.parse().ok())
            .unwrap_or_else(|| panic!("no count of verified instructions: {line}"));
        assert!(
            walked <= stalltrace_lab::records::VERIFIER_BUDGET,
            "over the verifier budget: {line}"
        );
    }
}

/// `investigate` records, then reports what it found: iperf3 through a 4
/// Mbit/s tbf in a namespace of the test's own is ranked as a `tx_throttled`
/// episode on that veth, in the text report on stdout, in the `stall` records
/// that `--out` tees (schema-valid, `start` to `stop`), and in the `--html`
/// page; a progress line goes to stderr.
#[test]
fn investigate_reports_the_episode_it_recorded() {
    use common::netlab::{Family, NetPair, Side};
    require_root();
    let net = NetPair::new();
    net.limit_rate(Side::A, "4mbit", "16kb", "400ms");
    let server = net.iperf3_server(Side::B);
    let dir = std::env::temp_dir().join(unique("stalltrace-investigate"));
    std::fs::create_dir_all(&dir).unwrap();
    let (jsonl, html) = (dir.join("run.jsonl"), dir.join("report.html"));
    let child = Command::new(stalltrace_bin())
        .args(["investigate", "--duration", "7s", "--interval", "500ms"])
        .args(["--netns", net.netns(Side::A), "--out"])
        .arg(&jsonl)
        .arg("--html")
        .arg(&html)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The load once it records (its `start` is written after attach): a busy
    // host may take seconds to attach. A guard, not a time limit: a run that
    // never starts would hang the test.
    let attached = std::time::Instant::now();
    while !std::fs::read_to_string(&jsonl).is_ok_and(|s| s.contains("\"type\":\"start\"")) {
        assert!(
            attached.elapsed() < std::time::Duration::from_secs(120),
            "investigate wrote no start record in 120 s"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let iperf = net.iperf3(&server, Family::V4, 4, &[]);
    let out = child.wait_with_output().unwrap();
    let (text, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    let records = std::fs::read_to_string(&jsonl).unwrap_or_default();
    let page = std::fs::read_to_string(&html).unwrap_or_default();
    std::fs::remove_dir_all(&dir).ok();
    assert!(out.status.success(), "investigate failed: {stderr}");
    eprintln!(
        "iperf3 through the tbf: {:.1} Mbit/s\n{text}",
        iperf.received_bps / 1e6
    );
    assert!(
        stderr.contains("stalltrace: recording"),
        "no progress line: {stderr}"
    );
    let veth = net.veth(Side::A);
    let records = parse_records(&records);
    assert_eq!(records.first().map(|r| &r["type"]), Some(&"start".into()));
    assert_eq!(records.last().map(|r| &r["type"]), Some(&"stop".into()));
    let throttled = records
        .iter()
        .any(|r| r["type"] == "stall" && r["cause"] == "tx_throttled" && r["iface"] == veth);
    assert!(throttled, "no tx_throttled stall on {veth} in the records");
    let episodes = text.split("── STALL EPISODES").nth(1).unwrap_or_default();
    let first = episodes.split("\n#2").next().unwrap_or_default();
    assert!(
        first.contains("#1 network: tx throttled") && first.contains(&format!("iface {veth}")),
        "the top episode is not the tbf on {veth}: {first}"
    );
    assert!(
        page.contains("<svg") && page.contains(veth),
        "html report: {} bytes",
        page.len()
    );
}
