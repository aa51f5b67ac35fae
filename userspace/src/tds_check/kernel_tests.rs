//! The kernel's TDS send classifier, `tds_classify_send` in
//! ebpf/include/tds.h, compiled for the host by build.rs and run here as C:
//! - every value of the type and status bytes at every edge of Length, and
//!   random sends of any length (proptest), against the Rust parser (which
//!   `capture_tests` checks against tshark) where both define the answer;
//! - with the send's bytes ending at an inaccessible page, so a read past
//!   the send or past 8 bytes crashes the test;
//! - on the simulator's own packets (sim/src/tds), whose constants must be
//!   tds.h's.
//!
//! The real capture is `capture_tests::the_kernel_reader_agrees_with_tshark`.

use std::cell::RefCell;

use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed};
use stalltrace_sim::tds as sim;

use super::{PacketType, TdsEvent, TdsStream, c};

unsafe extern "C" {
    /// tds.h's `tds_classify_send`, compiled for the host (csrc/tds_shim.c).
    fn stalltrace_c_tds_classify_send(bytes: *const u8, send_len: u64, spid: *mut u16) -> u32;
}

/// What the kernel decides about a send's first bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Verdict {
    NotAHeader,
    ServerHeader {
        spid: u16,
    },
    Tls,
    /// An SMP DATA header (MARS): the kernel reads the TDS header after it.
    SmpData,
}

/// Two pages: the send's bytes go at the end of the first, the second is
/// PROT_NONE, so a read past them is a SIGSEGV, not a silent success.
struct Guarded {
    base: *mut u8,
    page: usize,
}

impl Guarded {
    fn new() -> Self {
        // SAFETY: sysconf and an anonymous private mapping we own; checked below.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                2 * page,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(
            base,
            libc::MAP_FAILED,
            "mmap: {}",
            std::io::Error::last_os_error()
        );
        let base = base.cast::<u8>();
        // SAFETY: the second page of the mapping just made.
        let rc = unsafe { libc::mprotect(base.add(page).cast(), page, libc::PROT_NONE) };
        assert_eq!(rc, 0, "mprotect: {}", std::io::Error::last_os_error());
        Self { base, page }
    }
}

thread_local! {
    static GUARDED: RefCell<Guarded> = RefCell::new(Guarded::new());
}

/// The C decision on a send of `send_len` bytes starting with `bytes` (which
/// must hold at least min(send_len, 8) of them). Only those are mapped.
pub(super) fn classify(bytes: &[u8], send_len: u64) -> Verdict {
    let k = send_len.min(8) as usize;
    assert!(
        bytes.len() >= k,
        "{} bytes given for a send of {send_len}",
        bytes.len()
    );
    let mut spid = 0xa5a5;
    let v = GUARDED.with(|g| {
        let g = g.borrow();
        // SAFETY: the k bytes before the guard page are ours and writable;
        // the C function reads at most k bytes from there (or it faults).
        unsafe {
            let at = g.base.add(g.page - k);
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), at, k);
            stalltrace_c_tds_classify_send(at, send_len, &mut spid)
        }
    });
    match v {
        c::TDS_SERVER_HEADER => Verdict::ServerHeader { spid },
        c::TDS_NOT_A_HEADER | c::TDS_TLS_RECORD | c::TDS_SMP_DATA => {
            assert_eq!(spid, 0xa5a5, "spid written with verdict {v}");
            match v {
                c::TDS_TLS_RECORD => Verdict::Tls,
                c::TDS_SMP_DATA => Verdict::SmpData,
                _ => Verdict::NotAHeader,
            }
        }
        other => panic!("tds_classify_send returned {other}"),
    }
}

/// The Rust parser's answer where it has one: a fresh stream given the
/// send's first 8 bytes reports a packet (a server header when its type is a
/// server's), the start of TLS, or a desync.
fn rust_parser(bytes: &[u8; 8]) -> Verdict {
    match TdsStream::new().push(bytes).first() {
        Some(TdsEvent::Packet { offset: 0, header })
            if matches!(
                header.packet_type,
                PacketType::TabularResult | PacketType::PreLogin
            ) =>
        {
            Verdict::ServerHeader { spid: header.spid }
        }
        Some(TdsEvent::Encrypted { offset: 0 }) => Verdict::Tls,
        Some(TdsEvent::Packet { .. } | TdsEvent::Desync { offset: 0 }) => Verdict::NotAHeader,
        other => panic!("a fresh stream given 8 bytes reported {other:?}"),
    }
}

/// Sends shorter than a header, where only the kernel answers: under 5
/// bytes nothing; 5 to 7 only a TLS record header, which the Rust parser
/// reads from 5 bytes.
fn short_send(bytes: &[u8; 8], send_len: u64) -> Verdict {
    if send_len < 5 {
        return Verdict::NotAHeader;
    }
    match TdsStream::new().push(&bytes[..5]).first() {
        Some(TdsEvent::Encrypted { offset: 0 }) => Verdict::Tls,
        _ => Verdict::NotAHeader,
    }
}

