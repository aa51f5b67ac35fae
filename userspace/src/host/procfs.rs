//! What /proc says about a process's sockets and files: what SQL Server
//! discovery and the owners of bulk flows need (no client, no configuration).

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::{Path, PathBuf};

use crate::host::caps;

/// One line of /proc/PID/net/tcp{,6}.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TcpSocket {
    pub local: SocketAddr,
    pub remote: SocketAddr,
    /// Kernel TCP state (1 ESTABLISHED ... 10 LISTEN).
    pub state: u8,
    pub inode: u64,
}

pub const TCP_ESTABLISHED: u8 = 1;
pub const TCP_LISTEN: u8 = 10;

/// Processes whose command name is `comm`, with their parent pid.
/// Whether process `pid` (its main thread) is called `comm`.
pub fn is_named(pid: u32, comm: &str) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|n| n.trim_end() == comm)
}

pub fn processes_named(proc: &Path, comm: &str) -> Vec<(u32, u32)> {
    let Ok(dir) = std::fs::read_dir(proc) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for entry in dir.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let name = std::fs::read_to_string(entry.path().join("comm")).unwrap_or_default();
        if name.trim_end() != comm {
            continue;
        }
        if let Some(ppid) = parent_pid(&entry.path()) {
            out.push((pid, ppid));
        }
    }
    out.sort();
    out
}

fn parent_pid(proc_pid: &Path) -> Option<u32> {
    let status = std::fs::read_to_string(proc_pid.join("status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("PPid:"))
        .and_then(|v| v.trim().parse().ok())
}

/// Targets of a process's file descriptors: socket inodes and file paths.
#[derive(Default, Debug)]
pub struct OpenFiles {
    pub sockets: Vec<u64>,
    /// Each file's path as the process's link names it, and the link
    /// (/proc/PID/fd/N) that reaches that very file from any mount namespace
    /// (a container's path need not exist in ours, or be the same file).
    pub paths: Vec<(PathBuf, PathBuf)>,
    /// The descriptors could not be listed or read for want of permission:
    /// another user's need CAP_DAC_READ_SEARCH (to list /proc/PID/fd, mode
    /// 0500) and CAP_SYS_PTRACE (the kernel's ptrace check on each link).
    pub denied: bool,
}

/// What listing and reading another user's /proc/PID/fd needs.
pub const OTHERS_FDS_NEED: [caps::Cap; 2] = [caps::CAP_DAC_READ_SEARCH, caps::CAP_SYS_PTRACE];

pub fn open_files(proc_pid: &Path) -> OpenFiles {
    let mut out = OpenFiles::default();
    let dir = match std::fs::read_dir(proc_pid.join("fd")) {
        Ok(dir) => dir,
        Err(e) => {
            out.denied = e.kind() == io::ErrorKind::PermissionDenied;
            return out;
        }
    };
    for entry in dir.flatten() {
        let target = match std::fs::read_link(entry.path()) {
            Ok(target) => target,
            Err(e) => {
                out.denied |= e.kind() == io::ErrorKind::PermissionDenied;
                continue;
            }
        };
        let text = target.to_string_lossy();
        if let Some(ino) = text
            .strip_prefix("socket:[")
            .and_then(|t| t.strip_suffix(']'))
        {
            if let Ok(ino) = ino.parse() {
                out.sockets.push(ino);
            }
        } else if target.is_absolute() {
            out.paths.push((target, entry.path()));
        }
    }
    // A socket or file open on several descriptors (dup, a stream cloned for a
    // reader and a writer) is one socket, one file.
    out.sockets.sort_unstable();
    out.sockets.dedup();
    out.paths.sort_unstable();
    out.paths.dedup_by(|a, b| a.0 == b.0);
    out
}

/// Every TCP socket in the process's network namespace, by inode.
pub fn tcp_sockets(proc_pid: &Path) -> HashMap<u64, TcpSocket> {
    let mut out = HashMap::new();
    for file in ["net/tcp", "net/tcp6"] {
        let text = std::fs::read_to_string(proc_pid.join(file)).unwrap_or_default();
        for line in text.lines().skip(1) {
            if let Some(s) = parse_tcp_line(line) {
                out.insert(s.inode, s);
            }
        }
    }
    out
}

fn parse_tcp_line(line: &str) -> Option<TcpSocket> {
    let f: Vec<&str> = line.split_whitespace().collect();
    if f.len() < 10 {
        return None;
    }
    Some(TcpSocket {
        local: parse_addr(f[1])?,
        remote: parse_addr(f[2])?,
        state: u8::from_str_radix(f[3], 16).ok()?,
        inode: f[9].parse().ok()?,
    })
}

/// `0100007F:0599` (IPv4) or 32 hex digits (IPv6), each 32-bit word in host
/// (little-endian) order as the kernel prints it; the port is plain hex.
fn parse_addr(field: &str) -> Option<SocketAddr> {
    let (addr, port) = field.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let ip = match addr.len() {
        8 => IpAddr::V4(Ipv4Addr::from(
            u32::from_str_radix(addr, 16).ok()?.to_le_bytes(),
        )),
        32 => {
            let mut bytes = [0u8; 16];
            for (i, chunk) in bytes.chunks_mut(4).enumerate() {
                let word = u32::from_str_radix(&addr[i * 8..i * 8 + 8], 16).ok()?;
                chunk.copy_from_slice(&word.to_le_bytes());
            }
            let v6 = Ipv6Addr::from(bytes);
            // A dual-stack socket reports IPv4 peers as ::ffff:a.b.c.d.
            v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4)
        }
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_proc_net_tcp_lines() {
        let v4 = "   0: 0100007F:0599 0200007F:C350 01 00000000:00000000 00:00000000 00000000     0        0 4242 1 0 20 4 30 10 -1";
        let s = parse_tcp_line(v4).unwrap();
        assert_eq!(s.local, "127.0.0.1:1433".parse().unwrap());
        assert_eq!(s.remote, "127.0.0.2:50000".parse().unwrap());
        assert_eq!((s.state, s.inode), (TCP_ESTABLISHED, 4242));

        let v6 = "   1: 00000000000000000000000000000000:0599 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 777 1";
        let s = parse_tcp_line(v6).unwrap();
        assert_eq!(s.local, "[::]:1433".parse().unwrap());
        assert_eq!(s.state, TCP_LISTEN);

        // ::ffff:10.0.0.5, as a dual-stack listener's accepted socket shows it
        let mapped = "   2: 0000000000000000FFFF00000500000A:0599 0000000000000000FFFF00000600000A:D000 01 0:0 0:0 0 0 0 99 1";
        let s = parse_tcp_line(mapped).unwrap();
        assert_eq!(s.local, "10.0.0.5:1433".parse().unwrap());
        assert_eq!(s.remote, "10.0.0.6:53248".parse().unwrap());
        assert!(parse_tcp_line("garbage").is_none());
    }

    #[test]
    fn reads_this_process() {
        let me = Path::new("/proc/self");
        let files = open_files(me);
        assert!(!files.paths.is_empty() || !files.sockets.is_empty());
        assert!(!files.denied, "a process may always read its own");
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let _same_socket = listener.try_clone().unwrap();
        let port = listener.local_addr().unwrap().port();
        let socks = tcp_sockets(me);
        let ours = open_files(me).sockets;
        let mut unique = ours.clone();
        unique.dedup();
        assert_eq!(unique, ours, "a socket on two descriptors is listed once");
        assert!(
            socks.values().any(|s| s.local.port() == port
                && s.state == TCP_LISTEN
                && ours.contains(&s.inode)),
            "our listener on {port} not found"
        );
    }
}
