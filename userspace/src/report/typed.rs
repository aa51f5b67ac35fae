//! The one place the report turns a record's JSON into its record type
//! (`crate::records`): `model` dispatches each whole record by its `type` and
//! hands the family models typed records; nothing past here walks a `Value`.
//! Before it, only the envelope is read as written (`model::envelope`: `type`,
//! `ts`, `run`, `seqno`, `schema`, parts), and the `start` record's `schema`
//! is checked there first (`run::run_info`): its body is read here after.
//!
//! Compatibility policy. Readers skip fields they do not know (serde's
//! default), so a newer stream reads as is. What an older schema wrote
//! otherwise, its record type reads itself, so that every reader of the
//! stream (a replayed recording too) reads it alike: schema 1's histogram
//! triples (`hist/record.rs`), and schema 1 and 2's `tcp_rtt`, whose
//! connection was `peer`, `peer_port`, `local_port` and no local address
//! (`records::tcp`: it reads as schema 3's from `0.0.0.0` or `::`, and the
//! report keys a peer without its local address, so it still meets its
//! connection's `tcp_retransmit` records, see `network::TcpPeer`). An older
//! stream may also lack fields that were added over time (schema 1 streams,
//! and schema 2 streams of earlier builds): a record is first deserialized
//! strictly; when that fails, the
//! fields in [`ADDED`] that it lacks are filled with their "absent" value (0
//! for a counter, `false` for a flag, an empty histogram, object, list or
//! string, a `start`'s filters limiting nothing) and it is deserialized
//! again. Those are exactly the fields the report always read as "0 /
//! nothing when missing", so the figures do not change. A record
//! that still does not fit its type (an identifying field missing, a value of
//! the wrong type) is not dropped silently: the caller counts it by type in
//! `StreamHealth::unreadable`, which the report's stream health lists next
//! to the record types it does not know. Its line is not a bad line: it is
//! a JSON record, and "bad lines" count what is not one (a `stall` the
//! episode pairing refuses is the one exception, as before).

use serde::Serialize;
use serde_json::{Map, Value, json};

use crate::records::{AnyRecord, Record};

/// Per record type, the fields an older stream may lack, with the value that
/// means "absent". Identifying fields (`dev`, `op`, `iface`, `daddr`, ...) are
/// never filled: a record without them cannot be placed.
const ADDED: &[(&str, &[&str])] = &[
    // The first builds (block only) wrote no kernel clock rate and no filters.
    ("start", &["kernel_hz", "kernel_hz_source", "filters"]),
    (
        "block",
        &[
            "bios",
            "requeues",
            "errors",
            "completions_unseen",
            "interval_ms",
            "count",
            "bytes",
            "inflight_now",
            "latency_us",
            "tag_wait_us",
            "queue_us",
            "device_us",
            "inflight",
            "queue_limit",
        ],
    ),
    (
        "netdev",
        &[
            "interval_ms",
            "qdisc_untimed",
            "tx_timeouts",
            "tx_stalls",
            "tx_busy",
            "qdisc_us",
            "xmit_us",
            "rx_us",
        ],
    ),
    (
        "tcp_rtt",
        &[
            "interval_ms",
            "retransmits",
            "retrans_segs",
            "rtos",
            "fast_retransmits",
            "tail_loss_probes",
            "syn_retransmits",
            "peer_table_full",
            "srtt_us",
        ],
    ),
    ("lost", &["interval_ms", "by_source"]),
    ("stop", &["elapsed_ms", "records", "lost", "programs"]),
    (
        "sql_instance",
        &[
            "netns",
            "tds_ports",
            "ag_ports",
            "files",
            "files[].disks",
            "disk_roles",
        ],
    ),
];

/// The "absent" value of a field in [`ADDED`], by what the field holds.
fn absent(field: &str) -> Value {
    match field {
        "latency_us" | "tag_wait_us" | "queue_us" | "device_us" | "inflight" | "qdisc_us"
        | "xmit_us" | "rx_us" | "srtt_us" => {
            json!({"count": 0, "mean": null})
        }
        "queue_limit" | "disk_roles" | "by_source" | "records" | "lost" => {
            Value::Object(Map::new())
        }
        "tds_ports" | "ag_ports" | "files" | "files[].disks" | "programs" => {
            Value::Array(Vec::new())
        }
        "filters" => json!({"ports": [], "netns": [], "ifaces": []}),
        "kernel_hz_source" => Value::String(String::new()),
        "peer_table_full" => Value::Bool(false),
        _ => json!(0),
    }
}

