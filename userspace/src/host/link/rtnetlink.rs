//! Links and root qdiscs over rtnetlink (<linux/rtnetlink.h>,
//! <linux/if_link.h>, <linux/pkt_sched.h>): one RTM_GETLINK dump and one
//! RTM_GETQDISC dump.

use std::collections::HashMap;

use libc::c_int;
use netlink_packet_core::{parse_u8, parse_u32};

use super::model::{Exposed, LinkCounters, LinkHealth, QdiscStats};
use super::{LinkError, attrs};
use crate::host::netlink::Transport;

// What the libc crate lacks of <linux/rtnetlink.h>, <linux/pkt_sched.h> and
// <linux/gen_stats.h>.
/// `sizeof(struct tcmsg)`.
const TCMSG_LEN: usize = 20;
const TC_H_ROOT: u32 = u32::MAX;
/// In the TCA_STATS2 nest (enum in <linux/gen_stats.h>); not libc's TCA_STATS.
const TCA_STATS_QUEUE: u16 = 3;

/// Every link, each with its root qdisc; the ethtool fields are left "not
/// exposed" for the caller to fill in.
pub(super) fn read(route: &mut impl Transport) -> Result<Vec<LinkHealth>, LinkError> {
    let failed = |request| move |source| LinkError::Request { request, source };
    let mut links = Vec::new();
    // struct ifinfomsg all zero: AF_UNSPEC, no filter, every link.
    route
        .request(
            libc::RTM_GETLINK,
            true,
            &[0; size_of::<libc::ifinfomsg>()],
            &mut |m| {
                if m.kind == libc::RTM_NEWLINK {
                    links.extend(parse_link(m.payload));
                }
                Ok(())
            },
        )
        .map_err(failed("RTM_GETLINK dump"))?;

    let mut qdiscs = HashMap::new();
    route
        .request(libc::RTM_GETQDISC, true, &[0; TCMSG_LEN], &mut |m| {
            if m.kind == libc::RTM_NEWQDISC {
                qdiscs.extend(parse_root_qdisc(m.payload));
            }
            Ok(())
        })
        .map_err(failed("RTM_GETQDISC dump"))?;
    for link in &mut links {
        link.qdisc = qdiscs.remove(&link.ifindex);
    }
    Ok(links)
}

fn ne_u32(b: &[u8], at: usize) -> Option<u32> {
    b.get(at..at + 4)
        .map(|b| u32::from_ne_bytes(b.try_into().unwrap()))
}

/// One RTM_NEWLINK body: `struct ifinfomsg` then attributes. The ethtool and
/// qdisc fields are filled in later.
fn parse_link(body: &[u8]) -> Option<LinkHealth> {
    let ifindex = ne_u32(body, std::mem::offset_of!(libc::ifinfomsg, ifi_index))?;
    let mut link = LinkHealth {
        ifindex,
        name: String::new(),
        oper_state: "unknown".into(),
        carrier: None,
        carrier_changes: None,
        speed_mbps: Exposed::NotExposed,
        duplex: Exposed::NotExposed,
        autoneg: Exposed::NotExposed,
        counters: None,
        pause: Exposed::NotExposed,
        qdisc: None,
    };
    for (kind, v) in attrs(body.get(size_of::<libc::ifinfomsg>()..)?) {
        match kind {
            libc::IFLA_IFNAME => link.name = c_string(v),
            libc::IFLA_OPERSTATE => {
                link.oper_state = parse_u8(v).map_or(link.oper_state, oper_state)
            }
            libc::IFLA_CARRIER => link.carrier = parse_u8(v).ok().map(|c| c != 0),
            libc::IFLA_CARRIER_CHANGES => link.carrier_changes = parse_u32(v).ok().map(u64::from),
            libc::IFLA_STATS64 => link.counters = LinkCounters::parse(v),
            _ => {}
        }
    }
    Some(link)
}

fn c_string(v: &[u8]) -> String {
    let end = v.iter().position(|&b| b == 0).unwrap_or(v.len());
    String::from_utf8_lossy(&v[..end]).into_owned()
}

/// IF_OPER_* (<linux/if.h>), named as `ip link` names them (lower case).
fn oper_state(s: u8) -> String {
    match c_int::from(s) {
        libc::IF_OPER_UNKNOWN => "unknown",
        libc::IF_OPER_NOTPRESENT => "notpresent",
        libc::IF_OPER_DOWN => "down",
        libc::IF_OPER_LOWERLAYERDOWN => "lowerlayerdown",
        libc::IF_OPER_TESTING => "testing",
        libc::IF_OPER_DORMANT => "dormant",
        libc::IF_OPER_UP => "up",
        n => return format!("state{n}"),
    }
    .into()
}

/// One RTM_NEWQDISC body (`struct tcmsg` then attributes), if it is the
/// root qdisc of its interface: (ifindex, stats).
fn parse_root_qdisc(body: &[u8]) -> Option<(u32, QdiscStats)> {
    // struct tcmsg: tcm_ifindex at 4, tcm_parent at 12.
    let (ifindex, parent) = (ne_u32(body, 4)?, ne_u32(body, 12)?);
    if parent != TC_H_ROOT {
        return None; // a child class's qdisc, or ingress/clsact
    }
    let mut kind = None;
    let mut queue = None;
    for (t, v) in attrs(body.get(TCMSG_LEN..)?) {
        match t {
            libc::TCA_KIND => kind = Some(c_string(v)),
            libc::TCA_STATS2 => {
                queue = attrs(v)
                    .find(|(t, _)| *t == TCA_STATS_QUEUE)
                    .map(|(_, q)| q)
            }
            _ => {}
        }
    }
    // struct gnet_stats_queue: qlen, backlog, drops, requeues, overlimits (u32).
    let q = |i: usize| ne_u32(queue?, i * 4).map(u64::from);
    Some((
        ifindex,
        QdiscStats {
            kind: kind?,
            qlen_packets: q(0)?,
            backlog_bytes: q(1)?,
            drops: q(2)?,
            requeues: q(3)?,
            overlimits: q(4)?,
        },
    ))
}
