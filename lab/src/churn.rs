//! Things that come and go by the hundred while a tracer runs: network
//! namespaces joined by veth, with TCP traffic on each, and loop devices with
//! I/O on them. Each churner keeps a few alive at a time and logs when each
//! one appeared and when it was gone, so a test can tell a record about
//! something that still existed from one about something that no longer did.
//!
//! Everything is made through the lab's guards (`NetPair`, `NumberedLoop`):
//! a churn that panics half-way still removes what it made.

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime};

use crate::net::{NetPair, Side};
use crate::util::{sh, sh_stdin, unique};

/// One thing's life: its name (a veth, a loop device), its network
/// namespace inode (0 for a disk), when it was there and when it was gone.
#[derive(Clone, Debug)]
pub struct Lifetime {
    pub name: String,
    pub netns: u64,
    pub born: SystemTime,
    pub gone: SystemTime,
}

/// Create `pairs` namespace pairs one after another, at most `alive` at a
/// time (the oldest is deleted first): each pair is two namespaces joined by
/// a veth, a second veth pair inside the first namespace (`cx{n}a`/`cx{n}b`), TCP handshakes in
/// both families (`NetPair::new`) and 32 KiB sent over a connection. Stops
/// early when `stop` is set. Returns each veth's lifetime.
pub fn churn_namespaces(pairs: usize, alive: usize, stop: &AtomicBool) -> Vec<Lifetime> {
    let mut live: VecDeque<(NetPair, [String; 2], SystemTime)> = VecDeque::new();
    let mut log = Vec::new();
    let retire = |(pair, inner, born): (NetPair, [String; 2], SystemTime),
                  log: &mut Vec<Lifetime>| {
        let ends = [Side::A, Side::B].map(|s| (pair.veth(s).to_string(), pair.netns_inode(s)));
        // The links first, each deletion done when `ip` returns: a deleted
        // namespace's devices go later, in the kernel's own cleanup work,
        // seconds later on a busy host, so "gone" would come before they are.
        let netns = pair.netns(Side::A).to_string();
        sh_stdin(
            "ip",
            &["-n", &netns, "-batch", "-"],
            &format!("link del {}\nlink del {}\n", pair.veth(Side::A), inner[0]),
        );
        let inner = inner.map(|n| (n, pair.netns_inode(Side::A)));
        drop(pair);
        let gone = SystemTime::now();
        for (name, netns) in ends.into_iter().chain(inner) {
            log.push(Lifetime {
                name,
                netns,
                born,
                gone,
            });
        }
    };
    for n in 0..pairs {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let born = SystemTime::now();
        let pair = NetPair::new();
        // Names no other pair has (a namespace's inode is reused by later ones).
        let inner = [format!("cx{n}a"), format!("cx{n}b")];
        sh_stdin(
            "ip",
            &["-n", pair.netns(Side::A), "-batch", "-"],
            &format!(
                "link add {a} type veth peer name {b}\nlink set {a} up\nlink set {b} up\n",
                a = inner[0],
                b = inner[1]
            ),
        );
        exchange(&pair, 32 * 1024);
        live.push_back((pair, inner, born));
        if live.len() > alive {
            retire(live.pop_front().unwrap(), &mut log);
        }
    }
    while let Some(entry) = live.pop_front() {
        retire(entry, &mut log);
    }
    log
}

/// Send `bytes` from A to B over a new IPv4 connection and one byte back.
fn exchange(pair: &NetPair, bytes: usize) {
    let listener = pair.in_netns(Side::B, || {
        TcpListener::bind((pair.v4(Side::B), 0)).expect("bind in B")
    });
    let addr = listener.local_addr().unwrap();
    let mut client = pair.in_netns(Side::A, || {
        TcpStream::connect_timeout(&addr, Duration::from_secs(5)).expect("connect from A")
    });
    let (mut server, _) = listener.accept().unwrap();
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut buf = vec![0u8; bytes];
            server.read_exact(&mut buf).unwrap();
            server.write_all(b"k").unwrap();
        });
        client.write_all(&vec![7u8; bytes]).unwrap();
        let mut ack = [0u8; 1];
        client.read_exact(&mut ack).unwrap();
    });
}

