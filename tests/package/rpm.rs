//! The RPM in the same Debian guest, after the .deb is purged: Debian's rpm
//! runs the package's own scriptlets under the guest's systemd (install,
//! start, reload, stop, erase). It checks what the scriptlets and the files
//! do; no RHEL or SLES runs here, and their dnf/zypper (dependency
//! resolution, presets that leave the service disabled) are not exercised.

use std::path::Path;
use std::time::{Duration, Instant};

use stalltrace_lab::kernel_objects::Baseline;
use stalltrace_lab::systemd_guest::SystemdGuest;

use crate::guest::*;

const LOG: &str = "/var/log/stalltrace/stalltrace.jsonl";

/// `deb_files`: the files the .deb installed, which the RPM installs too
/// (each package's own aside).
pub fn installs_starts_reloads_stops_and_erases(
    guest: &SystemdGuest,
    rpm: &Path,
    deb_files: &[String],
    before: Baseline,
    map_names: &std::collections::HashSet<String>,
) {
    // The .deb's purge leaves its user, as Debian does; removed, so that the
    // RPM's %pre has to make it.
    guest.sh(&["userdel", "stalltrace"]);
    assert!(!guest.exec(&["id", "stalltrace"]).status.success());

    // --nodeps: Debian's rpm database knows none of the guest's packages
    // (systemd, util-linux, libc), which dnf would resolve on RHEL.
    let name = rpm.file_name().unwrap().to_string_lossy().into_owned();
    std::fs::copy(rpm, guest.path("/root").join(&name)).unwrap();
    guest.sh(&["rpm", "--install", "--nodeps", &format!("/root/{name}")]);
    let installed = guest.sh(&["rpm", "--query", "--list", "stalltrace"]);
    let rpm_files: Vec<&str> = installed
        .lines()
        .filter(|f| guest.path(f).is_file() && !f.starts_with("/usr/lib/.build-id/"))
        .collect();
    // The same files, but for where each distribution keeps a unit's
    // settings and its package documentation.
    let deb_own = |f: &&String| {
        *f == "/etc/default/stalltrace"
            || f.starts_with("/usr/share/doc/stalltrace/copyright")
            || f.starts_with("/usr/share/doc/stalltrace/changelog")
    };
    let rpm_own =
        |f: &&&str| **f == "/etc/sysconfig/stalltrace" || f.starts_with("/usr/share/licenses/");
    let mut deb_set: Vec<&str> = deb_files
        .iter()
        .filter(|f| !deb_own(f))
        .map(String::as_str)
        .collect();
    let mut rpm_set: Vec<&str> = rpm_files.iter().filter(|f| !rpm_own(f)).copied().collect();
    deb_set.sort();
    rpm_set.sort();
    assert_eq!(rpm_set, deb_set, "the RPM's files vs the .deb's");
    assert!(rpm_files.contains(&"/etc/sysconfig/stalltrace"));

    // %pre made the user, and the log directory is its own, closed to others.
    let uid: u32 = guest
        .sh(&["id", "-u", "stalltrace"])
        .trim()
        .parse()
        .unwrap();
    let log_dir = guest.sh(&["stat", "--format=%U:%G %a", "/var/log/stalltrace"]);
    assert_eq!(log_dir.trim(), "stalltrace:stalltrace 750");
    // %post ran the preset (Debian's presets enable every unit; RHEL's
    // would leave it disabled) and started nothing, as RHEL's packages do.
    assert_eq!(
        guest
            .sh(&["sh", "-c", "systemctl is-enabled stalltrace || true"])
            .trim(),
        "enabled"
    );
    assert_eq!(
        guest
            .sh(&["sh", "-c", "systemctl is-active stalltrace || true"])
            .trim(),
        "inactive"
    );

    // The RPM's settings file is the one the unit reads.
    std::fs::write(
        guest.path("/etc/sysconfig/stalltrace"),
        "STALLTRACE_OPTS=\"--interval 2s\"\n",
    )
    .unwrap();
    guest.sh(&["systemctl", "start", "stalltrace"]);
    let service = await_active(guest);
    assert_eq!(service.uid, uid, "the service runs as user stalltrace");
    let log = guest.path(LOG);
    let start = &records_of(&log)[0];
    assert_eq!(start["type"], "start");
    assert_eq!(start["interval_ms"], 2000, "/etc/sysconfig/stalltrace read");
    let first_run = start["run"].clone();

    // Reload: SIGHUP reopens the file, which takes the run's `start` again.
    guest.sh(&["systemctl", "reload", "stalltrace"]);
    let reopened = await_starts(&log, 2);
    assert_eq!(reopened["run"], first_run, "the same run goes on");
    assert_eq!(
        await_active(guest).pid,
        service.pid,
        "reloaded, not restarted"
    );

    // An upgrade's scriptlets (rpm --reinstall runs them as an upgrade
    // does): the running service restarts on the new files, stays enabled.
    guest.sh(&["rpm", "--reinstall", "--nodeps", &format!("/root/{name}")]);
    assert_last_is_stop_of(&log, &first_run);
    let upgraded = await_active(guest);
    assert_ne!(upgraded.pid, service.pid, "restarted by %postun");
    let restarted_run = await_starts(&log, 3)["run"].clone();
    assert_eq!(
        guest
            .sh(&["sh", "-c", "systemctl is-enabled stalltrace || true"])
            .trim(),
        "enabled",
        "an upgrade keeps the unit enabled"
    );

    guest.sh(&["systemctl", "stop", "stalltrace"]);
    assert_last_is_stop_of(&log, &restarted_run);
    assert_nothing_left(before, map_names);

    // Erase while it runs: %preun stops it (the second run's `stop` last),
    // and nothing stays attached.
    guest.sh(&["systemctl", "start", "stalltrace"]);
    let last_run = await_starts(&log, 4)["run"].clone();
    guest.sh(&["rpm", "--erase", "stalltrace"]);
    assert_last_is_stop_of(&log, &last_run);
    assert_nothing_left(before, map_names);
    assert!(
        !guest
            .exec(&["rpm", "--query", "stalltrace"])
            .status
            .success()
    );
    // systemctl status: 4 = no such unit (%postun reloaded systemd).
    let status = guest.exec(&["systemctl", "status", "stalltrace"]);
    assert_eq!(status.status.code(), Some(4), "{status:?}");
    // Every file goes; the log directory stays while it holds records, and
    // the edited settings file is kept as .rpmsave (rpm's way with an edited
    // %config), like Debian's remove without purge.
    for file in installed.lines().filter(|f| *f != "/var/log/stalltrace") {
        assert!(!guest.path(file).exists(), "{file} is left after erase");
    }
    assert!(guest.path(LOG).exists());
    assert!(guest.path("/etc/sysconfig/stalltrace.rpmsave").exists());
}

/// The `n`th `start` record in `log`, once written (up to 10 s).
fn await_starts(log: &Path, n: usize) -> serde_json::Value {
    let waited = Instant::now();
    loop {
        let starts: Vec<_> = records_of(log)
            .into_iter()
            .filter(|r| r["type"] == "start")
            .collect();
        if let Some(start) = starts.get(n - 1) {
            return start.clone();
        }
        assert!(
            waited.elapsed() < Duration::from_secs(10),
            "{} start records in {}, not {n}",
            starts.len(),
            log.display()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn assert_last_is_stop_of(log: &Path, run: &serde_json::Value) {
    let records = records_of(log);
    let last = records.last().unwrap();
    assert!(
        last["type"] == "stop" && last["run"] == *run,
        "the last record is not run {run}'s `stop`: {last}"
    );
}
