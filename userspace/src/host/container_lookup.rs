//! Containers by pid, cached for the records made many times a second, and
//! their names, from the API socket of the runtime that made the
//! container: podman's (`/run/podman/podman.sock`, `podman system service`,
//! or the `podman.socket` unit) and docker's (`/run/docker.sock`). Both
//! answer the Docker Engine API's `GET /containers/{id}/json`, whose `Name`
//! is the container's name. containerd's and CRI-O's names are their CRI's
//! (gRPC), not read here.
//!
//! One request per container, cached, asked by a thread of its own: the
//! daemon's loop never waits on a runtime. A container's records carry its
//! name from the moment the answer is in (the first ones may lack it). Each
//! request is bounded by [`TIMEOUT`], connect (which does not wait for a
//! full backlog) to last byte; a socket that fails (missing, closed to
//! stalltrace: root's or the docker group's, silent, slow) is not asked
//! again for a minute, whatever the container, and at most [`QUEUED`]
//! requests wait: the rest are asked later.
//!
//! HTTP/1.0 by hand: one small JSON document over a Unix socket, where the
//! HTTP crates either lack Unix sockets (ureq) or bring an async stack for it
//! (hyper with hyperlocal) to the one process that must not stall.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, SyncSender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::container::{self, Container, Runtime};

/// How long one lookup may take, connect to last byte.
pub const TIMEOUT: Duration = Duration::from_secs(2);
/// A failed lookup is tried again after this.
const RETRY_AFTER: Duration = Duration::from_secs(60);
/// Containers whose names are kept; the table starts over when full.
const CAPACITY: usize = 1024;
/// Requests waiting for the thread; more are dropped and asked again later.
pub const QUEUED: usize = 16;
/// The most of an answer read: a container's JSON is a few KiB.
const MAX_ANSWER: u64 = 1 << 20;

/// Containers by pid for records made many times a second (`slow_io`),
/// named: each pid's /proc file is read at most once per [`Cache::TTL`], and
/// the table never holds more than [`Cache::CAPACITY`] pids (it starts over
/// when full). A pid reused within the TTL keeps the earlier process's
/// container until then.
#[derive(Default)]
pub struct Cache {
    by_pid: HashMap<u32, (Instant, Option<Container>)>,
}

impl Cache {
    const TTL: Duration = Duration::from_secs(10);
    const CAPACITY: usize = 4096;

    pub fn of_pid(&mut self, proc_root: &Path, pid: u32) -> Option<Container> {
        let now = Instant::now();
        // Named at each use: a name that came in since the read is given.
        if let Some((read, container)) = self.by_pid.get(&pid)
            && now.duration_since(*read) < Self::TTL
        {
            return container.clone().map(|c| Names::shared().named(c));
        }
        if self.by_pid.len() >= Self::CAPACITY {
            self.by_pid.clear();
        }
        let container = container::of_pid(proc_root, pid);
        self.by_pid.insert(pid, (now, container.clone()));
        container.map(|c| Names::shared().named(c))
    }
}

/// A runtime's socket gave no answer in time, or none at all.
#[derive(Debug)]
pub struct Unreachable;

/// Container names by id, from the runtimes' sockets.
pub struct Names {
    sockets: Vec<(Runtime, PathBuf)>,
    known: Arc<Mutex<Known>>,
    requests: SyncSender<(PathBuf, String)>,
}

#[derive(Default)]
struct Known {
    /// By container id: asked (None) or answered, when, with what.
    by_id: HashMap<String, Option<(Instant, Option<String>)>>,
    /// Sockets that failed, and when: not asked again before RETRY_AFTER.
    failed: HashMap<PathBuf, Instant>,
}

impl Default for Names {
    fn default() -> Self {
        Self::at(vec![
            (Runtime::Podman, PathBuf::from("/run/podman/podman.sock")),
            (Runtime::Docker, PathBuf::from("/run/docker.sock")),
        ])
    }
}

