//! MS-SMP, the session multiplexing MARS runs TDS over. Once PRELOGIN agreed
//! on MARS, every TDS packet travels in a DATA packet of one logical session
//! (SID) after a 16-byte header: SMID 0x53, flags, SID, Length (header
//! included), sequence number and window, all little-endian. SYN opens a
//! session, FIN closes it, ACK moves the window.
//!
//! Enough for the simulator's own MARS client and server, several requests in
//! flight on one connection: sessions open and carry requests. Each end
//! grants a window far beyond what it will receive (MS-SMP lets the receiver
//! choose it), so neither ever waits for an ACK, and neither sends one. FIN
//! is read and let be: the connection's close ends every session.

use std::collections::HashMap;
use std::io::{self, Read};

use super::{HEADER_LEN as TDS_HEADER_LEN, invalid};

pub const SMID: u8 = 0x53;
pub const HEADER_LEN: usize = 16;
pub const SYN: u8 = 0x01;
pub const ACK: u8 = 0x02;
pub const FIN: u8 = 0x04;
pub const DATA: u8 = 0x08;

/// How far past its last received sequence number each end lets the other send.
const WINDOW_AHEAD: u32 = 1 << 20;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub flags: u8,
    pub sid: u16,
    /// The whole SMP packet, this header included.
    pub length: u32,
    pub seqnum: u32,
    pub window: u32,
}

impl Header {
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0] = SMID;
        b[1] = self.flags;
        b[2..4].copy_from_slice(&self.sid.to_le_bytes());
        b[4..8].copy_from_slice(&self.length.to_le_bytes());
        b[8..12].copy_from_slice(&self.seqnum.to_le_bytes());
        b[12..16].copy_from_slice(&self.window.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8; HEADER_LEN]) -> io::Result<Header> {
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        if b[0] != SMID {
            return Err(invalid(format!(
                "SMP packet starting {:#04x}, not 0x53",
                b[0]
            )));
        }
        let h = Header {
            flags: b[1],
            sid: u16::from_le_bytes([b[2], b[3]]),
            length: u32_at(4),
            seqnum: u32_at(8),
            window: u32_at(12),
        };
        let payload = h.length as usize >= HEADER_LEN + TDS_HEADER_LEN;
        match h.flags {
            SYN | ACK | FIN if h.length as usize == HEADER_LEN => Ok(h),
            DATA if payload => Ok(h),
            _ => Err(invalid(format!(
                "SMP packet with flags {:#04x} and length {}",
                h.flags, h.length
            ))),
        }
    }
}

/// One end's SMP state on a connection: per session, the sequence numbers
/// it has sent and received; and what is left of the DATA packet being read.
#[derive(Default)]
pub struct Mux {
    sent: HashMap<u16, u32>,
    received: HashMap<u16, u32>,
    left: usize,
    last_sid: u16,
}

impl Mux {
    fn header(&self, flags: u8, sid: u16, length: usize, seqnum: u32) -> [u8; HEADER_LEN] {
        let received = self.received.get(&sid).copied().unwrap_or(0);
        Header {
            flags,
            sid,
            length: length as u32,
            seqnum,
            window: received.wrapping_add(WINDOW_AHEAD),
        }
        .encode()
    }

    /// The SYN that opens session `sid`.
    pub fn syn(&mut self, sid: u16) -> [u8; HEADER_LEN] {
        self.sent.insert(sid, 0);
        self.header(SYN, sid, HEADER_LEN, 0)
    }

    /// A TDS message's wire bytes (whole packets, as `encode_message` makes
    /// them) as DATA packets of session `sid`, one per TDS packet.
    pub fn wrap(&mut self, sid: u16, tds: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(tds.len() + HEADER_LEN);
        let mut rest = tds;
        while rest.len() >= TDS_HEADER_LEN {
            let len = usize::from(u16::from_be_bytes([rest[2], rest[3]])).clamp(1, rest.len());
            let seq = self.sent.entry(sid).or_insert(0);
            *seq = seq.wrapping_add(1);
            let seq = *seq;
            out.extend_from_slice(&self.header(DATA, sid, HEADER_LEN + len, seq));
            out.extend_from_slice(&rest[..len]);
            rest = &rest[len..];
        }
        out
    }

