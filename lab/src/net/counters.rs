//! The kernel's own SNMP and netstat counters of a namespace.

use std::collections::BTreeMap;

use super::{NetPair, Side};

impl NetPair {
    /// /proc/net/snmp and /proc/net/netstat as seen inside `side`, keyed
    /// "Tcp.RetransSegs", "TcpExt.TCPTimeouts", ... (not `nstat`: its history
    /// file is shared between namespaces).
    pub fn counters(&self, side: Side) -> Counters {
        let text = self.exec(side, &["cat", "/proc/net/snmp", "/proc/net/netstat"]);
        parse_proc_net_counters(&text)
    }
}

// ---- kernel counters ---------------------------------------------------------------

/// Kernel SNMP/netstat counters of one namespace, "Group.Name" → value.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counters(pub BTreeMap<String, u64>);

impl Counters {
    /// A counter's value; panics on a name the kernel does not have (a typo
    /// would otherwise read as a silent 0).
    pub fn get(&self, name: &str) -> u64 {
        *self
            .0
            .get(name)
            .unwrap_or_else(|| panic!("no counter {name}"))
    }
}

/// `after - before` for every counter of `after` (0 where a counter went back).
pub fn delta(before: &Counters, after: &Counters) -> Counters {
    Counters(
        after
            .0
            .iter()
            .map(|(k, &v)| (k.clone(), v.saturating_sub(*before.0.get(k).unwrap_or(&0))))
            .collect(),
    )
}

/// Parse /proc/net/snmp and /proc/net/netstat text: each group is a line of
/// names followed by a line of values, both starting with "Group:". Signed
/// values (only Tcp.MaxConn, constant -1) are left out.
pub fn parse_proc_net_counters(text: &str) -> Counters {
    let mut map = BTreeMap::new();
    let mut lines = text.lines();
    while let (Some(names), Some(values)) = (lines.next(), lines.next()) {
        let (group, names) = names.split_once(':').expect("Group: header line");
        let (group2, values) = values.split_once(':').expect("Group: value line");
        assert_eq!(group, group2, "unpaired lines in /proc/net counters");
        for (name, value) in names.split_whitespace().zip(values.split_whitespace()) {
            if let Ok(v) = value.parse::<u64>() {
                map.insert(format!("{group}.{name}"), v);
            }
        }
    }
    Counters(map)
}
