//! Pcaps made from the exact bytes a test exchanged (no capture privileges
//! needed), and tshark, the independent oracle that dissects them.

use std::process::Command;

/// Each direction's bytes, in order: (from the client?, bytes).
pub type Transcript = Vec<(bool, Vec<u8>)>;

/// Whether tshark can run. Under CI (which installs it with `cargo xtask
/// setup`) a missing tshark fails the test instead of skipping the check.
pub fn tshark_available() -> bool {
    if Command::new("tshark").arg("-v").output().is_ok() {
        return true;
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "tshark is not installed: run `cargo xtask setup`"
    );
    eprintln!("tshark not installed: skipping the Wireshark dissector check");
    false
}

/// The transcript as a pcap: raw IPv4, a TCP handshake, then one segment
/// per ≤ 1448 bytes.
pub fn build_pcap(transcript: &Transcript, client_port: u16, server_port: u16) -> Vec<u8> {
    const SYN: u8 = 0x02;
    const ACK: u8 = 0x10;
    const PSH_ACK: u8 = 0x18;
    let (mut cseq, mut sseq) = (1000u32, 5000u32);
    let mut out = Vec::new();
    // Global header: magic, v2.4, UTC, snaplen, LINKTYPE_RAW (101).
    out.extend_from_slice(&0xa1b2_c3d4u32.to_le_bytes());
    out.extend_from_slice(&2u16.to_le_bytes());
    out.extend_from_slice(&4u16.to_le_bytes());
    out.extend_from_slice(&[0; 8]);
    out.extend_from_slice(&65535u32.to_le_bytes());
    out.extend_from_slice(&101u32.to_le_bytes());
    let mut usec = 0u32;
    let mut packet =
        |out: &mut Vec<u8>, from_client: bool, flags: u8, seq: u32, ack: u32, data: &[u8]| {
            let (sport, dport) = if from_client {
                (client_port, server_port)
            } else {
                (server_port, client_port)
            };
            let total = 20 + 20 + data.len();
            let mut ip = vec![
                0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, 6, 0, 0, 127, 0, 0, 1, 127, 0, 0, 1,
            ];
            ip[2..4].copy_from_slice(&(total as u16).to_be_bytes());
            let sum = ip
                .chunks(2)
                .map(|c| u16::from_be_bytes([c[0], c[1]]) as u32)
                .sum::<u32>();
            let sum = !(((sum & 0xFFFF) + (sum >> 16)) as u16);
            ip[10..12].copy_from_slice(&sum.to_be_bytes());
            let mut tcp = Vec::with_capacity(20);
            tcp.extend_from_slice(&sport.to_be_bytes());
            tcp.extend_from_slice(&dport.to_be_bytes());
            tcp.extend_from_slice(&seq.to_be_bytes());
            tcp.extend_from_slice(&ack.to_be_bytes());
            tcp.extend_from_slice(&[0x50, flags, 0xFF, 0xFF, 0, 0, 0, 0]);
            usec += 100;
            out.extend_from_slice(&0u32.to_le_bytes());
            out.extend_from_slice(&usec.to_le_bytes());
            out.extend_from_slice(&(total as u32).to_le_bytes());
            out.extend_from_slice(&(total as u32).to_le_bytes());
            out.extend_from_slice(&ip);
            out.extend_from_slice(&tcp);
            out.extend_from_slice(data);
        };
    packet(&mut out, true, SYN, cseq - 1, 0, &[]);
    packet(&mut out, false, SYN | ACK, sseq - 1, cseq, &[]);
    packet(&mut out, true, ACK, cseq, sseq, &[]);
    for (from_client, bytes) in transcript {
        for seg in bytes.chunks(1448) {
            if *from_client {
                packet(&mut out, true, PSH_ACK, cseq, sseq, seg);
                cseq += seg.len() as u32;
            } else {
                packet(&mut out, false, PSH_ACK, sseq, cseq, seg);
                sseq += seg.len() as u32;
            }
        }
    }
    out
}
