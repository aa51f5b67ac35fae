//! The worker `sqlservr`: opens the database files, listens for TDS, and runs
//! one thread per client session ([`session`], [`requests`]). Each session
//! gets the lowest free SPID from 51 up (as SQL Server hands out user SPIDs),
//! and every packet the server sends on it from the login response on carries
//! that SPID. With TLS (the default) the worker makes itself a certificate at
//! start and negotiates encryption as SQL Server does ([`crate::tls`]).

mod requests;
mod session;

use std::collections::{BTreeSet, HashMap};
use std::io;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context;

use crate::storage::{Rng, Storage};
use crate::tds::tokens::{self, ServerMessage};
use crate::tds::{DEFAULT_PACKET_SIZE, MAX_PACKET_SIZE, MIN_PACKET_SIZE};
use crate::tls::{BioStyle, ServerTls};

/// The first user SPID; SQL Server keeps 1–50 for its own tasks.
pub const FIRST_SPID: u16 = 51;
/// Program name and version in LOGINACK: what a real SQL Server 2022 sends.
const PROG_NAME: &str = "Microsoft SQL Server";
const PROG_VERSION: [u8; 4] = [16, 0, 0x03, 0xE8];
/// How often the accept loop looks at the stop flag.
const POLL_MS: i32 = 200;

#[derive(Clone, Debug)]
pub struct ServerConfig {
    pub listen: SocketAddr,
    pub data: PathBuf,
    pub log: PathBuf,
    pub data_bytes: u64,
    pub log_bytes: u64,
    /// The database LOGIN7 lands in (ENVCHANGE), whatever the client asked for.
    pub database: String,
    /// Seconds between checkpoint bursts; 0 turns the checkpoint thread off.
    pub checkpoint_secs: u64,
    pub checkpoint_pages: usize,
    /// None: no TLS, every PRELOGIN answered ENCRYPT_NOT_SUP (`--no-tls`).
    pub tls: Option<TlsConfig>,
}

#[derive(Clone, Debug)]
pub struct TlsConfig {
    pub bio: BioStyle,
    /// SQL Server's "Force Encryption": the whole session encrypted whatever
    /// the client asks, and a client that cannot encrypt is refused.
    pub force_encryption: bool,
    /// SSLKEYLOGFILE: where session secrets are appended (tests only).
    pub keylog: Option<PathBuf>,
    /// Where to write the self-signed certificate (PEM) at start.
    pub certificate_out: Option<PathBuf>,
}

/// SPIDs in use; the lowest free one is handed out, so they are reused.
#[derive(Default)]
struct SpidPool(Mutex<BTreeSet<u16>>);

impl SpidPool {
    fn acquire(&self) -> Option<u16> {
        let mut used = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let spid = (FIRST_SPID..=i16::MAX as u16).find(|s| !used.contains(s))?;
        used.insert(spid);
        Some(spid)
    }
    fn release(&self, spid: u16) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&spid);
    }
}

struct Shared {
    storage: Storage,
    spids: SpidPool,
    /// The sessions' sockets, to shut them down on SIGTERM.
    open: Mutex<HashMap<u16, TcpStream>>,
    database: String,
    server_name: String,
    tls: Option<ServerTls>,
    /// The last transaction descriptor handed out (server-wide, as SQL
    /// Server's are unique across sessions).
    last_descriptor: AtomicU64,
}

impl Shared {
    fn new_transaction_descriptor(&self) -> u64 {
        self.last_descriptor.fetch_add(1, Ordering::Relaxed) + 1
    }
}

