//! The packages as a fleet runs them. `cargo xtask test` builds the .deb
//! (`cargo xtask package`: cargo-deb, lintian) and the RPM (`--rpm`:
//! rpmbuild, rpmlint) and names them in STALLTRACE_DEB and STALLTRACE_RPM;
//! this test installs the .deb with apt into a Debian guest that boots
//! systemd as PID 1 (systemd-nspawn, on this kernel), lets the package start
//! the service, loads a disk and a TCP connection, rotates the log with the
//! packaged logrotate snippet, stops the service and purges the package,
//! checking at each step what the kernel, /proc and the records say; then
//! the RPM's scriptlets in the same guest (package/rpm.rs). The container
//! image built from the same .deb runs under podman with only the listed
//! capabilities.

mod common;
#[path = "package/guest.rs"]
mod guest;
#[path = "package/rpm.rs"]
mod rpm;
#[path = "package/sql.rs"]
mod sql;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use common::*;
use guest::*;
use serde_json::Value;
use stalltrace_lab::image::{CAPABILITIES, Image};
use stalltrace_lab::kernel_objects;
use stalltrace_lab::systemd_guest::SystemdGuest;

/// The package `cargo xtask test` built and named in `variable`
/// (STALLTRACE_DEB, STALLTRACE_RPM), or None (locally: the test says it
/// skipped) when it is not set. Under CI it fails instead.
fn built_package(variable: &str) -> Option<PathBuf> {
    match std::env::var_os(variable) {
        Some(path) => {
            let path = PathBuf::from(path);
            assert!(path.is_file(), "{variable}={} is no file", path.display());
            Some(path)
        }
        None => {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "{variable} is not set: run the suite with `cargo xtask test`, which \
                 builds the packages first (CI never skips this test)"
            );
            eprintln!(
                "SKIPPED: {variable} not set (`cargo xtask test` builds the packages and sets it)"
            );
            None
        }
    }
}

fn deb() -> Option<PathBuf> {
    built_package("STALLTRACE_DEB")
}

