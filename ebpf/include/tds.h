/* SPDX-License-Identifier: GPL-2.0 OR MIT */
/*
 * tds.h - the TDS constants, and the kernel's decision on the first bytes of
 * a SQL Server worker's send: a server TDS packet header (with the session's
 * SPID), a TLS record (the session is encrypted), the SMP header MARS wraps
 * a TDS packet in, or neither.
 *
 * Written once, in C, for both sides: sqlserver.bpf.c calls
 * tds_classify_send() on the bytes it read; userspace/build.rs compiles this
 * header for the host (userspace/csrc/tds_shim.c) and generates the Rust
 * constants from it (bindgen), so the Rust tests check this very code against
 * tshark on a real SQL Server capture, against the Rust stream parser
 * (userspace/src/tds_check.rs, which uses these constants), and against
 * the simulator's encoder (sim/src/tds, whose own constants are checked equal
 * to these).
 *
 * No BPF helpers, no kernel types, no loops: it is a pure function of at
 * most 8 bytes (MARS: of 8, then of the 8 after the SMP header), and the
 * verifier sees only constant-offset stack reads.
 */
#ifndef STALLTRACE_TDS_H
#define STALLTRACE_TDS_H

#ifndef __VMLINUX_H__
#include <linux/types.h>
#endif

#ifndef __always_inline
#define __always_inline inline __attribute__((always_inline))
#endif

/* A TDS packet header (MS-TDS 2.2.3.1): type, status, big-endian Length
 * (header included), big-endian SPID, packet id, window. */
#define TDS_HEADER_LEN 8

/* MS-TDS 2.2.6.4 caps the negotiated packet size, which bounds Length, at
 * 32,767 (the u16 field itself could say 65,535). */
#define TDS_MAX_PACKET_LEN 32767

/* Packet types (MS-TDS 2.2.3.1.1). */
#define TDS_TYPE_SQL_BATCH 1
#define TDS_TYPE_PRE_TDS7_LOGIN 2
#define TDS_TYPE_RPC 3
#define TDS_TYPE_TABULAR_RESULT 4 /* every server response */
#define TDS_TYPE_ATTENTION 6
#define TDS_TYPE_BULK_LOAD 7
#define TDS_TYPE_FEDAUTH_TOKEN 8
#define TDS_TYPE_TRANSACTION_MANAGER 14
#define TDS_TYPE_LOGIN7 16
#define TDS_TYPE_SSPI 17
#define TDS_TYPE_PRELOGIN 18 /* request and response alike */

/* Status bits (MS-TDS 2.2.3.1.2). */
#define TDS_STATUS_EOM 0x01 /* last packet of the message */
#define TDS_STATUS_IGNORE 0x02 /* client: ignore this message; only with EOM */
#define TDS_STATUS_EVENT_NOTIFICATION 0x04 /* dropped from the spec; old clients send it */
#define TDS_STATUS_RESET_CONNECTION 0x08
#define TDS_STATUS_RESET_CONNECTION_SKIP_TRAN 0x10 /* never together with the above */
#define TDS_STATUS_KNOWN 0x1f

/*
 * A TLS record header: content type, version (3.x for SSL 3.0 .. TLS 1.3),
 * big-endian length. The content types (change_cipher_spec, alert,
 * handshake, application_data) are none of TDS's packet types, so the first
 * byte tells a TLS record from a TDS packet.
 */
#define TLS_RECORD_HEADER_LEN 5
#define TLS_CONTENT_CHANGE_CIPHER_SPEC 0x14
#define TLS_CONTENT_APPLICATION_DATA 0x17
#define TLS_MAX_MINOR_VERSION 4
/* 2^14 bytes of plaintext plus the 2,048 of expansion TLS 1.2 allows (RFC 5246 6.2.3). */
#define TLS_MAX_RECORD_LEN (16384 + 2048)

/*
 * How many bytes TLS adds to one record's plaintext fragment: at least the
 * 16 of an AEAD tag (ChaCha20-Poly1305 in TLS 1.2; TLS 1.3 adds its 1-byte
 * inner content type, AES-GCM in TLS 1.2 its 8-byte explicit nonce), at most
 * a CBC suite's 16-byte IV, 48-byte SHA-384 MAC and 256 bytes of padding.
 * A record holds at most 2^14 bytes of plaintext (RFC 8446 5.1).
 */
#define TLS_MIN_EXPANSION 16
#define TLS_MAX_EXPANSION 320
#define TLS_MAX_FRAGMENT 16384

/*
 * MARS (MS-SMP 2.2.1): once PRELOGIN agreed on it, every TDS packet travels
 * in an SMP DATA packet of the logical session it belongs to, after a
 * 16-byte header: SMID 0x53, flags, little-endian SID, little-endian Length
 * (header included), sequence number, window. 0x53 is none of TDS's packet
 * types nor a TLS content type.
 */
