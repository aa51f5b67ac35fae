//! `backup`: a backup stream (a database file read with O_DIRECT and written
//! to a TCP socket, as a backup to a network share does) that crawls. Two at
//! once, each in its own pair of namespaces: one held back by the network (a
//! 20 Mbit/s tbf on the sender's link, the file on a fast disk), one by its
//! disk (no shaper; the file on a slow disk: a loop device stacked on another
//! that a blkio cgroup throttles for the sender, see `sql::SlowDisk`). stalltrace
//! should tell them apart from the kernel's own accounting of each socket
//! (`tcp_flow`): `network_limited` vs `application_limited` (with the slow
//! disk's `storage` episode). Clean: one stream, fast disk, no shaper.

use std::io::Read;
use std::net::TcpListener;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use super::{Expected, Fault, INTERVAL, Outcome};
use crate::Bins;
use crate::disk::{Backing, LoopDevice};
use crate::net::{Background, NetPair, Side, spawn_with};
use crate::sql::{Cgroup, Mounted, SlowDisk};
use crate::tracer::Tracer;
use crate::util::sh;

pub const ABOUT: &str = "a backup stream (file -> TCP); fault: one limited by a 20 Mbit/s tbf, one by a slow disk, side by side";

const SECS: u32 = 8;
const FILE_MIB: u32 = 48;
/// The shaper's rate. Not 40 Mbit/s (throttle.rs, with two flows, is): one
/// cubic flow behind a tbf on its own host queues there only what TCP small
/// queues and its window let it, and the window it settles at after slow
/// start varies from run to run. At 40 Mbit/s, one run in four or five
/// settled at 51 segments, sent as ~35 KB TSO packets, ~70 KB queued: every
/// packet waited ~14 ms, under `--stall-qdisc-ms` (20), and stalltrace rightly
/// saw no 20 ms queue; the others at 120-200 segments, 64 KB TSO packets
/// (which the tbf splits), ~100-150 KB queued, waits of 24-31 ms. Half the rate
/// doubles the wait for the same bytes (~29 ms for the ~70 KB; 50-62 ms
/// measured for the rest), so the scenario does not depend on where slow
/// start stopped.
const RATE: &str = "20mbit";
/// The sender's read size, and the reads per second the slow disk serves it:
/// ~4 MB/s (above `--bulk-mbps`), each read waiting ~30 ms for its turn, and
/// 15 per 500 ms interval (the storage rules need 10 requests in an interval).
const READ_SIZE: &str = "128k";
const SLOW_READ_IOPS: u32 = 30;

/// One stream and its pair of namespaces (A sends, B receives).
struct Stream {
    label: &'static str,
    pair: NetPair,
}

/// What the receiver counted.
struct Received {
    bytes: u64,
    secs: f64,
}

