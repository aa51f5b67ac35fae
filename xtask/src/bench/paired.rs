//! The paired rounds' order of play and what they measure, which `engine`
//! drives for the block, net and tls suites.
//!
//! A round measures every part of a suite (fio's depths, the net workloads)
//! in three blocks: untraced; traced (one stalltrace daemon started for the
//! block, each part run twice under it: as deployed, and with the kernel's
//! per-program accounting turned on by the bench for that run only); the
//! bpftrace peer (likewise, one bpftrace for the block). The blocks' order
//! goes through all six permutations, the parts' order rotates, and which of
//! a part's two runs under a daemon comes first alternates, so that drift on
//! the host (a neighbour's build starting, the page cache, CPU placement)
//! hits every configuration alike instead of always the one run last. Every
//! figure that judges is then a per-round ratio (a traced run over the
//! untraced run of the same part in the same round), and its median over the
//! rounds comes with an interval (see `stats`).
//!
//! Starting a daemon (load, verify, attach: about a second here) is the
//! costly part of a short run; one daemon per block instead of one per run
//! is what lets rounds be short and many within the same time.

use std::collections::BTreeMap;
use std::time::Instant;

use serde::Serialize;

use super::peers::{PeerProgram, StatsOn};
use super::tracer::programs::{self, Counter, Snapshot};
use super::tracer::{ProgramCost, StopRecord, Usage};

/// A round's three blocks by the place of each in round 1 (0: untraced,
/// 1: traced, 2: the peer, in the block and net suites): the three rotations
/// of 0, 1, 2, then the three of 0, 2, 1. Over every three rounds each block
/// takes each place once, over six each block also follows each other block
/// equally often.
const PERMUTATIONS: [[usize; 3]; 6] = [
    [0, 1, 2],
    [1, 2, 0],
    [2, 0, 1],
    [0, 2, 1],
    [2, 1, 0],
    [1, 0, 2],
];

/// A suite's three blocks (`items`, in round 1's order) in round `round`'s
/// order (1-based).
pub fn permuted<T: Copy>(round: usize, items: [T; 3]) -> [T; 3] {
    PERMUTATIONS[(round.max(1) - 1) % PERMUTATIONS.len()].map(|i| items[i])
}

/// Whether, under a daemon, each part's run with the kernel's accounting on
/// comes before the run as deployed in round `round`. It alternates from
/// round to round, and the pattern flips every six rounds, so that each
/// order of blocks meets both.
pub fn stats_first(round: usize) -> bool {
    let i = round.max(1) - 1;
    (i + i / PERMUTATIONS.len()).is_multiple_of(2)
}

/// Whether, in a peer block holding two peers (the block suite's bpftrace
/// and rezolus), the second one runs first in round `round`. Two peers share
/// one block rather than each taking a block of its own: the six
/// permutations of three blocks, which the net and tls suites share, stay as
/// they are, and each peer still takes each place among the blocks equally
/// often; within the block the order goes bpftrace, bpftrace, rezolus,
/// rezolus, bpftrace, bpftrace over the six permutations and flips for the
/// next six, so over twelve rounds each peer goes first with each order of
/// blocks once and with each order of [`stats_first`] equally often (a
/// plain alternation would be the same pattern as `stats_first`, and one
/// peer would always have its accounting run first).
pub fn second_peer_first(round: usize) -> bool {
    let i = round.max(1) - 1;
    let n = PERMUTATIONS.len();
    ((i % n) / 2 + i / n) % 2 == 1
}

/// The order of a suite's `n` parts in round `round`: rotated by one each round.
pub fn parts(round: usize, n: usize) -> Vec<usize> {
    let i = round.max(1) - 1;
    (0..n).map(|j| (i + j) % n.max(1)).collect()
}

/// Under a daemon: each part's two runs, in this round's order (true: with
/// the kernel's accounting on).
pub fn stats_order(round: usize) -> [bool; 2] {
    if stats_first(round) {
        [true, false]
    } else {
        [false, true]
    }
}

/// What a process (the daemon, bpftrace) used over one run.
#[derive(Serialize, Clone, Copy, Debug, Default, PartialEq)]
pub struct ProcessUse {
    /// user + system, all threads, over the run.
    pub cpu_s: f64,
    pub window_s: f64,
    /// VmHWM at the end of the run: the peak of its life so far.
    pub peak_rss_kib: u64,
}

