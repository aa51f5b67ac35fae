//! Keeps docs/schema.json honest: every record type the binary emits is built
//! here from the real record structs, written through the real `JsonWriter`
//! envelope, and validated against the schema generated from those types
//! (records/schema.rs; a test there holds docs/schema.json to it); and the
//! schema is shown to reject what it must (unknown fields, missing fields, a
//! malformed `ts`).

mod block;
mod netdev;
mod run;
mod sqlserver;
mod stall;
mod tcp;

use serde_json::{Value, json};

use crate::hist::{Histogram, HistogramRecord};
use crate::host::clock::{Clock, monotonic_ns};
use crate::output::{JsonWriter, SharedBuffer};
use crate::records::{self, RECORD_TYPES, SCHEMA_VERSION};

/// The envelope's fields a record may lack: those of a split record.
const SPLIT_FIELDS: [&str; 3] = ["part", "parts", "split"];

fn schema() -> Value {
    records::schema::generate()
}

fn validator() -> jsonschema::Validator {
    jsonschema::draft202012::options()
        .should_validate_formats(true)
        .build(&schema())
        .expect("the generated schema does not compile")
}

/// A record definition's top-level fields that may be absent.
fn optional_fields(schema: &Value, kind: &str) -> Vec<String> {
    let def = &schema["$defs"][kind];
    let required = def["required"].as_array().unwrap();
    def["properties"]
        .as_object()
        .unwrap()
        .keys()
        .filter(|k| !required.iter().any(|r| r == k.as_str()))
        .cloned()
        .collect()
}

/// Whether the record type's own struct reads `record` back (the envelope's
/// fields are not its own and are ignored): what a reader with these types
/// accepts as a whole record.
fn reads(record: &Value) -> bool {
    let kind = record["type"].as_str().unwrap();
    match records::AnyRecord::read(kind, record) {
        Some(read) => read.is_ok(),
        None => panic!("no reader for record type {kind}"),
    }
}

/// Writes each record it is handed through the writer, at one time.
struct FamilyRecords<'a> {
    w: &'a mut JsonWriter,
    ts: String,
}

impl records::Visit for FamilyRecords<'_> {
    fn record<R: records::Record>(&mut self, record: &R) {
        self.w.emit(&self.ts, record).unwrap();
    }
}

fn errors(v: &jsonschema::Validator, record: &Value) -> Vec<String> {
    v.iter_errors(record)
        .map(|e| format!("{}: {e}", e.instance_path()))
        .collect()
}

/// A latency histogram as the block family builds it: nanoseconds in, microseconds out.
fn latency_us(values_ns: &[(u64, u64)]) -> HistogramRecord {
    let mut h = Histogram::default();
    for &(v, n) in values_ns {
        h.record(v, n);
    }
    h.to_record(1e-3)
}

/// One realistic instance of every record type, with optional fields both
/// present and absent, exactly as `JsonWriter` writes them. One writer for
/// all: `seqno` runs across the records and `stop` counts them all.
fn emitted_lines() -> Vec<String> {
    let buf = SharedBuffer::default();
    let mut w = JsonWriter::new(Box::new(buf.clone()), "sqlhost-01".into());
    let w = &mut w;
    let clock = Clock::new();

    run::start(w);
    let mut family_records = FamilyRecords {
        w,
        ts: clock.monotonic_to_rfc3339(monotonic_ns()),
    };
    for record in records::family_examples() {
        record.visit(&mut family_records);
    }
    let FamilyRecords { w, .. } = family_records;
    stall::stall(w);
    let by_source = run::lost(w);
    run::heartbeat(w);
    run::stop(w, &by_source);

    let text = buf.text();
    text.lines().map(str::to_string).collect()
}

fn emitted() -> Vec<Value> {
    emitted_lines()
        .iter()
        .map(|l| serde_json::from_str(l).expect("a record line is JSON"))
        .collect()
}

