//! docs/schema.json, generated from the record types.
//!
//! Each record's fields and their meanings come from its type and doc
//! comments (schemars); what this file adds is what no record type holds: the
//! envelope every line carries (written by `output::JsonWriter`), the `type`
//! that selects a record's shape, and the split-record fields. Every record
//! object is closed, so a field the code writes and the schema does not
//! describe fails the schema's tests (schema_check/, at the crate root).
//!
//! `cargo run -p stalltrace --example schema > docs/schema.json` writes it;
//! a test fails while the committed file differs from this output.

use schemars::generate::SchemaSettings;
use serde_json::{Map, Value, json};

use super::{MAX_LINE_BYTES, RECORD_TYPES, SCHEMA_VERSION, each_schema};

/// The document's own description: what a reader needs before any record.
const DESCRIPTION: &str = "One JSON object per line, as written by `stalltrace run`. Every record has `ts`, `host`, `type`, `schema`, `run` and `seqno`, so that each line stands alone in a log pipeline; `type` selects the record's own fields, which sit at the same level (there is no nested body). Units are in field names (`_us` microseconds, `_ms` milliseconds, `_ns` nanoseconds). Field names never change meaning; fields may be added; a removal, rename or change of encoding bumps `schema` (2 since histograms name their buckets by index; 3 since every TCP record names its connection with the same six fields, `netns`, `family`, `saddr`, `sport`, `daddr`, `dport`). A record that would be longer than one line is written as consecutive parts (`part`, `parts`, `split`). Every record object is closed (`additionalProperties: false`): a field the code emits and this file does not describe fails validation, on purpose. docs/records.md explains the records in prose. Generated from the record types (userspace/src/records/) by `cargo run -p stalltrace --example schema`.";

/// The envelope's fields, on every record (output/json.rs writes them).
fn envelope() -> Vec<(&'static str, Value, bool)> {
    vec![
        (
            "ts",
            json!({
                "description": "RFC 3339 timestamp in UTC with exactly six fractional digits (microseconds) and a `Z` suffix, e.g. 2026-11-21T22:43:51.014898Z. The end of the interval for interval records, the moment of the event for event records.",
                "type": "string",
                "format": "date-time",
                "pattern": "^[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9]\\.[0-9]{6}Z$"
            }),
            true,
        ),
        (
            "host",
            json!({
                "description": "Host name of the machine traced (/proc/sys/kernel/hostname), `unknown` when it cannot be read.",
                "type": "string",
                "minLength": 1
            }),
            true,
        ),
        ("type", Value::Null, true), // the record's own `const`, below
        (
            "schema",
            json!({
                "const": SCHEMA_VERSION,
                "description": "Version of the record schema, on every record: bumped when a field is removed or changes meaning or encoding. Schema 1 (before 2026-11-23) wrote it on `start` only and histograms as `[low, high, count]` triples; schemas 1 and 2 named a `tcp_rtt`'s connection `peer`, `peer_port`, `local_port`, without its local address; `stalltrace report` reads all three."
            }),
            true,
        ),
        (
            "run",
            json!({
                "type": "string",
                "pattern": "^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$",
                "description": "This run's id (a random UUID made at start): the same on every record of one `stalltrace run`, in every file it wrote."
            }),
            true,
        ),
        (
            "seqno",
            json!({
                "type": "integer",
                "minimum": 0,
                "description": "The record's number in its run: 0 for `start`, then one more for each record made, written or not. A gap is records the output queue dropped for want of room (a slow or stuck reader), counted in `lost` as `output.queue_full`."
            }),
            true,
        ),
        (
            "part",
            json!({
                "type": "integer",
                "minimum": 1,
                "description": format!("Present when a record was split to keep each line within {MAX_LINE_BYTES} bytes: this line's number among the record's `parts` (1-based). The parts are consecutive records (consecutive `seqno`), each with every field of the record except that the array named by `split` is divided among them in order.")
            }),
            false,
        ),
        (
            "parts",
            json!({
                "type": "integer",
                "minimum": 2,
                "description": "How many lines the split record takes (with `part` and `split`)."
            }),
            false,
        ),
        (
            "split",
            json!({
                "type": "string",
                "description": "The top-level array field divided among the parts of a split record."
            }),
            false,
        ),
    ]
}

