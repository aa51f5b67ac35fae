//! The bounded queue between the run loop and wherever the records go.
//!
//! A reader that stops reading (a log shipper that hangs, a full pipe, a file
//! on a hung NFS mount) must never stop the tracer: the run loop hands each
//! record to this queue and goes on; one writer thread does the blocking
//! writes. When the queue holds its limit in bytes, new records are dropped
//! and counted (the run reports them as `lost` source `output`), so memory
//! stays bounded whatever the reader does, and a signal still ends the run on
//! time because the run loop never waits on a write.

use std::collections::VecDeque;
use std::io::{self, Write};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::file::{NextFile, Output};

/// What a queued line costs beyond its bytes (the Vec and the deque slot):
/// counted so that a flood of tiny lines cannot exceed the bound either.
const LINE_OVERHEAD: usize = 32;

/// Lines the writer takes per turn: small enough that its progress (which
/// `close` watches to tell a slow reader from a stuck one) shows often.
const BATCH_LINES: usize = 256;

pub struct OutputQueue {
    shared: Arc<Shared>,
    writer: Option<JoinHandle<Box<dyn Output>>>,
    limit: usize,
}

struct Shared {
    state: Mutex<State>,
    /// Signalled when there is something for the writer to do.
    work: Condvar,
    /// Signalled when the writer wrote something or stopped.
    progress: Condvar,
}

/// What the writer takes from the queue, in order.
enum Item {
    Line(Vec<u8>),
    /// Lines after this go to a new file (output/file.rs).
    NextFile(NextFile),
}

#[derive(Default)]
struct State {
    lines: VecDeque<Item>,
    /// Bytes queued or being written, overhead included.
    bytes: usize,
    /// Lines the writer has taken and not finished writing.
    in_hand: usize,
    /// The run is over: write what is queued, then stop.
    closing: bool,
    /// The writer stopped on this error; nothing more can be written.
    failed: Option<(io::ErrorKind, String)>,
    /// The writer thread has returned.
    done: bool,
    /// Bumped on every batch written: lets `close` tell a slow reader from a
    /// stuck one.
    batches: u64,
}

/// What `close` could not write before its deadline (the writer's batch in
/// hand included: part of its first line may have gone out).
#[derive(Debug, PartialEq, Eq)]
pub struct Unwritten {
    pub lines: usize,
    pub bytes: usize,
}

impl OutputQueue {
    /// Start the writer thread on `out`, holding at most `limit` bytes.
    pub fn start(out: Box<dyn Output>, limit: usize) -> io::Result<Self> {
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            work: Condvar::new(),
            progress: Condvar::new(),
        });
        let writer = std::thread::Builder::new().name("output".into()).spawn({
            let shared = Arc::clone(&shared);
            move || write_loop(&shared, out)
        })?;
        Ok(Self {
            shared,
            writer: Some(writer),
            limit,
        })
    }

    /// Queue one line. `Ok(false)`: the queue is full and the line was
    /// dropped. `Err`: the writer failed (its error), nothing more will be
    /// written.
    pub fn push(&self, line: Vec<u8>) -> io::Result<bool> {
        self.push_all(vec![line])
    }

    /// Every line or none: the parts of one record are never half queued.
    pub fn push_all(&self, lines: Vec<Vec<u8>>) -> io::Result<bool> {
        let mut state = self.shared.lock();
        if let Some((kind, message)) = &state.failed {
            return Err(io::Error::new(*kind, message.clone()));
        }
        let cost: usize = lines.iter().map(|l| l.len() + LINE_OVERHEAD).sum();
        if state.bytes + cost > self.limit {
            return Ok(false);
        }
        state.bytes += cost;
        state.lines.extend(lines.into_iter().map(Item::Line));
        self.shared.work.notify_one();
        Ok(true)
    }

    /// The writer's error, once it has failed.
    /// The lines pushed after this go to the next file, which begins with
    /// `head` (the run's `start`). Never refused, even by a full queue: a
    /// file that began without saying what run it is could not be read
    /// alone. It costs one record more than the limit at most.
    pub fn push_next_file(&self, how: NextFile, head: Vec<Vec<u8>>) {
        let mut state = self.shared.lock();
        state.bytes += LINE_OVERHEAD + head.iter().map(|l| l.len() + LINE_OVERHEAD).sum::<usize>();
        state.lines.push_back(Item::NextFile(how));
        state.lines.extend(head.into_iter().map(Item::Line));
        self.shared.work.notify_one();
    }

    pub fn failed(&self) -> Option<io::Error> {
        let state = self.shared.lock();
        state
            .failed
            .as_ref()
            .map(|(kind, message)| io::Error::new(*kind, message.clone()))
    }

    /// Wait until the queue has room for a line of `bytes` (or is empty).
    /// Gives up (false) when the writer made no progress for `stuck`, or at
    /// `deadline`: a stuck reader must not hold the end of a run.
    pub fn wait_for_room(&self, bytes: usize, stuck: Duration, deadline: Instant) -> bool {
        let cost = bytes + LINE_OVERHEAD;
        let limit = self.limit;
        let (state, ready) =
            self.shared
                .wait_while_writing(self.shared.lock(), stuck, deadline, |s| {
                    s.bytes + cost <= limit || s.bytes == 0 || s.failed.is_some() || s.done
                });
        ready && state.failed.is_none() && !state.done
    }

    /// Write what is queued and stop the writer. Gives up when the writer
    /// made no progress for `stuck`, or at `deadline`, whichever is first;
    /// then the writer thread is left blocked (the process is about to
    /// exit) and what it did not write is returned. On success the sink is
    /// handed back (flushed).
    pub fn close(
        mut self,
        stuck: Duration,
        deadline: Instant,
    ) -> Result<Box<dyn Output>, Unwritten> {
        let mut state = self.shared.lock();
        state.closing = true;
        self.shared.work.notify_one();
        let (state, done) = self
            .shared
            .wait_while_writing(state, stuck, deadline, |s| s.done);
        if !done {
            return Err(Unwritten {
                lines: state.lines.len() + state.in_hand,
                bytes: state.bytes,
            });
        }
        drop(state);
        let writer = self.writer.take().expect("closed once");
        Ok(writer.join().expect("the output thread does not panic"))
    }
}

