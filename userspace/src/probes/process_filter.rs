//! The kernel side of `--pid`, `--comm` and `--container`
//! (`ebpf/include/process_filter.bpf.h`, included by the block and tcp
//! objects): its load-time constants and its maps, filled before any
//! program attaches.

use aya::Ebpf;
use aya::maps::HashMap as BpfHashMap;

use crate::host::process_filter::{COMM_LEN, ProcessFilter};

/// The constants that switch each kind of check on (0: the verifier drops it).
pub fn load_globals(filter: &ProcessFilter) -> [(&'static str, u64); 3] {
    [
        ("filter_tgids", u64::from(!filter.tgids.is_empty())),
        ("filter_comms", u64::from(!filter.comms.is_empty())),
        (
            "filter_mntns",
            u64::from(!filter.mount_namespaces.is_empty()),
        ),
    ]
}

/// Fills the object's filter maps from `filter`.
pub fn fill(ebpf: &mut Ebpf, filter: &ProcessFilter) -> Result<(), String> {
    fn map<'a>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut aya::maps::Map, String> {
        ebpf.map_mut(name)
            .ok_or_else(|| format!("the object has no map {name}"))
    }
    if !filter.tgids.is_empty() {
        let mut tgids: BpfHashMap<_, u32, u8> =
            BpfHashMap::try_from(map(ebpf, "process_tgid_filter")?).map_err(|e| e.to_string())?;
        for tgid in &filter.tgids {
            tgids.insert(tgid, 1, 0).map_err(|e| e.to_string())?;
        }
    }
    if !filter.comms.is_empty() {
        let mut comms: BpfHashMap<_, [u8; COMM_LEN], u8> =
            BpfHashMap::try_from(map(ebpf, "process_comm_filter")?).map_err(|e| e.to_string())?;
        for comm in &filter.comms {
            // Zero-padded, as the kernel keeps a task's comm.
            let mut key = [0u8; COMM_LEN];
            key[..comm.len()].copy_from_slice(comm.as_bytes());
            comms.insert(key, 1, 0).map_err(|e| e.to_string())?;
        }
    }
    if !filter.mount_namespaces.is_empty() {
        let mut namespaces: BpfHashMap<_, u32, u8> =
            BpfHashMap::try_from(map(ebpf, "process_mntns_filter")?).map_err(|e| e.to_string())?;
        for ns in &filter.mount_namespaces {
            namespaces.insert(ns, 1, 0).map_err(|e| e.to_string())?;
        }
    }
    Ok(())
}
