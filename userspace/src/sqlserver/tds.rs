//! TDS packet headers, and a per-direction reassembler that finds them in a TCP byte
//! stream.
//!
//! Every TDS packet starts with an 8-byte header (MS-TDS 2.2.3.1) whose Length covers
//! header and payload, so a reader can hop from header to header without looking at
//! payloads. That is all [`TdsStream`] does: it holds at most the 8 bytes of a header
//! split across segments and counts its way over payloads, so SQL text and result rows
//! are never copied or kept.
//!
//! Encryption: TDS 7.x carries the TLS handshake inside PRELOGIN packets, then sends raw
//! TLS records on the socket (for the whole session, or for the LOGIN7 packet only when
//! just the login is encrypted); TDS 8.0 is TLS from the first byte. A TLS record header
//! is 5 bytes (content type 0x14..=0x17, version 3.x, length) and those content types are
//! not TDS packet types, so the reassembler skips TLS records the way it skips payloads
//! and reports the stream as encrypted rather than out of sync.

use std::fmt;

/// Size of a TDS packet header.
pub const HEADER_LEN: usize = 8;

/// Largest plausible Length. MS-TDS 2.2.3.1.3 caps the negotiated packet size, which
/// bounds Length, at 32,767 bytes (the u16 field itself could say 65,535).
pub const MAX_PACKET_LEN: u16 = 32_767;

/// Status bits (MS-TDS 2.2.3.1.2).
pub mod status {
    /// Last packet of the message.
    pub const END_OF_MESSAGE: u8 = 0x01;
    /// Client to server: ignore this message (needs END_OF_MESSAGE too).
    pub const IGNORE: u8 = 0x02;
    /// Dropped from the current spec but sent by older clients (Wireshark calls it
    /// "event notification"): the real capture has it on the first packet of a
    /// two-packet RPC.
    pub const EVENT_NOTIFICATION: u8 = 0x04;
    /// Client to server: reset the pooled connection first (TDS 7.1).
    pub const RESET_CONNECTION: u8 = 0x08;
    /// Same, keeping the transaction (TDS 7.3).
    pub const RESET_CONNECTION_SKIP_TRAN: u8 = 0x10;
    pub(super) const KNOWN: u8 = 0x1f;
}

/// Packet types (MS-TDS 2.2.3.1.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum PacketType {
    SqlBatch = 1,
    PreTds7Login = 2,
    Rpc = 3,
    TabularResult = 4,
    Attention = 6,
    BulkLoad = 7,
    FedAuthToken = 8,
    TransactionManager = 14,
    Tds7Login = 16,
    Sspi = 17,
    PreLogin = 18,
}

impl PacketType {
    pub fn from_u8(value: u8) -> Option<Self> {
        Some(match value {
            1 => Self::SqlBatch,
            2 => Self::PreTds7Login,
            3 => Self::Rpc,
            4 => Self::TabularResult,
            6 => Self::Attention,
            7 => Self::BulkLoad,
            8 => Self::FedAuthToken,
            14 => Self::TransactionManager,
            16 => Self::Tds7Login,
            17 => Self::Sspi,
            18 => Self::PreLogin,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::SqlBatch => "SQL batch",
            Self::PreTds7Login => "pre-TDS7 login",
            Self::Rpc => "RPC",
            Self::TabularResult => "tabular result",
            Self::Attention => "attention",
            Self::BulkLoad => "bulk load",
            Self::FedAuthToken => "federated authentication token",
            Self::TransactionManager => "transaction manager request",
            Self::Tds7Login => "TDS7 login",
            Self::Sspi => "SSPI",
            Self::PreLogin => "pre-login",
        }
    }
}

impl fmt::Display for PacketType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A TDS packet header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TdsHeader {
    pub packet_type: PacketType,
    /// Bits from [`status`].
    pub status: u8,
    /// Packet size, header included.
    pub length: u16,
    /// The session's server process id. Servers fill it in; clients usually send 0.
    pub spid: u16,
    /// Packet number within the message, modulo 256.
    pub packet_id: u8,
    /// Unused: the spec says 0, to be ignored.
    pub window: u8,
}

impl TdsHeader {
    pub fn end_of_message(&self) -> bool {
        self.status & status::END_OF_MESSAGE != 0
    }

