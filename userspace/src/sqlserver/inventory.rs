//! Which SQL Server instances run on this host, what they listen on, which
//! sessions they have, which files they keep on which disks: found from /proc
//! and /sys alone, refreshed every interval.
//!
//! SQL Server on Linux runs a watchdog `sqlservr` and a worker `sqlservr`
//! child; only the worker listens and opens files, so the worker is the
//! `sqlservr` with listening TCP sockets.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::SocketAddr;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::files::{self, DbFile, Disk, Role};
use crate::host::process_filter::ProcessFilter;
use crate::host::procfs::{self, TCP_ESTABLISHED, TCP_LISTEN};
use crate::host::{container, container_lookup};
pub use crate::records::sql::{FileSummary, Instance, Session, SessionKind};

/// How to find SQL Server (`--sql-pid`, `--sql-port`, `--sql-ag-port`).
#[derive(Clone, Debug, Default)]
pub struct Discovery {
    /// The worker's pid, when discovery by name should not be used.
    pub pid: Option<u32>,
    /// TDS ports, when they should not be taken from the listeners.
    pub tds_ports: Vec<u16>,
    /// Availability-group / database-mirroring endpoint ports (default 5022).
    pub ag_ports: Vec<u16>,
    /// `--pid`, `--comm`, `--container`: only workers among these processes.
    pub processes: ProcessFilter,
}

/// How long a closed session still tags records by its tuple: past the
/// kernel's FIN retransmissions of an orphaned socket (tcp_orphan_retries'
/// default of 8 backs off to about 100 s).
const RECENTLY_CLOSED_FOR: Duration = Duration::from_secs(120);
/// At most this many closed sessions remembered (a reconnect storm stays bounded).
const RECENTLY_CLOSED_MAX: usize = 4096;

/// Ports SQL Server backs up to: SMB and NFS shares.
const BACKUP_SHARE_PORTS: [u16; 2] = [445, 2049];
/// How long a process's TCP sockets as last read from /proc/PID/net/tcp{,6}
/// stand when it has opened no socket since (see `Inventory::tcp_sockets_of`):
/// a session's socket leaving ESTABLISHED while its descriptor stays open is
/// seen this much later at most.
const TCP_SOCKETS_FOR: Duration = Duration::from_secs(10);
/// How long a socket not yet listening or established when first looked up
/// (made but not yet bound or connected, or connecting) keeps its process's
/// sockets read again at every refresh: a listener or connection just
/// opening is seen at the next interval. Past it (a unix or UDP socket, which
/// never shows in /proc/PID/net/tcp), it stops costing a read.
const TCP_SOCKET_SETTLES_IN: Duration = Duration::from_secs(5);

/// A socket inode's TCP socket as last read, and when it was first looked up.
type LookedUp = (Option<procfs::TcpSocket>, Instant);

/// What changed in one refresh; each becomes a record.
#[derive(Default, Debug)]
pub struct Changes {
    pub instances: Vec<Instance>,
    pub opened: Vec<Session>,
    pub closed: Vec<Session>,
}

#[derive(Default)]
pub struct Inventory {
    discovery: Discovery,
    proc: PathBuf,
    sys: PathBuf,
    instances: Vec<Instance>,
    files: Vec<DbFile>,
    /// By socket inode.
    sessions: HashMap<u64, Session>,
    /// Sessions closed lately, newest last: the kernel still retransmits a
    /// closed socket's FIN (an orphan, no inode) and those records belong to
    /// the session too. Bounded by age and count.
    recently_closed: VecDeque<(Instant, Session)>,
    /// When the last refresh ran (UTC ms).
    last_refresh_ms: Option<i64>,
    roles: HashMap<Disk, &'static str>,
    /// Per candidate pid: when its sockets were last read, and each socket
    /// inode's TCP socket then (None: not in /proc/PID/net/tcp{,6}) with
    /// when it was first looked up.
    tcp_read: HashMap<u32, (Instant, HashMap<u64, LookedUp>)>,
}

impl Inventory {
    pub fn new(mut discovery: Discovery) -> Self {
        if discovery.ag_ports.is_empty() {
            discovery.ag_ports.push(5022);
        }
        Self {
            discovery,
            proc: PathBuf::from("/proc"),
            sys: PathBuf::from("/sys"),
            ..Default::default()
        }
    }

    pub fn instances(&self) -> &[Instance] {
        &self.instances
    }

    /// Worker pids, for the kernel side's TDS header reader.
    pub fn worker_pids(&self) -> Vec<u32> {
        self.instances.iter().map(|i| i.pid).collect()
    }

