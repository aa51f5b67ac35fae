//! SPIDs of encrypted sessions: the `SSL_write` / `SSL_write_ex` uprobes of
//! `ebpf/sqlserver.bpf.c`, attached to the libssl each SQL Server worker maps.
//!
//! SQL Server on Linux does TLS with the host's OpenSSL, so an encrypted
//! session's TDS headers are plaintext only inside `SSL_write*`. A uprobe
//! traps on every call of the worker, whatever the program then does, so by
//! default (`--sql-tls on-demand`) they are attached only while a worker has
//! encrypted sessions without a SPID (or named, whose first response after
//! the login, which says whether they use MARS, is still unread) that send:
//! at its discovery (its sessions are unknown then), when the kernel rings
//! that one of its sockets turned to TLS or that such a session sent while
//! they were off, and until `ON_DEMAND_GRACE` after the last such session
//! was identified or last sent. `always` keeps them attached; `off` never attaches them.
//!
//! A uprobe is scoped to the worker's process (perf_event pid), so no other
//! process mapping the same libssl traps; the program checks the worker
//! table too. The library is opened through /proc/PID/root, so a worker in a
//! container is served by the file its own mount namespace maps.

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use aya::Ebpf;
use aya::maps::{HashMap as BpfHashMap, MapData};
use aya::programs::UProbe;
use aya::programs::uprobe::{UProbeLinkId, UProbeScope};
use object::{Object, ObjectSymbol};

use crate::abi;
use crate::host::caps;
use crate::probes::describe;
pub use crate::records::sql::{SqlTlsStart, TlsPolicy, TlsSpids, TlsSpidsState};

/// The libssl functions whose plaintext is read, each with its program in
/// the object. OpenSSL 1.1.1+ implements neither with the other, so one call
/// traps once. (`SSL_write_ex2`, OpenSSL 3.2+, is reached through
/// `SSL_write_ex` by everything but callers of it by name.)
const SYMBOLS: [(&str, &str); 2] = [
    ("SSL_write", "on_ssl_write"),
    ("SSL_write_ex", "on_ssl_write_ex"),
];

/// How long the uprobes stay attached after a worker's last encrypted
/// session without a SPID: a connection opened in that time has its first
/// response (the login's) read; one opened after it, its first after the
/// kernel rang (docs/sqlserver.md).
pub const ON_DEMAND_GRACE: Duration = Duration::from_secs(60);

/// The grace period: `ON_DEMAND_GRACE`, or for the tests of the kernel's
/// doorbell `STALLTRACE_TEST_TLS_GRACE_MS` (never set in production).
fn grace() -> Duration {
    std::env::var("STALLTRACE_TEST_TLS_GRACE_MS")
        .ok()
        .and_then(|ms| ms.parse().ok())
        .map_or(ON_DEMAND_GRACE, Duration::from_millis)
}

/// The libssl a worker maps, as a path this process can open.
#[derive(Clone, Debug, PartialEq)]
pub struct Library {
    /// Its path in the worker's mount namespace (what /proc/PID/maps says).
    pub mapped: PathBuf,
    /// The same file through /proc/PID/root.
    pub open_as: PathBuf,
    /// The functions it exports, of `SYMBOLS`.
    pub symbols: Vec<&'static str>,
}

enum State {
    /// Ready; no uprobe attached.
    Idle(Library),
    /// Attached, with its links.
    Watching(Library, Vec<(&'static str, UProbeLinkId)>),
    /// Cannot be watched (said once, on stderr and in `sql_instance`).
    Unavailable,
}

struct Worker {
    state: State,
    summary: TlsSpids,
    /// The last time it was known to need the uprobes.
    needed_at: Instant,
}

/// What the uprobes need of the sqlserver object: their programs, and the
/// worker table whose `SQL_WORKER_TLS_WATCHED` bit has the send hook pair a
/// worker's TLS sends with its writes.
pub struct Kernel<'a> {
    pub ebpf: &'a mut Ebpf,
    pub workers: &'a mut BpfHashMap<MapData, u32, u8>,
}

impl Kernel<'_> {
    fn mark(&mut self, pid: u32, watched: bool) -> Result<(), String> {
        let flags = abi::SQL_WORKER_LISTED as u8
            | if watched {
                abi::SQL_WORKER_TLS_WATCHED as u8
            } else {
                0
            };
        self.workers
            .insert(pid, flags, 0)
            .map_err(|e| format!("cannot mark worker {pid} in sql_workers: {}", describe(&e)))
    }
}