/// `r` as the record type `kind` names, under the policy above: None for a
/// type this version does not know, `Some(None)` for a record that does not
/// fit (the caller counts it as unreadable).
pub fn read(kind: &str, r: &Value) -> Option<Option<AnyRecord>> {
    match AnyRecord::read(kind, r)? {
        Ok(record) => Some(Some(record)),
        Err(_) => Some(filled(kind, r).and_then(|f| AnyRecord::read(kind, &f)?.ok())),
    }
}

/// `r` as record type `T`, under the policy above; `None` when it does not fit.
pub fn typed<T: Record>(r: &Value) -> Option<T> {
    T::deserialize(r)
        .ok()
        .or_else(|| T::deserialize(&filled(T::TYPE, r)?).ok())
}

/// `r` with the fields [`ADDED`] lists for `kind` that it lacks filled with
/// their absent values; None when none was missing (nothing to try again).
fn filled(kind: &str, r: &Value) -> Option<Value> {
    let fields = ADDED
        .iter()
        .find(|(added_to, _)| *added_to == kind)
        .map(|(_, fields)| *fields)?;
    let mut filled = r.clone();
    let mut changed = false;
    for field in fields {
        changed |= fill(&mut filled, field, absent(field));
    }
    changed.then_some(filled)
}

/// Inserts `value` at `path` where it is missing: `a` in the record, `a[].b`
/// in each object of the record's array `a`. True when anything was inserted.
fn fill(r: &mut Value, path: &str, value: Value) -> bool {
    let Some(o) = r.as_object_mut() else {
        return false;
    };
    match path.split_once("[].") {
        Some((array, rest)) => match o.get_mut(array).and_then(Value::as_array_mut) {
            Some(items) => items.iter_mut().fold(false, |changed, item| {
                fill(item, rest, value.clone()) | changed
            }),
            None => false,
        },
        None if o.contains_key(path) => false,
        None => {
            o.insert(path.to_string(), value);
            true
        }
    }
}

