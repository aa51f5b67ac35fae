//! Speed, duplex, autoneg and Ethernet PAUSE over ethtool's generic netlink
//! family (<linux/genetlink.h>, <linux/ethtool_netlink.h>).

use std::collections::HashMap;

use netlink_packet_core::{parse_u8, parse_u16, parse_u32, parse_u64};

use super::model::{Exposed, LinkHealth, PauseCounters};
use super::{LinkError, attrs};
use crate::host::netlink::{self, Message, Transport, put_attr, put_nested};

/// The generic netlink controller's message type (a c_int in libc).
pub(super) const GENL_ID_CTRL: u16 = libc::GENL_ID_CTRL as u16;
pub(super) const GENL_HDRLEN: usize = size_of::<libc::genlmsghdr>();

// What the libc crate lacks of <linux/ethtool_netlink.h> and <linux/ethtool.h>.
pub(super) const ETHTOOL_GENL_VERSION: u8 = 1;
pub(super) const ETHTOOL_MSG_LINKMODES_GET: u8 = 4;
pub(super) const ETHTOOL_MSG_PAUSE_GET: u8 = 21;
/// Every ethtool message carries its request header as attribute 1.
pub(super) const ETHTOOL_A_HEADER: u16 = 1;
pub(super) const ETHTOOL_A_HEADER_DEV_INDEX: u16 = 1;
pub(super) const ETHTOOL_A_HEADER_FLAGS: u16 = 3;
/// Bit sets (the link mode lists, which are not read here) as bitmaps rather
/// than one named attribute per mode: a fraction of the reply size.
pub(super) const ETHTOOL_FLAG_COMPACT_BITSETS: u32 = 1 << 0;
/// Ask for statistics: without it PAUSE_GET returns only the settings.
pub(super) const ETHTOOL_FLAG_STATS: u32 = 1 << 2;
pub(super) const ETHTOOL_A_LINKMODES_AUTONEG: u16 = 2;
pub(super) const ETHTOOL_A_LINKMODES_SPEED: u16 = 5;
pub(super) const ETHTOOL_A_LINKMODES_DUPLEX: u16 = 6;
pub(super) const ETHTOOL_A_PAUSE_AUTONEG: u16 = 2;
pub(super) const ETHTOOL_A_PAUSE_RX: u16 = 3;
pub(super) const ETHTOOL_A_PAUSE_TX: u16 = 4;
pub(super) const ETHTOOL_A_PAUSE_STATS: u16 = 5;
pub(super) const ETHTOOL_A_PAUSE_STAT_TX_FRAMES: u16 = 2;
pub(super) const ETHTOOL_A_PAUSE_STAT_RX_FRAMES: u16 = 3;
pub(super) const DUPLEX_HALF: u8 = 0;
const DUPLEX_FULL: u8 = 1;

/// Fills in the ethtool fields of `links`. A kernel built without ethtool
/// netlink has no family: nothing exposed.
pub(super) fn fill(
    generic: &mut impl Transport,
    links: &mut [LinkHealth],
) -> Result<(), LinkError> {
    let Some(family) = ethtool_family(generic)? else {
        return Ok(());
    };
    let ifindexes: Vec<u32> = links.iter().map(|l| l.ifindex).collect();
    let mut modes = ethtool_get(
        generic,
        family,
        ETHTOOL_MSG_LINKMODES_GET,
        &ifindexes,
        parse_linkmodes,
    )?;
    let mut pause = ethtool_get(
        generic,
        family,
        ETHTOOL_MSG_PAUSE_GET,
        &ifindexes,
        parse_pause,
    )?;
    for link in links {
        if let Some(m) = modes.remove(&link.ifindex) {
            (link.speed_mbps, link.duplex, link.autoneg) = (m.speed_mbps, m.duplex, m.autoneg);
        }
        link.pause = pause.remove(&link.ifindex).into();
    }
    Ok(())
}

/// The id of the "ethtool" generic netlink family, or None when the kernel
/// has none (built without CONFIG_ETHTOOL_NETLINK).
fn ethtool_family(sock: &mut impl Transport) -> Result<Option<u16>, LinkError> {
    let mut body = vec![libc::CTRL_CMD_GETFAMILY as u8, 1, 0, 0];
    put_attr(&mut body, libc::CTRL_ATTR_FAMILY_NAME as u16, b"ethtool\0");
    let mut id = None;
    let r = sock.request(GENL_ID_CTRL, false, &body, &mut |m| {
        id = attrs(genl_attrs(m)?)
            .find(|(t, _)| *t == libc::CTRL_ATTR_FAMILY_ID as u16)
            .and_then(|(_, v)| parse_u16(v).ok());
        Ok(())
    });
    match r {
        Ok(()) => Ok(id),
        Err(netlink::Error::Kernel(libc::ENOENT)) => Ok(None),
        Err(source) => Err(LinkError::Request {
            request: "generic netlink family lookup",
            source,
        }),
    }
}

fn genl_attrs<'a>(m: Message<'a>) -> Result<&'a [u8], netlink::Error> {
    m.payload
        .get(GENL_HDRLEN..)
        .ok_or_else(|| netlink::Error::Decode("short generic netlink message".into()))
}