/// The uprobes of every worker.
pub struct TlsHooks {
    policy: TlsPolicy,
    /// Why no worker can be watched at all (no uprobe support, the programs
    /// did not load); None when they can.
    unavailable: Option<String>,
    workers: HashMap<u32, Worker>,
}

impl TlsHooks {
    /// Load the uprobe programs of the sqlserver object (they attach per worker later).
    pub fn load(ebpf: &mut Ebpf, policy: TlsPolicy) -> Self {
        let unavailable = if policy == TlsPolicy::Off {
            Some("--sql-tls off".to_string())
        } else {
            uprobe_support().err().or_else(|| {
                SYMBOLS
                    .iter()
                    .find_map(|(_, program)| load_program(ebpf, program).err())
            })
        };
        Self {
            policy,
            unavailable,
            workers: HashMap::new(),
        }
    }

    /// What the `start` record says.
    pub fn start(&self) -> SqlTlsStart {
        SqlTlsStart {
            policy: self.policy,
            available: self.unavailable.is_none(),
            reason: self.unavailable.clone(),
        }
    }

    /// A worker found (already in the kernel's worker table): where its
    /// libssl is, and whether its uprobes can be attached. Attaches them at
    /// once unless the policy is off: its sessions' encryption is not known yet.
    pub fn worker_found(&mut self, kernel: &mut Kernel, pid: u32) -> TlsSpids {
        let (state, summary) = match &self.unavailable {
            Some(_) if self.policy == TlsPolicy::Off => (State::Unavailable, TlsSpids::off()),
            Some(why) => (State::Unavailable, TlsSpids::unavailable(None, why.clone())),
            None => match find_library(Path::new("/proc"), pid) {
                Ok(lib) => {
                    let summary = TlsSpids::available(&lib.mapped, &lib.symbols);
                    (State::Idle(lib), summary)
                }
                Err(why) => (State::Unavailable, TlsSpids::unavailable(None, why)),
            },
        };
        self.workers.insert(
            pid,
            Worker {
                state,
                summary,
                needed_at: Instant::now(),
            },
        );
        match self.attach(kernel, pid) {
            Ok(()) => self.workers[&pid].summary.clone(),
            Err(why) => self.give_up(kernel, pid, why),
        }
    }

    /// The worker needs its uprobes now (an encrypted session without a SPID).
    /// Returns its new summary when attaching failed.
    pub fn needed(&mut self, kernel: &mut Kernel, pid: u32) -> Option<TlsSpids> {
        let worker = self.workers.get_mut(&pid)?;
        worker.needed_at = Instant::now();
        match self.attach(kernel, pid) {
            Ok(()) => None,
            Err(why) => Some(self.give_up(kernel, pid, why)),
        }
    }

    /// Every idle worker is attached: the kernel rang (a socket of an
    /// unwatched worker turned to TLS) without saying which. Returns the
    /// summaries that changed.
    pub fn rang(&mut self, kernel: &mut Kernel) -> Vec<(u32, TlsSpids)> {
        let idle: Vec<u32> = self
            .workers
            .iter()
            .filter(|(_, w)| matches!(w.state, State::Idle(_)))
            .map(|(pid, _)| *pid)
            .collect();
        idle.into_iter()
            .filter_map(|pid| self.needed(kernel, pid).map(|s| (pid, s)))
            .collect()
    }

    /// Detach the uprobes of workers that have not needed them for the grace
    /// period (`needed`: the workers that need them now).
    pub fn expire(&mut self, kernel: &mut Kernel, needed: &std::collections::HashSet<u32>) {
        if self.policy != TlsPolicy::OnDemand {
            return;
        }
        let grace = grace();
        let done: Vec<u32> = self
            .workers
            .iter()
            .filter(|(pid, w)| {
                matches!(w.state, State::Watching(..))
                    && !needed.contains(pid)
                    && w.needed_at.elapsed() >= grace
            })
            .map(|(pid, _)| *pid)
            .collect();
        for pid in done {
            self.detach(kernel, pid);
        }
    }

    /// The worker exited (the kernel dropped its uprobes with its memory):
    /// its links go.
    pub fn worker_gone(&mut self, ebpf: &mut Ebpf, pid: u32) {
        if let Some(Worker {
            state: State::Watching(_, links),
            ..
        }) = self.workers.remove(&pid)
        {
            detach_links(ebpf, links);
        }
    }