    /// Bytes after the header.
    pub fn payload_len(&self) -> usize {
        usize::from(self.length) - HEADER_LEN
    }
}

/// Decodes a header, or None if it is not a plausible one: unknown type, status bits
/// the spec does not define or forbids together, or a Length outside 8..=32767. The
/// window byte is not checked, as the spec tells receivers to ignore it.
pub fn parse_header(bytes: &[u8; HEADER_LEN]) -> Option<TdsHeader> {
    let packet_type = PacketType::from_u8(bytes[0])?;
    let status = bytes[1];
    let length = u16::from_be_bytes([bytes[2], bytes[3]]);
    let resets = status::RESET_CONNECTION | status::RESET_CONNECTION_SKIP_TRAN;
    let status_ok = status & !status::KNOWN == 0
        && (status & status::IGNORE == 0 || status & status::END_OF_MESSAGE != 0)
        && status & resets != resets;
    let length_ok = (HEADER_LEN as u16..=MAX_PACKET_LEN).contains(&length);
    (status_ok && length_ok).then(|| TdsHeader {
        packet_type,
        status,
        length,
        spid: u16::from_be_bytes([bytes[4], bytes[5]]),
        packet_id: bytes[6],
        window: bytes[7],
    })
}

/// Size of a TLS record header.
const TLS_RECORD_HEADER_LEN: usize = 5;

/// Largest TLS record body: 2^14 bytes of plaintext plus the 2,048 bytes of expansion
/// TLS 1.2 allows (RFC 5246, 6.2.3; TLS 1.3 allows less).
const TLS_MAX_RECORD_LEN: u16 = 16_384 + 2_048;

/// change_cipher_spec, alert, handshake, application_data. None is a TDS packet type,
/// so one byte tells a TLS record from a TDS packet.
fn is_tls_content_type(byte: u8) -> bool {
    (0x14..=0x17).contains(&byte)
}

/// Body length of the TLS record whose header starts `bytes`, if it is one.
fn tls_record_len(bytes: &[u8]) -> Option<u16> {
    let len = u16::from_be_bytes([bytes[3], bytes[4]]);
    let plausible = is_tls_content_type(bytes[0])
        && bytes[1] == 3 // SSL 3.0 .. TLS 1.3 all say 3.x here
        && bytes[2] <= 4
        && len <= TLS_MAX_RECORD_LEN;
    plausible.then_some(len)
}

/// What [`TdsStream::push`] found. Offsets count bytes from the first one pushed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TdsEvent {
    /// A packet header starting at `offset`, reported as soon as its 8 bytes are in
    /// (before its payload, which ends at `offset + length`).
    Packet { offset: u64, header: TdsHeader },
    /// TLS starts at `offset`: inside a PRELOGIN packet (TDS 7.x handshake, whose
    /// header was reported as a packet) or as raw records. Reported once per stretch
    /// of TLS; from there on the stream yields nothing until plain TDS comes back.
    Encrypted { offset: u64 },
    /// The bytes at `offset` are neither a TDS header nor a TLS record. The stream
    /// stops there: TDS has no sync marker, and guessing at headers inside SQL text
    /// would report made-up packets and SPIDs. A new `TdsStream` can be started at a
    /// known packet boundary.
    Desync { offset: u64 },
}

#[derive(Debug, Clone, Copy)]
enum State {
    /// Reading the header of the next unit, a TDS packet or a TLS record (the first
    /// byte tells which, and so whether 8 or 5 bytes are needed); `have` are in `buf`.
    Header { buf: [u8; HEADER_LEN], have: usize },
    /// Skipping `left` payload bytes, unseen. `peek_tls`: this is a PRELOGIN payload,
    /// whose first byte tells TLS (a content type) from pre-login options (0x00..=0x08
    /// or 0xff).
    Payload { left: usize, peek_tls: bool },
    /// Out of sync: the rest of the stream is ignored.
    Stopped,
}

impl State {
    const NEXT_UNIT: State = State::Header {
        buf: [0; HEADER_LEN],
        have: 0,
    };

    fn skip(left: usize, peek_tls: bool) -> State {
        if left == 0 {
            State::NEXT_UNIT
        } else {
            State::Payload { left, peek_tls }
        }
    }
}

/// Finds the TDS packet headers in one direction of a TCP connection. Feed it the
/// payload of each segment in sequence order, without gaps (a gap breaks the chain of
/// lengths: start a new stream after one).
#[derive(Debug, Clone)]
pub struct TdsStream {
    state: State,
    /// Offset of the next byte pushed.
    pos: u64,
    /// Inside a stretch of TLS.
    in_tls: bool,
}

impl Default for TdsStream {
    fn default() -> Self {
        Self::new()
    }
}

impl TdsStream {
    pub fn new() -> Self {
        Self {
            state: State::NEXT_UNIT,
            pos: 0,
            in_tls: false,
        }
    }

