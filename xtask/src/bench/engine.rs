//! The paired-rounds engine that the block, net and tls suites configure:
//! every round, a suite's three blocks in the order `paired` gives, each
//! part once per configuration (twice under a daemon or a peer: as deployed
//! and with the kernel's accounting on), one daemon per daemon block, the
//! floor right after it when the suite has one, and one process per peer
//! in the peer block. A suite is a [`Suite`]: its parts, how to run one
//! under a configuration, how to start its daemons and peers; the order of
//! play, the quiet-host retries, the accounting windows and where each run
//! is filed are the engine's, once for every suite.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

use anyhow::{Context, bail};

use super::floor::{self, AttachPoint, Floor};
use super::paired::{self, PartRuns, TracedRun, Window};
use super::peers::{Peer, PeerProgram};
use super::quiet::{self, Quiet};
use super::settings::Settings;
use super::tracer::programs::{Counter, total_runs};
use super::tracer::{ProgramCost, StopRecord, Tracer, Usage};

/// What a suite runs in one of a round's three blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Block {
    /// No tracer at all.
    Untraced,
    /// One daemon for the block, in the suite's configuration of that index
    /// (`Suite::daemon_name`); the floor right after it when the suite has one.
    Daemon(usize),
    /// Every peer of the suite, one process each for the block.
    Peers,
}

/// A daemon a suite started for a block.
pub struct Daemon {
    pub tracer: Tracer,
    /// Its programs whose counters each run reads: (id, family, hook).
    pub attached: Vec<(u64, String, String)>,
    /// Its programs, which the quiet-host check does not count as someone else's.
    pub ours: Vec<u64>,
}

impl Daemon {
    /// A daemon whose programs are those its start record lists.
    pub fn of(tracer: Tracer) -> Self {
        Daemon {
            attached: tracer.attached_programs(),
            ours: tracer.prog_ids(),
            tracer,
        }
    }
}

/// One daemon, from start to stop, and what its suite read from its output
/// once it had stopped (`output`: `()` for suites that read nothing).
pub struct DaemonLife<X> {
    pub stop: StopRecord,
    /// user + system over its whole life: load, verify and attach included.
    pub lifetime_cpu_s: f64,
    pub output: X,
}

/// A suite as the engine drives it.
pub trait Suite {
    /// What one part is (a device and depth, a workload, a BIO style).
    type Part: Copy;
    /// One run's figures.
    type Run: Clone;
    /// What the suite reads from a daemon's output after it stopped.
    type Output;
    /// How the progress lines name the configuration without a tracer.
    const UNTRACED: &'static str = "untraced";
    /// Whether a failed run, or a block with a failed run, is tried again
    /// (with a new daemon or peer): the suites with servers of their own,
    /// which someone else's cleanup on a shared host may kill.
    const RETRY_FAILURES: bool = false;

    /// The round's three blocks, in the order of round 1; the engine permutes them.
    fn blocks(&self) -> [Block; 3];
    /// The progress lines' and the tags' name of daemon configuration `config`.
    fn daemon_name(&self, _config: usize) -> &'static str {
        "traced"
    }
    fn parts(&self) -> Vec<Self::Part>;
    /// How the progress lines name a part.
    fn part_name(&self, part: Self::Part) -> String;
    /// Where the daemons, peers and the floor write their files.
    fn scratch(&self) -> &Path;
    /// The quiet-host budget of a suite that waits for a quiet host before
    /// each attempt of a run or a block.
    fn quiet(&mut self) -> Option<&mut Quiet> {
        None
    }
    /// Before each attempt of a run or a block, what the suite's workload
    /// needs (net: its servers up again after someone else's cleanup).
    fn before_attempt(&mut self) -> anyhow::Result<()> {
        Ok(())
    }
    /// Why the host is not quiet right now, if it is not.
    fn disturbance(&self, ours: &[u64]) -> Option<String>;
    /// Each attempt's disturbance on its way to the retry, for suites that count them.
    fn note(&mut self, _label: &str, why: Option<String>) -> Option<String> {
        why
    }
    /// One run of `part`, under `daemon` when there is one.
    fn run(&mut self, part: Self::Part, daemon: Option<&Tracer>) -> anyhow::Result<Self::Run>;
    /// One line per run; `accounted`: its daemon's counters, in a daemon's
    /// run with the accounting on.
    fn progress(
        &self,
        label: &str,
        part: Self::Part,
        run: &Self::Run,
        accounted: Option<&BTreeMap<u64, Counter>>,
    );
    /// Start round `round`'s daemon of configuration `config`, its files tagged `tag`.
    fn start_daemon(&mut self, config: usize, round: usize, tag: &str) -> anyhow::Result<Daemon>;
    /// The floor's attach points for a daemon just started; None for a suite without a floor.
    fn floor_points(&self, _daemon: &Tracer) -> anyhow::Result<Option<Vec<AttachPoint>>> {
        Ok(None)
    }
    /// Read what the suite needs from a stopped daemon's output file; `block` labels the block.
    fn stopped(&mut self, out: &Path, block: &str) -> anyhow::Result<Self::Output>;
    /// Whether a daemon's run is what its configuration claims; a failed check ends the bench.
    fn check(
        &self,
        _config: usize,
        _stats: bool,
        _run: &TracedRun<Self::Run, ProgramCost>,
    ) -> Result<(), String> {
        Ok(())
    }
    /// How many peers the peer block holds (at most two).
    fn peers(&self) -> usize {
        0
    }
    /// Peer `peer`'s name, for its files' tag.
    fn peer_name(&self, _peer: usize) -> &'static str {
        "peer"
    }
    /// Start peer `peer`, its files tagged `tag`.
    fn start_peer(&self, _peer: usize, _tag: &str) -> anyhow::Result<Box<dyn Peer>> {
        bail!("this suite has no peer")
    }
}