#[test]
fn the_packages_install_start_rotate_stop_and_leave_under_systemd() {
    require_root();
    let Some(deb) = deb() else { return };
    let Some(rpm) = built_package("STALLTRACE_RPM") else {
        return;
    };
    // What a standard Debian host has and the package needs or names: the
    // guest has no network to fetch them from. man-db: `systemd-analyze
    // verify` opens the unit's Documentation= man page. rpm: the RPM's turn,
    // after the .deb's.
    let guest = SystemdGuest::boot(&["logrotate", "procps", "man-db", "rpm"]);
    let before = kernel_objects::baseline();
    let map_names = kernel_objects::stalltrace_map_names();

    // apt, as a fleet installs it; Debian's default starts the service.
    let name = deb.file_name().unwrap().to_string_lossy().into_owned();
    std::fs::copy(&deb, guest.path("/root").join(&name)).unwrap();
    guest.sh(&["apt-get", "install", "-y", &format!("/root/{name}")]);
    let service = await_active(&guest);
    eprintln!("service: {service:?}");

    // The installed unit as systemd itself judges it (its version: the guest's).
    let unit_path = "/usr/lib/systemd/system/stalltrace.service";
    let verify = guest.exec(&["systemd-analyze", "verify", unit_path]);
    assert!(
        verify.status.success() && verify.stderr.is_empty(),
        "systemd-analyze verify: {}",
        String::from_utf8_lossy(&verify.stderr)
    );
    let security = guest.sh(&[
        "systemd-analyze",
        "security",
        "--no-pager",
        "stalltrace.service",
    ]);
    let score = security
        .lines()
        .find(|l| l.contains("Overall exposure level"))
        .unwrap_or_else(|| panic!("no score in {security}"));
    eprintln!("systemd-analyze security: {}", score.trim());
    // The score packaging/README.md publishes is this one.
    let documented = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../packaging/README.md"),
    )
    .unwrap();
    let value = score
        .split(':')
        .nth(1)
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap();
    assert!(
        documented.contains(&format!("**{value} OK**")),
        "packaging/README.md does not give the measured exposure {value}"
    );

    // Its own user, exactly the unit's capabilities, nothing to gain more.
    let uid: u32 = guest
        .sh(&["id", "-u", "stalltrace"])
        .trim()
        .parse()
        .unwrap();
    assert_ne!(uid, 0);
    assert_eq!(service.uid, uid, "the service runs as user stalltrace");
    let unit =
        std::fs::read_to_string(guest.path("/usr/lib/systemd/system/stalltrace.service")).unwrap();
    let granted = capability_mask(&unit_capabilities(&unit, "AmbientCapabilities"));
    assert_eq!(
        capability_mask(&unit_capabilities(&unit, "CapabilityBoundingSet")),
        granted
    );
    assert_eq!(
        service.cap_eff, granted,
        "effective = the unit's ambient set"
    );
    assert_eq!(service.cap_bnd, granted, "nothing beyond it can be gained");
    assert!(service.no_new_privs);

    // A disk and a TCP connection the service must see.
    let disk = LoopDevice::new(Backing::Disk, 128, true);
    // The daemon looks for new disks once per interval (1 s by default).
    std::thread::sleep(Duration::from_millis(2500));
    let io_before = disk.diskstats();
    let fio = randread_4k(&disk.dev, &["--ioengine=libaio", "--iodepth=8"], 3);
    let io_after = disk.diskstats();
    let port = tcp_load(&guest);
    std::thread::sleep(Duration::from_millis(2500));

    let log = guest.path("/var/log/stalltrace/stalltrace.jsonl");
    let first = records_of(&log);
    let reads = block_records(&first, &disk.name, "read");
    let kernel = io_after.reads_completed - io_before.reads_completed;
    let counted = sum_field(&reads, "count");
    eprintln!(
        "block: {counted} reads in the service's records, diskstats {kernel}, fio {}",
        fio.ios
    );
    assert!(fio.ios > 1000, "fio did too little: {fio:?}");
    assert_eq!(counted, kernel, "reads of {} vs /proc/diskstats", disk.name);
    let netns = guest.netns();
    let rtt: u64 = of_type(&first, "tcp_rtt")
        .into_iter()
        .filter(|r| r["netns"].as_u64() == Some(netns))
        .filter(|r| r["sport"] == port || r["dport"] == port)
        .map(|r| Buckets::merge(&[r], "srtt_us").count())
        .sum();
    eprintln!("tcp: {rtt} RTT samples on port {port} in the guest's namespace {netns}");
    assert!(
        rtt > 0,
        "no tcp_rtt samples for the guest's iperf3 on port {port}"
    );

    // Reload: the packaged logrotate snippet renames the file, creates a new
    // one and reloads the service (SIGHUP), which reopens it.
    guest.sh(&["logrotate", "--force", "/etc/logrotate.d/stalltrace"]);
    let rotated = guest.path("/var/log/stalltrace/stalltrace.jsonl.1");
    let reopened = await_start_record(&log);
    let old = records_of(&rotated);
    assert_eq!(
        reopened["run"], old[0]["run"],
        "the same run goes on in the new file"
    );
    assert!(
        reopened["seqno"].as_u64() > old.last().unwrap()["seqno"].as_u64(),
        "seqno goes on: {} after {}",
        reopened["seqno"],
        old.last().unwrap()["seqno"]
    );
    assert_eq!(
        await_active(&guest).pid,
        service.pid,
        "reloaded, not restarted"
    );

    // DMV settings as the unit's comments say: a root-only file in the
    // credstore, handed to the service by LoadCredential=. stalltrace refuses
    // a settings file it judges open to others at start (exit 1), so a
    // service that keeps running has accepted systemd's copy.
    guest.sh(&[
        "sh",
        "-c",
        "install -d -m 0700 /etc/credstore && \
         printf 'host = 127.0.0.1\nport = 1\nuser = stalltrace\npassword = not-a-secret\n' \
           > /etc/credstore/stalltrace-sql-dmv && chmod 0600 /etc/credstore/stalltrace-sql-dmv && \
         echo 'STALLTRACE_OPTS=\"--sql-dmv /run/credentials/stalltrace.service/stalltrace-sql-dmv\"' \
           > /etc/default/stalltrace && systemctl restart stalltrace",
    ]);
    let with_dmv = await_active(&guest);
    assert_ne!(with_dmv.pid, service.pid, "restarted");
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(
        await_active(&guest).pid,
        with_dmv.pid,
        "still running with the credential"
    );
    let journal = guest.sh(&["journalctl", "--unit=stalltrace", "--no-pager"]);
    assert!(!journal.contains("DMV settings file"), "{journal}");
    // How systemd handed the copy over (its form differs by version).
    eprintln!(
        "credential: {}",
        guest.sh(&[
            "stat",
            "--format=%n %U:%G %a %m",
            "/run/credentials/stalltrace.service",
            "/run/credentials/stalltrace.service/stalltrace-sql-dmv",
        ])
    );
    // The sandbox took nothing the capabilities give: no feature went missing.
    assert_eq!(degradations(&journal), Vec::<&str>::new(), "{journal}");

    // Looking back: a SQL Server's sessions meet loss while the service
    // records; then `investigate --last` finds the episode, with those
    // sessions, in the service's files (one of them rotated by logrotate),
    // recording nothing itself.
    if let Some(sqlservr) = sql::static_sqlservr() {
        // A second rotation: the first rotated file is gzip'd (delaycompress),
        // and the one rotated now holds the first run's end and the restarted
        // run's beginning.
        guest.sh(&["logrotate", "--force", "/etc/logrotate.d/stalltrace"]);
        await_start_record(&log);
        let sessions = sql::sessions_under_loss(&guest, &sqlservr, &log);
        // The episode closes after 2 s without retransmissions, and its
        // `closed` record is written at the next interval.
        std::thread::sleep(Duration::from_secs(4));
        let run = await_active(&guest);
        let look = guest.exec(&["stalltrace", "investigate", "--last", "5m"]);
        let (text, said) = (
            String::from_utf8_lossy(&look.stdout),
            String::from_utf8_lossy(&look.stderr),
        );
        eprintln!("investigate --last 5m: {said}{text}");
        assert!(look.status.success(), "{said}");
        assert!(
            said.contains(
                "looking back at /var/log/stalltrace/stalltrace.jsonl (stalltrace.service's --out"
            ) && !said.contains("recording"),
            "{said}"
        );
        let episodes = text
            .split("── STALL EPISODES")
            .nth(1)
            .and_then(|s| s.split("\n── ").next())
            .unwrap_or_else(|| panic!("no episodes section: {text}"));
        // A network episode names sessions by SPID and client port, as the
        // clients' own `SELECT @@SPID` paired them. (On loopback the clients'
        // sockets are this host's too, and their requests sent again may make
        // an episode of their own, naming no session: sessions are known by
        // the worker's end. It may outrank the others.)
        let network = episodes
            .split("\n#")
            .filter(|e| e.contains(" network: "))
            .find(|e| e.contains("SPID "))
            .unwrap_or_else(|| panic!("no network episode names a session:\n{episodes}"));
        let named: Vec<(u16, u16)> = network
            .split("SPID ")
            .skip(1)
            .map(|s| {
                let words: Vec<&str> = s.split_whitespace().collect();
                let port = words[2]
                    .trim_end_matches([';', ','])
                    .rsplit(':')
                    .next()
                    .unwrap();
                (port.parse().unwrap(), words[0].parse().unwrap())
            })
            .collect();
        assert!(!named.is_empty(), "no session named:\n{network}");
        for session in &named {
            assert!(
                sessions.contains(session),
                "{session:?} is not a (client port, SPID) of {sessions:?}:\n{network}"
            );
        }
        // The whole set was found; the run the service restarted from is not
        // the one reported.
        let flat = text.split_whitespace().collect::<Vec<_>>().join(" ");
        assert!(
            flat.contains("stalltrace.jsonl.2.gz (run file 0, seqno 0–")
                && flat.contains("an earlier run, not reported"),
            "{text}"
        );
        assert_eq!(await_active(&guest).pid, run.pid, "the service went on");
    }

    // Stop: a `stop` record last, and every program and map gone from the kernel.
    guest.sh(&["systemctl", "stop", "stalltrace"]);
    let last = records_of(&log);
    assert_eq!(
        last.last().unwrap()["type"],
        "stop",
        "the last record is `stop`"
    );
    assert_nothing_left(before, &map_names);

    // Purge: every file the package installed goes, and its log directory;
    // the service is unknown, nothing attached or pinned.
    let installed = guest.sh(&["dpkg", "--listfiles", "stalltrace"]);
    let deb_files: Vec<String> = installed
        .lines()
        .filter(|f| guest.path(f).is_file())
        .map(str::to_string)
        .collect();
    guest.sh(&["apt-get", "purge", "-y", "stalltrace"]);
    let package_files = installed
        .lines()
        .filter(|f| !guest.path(f).is_dir() || f.contains("stalltrace"));
    for gone in package_files.chain([
        "/var/log/stalltrace",
        "/etc/systemd/system/multi-user.target.wants/stalltrace.service",
    ]) {
        assert!(!guest.path(gone).exists(), "{gone} is left after purge");
    }
    assert!(
        !guest
            .exec(&["dpkg", "--status", "stalltrace"])
            .status
            .success()
    );
    let status = guest.exec(&["systemctl", "status", "stalltrace"]);
    // systemctl status: 4 = no such unit.
    assert_eq!(status.status.code(), Some(4), "{status:?}");
    let pins = guest.sh(&["sh", "-c", "ls -A /sys/fs/bpf 2>/dev/null || true"]);
    assert!(
        !pins.contains("stalltrace"),
        "pins left in the guest: {pins}"
    );
    assert_nothing_left(before, &map_names);

    rpm::installs_starts_reloads_stops_and_erases(&guest, &rpm, &deb_files, before, &map_names);
}