    /// Bytes pushed so far.
    pub fn offset(&self) -> u64 {
        self.pos
    }

    /// The last thing seen was TLS.
    pub fn is_encrypted(&self) -> bool {
        self.in_tls
    }

    /// A desync was reported; pushes do nothing any more.
    pub fn is_stopped(&self) -> bool {
        matches!(self.state, State::Stopped)
    }

    /// Consumes the next bytes of the stream; each packet header is reported once, in
    /// the push that completes it.
    pub fn push(&mut self, mut data: &[u8]) -> Vec<TdsEvent> {
        let mut events = Vec::new();
        while let Some(&next) = data.first() {
            let used = match self.state {
                State::Header { mut buf, have } => {
                    let first = if have == 0 { next } else { buf[0] };
                    let want = if is_tls_content_type(first) {
                        TLS_RECORD_HEADER_LEN
                    } else {
                        HEADER_LEN
                    };
                    let n = (want - have).min(data.len());
                    buf[have..have + n].copy_from_slice(&data[..n]);
                    let start = self.pos - have as u64;
                    self.state = if have + n < want {
                        State::Header {
                            buf,
                            have: have + n,
                        }
                    } else if want == TLS_RECORD_HEADER_LEN {
                        self.tls_record(&buf, start, &mut events)
                    } else {
                        self.packet(&buf, start, &mut events)
                    };
                    n
                }
                State::Payload { left, peek_tls } => {
                    if peek_tls {
                        self.tls_seen(is_tls_content_type(next), self.pos, &mut events);
                    }
                    let n = left.min(data.len());
                    self.state = State::skip(left - n, false);
                    n
                }
                State::Stopped => data.len(),
            };
            self.pos += used as u64;
            data = &data[used..];
        }
        events
    }

    fn packet(&mut self, buf: &[u8; HEADER_LEN], offset: u64, events: &mut Vec<TdsEvent>) -> State {
        let Some(header) = parse_header(buf) else {
            return Self::desync(offset, events);
        };
        events.push(TdsEvent::Packet { offset, header });
        let prelogin = header.packet_type == PacketType::PreLogin;
        if !prelogin {
            // Plain TDS again, as after a LOGIN7 encrypted on its own.
            self.in_tls = false;
        }
        State::skip(header.payload_len(), prelogin)
    }

    fn tls_record(
        &mut self,
        buf: &[u8; HEADER_LEN],
        offset: u64,
        events: &mut Vec<TdsEvent>,
    ) -> State {
        let Some(len) = tls_record_len(buf) else {
            return Self::desync(offset, events);
        };
        self.tls_seen(true, offset, events);
        State::skip(usize::from(len), false)
    }

    fn tls_seen(&mut self, tls: bool, offset: u64, events: &mut Vec<TdsEvent>) {
        if tls && !self.in_tls {
            events.push(TdsEvent::Encrypted { offset });
        }
        self.in_tls = tls;
    }

    fn desync(offset: u64, events: &mut Vec<TdsEvent>) -> State {
        events.push(TdsEvent::Desync { offset });
        State::Stopped
    }
}

#[cfg(test)]
mod capture_tests;

#[cfg(test)]
mod tests {
    use super::*;

    /// A packet: header, then `length - 8` filler bytes.
    fn packet(packet_type: u8, status: u8, length: u16, spid: u16) -> Vec<u8> {
        let mut bytes = vec![packet_type, status];
        bytes.extend(length.to_be_bytes());
        bytes.extend(spid.to_be_bytes());
        bytes.extend([1, 0]);
        bytes.resize(usize::from(length), b'x');
        bytes
    }

    fn tls_record(content_type: u8, len: u16) -> Vec<u8> {
        let mut bytes = vec![content_type, 3, 3];
        bytes.extend(len.to_be_bytes());
        bytes.resize(TLS_RECORD_HEADER_LEN + usize::from(len), 0xaa);
        bytes
    }

    fn header(packet_type: PacketType, status: u8, length: u16, spid: u16) -> TdsHeader {
        TdsHeader {
            packet_type,
            status,
            length,
            spid,
            packet_id: 1,
            window: 0,
        }
    }

    fn at(offset: u64, header: TdsHeader) -> TdsEvent {
        TdsEvent::Packet { offset, header }
    }

    /// Events from pushing `bytes` in chunks of `chunk` bytes.
    fn chunked(bytes: &[u8], chunk: usize) -> Vec<TdsEvent> {
        let mut stream = TdsStream::new();
        bytes.chunks(chunk).flat_map(|c| stream.push(c)).collect()
    }