    /// The pairing of plaintext and socket contradicted itself on this
    /// worker: its TLS SPIDs cannot be trusted, so they stop for the run.
    /// Returns its new summary the first time.
    pub fn distrust(&mut self, kernel: &mut Kernel, pid: u32) -> Option<TlsSpids> {
        let summary = &self.workers.get(&pid)?.summary;
        if summary.state == TlsSpidsState::Disabled {
            return None;
        }
        let library = summary.library.clone();
        self.detach(kernel, pid);
        let worker = self.workers.get_mut(&pid)?;
        worker.state = State::Unavailable;
        worker.summary = TlsSpids {
            state: TlsSpidsState::Disabled,
            library,
            symbols: Vec::new(),
            reason: Some(
                "an SSL_write and the TLS record its thread sent next named two SPIDs for one \
                 connection: this server does not send each record from the thread that wrote \
                 it, so SPIDs from TLS are not used; use --sql-dmv"
                    .into(),
            ),
        };
        Some(worker.summary.clone())
    }

    /// Whether the worker's uprobes are attached.
    pub fn watching(&self, pid: u32) -> bool {
        self.workers
            .get(&pid)
            .is_some_and(|w| matches!(w.state, State::Watching(..)))
    }

    /// Whether SPIDs the kernel read in this worker's TLS plaintext may be used.
    pub fn trusted(&self, pid: u32) -> bool {
        self.workers
            .get(&pid)
            .is_some_and(|w| w.summary.state == TlsSpidsState::Available)
    }

    fn attach(&mut self, kernel: &mut Kernel, pid: u32) -> Result<(), String> {
        let Some(worker) = self.workers.get_mut(&pid) else {
            return Ok(());
        };
        let State::Idle(lib) = &worker.state else {
            return Ok(());
        };
        let lib = lib.clone();
        let scope = UProbeScope::OneProcess(NonZeroU32::new(pid).ok_or("pid 0")?);
        // The bit first: a write the uprobe sees is paired by the send hook
        // from its first send on, never later with a send it does not belong to.
        kernel.mark(pid, true)?;
        let mut links = Vec::new();
        for (symbol, program) in SYMBOLS {
            if !lib.symbols.contains(&symbol) {
                continue;
            }
            let attached = uprobe(kernel.ebpf, program).and_then(|p| {
                p.attach(symbol, &lib.open_as, scope)
                    .map_err(|e| describe(&e))
            });
            match attached {
                Ok(link) => links.push((symbol, link)),
                Err(why) => {
                    // Nothing half-attached: the links made so far go.
                    detach_links(kernel.ebpf, links);
                    let _ = kernel.mark(pid, false);
                    return Err(format!(
                        "cannot attach a uprobe to {symbol} of {}: {why}{}",
                        lib.mapped.display(),
                        missing_capability(&why)
                    ));
                }
            }
        }
        worker.state = State::Watching(lib, links);
        Ok(())
    }

    fn detach(&mut self, kernel: &mut Kernel, pid: u32) {
        let Some(worker) = self.workers.get_mut(&pid) else {
            return;
        };
        if let State::Watching(lib, links) =
            std::mem::replace(&mut worker.state, State::Unavailable)
        {
            detach_links(kernel.ebpf, links);
            // After the uprobes: sends of writes made until then are still paired.
            let _ = kernel.mark(pid, false);
            worker.state = State::Idle(lib);
        }
    }

    /// Attaching failed: the worker is unavailable from now on; its summary says why.
    fn give_up(&mut self, kernel: &mut Kernel, pid: u32, why: String) -> TlsSpids {
        self.detach(kernel, pid);
        let worker = self.workers.get_mut(&pid).expect("a known worker");
        worker.state = State::Unavailable;
        worker.summary = TlsSpids::unavailable(worker.summary.library.clone(), why);
        worker.summary.clone()
    }
}

/// The fix for a refused uprobe: perf's uprobes need CAP_SYS_ADMIN (again
/// since Linux 6.16 and its 2025 stable updates; CAP_PERFMON before).
fn missing_capability(why: &str) -> &'static str {
    let refused = why.contains("os error 13") || why.contains("os error 1)");
    if refused && !caps::has(caps::CAP_SYS_ADMIN) {
        " (uprobes need CAP_SYS_ADMIN on this kernel, which this process lacks: grant it)"
    } else {
        ""
    }
}