    pub fn is_worker(&self, pid: u32) -> bool {
        self.instances.iter().any(|i| i.pid == pid)
    }

    /// The id of the container worker `pid` runs in.
    pub fn container_id(&self, pid: u32) -> Option<String> {
        let instance = self.instances.iter().find(|i| i.pid == pid)?;
        instance.container.as_ref().map(|c| c.id.clone())
    }

    pub fn session_by_inode(&self, ino: u64) -> Option<&Session> {
        self.sessions.get(&ino)
    }

    /// The session on this socket, live or closed lately: a request that ends
    /// at its connection's close may be read after discovery saw it close.
    pub fn session_seen(&self, ino: u64) -> Option<&Session> {
        self.session_by_inode(ino).or_else(|| {
            self.recently_closed
                .iter()
                .rev()
                .map(|(_, s)| s)
                .find(|s| s.sock_ino == ino)
        })
    }

    /// The session on `netns` with this local port and remote end.
    pub fn session_by_tuple(
        &self,
        netns: u32,
        local_port: u16,
        remote: SocketAddr,
    ) -> Option<&Session> {
        let matches =
            |s: &&Session| s.netns == netns && s.local.port() == local_port && s.remote == remote;
        self.sessions.values().find(matches).or_else(|| {
            self.recently_closed
                .iter()
                .rev()
                .map(|(_, s)| s)
                .find(matches)
        })
    }

    /// Each worker's open sessions that use MARS, by its pid.
    pub fn mars_sessions(&self) -> BTreeMap<u32, u64> {
        let mut by_pid = BTreeMap::new();
        for s in self.sessions.values().filter(|s| s.mars) {
            *by_pid.entry(s.pid).or_default() += 1;
        }
        by_pid
    }

    pub fn sessions_mut(&mut self) -> impl Iterator<Item = &mut Session> {
        self.sessions.values_mut()
    }

