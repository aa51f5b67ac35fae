//! Reading fields of a record that may lack them: the report reads streams of
//! this schema version and of later ones (fields are only ever added), so a
//! missing or differently typed field is left out, never an error.

use serde_json::Value;

pub fn str_of(v: &Value, key: &str) -> Option<String> {
    v.get(key).and_then(Value::as_str).map(str::to_string)
}

pub fn u64_of(v: &Value, key: &str) -> Option<u64> {
    v.get(key).and_then(Value::as_u64)
}

pub fn f64_of(v: &Value, key: &str) -> Option<f64> {
    v.get(key).and_then(Value::as_f64)
}

pub fn bool_of(v: &Value, key: &str) -> Option<bool> {
    v.get(key).and_then(Value::as_bool)
}

/// A counter that may be `"not exposed"`: 0 when absent or not a number.
pub fn count_of(v: &Value, key: &str) -> u64 {
    u64_of(v, key).unwrap_or(0)
}

/// A value that is a number, a string (`"not exposed"`), or a boolean, as text.
pub fn text_of(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}
