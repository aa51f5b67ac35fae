//! The poller thread: asks a `DmvSource` every `poll_every`, keeps the latest
//! rows where the daemon can take them without waiting, and says when polling
//! starts or stops working (once per change, not once per poll: a SQL Server
//! that is down for an hour is one line, not 720). Failures back off.

use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::client::TdsDmvSource;
use super::config::DmvConfig;
use super::join::DmvRow;
use super::{DmvError, DmvSource};

/// Retries double from `poll_every` up to this (or `poll_every`, if longer).
pub const MAX_BACKOFF: Duration = Duration::from_secs(120);
/// Status changes not yet taken; a daemon that never takes them loses the oldest.
const STATUS_QUEUE: usize = 32;

/// One poll's rows.
#[derive(Clone, Debug, PartialEq)]
pub struct DmvSnapshot {
    /// When the poll finished, UTC ms since the epoch: rows older than a few
    /// periods describe a SQL Server the poller no longer reaches.
    pub polled_at_ms: i64,
    pub rows: Vec<DmvRow>,
}

/// A change in how polling goes.
#[derive(Clone, Debug, PartialEq)]
pub enum DmvStatus {
    /// Polls succeed: the first one, or the first after failures.
    Up { rows: usize },
    /// Polls fail (reported again only when the kind of failure changes).
    Down { error: DmvError, retry_in: Duration },
}

impl std::fmt::Display for DmvStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Up { rows } => write!(f, "SQL Server DMV polling works ({rows} connections)"),
            Self::Down { error, retry_in } if *retry_in == Duration::MAX => {
                write!(f, "{} (not retried)", error.to_user_error())
            }
            Self::Down { error, retry_in } => write!(
                f,
                "{} (retrying in {})",
                error.to_user_error(),
                humantime::format_duration(*retry_in)
            ),
        }
    }
}

#[derive(Default)]
struct Shared {
    latest: Mutex<Option<Arc<DmvSnapshot>>>,
    status: Mutex<Vec<DmvStatus>>,
}

/// A running poller. Dropping it stops the thread at its next wait; nothing
/// ever waits for the thread, which may be inside a query (bounded by the
/// client's timeouts).
pub struct Dmv {
    shared: Arc<Shared>,
    every: Duration,
    _stop: mpsc::Sender<()>,
}

impl Dmv {
    /// Poll the SQL Server of `config` over TDS, on a thread of its own.
    pub fn start(config: DmvConfig) -> Self {
        let every = config.poll_every;
        Self::spawn(every, move || {
            TdsDmvSource::new(config).map(|s| Box::new(s) as Box<dyn DmvSource>)
        })
    }

    /// Poll any source (tests use recorded rows).
    pub fn with_source(source: impl DmvSource + Send + 'static, poll_every: Duration) -> Self {
        Self::spawn(poll_every, move || {
            Ok(Box::new(source) as Box<dyn DmvSource>)
        })
    }

    fn spawn(
        every: Duration,
        make: impl FnOnce() -> Result<Box<dyn DmvSource>, DmvError> + Send + 'static,
    ) -> Self {
        let shared = Arc::new(Shared::default());
        let (stop, stopped) = mpsc::channel();
        let mine = Arc::clone(&shared);
        let spawned = std::thread::Builder::new()
            .name("stalltrace-dmv".into())
            .spawn(move || match make() {
                Ok(source) => run(source, every, &mine, &stopped),
                Err(error) => push(
                    &mine,
                    DmvStatus::Down {
                        error,
                        retry_in: Duration::MAX,
                    },
                ),
            });
        if let Err(e) = spawned {
            push(
                &shared,
                DmvStatus::Down {
                    error: DmvError::Setup(format!("cannot start the DMV poller thread: {e}")),
                    retry_in: Duration::MAX,
                },
            );
        }
        Self {
            shared,
            every,
            _stop: stop,
        }
    }

    /// How often it polls.
    pub fn poll_every(&self) -> Duration {
        self.every
    }

    /// The latest successful poll, without waiting for one.
    pub fn latest(&self) -> Option<Arc<DmvSnapshot>> {
        lock(&self.shared.latest).clone()
    }

    /// Status changes since the last call, oldest first.
    pub fn take_status(&self) -> Vec<DmvStatus> {
        std::mem::take(&mut *lock(&self.shared.status))
    }
}

/// A poisoned lock only means a panic elsewhere mid-update of plain data.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn push(shared: &Shared, status: DmvStatus) {
    let mut q = lock(&shared.status);
    if q.len() >= STATUS_QUEUE {
        q.remove(0);
    }
    q.push(status);
}