/// Runs the worker until SIGTERM or SIGINT: its certificate, then the files
/// (as SQL Server recovers its databases before it accepts logins), then the
/// listener. Prints
/// `sqlservr: worker PID listening on ADDR` on stdout once it accepts.
pub fn run_worker(cfg: &ServerConfig) -> anyhow::Result<()> {
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [libc::SIGTERM, libc::SIGINT] {
        signal_hook::flag::register(sig, stop.clone()).context("installing signal handlers")?;
    }
    let server_name = crate::hostname();
    let tls = match &cfg.tls {
        Some(t) => {
            let tls = ServerTls::new(&server_name, t.bio, t.force_encryption, t.keylog.as_deref())
                .context("setting up TLS")?;
            if let Some(p) = &t.certificate_out {
                std::fs::write(p, &tls.certificate_pem)
                    .with_context(|| format!("writing the certificate to {}", p.display()))?;
            }
            eprintln!(
                "sqlservr: TLS: self-signed certificate CN={}, bio={}, force_encryption={}{}",
                tls.common_name,
                t.bio.name(),
                if t.force_encryption { "yes" } else { "no" },
                t.keylog
                    .as_ref()
                    .map(|p| format!(", keylog={}", p.display()))
                    .unwrap_or_default()
            );
            Some(tls)
        }
        None => {
            eprintln!("sqlservr: TLS: off (--no-tls): every PRELOGIN is answered ENCRYPT_NOT_SUP");
            None
        }
    };
    // After the certificate (its RSA key takes a while to make): the files'
    // I/O and the listener come close together, as the tests expect.
    let storage = Storage::create(&cfg.data, cfg.data_bytes, &cfg.log, cfg.log_bytes)?;
    let listener =
        TcpListener::bind(cfg.listen).with_context(|| format!("listening on {}", cfg.listen))?;
    listener.set_nonblocking(true)?;
    let shared = Arc::new(Shared {
        storage,
        spids: SpidPool::default(),
        open: Mutex::new(HashMap::new()),
        database: cfg.database.clone(),
        server_name,
        tls,
        // Starts high so that a descriptor never looks like a small count.
        last_descriptor: AtomicU64::new(0x0000_0100_0000_0000),
    });
    println!(
        "sqlservr: worker {} listening on {}",
        std::process::id(),
        listener.local_addr()?
    );

    let checkpointer = (cfg.checkpoint_secs > 0).then(|| {
        let (shared, stop, every, pages) = (
            shared.clone(),
            stop.clone(),
            Duration::from_secs(cfg.checkpoint_secs),
            cfg.checkpoint_pages,
        );
        thread::Builder::new()
            .name("checkpoint".into())
            .spawn(move || checkpoint_loop(&shared, &stop, every, pages))
            .expect("spawning the checkpoint thread")
    });

    let mut sessions: Vec<JoinHandle<()>> = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        if !readable(&listener)? {
            continue;
        }
        let stream = match listener.accept() {
            Ok((s, _)) => s,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                ) =>
            {
                continue;
            }
            Err(e) if e.kind() == io::ErrorKind::ConnectionAborted => continue,
            Err(e) => {
                // EMFILE and the like: say so and back off rather than spin.
                eprintln!("sqlservr: accept: {e}");
                thread::sleep(Duration::from_millis(100));
                continue;
            }
        };
        let Some(spid) = shared.spids.acquire() else {
            eprintln!("sqlservr: no free SPID; closing the connection");
            continue;
        };
        // Registered here, before the thread runs, so that a shutdown can
        // never miss a session.
        match stream.try_clone() {
            Ok(s) => {
                shared
                    .open
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(spid, s);
            }
            Err(e) => {
                eprintln!("sqlservr: session {spid}: {e}");
                shared.spids.release(spid);
                continue;
            }
        }
        let shared2 = shared.clone();
        let handle = thread::Builder::new()
            .name(format!("spid{spid}"))
            .spawn(move || session(&shared2, stream, spid))
            .context("spawning a session thread")?;
        sessions.push(handle);
        sessions.retain(|h| !h.is_finished());
    }

    // Shutdown: stop listening, wake every session (its read sees EOF), wait
    // for them, then let the files close.
    drop(listener);
    for s in shared
        .open
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .values()
    {
        let _ = s.shutdown(Shutdown::Both);
    }
    for h in sessions {
        let _ = h.join();
    }
    if let Some(h) = checkpointer {
        let _ = h.join();
    }
    eprintln!("sqlservr: worker {} shut down", std::process::id());
    Ok(())
}