impl ProcessUse {
    pub fn cpu_pct_of_one_cpu(&self) -> f64 {
        100.0 * self.cpu_s / self.window_s
    }

    pub fn peak_rss_mib(&self) -> f64 {
        self.peak_rss_kib as f64 / 1024.0
    }
}

/// One run of a part under a tracer, the daemon or the bpftrace peer: the
/// workload's figures (`R`: fio's, a net workload's), its programs' costs
/// over the run (`P`; zero unless the accounting was on), and the tracer
/// process's use.
#[derive(Clone)]
pub struct TracedRun<R, P> {
    pub run: R,
    pub programs: Vec<P>,
    pub usage: ProcessUse,
}

/// One configuration's runs of a part under a daemon or a peer, one per
/// round each: as deployed (`plain`: its programs count no runs) and with
/// the kernel's accounting on (`bpf_stats`: the per-program costs come from
/// these).
pub struct Accounted<T> {
    pub plain: Vec<T>,
    pub bpf_stats: Vec<T>,
}

impl<T> Accounted<T> {
    /// Files a run under the configuration it ran in (`stats`: the accounting on).
    pub fn file(&mut self, stats: bool, run: T) {
        if stats {
            self.bpf_stats.push(run);
        } else {
            self.plain.push(run);
        }
    }
}

impl<T> Default for Accounted<T> {
    fn default() -> Self {
        Accounted {
            plain: Vec::new(),
            bpf_stats: Vec::new(),
        }
    }
}

/// Every configuration's runs of one part of a suite (`part`: a depth, a
/// workload), one per round, in round order (index i of each is round i +
/// 1: the pairs).
pub struct PartRuns<K, R> {
    pub part: K,
    pub untraced: Vec<R>,
    /// Each daemon configuration of the suite (block, net: stalltrace as
    /// deployed; tls: `--sql-tls off`, `always`).
    pub daemons: Vec<Accounted<TracedRun<R, ProgramCost>>>,
    /// Each peer of the suite (block: bpftrace, rezolus when installed;
    /// net: bpftrace).
    pub peers: Vec<Accounted<TracedRun<R, PeerProgram>>>,
    /// Empty programs on the daemon's hooks (see `floor`), in the daemon's
    /// block after it stopped, with the accounting on; their process
    /// is the bench's own, so its use is zero. Empty for suites without a floor.
    pub floor: Vec<TracedRun<R, PeerProgram>>,
}

impl<K, R> PartRuns<K, R> {
    /// No runs yet, for `daemons` daemon configurations and `peers` peers.
    pub fn new(part: K, daemons: usize, peers: usize) -> Self {
        PartRuns {
            part,
            untraced: Vec::new(),
            daemons: (0..daemons).map(|_| Accounted::default()).collect(),
            peers: (0..peers).map(|_| Accounted::default()).collect(),
            floor: Vec::new(),
        }
    }

    /// stalltrace as deployed (the first daemon configuration).
    pub fn traced(&self) -> &[TracedRun<R, ProgramCost>] {
        self.daemons.first().map_or(&[], |d| &d.plain)
    }

    /// The same daemons with the accounting on.
    pub fn traced_bpf_stats(&self) -> &[TracedRun<R, ProgramCost>] {
        self.daemons.first().map_or(&[], |d| &d.bpf_stats)
    }

    /// Peer `i`'s runs as deployed; none where it did not run.
    pub fn peer(&self, i: usize) -> &[TracedRun<R, PeerProgram>] {
        self.peers.get(i).map_or(&[], |p| &p.plain)
    }

    /// Peer `i`'s runs with the accounting on.
    pub fn peer_bpf_stats(&self, i: usize) -> &[TracedRun<R, PeerProgram>] {
        self.peers.get(i).map_or(&[], |p| &p.bpf_stats)
    }
}

