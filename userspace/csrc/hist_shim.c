/* Host build of the kernel-side bucket math (ebpf/include/hist.h), linked into
 * the Rust crate so that hist.rs is tested against the C code itself. */
#include "hist.h"

unsigned int stalltrace_c_hist_bucket_index(unsigned long long value)
{
	return hist_bucket_index(value);
}
