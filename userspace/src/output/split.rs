//! Lines at most MAX_LINE_BYTES long: what log shippers take whole with their
//! default settings. rsyslog is the strictest: its maxMessageSize (8096 bytes)
//! holds the syslog header too when it forwards, and it cuts what is longer
//! without a word (tests/shipping.rs measured an 8191-byte line arrive as 8036
//! bytes with host name "vm"); Fluent Bit's tail stops at 32 KiB; journald
//! splits at 48 KiB.
//!
//! Histograms (schema 2) keep interval records far below the limit; what can
//! still grow past it is a record listing things (an instance's files, a stop
//! record's programs). Such a record is written as consecutive parts, each a
//! whole record with every field, except that its largest top-level array is
//! divided among them (`part`, `parts`, `split`; docs/schema.json).

use serde::Serialize;
use serde_json::{Map, Value};

/// What the envelope adds to a part beyond its body: `part`, `parts` and
/// `split` with their values (a field name of up to 40 bytes).
const PART_FIELDS_BYTES: usize = 96;

/// A record's body cut into parts that fit `budget` bytes of body each: the
/// parts' bodies, or None when the body has no array whose division helps.
pub fn split_body(body: &Map<String, Value>, budget: usize) -> Option<Vec<Map<String, Value>>> {
    let (field, items) = body
        .iter()
        .filter_map(|(k, v)| Some((k, v.as_array()?)))
        .max_by_key(|(_, items)| serialized_len(*items))?;
    if items.len() < 2 {
        return None;
    }
    let mut rest = body.clone();
    rest.remove(field);
    let room = budget.checked_sub(serialized_len(&rest) + field.len() + PART_FIELDS_BYTES)?;
    let mut chunks: Vec<Vec<Value>> = vec![Vec::new()];
    let mut used = 2; // the brackets
    for item in items {
        // An item longer than the room alone still gets a part of its own
        // (over the line: the writer warns when it writes it).
        let len = serialized_len(item) + 1;
        let chunk = chunks.last_mut().expect("one chunk at least");
        if !chunk.is_empty() && used + len > room {
            chunks.push(Vec::new());
            used = 2;
        }
        used += len;
        chunks.last_mut().expect("just pushed").push(item.clone());
    }
    if chunks.len() < 2 {
        return None;
    }
    let parts = chunks.len();
    Some(
        chunks
            .into_iter()
            .enumerate()
            .map(|(i, chunk)| {
                let mut part = rest.clone();
                part.insert(field.clone(), Value::Array(chunk));
                part.insert("part".into(), (i + 1).into());
                part.insert("parts".into(), parts.into());
                part.insert("split".into(), field.as_str().into());
                part
            })
            .collect(),
    )
}

fn serialized_len(v: &impl Serialize) -> usize {
    serde_json::to_vec(v).map_or(0, |b| b.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_largest_array_is_divided_and_every_other_field_repeated() {
        let files: Vec<Value> = (0..400)
            .map(|i| json!({"path": format!("/var/opt/mssql/data/db{i}.mdf"), "fiemap": true}))
            .collect();
        let body = json!({"pid": 42, "ports": [1433, 1434], "files": files});
        let parts = split_body(body.as_object().unwrap(), 8000).unwrap();
        assert!(parts.len() >= 2);
        let mut joined = Vec::new();
        for (i, p) in parts.iter().enumerate() {
            assert!(serialized_len(p) <= 8000, "part {i}: {}", serialized_len(p));
            assert_eq!(
                (p["part"].as_u64(), p["parts"].as_u64()),
                (Some(i as u64 + 1), Some(parts.len() as u64))
            );
            assert_eq!(
                (&p["split"], &p["pid"], &p["ports"]),
                (&json!("files"), &json!(42), &json!([1433, 1434]))
            );
            joined.extend(p["files"].as_array().unwrap().iter().cloned());
        }
        assert_eq!(Value::Array(joined), body["files"]);
    }

    #[test]
    fn a_body_without_a_divisible_array_is_not_split() {
        let one = json!({"files": [{"path": "x".repeat(9000)}]});
        assert!(split_body(one.as_object().unwrap(), 8000).is_none());
        let none = json!({"text": "y".repeat(9000)});
        assert!(split_body(none.as_object().unwrap(), 8000).is_none());
    }
}