impl Names {
    /// The daemon's one table, on the default sockets: a name discovery
    /// asked for is there for the records of the container's processes.
    pub fn shared() -> &'static Names {
        static SHARED: std::sync::OnceLock<Names> = std::sync::OnceLock::new();
        SHARED.get_or_init(Names::default)
    }

    /// Names from these sockets, by the runtime they serve; the thread that
    /// asks them ends with this.
    pub fn at(sockets: Vec<(Runtime, PathBuf)>) -> Self {
        let known = Arc::new(Mutex::new(Known::default()));
        let (requests, asked) = mpsc::sync_channel::<(PathBuf, String)>(QUEUED);
        let answers = Arc::clone(&known);
        let _ = std::thread::Builder::new()
            .name("container-names".into())
            .spawn(move || {
                for (socket, id) in asked {
                    let answer = ask(&socket, &id);
                    let mut known = answers.lock().unwrap_or_else(|e| e.into_inner());
                    let now = Instant::now();
                    let name = answer.unwrap_or_else(|()| {
                        known.failed.insert(socket, now);
                        None
                    });
                    known.by_id.insert(id, Some((now, name)));
                }
            });
        Self {
            sockets,
            known,
            requests,
        }
    }

    /// `container` with its name, when its runtime's socket has given one.
    pub fn named(&self, mut container: Container) -> Container {
        container.name = self.name(&container);
        container
    }

    /// `container`'s name, asked of its runtime now and waited for (at
    /// start, to resolve `--container NAME`; never on the records' path).
    /// `Err` when its runtime's socket failed.
    pub fn name_now(&self, container: &Container) -> Result<Option<String>, Unreachable> {
        let Some((_, socket)) = self
            .sockets
            .iter()
            .find(|(runtime, _)| Some(*runtime) == container.runtime)
        else {
            return Ok(None);
        };
        ask(socket, &container.id).map_err(|()| Unreachable)
    }

    fn name(&self, container: &Container) -> Option<String> {
        let (_, socket) = self
            .sockets
            .iter()
            .find(|(runtime, _)| Some(*runtime) == container.runtime)?;
        let now = Instant::now();
        let mut known = self.known.lock().unwrap_or_else(|e| e.into_inner());
        match known.by_id.get(&container.id) {
            Some(None) => return None, // asked, no answer yet
            Some(Some((at, name))) if name.is_some() || now.duration_since(*at) < RETRY_AFTER => {
                return name.clone();
            }
            _ => {}
        }
        if known
            .failed
            .get(socket)
            .is_some_and(|at| now.duration_since(*at) < RETRY_AFTER)
        {
            return None;
        }
        if known.by_id.len() >= CAPACITY {
            known.by_id.clear();
        }
        if self
            .requests
            .try_send((socket.clone(), container.id.clone()))
            .is_ok()
        {
            known.by_id.insert(container.id.clone(), None);
        }
        None
    }
}

/// `GET /containers/{id}/json` on `socket`: the `Name` of a 200 answer,
/// without the leading `/` docker gives it; `Err` when the socket failed
/// (no answer within TIMEOUT, or none at all).
fn ask(socket: &Path, id: &str) -> Result<Option<String>, ()> {
    let deadline = Instant::now() + TIMEOUT;
    let left = || {
        deadline
            .checked_duration_since(Instant::now())
            .filter(|d| !d.is_zero())
            .ok_or(())
    };
    // socket2: std's UnixStream::connect has no timeout, and a Unix socket's
    // connect sleeps while the listener's backlog is full.
    let address = socket2::SockAddr::unix(socket).map_err(|_| ())?;
    let raw =
        socket2::Socket::new(socket2::Domain::UNIX, socket2::Type::STREAM, None).map_err(|_| ())?;
    raw.connect_timeout(&address, left()?).map_err(|_| ())?;
    let mut stream = UnixStream::from(raw);
    stream.set_write_timeout(Some(left()?)).map_err(|_| ())?;
    // HTTP/1.0: the answer is the body up to the close, never chunked.
    let request = format!("GET /containers/{id}/json HTTP/1.0\r\nHost: localhost\r\n\r\n");
    stream.write_all(request.as_bytes()).map_err(|_| ())?;
    let mut answer = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        stream.set_read_timeout(Some(left()?)).map_err(|_| ())?;
        match stream.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) if answer.len() as u64 + n as u64 > MAX_ANSWER => return Ok(None),
            Ok(n) => answer.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => return Err(()),
        }
    }
    Ok(name_in(&answer))
}

