//! Link health of network interfaces, read through netlink (never by running
//! `ip` or `ethtool`): operational state and carrier, speed/duplex/autoneg,
//! the kernel's interface error counters, Ethernet PAUSE statistics and the
//! root qdisc's queue. This is the `link` part of `netdev` records.
//!
//! One reading costs a fixed number of round trips whatever the number of
//! interfaces: an RTM_GETLINK dump, an RTM_GETQDISC dump, the ethtool family
//! lookup and two ethtool dumps (LINKMODES_GET, PAUSE_GET). Only when an
//! ethtool dump fails as a whole (one driver returning an unexpected error
//! ends the dump for every interface) does it ask each interface in turn.
//!
//! Values a driver does not expose are [`Exposed::NotExposed`], serialized as
//! `"not exposed"`: a zero would claim "no errors" where nothing was measured.
//!
//! - `model`: what a reading holds ([`LinkHealth`] and its parts);
//! - `rtnetlink`: links and their counters, root qdiscs;
//! - `ethtool`: speed, duplex, autoneg and PAUSE over generic netlink;
//! - `netns`: reading another network namespace from a thread of its own;
//! - `delta`: the change between two readings.

use std::io;
use std::path::PathBuf;

use netlink_packet_core::{NLA_HEADER_SIZE, NlasIterator};

use super::netlink::{self, NETLINK_GENERIC, NETLINK_ROUTE, Socket, Transport};

mod delta;
mod ethtool;
mod model;
mod netns;
mod rtnetlink;
#[cfg(test)]
mod tests;

pub use delta::delta;
pub use model::{Exposed, LinkCounters, LinkHealth, NOT_EXPOSED, PauseCounters, QdiscStats};
pub use netns::read_all_in_netns;

/// Why a reading failed as a whole. A single interface whose driver does not
/// answer an ethtool query is not an error: its fields are "not exposed".
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    #[error("cannot open network namespace {}: {source}", path.display())]
    OpenNetns { path: PathBuf, source: io::Error },
    #[error("cannot enter network namespace {} (setns needs CAP_SYS_ADMIN and a netns file such as /run/netns/NAME or /proc/PID/ns/net): {source}", path.display())]
    EnterNetns { path: PathBuf, source: io::Error },
    #[error("cannot start a thread to read network namespace {}: {source}", path.display())]
    Thread { path: PathBuf, source: io::Error },
    #[error("cannot open a {protocol} netlink socket: {source}")]
    Socket {
        protocol: &'static str,
        source: io::Error,
    },
    #[error("netlink {request} failed: {source}")]
    Request {
        request: &'static str,
        source: netlink::Error,
    },
}

/// Reads the link health of every interface in this thread's network namespace.
pub fn read_all() -> Result<Vec<LinkHealth>, LinkError> {
    let open = |protocol, name| {
        Socket::open(protocol).map_err(|source| LinkError::Socket {
            protocol: name,
            source,
        })
    };
    let mut route = open(NETLINK_ROUTE, "NETLINK_ROUTE")?;
    let mut generic = open(NETLINK_GENERIC, "NETLINK_GENERIC")?;
    read_with(&mut route, &mut generic)
}

/// [`read_all`] over any transport: `route` answers rtnetlink requests,
/// `generic` generic netlink ones.
fn read_with(
    route: &mut impl Transport,
    generic: &mut impl Transport,
) -> Result<Vec<LinkHealth>, LinkError> {
    let mut links = rtnetlink::read(route)?;
    ethtool::fill(generic, &mut links)?;
    Ok(links)
}

/// The attributes of `body` as (type, value), stopping at a malformed one.
/// Unknown types are skipped by the callers, so new kernel attributes never
/// break a reading.
fn attrs(body: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    NlasIterator::new(body).map_while(Result::ok).map(|nla| {
        let (kind, len) = (nla.kind(), nla.length() as usize);
        (kind, &nla.into_inner()[NLA_HEADER_SIZE..len])
    })
}