fn first_of(records: &[Value], kind: &str) -> Value {
    records
        .iter()
        .find(|r| r["type"] == kind)
        .unwrap_or_else(|| panic!("no {kind} record built"))
        .clone()
}

#[test]
fn schema_is_a_valid_draft_2020_12_schema() {
    let s = schema();
    assert_eq!(s["$schema"], "https://json-schema.org/draft/2020-12/schema");
    if let Err(e) = jsonschema::meta::validate(&s) {
        panic!("docs/schema.json is not a valid JSON Schema: {e}");
    }
    let types: Vec<&str> = s["$defs"]["record_type"]["enum"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    assert_eq!(types, RECORD_TYPES, "record types in the schema");
    for &t in RECORD_TYPES {
        let def = &s["$defs"][t];
        assert_eq!(def["properties"]["type"]["const"], t, "$defs/{t}");
        assert_eq!(def["additionalProperties"], false, "$defs/{t}");
        assert_eq!(
            def["properties"]["schema"]["const"], SCHEMA_VERSION,
            "$defs/{t}/properties/schema"
        );
    }
}

#[test]
fn every_field_and_shape_is_described() {
    fn walk(node: &Value, path: &str, missing: &mut Vec<String>) {
        let Value::Object(map) = node else {
            if let Value::Array(items) = node {
                for (i, item) in items.iter().enumerate() {
                    walk(item, &format!("{path}/{i}"), missing);
                }
            }
            return;
        };
        for (key, value) in map {
            // Conditions restate properties already described; they need no descriptions.
            if matches!(key.as_str(), "if" | "then" | "else" | "not") {
                continue;
            }
            if key == "properties" || key == "$defs" {
                for (name, sub) in value.as_object().unwrap() {
                    let described = sub
                        .get("description")
                        .and_then(Value::as_str)
                        .is_some_and(|d| !d.trim().is_empty());
                    if !described {
                        missing.push(format!("{path}/{key}/{name}"));
                    }
                }
            }
            walk(value, &format!("{path}/{key}"), missing);
        }
    }
    let mut missing = Vec::new();
    walk(&schema(), "#", &mut missing);
    assert!(missing.is_empty(), "without a description: {missing:#?}");
}

#[test]
fn every_record_the_code_builds_validates() {
    let v = validator();
    let records = emitted();
    for (line, record) in emitted_lines().iter().zip(&records) {
        let errs = errors(&v, record);
        assert!(errs.is_empty(), "{line}\n{errs:#?}");
    }
    for &t in RECORD_TYPES {
        assert!(
            records.iter().any(|r| r["type"] == t),
            "no {t} record checked"
        );
    }
    // Optional fields (those the schema does not require) were checked both
    // present and absent; a split record's fields on the record that splits.
    let s = schema();
    for &t in RECORD_TYPES {
        let of_type: Vec<_> = records.iter().filter(|r| r["type"] == t).collect();
        for field in optional_fields(&s, t) {
            if SPLIT_FIELDS.contains(&field.as_str()) {
                continue;
            }
            assert!(
                of_type.iter().any(|r| r.get(&field).is_some()),
                "{t}.{field} present"
            );
            assert!(
                of_type.iter().any(|r| r.get(&field).is_none()),
                "{t}.{field} absent"
            );
        }
    }
    for field in SPLIT_FIELDS {
        assert!(
            records.iter().any(|r| r.get(field).is_some()),
            "no split record checked ({field})"
        );
    }
}

#[test]
fn the_real_timestamp_formats_match() {
    let v = validator();
    let mut record = first_of(&emitted(), "lost");
    for ts in [
        Clock::now_rfc3339(),
        Clock::new().monotonic_to_rfc3339(monotonic_ns()),
        Clock::new().monotonic_to_rfc3339(0),
    ] {
        record["ts"] = json!(ts);
        assert!(v.is_valid(&record), "{ts}");
    }
}

#[test]
fn a_malformed_ts_fails() {
    let v = validator();
    let good = first_of(&emitted(), "block");
    for ts in [
        "2026-11-21T22:43:51.014898+00:00", // offset instead of Z
        "2026-11-21T22:43:51.014898z",
        "2026-11-21T22:43:51Z",           // no fraction
        "2026-11-21T22:43:51.014Z",       // milliseconds
        "2026-11-21T22:43:51.014898123Z", // nanoseconds
        "2026-11-21 22:43:51.014898Z",    // space separator
        "2026-13-21T22:43:51.014898Z",    // month 13
        "1795473831",
        "",
    ] {
        let mut bad = good.clone();
        bad["ts"] = json!(ts);
        assert!(!v.is_valid(&bad), "ts {ts:?} was accepted");
    }
    let mut bad = good;
    bad["ts"] = json!(1_795_473_831_014_898u64);
    assert!(!v.is_valid(&bad), "numeric ts was accepted");
}

/// Every object in every record is closed: a field the schema does not
/// describe fails, at any depth (records, histograms, queue limits, hook
/// statuses, program costs). A by-name map (`by_source`, `records`,
/// `disk_roles`: a schema for its values, not `additionalProperties: false`)
/// takes any key, but not a value of another shape.
#[test]
fn an_unknown_field_fails_anywhere() {
    fn object_paths(node: &Value, path: Vec<String>, out: &mut Vec<Vec<String>>) {
        match node {
            Value::Object(map) => {
                out.push(path.clone());
                for (k, v) in map {
                    let mut p = path.clone();
                    p.push(k.clone());
                    object_paths(v, p, out);
                }
            }
            Value::Array(items) => {
                for (i, v) in items.iter().enumerate() {
                    let mut p = path.clone();
                    p.push(i.to_string());
                    object_paths(v, p, out);
                }
            }
            _ => {}
        }
    }
    fn at<'a>(node: &'a mut Value, path: &[String]) -> &'a mut Value {
        path.iter().fold(node, |n, key| match n {
            Value::Array(items) => &mut items[key.parse::<usize>().unwrap()],
            _ => &mut n[key.as_str()],
        })
    }
    /// The fields that are by-name maps, anywhere in the schema.
    fn maps(node: &Value, out: &mut Vec<String>) {
        match node {
            Value::Object(map) => {
                if let Some(Value::Object(properties)) = map.get("properties") {
                    for (name, field) in properties {
                        if field
                            .get("additionalProperties")
                            .is_some_and(Value::is_object)
                        {
                            out.push(name.clone());
                        }
                    }
                }
                map.values().for_each(|v| maps(v, out));
            }
            Value::Array(items) => items.iter().for_each(|v| maps(v, out)),
            _ => {}
        }
    }
    let mut map_fields = Vec::new();
    maps(&schema(), &mut map_fields);
    assert!(
        map_fields.iter().any(|m| m == "by_source"),
        "{map_fields:?}"
    );
    let v = validator();
    let mut checked = 0;
    for record in emitted() {
        let mut paths = Vec::new();
        object_paths(&record, Vec::new(), &mut paths);
        for path in paths {
            let is_map = path.last().is_some_and(|f| map_fields.contains(f));
            // An object: no map's value type is, or else its own field fails.
            let value = if is_map {
                json!({"unexpected_field": 1})
            } else {
                json!(1)
            };
            let mut bad = record.clone();
            at(&mut bad, &path)
                .as_object_mut()
                .unwrap()
                .insert("unexpected_field".into(), value);
            assert!(
                !v.is_valid(&bad),
                "{} record: an unknown field at /{} was accepted",
                record["type"],
                path.join("/")
            );
            checked += 1;
        }
    }
    assert!(checked > 50, "{checked}");
}

