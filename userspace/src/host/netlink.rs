//! A small synchronous netlink client: one request, its replies, done.
//!
//! The rust-netlink "handle" crates are async (tokio). stalltrace reads a
//! handful of dumps once per interval, so a blocking socket with a receive
//! timeout is simpler and cheaper. Framing and attribute parsing come from
//! `netlink-packet-core`; message bodies are built and read by the callers,
//! which only touch the attributes they need: a full decode of every link
//! attribute costs more, and a decoder that trips on one attribute (as
//! netlink-packet-route has on new kernels) would lose the whole interface.

use std::io;
use std::time::Duration;

use netlink_packet_core::{NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST, NetlinkBuffer};

pub use netlink_sys::protocols::{NETLINK_GENERIC, NETLINK_ROUTE};

/// Netlink message types shared by every protocol (`<linux/netlink.h>`).
const NLMSG_NOOP: u16 = 1;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLMSG_OVERRUN: u16 = 4;
const NLMSG_HDRLEN: usize = 16;

const NLA_F_NESTED: u16 = 1 << 15;
const NLA_HDRLEN: usize = 4;

/// A kernel that does not answer within this long is treated as an error, so
/// a reader called once per interval can never hang the daemon.
const RECV_TIMEOUT: Duration = Duration::from_secs(2);

/// Starting receive buffer. Dump datagrams are at most 32 KiB on current
/// kernels; a larger single message (e.g. a link with many VFs) grows it.
const RECV_BUF: usize = 32 * 1024;

/// Why a request failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The kernel answered with an error (the value is a positive errno).
    #[error("{}", io::Error::from_raw_os_error(*.0))]
    Kernel(i32),
    #[error("{0}")]
    Io(#[from] io::Error),
    #[error("malformed reply: {0}")]
    Decode(String),
}

/// One message of a reply: its type, flags and body (after the netlink header).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Message<'a> {
    pub kind: u16,
    pub flags: u16,
    pub seq: u32,
    pub payload: &'a [u8],
}

/// Splits one received datagram into its messages.
pub fn messages(datagram: &[u8]) -> impl Iterator<Item = Result<Message<'_>, Error>> {
    let mut rest = datagram;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let buf = match NetlinkBuffer::new_checked(rest) {
            Ok(b) => b,
            Err(e) => {
                rest = &[];
                return Some(Err(Error::Decode(e.to_string())));
            }
        };
        let len = buf.length() as usize;
        let msg = Message {
            kind: buf.message_type(),
            flags: buf.flags(),
            seq: buf.sequence_number(),
            payload: &rest[NLMSG_HDRLEN..len],
        };
        rest = &rest[align4(len).min(rest.len())..];
        Some(Ok(msg))
    })
}

/// What a message means for the request it answers.
#[derive(Debug, PartialEq, Eq)]
pub enum Step<'a> {
    /// A reply body for the caller.
    Data(Message<'a>),
    /// The request is complete (end of a dump, or the ACK of a plain request).
    Done,
    /// Nothing for the caller (a no-op message).
    Skip,
}

