//! Loss accounting: every drop the kernel side counts (`lost_counts`, indexed by
//! `enum lost_source`) and every run the kernel skipped because a program was
//! already running on that CPU (recursion misses).

use std::collections::HashMap;

use aya::Ebpf;
use aya::maps::{MapData, PerCpuArray};

use super::stats::program_stats;
use crate::abi;

/// Record name of each `enum lost_source` value.
pub fn source_name(source: u32) -> &'static str {
    match source {
        abi::LOST_SLOW_IO_RINGBUF => "slow_io_ringbuf_full",
        abi::LOST_BIO_TRACK_FULL => "bio_table_full",
        abi::LOST_RQ_TRACK_FULL => "request_table_full",
        abi::LOST_BLOCK_STATS_FULL => "block_stats_entry_unavailable",
        abi::LOST_DISK_STATE_FULL => "disk_table_full",
        abi::LOST_BIO_CHAIN_TRUNCATED => "bio_chain_truncated",
        abi::LOST_STALE_SLOT => "stale_slot_displaced",
        abi::LOST_TCP_RINGBUF => "retransmit_ringbuf_full",
        abi::LOST_NETDEV_STATS_FULL => "netdev_stats_entry_unavailable",
        abi::LOST_TCP_RETRANS_UNSEEN => "retransmit_unseen_segs",
        abi::LOST_TLS_AMBIGUOUS => "tls_write_ambiguous",
        abi::LOST_TLS_UNPAIRED => "tls_write_unpaired",
        abi::LOST_TLS_CONFLICT => "tls_spid_conflict",
        abi::LOST_TLS_GAVE_UP => "tls_session_given_up",
        abi::LOST_SQL_REQUEST_RINGBUF => "request_ringbuf_full",
        abi::LOST_SQL_REQUEST_UNTIMED => "request_untimed",
        abi::LOST_TLS_WRITE_EVICTED => "tls_write_evicted",
        _ => "unknown",
    }
}

/// Running totals of one family's losses; `deltas` gives what is new since the last call.
pub struct LostCounters {
    family: &'static str,
    counts: PerCpuArray<MapData, u64>,
    previous: Vec<u64>,
    previous_misses: HashMap<String, u64>,
}

impl LostCounters {
    pub fn take(family: &'static str, ebpf: &mut Ebpf) -> anyhow::Result<Self> {
        let map = ebpf
            .take_map("lost_counts")
            .ok_or_else(|| anyhow::anyhow!("{family} object has no lost_counts map"))?;
        Ok(Self {
            family,
            counts: PerCpuArray::try_from(map)?,
            previous: vec![0; abi::LOST_SOURCE_COUNT as usize],
            previous_misses: HashMap::new(),
        })
    }

    /// `(source, newly lost)` for every source with new losses, e.g. `block.request_table_full`.
    pub fn deltas(&mut self, ebpf: &Ebpf) -> Vec<(String, u64)> {
        let mut out = Vec::new();
        for source in 0..abi::LOST_SOURCE_COUNT {
            let Ok(per_cpu) = self.counts.get(&source, 0) else {
                continue;
            };
            let total: u64 = per_cpu.iter().sum();
            let prev = &mut self.previous[source as usize];
            if total > *prev {
                // netdev's statistics entries are also created by the tcp object's
                // tcp_probe (it ends netdev's receive path): a loss of one is netdev's.
                let family = if source == abi::LOST_NETDEV_STATS_FULL {
                    "netdev"
                } else {
                    self.family
                };
                out.push((format!("{family}.{}", source_name(source)), total - *prev));
            }
            *prev = total;
        }
        for prog in program_stats(ebpf) {
            let prev = self
                .previous_misses
                .entry(prog.program.clone())
                .or_default();
            if prog.recursion_misses > *prev {
                out.push((
                    format!("{}.recursion_miss.{}", self.family, prog.program),
                    prog.recursion_misses - *prev,
                ));
            }
            *prev = prog.recursion_misses;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_lost_source_is_named() {
        for s in 0..abi::LOST_SOURCE_COUNT {
            assert_ne!(
                source_name(s),
                "unknown",
                "enum lost_source value {s} has no name"
            );
        }
    }
}