    /// The session the last DATA packet read came from.
    pub fn last_sid(&self) -> u16 {
        self.last_sid
    }

    /// A reader of the TDS bytes inside `inner`'s SMP packets.
    pub fn reader<'a, R: Read>(&'a mut self, inner: &'a mut R) -> Reader<'a, R> {
        Reader { mux: self, inner }
    }
}

/// The TDS stream inside SMP: the payloads of DATA packets in order, the
/// other packets skipped; the end of the connection between packets is the
/// end of the stream.
pub struct Reader<'a, R> {
    mux: &'a mut Mux,
    inner: &'a mut R,
}

impl<R: Read> Read for Reader<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.mux.left == 0 {
            let mut b = [0u8; HEADER_LEN];
            let mut got = 0;
            while got < HEADER_LEN {
                match self.inner.read(&mut b[got..]) {
                    Ok(0) if got == 0 => return Ok(0),
                    Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                    Ok(n) => got += n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            }
            let h = Header::decode(&b)?;
            if h.flags == DATA {
                self.mux.received.insert(h.sid, h.seqnum);
                self.mux.last_sid = h.sid;
                self.mux.left = h.length as usize - HEADER_LEN;
            }
        }
        let want = buf.len().min(self.mux.left);
        let n = self.inner.read(&mut buf[..want])?;
        if n == 0 && want > 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        self.mux.left -= n;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tds::{encode_message, packet_type, read_message};

    #[test]
    fn messages_of_two_sessions_come_back_with_their_sid() {
        let mut client = Mux::default();
        let mut wire = client.syn(0).to_vec();
        wire.extend_from_slice(&client.syn(1));
        let big = vec![7u8; 10_000];
        wire.extend(client.wrap(0, &encode_message(packet_type::SQL_BATCH, 0, b"a", 4096)));
        wire.extend(client.wrap(1, &encode_message(packet_type::SQL_BATCH, 0, &big, 4096)));
        let mut server = Mux::default();
        let mut r = &wire[..];
        let m = read_message(&mut server.reader(&mut r)).unwrap().unwrap();
        assert_eq!((m.payload.as_slice(), server.last_sid()), (&b"a"[..], 0));
        let m = read_message(&mut server.reader(&mut r)).unwrap().unwrap();
        assert_eq!((m.payload.len(), server.last_sid()), (10_000, 1));
        assert!(read_message(&mut server.reader(&mut r)).unwrap().is_none());
    }

    #[test]
    fn every_tds_packet_gets_its_own_data_packet_with_the_next_seqnum() {
        let mut mux = Mux::default();
        let tds = encode_message(packet_type::TABULAR_RESULT, 51, &[0u8; 9000], 4096);
        let wire = mux.wrap(3, &tds);
        let mut rest = &wire[..];
        let mut seqs = Vec::new();
        while !rest.is_empty() {
            let h = Header::decode(rest[..HEADER_LEN].try_into().unwrap()).unwrap();
            assert_eq!((h.flags, h.sid, rest[HEADER_LEN]), (DATA, 3, 4));
            seqs.push(h.seqnum);
            rest = &rest[h.length as usize..];
        }
        assert_eq!(seqs, [1, 2, 3]);
        assert_eq!(wire.len(), tds.len() + 3 * HEADER_LEN);
    }

    #[test]
    fn malformed_packets_are_errors() {
        let mut syn = Mux::default().syn(0);
        syn[4] = 17;
        assert!(Header::decode(&syn).is_err());
        syn[0] = 0x54;
        assert!(Header::decode(&syn).is_err());
    }
}
