/* Host build of the kernel's TDS send classifier (ebpf/include/tds.h), linked
 * into the Rust crate so that the tests run the C code itself: against tshark
 * on a real capture, the Rust parser, and the simulator. */
#include "tds.h"

unsigned int stalltrace_c_tds_classify_send(const __u8 *bytes, __u64 send_len, __u16 *spid)
{
	return tds_classify_send(bytes, send_len, spid);
}

int stalltrace_c_tls_record_fits_write(const __u8 *bytes, __u64 send_len, __u64 plain_len)
{
	return tls_record_fits_write(bytes, send_len, plain_len);
}