/// An ethtool GET request; `ifindex` None asks for a dump of every device.
fn ethtool_request(cmd: u8, ifindex: Option<u32>) -> Vec<u8> {
    let mut header = Vec::new();
    if let Some(i) = ifindex {
        put_attr(&mut header, ETHTOOL_A_HEADER_DEV_INDEX, &i.to_ne_bytes());
    }
    let flags = match cmd {
        ETHTOOL_MSG_PAUSE_GET => ETHTOOL_FLAG_STATS,
        _ => ETHTOOL_FLAG_COMPACT_BITSETS,
    };
    put_attr(&mut header, ETHTOOL_A_HEADER_FLAGS, &flags.to_ne_bytes());
    let mut body = vec![cmd, ETHTOOL_GENL_VERSION, 0, 0];
    put_nested(&mut body, ETHTOOL_A_HEADER, &header);
    body
}

/// The device index in an ethtool reply's header attribute.
pub(super) fn ethtool_ifindex(attrs_: &[u8]) -> Option<u32> {
    let (_, header) = attrs(attrs_).find(|(t, _)| *t == ETHTOOL_A_HEADER)?;
    let (_, v) = attrs(header).find(|(t, _)| *t == ETHTOOL_A_HEADER_DEV_INDEX)?;
    parse_u32(v).ok()
}

/// Runs one ethtool GET for every interface: a dump, or, if the dump fails as
/// a whole, one request per interface. Devices whose driver does not
/// implement the operation are left out (a dump skips them; a single request
/// gets EOPNOTSUPP), as are devices that vanished or failed on their own.
fn ethtool_get<T>(
    sock: &mut impl Transport,
    family: u16,
    cmd: u8,
    ifindexes: &[u32],
    parse: fn(&[u8]) -> T,
) -> Result<HashMap<u32, T>, LinkError> {
    let mut out = HashMap::new();
    let mut collect = |m: Message<'_>| {
        let a = genl_attrs(m)?;
        if let Some(i) = ethtool_ifindex(a) {
            out.insert(i, parse(a));
        }
        Ok(())
    };
    // Timeouts and socket failures are no single driver's doing: give up.
    let fatal = |source| LinkError::Request {
        request: "ethtool query",
        source,
    };
    match sock.request(family, true, &ethtool_request(cmd, None), &mut collect) {
        Ok(()) => return Ok(out),
        Err(e @ netlink::Error::Io(_)) => return Err(fatal(e)),
        Err(_) => {}
    }
    for &i in ifindexes {
        // Kernel errors (EOPNOTSUPP: the driver lacks the operation;
        // ENODEV: the device went away; a driver's own error) leave this
        // device out: not exposed.
        let r = sock.request(family, false, &ethtool_request(cmd, Some(i)), &mut collect);
        if let Err(e @ netlink::Error::Io(_)) = r {
            return Err(fatal(e));
        }
    }
    Ok(out)
}

/// What LINKMODES_GET says about the current link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct LinkModes {
    pub(super) speed_mbps: Exposed<u32>,
    pub(super) duplex: Exposed<String>,
    pub(super) autoneg: Exposed<bool>,
}

pub(super) fn parse_linkmodes(a: &[u8]) -> LinkModes {
    let mut m = LinkModes {
        speed_mbps: Exposed::NotExposed,
        duplex: Exposed::NotExposed,
        autoneg: Exposed::NotExposed,
    };
    for (t, v) in attrs(a) {
        match t {
            // SPEED_UNKNOWN (u32::MAX) when the driver cannot tell (no link,
            // virtio_net without a configured speed); ethtool also treats
            // values above INT_MAX and 0 as unknown.
            ETHTOOL_A_LINKMODES_SPEED => {
                m.speed_mbps = parse_u32(v)
                    .ok()
                    .filter(|&s| s > 0 && s <= i32::MAX as u32)
                    .into()
            }
            // DUPLEX_UNKNOWN is 0xff.
            ETHTOOL_A_LINKMODES_DUPLEX => {
                m.duplex = match parse_u8(v) {
                    Ok(DUPLEX_FULL) => Exposed::Value("full".into()),
                    Ok(DUPLEX_HALF) => Exposed::Value("half".into()),
                    _ => Exposed::NotExposed,
                }
            }
            ETHTOOL_A_LINKMODES_AUTONEG => m.autoneg = parse_u8(v).ok().map(|a| a != 0).into(),
            _ => {}
        }
    }
    m
}

pub(super) fn parse_pause(a: &[u8]) -> PauseCounters {
    let mut p = PauseCounters {
        autoneg: None,
        rx_enabled: None,
        tx_enabled: None,
        tx_pause_frames: Exposed::NotExposed,
        rx_pause_frames: Exposed::NotExposed,
    };
    let flag = |v| parse_u8(v).ok().map(|b| b != 0);
    for (t, v) in attrs(a) {
        match t {
            ETHTOOL_A_PAUSE_AUTONEG => p.autoneg = flag(v),
            ETHTOOL_A_PAUSE_RX => p.rx_enabled = flag(v),
            ETHTOOL_A_PAUSE_TX => p.tx_enabled = flag(v),
            // Present only for drivers with get_pause_stats; each counter
            // only when the driver filled it in.
            ETHTOOL_A_PAUSE_STATS => {
                for (s, v) in attrs(v) {
                    match s {
                        ETHTOOL_A_PAUSE_STAT_TX_FRAMES => {
                            p.tx_pause_frames = parse_u64(v).ok().into()
                        }
                        ETHTOOL_A_PAUSE_STAT_RX_FRAMES => {
                            p.rx_pause_frames = parse_u64(v).ok().into()
                        }
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    p
}
