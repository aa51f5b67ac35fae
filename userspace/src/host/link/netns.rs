//! Reading the links of another network namespace, from a thread of its own.

use std::fs::File;
use std::io;
use std::path::Path;

use super::model::LinkHealth;
use super::{LinkError, read_all};
use crate::host::{caps, netns};

/// [`read_all`] for another network namespace, given its file
/// (`/run/netns/NAME`, `/proc/PID/ns/net`). A netlink socket answers for the
/// namespace it was created in, so a short-lived thread enters the namespace
/// (setns only moves the calling thread) and opens its sockets there; they
/// are closed before it returns, so no namespace is kept alive by stalltrace.
pub fn read_all_in_netns(path: &Path) -> Result<Vec<LinkHealth>, LinkError> {
    use std::os::fd::AsRawFd;
    let ns = File::open(path).map_err(|source| LinkError::OpenNetns {
        path: path.to_path_buf(),
        source,
    })?;
    // This thread's own namespace is read here: setns, even into the
    // namespace one is in, needs CAP_SYS_ADMIN.
    if ns.metadata().is_ok_and(|m| netns::is_own(&m)) {
        return read_all();
    }
    let owned = path.to_path_buf();
    let reader = std::thread::Builder::new()
        .name("stalltrace-netns".into())
        .spawn(move || {
            // SAFETY: setns on a valid fd we own; it changes only this thread.
            if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                let source = io::Error::last_os_error();
                return Err(LinkError::EnterNetns {
                    path: owned,
                    source,
                });
            }
            drop(ns);
            read_all()
        })
        .map_err(|source| LinkError::Thread {
            path: path.to_path_buf(),
            source,
        })?;
    // A panic in the reader is a bug in this module: let it propagate.
    let read = reader
        .join()
        .unwrap_or_else(|p| std::panic::resume_unwind(p));
    if let Err(LinkError::EnterNetns { source, .. }) = &read
        && source.kind() == io::ErrorKind::PermissionDenied
    {
        caps::degraded(
            "netdev",
            &format!(
                "reading link health in network namespace {} (setns)",
                path.display()
            ),
            &[caps::CAP_SYS_ADMIN],
            "netdev records of the interfaces in other network namespaces have no `link` and are named ifN",
        );
    }
    read
}

/// Root only (namespaces), so end-to-end: the `e2e` feature (userspace/Cargo.toml).
#[cfg(all(test, feature = "e2e"))]
mod tests {
    use super::*;
    use crate::host::link::Exposed;
    use crate::host::link::delta;
    use crate::host::link::tests::by_name;

    #[test]
    fn netns_errors_name_the_namespace() {
        let e = read_all_in_netns(Path::new("/run/netns/stalltrace-no-such-ns")).unwrap_err();
        assert!(matches!(e, LinkError::OpenNetns { .. }), "{e:?}");
        assert!(
            e.to_string().contains("/run/netns/stalltrace-no-such-ns"),
            "{e}"
        );
        // A namespace file of another type: setns(CLONE_NEWNET) refuses it
        // before any privilege check.
        let e = read_all_in_netns(Path::new("/proc/self/ns/uts")).unwrap_err();
        assert!(matches!(e, LinkError::EnterNetns { .. }), "{e:?}");
    }

    /// Two scratch namespaces joined by a veth pair; deleting a namespace
    /// deletes its end of the pair, so dropping this cleans up everything,
    /// also when the test panics.
    struct ScratchNetns(Vec<String>);

    impl ScratchNetns {
        fn ip(args: &[&str]) {
            let out = std::process::Command::new("ip")
                .args(args)
                .output()
                .expect("run ip (iproute2)");
            assert!(
                out.status.success(),
                "ip {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }

    impl Drop for ScratchNetns {
        fn drop(&mut self) {
            for ns in &self.0 {
                let _ = std::process::Command::new("ip")
                    .args(["netns", "del", ns])
                    .output();
            }
        }
    }

    /// Sends `n` UDP datagrams from inside the namespace at `ns` (there is no
    /// ping on these machines; any traffic moves the counters the same way).
    fn send_udp_in(ns: &Path, from: &str, to: &str, n: usize) {
        use std::os::fd::AsRawFd;
        let ns = File::open(ns).unwrap();
        let (from, to) = (from.to_string(), to.to_string());
        std::thread::spawn(move || {
            assert_eq!(
                unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) },
                0,
                "setns"
            );
            let sock = std::net::UdpSocket::bind(from).unwrap();
            for _ in 0..n {
                sock.send_to(&[0u8; 100], &to).unwrap();
            }
        })
        .join()
        .unwrap();
    }