/// Everything the engine measured: each part's runs (`K` the part, `R` a
/// run's figures) and each daemon's life (`X` what the suite read from its output).
pub struct Runs<K, R, X> {
    pub parts: Vec<PartRuns<K, R>>,
    /// One per daemon block, in order.
    pub daemons: Vec<DaemonLife<X>>,
    /// The floor's programs, compiled for the daemon's hooks (None before
    /// a daemon block ran, or for a suite without a floor).
    pub floor: Option<floor::Object>,
    /// Anything that may have disturbed the figures.
    pub warnings: Vec<String>,
}

/// Every round of `suite`, `warnings` those the suite gathered before.
pub fn measure<S: Suite>(
    suite: &mut S,
    settings: &Settings,
    mut warnings: Vec<String>,
) -> anyhow::Result<Runs<S::Part, S::Run, S::Output>> {
    let stats_sysctl = paired::stats_sysctl_on(&mut warnings);
    let blocks = suite.blocks();
    let daemons = blocks
        .iter()
        .filter(|b| matches!(b, Block::Daemon(_)))
        .count();
    let peers = suite.peers();
    let mut engine = Engine {
        settings,
        stats_sysctl,
        runs: Runs {
            parts: suite
                .parts()
                .into_iter()
                .map(|p| PartRuns::new(p, daemons, peers))
                .collect(),
            daemons: Vec::new(),
            floor: None,
            warnings,
        },
        suite,
    };
    for round in 1..=settings.rounds {
        let order = paired::parts(round, engine.runs.parts.len());
        for block in paired::permuted(round, blocks) {
            match block {
                Block::Untraced => engine.untraced(round, &order)?,
                Block::Daemon(config) => engine.daemon(round, &order, config)?,
                Block::Peers => {
                    // Two peers share the block, taking turns (see `paired::second_peer_first`).
                    let second_first = paired::second_peer_first(round);
                    for second in [second_first, !second_first] {
                        let peer = usize::from(second);
                        if peer < peers {
                            engine.peer(round, &order, peer)?;
                        }
                    }
                }
            }
        }
    }
    Ok(engine.runs)
}

/// Before each attempt of a run or a block: the scratch directory there
/// (someone else's cleanup of a shared host may remove it), what the
/// workload needs, and a quiet host waited for within the budget (`ours`:
/// the programs under which the attempt runs).
fn prepare<S: Suite>(suite: &mut S, label: &str, ours: &[u64]) -> anyhow::Result<()> {
    let scratch = suite.scratch();
    fs::create_dir_all(scratch).with_context(|| format!("cannot create {}", scratch.display()))?;
    suite.before_attempt()?;
    if let Some(quiet) = suite.quiet()
        && let Some(why) = quiet.before_run(ours)?
    {
        eprintln!("bench: {label}: measuring anyway: {why}");
    }
    Ok(())
}

struct Engine<'a, S: Suite> {
    suite: &'a mut S,
    settings: &'a Settings,
    /// sysctl kernel.bpf_stats_enabled was 1: every run counts program runs.
    stats_sysctl: bool,
    runs: Runs<S::Part, S::Run, S::Output>,
}

