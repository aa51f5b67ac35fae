//! Bulk-flow rules: a backup or replica stream is held back by the receiver,
//! by the network (with loss or queueing to show for it), or by the sending
//! application while the storage it reads is slow. A bulk flow limited by
//! nothing wrong (a clean network at full speed) is no stall.

use super::Thresholds;
use super::interval::{Finding, Interval, SqlState};
use super::network::round1;
use super::storage;
use crate::records::stall::{Cause, Evidence, Kind, Subject};
use crate::records::tcp::{Limiter, TcpFlowRecord};

/// The share of a flow's data segments retransmitted above which the loss
/// is what holds a cwnd-limited flow back: 1 in 1000 is where TCP's
/// throughput visibly falls (Mathis et al.: rate ~ MSS / (RTT * sqrt(p))).
/// A segment or two lost at full speed (a veth backlog overflowing on a busy
/// host) is congestion control doing its work, not a cause.
const LOSS_SHARE: f64 = 0.001;

/// Whether `f` lost enough to limit it. Records without `data_segs_out`
/// (written before it was) count any retransmission.
fn lossy(f: &TcpFlowRecord) -> bool {
    match f.data_segs_out {
        Some(sent) if sent > 0 => f.retrans_segs as f64 >= LOSS_SHARE * sent as f64,
        _ => f.retrans_segs > 0,
    }
}