#[test]
fn the_container_image_streams_records_with_only_the_listed_capabilities() {
    require_root();
    let Some(deb) = deb() else { return };
    let image = Image::build(&deb, &format!("localhost/{}", unique("stalltrace-test")));
    let before = kernel_objects::baseline();
    let map_names = kernel_objects::stalltrace_map_names();
    let disk = LoopDevice::new(Backing::Disk, 128, true);
    // Stopped by SIGTERM once the load is done, as a DaemonSet's pod is.
    let mut podman = image.command(&["run"]);
    let mut child = stalltrace_lab::die_with_parent(&mut podman)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("podman");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let start: Value = serde_json::from_str(&lines.next().expect("a first line").unwrap()).unwrap();
    assert_eq!(start["type"], "start", "{start}");

    // The container's stalltrace as the host sees it: uid 0 of the host's
    // user namespace, with exactly the listed capabilities.
    let pid = container_pid(&image.tag).expect("the container's stalltrace process");
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let granted = capability_mask(CAPABILITIES);
    assert_eq!(status_hex(&status, "CapEff:"), granted, "{status}");
    assert_eq!(status_hex(&status, "CapBnd:"), granted, "{status}");

    std::thread::sleep(Duration::from_millis(2500));
    let io_before = disk.diskstats();
    let fio = randread_4k(&disk.dev, &["--ioengine=libaio", "--iodepth=8"], 2);
    let io_after = disk.diskstats();
    // Two intervals, so the last records carry the drained counts.
    std::thread::sleep(Duration::from_millis(2500));
    // SAFETY: kill(2) on the pid podman reported for its container.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGTERM) }, 0);
    let rest: Vec<String> = lines.map(|l| l.unwrap()).collect();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "podman run: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut records = vec![start];
    records.extend(parse_records(&rest.join("\n")));
    assert_eq!(records.last().unwrap()["type"], "stop");
    for family in records[0]["families"].as_array().unwrap() {
        assert_eq!(family["attached"], true, "{family}");
    }
    let counted = sum_field(&block_records(&records, &disk.name, "read"), "count");
    let kernel = io_after.reads_completed - io_before.reads_completed;
    eprintln!(
        "container: {counted} reads of {}, diskstats {kernel}, fio {}",
        disk.name, fio.ios
    );
    assert_eq!(counted, kernel);
    assert_nothing_left(before, &map_names);
}