/// Waits up to POLL_MS for a connection; false on timeout or a signal.
fn readable(listener: &TcpListener) -> io::Result<bool> {
    let mut pfd = libc::pollfd {
        fd: listener.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd for the duration of the call.
    let n = unsafe { libc::poll(&mut pfd, 1, POLL_MS) };
    if n < 0 {
        let e = io::Error::last_os_error();
        return if e.kind() == io::ErrorKind::Interrupted {
            Ok(false)
        } else {
            Err(e)
        };
    }
    Ok(n > 0)
}

fn checkpoint_loop(shared: &Shared, stop: &AtomicBool, every: Duration, pages: usize) {
    let mut rng = Rng::new(seed(0));
    let mut next = Instant::now() + every;
    while !stop.load(Ordering::Relaxed) {
        if Instant::now() < next {
            thread::sleep(Duration::from_millis(POLL_MS as u64));
            continue;
        }
        if let Err(e) = shared.storage.checkpoint(pages, &mut rng) {
            eprintln!("sqlservr: checkpoint: {e}");
        }
        next += every;
    }
}

fn seed(spid: u16) -> u64 {
    let t = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    t ^ ((spid as u64) << 48)
}

/// One client connection, from accept to close.
fn session(shared: &Shared, stream: TcpStream, spid: u16) {
    // SQL Server disables Nagle: each response goes out at once.
    let result = stream
        .set_nodelay(true)
        .and_then(|()| session::serve(shared, &stream, spid));
    if let Err(e) = result {
        let quiet = matches!(
            e.kind(),
            io::ErrorKind::UnexpectedEof
                | io::ErrorKind::ConnectionReset
                | io::ErrorKind::BrokenPipe
        );
        if !quiet {
            let peer = session::peer(&stream);
            eprintln!("sqlservr: session {spid} ({peer}): {e}");
        }
    }
    shared
        .open
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(&spid);
    shared.spids.release(spid);
}

/// The packet size the server agrees to: what the client asked for, within
/// MS-TDS's limits; 0 means "the server's default".
fn negotiated_packet_size(asked: u32) -> usize {
    if asked == 0 {
        DEFAULT_PACKET_SIZE
    } else {
        (asked as usize).clamp(MIN_PACKET_SIZE, MAX_PACKET_SIZE)
    }
}

/// The tokens of a successful login, in the order SQL Server sends them.
fn login_response(reply: &mut Vec<u8>, shared: &Shared, version: u32, asked_packet_size: u32) {
    let info = |number: i32, state: u8, text: String| ServerMessage {
        number,
        state,
        class: 0,
        text,
        server: shared.server_name.clone(),
        procedure: String::new(),
        line: 1,
    };
    tokens::env_change(reply, tokens::ENV_DATABASE, &shared.database, "master");
    tokens::message(
        reply,
        &info(
            5701,
            2,
            format!("Changed database context to '{}'.", shared.database),
        ),
    );
    tokens::env_change_collation(reply, tokens::COLLATION_LATIN1_CI_AS);
    tokens::env_change(reply, tokens::ENV_LANGUAGE, "us_english", "");
    tokens::message(
        reply,
        &info(5703, 1, "Changed language setting to us_english.".into()),
    );
    tokens::login_ack(reply, version, PROG_NAME, PROG_VERSION);
    let size = negotiated_packet_size(asked_packet_size).to_string();
    tokens::env_change(
        reply,
        tokens::ENV_PACKET_SIZE,
        &size,
        &DEFAULT_PACKET_SIZE.to_string(),
    );
    tokens::done(reply, tokens::DONE_FINAL, 0, 0);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spids_start_at_51_and_are_reused_lowest_first() {
        let p = SpidPool::default();
        assert_eq!(p.acquire(), Some(51));
        assert_eq!(p.acquire(), Some(52));
        assert_eq!(p.acquire(), Some(53));
        p.release(52);
        assert_eq!(p.acquire(), Some(52));
        assert_eq!(p.acquire(), Some(54));
    }

    #[test]
    fn packet_size_negotiation() {
        assert_eq!(negotiated_packet_size(0), 4096);
        assert_eq!(negotiated_packet_size(100), 512);
        assert_eq!(negotiated_packet_size(8000), 8000);
        assert_eq!(negotiated_packet_size(100_000), 32767);
    }
}
