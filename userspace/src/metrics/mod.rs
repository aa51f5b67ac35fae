//! `--prometheus ADDR:PORT`: the stream's figures as Prometheus metrics.
//!
//! Fed by the records as they are emitted (records.rs), plus each program's
//! run time from the kernel every interval; served from a thread of its own
//! (server.rs), so a slow or hostile scraper never holds up the tracer.
//! Counters count from the start of the run: Prometheus' `rate()` handles the
//! restart of a new run.

mod capped;
mod containers;
pub use containers::MAX_CONTAINERS;
mod peers;
pub use peers::MAX_PEERS;
mod records;
mod registry;
mod server;

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

pub use records::wanted;
pub use registry::{Kind, Registry};
pub use server::Server;

use crate::output::RecordReader;
use crate::records::block::SlowIoRecord;
use crate::records::run::ProgramStats;
use crate::records::{AnyRecord, OUTPUT_LOST, Record};
use records::FromRecords;
use registry::SERIES_TTL;

#[derive(Debug)]
struct State {
    registry: Registry,
    from_records: FromRecords,
}

/// The run's metrics, shared between the run loop and the server thread.
#[derive(Clone, Debug)]
pub struct Metrics {
    state: Arc<Mutex<State>>,
    /// The last scrape's text: scrapes closer together than RENDER_EVERY get
    /// it again, so scraping, however often, costs the tracer little.
    rendered: Arc<Mutex<Option<Rendered>>>,
    /// `slow_io` records feed only the per-container series: read only for them.
    reads_slow_io: bool,
}

/// A scrape's text and when it was made.
type Rendered = (Instant, Arc<str>);

/// The metrics change once per interval; at most one fresh text per this.
const RENDER_EVERY: Duration = Duration::from_millis(500);

impl Default for Metrics {
    fn default() -> Self {
        Self::new(0, 0)
    }
}

impl Metrics {
    /// `peers`, `containers`: how many TCP peers and containers get series
    /// of their own (`--prometheus-peers`, `--prometheus-containers`).
    pub fn new(peers: u32, containers: u32) -> Self {
        let mut registry = Registry::default();
        let from_records = FromRecords::new(&mut registry, peers, containers);
        registry.declare(
            "stalltrace_program_run_seconds_total",
            Kind::Counter,
            "Time the kernel spent in each BPF program (0 unless bpf stats are on: --bpf-stats).",
        );
        registry.declare(
            "stalltrace_program_runs_total",
            Kind::Counter,
            "Runs of each BPF program (0 unless bpf stats are on: --bpf-stats).",
        );
        registry.declare(
            "stalltrace_program_recursion_misses_total",
            Kind::Counter,
            "Runs the kernel skipped because the program was already running on that CPU.",
        );
        registry.declare(
            "stalltrace_metrics_series_refused_total",
            Kind::Counter,
            "Series not kept: the metrics were at their cap of series.",
        );
        // Made now: made at the cap, it would be refused itself.
        registry.set("stalltrace_metrics_series_refused_total", vec![], 0.0);
        Self {
            state: Arc::new(Mutex::new(State {
                registry,
                from_records,
            })),
            rendered: Arc::new(Mutex::new(None)),
            reads_slow_io: containers > 0,
        }
    }
}

/// The writer hands every record over through this (output/json.rs).
impl RecordReader for Metrics {
    fn reads(&self, kind: &str) -> bool {
        wanted(kind) && (kind != SlowIoRecord::TYPE || self.reads_slow_io)
    }

    fn read(&self, ts: &str, record: &AnyRecord) {
        self.record(ts, record);
    }

    fn made(&self, kind: &str) {
        self.count(kind);
    }

    fn dropped(&self) {
        Metrics::dropped(self);
    }
}

impl Metrics {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves figures at worst half-added:
        // still better served than none.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// One emitted record, made at `ts`, of a type `wanted` asked for.
    pub fn record(&self, ts: &str, record: &AnyRecord) {
        let state = &mut *self.lock();
        state.from_records.record(&mut state.registry, ts, record);
    }

    /// Counts a record of a type the metrics do not read.
    pub fn count(&self, kind: &str) {
        FromRecords::made(&mut self.lock().registry, kind);
    }

    /// One record the output queue had no room for.
    pub fn dropped(&self) {
        self.lock().registry.add(
            "stalltrace_lost_total",
            vec![("source", OUTPUT_LOST.to_string())],
            1.0,
        );
    }

    /// The kernel's running totals for each program of `family`.
    pub fn programs(&self, family: &'static str, stats: &[ProgramStats]) {
        let registry = &mut self.lock().registry;
        for s in stats {
            let labels = vec![
                ("family", family.to_string()),
                ("program", s.program.clone()),
            ];
            registry.set(
                "stalltrace_program_run_seconds_total",
                labels.clone(),
                s.run_time_ns as f64 / 1e9,
            );
            registry.set(
                "stalltrace_program_runs_total",
                labels.clone(),
                s.run_count as f64,
            );
            registry.set(
                "stalltrace_program_recursion_misses_total",
                labels,
                s.recursion_misses as f64,
            );
        }
    }

    /// The text a scrape gets. The registry is copied under the lock the run
    /// loop takes for every record, and formatted outside it.
    pub fn render(&self) -> Arc<str> {
        let mut rendered = self.rendered.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((at, text)) = rendered.as_ref()
            && at.elapsed() < RENDER_EVERY
        {
            return Arc::clone(text);
        }
        let snapshot = {
            let registry = &mut self.lock().registry;
            registry.expire(Instant::now(), SERIES_TTL);
            let refused = registry.refused() as f64;
            registry.set("stalltrace_metrics_series_refused_total", vec![], refused);
            registry.clone()
        };
        let text: Arc<str> = snapshot.render().into();
        *rendered = Some((Instant::now(), Arc::clone(&text)));
        text
    }
}
