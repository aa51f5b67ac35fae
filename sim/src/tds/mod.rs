//! The subset of TDS 7.x and 8.0 (MS-TDS) that a client and `sqlservr` need to
//! log in and run requests:
//!
//! - packet framing (8-byte header: type, status, big-endian length and SPID,
//!   packet id, window), messages split over packets of the negotiated size;
//! - PRELOGIN request and response (VERSION, ENCRYPTION, INSTOPT, THREADID, MARS),
//!   with MS-TDS's encryption table (TLS itself is `crate::tls`);
//! - MARS: TDS inside MS-SMP's session packets (`smp`);
//! - LOGIN7 (fixed part, UCS-2 strings, password obfuscation; no SSPI, no
//!   feature extensions);
//! - SQL batch (type 1) with the ALL_HEADERS transaction descriptor of TDS 7.2+,
//!   RPC requests and transaction manager requests as ODBC drivers send them;
//! - response tokens: LOGINACK, ENVCHANGE (database, language, collation, packet
//!   size), INFO, ERROR, COLMETADATA and ROW for integer columns, DONE;
//!   attention (type 6) is acknowledged with DONE_ATTN.
//!
//! Not implemented: bulk load, federated authentication, session recovery, and
//! any column type but the integers.
//!
//! Integers inside messages are little-endian; the header's length and SPID,
//! and PRELOGIN's option table, are big-endian (network order).

pub mod batch;
pub mod login7;
pub mod prelogin;
pub mod rpc;
pub mod smp;
pub mod sql;
pub mod tm;
pub mod tokens;
pub mod types;

use std::io::{self, Read, Write};

/// Bytes in a packet header.
pub const HEADER_LEN: usize = 8;
/// The packet size both sides use until LOGIN7 negotiates another.
pub const DEFAULT_PACKET_SIZE: usize = 4096;
/// Smallest and largest packet sizes a client may ask for (MS-TDS 2.2.6.4).
pub const MIN_PACKET_SIZE: usize = 512;
pub const MAX_PACKET_SIZE: usize = 32767;
/// A message larger than this is refused: it is a broken or hostile peer, and
/// nothing this simulator exchanges comes near it.
pub const MAX_MESSAGE: usize = 16 << 20;

/// TDS 7.4 (SQL Server 2012 and later), as LOGIN7 and LOGINACK carry it.
pub const TDS_7_4: u32 = 0x7400_0004;
/// TDS 7.2 (SQL Server 2005): from here on SQL batches carry ALL_HEADERS.
pub const TDS_7_2: u32 = 0x7209_0002;

/// Packet types (MS-TDS 2.2.3.1.1).
pub mod packet_type {
    pub const SQL_BATCH: u8 = 0x01;
    pub const RPC: u8 = 0x03;
    pub const TABULAR_RESULT: u8 = 0x04;
    pub const ATTENTION: u8 = 0x06;
    pub const BULK_LOAD: u8 = 0x07;
    pub const TRANSACTION_MANAGER: u8 = 0x0E;
    pub const LOGIN7: u8 = 0x10;
    pub const SSPI: u8 = 0x11;
    pub const PRELOGIN: u8 = 0x12;
}

/// Status bit: last packet of the message.
pub const STATUS_EOM: u8 = 0x01;

/// A packet header (MS-TDS 2.2.3.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub packet_type: u8,
    pub status: u8,
    /// Whole packet, header included.
    pub length: u16,
    /// The server's process id for the session; clients send 0.
    pub spid: u16,
    /// Increments (mod 256) with each packet of a message.
    pub packet_id: u8,
    pub window: u8,
}

impl Header {
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let len = self.length.to_be_bytes();
        let spid = self.spid.to_be_bytes();
        [
            self.packet_type,
            self.status,
            len[0],
            len[1],
            spid[0],
            spid[1],
            self.packet_id,
            self.window,
        ]
    }

    pub fn decode(b: &[u8; HEADER_LEN]) -> io::Result<Header> {
        let h = Header {
            packet_type: b[0],
            status: b[1],
            length: u16::from_be_bytes([b[2], b[3]]),
            spid: u16::from_be_bytes([b[4], b[5]]),
            packet_id: b[6],
            window: b[7],
        };
        if (h.length as usize) < HEADER_LEN {
            return Err(invalid(format!(
                "TDS packet length {} is shorter than its header",
                h.length
            )));
        }
        Ok(h)
    }
}

/// A whole TDS message: the payloads of its packets joined.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    pub packet_type: u8,
    /// The SPID every packet of the message carried.
    pub spid: u16,
    /// How many packets it came in.
    pub packets: usize,
    pub payload: Vec<u8>,
}