fn run(
    mut source: Box<dyn DmvSource>,
    every: Duration,
    shared: &Shared,
    stopped: &mpsc::Receiver<()>,
) {
    let mut up = false;
    let mut failing: Option<&'static str> = None;
    let mut backoff = every;
    loop {
        let started = Instant::now();
        let wait = match source.poll() {
            Ok(rows) => {
                if !up {
                    push(shared, DmvStatus::Up { rows: rows.len() });
                }
                (up, failing, backoff) = (true, None, every);
                let snapshot = DmvSnapshot {
                    polled_at_ms: chrono::Utc::now().timestamp_millis(),
                    rows,
                };
                *lock(&shared.latest) = Some(Arc::new(snapshot));
                every.saturating_sub(started.elapsed())
            }
            Err(error) => {
                let wait = backoff;
                if failing != Some(error.kind()) {
                    failing = Some(error.kind());
                    push(
                        shared,
                        DmvStatus::Down {
                            error,
                            retry_in: wait,
                        },
                    );
                }
                up = false;
                backoff = next_backoff(backoff, every);
                wait
            }
        };
        match stopped.recv_timeout(wait) {
            Err(RecvTimeoutError::Timeout) => {}
            // The Dmv was dropped (or, never, sent a stop).
            _ => return,
        }
    }
}

pub fn next_backoff(current: Duration, every: Duration) -> Duration {
    (current * 2).min(MAX_BACKOFF.max(every))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;
    use std::sync::mpsc::Sender;

    /// Replays results, then keeps returning one row; says it is done at the
    /// second of those, when the poller has surely stored the first.
    struct Script {
        results: VecDeque<Result<Vec<DmvRow>, DmvError>>,
        extra: usize,
        done: Option<Sender<()>>,
    }

    impl DmvSource for Script {
        fn poll(&mut self) -> Result<Vec<DmvRow>, DmvError> {
            match self.results.pop_front() {
                Some(r) => r,
                None => {
                    self.extra += 1;
                    if self.extra == 2
                        && let Some(done) = self.done.take()
                    {
                        let _ = done.send(());
                    }
                    Ok(vec![DmvRow::default()])
                }
            }
        }
    }

    fn rows(n: usize) -> Result<Vec<DmvRow>, DmvError> {
        Ok(vec![DmvRow::default(); n])
    }

    #[test]
    fn reports_each_change_once_and_keeps_the_latest_rows() {
        let refused = || Err(DmvError::Connect("127.0.0.1:1433: refused".into()));
        let (done, finished) = mpsc::channel();
        let script = Script {
            results: VecDeque::from([
                rows(2),
                rows(3),
                refused(),
                refused(),
                refused(),
                Err(DmvError::Login("Login failed for user 'x'".into())),
                rows(4),
            ]),
            extra: 0,
            done: Some(done),
        };
        let dmv = Dmv::with_source(script, Duration::from_millis(1));
        finished.recv_timeout(Duration::from_secs(30)).unwrap();
        let kinds: Vec<String> = dmv
            .take_status()
            .iter()
            .map(|s| match s {
                DmvStatus::Up { rows } => format!("up {rows}"),
                DmvStatus::Down { error, .. } => format!("down {}", error.kind()),
            })
            .collect();
        assert_eq!(kinds, ["up 2", "down connect", "down login", "up 4"]);
        assert!(dmv.take_status().is_empty(), "taken once");
        let latest = dmv.latest().unwrap();
        assert_eq!(latest.rows.len(), 1);
        assert!(latest.polled_at_ms > 1_700_000_000_000);
    }

    #[test]
    fn a_source_that_cannot_start_is_reported() {
        let dmv = Dmv::spawn(Duration::from_millis(1), || {
            Err(DmvError::Setup("no runtime".into()))
        });
        let deadline = Instant::now() + Duration::from_secs(30);
        let status = loop {
            let s = dmv.take_status();
            if !s.is_empty() || Instant::now() > deadline {
                break s;
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        assert!(matches!(
            &status[..],
            [DmvStatus::Down {
                error: DmvError::Setup(_),
                ..
            }]
        ));
        assert!(dmv.latest().is_none());
    }

    #[test]
    fn backoff_doubles_up_to_a_cap() {
        let s = Duration::from_secs;
        assert_eq!(next_backoff(s(5), s(5)), s(10));
        assert_eq!(next_backoff(s(80), s(5)), MAX_BACKOFF);
        assert_eq!(
            next_backoff(s(600), s(600)),
            s(600),
            "never below the period"
        );
    }

    #[test]
    fn down_status_reads_as_one_user_line() {
        let s = DmvStatus::Down {
            error: DmvError::Tls("certificate\nunknown issuer".into()),
            retry_in: Duration::from_secs(10),
        }
        .to_string();
        assert!(!s.contains('\n'));
        assert!(
            s.contains("trust_server_certificate") && s.ends_with("(retrying in 10s)"),
            "{s}"
        );
    }
}