fn expected(bytes: &[u8; 8], send_len: u64) -> Verdict {
    if send_len < 8 {
        short_send(bytes, send_len)
    } else if bytes[0] == SMP_SMID {
        smp_rule(bytes)
    } else {
        rust_parser(bytes)
    }
}

/// MS-SMP 2.2.1, which the Rust parser does not speak: SMID 0x53, then a
/// DATA packet (flags 0x08) whose little-endian Length (its 16-byte header
/// included) holds one TDS packet: 8 to 32,767 bytes of it.
const SMP_SMID: u8 = 0x53;

fn smp_rule(bytes: &[u8; 8]) -> Verdict {
    let len = u32::from_le_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]);
    if bytes[1] == 0x08 && (16 + 8..=16 + 32_767).contains(&len) {
        Verdict::SmpData
    } else {
        Verdict::NotAHeader
    }
}

/// Lengths at every edge the rule has (TDS: 8, 32767; TLS: 18432), as bytes 2-3
/// of a TDS header; bytes 3-4 carry the TLS length.
const EDGES: [u16; 12] = [
    0, 1, 7, 8, 9, 34, 4096, 18_432, 18_433, 32_767, 32_768, 65_535,
];

#[test]
fn every_type_and_status_at_every_length_edge_agrees_with_the_rust_parser() {
    let mut seen = [0usize; 4];
    for b0 in 0..=255u8 {
        for b1 in 0..=255u8 {
            for len in EDGES {
                let [hi, lo] = len.to_be_bytes();
                for bytes in [
                    [b0, b1, hi, lo, 0x01, 0x35, 1, 0],
                    [b0, b1, 3, hi, lo, 0xff, 9, 9],
                ] {
                    for send_len in [4, 5, 7, 8, u64::from(len), u64::MAX] {
                        let v = classify(&bytes, send_len);
                        assert_eq!(
                            v,
                            expected(&bytes, send_len),
                            "{bytes:02x?}, send of {send_len}"
                        );
                        seen[match v {
                            Verdict::NotAHeader => 0,
                            Verdict::ServerHeader { .. } => 1,
                            Verdict::Tls => 2,
                            Verdict::SmpData => 3,
                        }] += 1;
                    }
                }
            }
        }
    }
    // Each answer but SMP's (whose Length is in bytes 4-7) came up (TLS: 4
    // content types with version 3.x, at lengths and send sizes): the loop is
    // not checking one case 9 million times.
    assert!(seen[..3].iter().all(|&n| n > 200), "{seen:?}");
}

#[test]
fn the_rules_named_in_tds_h() {
    let send = |bytes: [u8; 8]| classify(&bytes, 8);
    // Frame 2 of the real capture: a tabular result from SPID 53.
    assert_eq!(
        send([4, 1, 0, 0x22, 0, 0x35, 1, 0]),
        Verdict::ServerHeader { spid: 53 }
    );
    // A pre-login response: SPID 0 (the kernel then waits for the LOGINACK).
    assert_eq!(
        send([18, 1, 0, 47, 0, 0, 1, 0]),
        Verdict::ServerHeader { spid: 0 }
    );
    // Client packets, and the Length the spec caps at 32767.
    assert_eq!(send([1, 1, 0, 44, 0, 0, 1, 0]), Verdict::NotAHeader);
    assert_eq!(
        send([4, 1, 0x7f, 0xff, 0, 9, 1, 0]),
        Verdict::ServerHeader { spid: 9 }
    );
    assert_eq!(send([4, 1, 0x80, 0x00, 0, 9, 1, 0]), Verdict::NotAHeader);
    // Ignore without end of message; both resets; an undefined bit.
    for status in [0x02, 0x18, 0x21] {
        assert_eq!(
            send([4, status, 0, 34, 0, 9, 1, 0]),
            Verdict::NotAHeader,
            "{status:#x}"
        );
    }
    // TLS application data and a TDS 8.0 ClientHello-style record; not TLS 3.9.
    assert_eq!(send([0x17, 3, 3, 0, 40, 0, 0, 0]), Verdict::Tls);
    assert_eq!(classify(&[0x16, 3, 1, 0, 4], 5), Verdict::Tls);
    assert_eq!(send([0x17, 3, 9, 0, 40, 0, 0, 0]), Verdict::NotAHeader);
    // A 7-byte send is no header, whatever it starts with.
    assert_eq!(classify(&[4, 1, 0, 7, 0, 9, 1], 7), Verdict::NotAHeader);
    // MARS: an SMP DATA header of SID 1 holding a 34-byte TDS packet; SMP's
    // SYN, ACK and FIN carry no TDS; a DATA too short to hold a TDS header.
    assert_eq!(send([0x53, 0x08, 1, 0, 50, 0, 0, 0]), Verdict::SmpData);
    for flags in [0x01, 0x02, 0x04] {
        assert_eq!(send([0x53, flags, 1, 0, 16, 0, 0, 0]), Verdict::NotAHeader);
    }
    assert_eq!(send([0x53, 0x08, 1, 0, 23, 0, 0, 0]), Verdict::NotAHeader);
}