#[test]
fn a_missing_field_fails() {
    let v = validator();
    let records = emitted();

    let mut block = first_of(&records, "block");
    block.as_object_mut().unwrap().remove("latency_us");
    assert!(
        !v.is_valid(&block),
        "a block record without latency_us was accepted"
    );

    // Every record is numbered, in order, and a top-level field may be
    // missing exactly when the record's own type reads the record without it
    // (the envelope's fields are all required but a split record's).
    for (n, record) in records.iter().enumerate() {
        assert_eq!(record["seqno"], n, "{record}");
    }
    let envelope = ["ts", "host", "type", "schema", "run", "seqno"];
    for record in &records {
        let t = record["type"].as_str().unwrap();
        assert!(reads(record), "{t} record does not read back: {record}");
        for field in record.as_object().unwrap().keys() {
            let mut without = record.clone();
            without.as_object_mut().unwrap().remove(field);
            let optional = if envelope.contains(&field.as_str()) {
                false
            } else {
                SPLIT_FIELDS.contains(&field.as_str()) || reads(&without)
            };
            assert_eq!(
                v.is_valid(&without),
                optional,
                "{t} record without {field}: optional is {optional}"
            );
        }
    }
    // ... and every histogram field.
    for field in [
        "count",
        "mean",
        "p50",
        "p90",
        "p99",
        "max",
        "scale",
        "first_bucket",
        "counts",
    ] {
        let mut bad = first_of(&records, "block");
        bad["device_us"].as_object_mut().unwrap().remove(field);
        assert!(
            !v.is_valid(&bad),
            "a histogram without {field} was accepted"
        );
    }
}