pub fn run(bins: &Bins, fault: Fault) -> Outcome {
    crate::require_root();
    bins.check();
    // Declared before what runs in it: dropped after the sender is gone.
    let cgroup = Cgroup::new();
    let fast = Mounted::new(LoopDevice::new(Backing::Tmpfs, FILE_MIB + 16, false));
    let fast_file = fast.path("sales.bak.src.mdf");
    fill(&fast_file);
    let slow = (fault == Fault::Injected).then(|| {
        let d = SlowDisk::new(FILE_MIB + 16);
        fill(&d.upper.path("sales.mdf"));
        d
    });

    let net = Stream {
        label: if fault == Fault::Injected {
            "network-limited"
        } else {
            "clean"
        },
        pair: NetPair::new(),
    };
    let disk = slow.as_ref().map(|_| Stream {
        label: "disk-limited",
        pair: NetPair::new(),
    });
    if fault == Fault::Injected {
        net.pair.limit_rate(Side::A, RATE, "64kb", "200ms");
    }
    // cubic, as on a typical SQL Server host (see throttle.rs).
    for s in std::iter::once(&net).chain(disk.as_ref()) {
        s.pair
            .congestion_control_to_peer(Side::A, super::throttle::CC);
    }
    let mut args: Vec<String> = ["--interval", INTERVAL, "--slow-io-ms", "0"]
        .map(String::from)
        .to_vec();
    for s in std::iter::once(&net).chain(disk.as_ref()) {
        for side in [Side::A, Side::B] {
            args.push("--netns".into());
            args.push(s.pair.netns(side).into());
        }
    }
    let arg_refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let tracer = Tracer::start(&bins.stalltrace, &arg_refs);
    if let Some(d) = &slow {
        d.slow_down_reads(&cgroup, SLOW_READ_IOPS);
    }

    // Receivers first, then the senders; all within one scope.
    let (net_rx, disk_rx) = std::thread::scope(|s| {
        let (net_listener, net_port) = listen(&net.pair);
        let net_rx = s.spawn(move || receive(net_listener));
        let net_tx = sender(&net.pair, net_port, &fast_file, None);
        let disk_side = disk.as_ref().zip(slow.as_ref()).map(|(st, d)| {
            let (l, port) = listen(&st.pair);
            let rx = s.spawn(move || receive(l));
            let tx = sender(&st.pair, port, &d.upper.path("sales.mdf"), Some(&cgroup));
            (rx, tx, port)
        });
        let net_rx = (net_rx.join().unwrap(), net_port);
        drop(net_tx);
        let disk_rx = disk_side.map(|(rx, tx, port)| {
            let r = rx.join().unwrap();
            drop(tx);
            (r, port)
        });
        (net_rx, disk_rx)
    });
    std::thread::sleep(Duration::from_millis(1200));
    let stream = tracer.stop_text();

    let mut o = Outcome::new("backup", fault, stream);
    o.args = args;
    o.devs.push(fast.disk.name.clone());
    if let Some(d) = &slow {
        o.devs.push(d.upper.disk.name.clone());
        o.devs.push(d.lower.disk.name.clone());
    }
    let streams: Vec<(&Stream, &(Received, u16))> = std::iter::once((&net, &net_rx))
        .chain(disk.as_ref().zip(disk_rx.as_ref()))
        .collect();
    for (st, (rx, port)) in &streams {
        let p = &st.pair;
        o.peers
            .extend([p.v4(Side::A).to_string(), p.v4(Side::B).to_string()]);
        o.ifaces
            .extend([p.veth(Side::A).to_string(), p.veth(Side::B).to_string()]);
        o.netns
            .extend([p.netns_inode(Side::A), p.netns_inode(Side::B)]);
        let mbps = rx.bytes as f64 * 8.0 / 1e6 / rx.secs.max(0.001);
        o.figures.push(format!(
            "{} stream {} -> {}:{port}: the receiver got {:.1} MB in {:.1} s, {mbps:.1} Mbit/s",
            st.label,
            p.v4(Side::A),
            p.v4(Side::B),
            rx.bytes as f64 / 1e6,
            rx.secs
        ));
        o.values.insert(
            if st.label == "disk-limited" {
                "disk_limited_mbps"
            } else {
                "network_mbps"
            },
            mbps,
        );
    }
    o.figures.push(format!(
        "disks: {} holds the fast file{}",
        fast.disk.name,
        slow.as_ref()
            .map(|d| format!(
                "; {} the slow one (a loop device over {}, whose reads the sender's cgroup may do {SLOW_READ_IOPS}/s)",
                d.upper.disk.name, d.lower.disk.name
            ))
            .unwrap_or_default()
    ));
    if fault == Fault::Injected {
        let (p, port) = (&net.pair, net_rx.1);
        o.expected.push(Expected {
            kind: "bulk_flow",
            cause: "network_limited",
            field: "flow",
            value: format!("-> {}:{port}", p.v4(Side::B)),
            netns: Some(p.netns_inode(Side::A)),
            sessions: Vec::new(),
        });
        o.expected.push(Expected {
            kind: "network",
            cause: "tx_throttled",
            field: "iface",
            value: p.veth(Side::A).into(),
            netns: Some(p.netns_inode(Side::A)),
            sessions: Vec::new(),
        });
        if let (Some(st), Some((_, port)), Some(d)) = (&disk, &disk_rx, &slow) {
            o.expected.push(Expected {
                kind: "bulk_flow",
                cause: "application_limited",
                field: "flow",
                value: format!("-> {}:{port}", st.pair.v4(Side::B)),
                netns: Some(st.pair.netns_inode(Side::A)),
                sessions: Vec::new(),
            });
            o.expected.push(Expected {
                kind: "storage",
                cause: "slow_device",
                field: "dev",
                value: d.upper.disk.name.clone(),
                netns: None,
                sessions: Vec::new(),
            });
        }
    }
    o
}

/// A file of random data, written with O_DIRECT (nothing of it left to write back).
fn fill(path: &Path) {
    sh(
        "dd",
        &[
            "if=/dev/urandom",
            &format!("of={}", path.display()),
            "bs=1M",
            &format!("count={FILE_MIB}"),
            "oflag=direct",
            "status=none",
        ],
    );
}

/// A listener on B's address (made inside B, so it stays there).
fn listen(pair: &NetPair) -> (TcpListener, u16) {
    let addr = pair.v4(Side::B);
    let l = pair.in_netns(Side::B, || TcpListener::bind((addr, 0)).expect("bind"));
    let port = l.local_addr().unwrap().port();
    (l, port)
}

/// Accept one connection and read it to the end (at most SECS + 20 s).
fn receive(l: TcpListener) -> Received {
    let (mut conn, _) = l.accept().expect("accept");
    conn.set_read_timeout(Some(Duration::from_secs(SECS as u64 + 20)))
        .unwrap();
    let mut buf = vec![0u8; 1 << 20];
    let mut bytes = 0u64;
    let mut first = None;
    loop {
        match conn.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                first.get_or_insert_with(Instant::now);
                bytes += n as u64;
            }
            Err(e) => panic!("backup receiver: {e}"),
        }
    }
    Received {
        bytes,
        secs: first.map_or(0.0, |t| t.elapsed().as_secs_f64()),
    }
}

/// The backup: in A, read `file` with O_DIRECT, READ_SIZE at a time, over and over
/// for SECS seconds, into a TCP connection to B:`port` (bash's /dev/tcp). In
/// `cgroup` when given (where the slow disk is slow).
fn sender<'a>(
    pair: &'a NetPair,
    port: u16,
    file: &Path,
    cgroup: Option<&Cgroup>,
) -> Background<'a> {
    let script = format!(
        "exec >/dev/tcp/{addr}/{port} || exit 1; end=$((SECONDS + {SECS})); \
         while [ $SECONDS -lt $end ]; do \
         timeout $((end - SECONDS + 1)) dd if={file} iflag=direct bs={READ_SIZE} status=none || exit 0; done",
        addr = pair.v4(Side::B),
        file = file.display(),
    );
    let args = ["bash", "-c", script.as_str()];
    match cgroup {
        None => pair.spawn(Side::A, &args),
        Some(cg) => spawn_with(pair, pair.netns(Side::A), &args, |cmd: &mut Command| {
            cg.enter_on_exec(cmd)
        }),
    }
}
