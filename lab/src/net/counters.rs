//! The kernel's own SNMP and netstat counters of a namespace.

use std::collections::BTreeMap;

use super::{NetPair, Side};

impl NetPair {
    /// /proc/net/snmp and /proc/net/netstat as seen inside `side`, keyed
    /// "Tcp.RetransSegs", "TcpExt.TCPTimeouts", ... (not `nstat`: its history
    /// file is shared between namespaces).
    pub fn counters(&self, side: Side) -> Counters {
        self.try_counters(side).unwrap_or_else(|e| panic!("{e:#}"))
    }

    /// `counters`, an error if they cannot be read.
    pub fn try_counters(&self, side: Side) -> anyhow::Result<Counters> {
        let text = self.try_exec(side, &["cat", "/proc/net/snmp", "/proc/net/netstat"])?;
        Ok(parse_proc_net_counters(&text))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_are_read_by_group_and_name() {
        let text = "Ip: Forwarding DefaultTTL\nIp: 1 64\n\
            Tcp: RtoAlgorithm RtoMin RtoMax MaxConn ActiveOpens PassiveOpens AttemptFails \
            EstabResets CurrEstab InSegs OutSegs RetransSegs InErrs OutRsts InCsumErrors\n\
            Tcp: 1 200 120000 -1 3 2 0 0 1 4711 4242 7 0 1 0\n\
            Udp: InDatagrams\nUdp: 5\n";
        let c = parse_proc_net_counters(text);
        assert_eq!((c.get("Tcp.InSegs"), c.get("Tcp.OutSegs")), (4711, 4242));
        assert_eq!(c.0.get("Tcp.MaxConn"), None, "signed: left out");
        assert_eq!(c.get("Udp.InDatagrams"), 5);
    }
}