/// The counters of a typed object by the names the records give them (its
/// own serialization: e.g. `LinkCounters`, whose fields a macro declares).
pub fn named_counts<T: Serialize>(t: &T) -> Vec<(String, u64)> {
    match serde_json::to_value(t) {
        Ok(Value::Object(m)) => m
            .into_iter()
            .filter_map(|(k, v)| Some((k, v.as_u64()?)))
            .collect(),
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::records::block::BlockRecord;
    use crate::records::netdev::NetdevRecord;
    use crate::records::run::StartRecord;
    use crate::report::fixtures::{
        HOST, RUN, as_v2, assert_valid, block, hist, retransmit, schema_2_validator,
        schema_validator, start, ts,
    };
    use crate::report::model::Report;

    /// A stream of schema 2 (as its writer wrote it: `tcp_rtt` without the
    /// local address, the remote end as `peer`) and the same as schema 3
    /// writes it: one connection, whose `tcp_rtt` and `tcp_retransmit`
    /// records the report puts on one row.
    #[test]
    fn a_tcp_rtt_of_schema_2_or_3_meets_its_connections_retransmits() {
        let rtt = json!({"ts": ts(1.0), "host": HOST, "type": "tcp_rtt",
            "netns": 4026531840u64, "family": "ipv4",
            "peer": "10.0.0.9", "peer_port": 50000, "local_port": 1433,
            "interval_ms": 1000, "srtt_us": hist(json!([]), 0.0), "retransmits": 1,
            "retrans_segs": 1, "rtos": 1, "fast_retransmits": 0, "tail_loss_probes": 0,
            "syn_retransmits": 0, "peer_table_full": false});
        let v2 = as_v2(
            &[start(), rtt, retransmit(1.0, 50000, 51, true, 204.0)],
            RUN,
            0,
        );
        let mut v3 = v2.clone();
        for r in &mut v3 {
            r["schema"] = json!(3);
            if r["type"] == "tcp_rtt" {
                let o = r.as_object_mut().unwrap();
                for (was, now) in [
                    ("peer", "daddr"),
                    ("peer_port", "dport"),
                    ("local_port", "sport"),
                ] {
                    let v = o.remove(was).unwrap();
                    o.insert(now.into(), v);
                }
                o.insert("saddr".into(), json!("10.0.0.1"));
            }
        }
        for (stream, contract) in [(&v2, schema_2_validator()), (&v3, schema_validator())] {
            stream.iter().for_each(|r| assert_valid(&contract, r));
            let r = Report::from_records(stream).unwrap();
            assert!(r.stream.unreadable.is_empty(), "{:?}", r.stream.unreadable);
            let peers: Vec<_> = r
                .peers
                .iter()
                .map(|p| (p.label(), p.rtos, p.events))
                .collect();
            assert_eq!(peers, [(":1433 with 10.0.0.9:50000".to_string(), 1, 1)]);
        }
    }

    #[test]
    fn an_older_block_record_reads_with_its_later_fields_absent() {
        let mut r = block(1.0, "sda", "read", json!([[1.024, 1.087, 3]]), json!([]));
        for field in ["completions_unseen", "requeues", "bios", "tag_wait_us"] {
            r.as_object_mut().unwrap().remove(field);
        }
        let b: BlockRecord = typed(&r).expect("filled");
        assert_eq!(
            (b.count, b.completions_unseen, b.requeues, b.bios),
            (3, 0, 0, 0)
        );
        assert_eq!(b.tag_wait_us.count, 0);
        assert_eq!(b.latency_us.count, 3);
    }

    #[test]
    fn an_older_netdev_record_reads_without_its_later_timings() {
        let r = json!({"ts": ts(1.0), "type": "netdev", "iface": "eth0", "ifindex": 2,
            "netns": 1, "interval_ms": 1000, "tx_bytes": 10,
            "qdisc_us": {"count": 0, "mean": null, "buckets": []}});
        let n: NetdevRecord = typed(&r).expect("filled");
        assert_eq!((n.tx_bytes, n.tx_busy, n.rx_us.count), (Some(10), 0, 0));
    }

    /// The first builds (block only) wrote `start` without the kernel's
    /// clock rate and the filters: it reads, limited to nothing.
    #[test]
    fn a_start_of_the_first_builds_reads_without_its_later_fields() {
        let mut s = start();
        for field in ["kernel_hz", "kernel_hz_source", "filters"] {
            s.as_object_mut().unwrap().remove(field);
        }
        let t: StartRecord = typed(&s).expect("filled");
        assert_eq!((t.kernel_hz, t.filters.ports.len()), (0, 0));
        let r = Report::from_records(&[s]).unwrap();
        assert!(r.stream.unreadable.is_empty());
        assert_eq!((r.run.kernel.as_str(), r.run.interval_ms), ("6.18.0", 1000));
        assert!(r.run.filters.is_empty());
    }

    /// A `start` whose body does not fit is counted; the run is still
    /// reported from its envelope, what the body says unknown.
    #[test]
    fn a_start_that_does_not_fit_is_counted_and_its_run_still_reported() {
        let mut s = start();
        s["families"] = json!("block");
        let r = Report::from_records(&[s]).unwrap();
        assert_eq!(r.stream.unreadable.get("start"), Some(&1));
        assert_eq!(
            (r.run.host.as_str(), r.run.kernel.as_str()),
            ("db-01", "unknown")
        );
    }

    #[test]
    fn a_record_that_does_not_fit_is_counted_unreadable_not_dropped() {
        let mut no_dev = block(1.0, "sda", "read", json!([[1.024, 1.087, 3]]), json!([]));
        no_dev.as_object_mut().unwrap().remove("dev");
        assert!(typed::<BlockRecord>(&no_dev).is_none());
        let mut bad_op = block(1.0, "sda", "read", json!([]), json!([]));
        bad_op["op"] = json!(7);
        let r = Report::from_records(&[start(), no_dev, bad_op]).unwrap();
        assert_eq!(r.stream.unreadable.get("block"), Some(&2));
        assert_eq!(r.stream.bad_lines, 0);
        assert!(r.disks.is_empty());
    }
}
