//! Containers by pid, cached for the records made many times a second, and
//! their names, from the API socket of the runtime that made the
//! container: podman's (`/run/podman/podman.sock`, `podman system service`,
//! or the `podman.socket` unit) and docker's (`/run/docker.sock`). Both
//! answer the Docker Engine API's `GET /containers/{id}/json`, whose `Name`
//! is the container's name. containerd's and CRI-O's names are their CRI's
//! (gRPC), not read here.
//!
//! One request per container, cached; never from a BPF program's path.
//! A socket that is missing or closed to stalltrace (it is root's, or the
//! docker group's) costs a failed connect, retried once a minute per
//! container. A runtime that does not answer within [`TIMEOUT`] is given up
//! for that minute too.
//!
//! HTTP/1.0 by hand: one small JSON document over a Unix socket, where the
//! HTTP crates either lack Unix sockets (ureq) or bring an async stack for it
//! (hyper with hyperlocal) to the one process that must not stall.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::container::{self, Container, Runtime};

/// How long one lookup may take, connect to last byte.
pub const TIMEOUT: Duration = Duration::from_millis(250);
/// A failed lookup is tried again after this.
const RETRY_AFTER: Duration = Duration::from_secs(60);
/// Containers whose names are kept; the table starts over when full.
const CAPACITY: usize = 1024;
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
    names: Names,
}

impl Cache {
    const TTL: Duration = Duration::from_secs(10);
    const CAPACITY: usize = 4096;

    pub fn of_pid(&mut self, proc_root: &Path, pid: u32) -> Option<Container> {
        let now = Instant::now();
        if let Some((read, container)) = self.by_pid.get(&pid)
            && now.duration_since(*read) < Self::TTL
        {
            return container.clone();
        }
        if self.by_pid.len() >= Self::CAPACITY {
            self.by_pid.clear();
        }
        let container = container::of_pid(proc_root, pid).map(|c| self.names.named(c));
        self.by_pid.insert(pid, (now, container.clone()));
        container
    }
}

/// Container names by id, from the runtimes' sockets.
pub struct Names {
    sockets: Vec<(Runtime, PathBuf)>,
    by_id: HashMap<String, (Instant, Option<String>)>,
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
    /// Names from these sockets, by the runtime they serve.
    pub fn at(sockets: Vec<(Runtime, PathBuf)>) -> Self {
        Self {
            sockets,
            by_id: HashMap::new(),
        }
    }

    /// `container` with its name, when its runtime's socket gives one.
    pub fn named(&mut self, mut container: Container) -> Container {
        container.name = self.name(&container);
        container
    }

    fn name(&mut self, container: &Container) -> Option<String> {
        let socket = self
            .sockets
            .iter()
            .find(|(runtime, _)| Some(*runtime) == container.runtime)?
            .1
            .clone();
        let now = Instant::now();
        if let Some((asked, name)) = self.by_id.get(&container.id)
            && (name.is_some() || now.duration_since(*asked) < RETRY_AFTER)
        {
            return name.clone();
        }
        if self.by_id.len() >= CAPACITY {
            self.by_id.clear();
        }
        let name = ask(&socket, &container.id);
        self.by_id.insert(container.id.clone(), (now, name.clone()));
        name
    }
}

/// `GET /containers/{id}/json` on `socket`: the `Name` of a 200 answer,
/// without the leading `/` docker gives it.
fn ask(socket: &Path, id: &str) -> Option<String> {
    let mut stream = UnixStream::connect(socket).ok()?;
    stream.set_read_timeout(Some(TIMEOUT)).ok()?;
    stream.set_write_timeout(Some(TIMEOUT)).ok()?;
    // HTTP/1.0: the answer is the body up to the close, never chunked.
    let request = format!("GET /containers/{id}/json HTTP/1.0\r\nHost: localhost\r\n\r\n");
    stream.write_all(request.as_bytes()).ok()?;
    let started = Instant::now();
    let mut answer = Vec::new();
    let mut chunk = [0u8; 8192];
    let mut limited = stream.take(MAX_ANSWER);
    loop {
        if started.elapsed() > TIMEOUT {
            return None;
        }
        match limited.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => answer.extend_from_slice(&chunk[..n]),
            Err(_) => return None,
        }
    }
    name_in(&answer)
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

    #[test]
    fn a_name_is_asked_once_of_the_container_s_runtime() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("podman.sock");
        let server = serve(
            &socket,
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n{\"Id\":\"x\",\"Name\":\"/mssql-prod\"}",
            1,
        );
        let mut names = Names::at(vec![(Runtime::Podman, socket)]);
        let named = names.named(container(Runtime::Podman));
        assert_eq!(named.name.as_deref(), Some("mssql-prod"));
        // Cached: the server answers one request only.
        assert_eq!(
            names.named(container(Runtime::Podman)).name.as_deref(),
            Some("mssql-prod")
        );
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
        let mut names = Names::at(vec![(Runtime::Podman, dir.path().join("absent.sock"))]);
        assert_eq!(names.named(container(Runtime::Podman)).name, None);
        // A socket that accepts and never answers: given up after TIMEOUT.
        let silent = dir.path().join("silent.sock");
        let _listener = UnixListener::bind(&silent).unwrap();
        let mut names = Names::at(vec![(Runtime::Podman, silent)]);
        let started = Instant::now();
        assert_eq!(names.named(container(Runtime::Podman)).name, None);
        assert!(started.elapsed() < TIMEOUT * 4, "{:?}", started.elapsed());
    }
}