    #[test]
    fn parses_a_server_header() {
        // Frame 2 of the capture: a 34-byte tabular result from SPID 53.
        let h = parse_header(&[0x04, 0x01, 0x00, 0x22, 0x00, 0x35, 0x01, 0x00]).unwrap();
        assert_eq!(h, header(PacketType::TabularResult, 0x01, 34, 53));
        assert!(h.end_of_message());
        assert_eq!(h.payload_len(), 26);
        assert_eq!(h.packet_type.to_string(), "tabular result");
    }

    #[test]
    fn knows_exactly_the_spec_types() {
        let known: Vec<u8> = (0..=255)
            .filter(|&t| PacketType::from_u8(t).is_some())
            .collect();
        assert_eq!(known, [1, 2, 3, 4, 6, 7, 8, 14, 16, 17, 18]);
        for t in known {
            assert_eq!(PacketType::from_u8(t).unwrap() as u8, t);
            assert!(parse_header(&[t, 1, 0, 8, 0, 0, 1, 0]).is_some());
        }
        assert!(parse_header(&[5, 1, 0, 8, 0, 0, 1, 0]).is_none());
        assert!(parse_header(&[15, 1, 0, 8, 0, 0, 1, 0]).is_none());
    }

    #[test]
    fn rejects_implausible_lengths_and_status() {
        let with = |status: u8, length: u16| {
            let [hi, lo] = length.to_be_bytes();
            parse_header(&[3, status, hi, lo, 0, 0, 1, 0])
        };
        assert!(with(1, 7).is_none());
        assert!(with(1, 8).is_some()); // an attention signal has no payload
        assert!(with(1, 32_767).is_some());
        assert!(with(1, 32_768).is_none());
        assert!(with(0x00, 100).is_some()); // not the last packet
        assert!(with(0x04, 100).is_some()); // seen in the real capture
        assert!(with(0x09, 100).is_some()); // pooled connection reset
        assert!(with(0x11, 100).is_some());
        assert!(with(0x03, 100).is_some());
        assert!(with(0x02, 100).is_none()); // ignore without end of message
        assert!(with(0x19, 100).is_none()); // both resets
        assert!(with(0x21, 100).is_none()); // undefined bit
        assert!(with(0x81, 100).is_none());
    }

    #[test]
    fn several_packets_in_one_segment() {
        let mut bytes = packet(3, 0x09, 185, 0);
        bytes.extend(packet(6, 0x01, 8, 0));
        bytes.extend(packet(1, 0x01, 44, 0));
        let mut stream = TdsStream::new();
        assert_eq!(
            stream.push(&bytes),
            [
                at(0, header(PacketType::Rpc, 0x09, 185, 0)),
                at(185, header(PacketType::Attention, 0x01, 8, 0)),
                at(193, header(PacketType::SqlBatch, 0x01, 44, 0)),
            ]
        );
        assert_eq!(stream.offset(), 237);
    }

    #[test]
    fn any_segmentation_gives_the_same_headers() {
        // Chunk sizes 1..=8 split headers at every position; larger ones split
        // payloads and put a packet's end and the next header in one chunk.
        let mut bytes = packet(4, 0x00, 100, 53);
        bytes.extend(packet(4, 0x01, 9, 53));
        bytes.extend(packet(4, 0x01, 60, 53));
        let whole = chunked(&bytes, bytes.len());
        assert_eq!(whole.len(), 3);
        for chunk in 1..bytes.len() {
            assert_eq!(chunked(&bytes, chunk), whole, "chunks of {chunk}");
        }
    }

    #[test]
    fn split_header_is_reported_when_complete() {
        let bytes = packet(1, 0x01, 20, 0);
        let mut stream = TdsStream::new();
        assert_eq!(stream.push(&bytes[..3]), []);
        assert_eq!(stream.push(&bytes[3..7]), []);
        assert_eq!(
            stream.push(&bytes[7..9]),
            [at(0, header(PacketType::SqlBatch, 1, 20, 0))]
        );
        assert_eq!(stream.push(&bytes[9..]), []);
    }

    #[test]
    fn packet_spanning_many_segments() {
        // Like the capture: an 8000-byte RPC packet in five full segments and a
        // shorter one, whose last segment also holds the next packet.
        let mut bytes = packet(3, 0x04, 8000, 0);
        bytes.extend(packet(3, 0x01, 339, 0));
        let mut stream = TdsStream::new();
        let mut segments = bytes[..7300].chunks(1460);
        assert_eq!(
            stream.push(segments.next().unwrap()),
            [at(0, header(PacketType::Rpc, 0x04, 8000, 0))]
        );
        for segment in segments {
            assert_eq!(stream.push(segment), []);
        }
        assert_eq!(
            stream.push(&bytes[7300..]),
            [at(8000, header(PacketType::Rpc, 0x01, 339, 0))]
        );
    }