fn name_in(answer: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(answer).ok()?;
    let (head, body) = text.split_once("\r\n\r\n")?;
    let status = head.lines().next()?.split_whitespace().nth(1)?;
    if status != "200" {
        return None;
    }
    let json: serde_json::Value = serde_json::from_str(body).ok()?;
    let name = json["Name"].as_str()?.trim_start_matches('/');
    (!name.is_empty()).then(|| name.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;

    const ID: &str = "2e2222c3a81289eb9bef02d9d669e8d0e12c6b9fa0470ae84110ead8628cfd5d";

    fn container(runtime: Runtime) -> Container {
        Container {
            runtime: Some(runtime),
            id: ID.into(),
            name: None,
            pod_uid: None,
            cgroup: format!("/libpod_parent/libpod-{ID}"),
        }
    }

    /// A runtime's socket that answers `answers` requests with `answer`,
    /// recording each request line.
    fn serve(
        socket: &Path,
        answer: &'static str,
        answers: usize,
    ) -> std::thread::JoinHandle<Vec<String>> {
        let listener = UnixListener::bind(socket).unwrap();
        std::thread::spawn(move || {
            let mut asked = Vec::new();
            for _ in 0..answers {
                let (mut conn, _) = listener.accept().unwrap();
                let mut request = [0u8; 1024];
                let n = conn.read(&mut request).unwrap();
                asked.push(
                    String::from_utf8_lossy(&request[..n])
                        .lines()
                        .next()
                        .unwrap()
                        .to_string(),
                );
                conn.write_all(answer.as_bytes()).unwrap();
            }
            asked
        })
    }

    /// What `names` says of `container` once its thread has answered (up to 5 s).
    fn answered(names: &Names, container: &Container) -> Option<String> {
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(5) {
            let known = names.known.lock().unwrap();
            if let Some(Some((_, name))) = known.by_id.get(&container.id) {
                return name.clone();
            }
            drop(known);
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("no answer in 5 s");
    }

    #[test]
    fn a_name_is_asked_once_of_the_container_s_runtime() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("podman.sock");
        let server = serve(
            &socket,
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n{\"Id\":\"x\",\"Name\":\"/mssql-prod\"}",
            1,
        );
        let names = Names::at(vec![(Runtime::Podman, socket)]);
        let podman = container(Runtime::Podman);
        // Asked, not waited for.
        assert_eq!(names.named(podman.clone()).name, None);
        assert_eq!(answered(&names, &podman).as_deref(), Some("mssql-prod"));
        assert_eq!(
            names.named(podman.clone()).name.as_deref(),
            Some("mssql-prod")
        );
        // Cached: the server answered one request only.
        assert_eq!(
            server.join().unwrap(),
            [format!("GET /containers/{ID}/json HTTP/1.0")]
        );
        // Another runtime's container is not asked of this socket.
        assert_eq!(names.named(container(Runtime::Docker)).name, None);
    }

    #[test]
    fn no_name_from_an_error_a_missing_socket_or_a_silent_runtime() {
        assert_eq!(
            name_in(b"HTTP/1.1 404 Not Found\r\n\r\n{\"message\":\"no such container\"}"),
            None
        );
        assert_eq!(name_in(b"HTTP/1.1 200 OK\r\n\r\nnot json"), None);
        assert_eq!(name_in(b"garbage"), None);
        let dir = tempfile::tempdir().unwrap();
        let names = Names::at(vec![(Runtime::Podman, dir.path().join("absent.sock"))]);
        let podman = container(Runtime::Podman);
        assert_eq!(names.named(podman.clone()).name, None);
        assert_eq!(answered(&names, &podman), None);
        // A socket that accepts and never answers: the caller never waits,
        // the thread gives up after TIMEOUT, and the socket is not asked
        // again within the minute, for any container.
        let silent = dir.path().join("silent.sock");
        let _listener = UnixListener::bind(&silent).unwrap();
        let names = Names::at(vec![(Runtime::Podman, silent.clone())]);
        let started = Instant::now();
        assert_eq!(names.named(podman.clone()).name, None);
        assert!(started.elapsed() < TIMEOUT / 10, "{:?}", started.elapsed());
        assert_eq!(answered(&names, &podman), None);
        let waited = started.elapsed();
        assert!(waited >= TIMEOUT && waited < TIMEOUT * 2, "{waited:?}");
        assert!(names.known.lock().unwrap().failed.contains_key(&silent));
        let other = Container {
            id: ID.replace('2', "3"),
            ..container(Runtime::Podman)
        };
        assert_eq!(names.named(other.clone()).name, None);
        assert!(
            !names.known.lock().unwrap().by_id.contains_key(&other.id),
            "asked again"
        );
    }
}