    /// `data`, `log`, `tempdb`, `backup` or `mixed`, for a disk holding SQL Server files.
    pub fn role_of(&self, disk: Disk) -> Option<&'static str> {
        self.roles.get(&disk).copied()
    }

    /// The database file holding `sector` of `disk`.
    pub fn file_at(&self, disk: Disk, sector: u64) -> Option<&Path> {
        self.files
            .iter()
            .find(|f| f.holds(disk, sector))
            .map(|f| f.path.as_path())
    }

    /// Find instances, their sessions and files again. `now` stamps new sessions.
    pub fn refresh(&mut self, now: &str) -> Changes {
        let mut changes = Changes::default();
        let mut instances = Vec::new();
        let mut files = Vec::new();
        let mut seen = HashMap::new();
        let candidates = self.candidates();
        self.tcp_read
            .retain(|pid, _| candidates.iter().any(|(c, _)| c == pid));
        for (pid, ppid) in candidates {
            let proc_pid = self.proc.join(pid.to_string());
            let open = procfs::open_files(&proc_pid);
            if open.denied {
                crate::host::caps::degraded_if_lacking(
                    "sqlserver",
                    &format!("reading /proc/{pid}/fd of sqlservr (another user's)"),
                    &procfs::OTHERS_FDS_NEED,
                    "a SQL Server run by another user is not found: no sql_instance or \
                     sql_session records, no sql tags, disk roles or slow_io files",
                );
            }
            let sockets = self.tcp_sockets_of(pid, &proc_pid, &open.sockets);
            let mine: Vec<_> = sockets.iter().collect();
            let listening = listening_ports(mine.iter().copied());
            // The watchdog listens on nothing: skip it (unless named by --sql-pid).
            if listening.is_empty() && self.discovery.pid != Some(pid) {
                continue;
            }
            let netns = std::fs::metadata(proc_pid.join("ns/net"))
                .map(|m| m.ino() as u32)
                .unwrap_or(0);
            let ag_ports: Vec<u16> = self.discovery.ag_ports.clone();
            let tds_ports: Vec<u16> = if self.discovery.tds_ports.is_empty() {
                listening
                    .iter()
                    .copied()
                    .filter(|p| !ag_ports.contains(p))
                    .collect()
            } else {
                self.discovery.tds_ports.clone()
            };
            let mut instance_files: Vec<DbFile> = open
                .paths
                .iter()
                .filter_map(|(path, link)| {
                    DbFile::locate(path, link, files::classify(path)?, &self.sys)
                })
                .collect();
            instance_files.sort_by(|a, b| a.path.cmp(&b.path));
            instance_files.dedup_by(|a, b| a.path == b.path);
            for s in mine.iter().filter(|s| s.state == TCP_ESTABLISHED) {
                let kind = if tds_ports.contains(&s.local.port()) {
                    SessionKind::Client
                } else if ag_ports.contains(&s.local.port()) || ag_ports.contains(&s.remote.port())
                {
                    SessionKind::AvailabilityGroup
                } else if BACKUP_SHARE_PORTS.contains(&s.remote.port()) {
                    SessionKind::Backup
                } else {
                    continue;
                };
                let session = self.sessions.remove(&s.inode).unwrap_or_else(|| {
                    let fresh = Session {
                        pid,
                        netns,
                        kind,
                        local: s.local,
                        remote: s.remote,
                        sock_ino: s.inode,
                        first_seen: now.to_string(),
                        spid: None,
                        spid_source: None,
                        encrypted: false,
                        mars: false,
                        dmv: Vec::new(),
                        absent_at_ms: self.last_refresh_ms,
                    };
                    changes.opened.push(fresh.clone());
                    fresh
                });
                seen.insert(s.inode, session);
            }
            let instance = Instance {
                pid,
                watchdog_pid: (ppid > 1).then_some(ppid).filter(|pp| {
                    std::fs::read_to_string(self.proc.join(format!("{pp}/comm")))
                        .is_ok_and(|c| c.trim_end() == "sqlservr")
                }),
                netns,
                tds_ports,
                ag_ports,
                files: instance_files
                    .iter()
                    .map(|f| FileSummary {
                        path: f.path.clone(),
                        role: f.role.name().to_string(),
                        disks: f.disks.iter().map(|(a, b)| format!("{a}:{b}")).collect(),
                        overlay: f.overlay.clone(),
                    })
                    .collect(),
                disk_roles: BTreeMap::new(),
                tls: None, // the live side fills it in (sqlserver/tls.rs)
                container: container::of_pid(&self.proc, pid)
                    .map(|c| container_lookup::Names::shared().named(c)),
            };
            instances.push(instance);
            files.extend(instance_files);
        }
        changes.closed = self.sessions.drain().map(|(_, s)| s).collect();
        self.remember_closed(&changes.closed);
        self.last_refresh_ms = chrono::DateTime::parse_from_rfc3339(now)
            .ok()
            .map(|t| t.timestamp_millis());
        self.sessions = seen;
        self.files = files;
        self.roles = roles(&self.files);
        for instance in &mut instances {
            instance.disk_roles = self
                .files
                .iter()
                .filter(|f| instance.files.iter().any(|s| s.path == f.path))
                .flat_map(|f| f.disks.iter())
                .map(|&(a, b)| (format!("{a}:{b}"), self.roles[&(a, b)].to_string()))
                .collect();
            if !self.instances.contains(instance) {
                changes.instances.push(instance.clone());
            }
        }
        self.instances = instances;
        changes
    }

    /// The TCP sockets among a process's socket inodes. Reading
    /// /proc/PID/net/tcp{,6} walks the kernel's whole established-socket
    /// hash table, however few sockets there are: with one idle worker that
    /// was ~2% of a core at the default interval of 1 s (perf: the daemon's
    /// time in established_get_first). So it is read again only when the
    /// process has a socket inode not looked up yet or one still settling
    /// (`TCP_SOCKET_SETTLES_IN`), or after `TCP_SOCKETS_FOR`.
    fn tcp_sockets_of(
        &mut self,
        pid: u32,
        proc_pid: &Path,
        inodes: &[u64],
    ) -> Vec<procfs::TcpSocket> {
        let settled = |s: &Option<procfs::TcpSocket>, first: &Instant| {
            matches!(s, Some(s) if s.state == TCP_ESTABLISHED || s.state == TCP_LISTEN)
                || first.elapsed() >= TCP_SOCKET_SETTLES_IN
        };
        let fresh = self.tcp_read.get(&pid).is_some_and(|(at, known)| {
            at.elapsed() < TCP_SOCKETS_FOR
                && inodes
                    .iter()
                    .all(|i| known.get(i).is_some_and(|(s, first)| settled(s, first)))
        });
        if !fresh {
            let mut all = if inodes.is_empty() {
                HashMap::new()
            } else {
                procfs::tcp_sockets(proc_pid)
            };
            let before = self
                .tcp_read
                .remove(&pid)
                .map(|(_, k)| k)
                .unwrap_or_default();
            let now = Instant::now();
            let known = inodes
                .iter()
                .map(|i| {
                    let first = before.get(i).map_or(now, |(_, first)| *first);
                    (*i, (all.remove(i), first))
                })
                .collect();
            self.tcp_read.insert(pid, (now, known));
        }
        let known = &self.tcp_read[&pid].1;
        inodes
            .iter()
            .filter_map(|i| known.get(i)?.0.clone())
            .collect()
    }

    fn remember_closed(&mut self, closed: &[Session]) {
        let now = Instant::now();
        self.recently_closed
            .extend(closed.iter().map(|s| (now, s.clone())));
        while self.recently_closed.len() > RECENTLY_CLOSED_MAX
            || self
                .recently_closed
                .front()
                .is_some_and(|(at, _)| now.duration_since(*at) > RECENTLY_CLOSED_FOR)
        {
            self.recently_closed.pop_front();
        }
    }

    /// `sqlservr` processes, or the one named by --sql-pid.
    fn candidates(&self) -> Vec<(u32, u32)> {
        let mut found = match self.discovery.pid {
            Some(pid) => {
                let status = std::fs::read_to_string(self.proc.join(format!("{pid}/status")))
                    .unwrap_or_default();
                let ppid = status
                    .lines()
                    .find_map(|l| l.strip_prefix("PPid:"))
                    .and_then(|v| v.trim().parse().ok())
                    .unwrap_or(0);
                vec![(pid, ppid)]
            }
            None => procfs::processes_named(&self.proc, "sqlservr"),
        };
        found.retain(|&(pid, _)| self.discovery.processes.matches(&self.proc, pid));
        found
    }
}