/// Bytes that reach every branch: server and client types, TLS content
/// types, and random ones; status bits alone and mixed; Length at its edges.
fn send_bytes() -> impl Strategy<Value = [u8; 8]> {
    let first = prop_oneof![
        Just(4u8),
        Just(18),
        prop::sample::select(vec![
            1u8, 2, 3, 6, 7, 8, 14, 16, 17, 0x14, 0x15, 0x16, 0x17, 0x53
        ]),
        any::<u8>(),
    ];
    let status = prop_oneof![0..=0x1fu8, Just(3), any::<u8>()];
    let len = prop_oneof![prop::sample::select(EDGES.to_vec()), any::<u16>()];
    (first, status, len, any::<[u8; 4]>()).prop_map(|(b0, b1, len, rest)| {
        let [hi, lo] = len.to_be_bytes();
        if (0x14..=0x17).contains(&b0) {
            [b0, 3, b1 & 7, hi, lo, rest[0], rest[1], rest[2]]
        } else {
            [b0, b1, hi, lo, rest[0], rest[1], rest[2], rest[3]]
        }
    })
}

fn config(cases: u32) -> Config {
    let mut c = Config::with_cases(cases);
    if std::env::var_os("PROPTEST_RNG_SEED").is_none() {
        c.rng_seed = RngSeed::Fixed(0x7d5_8b17);
    }
    c.failure_persistence = None;
    c
}

proptest! {
    #![proptest_config(config(20_000))]

    /// Any bytes and any send length: one of three answers, reading nothing
    /// past the send or its 8th byte (the guard page), and the Rust parser's
    /// answer wherever it has one.
    #[test]
    fn any_send_gets_the_rust_parsers_answer_and_reads_only_its_bytes(
        bytes in prop_oneof![send_bytes(), any::<[u8; 8]>()],
        send_len in prop_oneof![0..=16u64, any::<u64>()],
    ) {
        prop_assert_eq!(classify(&bytes, send_len), expected(&bytes, send_len));
    }
}

#[test]
fn the_simulator_speaks_with_tds_h_constants() {
    let t = |v: u32| v as u8;
    assert_eq!(sim::HEADER_LEN, c::TDS_HEADER_LEN as usize);
    assert_eq!(sim::MAX_PACKET_SIZE, c::TDS_MAX_PACKET_LEN as usize);
    assert_eq!(sim::STATUS_EOM, t(c::TDS_STATUS_EOM));
    use sim::packet_type as p;
    for (ours, theirs) in [
        (c::TDS_TYPE_SQL_BATCH, p::SQL_BATCH),
        (c::TDS_TYPE_RPC, p::RPC),
        (c::TDS_TYPE_TABULAR_RESULT, p::TABULAR_RESULT),
        (c::TDS_TYPE_ATTENTION, p::ATTENTION),
        (c::TDS_TYPE_BULK_LOAD, p::BULK_LOAD),
        (c::TDS_TYPE_TRANSACTION_MANAGER, p::TRANSACTION_MANAGER),
        (c::TDS_TYPE_LOGIN7, p::LOGIN7),
        (c::TDS_TYPE_SSPI, p::SSPI),
        (c::TDS_TYPE_PRELOGIN, p::PRELOGIN),
    ] {
        assert_eq!(t(ours), theirs);
    }
}

proptest! {
    #![proptest_config(config(500))]

    /// The simulator's messages, split into packets as its server sends them:
    /// every packet of a server type is a header naming the SPID, as a send
    /// of its own or as the first of a message written whole (the
    /// simulator's `write_message`); a client's are not. (A pre-login
    /// request has the pre-login type too; the kernel reads only the
    /// server's sends.)
    #[test]
    fn the_simulators_packets_are_read_as_the_server_sent_them(
        packet_type in prop::sample::select(vec![
            sim::packet_type::TABULAR_RESULT, sim::packet_type::PRELOGIN,
            sim::packet_type::SQL_BATCH, sim::packet_type::RPC, sim::packet_type::LOGIN7,
            sim::packet_type::ATTENTION,
        ]),
        spid in any::<u16>(),
        payload_len in prop_oneof![0..64usize, 0..100_000usize],
        packet_size in prop_oneof![Just(sim::DEFAULT_PACKET_SIZE), 0..70_000usize],
    ) {
        let message = sim::encode_message(packet_type, spid, &vec![0x5a; payload_len], packet_size);
        let server = matches!(packet_type, sim::packet_type::TABULAR_RESULT | sim::packet_type::PRELOGIN);
        let want = if server { Verdict::ServerHeader { spid } } else { Verdict::NotAHeader };
        let mut rest = &message[..];
        let mut packets = 0;
        while !rest.is_empty() {
            let len = usize::from(u16::from_be_bytes([rest[2], rest[3]]));
            prop_assert_eq!(classify(rest, len as u64), want);
            rest = &rest[len..];
            packets += 1;
        }
        prop_assert!(packets >= 1);
        prop_assert_eq!(classify(&message, message.len() as u64), want);
    }
}