/// Every part's two runs under one tracer, in this round's order: the
/// parts' rotation (`parts`), and within a part, which of the two runs
/// (accounting on or off) comes first. `run(i, stats)` makes one; the
/// results come with their part index and `stats`.
pub fn each_run<W>(
    round: usize,
    parts: &[usize],
    mut run: impl FnMut(usize, bool) -> anyhow::Result<W>,
) -> anyhow::Result<Vec<(usize, bool, W)>> {
    let mut runs = Vec::new();
    for &i in parts {
        for stats in stats_order(round) {
            runs.push((i, stats, run(i, stats)?));
        }
    }
    Ok(runs)
}

/// One run under a daemon or a peer: the workload's figures, what the
/// process used, and its programs' counters over the run.
pub struct Window<R> {
    pub run: R,
    pub usage: ProcessUse,
    /// By program id: zero unless the kernel's accounting was on.
    pub counters: BTreeMap<u64, Counter>,
}

/// Run `work` under a process whose usage `usage` reads and whose programs
/// are `ids`, with the kernel's per-program accounting on for the run only
/// when `stats` (`BPF_ENABLE_STATS`, held by this process: the same as the
/// daemon's `--bpf-stats`, but for one run of the daemon's life).
pub fn window<R>(
    ids: &[u64],
    stats: bool,
    usage: impl Fn() -> anyhow::Result<Usage>,
    work: impl FnOnce() -> anyhow::Result<R>,
) -> anyhow::Result<Window<R>> {
    let counters = Snapshot::take(ids)?;
    let before = usage()?;
    let began = Instant::now();
    let on = stats.then(StatsOn::enable).transpose()?;
    let run = work();
    drop(on);
    let window_s = began.elapsed().as_secs_f64();
    let run = run?;
    let after = usage()?;
    Ok(Window {
        run,
        usage: ProcessUse {
            cpu_s: (after.cpu_s - before.cpu_s).max(0.0),
            window_s,
            peak_rss_kib: after.peak_rss_kib,
        },
        counters: Snapshot::take(ids)?.since(&counters),
    })
}

/// Why a run without the accounting is disturbed, if its programs counted
/// runs all the same (`counted`): another process held bpf_stats on, so the
/// run paid for them. Not when the sysctl has them on for good (`sysctl`:
/// then every run pays, and a warning says so).
pub fn stats_disturbance(stats: bool, sysctl: bool, counted: u64) -> Option<String> {
    (!stats && !sysctl && counted > 0).then(|| {
        format!(
            "bpf_stats were on although the bench had not turned them on (the programs \
             counted {counted} runs in this run): another process held them"
        )
    })
}

/// Whether the sysctl kernel.bpf_stats_enabled is on, with a warning into
/// `warnings` if so: the kernel then accounts every program run whatever the
/// bench asks for, and the "traced" configuration pays for bpf_stats too.
pub fn stats_sysctl_on(warnings: &mut Vec<String>) -> bool {
    let on = super::tracer::bpf_stats_sysctl();
    if on {
        let w = "sysctl kernel.bpf_stats_enabled was 1, so the traced runs without \
                 the accounting paid the bpf_stats cost too";
        eprintln!("bench: warning: {w}");
        warnings.push(w.to_string());
    }
    on
}

/// How the runs with the accounting differ from the traced ones, for the published setup.
pub const TRACER_BPF_STATS: &str = "the same daemon (no --bpf-stats), with the kernel's \
     per-program accounting turned on by the bench (BPF_ENABLE_STATS) for that run only, its \
     programs' counters read with bpftool before and after the run";

/// The order of play in words, for the published setup.
pub const ORDER: &str = "each round runs three blocks: untraced; traced (one daemon \
     started for the block, each part run under it as deployed and, in the same daemon's life, \
     with the kernel's per-program accounting turned on by the bench for that run only); the \
     bpftrace peer (one bpftrace for the block, the same two runs). The blocks' order goes \
     through all six permutations, the parts' order rotates, and which of a part's two runs \
     comes first alternates, so drift on the host hits every configuration alike";

/// A run's configuration as the progress lines name it: `tool` ("traced",
/// "bpftrace"), with "+bpf-stats" when the accounting was on.
pub fn config(tool: &str, stats: bool) -> String {
    if stats {
        format!("{tool}+bpf-stats")
    } else {
        tool.to_string()
    }
}

