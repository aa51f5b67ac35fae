//! The header parser and the stream reassembler on handmade packets; the real
//! capture is `capture_tests`, the kernel's C reader `kernel_tests`.

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