/// Classifies one reply message: end of the answer, data, or the kernel's error.
pub fn step(msg: Message<'_>) -> Result<Step<'_>, Error> {
    match msg.kind {
        NLMSG_NOOP => Ok(Step::Skip),
        NLMSG_OVERRUN => Err(Error::Decode("netlink overrun: data lost".into())),
        // An ACK is an error message with code 0; both end a plain request.
        NLMSG_ERROR => match read_i32(msg.payload)? {
            0 => Ok(Step::Done),
            code => Err(Error::Kernel(-code)),
        },
        // A dump that failed part way reports the error in its DONE message.
        NLMSG_DONE => match msg.payload.len() {
            0 => Ok(Step::Done),
            _ => match read_i32(msg.payload)? {
                code if code < 0 => Err(Error::Kernel(-code)),
                _ => Ok(Step::Done),
            },
        },
        _ => Ok(Step::Data(msg)),
    }
}

fn read_i32(payload: &[u8]) -> Result<i32, Error> {
    payload
        .get(..4)
        .map(|b| i32::from_ne_bytes(b.try_into().unwrap()))
        .ok_or_else(|| Error::Decode("truncated error message".into()))
}

/// Called with every reply body of a request.
pub type Each<'a> = &'a mut dyn FnMut(Message<'_>) -> Result<(), Error>;

/// Something that answers netlink requests: a [`Socket`], or recorded
/// replies in tests.
pub trait Transport {
    /// Sends one request of type `kind` with `body` and calls `each` for
    /// every reply body until the answer is complete. `dump` asks for every
    /// object (`NLM_F_DUMP`, ended by DONE); otherwise the request is
    /// acknowledged (`NLM_F_ACK`), so an ACK ends it and errors always come
    /// back.
    fn request(&mut self, kind: u16, dump: bool, body: &[u8], each: Each<'_>) -> Result<(), Error>;
}

/// Hands the data messages of one received datagram to `each`; true once
/// the answer is complete. Messages of another sequence number (a late
/// answer to an earlier request that timed out) are skipped when `seq` is
/// given.
pub fn feed(datagram: &[u8], seq: Option<u32>, each: Each<'_>) -> Result<bool, Error> {
    for msg in messages(datagram) {
        let msg = msg?;
        if seq.is_some_and(|s| s != msg.seq) {
            continue;
        }
        match step(msg)? {
            Step::Data(m) => each(m)?,
            Step::Done => return Ok(true),
            Step::Skip => {}
        }
    }
    Ok(false)
}

/// A netlink socket of one protocol, in the network namespace of the thread
/// that opened it.
pub struct Socket {
    sock: netlink_sys::Socket,
    seq: u32,
    buf: Vec<u8>,
}

impl Socket {
    pub fn open(protocol: isize) -> io::Result<Self> {
        let mut sock = netlink_sys::Socket::new(protocol)?;
        sock.bind_auto()?;
        set_recv_timeout(&sock, RECV_TIMEOUT)?;
        Ok(Self {
            sock,
            seq: 0,
            buf: Vec::with_capacity(RECV_BUF),
        })
    }

    /// Sends one request; returns its sequence number.
    fn send(&mut self, kind: u16, dump: bool, body: &[u8]) -> Result<u32, Error> {
        self.seq = self.seq.wrapping_add(1);
        let flags = NLM_F_REQUEST | if dump { NLM_F_DUMP } else { NLM_F_ACK };
        self.sock.send(&frame(kind, flags, self.seq, body), 0)?;
        Ok(self.seq)
    }

    /// Receives one whole datagram into `self.buf`. Its size is peeked first
    /// (MSG_TRUNC reports the full length even into an empty buffer), so a
    /// large one grows the buffer instead of being truncated.
    fn recv_datagram(&mut self) -> Result<(), Error> {
        let mut probe: &mut [u8] = &mut [];
        let size = self
            .sock
            .recv(&mut probe, libc::MSG_PEEK | libc::MSG_TRUNC)
            .map_err(timeout)?;
        self.buf.clear();
        self.buf.reserve(size);
        self.sock.recv(&mut self.buf, 0).map_err(timeout)?;
        Ok(())
    }
}

impl Transport for Socket {
    fn request(&mut self, kind: u16, dump: bool, body: &[u8], each: Each<'_>) -> Result<(), Error> {
        let seq = self.send(kind, dump, body)?;
        loop {
            self.recv_datagram()?;
            if feed(&self.buf, Some(seq), each)? {
                return Ok(());
            }
        }
    }
}

fn timeout(e: io::Error) -> io::Error {
    match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => io::Error::new(
            io::ErrorKind::TimedOut,
            format!(
                "no answer from the kernel within {} s",
                RECV_TIMEOUT.as_secs()
            ),
        ),
        _ => e,
    }
}

fn set_recv_timeout(sock: &netlink_sys::Socket, t: Duration) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let tv = libc::timeval {
        tv_sec: t.as_secs() as libc::time_t,
        tv_usec: t.subsec_micros() as libc::suseconds_t,
    };
    // SAFETY: valid fd owned by `sock`, pointer and length of a live timeval.
    let rc = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&tv as *const libc::timeval).cast(),
            size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// One netlink message: header followed by `body`.
pub fn frame(kind: u16, flags: u16, seq: u32, body: &[u8]) -> Vec<u8> {
    let len = NLMSG_HDRLEN + body.len();
    let mut out = Vec::with_capacity(align4(len));
    out.extend_from_slice(&(len as u32).to_ne_bytes());
    out.extend_from_slice(&kind.to_ne_bytes());
    out.extend_from_slice(&flags.to_ne_bytes());
    out.extend_from_slice(&seq.to_ne_bytes());
    out.extend_from_slice(&0u32.to_ne_bytes()); // port id: the kernel fills it in
    out.extend_from_slice(body);
    out.resize(align4(len), 0);
    out
}

/// Appends one attribute (type, length, value, padding) to `out`.
pub fn put_attr(out: &mut Vec<u8>, kind: u16, value: &[u8]) {
    let len = NLA_HDRLEN + value.len();
    out.extend_from_slice(&(len as u16).to_ne_bytes());
    out.extend_from_slice(&kind.to_ne_bytes());
    out.extend_from_slice(value);
    out.resize(out.len() + align4(len) - len, 0);
}

/// Appends a nested attribute whose value is `inner` (already encoded
/// attributes). The nested flag is set: strict families (ethtool) reject
/// nests without it.
pub fn put_nested(out: &mut Vec<u8>, kind: u16, inner: &[u8]) {
    put_attr(out, kind | NLA_F_NESTED, inner);
}

fn align4(n: usize) -> usize {
    (n + 3) & !3
}

/// Datagrams of a testdata file: hex, one datagram per line, `#` comments
/// (the captured kernel replies the netlink readers' tests replay).
#[cfg(test)]
pub(crate) fn hex_datagrams(text: &str) -> Vec<Vec<u8>> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            (0..l.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&l[i..i + 2], 16).unwrap())
                .collect()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frame_then_split_round_trips() {
        let mut body = Vec::new();
        put_attr(&mut body, 3, b"lo\0");
        let pkt = frame(18, NLM_F_REQUEST, 7, &body);
        assert_eq!(pkt.len(), 16 + 8);
        let all: Vec<_> = messages(&pkt).collect::<Result<_, _>>().unwrap();
        assert_eq!(all.len(), 1);
        assert_eq!((all[0].kind, all[0].seq), (18, 7));
        assert_eq!(all[0].payload, &[7, 0, 3, 0, b'l', b'o', 0, 0]);
    }

    #[test]
    fn error_ack_and_done_end_a_request() {
        let err = frame(NLMSG_ERROR, 0, 1, &(-libc::EOPNOTSUPP).to_ne_bytes());
        let msg = messages(&err).next().unwrap().unwrap();
        assert!(matches!(step(msg), Err(Error::Kernel(95))));

        let ack = frame(NLMSG_ERROR, 0, 1, &0i32.to_ne_bytes());
        assert_eq!(
            step(messages(&ack).next().unwrap().unwrap()).unwrap(),
            Step::Done
        );

        let done = frame(NLMSG_DONE, 2, 1, &0i32.to_ne_bytes());
        assert_eq!(
            step(messages(&done).next().unwrap().unwrap()).unwrap(),
            Step::Done
        );

        let failed_dump = frame(NLMSG_DONE, 2, 1, &(-libc::EIO).to_ne_bytes());
        assert!(matches!(
            step(messages(&failed_dump).next().unwrap().unwrap()),
            Err(Error::Kernel(e)) if e == libc::EIO
        ));
    }

    #[test]
    fn truncated_datagram_is_a_decode_error() {
        let pkt = frame(16, 0, 1, &[0; 16]);
        let mut it = messages(&pkt[..20]);
        assert!(matches!(it.next(), Some(Err(Error::Decode(_)))));
        assert!(it.next().is_none());
    }
}
