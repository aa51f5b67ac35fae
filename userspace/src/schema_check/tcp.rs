//! The tcp family's records: `tcp_retransmit`, `tcp_rtt` and `tcp_flow`.

use super::latency_us;
use crate::abi;
use crate::host::container::{self, Container};
use crate::records::Examples;
use crate::records::sql::{SessionKind, SpidSource, SqlTag};
use crate::records::tcp::{Connection, Limiter, TcpFlowRecord, TcpRetransmitRecord, TcpRttRecord};

/// A connection in the host's namespace, from its local and remote ends.
fn connection(local: &str, remote: &str) -> Connection {
    Connection::new(4026531840, local.parse().unwrap(), remote.parse().unwrap())
}

/// The SQL Server session tag the tagged tcp records carry.
fn session_tag() -> SqlTag {
    SqlTag {
        pid: 4242,
        kind: Some(SessionKind::Client),
        spid: Some(57),
        spid_source: Some(SpidSource::TlsPlaintext),
        client: Some("10.1.2.4:50123".into()),
        encrypted: true,
        login: Some("app_user".into()),
        program: Some("OrderService".into()),
        database: Some("sales".into()),
        wait_type: Some("ASYNC_NETWORK_IO".into()),
        mars_spids: vec![61],
        container: Some(in_a_pod().id),
    }
}

/// An owned RTO timer retransmit in an episode, a late tail-loss probe, and a
/// bare v6 fast one.
impl Examples for TcpRetransmitRecord {
    fn examples() -> Vec<Self> {
        let mut all = Vec::new();
        let mut rto = abi::tcp_retransmit_event {
            kind: abi::EVENT_TCP_RETRANSMIT,
            flags: abi::TCP_RETX_F_TIMER
                | abi::TCP_RETX_F_COUNTED
                | abi::TCP_RETX_F_OWNER
                | abi::TCP_RETX_F_EPISODE,
            sock_ino: 912_345,
            netns: 4026531840,
            family: 2,
            sport: 1433,
            dport: 50_123,
            state: 1,
            ca_state: 4,
            retx_kind: abi::TCP_RETX_RTO as u8,
            backoff: 1,
            retransmits: 2,
            segs: 1,
            bytes: 1448,
            rto_jiffies: 100,
            srtt_us: 350,
            stalled_ms: 612,
            tgid: 4242,
            pid: 4250,
            ..Default::default()
        };
        rto.saddr[..4].copy_from_slice(&[10, 1, 2, 3]);
        rto.daddr[..4].copy_from_slice(&[10, 1, 2, 4]);
        for (i, b) in b"sqlservr".iter().enumerate() {
            rto.comm[i] = *b as _;
        }
        all.push(TcpRetransmitRecord {
            sql: Some(session_tag()),
            held_up_response: Some(true),
            request_waited_ms: Some(204.5),
            ..TcpRetransmitRecord::from_event(&rto, 250)
        });
        let probe = abi::tcp_retransmit_event {
            flags: abi::TCP_RETX_F_COUNTED | abi::TCP_RETX_F_PROBE,
            retx_kind: abi::TCP_RETX_TLP as u8,
            probe_after_us: 204_312,
            ..rto
        };
        all.push(TcpRetransmitRecord::from_event(&probe, 250));
        let mut fast = abi::tcp_retransmit_event {
            family: 10,
            retx_kind: abi::TCP_RETX_FAST as u8,
            ca_state: 3,
            state: 1,
            err: -16,
            segs: 12,
            ..Default::default()
        };
        fast.daddr = [0xfd, 0, 0x57, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2];
        all.push(TcpRetransmitRecord::from_event(&fast, 1000));
        all
    }
}

/// One connection with samples and retransmits, and a v6 one.
impl Examples for TcpRttRecord {
    fn examples() -> Vec<Self> {
        let mut all = Vec::new();
        let rtt = TcpRttRecord {
            connection: connection("10.1.2.3:1433", "10.1.2.4:50123"),
            interval_ms: 1000,
            srtt_us: latency_us(&[(120_000, 300), (900_000, 2)]),
            retransmits: 4,
            retrans_segs: 9,
            rtos: 1,
            fast_retransmits: 2,
            tail_loss_probes: 1,
            syn_retransmits: 0,
            peer_table_full: false,
            sql: None,
        };
        all.push(rtt.clone());
        all.push(TcpRttRecord {
            sql: Some(session_tag()),
            ..rtt.clone()
        });
        all.push(TcpRttRecord {
            connection: connection("[fd00:5700::1]:1433", "[fd00:5700::2]:50123"),
            ..rtt
        });
        all
    }
}

/// A receiver-limited replica stream, tagged; and an untagged flow not
/// accepted yet (no inode).
impl Examples for TcpFlowRecord {
    fn examples() -> Vec<Self> {
        let mut all = Vec::new();
        let flow = TcpFlowRecord {
            connection: connection("10.1.2.3:5022", "10.1.2.4:50200"),
            sock_ino: Some(88_123),
            interval_ms: 1001,
            bytes_acked: 31_250_000,
            bytes_received: 41_000,
            send_mbps: 249.75,
            delivery_mbps: 251.2,
            busy_ms: 1000.0,
            rwnd_limited_ms: 812.0,
            sndbuf_limited_ms: 0.0,
            retrans_segs: 0,
            data_segs_out: Some(21_600),
            srtt_us: 410.0,
            cwnd: 64,
            limiter: Limiter::Receiver,
            pids: Vec::new(),
            container: None,
            sql: Some(session_tag()),
        };
        all.push(flow.clone());
        all.push(TcpFlowRecord {
            sock_ino: None,
            limiter: Limiter::Application,
            busy_ms: 120.0,
            rwnd_limited_ms: 0.0,
            pids: vec![3131, 3132],
            container: Some(in_a_pod()),
            sql: None,
            // as a stream written before the field was
            data_segs_out: None,
            ..flow
        });
        all
    }
}

/// A CRI-O container of a Kubernetes pod, as its cgroup names it.
pub(super) fn in_a_pod() -> Container {
    let path = "/kubepods.slice/kubepods-pod0f1e2d3c_4b5a_6978_8a9b_0c1d2e3f4a5b.slice/\
                crio-2e2222c3a81289eb9bef02d9d669e8d0e12c6b9fa0470ae84110ead8628cfd5d.scope";
    container::of_cgroup(path).expect("a container")
}
