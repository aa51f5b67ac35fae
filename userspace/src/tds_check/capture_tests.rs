//! The real SQL Server capture in tests/data/mssql_tds.pcap (a copy of
//! ../shared/captures; see its README there) against tshark's TDS dissector:
//! - the kernel's reader (ebpf/include/tds.h, run as C): what it decides for
//!   the first bytes of every segment, taken as a send, is what tshark says
//!   starts there (a server packet and its SPID, or not a server header);
//! - [`TdsStream`], the Rust parser the kernel reader's property tests use
//!   as their oracle: every TDS packet's type, status, length and SPID, at
//!   the frame where tshark reports it.
//!
//! tshark is the oracle: without it these tests fail, never skip.
//!
//! The pcap reader is ours rather than the `pcap-file` crate: classic pcap is a 24-byte
//! file header and a 16-byte header per frame, and the Ethernet/IPv4/TCP decoding (most
//! of the work) would be ours either way; that is not worth a dependency for one test.

use std::collections::BTreeMap;
use std::io::ErrorKind;
use std::path::PathBuf;
use std::process::Command;

use super::kernel_tests::{Verdict, classify};
use super::{PacketType, TdsEvent, TdsStream};

const TDS_PORT: u16 = 1433;

fn capture_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/data/mssql_tds.pcap")
}

/// One TDS packet as tshark reports it: the columns of the oracle command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Row {
    frame: u32,
    srcport: u16,
    packet_type: u8,
    status: u8,
    length: u16,
    spid: u16,
}

/// (source address, source port, destination address, destination port).
type Direction = ([u8; 4], u16, [u8; 4], u16);

/// A TCP segment's payload; `frame` counts from 1, as tshark does.
struct Segment<'a> {
    frame: u32,
    seq: u32,
    payload: &'a [u8],
}

/// The frames of a classic pcap file.
fn pcap_frames(file: &[u8]) -> Vec<&[u8]> {
    let little_endian = match file.get(..4) {
        // Microsecond and nanosecond timestamps; the rest of the format is the same.
        Some([0xd4, 0xc3, 0xb2, 0xa1] | [0x4d, 0x3c, 0xb2, 0xa1]) => true,
        Some([0xa1, 0xb2, 0xc3, 0xd4] | [0xa1, 0xb2, 0x3c, 0x4d]) => false,
        _ => panic!("not a classic pcap file (pcapng is not supported)"),
    };
    let u32_at = |at: usize| {
        let bytes = file
            .get(at..at + 4)
            .expect("pcap file truncated")
            .try_into()
            .unwrap();
        if little_endian {
            u32::from_le_bytes(bytes)
        } else {
            u32::from_be_bytes(bytes)
        }
    };
    assert_eq!(u32_at(20) & 0xffff, 1, "link type is not Ethernet");
    let mut frames = Vec::new();
    let mut at = 24;
    while at < file.len() {
        let (captured, original) = (u32_at(at + 8) as usize, u32_at(at + 12) as usize);
        assert_eq!(
            captured,
            original,
            "frame {} cut by the snap length",
            frames.len() + 1
        );
        frames.push(
            file.get(at + 16..at + 16 + captured)
                .expect("pcap file truncated"),
        );
        at += 16 + captured;
    }
    frames
}

/// The TCP segment in an Ethernet frame; None for anything but IPv4/TCP.
fn tcp_segment(frame: &[u8]) -> Option<(Direction, u32, &[u8])> {
    let be16 = |b: &[u8], at: usize| u16::from_be_bytes([b[at], b[at + 1]]);
    let (ethertype, ip_at) = match be16(frame, 12) {
        0x8100 => (be16(frame, 16), 18), // one VLAN tag
        ethertype => (ethertype, 14),
    };
    let ip = &frame[ip_at..];
    if ethertype != 0x0800 || ip[0] >> 4 != 4 || ip[9] != 6 {
        return None;
    }
    assert_eq!(be16(ip, 6) & 0x3fff, 0, "IP fragments are not supported");
    // Up to the IP total length: short frames carry Ethernet padding after it.
    let tcp = &ip[usize::from(ip[0] & 0x0f) * 4..usize::from(be16(ip, 2))];
    let direction = (
        ip[12..16].try_into().unwrap(),
        be16(tcp, 0),
        ip[16..20].try_into().unwrap(),
        be16(tcp, 2),
    );
    let syn = tcp[13] & 0x02 != 0;
    let seq = u32::from_be_bytes(tcp[4..8].try_into().unwrap()).wrapping_add(u32::from(syn));
    Some((direction, seq, &tcp[usize::from(tcp[12] >> 4) * 4..]))
}