/// Splits a message into packets of at most `packet_size` bytes (header
/// included), all stamped with `spid`; the last one has EOM set.
pub fn encode_message(packet_type: u8, spid: u16, payload: &[u8], packet_size: usize) -> Vec<u8> {
    let chunk = packet_size.clamp(MIN_PACKET_SIZE, MAX_PACKET_SIZE) - HEADER_LEN;
    let n = payload.len().div_ceil(chunk).max(1);
    let mut out = Vec::with_capacity(payload.len() + n * HEADER_LEN);
    for i in 0..n {
        let part = &payload[(i * chunk).min(payload.len())..((i + 1) * chunk).min(payload.len())];
        let header = Header {
            packet_type,
            status: if i + 1 == n { STATUS_EOM } else { 0 },
            length: (part.len() + HEADER_LEN) as u16,
            spid,
            packet_id: ((i + 1) % 256) as u8,
            window: 0,
        };
        out.extend_from_slice(&header.encode());
        out.extend_from_slice(part);
    }
    out
}

/// Writes a message in one `write_all`, so a small message is one TCP segment
/// (with TCP_NODELAY) as with a real server.
pub fn write_message(
    w: &mut impl Write,
    packet_type: u8,
    spid: u16,
    payload: &[u8],
    packet_size: usize,
) -> io::Result<()> {
    w.write_all(&encode_message(packet_type, spid, payload, packet_size))?;
    w.flush()
}

/// Reads packets up to the one with EOM. `Ok(None)` when the peer closed the
/// connection between messages (a clean disconnect); a close inside a message
/// is an `UnexpectedEof` error.
pub fn read_message(r: &mut impl Read) -> io::Result<Option<Message>> {
    let mut msg: Option<Message> = None;
    loop {
        let mut hb = [0u8; HEADER_LEN];
        if !read_exact_or_eof(r, &mut hb, msg.is_none())? {
            return Ok(None);
        }
        let h = Header::decode(&hb)?;
        let body_len = h.length as usize - HEADER_LEN;
        let m = msg.get_or_insert_with(|| Message {
            packet_type: h.packet_type,
            spid: h.spid,
            packets: 0,
            payload: Vec::new(),
        });
        if h.packet_type != m.packet_type || h.spid != m.spid {
            return Err(invalid(format!(
                "TDS packet of type {:#04x} SPID {} inside a message of type {:#04x} SPID {}",
                h.packet_type, h.spid, m.packet_type, m.spid
            )));
        }
        if m.payload.len() + body_len > MAX_MESSAGE {
            return Err(invalid(format!(
                "TDS message larger than {MAX_MESSAGE} bytes"
            )));
        }
        let start = m.payload.len();
        m.payload.resize(start + body_len, 0);
        r.read_exact(&mut m.payload[start..])?;
        m.packets += 1;
        if h.status & STATUS_EOM != 0 {
            return Ok(msg);
        }
    }
}

/// Fills `buf`; returns false if the stream ended before its first byte and
/// `eof_ok`.
fn read_exact_or_eof(r: &mut impl Read, buf: &mut [u8], eof_ok: bool) -> io::Result<bool> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) if got == 0 && eof_ok => return Ok(false),
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

/// A protocol violation, as an I/O error so that one `?` covers both.
pub fn invalid(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.into())
}

/// Appends `s` as UCS-2 little-endian (TDS strings; UTF-16 in practice).
pub fn put_ucs2(buf: &mut Vec<u8>, s: &str) {
    for u in s.encode_utf16() {
        buf.extend_from_slice(&u.to_le_bytes());
    }
}

/// Decodes UCS-2 little-endian bytes (an odd trailing byte is an error).
pub fn get_ucs2(b: &[u8]) -> io::Result<String> {
    if !b.len().is_multiple_of(2) {
        return Err(invalid("UCS-2 string with an odd number of bytes"));
    }
    let units: Vec<u16> = b
        .chunks_exact(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]))
        .collect();
    String::from_utf16(&units).map_err(|_| invalid("invalid UTF-16 in a TDS string"))
}