fn detach_links(ebpf: &mut Ebpf, links: Vec<(&'static str, UProbeLinkId)>) {
    for (symbol, link) in links {
        let program = SYMBOLS
            .iter()
            .find(|(s, _)| *s == symbol)
            .map(|(_, p)| *p)
            .expect("a known symbol");
        if let Ok(p) = uprobe(ebpf, program) {
            let _ = p.detach(link);
        }
    }
}

fn uprobe<'a>(ebpf: &'a mut Ebpf, program: &str) -> Result<&'a mut UProbe, String> {
    ebpf.program_mut(program)
        .ok_or_else(|| format!("program {program} missing from the object"))?
        .try_into()
        .map_err(|e| describe(&e))
}

fn load_program(ebpf: &mut Ebpf, program: &str) -> Result<(), String> {
    uprobe(ebpf, program)?
        .load()
        .map_err(|e| format!("the {program} program did not load: {}", describe(&e)))
}

/// Whether the kernel has the uprobe PMU (CONFIG_UPROBE_EVENTS), through
/// which aya attaches uprobes.
fn uprobe_support() -> Result<(), String> {
    if Path::new("/sys/bus/event_source/devices/uprobe/type").exists() {
        Ok(())
    } else {
        Err(
            "this kernel has no uprobes (no /sys/bus/event_source/devices/uprobe: \
             CONFIG_UPROBE_EVENTS is off)"
                .into(),
        )
    }
}

/// The libssl `pid` maps, checked to be the very file it mapped and to
/// export at least one of `SYMBOLS`. `proc` is /proc (a fixture in tests).
pub fn find_library(proc: &Path, pid: u32) -> Result<Library, String> {
    let maps_path = proc.join(format!("{pid}/maps"));
    let maps = std::fs::read_to_string(&maps_path)
        .map_err(|e| format!("cannot read {}: {e}", maps_path.display()))?;
    let Some(mapping) = libssl_mapping(&maps) else {
        return Err(
            "it maps no libssl.so (its TLS is linked in statically, or it uses another TLS \
             library)"
                .into(),
        );
    };
    if mapping.deleted {
        return Err(format!(
            "{} was replaced on disk after it started (a package upgrade): restart it",
            mapping.path.display()
        ));
    }
    let relative = mapping.path.strip_prefix("/").unwrap_or(&mapping.path);
    let open_as = proc.join(format!("{pid}/root")).join(relative);
    let meta = std::fs::metadata(&open_as)
        .map_err(|e| format!("cannot open {}: {e}", open_as.display()))?;
    if meta.ino() != mapping.inode {
        return Err(format!(
            "{} is no longer the file it mapped (inode {} on disk, {} mapped): restart it",
            mapping.path.display(),
            meta.ino(),
            mapping.inode
        ));
    }
    let symbols = exported(&open_as, &SYMBOLS.map(|(s, _)| s))?;
    if symbols.is_empty() {
        return Err(format!(
            "{} exports neither SSL_write nor SSL_write_ex",
            mapping.path.display()
        ));
    }
    Ok(Library {
        mapped: mapping.path,
        open_as,
        symbols,
    })
}

struct Mapping {
    path: PathBuf,
    inode: u64,
    deleted: bool,
}

/// The first libssl.so* in a maps file (OpenSSL's: NSS's libssl3.so is another library).
fn libssl_mapping(maps: &str) -> Option<Mapping> {
    maps.lines().find_map(|line| {
        // address perms offset dev inode pathname
        let mut fields = line.splitn(6, ' ');
        let inode: u64 = fields.nth(4)?.parse().ok()?;
        let path = fields.next()?.trim_start();
        let (path, deleted) = match path.strip_suffix(" (deleted)") {
            Some(p) => (p, true),
            None => (path, false),
        };
        let name = Path::new(path).file_name()?.to_str()?;
        name.starts_with("libssl.so").then(|| Mapping {
            path: PathBuf::from(path),
            inode,
            deleted,
        })
    })
}