/// A daemon's windows (part index, accounting on, window), their programs
/// named once the daemon has stopped: `attached` as its start record gave
/// them, `stop` its stop record. Names are known only then (see
/// `programs::resolve`), so the windows wait for it.
pub fn named<R>(
    windows: Vec<(usize, bool, Window<R>)>,
    attached: &[(u64, String, String)],
    stop: &StopRecord,
) -> Vec<(usize, bool, TracedRun<R, ProgramCost>)> {
    let names: BTreeMap<u64, String> = windows
        .iter()
        .flat_map(|(_, _, w)| w.counters.iter().map(|(id, c)| (*id, c.name.clone())))
        .collect();
    let keys = programs::resolve(attached, &names, stop);
    windows
        .into_iter()
        .map(|(i, stats, w)| {
            let run = TracedRun {
                programs: programs::window_costs(&w.counters, &keys, stop),
                run: w.run,
                usage: w.usage,
            };
            (i, stats, run)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_block_takes_every_place_equally_often() {
        let mut seen = [[0; 3]; 3];
        for round in 1..=6 {
            for (place, b) in permuted(round, [0, 1, 2]).iter().enumerate() {
                seen[*b][place] += 1;
            }
        }
        assert_eq!(seen, [[2; 3]; 3]);
        assert_eq!(
            permuted(1, ["none", "off", "always"]),
            ["none", "off", "always"]
        );
        assert_eq!(permuted(2, ['a', 'b', 'c']), ['b', 'c', 'a']);
        assert_eq!(permuted(5, ['a', 'b', 'c']), ['c', 'b', 'a']);
        assert_eq!(permuted(7, ['a', 'b', 'c']), permuted(1, ['a', 'b', 'c']));
        // Every round holds each block once.
        for round in 1..=6 {
            let mut b = permuted(round, [0, 1, 2]);
            b.sort();
            assert_eq!(b, [0, 1, 2]);
        }
    }

    #[test]
    fn the_accounting_run_alternates_and_meets_every_order_both_ways() {
        let firsts: Vec<bool> = (1..=12).map(stats_first).collect();
        assert_eq!(&firsts[..6], [true, false, true, false, true, false]);
        assert_eq!(&firsts[6..], [false, true, false, true, false, true]);
        for p in 0..6 {
            assert_ne!(stats_first(p + 1), stats_first(p + 7), "permutation {p}");
        }
    }

    #[test]
    fn accounting_counted_runs_disturb_only_runs_without_it() {
        assert_eq!(stats_disturbance(true, false, 10), None);
        assert_eq!(stats_disturbance(false, true, 10), None);
        assert_eq!(stats_disturbance(false, false, 0), None);
        let why = stats_disturbance(false, false, 10).unwrap();
        assert!(why.contains("counted 10 runs"), "{why}");
        assert_eq!(stats_order(1), [true, false]);
        assert_eq!(stats_order(2), [false, true]);
        let u = ProcessUse {
            cpu_s: 0.01,
            window_s: 2.0,
            peak_rss_kib: 2048,
        };
        assert!((u.cpu_pct_of_one_cpu() - 0.5).abs() < 1e-12);
        assert_eq!(u.peak_rss_mib(), 2.0);
    }

    #[test]
    fn two_peers_in_one_block_take_turns_fairly() {
        let second: Vec<bool> = (1..=12).map(second_peer_first).collect();
        assert_eq!(second.iter().filter(|&&b| b).count(), 6);
        let mut with_stats = BTreeMap::new();
        for round in 1..=12 {
            // Each order of blocks meets both orders of the peers.
            if round <= 6 {
                assert_ne!(second_peer_first(round), second_peer_first(round + 6));
            }
            *with_stats
                .entry((second_peer_first(round), stats_first(round)))
                .or_insert(0) += 1;
        }
        assert_eq!(with_stats.values().copied().collect::<Vec<_>>(), [3; 4]);
        assert!(!second_peer_first(1));
    }

    #[test]
    fn parts_rotate() {
        assert_eq!(parts(1, 3), [0, 1, 2]);
        assert_eq!(parts(2, 3), [1, 2, 0]);
        assert_eq!(parts(4, 3), [0, 1, 2]);
        assert_eq!(parts(2, 2), [1, 0]);
        assert_eq!(parts(5, 1), [0]);
    }
}