/// `others`: this interval's network and storage findings, which turn a
/// limiter into a cause; `sql`: which disks each SQL Server instance keeps
/// files on, which ties a sender to the disks it reads.
pub fn bulk(iv: &Interval, sql: &SqlState, others: &[Finding], th: &Thresholds) -> Vec<Finding> {
    let mut out = Vec::new();
    for f in &iv.flows {
        let c = &f.connection;
        let name = format!("{}:{} -> {}:{}", c.saddr, c.sport, c.daddr, c.dport);
        let busy = f.busy_ms.max(0.0);
        let fraction = |part: f64| if busy > 0.0 { part / busy } else { 0.0 };
        let rate = Evidence::new(
            "send_mbps",
            round1(f.send_mbps),
            format!("the flow sent {:.1} Mbit/s", f.send_mbps),
        )
        .unit("Mbit/s");
        let (cause, mut evidence, next_step, impact_ms) = match f.limiter {
            Limiter::Receiver => (
                Cause::ReceiverLimited,
                vec![
                    Evidence::new(
                        "rwnd_limited_fraction",
                        round1(fraction(f.rwnd_limited_ms) * 100.0) / 100.0,
                        format!(
                            "the receiver's window was full {:.0}% of the time data was in flight",
                            fraction(f.rwnd_limited_ms) * 100.0
                        ),
                    )
                    .unit("fraction"),
                ],
                format!(
                    "{} does not read as fast as this host sends: check the receiving side (its \
                     disk, CPU, socket receive buffer)",
                    c.daddr
                ),
                f.rwnd_limited_ms,
            ),
            Limiter::Network => {
                let path = others
                    .iter()
                    .find(|o| o.kind == Kind::Network && o.subject.netns == Some(c.netns.into()));
                if !lossy(f) && path.is_none() {
                    continue; // the network at full speed: nothing wrong
                }
                let mut ev = vec![Evidence::new(
                    "retrans_segs",
                    f.retrans_segs,
                    format!(
                        "the congestion window limited it while {} segments were retransmitted{}",
                        f.retrans_segs,
                        match f.data_segs_out {
                            Some(sent) if sent > 0 => format!(
                                " ({:.2}% of {sent} sent)",
                                f.retrans_segs as f64 * 100.0 / sent as f64
                            ),
                            _ => String::new(),
                        }
                    ),
                )
                .unit("count")];
                if let Some(p) = path {
                    ev.push(Evidence::new(
                        "network_episode",
                        p.cause.name(),
                        format!("on the same path: {}", p.headline()),
                    ));
                }
                (
                    Cause::NetworkLimited,
                    ev,
                    "the network path limits the stream: see the network episode for the path \
                     (loss, a shaper, PAUSE frames) and fix that first"
                        .to_string(),
                    busy,
                )
            }
            Limiter::Application => {
                // A disk the sender reads explains its idling: one that keeps files
                // of the SQL Server instance the flow belongs to, or one a process
                // holding the socket did slow I/O on. A flow of an instance is tied
                // to its disks only. For a flow of no known instance whose reads
                // were not seen (throttled or stacked I/O is submitted by kernel
                // workers), a disk on the host whose reads were slow is the
                // only lead: named as such, not as proven. A disk slow only to
                // write (a build writing back on a busy host) is none: a sender
                // starved of CPU idles too, and blaming that disk would state a
                // false cause. Of several, the one that held back the most work
                // (a busy host has brief slow moments elsewhere).
                let tied = |o: &&Finding| {
                    o.kind == Kind::Storage
                        && o.subject
                            .dev
                            .as_deref()
                            .is_some_and(|dev| feeds(iv, sql, f, dev))
                };
                let storage = |o: &&Finding| {
                    o.kind == Kind::Storage
                        && o.subject
                            .dev
                            .as_deref()
                            .is_some_and(|dev| storage::reads_slow(iv, dev, th))
                };
                let most = |a: &&Finding, b: &&Finding| a.impact_ms.total_cmp(&b.impact_ms);
                let (disk, proven) = match others.iter().filter(tied).max_by(most) {
                    Some(d) => (d, true),
                    None if f.sql.is_none() => match others.iter().filter(storage).max_by(most) {
                        Some(d) => (d, false),
                        None => continue,
                    },
                    None => continue,
                };
                let dev = disk.subject.dev.clone().unwrap_or_default();
                let link = if proven {
                    format!("meanwhile {dev}, which the sender reads, was slow")
                } else {
                    format!(
                        "meanwhile {dev} was slow (not shown to be the disk the sender reads: \
                         no slow I/O of a process holding the socket was seen)"
                    )
                };
                (
                    Cause::ApplicationLimited,
                    vec![
                        Evidence::new(
                            "busy_fraction",
                            round1(busy / f.interval_ms.max(1) as f64 * 100.0) / 100.0,
                            format!(
                                "the sender had data in flight only {:.0}% of the interval: it \
                                 had nothing to send",
                                busy / f.interval_ms.max(1) as f64 * 100.0
                            ),
                        )
                        .unit("fraction"),
                        Evidence::new(
                            "storage_episode",
                            dev.clone(),
                            format!("{link}: {}", disk.headline()),
                        ),
                    ],
                    format!(
                        "the stream waits for the sending application, which waits for {dev}: \
                         the disk, not the network, bounds it (see the storage episode)"
                    ),
                    (f.interval_ms as f64 - busy).max(0.0),
                )
            }
            // No network lies between a loopback flow's ends to blame.
            Limiter::SenderBuffer | Limiter::Host => continue,
        };
        evidence.push(rate);
        let subject = Subject {
            flow: Some(name),
            netns: Some(c.netns.into()),
            ..Default::default()
        };
        out.push(
            Finding::new(
                Kind::BulkFlow,
                subject,
                cause,
                impact_ms,
                evidence,
                next_step,
            )
            .with_sessions(f.sql.iter().cloned().collect()),
        );
    }
    out
}

/// Whether flow `f`'s sender reads disk `dev`: its SQL Server instance keeps
/// files there, or a process holding the socket did slow I/O on it in this
/// interval (`slow_io` records, so only as far as `--slow-io-ms` sends them).
fn feeds(iv: &Interval, sql: &SqlState, f: &TcpFlowRecord, dev: &str) -> bool {
    let instance = f.sql.as_ref().map(|tag| tag.pid);
    let keeps_files = instance
        .zip(iv.disk_key(dev))
        .is_some_and(|(pid, key)| sql.keeps_files_on(pid, &key));
    keeps_files
        || iv
            .slow_ios
            .iter()
            .any(|s| s.dev == dev && f.pids.contains(&s.pid))
}