/// `--sql-pid`, before anything attaches: a process that exists and listens
/// on TCP (a worker listens on its TDS port; its watchdog, init or a typo do
/// not). Its name need not be `sqlservr` (naming another is what the flag is
/// for); when it is not, the name is returned for the caller to say so.
pub fn check_sql_pid(pid: u32) -> Result<Option<String>, crate::error::UserError> {
    let proc_pid = PathBuf::from(format!("/proc/{pid}"));
    let refuse = |why: String| {
        crate::error::UserError::new(
            format!("--sql-pid {pid}: {why}"),
            "give the pid of the SQL Server worker: the `sqlservr` that listens on the TDS port \
             (`ss -ltnp | grep sqlservr`), or leave --sql-pid out to find it by name",
        )
    };
    let comm = std::fs::read_to_string(proc_pid.join("comm"))
        .map_err(|_| refuse("no such process".into()))?
        .trim()
        .to_string();
    let open = procfs::open_files(&proc_pid);
    let sockets = procfs::tcp_sockets(&proc_pid);
    let listening = listening_ports(open.sockets.iter().filter_map(|ino| sockets.get(ino)));
    if listening.is_empty() && !open.denied {
        return Err(refuse(format!(
            "process {pid} ({comm}) listens on no TCP port"
        )));
    }
    Ok((comm != "sqlservr").then_some(comm))
}

/// The ports a process's own TCP sockets listen on, sorted, each once.
fn listening_ports<'a>(mine: impl Iterator<Item = &'a procfs::TcpSocket>) -> Vec<u16> {
    let mut ports: Vec<u16> = mine
        .filter(|s| s.state == TCP_LISTEN)
        .map(|s| s.local.port())
        .collect();
    ports.sort_unstable();
    ports.dedup();
    ports
}