/// Which of `wanted` the ELF file at `path` defines in its dynamic symbol table.
fn exported(path: &Path, wanted: &[&'static str]) -> Result<Vec<&'static str>, String> {
    let data = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let file = object::File::parse(&*data)
        .map_err(|e| format!("{} is not an ELF library: {e}", path.display()))?;
    Ok(wanted
        .iter()
        .copied()
        .filter(|name| {
            file.dynamic_symbols()
                .any(|s| s.is_definition() && s.name() == Ok(name))
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_openssl_not_nss() {
        let maps = "\
7f00-7f10 r--p 00000000 08:01 1111 /usr/lib/x86_64-linux-gnu/libssl3.so
7f10-7f20 r-xp 00001000 08:01 2222 /usr/lib/x86_64-linux-gnu/libssl.so.3
7f20-7f30 r--p 00000000 00:00 0 
";
        let m = libssl_mapping(maps).unwrap();
        assert_eq!(m.path, Path::new("/usr/lib/x86_64-linux-gnu/libssl.so.3"));
        assert_eq!(m.inode, 2222);
        assert!(!m.deleted);
        let m = libssl_mapping("7f-80 r-xp 0 08:01 7 /opt/lib/libssl.so.1.1 (deleted)\n").unwrap();
        assert!(m.deleted);
        assert_eq!(m.path, Path::new("/opt/lib/libssl.so.1.1"));
        assert!(libssl_mapping("7f-80 r-xp 0 08:01 7 /usr/lib/libcrypto.so.3\n").is_none());
    }

    /// The host's OpenSSL (libssl-dev is a build dependency of the
    /// simulator, so every machine that builds the workspace has it).
    const HOST_LIBSSL: &str = "/usr/lib/x86_64-linux-gnu/libssl.so.3";

    #[test]
    fn openssl_exports_both_and_libc_neither() {
        let found = exported(Path::new(HOST_LIBSSL), &SYMBOLS.map(|(s, _)| s))
            .expect("the host's libssl.so.3 (cargo xtask setup installs libssl-dev)");
        assert_eq!(found, ["SSL_write", "SSL_write_ex"]);
        let libc = Path::new("/usr/lib/x86_64-linux-gnu/libc.so.6");
        assert!(exported(libc, &["SSL_write"]).unwrap().is_empty());
    }

    /// A /proc of one process whose maps name `mapped`, with its root holding `file` there.
    fn fake_proc(mapped: &str, file: &Path, inode: u64) -> tempfile::TempDir {
        let proc = tempfile::tempdir().unwrap();
        let pid = proc.path().join("42");
        let at = pid.join("root").join(mapped.trim_start_matches('/'));
        std::fs::create_dir_all(at.parent().unwrap()).unwrap();
        std::os::unix::fs::symlink(file, &at).unwrap();
        std::fs::write(
            pid.join("maps"),
            format!("7f10-7f20 r-xp 00001000 08:01 {inode} {mapped}\n"),
        )
        .unwrap();
        proc
    }

    #[test]
    fn library_is_opened_through_the_workers_root_and_checked() {
        let host = Path::new(HOST_LIBSSL);
        let inode = std::fs::metadata(host)
            .expect("the host's libssl.so.3")
            .ino();
        let proc = fake_proc("/opt/mssql/lib/libssl.so.3", host, inode);
        let lib = find_library(proc.path(), 42).unwrap();
        assert_eq!(lib.mapped, Path::new("/opt/mssql/lib/libssl.so.3"));
        assert_eq!(
            lib.open_as,
            proc.path().join("42/root/opt/mssql/lib/libssl.so.3")
        );
        assert_eq!(lib.symbols, ["SSL_write", "SSL_write_ex"]);

        // Replaced on disk since it was mapped: another inode.
        let proc = fake_proc("/opt/mssql/lib/libssl.so.3", host, inode + 1);
        let why = find_library(proc.path(), 42).unwrap_err();
        assert!(why.contains("no longer the file it mapped"), "{why}");

        // A library by that name without the functions.
        let libc = Path::new("/usr/lib/x86_64-linux-gnu/libc.so.6");
        let proc = fake_proc(
            "/lib/libssl.so.3",
            libc,
            std::fs::metadata(libc).unwrap().ino(),
        );
        let why = find_library(proc.path(), 42).unwrap_err();
        assert!(
            why.contains("exports neither SSL_write nor SSL_write_ex"),
            "{why}"
        );

        // No libssl mapped at all.
        let why = find_library(proc.path(), 43).unwrap_err();
        assert!(why.contains("cannot read"), "{why}");
        std::fs::write(
            proc.path().join("42/maps"),
            "7f-80 r-xp 0 08:01 7 /usr/bin/sqlservr\n",
        )
        .unwrap();
        let why = find_library(proc.path(), 42).unwrap_err();
        assert!(why.contains("maps no libssl.so"), "{why}");
    }
}