/// What a block's runs are made under: its programs (`ours`, for the
/// quiet-host check; `ids`, those whose counters are read), its process's
/// use, and the daemon when it is one.
struct Under<'a> {
    ours: &'a [u64],
    ids: &'a [u64],
    usage: &'a dyn Fn() -> anyhow::Result<Usage>,
    daemon: Option<&'a Tracer>,
}

/// A run of part `i` under a peer or the floor.
type PeerRun<S> = TracedRun<<S as Suite>::Run, PeerProgram>;
/// A daemon block's result: its runs (part, accounting on, run), its life, the floor's runs.
type DaemonBlock<S> = (
    Vec<(usize, bool, TracedRun<<S as Suite>::Run, ProgramCost>)>,
    DaemonLife<<S as Suite>::Output>,
    Vec<(usize, PeerRun<S>)>,
);

impl<S: Suite> Engine<'_, S> {
    fn label(&self, round: usize, i: usize, config: &str) -> String {
        let part = self.runs.parts[i].part;
        format!(
            "round {round}/{} {} {config}",
            self.settings.rounds,
            self.suite.part_name(part)
        )
    }

    fn untraced(&mut self, round: usize, order: &[usize]) -> anyhow::Result<()> {
        for &i in order {
            let part = self.runs.parts[i].part;
            let label = self.label(round, i, S::UNTRACED);
            let suite = &mut *self.suite;
            let attempt = || {
                prepare(suite, &label, &[])?;
                let before = suite.disturbance(&[]);
                let run = suite.run(part, None)?;
                let disturbed = before.or_else(|| suite.disturbance(&[]));
                Ok((run, suite.note(&label, disturbed)))
            };
            let warnings = &mut self.runs.warnings;
            let run = if S::RETRY_FAILURES {
                quiet::retry_failures(&label, warnings, attempt)?
            } else {
                quiet::retry(&label, warnings, attempt)?
            };
            self.suite.progress(&label, part, &run, None);
            self.runs.parts[i].untraced.push(run);
        }
        Ok(())
    }

    /// One run of part `i` under `under`, with the accounting on when
    /// `stats`; tried again (up to the usual attempts) when disturbed, its
    /// warnings into `warnings`.
    fn window(
        &mut self,
        warnings: &mut Vec<String>,
        label: &str,
        i: usize,
        under: &Under,
        stats: bool,
    ) -> anyhow::Result<Window<S::Run>> {
        let part = self.runs.parts[i].part;
        let stats_sysctl = self.stats_sysctl;
        let suite = &mut *self.suite;
        let win = quiet::retry(label, warnings, || {
            prepare(suite, label, under.ours)?;
            let before = suite.disturbance(under.ours);
            let win = paired::window(under.ids, stats, under.usage, || {
                suite.run(part, under.daemon)
            })?;
            let disturbed = before
                .or_else(|| suite.disturbance(under.ours))
                .or_else(|| {
                    paired::stats_disturbance(stats, stats_sysctl, total_runs(&win.counters))
                });
            Ok((win, suite.note(label, disturbed)))
        })?;
        let accounted = (under.daemon.is_some() && stats).then_some(&win.counters);
        self.suite.progress(label, part, &win.run, accounted);
        Ok(win)
    }

    /// A block of runs under one daemon or peer (`tool`), run again as a
    /// whole, with a new process, when it fails and the suite retries
    /// failures: `attempt(engine, warnings, block)` runs it once, `block`
    /// its label. Only the warnings of the attempt that succeeded are kept.
    fn block<T>(
        &mut self,
        round: usize,
        tool: &str,
        mut attempt: impl FnMut(&mut Self, &mut Vec<String>, &str) -> anyhow::Result<T>,
    ) -> anyhow::Result<T> {
        let block = format!("round {round}/{} {tool} block", self.settings.rounds);
        let mut warnings = std::mem::take(&mut self.runs.warnings);
        let done = if S::RETRY_FAILURES {
            let mut inner = Vec::new();
            let done = quiet::retry_failures(&block, &mut warnings, || {
                inner.clear();
                prepare(self.suite, &block, &[])?;
                Ok((attempt(self, &mut inner, &block)?, None))
            });
            warnings.append(&mut inner);
            done
        } else {
            attempt(self, &mut warnings, &block)
        };
        self.runs.warnings = warnings;
        done
    }

    /// One daemon for the block: each part as deployed and with the
    /// accounting on, each run's program counters read around it and named
    /// after the daemon has stopped (by its stop record); then the floor on
    /// its hooks, when the suite has one.
    fn daemon(&mut self, round: usize, order: &[usize], config: usize) -> anyhow::Result<()> {
        let name = self.suite.daemon_name(config);
        let (runs, life, floor_runs) = self.block(round, name, |engine, warnings, block| {
            engine.daemon_block(warnings, block, (round, order), config)
        })?;
        for (i, stats, run) in runs {
            if let Err(why) = self.suite.check(config, stats, &run) {
                let label = self.label(round, i, &paired::config(name, stats));
                bail!(
                    "{label}: {why}: the figures would not be what they claim; nothing published"
                );
            }
            self.runs.parts[i].daemons[config].file(stats, run);
        }
        for (i, run) in floor_runs {
            self.runs.parts[i].floor.push(run);
        }
        self.runs.daemons.push(life);
        Ok(())
    }

    fn daemon_block(
        &mut self,
        warnings: &mut Vec<String>,
        block: &str,
        (round, order): (usize, &[usize]),
        config: usize,
    ) -> anyhow::Result<DaemonBlock<S>> {
        let name = self.suite.daemon_name(config);
        let tag = format!("r{round}-{name}");
        let daemon = self.suite.start_daemon(config, round, &tag)?;
        let points = self.suite.floor_points(&daemon.tracer)?;
        let ids: Vec<u64> = daemon.attached.iter().map(|(id, _, _)| *id).collect();
        let tracer = &daemon.tracer;
        let usage = || tracer.usage();
        let under = Under {
            ours: &daemon.ours,
            ids: &ids,
            usage: &usage,
            daemon: Some(tracer),
        };
        let windows = paired::each_run(round, order, |i, stats| {
            let label = self.label(round, i, &paired::config(name, stats));
            self.window(warnings, &label, i, &under, stats)
        })?;
        let out = tracer.out().to_path_buf();
        let finished = daemon.tracer.stop()?;
        let output = self.suite.stopped(&out, block)?;
        let runs = paired::named(windows, &daemon.attached, &finished.stop);
        let life = DaemonLife {
            stop: finished.stop,
            lifetime_cpu_s: finished.lifetime_cpu_s,
            output,
        };
        let floor_runs = match points {
            Some(points) => self.floor(warnings, (round, order), &points)?,
            None => Vec::new(),
        };
        Ok((runs, life, floor_runs))
    }

    /// The floor in the daemon's place, right after it stopped: empty
    /// programs on `points` (its hooks, as it attached them), each part once
    /// with the accounting on. Compiled once, and again only if a daemon
    /// attached other hooks.
    fn floor(
        &mut self,
        warnings: &mut Vec<String>,
        (round, order): (usize, &[usize]),
        points: &[AttachPoint],
    ) -> anyhow::Result<Vec<(usize, PeerRun<S>)>> {
        if self.runs.floor.as_ref().is_none_or(|o| o.points != points) {
            self.runs.floor = Some(floor::Object::compile(points, self.suite.scratch())?);
        }
        let attached = Floor::attach(self.runs.floor.as_ref().expect("compiled above"))?;
        let ids = attached.prog_ids();
        let usage = || Ok(Floor::usage());
        let under = Under {
            ours: &ids,
            ids: &ids,
            usage: &usage,
            daemon: None,
        };
        let mut out = Vec::new();
        for &i in order {
            let label = self.label(round, i, &paired::config("floor", true));
            let win = self.window(warnings, &label, i, &under, true)?;
            let run = TracedRun {
                programs: attached.costs(&win.counters),
                run: win.run,
                usage: win.usage,
            };
            out.push((i, run));
        }
        attached.detach()?;
        Ok(out)
    }

    /// One process of peer `peer` for the block, the same two runs per part as the daemon's.
    fn peer(&mut self, round: usize, order: &[usize], peer: usize) -> anyhow::Result<()> {
        let name = self.suite.peer_name(peer);
        let runs = self.block(round, name, |engine, warnings, _| {
            let started = engine.suite.start_peer(peer, &format!("r{round}-{name}"))?;
            let ids = started.prog_ids();
            let usage = || started.usage();
            let under = Under {
                ours: &ids,
                ids: &ids,
                usage: &usage,
                daemon: None,
            };
            let runs = paired::each_run(round, order, |i, stats| {
                let label = engine.label(round, i, &paired::config(started.name, stats));
                let win = engine.window(warnings, &label, i, &under, stats)?;
                Ok(TracedRun {
                    programs: started.costs(&win.counters),
                    run: win.run,
                    usage: win.usage,
                })
            })?;
            started.finish()?;
            Ok(runs)
        })?;
        for (i, stats, run) in runs {
            self.runs.parts[i].peers[peer].file(stats, run);
        }
        Ok(())
    }
}