/// A bounds-checked little-endian cursor over a message, for the decoders.
pub struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Cursor { buf, pos: 0 }
    }
    pub fn pos(&self) -> usize {
        self.pos
    }
    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }
    pub fn bytes(&mut self, n: usize) -> io::Result<&'a [u8]> {
        if self.remaining() < n {
            return Err(invalid(format!(
                "TDS data truncated: wanted {n} bytes at offset {}, {} left",
                self.pos,
                self.remaining()
            )));
        }
        let b = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(b)
    }
    pub fn u8(&mut self) -> io::Result<u8> {
        Ok(self.bytes(1)?[0])
    }
    /// The next byte, left in place.
    pub fn peek(&self) -> io::Result<u8> {
        self.buf
            .get(self.pos)
            .copied()
            .ok_or_else(|| invalid(format!("TDS data truncated at offset {}", self.pos)))
    }
    pub fn u16_le(&mut self) -> io::Result<u16> {
        let b = self.bytes(2)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }
    pub fn u16_be(&mut self) -> io::Result<u16> {
        let b = self.bytes(2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }
    pub fn u32_le(&mut self) -> io::Result<u32> {
        Ok(u32::from_le_bytes(
            self.bytes(4)?.try_into().expect("4 bytes"),
        ))
    }
    pub fn u32_be(&mut self) -> io::Result<u32> {
        Ok(u32::from_be_bytes(
            self.bytes(4)?.try_into().expect("4 bytes"),
        ))
    }
    pub fn u64_le(&mut self) -> io::Result<u64> {
        Ok(u64::from_le_bytes(
            self.bytes(8)?.try_into().expect("8 bytes"),
        ))
    }
    /// B_VARCHAR: a one-byte length in characters, then UCS-2.
    pub fn b_varchar(&mut self) -> io::Result<String> {
        let n = self.u8()? as usize;
        get_ucs2(self.bytes(n * 2)?)
    }
    /// US_VARCHAR: a two-byte length in characters, then UCS-2.
    pub fn us_varchar(&mut self) -> io::Result<String> {
        let n = self.u16_le()? as usize;
        get_ucs2(self.bytes(n * 2)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_is_big_endian_on_the_wire() {
        let h = Header {
            packet_type: 4,
            status: 1,
            length: 0x0102,
            spid: 51,
            packet_id: 1,
            window: 0,
        };
        assert_eq!(h.encode(), [4, 1, 0x01, 0x02, 0x00, 51, 1, 0]);
        assert_eq!(Header::decode(&h.encode()).unwrap(), h);
    }

    #[test]
    fn header_shorter_than_itself_is_rejected() {
        assert!(Header::decode(&[4, 1, 0, 7, 0, 0, 1, 0]).is_err());
    }

    #[test]
    fn message_splits_at_packet_size_and_reassembles() {
        let payload: Vec<u8> = (0..1500u32).map(|i| i as u8).collect();
        let wire = encode_message(packet_type::SQL_BATCH, 0, &payload, 512);
        // 504 payload bytes per packet: 504 + 504 + 492.
        assert_eq!(wire.len(), 1500 + 3 * HEADER_LEN);
        assert_eq!(&wire[..8], &[1, 0, 0x02, 0x00, 0, 0, 1, 0]);
        assert_eq!(wire[512 + 1], 0, "middle packet has no EOM");
        assert_eq!(wire[1024 + 1], STATUS_EOM);
        assert_eq!(wire[1024 + 6], 3, "packet ids count up");
        let m = read_message(&mut &wire[..]).unwrap().unwrap();
        assert_eq!(m.payload, payload);
        assert_eq!(m.packets, 3);
    }

    #[test]
    fn empty_message_is_one_packet() {
        let wire = encode_message(packet_type::ATTENTION, 0, &[], 4096);
        assert_eq!(wire, [6, 1, 0, 8, 0, 0, 1, 0]);
        let m = read_message(&mut &wire[..]).unwrap().unwrap();
        assert!(m.payload.is_empty());
    }

    #[test]
    fn eof_between_messages_is_clean_but_inside_is_an_error() {
        assert!(read_message(&mut &[][..]).unwrap().is_none());
        let wire = encode_message(packet_type::SQL_BATCH, 0, b"abcdef", 4096);
        let e = read_message(&mut &wire[..10]).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
        let e = read_message(&mut &wire[..3]).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
    }

    #[test]
    fn spid_change_inside_a_message_is_rejected() {
        let mut wire = encode_message(packet_type::TABULAR_RESULT, 51, &[0u8; 600], 512);
        wire[512 + 5] = 52;
        assert!(read_message(&mut &wire[..]).is_err());
    }

    #[test]
    fn ucs2_round_trip() {
        let mut b = Vec::new();
        put_ucs2(&mut b, "sa Ω");
        assert_eq!(&b[..4], &[b's', 0, b'a', 0]);
        assert_eq!(get_ucs2(&b).unwrap(), "sa Ω");
        assert!(get_ucs2(&b[..3]).is_err());
    }
}