#[test]
fn wrong_values_fail() {
    let v = validator();
    let records = emitted();
    let bad = |kind: &str, edit: &dyn Fn(&mut Value)| {
        let mut r = first_of(&records, kind);
        edit(&mut r);
        assert!(!v.is_valid(&r), "accepted: {r}");
    };
    // A type the schema does not know (not emitted yet) fails.
    bad("lost", &|r| r["type"] = json!("netdev_stall"));
    bad("start", &|r| r["schema"] = json!(1));
    bad("block", &|r| r["run"] = json!("run-1"));
    bad("block", &|r| r["op"] = json!("readwrite"));
    bad("block", &|r| r["count"] = json!(-1));
    bad("block", &|r| r["latency_us"]["p99"] = json!("12"));
    bad("block", &|r| r["latency_us"]["counts"][0] = json!(0));
    bad("block", &|r| r["latency_us"]["first_bucket"] = json!(976));
    // An empty histogram has no statistics.
    bad("block", &|r| r["latency_us"]["count"] = json!(0));
    bad("slow_io", &|r| r["pid"] = json!(-1));
    bad("start", &|r| r["probes"][0]["mode"] = json!("kprobe"));
    bad("start", &|r| r["probes"][1]["via"] = json!("uprobe"));
    bad("lost", &|r| {
        r["by_source"]["block.bio_table_full"] = json!(-1)
    });
    bad("stop", &|r| r["records"]["block"] = json!("12"));
    bad("tcp_retransmit", &|r| r["kind"] = json!("dupack"));
    bad("tcp_retransmit", &|r| r["sport"] = json!(70000));
    bad("tcp_rtt", &|r| r["srtt_us"] = json!(120));
    bad("tcp_rtt", &|r| r["family"] = json!("inet"));
    // Schema 2's spelling of its connection, which the report still reads, is not schema 3's.
    bad("tcp_rtt", &|r| {
        let daddr = r.as_object_mut().unwrap().remove("daddr").unwrap();
        r["peer"] = daddr;
    });
    bad("tcp_rtt", &|r| {
        r.as_object_mut().unwrap().remove("saddr");
    });
    bad("sql_session", &|r| r["event"] = json!("reopened"));
    bad("sql_session", &|r| r["kind"] = json!("replica"));
    bad("tcp_flow", &|r| r["limiter"] = json!("cwnd"));
    bad("tcp_flow", &|r| r["send_mbps"] = json!(-1.0));
}