/// The DaemonSet is valid Kubernetes (checked offline against the API's own
/// schemas by kubernetes-validate, strict: no unknown field) and grants the
/// container the same capabilities the unit grants the service and the
/// podman test gave the image.
#[test]
fn the_daemonset_is_valid_and_grants_the_unit_s_capabilities() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let manifest = root.join("deploy/kubernetes/daemonset.yaml");
    let Some(out) = kubernetes_validate(&manifest) else {
        return;
    };
    assert!(
        out.status.success(),
        "kubernetes-validate: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let yaml = std::fs::read_to_string(&manifest).unwrap();
    let added: Vec<String> = yaml
        .lines()
        .find_map(|l| l.trim().strip_prefix("add: ["))
        .expect("capabilities add: [..] in the DaemonSet")
        .trim_end_matches(']')
        .split(',')
        .map(|c| format!("CAP_{}", c.trim()))
        .collect();
    let added: Vec<&str> = added.iter().map(String::as_str).collect();
    let unit = std::fs::read_to_string(root.join("packaging/stalltrace.service")).unwrap();
    let granted = capability_mask(&unit_capabilities(&unit, "AmbientCapabilities"));
    assert_eq!(capability_mask(&added), granted, "DaemonSet vs unit");
    assert_eq!(
        capability_mask(CAPABILITIES),
        granted,
        "podman test vs unit"
    );
    for must in [
        "hostPID: true",
        "drop: [ALL]",
        "privileged: false",
        "/sys/kernel/btf",
    ] {
        assert!(yaml.contains(must), "the DaemonSet lacks {must}");
    }
}

/// `kubernetes-validate --strict FILE` (the one `cargo xtask test` names in
/// STALLTRACE_KUBERNETES_VALIDATE, else the PATH's), or None (locally:
/// skipped) when it is not installed. Under CI it fails instead.
fn kubernetes_validate(manifest: &std::path::Path) -> Option<std::process::Output> {
    let program = std::env::var_os("STALLTRACE_KUBERNETES_VALIDATE")
        .unwrap_or_else(|| "kubernetes-validate".into());
    match std::process::Command::new(program)
        .arg("--strict")
        .arg(manifest)
        .output()
    {
        Ok(out) => Some(out),
        Err(e) => {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "kubernetes-validate: {e}: `cargo xtask setup` installs it from PyPI (CI never skips)"
            );
            eprintln!("SKIPPED: kubernetes-validate not installed (`cargo xtask setup`)");
            None
        }
    }
}