    /// Privileged: must run as root (creates namespaces); fails otherwise.
    #[test]
    fn privileged_veth_pair_in_scratch_netns() {
        assert_eq!(
            unsafe { libc::geteuid() },
            0,
            "this test creates network namespaces: run it as root (e.g. `cargo test -p stalltrace --features e2e --lib host::link`)"
        );
        let tag = format!("stl{}{}", std::process::id() % 100_000, rand_suffix());
        let (ns_a, ns_b) = (format!("{tag}a"), format!("{tag}b"));
        let _cleanup = ScratchNetns(vec![ns_a.clone(), ns_b.clone()]);
        ScratchNetns::ip(&["netns", "add", &ns_a]);
        ScratchNetns::ip(&["netns", "add", &ns_b]);
        let (va, vb) = (format!("{tag}va"), format!("{tag}vb"));
        ScratchNetns::ip(&[
            "link", "add", &va, "netns", &ns_a, "type", "veth", "peer", "name", &vb, "netns", &ns_b,
        ]);
        for (ns, dev, addr) in [(&ns_a, &va, "192.0.2.1/24"), (&ns_b, &vb, "192.0.2.2/24")] {
            ScratchNetns::ip(&["-n", ns, "addr", "add", addr, "dev", dev]);
            ScratchNetns::ip(&["-n", ns, "link", "set", dev, "up"]);
        }
        let path_a = Path::new("/run/netns").join(&ns_a);

        // A freshly created veth may report carrier a moment after `up`.
        let mut before = None;
        for _ in 0..200 {
            let links = read_all_in_netns(&path_a).unwrap();
            let v = by_name(&links, &va).clone();
            if v.oper_state == "up" {
                before = Some(v);
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let before = before.expect("veth never came up");
        assert_eq!(before.carrier, Some(true));
        assert_eq!(before.speed_mbps, Exposed::Value(10_000));
        assert_eq!(before.duplex, Exposed::Value("full".into()));
        assert_eq!(before.autoneg, Exposed::Value(false));
        assert_eq!(before.pause, Exposed::NotExposed);
        assert_eq!(
            before.qdisc.as_ref().map(|q| q.kind.as_str()),
            Some("noqueue")
        );
        // Only this namespace's interfaces: lo and our veth.
        let links = read_all_in_netns(&path_a).unwrap();
        let mut names: Vec<_> = links.iter().map(|l| l.name.as_str()).collect();
        names.sort();
        assert_eq!(names, ["lo", va.as_str()]);

        send_udp_in(&path_a, "192.0.2.1:0", "192.0.2.2:9", 20);
        let mut moved = None;
        for _ in 0..200 {
            let after = read_all_in_netns(&path_a).unwrap();
            let d = delta(&before, by_name(&after, &va));
            if d.counters.unwrap().tx_packets >= 20 {
                moved = Some(d);
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let d = moved.expect("20 datagrams sent, veth tx_packets did not move by 20");
        let c = d.counters.unwrap();
        assert!(c.tx_bytes >= 20 * 100, "{c:?}");
        assert_eq!((c.tx_errors, c.tx_dropped), (0, 0));
        // The peer's end saw them arrive.
        let b = read_all_in_netns(&Path::new("/run/netns").join(&ns_b)).unwrap();
        assert!(by_name(&b, &vb).counters.unwrap().rx_packets >= 20);
    }

    /// Names under /run/netns are shared by the whole host, and a pid alone
    /// can repeat across PID namespaces (containers) on the same kernel.
    fn rand_suffix() -> u32 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos()
            % 1000
    }
}
