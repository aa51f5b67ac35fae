//! A check's verdict: the figures it measured, the expectations that failed,
//! and how stalltrace attached its hooks.

use std::any::Any;
use std::panic::{AssertUnwindSafe, catch_unwind};

use serde_json::{Map, Value};

use super::{Check, Opts};

/// What one check found. It passes when nothing failed and it did not panic.
#[derive(Default)]
pub struct Judge {
    figures: Vec<String>,
    failures: Vec<String>,
    /// hook name → how it attached (the `start` record's probe entry).
    pub hooks: Map<String, Value>,
}

impl Judge {
    /// Run `check`; a panic (the lab's way to fail) is a failure with its message.
    pub fn run(opts: &Opts, check: &Check) -> Self {
        let mut judge = Self::default();
        let outcome = catch_unwind(AssertUnwindSafe(|| (check.run)(opts, &mut judge)));
        if let Err(payload) = outcome {
            judge.fail(format!("could not run: {}", panic_text(&*payload)));
        }
        if judge.figures.is_empty() && judge.failures.is_empty() {
            judge.fail("the check measured nothing".to_string());
        }
        judge
    }

    pub fn passed(&self) -> bool {
        self.failures.is_empty()
    }

    /// Figures, then `FAIL: ...` for each failed expectation.
    pub fn detail(&self) -> String {
        let mut parts = self.figures.clone();
        parts.extend(self.failures.iter().map(|f| format!("FAIL: {f}")));
        parts.join("; ")
    }

    /// A figure for the detail.
    pub fn note(&mut self, figure: impl Into<String>) {
        let figure = figure.into();
        eprintln!("kernel-checks:   {figure}");
        self.figures.push(figure);
    }

    pub fn fail(&mut self, why: impl Into<String>) {
        let why = why.into();
        eprintln!("kernel-checks:   FAIL: {why}");
        self.failures.push(why);
    }

    /// Fail with `why` unless `ok`; returns `ok`.
    pub fn expect(&mut self, ok: bool, why: impl FnOnce() -> String) -> bool {
        if !ok {
            self.fail(why());
        }
        ok
    }

    /// Record how the hooks of `families` attached (every field of each probe
    /// entry in `start`, whatever they are), and require each family to be
    /// attached; returns whether all were.
    pub fn families_attached(&mut self, start: &Value, families: &[&str]) -> bool {
        self.record_hooks(start, families);
        let mut all = true;
        for family in families {
            let entry = start["families"]
                .as_array()
                .and_then(|fs| fs.iter().find(|f| f["family"] == *family));
            match entry {
                None => {
                    self.fail(format!("family {family} missing from `start`"));
                    all = false;
                }
                Some(f) if f["attached"] != true => {
                    self.fail(format!(
                        "family {family} not attached: {}",
                        f.get("error")
                            .map_or_else(|| f.to_string(), Value::to_string)
                    ));
                    all = false;
                }
                Some(f) => {
                    let mut how = format!("{family} attached in {}", f["mode"]);
                    if let Some(why) = f.get("fallback_reason") {
                        how.push_str(&format!(" (fell back: {why})"));
                    }
                    self.note(how);
                }
            }
        }
        all
    }

    /// The `start` record's probe entries of `families`, by hook. A hook tried
    /// more than once (tp_btf failed, then raw_tp) is the attempt that
    /// attached, or the last, with the others under `other_attempts`.
    pub fn record_hooks(&mut self, start: &Value, families: &[&str]) {
        let Some(probes) = start["probes"].as_array() else {
            self.fail(format!("`start` has no probes list: {start}"));
            return;
        };
        let mut by_hook: Map<String, Value> = Map::new();
        let mut attempts: Map<String, Value> = Map::new();
        for probe in probes {
            let family = probe["family"].as_str().unwrap_or("?");
            if !families.contains(&family) {
                continue;
            }
            let hook = probe["hook"].as_str().unwrap_or("?");
            // The same hook in two families (tcp_probe: tcp and netdev): keyed `family/hook`.
            let other_family =
                |m: &Map<String, Value>| m.get(hook).is_some_and(|p| p["family"] != family);
            let key = if other_family(&by_hook) || other_family(&self.hooks) {
                format!("{family}/{hook}")
            } else {
                hook.to_string()
            };
            let mut how = probe.as_object().cloned().unwrap_or_default();
            how.remove("hook");
            let how = Value::Object(how);
            match by_hook.get(&key) {
                Some(prev) if prev["attached"] == true && how["attached"] != true => {
                    push(&mut attempts, &key, how);
                }
                Some(prev) => {
                    push(&mut attempts, &key, prev.clone());
                    by_hook.insert(key, how);
                }
                None => {
                    by_hook.insert(key, how);
                }
            }
        }
        for (key, mut how) in by_hook {
            if let Some(others) = attempts.remove(&key) {
                how["other_attempts"] = others;
            }
            self.hooks.insert(key, how);
        }
    }
}

fn push(map: &mut Map<String, Value>, key: &str, v: Value) {
    map.entry(key.to_string())
        .or_insert_with(|| Value::Array(Vec::new()))
        .as_array_mut()
        .unwrap()
        .push(v);
}

/// A panic's message.
pub fn panic_text(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "(no message)".to_string()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::Judge;

    #[test]
    fn hooks_keep_every_field_and_the_failed_attempts() {
        let start = json!({
            "families": [
                {"family": "block", "attached": true, "mode": "raw_tp", "fallback_reason": "no BTF"},
                {"family": "tcp", "attached": false, "error": "tcp_retransmit_skb: no err argument"},
            ],
            "probes": [
                {"family": "block", "hook": "block_rq_issue", "mode": "tp_btf", "attached": false, "error": "E"},
                {"family": "block", "hook": "block_rq_issue", "mode": "raw_tp", "attached": true, "via": "raw_tp", "target": "block_rq_issue"},
                {"family": "tcp", "hook": "tcp_probe", "mode": "tp_btf", "attached": true},
                {"family": "netdev", "hook": "tcp_probe", "mode": "tp_btf", "attached": true},
            ]
        });
        let mut judge = Judge::default();
        assert!(!judge.families_attached(&start, &["block", "tcp", "netdev"]));
        let issue = &judge.hooks["block_rq_issue"];
        assert_eq!(issue["mode"], "raw_tp");
        assert_eq!(issue["via"], "raw_tp");
        assert_eq!(issue["other_attempts"][0]["error"], "E");
        assert_eq!(judge.hooks["tcp_probe"]["family"], "tcp");
        assert_eq!(judge.hooks["netdev/tcp_probe"]["family"], "netdev");
        let detail = judge.detail();
        assert!(detail.contains("fell back"), "{detail}");
        assert!(detail.contains("FAIL: family tcp not attached"), "{detail}");
        assert!(detail.contains("FAIL: family netdev missing"), "{detail}");
    }
}