/// A direction's segments in sequence order, retransmitted bytes cut out, so that
/// they concatenate to the byte stream. Panics on a gap: the stream cannot be followed
/// past bytes the capture missed.
fn in_sequence(mut segments: Vec<Segment<'_>>) -> Vec<Segment<'_>> {
    // Sequence numbers wrap: order by signed distance from the first one captured.
    let first = segments[0].seq;
    segments.sort_by_key(|s| (s.seq.wrapping_sub(first) as i32, s.frame));
    let mut next = segments[0].seq;
    let mut ordered = Vec::new();
    for s in segments {
        let ahead = s.seq.wrapping_sub(next) as i32;
        assert!(ahead <= 0, "{ahead} bytes missing before frame {}", s.frame);
        let seen = ahead.unsigned_abs() as usize;
        if seen < s.payload.len() {
            next = s.seq.wrapping_add(s.payload.len() as u32);
            ordered.push(Segment {
                frame: s.frame,
                seq: s.seq.wrapping_add(seen as u32),
                payload: &s.payload[seen..],
            });
        }
    }
    ordered
}

/// What our side finds in the capture.
struct Ours {
    /// With tshark's frame attribution (see `ours`), in frame order.
    rows: Vec<Row>,
    /// Packets spanning segments: (first frame, last frame, row).
    spanning: Vec<(u32, u32, Row)>,
    /// Port-1433 TCP frames where no packet ends: tshark shows no TDS fields there.
    quiet_frames: Vec<u32>,
}

/// Runs each direction of each port-1433 connection through a `TdsStream`, one push
/// per segment.
///
/// tshark's convention: a TDS packet is dissected, and its fields shown, in the frame
/// where reassembly completes, that is the frame holding the packet's last byte, not
/// the one holding its header. The stream reports a header as soon as its 8 bytes are
/// in; the packet's end (`offset + length`) gives the frame tshark names.
fn ours(file: &[u8]) -> Ours {
    let mut directions: BTreeMap<Direction, Vec<Segment>> = BTreeMap::new();
    let mut quiet_frames = Vec::new();
    for (index, frame) in pcap_frames(file).into_iter().enumerate() {
        let frame_number = index as u32 + 1;
        let Some((direction, seq, payload)) = tcp_segment(frame) else {
            continue;
        };
        if direction.1 != TDS_PORT && direction.3 != TDS_PORT {
            continue;
        }
        quiet_frames.push(frame_number);
        if !payload.is_empty() {
            directions.entry(direction).or_default().push(Segment {
                frame: frame_number,
                seq,
                payload,
            });
        }
    }

    let mut rows = Vec::new();
    let mut spanning = Vec::new();
    for (direction, segments) in directions {
        let segments = in_sequence(segments);
        // (stream offset of its first byte, frame) per segment.
        let mut starts = Vec::new();
        let mut offset = 0u64;
        for s in &segments {
            starts.push((offset, s.frame));
            offset += s.payload.len() as u64;
        }
        let stream_len = offset;
        let frame_of =
            |offset: u64| starts[starts.partition_point(|&(start, _)| start <= offset) - 1].1;

        let mut stream = TdsStream::new();
        for s in &segments {
            for event in stream.push(s.payload) {
                let TdsEvent::Packet { offset, header } = event else {
                    panic!(
                        "{event:?} in {direction:?}, frame {}: the capture is plain, in-sync TDS",
                        s.frame
                    );
                };
                let end = offset + u64::from(header.length);
                assert!(
                    end <= stream_len,
                    "packet at frame {} cut off by the end of the capture",
                    s.frame
                );
                let row = Row {
                    frame: frame_of(end - 1),
                    srcport: direction.1,
                    packet_type: header.packet_type as u8,
                    status: header.status,
                    length: header.length,
                    spid: header.spid,
                };
                if s.frame != row.frame {
                    spanning.push((s.frame, row.frame, row));
                }
                rows.push((offset, row));
            }
        }
    }
    // A frame is one direction, so (frame, offset) is the order tshark lists them in.
    rows.sort_by_key(|&(offset, row)| (row.frame, offset));
    let rows: Vec<Row> = rows.into_iter().map(|(_, row)| row).collect();
    quiet_frames.retain(|f| !rows.iter().any(|row| row.frame == *f));
    Ours {
        rows,
        spanning,
        quiet_frames,
    }
}

/// tshark's output for `fields` (tab-separated, one line per frame).
fn run_tshark(path: &str, fields: &[&str]) -> String {
    #[rustfmt::skip]
    let mut args = vec![
        "-r", path,
        // The README's oracle command; the two preferences are tshark's defaults,
        // pinned so that a user's preferences cannot change where packets are shown.
        "-o", "tcp.desegment_tcp_streams:TRUE",
        "-o", "tds.desegment_buffers:TRUE",
        "-d", "tcp.port==1433,tds",
        "-T", "fields",
    ];
    for f in fields {
        args.extend(["-e", f]);
    }
    let output = match Command::new("tshark").args(args).output() {
        Ok(output) => output,
        Err(e) if e.kind() == ErrorKind::NotFound => {
            panic!("tshark is not installed; it is this test's oracle: run `cargo xtask setup`")
        }
        Err(e) => panic!("cannot run tshark: {e}"),
    };
    assert!(
        output.status.success(),
        "tshark failed ({}): {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

/// tshark's TDS rows, and the frames it lists without TDS fields.
fn tshark(path: &str) -> (Vec<Row>, Vec<u32>) {
    let fields = [
        "frame.number",
        "tcp.srcport",
        "tds.type",
        "tds.status",
        "tds.length",
        "tds.channel",
    ];
    let text = run_tshark(path, &fields);
    let mut rows = Vec::new();
    let mut quiet = Vec::new();
    for line in text.lines() {
        let fields: Vec<&str> = line.split('\t').collect();
        let [frame, srcport, types, statuses, lengths, spids] = fields[..] else {
            panic!("unexpected tshark line {line:?}");
        };
        let frame: u32 = frame.parse().unwrap();
        if types.is_empty() {
            quiet.push(frame);
            continue;
        }
        // Several TDS packets in one frame come as comma-separated values.
        let split = |values: &str| -> Vec<u32> {
            values
                .split(',')
                .map(|v| match v.strip_prefix("0x") {
                    Some(hex) => u32::from_str_radix(hex, 16),
                    None => v.parse(),
                })
                .collect::<Result<_, _>>()
                .unwrap_or_else(|e| panic!("tshark line {line:?}: {e}"))
        };
        let (types, statuses, lengths, spids) =
            (split(types), split(statuses), split(lengths), split(spids));
        assert!(
            [&statuses, &lengths, &spids]
                .iter()
                .all(|v| v.len() == types.len()),
            "tshark line {line:?}: uneven columns"
        );
        for i in 0..types.len() {
            rows.push(Row {
                frame,
                srcport: srcport.parse().unwrap(),
                packet_type: types[i] as u8,
                status: statuses[i] as u8,
                length: lengths[i] as u16,
                spid: spids[i] as u16,
            });
        }
    }
    (rows, quiet)
}

#[test]
fn agrees_with_tshark_on_the_real_capture() {
    let path = capture_path();
    let file = std::fs::read(&path)
        .unwrap_or_else(|e| panic!("the SQL Server capture {} is missing: {e}", path.display()));
    let (expected, tshark_quiet) = tshark(path.to_str().unwrap());
    let ours = ours(&file);

    for (i, (theirs, mine)) in expected.iter().zip(&ours.rows).enumerate() {
        assert_eq!(theirs, mine, "TDS packet {i}: tshark, then ours");
    }
    assert_eq!(
        expected.len(),
        ours.rows.len(),
        "number of TDS packets: tshark, then ours"
    );
    // tshark's rows without TDS fields are port-1433 frames where no packet ends:
    // pure ACKs, and the first segments of a packet spanning several.
    assert_eq!(
        tshark_quiet, ours.quiet_frames,
        "frames without TDS fields: tshark, then ours"
    );
    // The README promises a packet larger than one segment; make sure it was tested.
    assert!(!ours.spanning.is_empty(), "no packet spans segments");

    let mut types = BTreeMap::new();
    for row in &ours.rows {
        *types
            .entry(PacketType::from_u8(row.packet_type).unwrap())
            .or_insert(0) += 1;
    }
    println!(
        "{} TDS packets agree with tshark; types: {types:?}",
        ours.rows.len()
    );
    for (first, last, row) in &ours.spanning {
        println!("spanning: header in frame {first}, reported by tshark in frame {last}: {row:?}");
    }
    println!("frames without TDS fields: {:?}", ours.quiet_frames);
}

/// tshark's comma-separated numbers (decimal, or hex with 0x).
fn numbers(values: &str) -> Vec<u32> {
    values
        .split(',')
        .filter(|v| !v.is_empty())
        .map(|v| match v.strip_prefix("0x") {
            Some(hex) => u32::from_str_radix(hex, 16).unwrap(),
            None => v.parse().unwrap(),
        })
        .collect()
}

/// Each port-1433 segment with data, taken as one send (the kernel reads the
/// first bytes of each of the server's sends; here every server packet starts
/// a segment): the kernel reader's verdict on its first bytes must be what
/// tshark says starts there. All of it comes from tshark: the bytes, the
/// length, which packet starts the segment (a packet reassembled from several
/// segments starts in the first one tshark lists for it), its type and SPID.
#[test]
fn the_kernel_reader_agrees_with_tshark_on_the_real_capture() {
    let path = capture_path();
    let fields = [
        "frame.number",
        "tcp.srcport",
        "tcp.len",
        "tcp.segment",
        "tds.type",
        "tds.channel",
        "tcp.payload",
    ];
    let text = run_tshark(path.to_str().unwrap(), &fields);
    let rows: Vec<Vec<&str>> = text.lines().map(|l| l.split('\t').collect()).collect();
    // frame -> (type, SPID) of the first packet dissected there, and for a
    // reassembled one the frames it came in.
    let mut first_packet: BTreeMap<u32, (u8, u16)> = BTreeMap::new();
    let mut starts_in: BTreeMap<u32, u32> = BTreeMap::new();
    let mut continued: Vec<u32> = Vec::new();
    for r in &rows {
        let [frame, _, _, segments, types, spids, _] = r[..] else {
            panic!("unexpected tshark line {r:?}");
        };
        let frame = numbers(frame)[0];
        let (types, spids) = (numbers(types), numbers(spids));
        if let (Some(&t), Some(&spid)) = (types.first(), spids.first()) {
            first_packet.insert(frame, (t as u8, spid as u16));
        }
        if let [first, rest @ ..] = &numbers(segments)[..] {
            starts_in.insert(*first, frame);
            continued.extend(rest);
        }
    }
    let mut server_headers = 0;
    let mut checked = 0;
    for r in &rows {
        let frame = numbers(r[0])[0];
        let send_len: u64 = r[2].parse().unwrap();
        if send_len == 0 {
            continue;
        }
        let payload: Vec<u8> = (0..r[6].len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&r[6][i..i + 2], 16).unwrap())
            .collect();
        assert_eq!(payload.len() as u64, send_len, "frame {frame}");
        // What starts this segment: nothing new in a packet's later segments.
        let starting = if continued.contains(&frame) {
            None
        } else {
            first_packet.get(starts_in.get(&frame).unwrap_or(&frame))
        };
        let expected = match starting {
            Some(&(t, spid))
                if t == PacketType::TabularResult as u8 || t == PacketType::PreLogin as u8 =>
            {
                server_headers += 1;
                Verdict::ServerHeader { spid }
            }
            _ => Verdict::NotAHeader,
        };
        assert_eq!(
            classify(&payload, send_len),
            expected,
            "frame {frame} (port {}): {:02x?}",
            r[1],
            &payload[..8.min(payload.len())]
        );
        checked += 1;
    }
    // Every server packet tshark dissected was found at a segment start.
    let server_packets = rows
        .iter()
        .filter(|r| r[1] == "1433")
        .map(|r| numbers(r[4]).len())
        .sum::<usize>();
    assert!(server_headers > 0, "no server header in the capture");
    assert_eq!(
        server_headers, server_packets,
        "server headers at segment starts, of tshark's server packets"
    );
    println!("{checked} segments: {server_headers} server headers, the rest none, as tshark says");

    // The Rust parser's headers (anywhere in the streams, client ones too),
    // as the kernel would read them at the start of a send.
    let file = std::fs::read(&path).unwrap();
    for row in ours(&file).rows {
        let [hi, lo] = row.length.to_be_bytes();
        let [s_hi, s_lo] = row.spid.to_be_bytes();
        let bytes = [row.packet_type, row.status, hi, lo, s_hi, s_lo, 1, 0];
        let server = [PacketType::TabularResult as u8, PacketType::PreLogin as u8]
            .contains(&row.packet_type);
        let want = if server {
            Verdict::ServerHeader { spid: row.spid }
        } else {
            Verdict::NotAHeader
        };
        assert_eq!(classify(&bytes, u64::from(row.length)), want, "{row:?}");
    }
}
