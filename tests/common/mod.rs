//! What the end-to-end tests add to the lab (the `stalltrace-lab` crate, in
//! lab/, which `cargo xtask lab` shares): the binaries cargo built for this
//! test run, and JSON-Schema validation of every record a test reads.
//!
//! Everything a test creates has a unique name and is removed by a Drop guard
//! (in the lab), so a failing (panicking) test still leaves the shared kernel
//! clean.
#![allow(dead_code, unused_imports)] // each test binary uses a different subset

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use serde_json::Value;

pub use stalltrace_lab::{
    Backing, Bins, Bpftrace, Buckets, DiskStats, Fio, HIST_BUCKET_ERROR, LoopDevice, block_records,
    fio, of_type, randread_4k, requests_untimed, require_root, retransmits_in,
    retransmits_unjudged, sh, sum_field, sum_segs, unique,
};

/// The network lab: namespaces, veth, loss, tbf, iperf3, sockperf, counters.
pub mod netlab {
    pub use stalltrace_lab::net::*;
}

/// The request-latency oracle of the SQL Server tests.
pub mod requests;

/// The SQL Server lab: the simulator, filesystems on loop devices, a slow disk.
pub mod sqllab {
    pub use stalltrace_lab::sql::*;
}

pub fn stalltrace_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_stalltrace"))
}

/// This test run's binaries: `stalltrace`, and the simulator's beside it
/// (`cargo xtask test` and `cargo nextest run --workspace` build them all).
pub fn bins() -> Bins {
    let bins = Bins::beside(stalltrace_bin());
    bins.check();
    bins
}

fn schema() -> &'static jsonschema::Validator {
    static SCHEMA: OnceLock<jsonschema::Validator> = OnceLock::new();
    SCHEMA.get_or_init(|| {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/schema.json");
        let text = std::fs::read_to_string(&path).expect("docs/schema.json");
        let schema: Value = serde_json::from_str(&text).expect("docs/schema.json is JSON");
        jsonschema::validator_for(&schema).expect("docs/schema.json is a valid JSON Schema")
    })
}

/// Parse JSON lines, validating every one against docs/schema.json.
pub fn parse_records(text: &str) -> Vec<Value> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let v: Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("line {}: not JSON ({e}): {line}", n + 1));
        let errors: Vec<String> = schema()
            .iter_errors(&v)
            .map(|e| format!("{e} at {}", e.instance_path()))
            .collect();
        assert!(
            errors.is_empty(),
            "line {} breaks docs/schema.json: {errors:?}\n{line}",
            n + 1
        );
        out.push(v);
    }
    out
}

/// `stalltrace run` (this test run's binary) as a child process writing to
/// its own file; every record it returns is checked against the schema.
pub struct Tracer(stalltrace_lab::Tracer);

impl Tracer {
    /// Start `stalltrace run --out FILE <args>` and wait for its `start` record.
    pub fn start(args: &[&str]) -> Self {
        Self::start_with_env(args, &[])
    }

    pub fn start_with_env(args: &[&str], env: &[(&str, &str)]) -> Self {
        Self(stalltrace_lab::Tracer::start_with_env(
            &stalltrace_bin(),
            args,
            env,
        ))
    }

    /// Send `signal`, wait for exit, and return every record (schema-validated).
    pub fn stop_with(self, signal: i32) -> Vec<Value> {
        parse_records(&self.0.stop_text_with(signal))
    }

    pub fn stop(self) -> Vec<Value> {
        self.stop_with(libc::SIGINT)
    }
}

impl std::ops::Deref for Tracer {
    type Target = stalltrace_lab::Tracer;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl std::ops::DerefMut for Tracer {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.0
    }
}