impl Shared {
    /// The state, even if a thread panicked while holding it: the fields are
    /// plain counters and a deque, valid at every step.
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Wait until `ready`; false when the writer made no progress (no batch
    /// written) for `stuck`, or at `deadline`: a slow reader is waited for,
    /// a stuck one is not.
    fn wait_while_writing<'a>(
        &self,
        mut state: MutexGuard<'a, State>,
        stuck: Duration,
        deadline: Instant,
        ready: impl Fn(&State) -> bool,
    ) -> (MutexGuard<'a, State>, bool) {
        let mut batches = state.batches;
        let mut last_progress = Instant::now();
        while !ready(&state) {
            let now = Instant::now();
            if state.batches != batches {
                batches = state.batches;
                last_progress = now;
            }
            let give_up = deadline.min(last_progress + stuck);
            if now >= give_up {
                return (state, false);
            }
            state = self.wait_progress(state, give_up - now);
        }
        (state, true)
    }

    fn wait_progress<'a>(
        &self,
        state: MutexGuard<'a, State>,
        timeout: Duration,
    ) -> MutexGuard<'a, State> {
        match self.progress.wait_timeout(state, timeout) {
            Ok((state, _)) => state,
            Err(e) => e.into_inner().0,
        }
    }
}

/// The writer thread: take everything queued, write it, flush when the queue
/// is empty (so a reader sees each interval's records as they are made), and
/// return the sink when closed or failed.
fn write_loop(shared: &Shared, mut out: Box<dyn Output>) -> Box<dyn Output> {
    let mut state = shared.lock();
    loop {
        if state.lines.is_empty() {
            if state.closing {
                break;
            }
            state = match shared.work.wait(state) {
                Ok(state) => state,
                Err(e) => e.into_inner(),
            };
            continue;
        }
        let take = state.lines.len().min(BATCH_LINES);
        let batch: Vec<Item> = state.lines.drain(..take).collect();
        state.in_hand = take;
        drop(state);
        let mut written = 0;
        let mut result = Ok(());
        for item in &batch {
            result = match item {
                Item::Line(line) => out.write_all(line).map(|()| line.len()),
                Item::NextFile(how) => out.next_file(*how).map(|()| 0),
            }
            .map(|bytes| written += bytes + LINE_OVERHEAD);
            if result.is_err() {
                break;
            }
        }
        state = shared.lock();
        if result.is_ok() && state.lines.is_empty() {
            drop(state);
            result = out.flush();
            state = shared.lock();
        }
        // Bytes leave the bound only once written: the batch in hand counts.
        state.bytes -= written;
        state.in_hand = 0;
        state.batches += 1;
        if let Err(e) = result {
            state.failed = Some((e.kind(), e.to_string()));
            break;
        }
        shared.progress.notify_all();
    }
    state.done = true;
    shared.progress.notify_all();
    drop(state);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    /// A sink that takes each write only when the test says so.
    struct Gate(mpsc::Receiver<()>, Arc<Mutex<Vec<u8>>>);
    impl Output for Gate {}
    impl Write for Gate {
        fn write(&mut self, b: &[u8]) -> io::Result<usize> {
            self.0
                .recv()
                .map_err(|_| io::Error::from(io::ErrorKind::BrokenPipe))?;
            self.1.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    fn line(n: usize) -> Vec<u8> {
        format!("{n:0>63}\n").into_bytes()
    }

    #[test]
    fn a_records_parts_go_all_or_none_and_a_new_files_head_is_never_refused() {
        let (open, gate) = mpsc::channel();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let q = OutputQueue::start(Box::new(Gate(gate, seen.clone())), 3 * (64 + 32)).unwrap();
        assert!(q.push(line(0)).unwrap());
        // Two parts fit, three do not: none of the three is queued.
        assert!(!q.push_all(vec![line(1), line(2), line(3)]).unwrap());
        assert!(q.push_all(vec![line(4), line(5)]).unwrap());
        // Full now; a file change and the start that heads it still go in.
        assert!(!q.push(line(6)).unwrap());
        q.push_next_file(NextFile::Reopen, vec![line(7)]);
        for _ in 0..4 {
            open.send(()).unwrap();
        }
        drop(
            q.close(
                Duration::from_secs(5),
                Instant::now() + Duration::from_secs(5),
            )
            .unwrap_or_else(|u| panic!("{u:?}")),
        );
        let text = String::from_utf8(seen.lock().unwrap().clone()).unwrap();
        let got: Vec<usize> = text.lines().map(|l| l.parse().unwrap()).collect();
        assert_eq!(got, [0, 4, 5, 7]);
    }

    #[test]
    fn a_stuck_reader_fills_the_queue_then_lines_are_dropped_not_held() {
        let (open, gate) = mpsc::channel();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let q = OutputQueue::start(Box::new(Gate(gate, seen.clone())), 10 * (64 + 32)).unwrap();
        // The writer takes the first line and blocks in its write; ten more
        // fill the bound (the line in hand still counts), the rest drop.
        let taken: Vec<bool> = (0..20).map(|n| q.push(line(n)).unwrap()).collect();
        assert_eq!(taken.iter().filter(|&&t| t).count(), 10, "{taken:?}");
        assert!(taken[..10].iter().all(|&t| t));
        // The reader wakes: everything queued is written, in order.
        for _ in 0..10 {
            open.send(()).unwrap();
        }
        let sink = q
            .close(
                Duration::from_secs(5),
                Instant::now() + Duration::from_secs(5),
            )
            .unwrap_or_else(|u| panic!("{u:?}"));
        drop(sink);
        let text = String::from_utf8(seen.lock().unwrap().clone()).unwrap();
        let got: Vec<usize> = text.lines().map(|l| l.parse().unwrap()).collect();
        assert_eq!(got, (0..10).collect::<Vec<_>>());
    }

    #[test]
    fn close_gives_up_on_a_stuck_reader_and_says_what_was_not_written() {
        let (_open, gate) = mpsc::channel();
        let q = OutputQueue::start(Box::new(Gate(gate, Default::default())), 1 << 20).unwrap();
        for n in 0..5 {
            assert!(q.push(line(n)).unwrap());
        }
        let started = Instant::now();
        let unwritten = q
            .close(
                Duration::from_millis(200),
                Instant::now() + Duration::from_secs(5),
            )
            .err()
            .expect("nothing can be written");
        assert!(started.elapsed() < Duration::from_secs(2));
        // The writer holds them all, blocked in the first write.
        assert_eq!(unwritten.lines, 5);
        assert_eq!(unwritten.bytes, 5 * (64 + LINE_OVERHEAD));
    }

    #[test]
    fn waiting_for_room_gives_up_on_a_stuck_reader_before_its_deadline() {
        let (_open, gate) = mpsc::channel();
        let q =
            OutputQueue::start(Box::new(Gate(gate, Default::default())), 2 * (64 + 32)).unwrap();
        while q.push(line(0)).unwrap() {}
        let started = Instant::now();
        let far = Instant::now() + Duration::from_secs(3600);
        assert!(!q.wait_for_room(64, Duration::from_millis(200), far));
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
    }

    #[test]
    fn a_write_error_stops_the_writer_and_every_later_push_gets_it() {
        let q = OutputQueue::start(
            Box::new(
                std::fs::OpenOptions::new()
                    .write(true)
                    .open("/dev/full")
                    .unwrap(),
            ),
            1 << 20,
        )
        .unwrap();
        // /dev/full takes nothing: the flush after the first line fails.
        let _ = q.push(line(0));
        let deadline = Instant::now() + Duration::from_secs(5);
        while q.failed().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        let e = q.push(line(1)).expect_err("the writer failed");
        assert_eq!(e.raw_os_error(), None, "kind and message are kept");
        assert_eq!(e.kind(), io::ErrorKind::StorageFull);
        assert!(q.close(Duration::from_secs(1), deadline).is_ok());
    }
}