    #[test]
    fn garbage_stops_the_stream() {
        let mut stream = TdsStream::new();
        assert_eq!(stream.push(b"SELECT 1"), [TdsEvent::Desync { offset: 0 }]);
        assert!(stream.is_stopped());
        assert_eq!(stream.push(&packet(4, 1, 30, 53)), []);

        // A bad header after a good packet, the good one still reported.
        let mut bytes = packet(4, 1, 30, 53);
        bytes.extend([4, 1, 0xff, 0xff, 0, 53, 1, 0]); // Length 65535
        bytes.extend(packet(4, 1, 30, 53));
        for chunk in 1..=bytes.len() {
            let events = chunked(&bytes, chunk);
            assert_eq!(
                events,
                [
                    at(0, header(PacketType::TabularResult, 1, 30, 53)),
                    TdsEvent::Desync { offset: 30 }
                ]
            );
        }
    }

    #[test]
    fn tls_after_prelogin_is_reported_as_encrypted() {
        // TDS 7.x: a plain PRELOGIN (options start with token 0x00), then the TLS
        // handshake inside PRELOGIN packets, then raw TLS records.
        let mut plain = packet(18, 1, 47, 0);
        plain[8] = 0x00;
        let mut hello = vec![18, 1, 0, 8 + 10, 0, 0, 1, 0];
        hello.extend(&tls_record(0x16, 5));
        let mut bytes = plain;
        bytes.extend(&hello);
        bytes.extend(tls_record(0x14, 1));
        bytes.extend(tls_record(0x17, 300));
        bytes.extend(tls_record(0x15, 2));
        for chunk in 1..=bytes.len() {
            let mut stream = TdsStream::new();
            let events: Vec<_> = bytes.chunks(chunk).flat_map(|c| stream.push(c)).collect();
            assert_eq!(
                events,
                [
                    at(0, header(PacketType::PreLogin, 1, 47, 0)),
                    at(47, header(PacketType::PreLogin, 1, 18, 0)),
                    TdsEvent::Encrypted { offset: 55 },
                ],
                "chunks of {chunk}"
            );
            assert!(stream.is_encrypted() && !stream.is_stopped());
        }
    }

    #[test]
    fn plain_tds_after_an_encrypted_login_is_followed() {
        // Login-only encryption: the LOGIN7 goes as a TLS record, the rest in clear.
        let mut bytes = tls_record(0x17, 200);
        bytes.extend(packet(1, 1, 40, 0));
        let mut stream = TdsStream::new();
        assert_eq!(
            stream.push(&bytes),
            [
                TdsEvent::Encrypted { offset: 0 },
                at(205, header(PacketType::SqlBatch, 1, 40, 0))
            ]
        );
        assert!(!stream.is_encrypted());
    }

    #[test]
    fn strict_encryption_is_tls_from_the_start() {
        // TDS 8.0: a raw ClientHello (record version 3.1) first.
        let mut bytes = vec![0x16, 3, 1, 0, 4, 1, 0, 0, 0];
        bytes.extend(tls_record(0x17, 1000));
        let mut stream = TdsStream::new();
        assert_eq!(stream.push(&bytes), [TdsEvent::Encrypted { offset: 0 }]);
        // Not a TLS version: garbage, not encryption.
        let mut stream = TdsStream::new();
        assert_eq!(
            stream.push(&[0x17, 9, 9, 0, 1, 0]),
            [TdsEvent::Desync { offset: 0 }]
        );
    }

    #[test]
    fn never_panics_on_random_bytes() {
        // xorshift: random bytes in random chunks, alone and after a valid packet.
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut random = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for round in 0..2_000 {
            let mut bytes = if round % 2 == 0 {
                packet(4, 1, 20, 7)
            } else {
                Vec::new()
            };
            bytes.extend((0..random() % 300).map(|_| random() as u8));
            let mut stream = TdsStream::new();
            let mut rest = &bytes[..];
            while !rest.is_empty() {
                let n = (random() as usize % 40 + 1).min(rest.len());
                for event in stream.push(&rest[..n]) {
                    if let TdsEvent::Packet { offset, .. } | TdsEvent::Desync { offset } = event {
                        assert!(offset < bytes.len() as u64);
                    }
                }
                rest = &rest[n..];
            }
            assert_eq!(stream.offset(), bytes.len() as u64);
        }
    }
}