/// The whole schema document.
pub fn generate() -> Value {
    let mut generator = SchemaSettings::draft2020_12().into_generator();
    let mut records: Vec<(&'static str, Value)> = Vec::new();
    each_schema(&mut generator, |name, reference| {
        records.push((name, reference.to_value()));
    });
    let mut defs: Map<String, Value> = generator.take_definitions(true).into_iter().collect();

    let mut all_of = Vec::new();
    for (name, reference) in &records {
        // Each record type's struct moves to `$defs/<type>` and gains the envelope.
        let struct_name = reference["$ref"]
            .as_str()
            .and_then(|r| r.strip_prefix("#/$defs/"))
            .unwrap_or_else(|| panic!("record type {name} has no definition of its own"))
            .to_string();
        let mut def = defs
            .remove(&struct_name)
            .unwrap_or_else(|| panic!("no definition {struct_name}"));
        with_envelope(&mut def, name);
        defs.insert((*name).to_string(), def);
        all_of.push(json!({
            "if": { "properties": { "type": { "const": name } }, "required": ["type"] },
            "then": { "$ref": format!("#/$defs/{name}") }
        }));
    }
    defs.insert(
        "record_type".into(),
        json!({ "description": "Every record type this version emits.", "enum": RECORD_TYPES }),
    );
    let mut defs: Map<String, Value> = sorted(defs);
    for def in defs.values_mut() {
        unwrap_descriptions(def);
    }

    json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://github.com/stalltrace/stalltrace/raw/main/docs/schema.json",
        "title": format!("stalltrace JSON lines, schema {SCHEMA_VERSION}"),
        "description": DESCRIPTION,
        "type": "object",
        "required": ["ts", "host", "type", "schema", "run", "seqno"],
        "properties": {
            "type": {
                "$ref": "#/$defs/record_type",
                "description": "Record type; selects which of the `$defs` record shapes the line must match."
            }
        },
        "allOf": all_of,
        "$defs": defs,
    })
}

/// Adds the envelope's fields to a record's definition (first, as a line shows them).
fn with_envelope(def: &mut Value, name: &str) {
    let object = def.as_object_mut().expect("a record's schema is an object");
    let own = object
        .remove("properties")
        .and_then(|p| match p {
            Value::Object(m) => Some(m),
            _ => None,
        })
        .unwrap_or_default();
    let own_required: Vec<Value> = object
        .remove("required")
        .and_then(|r| match r {
            Value::Array(a) => Some(a),
            _ => None,
        })
        .unwrap_or_default();
    let mut properties = Map::new();
    let mut required = Vec::new();
    for (field, schema, needed) in envelope() {
        let schema = if field == "type" {
            json!({ "const": name, "description": "Record type." })
        } else {
            schema
        };
        properties.insert(field.into(), schema);
        if needed {
            required.push(Value::from(field));
        }
    }
    for (field, schema) in own {
        assert!(
            !properties.contains_key(&field),
            "record {name} has a field named like the envelope's {field}"
        );
        properties.insert(field, schema);
    }
    required.extend(own_required);
    object.insert("properties".into(), Value::Object(properties));
    object.insert("required".into(), Value::Array(required));
    object.insert("additionalProperties".into(), Value::Bool(false));
    object.remove("$schema");
    object.remove("title");
}

/// Doc comments wrap at the source's width; a description is one paragraph
/// per line break pair, so a single line break is a space.
fn unwrap_descriptions(value: &mut Value) {
    match value {
        Value::Object(map) => {
            for (key, v) in map.iter_mut() {
                match v {
                    Value::String(text) if key == "description" => {
                        *text = text
                            .split("\n\n")
                            .map(|paragraph| {
                                paragraph
                                    .split('\n')
                                    .map(str::trim)
                                    .collect::<Vec<_>>()
                                    .join(" ")
                            })
                            .collect::<Vec<_>>()
                            .join("\n\n");
                    }
                    _ => unwrap_descriptions(v),
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(unwrap_descriptions),
        _ => {}
    }
}

/// Definitions in name order: a stable file, diffs that show the change.
fn sorted(defs: Map<String, Value>) -> Map<String, Value> {
    let mut entries: Vec<(String, Value)> = defs.into_iter().collect();
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    entries.into_iter().collect()
}

/// The document as committed: pretty JSON and a final newline.
pub fn document() -> String {
    let mut text = serde_json::to_string_pretty(&generate()).expect("a JSON value serializes");
    text.push('\n');
    text
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_committed_schema_is_the_generated_one() {
        let committed = include_str!("../../../docs/schema.json");
        assert!(
            committed == super::document(),
            "docs/schema.json differs from the record types: run `cargo run -p stalltrace --example schema > docs/schema.json`"
        );
    }
}