#define SMP_SMID 0x53
#define SMP_HEADER_LEN 16
#define SMP_FLAG_DATA 0x08

enum tds_verdict {
	TDS_NOT_A_HEADER = 0,  /* mid-packet bytes, a client packet, anything else */
	TDS_SERVER_HEADER = 1, /* a tabular result or pre-login header: *spid is set */
	TDS_TLS_RECORD = 2,    /* a TLS record: the session is encrypted */
	TDS_SMP_DATA = 3,      /* an SMP DATA header (MARS): a TDS header follows at SMP_HEADER_LEN */
};

/*
 * What the first bytes of a send are. `b` holds the send's first
 * min(send_len, 8) bytes, and only those are read: a send too short for a
 * header is not one, whatever follows it in memory. For an SMP DATA header
 * the caller classifies the 8 bytes at SMP_HEADER_LEN in turn: only a server
 * TDS header there makes the send a MARS one.
 *
 * A header counts only when every field is one a server can send: a server
 * type (tabular result, pre-login), status bits the spec defines in a
 * combination it allows, and a Length within 8..32767. A wrong SPID would be
 * sticky (the first one wins) while a missed one is retried at the next
 * send, so anything doubtful is not a header. The same rule, for every
 * packet type, is userspace's parse_header().
 */
static __always_inline enum tds_verdict tds_classify_send(const __u8 *b, __u64 send_len,
							   __u16 *spid)
{
	const __u8 resets = TDS_STATUS_RESET_CONNECTION | TDS_STATUS_RESET_CONNECTION_SKIP_TRAN;
	__u16 len;
	__u8 status;

	if (send_len < TLS_RECORD_HEADER_LEN)
		return TDS_NOT_A_HEADER;
	if (b[0] >= TLS_CONTENT_CHANGE_CIPHER_SPEC && b[0] <= TLS_CONTENT_APPLICATION_DATA) {
		len = ((__u16)b[3] << 8) | b[4];
		if (b[1] == 3 && b[2] <= TLS_MAX_MINOR_VERSION && len <= TLS_MAX_RECORD_LEN)
			return TDS_TLS_RECORD;
		return TDS_NOT_A_HEADER;
	}
	if (send_len < TDS_HEADER_LEN)
		return TDS_NOT_A_HEADER;
	if (b[0] == SMP_SMID) {
		/* SYN, ACK and FIN carry no TDS; a DATA packet carries one TDS packet. */
		__u32 smp_len = b[4] | ((__u32)b[5] << 8) | ((__u32)b[6] << 16) | ((__u32)b[7] << 24);

		if (b[1] == SMP_FLAG_DATA && smp_len >= SMP_HEADER_LEN + TDS_HEADER_LEN &&
		    smp_len <= SMP_HEADER_LEN + TDS_MAX_PACKET_LEN)
			return TDS_SMP_DATA;
		return TDS_NOT_A_HEADER;
	}
	if (b[0] != TDS_TYPE_TABULAR_RESULT && b[0] != TDS_TYPE_PRELOGIN)
		return TDS_NOT_A_HEADER;
	status = b[1];
	if (status & ~TDS_STATUS_KNOWN)
		return TDS_NOT_A_HEADER;
	if ((status & TDS_STATUS_IGNORE) && !(status & TDS_STATUS_EOM))
		return TDS_NOT_A_HEADER;
	if ((status & resets) == resets)
		return TDS_NOT_A_HEADER;
	len = ((__u16)b[2] << 8) | b[3];
	if (len < TDS_HEADER_LEN || len > TDS_MAX_PACKET_LEN)
		return TDS_NOT_A_HEADER;
	*spid = ((__u16)b[4] << 8) | b[5];
	return TDS_SERVER_HEADER;
}

/*
 * Whether a worker's send whose first bytes are `b` can be the TLS record of
 * an SSL_write of `plain_len` plaintext bytes: an application-data record
 * whose length is the write's first fragment plus what TLS adds to one. The
 * only evidence besides the thread and the order that ties a plaintext to a
 * socket, so it is exact: a send that fits no write leaves the SPID unknown.
 */
static __always_inline int tls_record_fits_write(const __u8 *b, __u64 send_len, __u64 plain_len)
{
	__u64 first = plain_len < TLS_MAX_FRAGMENT ? plain_len : TLS_MAX_FRAGMENT;
	__u64 len;

	if (send_len < TLS_RECORD_HEADER_LEN || b[0] != TLS_CONTENT_APPLICATION_DATA || b[1] != 3 ||
	    b[2] > TLS_MAX_MINOR_VERSION)
		return 0;
	len = ((__u64)b[3] << 8) | b[4];
	return len >= first + TLS_MIN_EXPANSION && len <= first + TLS_MAX_EXPANSION;
}

#endif /* STALLTRACE_TDS_H */