/// A loop device with a number of the caller's choosing (LOOP_CTL_ADD), over
/// a file in /dev/shm; detached, deleted (LOOP_CTL_REMOVE) and its file
/// removed on drop. Numbers of its own keep the names apart from the loop
/// devices other tests get from `losetup --find`.
pub struct NumberedLoop {
    pub number: u32,
    pub name: String,
    file: PathBuf,
    attached: bool,
}

const LOOP_CTL_ADD: libc::c_ulong = 0x4C80;
const LOOP_CTL_REMOVE: libc::c_ulong = 0x4C81;

fn loop_control(request: libc::c_ulong, number: u32) -> std::io::Result<()> {
    let ctl = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/loop-control")?;
    // SAFETY: ioctl on a file we own; both requests take the number by value.
    let rc = unsafe {
        libc::ioctl(
            std::os::fd::AsRawFd::as_raw_fd(&ctl),
            request,
            number as libc::c_ulong,
        )
    };
    if rc < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}

impl NumberedLoop {
    /// Create /dev/loop`number` over a new `mib` MiB file and attach it.
    pub fn new(number: u32, mib: usize) -> Self {
        let file = PathBuf::from("/dev/shm").join(format!("{}.img", unique("stalltrace-churn")));
        let mut dev = Self {
            number,
            name: format!("loop{number}"),
            file,
            attached: false,
        };
        std::fs::write(&dev.file, vec![0x5au8; mib << 20]).unwrap();
        match loop_control(LOOP_CTL_ADD, number) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {}
            Err(e) => panic!("LOOP_CTL_ADD {number}: {e}"),
        }
        sh("losetup", &[&dev.path(), &dev.file.to_string_lossy()]);
        dev.attached = true;
        dev
    }

    pub fn path(&self) -> String {
        format!("/dev/{}", self.name)
    }

    /// Direct reads and writes of `kib` KiB each, in 64 KiB requests.
    pub fn io(&self, kib: usize) {
        let count = format!("count={}", kib / 64);
        let dev = self.path();
        sh(
            "dd",
            &[
                &format!("if={dev}"),
                "of=/dev/null",
                "bs=64k",
                &count,
                "iflag=direct",
                "status=none",
            ],
        );
        sh(
            "dd",
            &[
                "if=/dev/zero",
                &format!("of={dev}"),
                "bs=64k",
                &count,
                "oflag=direct",
                "status=none",
            ],
        );
    }
}

impl Drop for NumberedLoop {
    fn drop(&mut self) {
        if self.attached {
            let _ = Command::new("losetup").args(["-d", &self.path()]).status();
        }
        // EBUSY while something (udev, another test's `losetup --find`
        // scanning devices) still has it open.
        for _ in 0..100 {
            match loop_control(LOOP_CTL_REMOVE, self.number) {
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                    std::thread::sleep(Duration::from_millis(50))
                }
                _ => break,
            }
        }
        let _ = std::fs::remove_file(&self.file);
    }
}

/// Attach, use and remove loop devices `cycles` times, cycling through
/// `numbers` (at most `numbers.len()` alive at a time, each number reused
/// only after all the others). Stops early when
/// `stop` is set. Returns each device's lifetime.
pub fn churn_loops(cycles: usize, numbers: &[u32], stop: &AtomicBool) -> Vec<Lifetime> {
    let mut live: VecDeque<(NumberedLoop, SystemTime)> = VecDeque::new();
    let mut log = Vec::new();
    let retire = |(dev, born): (NumberedLoop, SystemTime), log: &mut Vec<Lifetime>| {
        let name = dev.name.clone();
        drop(dev);
        assert!(
            !std::path::Path::new("/sys/block").join(&name).exists(),
            "{name} is still there after LOOP_CTL_REMOVE"
        );
        log.push(Lifetime {
            name,
            netns: 0,
            born,
            gone: SystemTime::now(),
        });
    };
    for cycle in 0..cycles {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        if live.len() == numbers.len() {
            retire(live.pop_front().unwrap(), &mut log);
        }
        let born = SystemTime::now();
        let dev = NumberedLoop::new(numbers[cycle % numbers.len()], 2);
        dev.io(512);
        live.push_back((dev, born));
    }
    while let Some(entry) = live.pop_front() {
        retire(entry, &mut log);
    }
    log
}

/// Loop device numbers for this process alone: 16 from 10000 + 16 × (pid mod 4096).
pub fn loop_numbers() -> Vec<u32> {
    let base = 10_000 + 16 * (std::process::id() % 4096);
    (base..base + 16).collect()
}