/// Each disk's role: the one role of all the files on it, or `mixed`.
fn roles(files: &[DbFile]) -> HashMap<Disk, &'static str> {
    let mut by_disk: HashMap<Disk, Vec<Role>> = HashMap::new();
    for f in files {
        for d in &f.disks {
            by_disk.entry(*d).or_default().push(f.role);
        }
    }
    by_disk
        .into_iter()
        .map(|(disk, mut roles)| {
            roles.sort();
            roles.dedup();
            (
                disk,
                if roles.len() == 1 {
                    roles[0].name()
                } else {
                    "mixed"
                },
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_disk_with_several_roles_is_mixed() {
        let file = |path: &str, role, disks: Vec<Disk>| DbFile {
            path: PathBuf::from(path),
            role,
            disks,
            overlay: None,
            extents: vec![(0, 8)],
        };
        let r = roles(&[
            file("/d/a.mdf", Role::Data, vec![(8, 0)]),
            file("/d/b.ndf", Role::Data, vec![(8, 0)]),
            file("/l/a.ldf", Role::Log, vec![(8, 16)]),
            file("/t/tempdb.mdf", Role::Tempdb, vec![(8, 32), (253, 1)]),
            file("/t/sales.mdf", Role::Data, vec![(253, 1)]),
        ]);
        assert_eq!(r[&(8, 0)], "data");
        assert_eq!(r[&(8, 16)], "log");
        assert_eq!(r[&(8, 32)], "tempdb");
        assert_eq!(r[&(253, 1)], "mixed");
    }

    #[test]
    fn a_closed_session_still_tags_by_tuple_for_a_while() {
        let session = |ino: u64, port: u16| Session {
            pid: 7,
            netns: 1,
            kind: SessionKind::Client,
            local: "10.0.0.1:1433".parse().unwrap(),
            remote: SocketAddr::new("10.0.0.2".parse().unwrap(), port),
            sock_ino: ino,
            first_seen: String::new(),
            spid: Some(51),
            spid_source: None,
            encrypted: false,
            mars: false,
            dmv: Vec::new(),
            absent_at_ms: None,
        };
        let mut inv = Inventory::new(Discovery::default());
        inv.remember_closed(&[session(1, 50000)]);
        let remote = "10.0.0.2:50000".parse().unwrap();
        assert_eq!(
            inv.session_by_tuple(1, 1433, remote).unwrap().spid,
            Some(51)
        );
        assert!(
            inv.session_by_tuple(2, 1433, remote).is_none(),
            "another netns"
        );
        assert!(inv.session_by_inode(1).is_none(), "closed: no longer live");
        assert_eq!(inv.session_seen(1).map(|s| s.remote), Some(remote));
        // Bounded: the oldest go first.
        let many: Vec<Session> = (0..RECENTLY_CLOSED_MAX as u64)
            .map(|i| session(i + 2, 1 + i as u16))
            .collect();
        inv.remember_closed(&many);
        assert_eq!(inv.recently_closed.len(), RECENTLY_CLOSED_MAX);
        assert!(inv.session_by_tuple(1, 1433, remote).is_none());
    }

    /// /proc/PID/net/tcp{,6} are read again only for a socket not looked up
    /// yet or still opening: a socket's state change alone waits for
    /// `TCP_SOCKETS_FOR`.
    #[test]
    fn sockets_are_read_again_only_for_a_new_or_opening_socket() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("net")).unwrap();
        let header = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n";
        std::fs::write(dir.path().join("net/tcp6"), header).unwrap();
        let write = |lines: &[(&str, u64)]| {
            let body: String = lines
                .iter()
                .map(|(st, ino)| {
                    format!(
                        "   0: 0100007F:0599 0200007F:C350 {st} 00000000:00000000 00:00000000 00000000     0        0 {ino} 1\n"
                    )
                })
                .collect();
            std::fs::write(dir.path().join("net/tcp"), format!("{header}{body}")).unwrap();
        };
        let states = |inv: &mut Inventory, inodes: &[u64]| -> Vec<(u64, u8)> {
            let got = inv.tcp_sockets_of(7, dir.path(), inodes);
            got.iter().map(|s| (s.inode, s.state)).collect()
        };
        let mut inv = Inventory::new(Discovery::default());
        // 100 listening, 101 established; 200 is no TCP socket (a unix one).
        write(&[("0A", 100), ("01", 101)]);
        assert_eq!(states(&mut inv, &[100, 101]), [(100, 10), (101, 1)]);
        // 101 leaves ESTABLISHED: not read again, nothing new.
        write(&[("0A", 100), ("08", 101)]);
        assert_eq!(states(&mut inv, &[100, 101]), [(100, 10), (101, 1)]);
        // A new socket, not yet in the table (made, not yet connected): read again.
        write(&[("0A", 100), ("01", 101)]);
        assert_eq!(states(&mut inv, &[100, 101, 102]), [(100, 10), (101, 1)]);
        // Still opening: read again at the next refresh, which finds it.
        write(&[("0A", 100), ("01", 101), ("01", 102)]);
        assert_eq!(
            states(&mut inv, &[100, 101, 102]),
            [(100, 10), (101, 1), (102, 1)]
        );
        // Every socket settled again: a change waits.
        write(&[("0A", 100), ("08", 101), ("08", 102)]);
        assert_eq!(
            states(&mut inv, &[100, 101, 102]),
            [(100, 10), (101, 1), (102, 1)]
        );
    }

    #[test]
    fn finds_nothing_without_sql_server() {
        let mut inv = Inventory::new(Discovery::default());
        let changes = inv.refresh("2026-01-01T00:00:00.000000Z");
        // No sqlservr on a build machine (the simulator tests run their own).
        if procfs::processes_named(Path::new("/proc"), "sqlservr").is_empty() {
            assert!(changes.instances.is_empty() && inv.instances().is_empty());
            assert_eq!(inv.role_of((8, 0)), None);
        }
    }
}
