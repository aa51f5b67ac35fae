//! The net suite's paired-run driver: every round, the untraced, traced and
//! peer blocks in the order `paired` gives, each workload once per
//! configuration; one daemon, one floor (right after the daemon, in the
//! traced block) and one bpftrace per round.

use std::fs;
use std::path::Path;

use anyhow::Context;

use super::workload::{self, Run, Servers, WORKLOADS, Workload};
use super::{
    DaemonLife, Measured, PeerRun, Settings, WorkloadRuns, disturbance, on_net_path, transmits,
};
use crate::bench::floor::{self, AttachPoint, Floor};
use crate::bench::netpair::{self, CLIENT, NetPair, SERVER};
use crate::bench::paired::{self, Block, Window};
use crate::bench::peers::{self, Bpftrace};
use crate::bench::quiet::{self, Quiet};
use crate::bench::tracer::programs::total_runs;
use crate::bench::tracer::{self, Tracer};

struct Ctx<'a> {
    settings: &'a Settings,
    bin: &'a Path,
    scratch: &'a Path,
    filters: [&'a str; 2],
    /// sysctl kernel.bpf_stats_enabled was 1: every run counts program runs.
    stats_sysctl: bool,
}

impl Ctx<'_> {
    fn label(&self, round: usize, w: &Workload, config: &str) -> String {
        format!("round {round}/{} {} {config}", self.settings.rounds, w.key)
    }
}

/// What every run needs and may change: the servers (restarted when someone
/// else's cleanup kills one), the quiet-host budget, and what was restarted.
struct State<'a> {
    servers: Servers<'a>,
    quiet: &'a mut Quiet,
    restarted: Vec<String>,
}

impl State<'_> {
    /// Before each attempt: the servers up, the scratch directory there
    /// (someone else's cleanup of a shared host may remove either), and a
    /// quiet host, waited for within the budget.
    fn prepare(&mut self, scratch: &Path, label: &str, ours: &[u64]) -> anyhow::Result<()> {
        fs::create_dir_all(scratch)
            .with_context(|| format!("cannot create {}", scratch.display()))?;
        for what in self.servers.restart_dead()? {
            let w = format!("restarted a server: {what}");
            eprintln!("bench: {w}");
            self.restarted.push(w);
        }
        if let Some(why) = self.quiet.before_run(ours)? {
            eprintln!("bench: {label}: measuring anyway: {why}");
        }
        Ok(())
    }
}

pub fn measure(
    settings: &Settings,
    bin: &Path,
    pair: &NetPair,
    scratch: &Path,
    quiet_host: &mut Quiet,
    warnings: Vec<String>,
) -> anyhow::Result<Measured> {
    let client_netns = pair.netns(CLIENT).to_string();
    let mut m = Measured {
        workloads: WORKLOADS.iter().map(WorkloadRuns::new).collect(),
        daemons: Vec::new(),
        hooks: Vec::new(),
        floor: None,
        congestion_control: pair
            .try_exec(CLIENT, &["sysctl", "-n", "net.ipv4.tcp_congestion_control"])?
            .trim()
            .to_string(),
        warnings,
        unavailable: Vec::new(),
    };
    eprintln!("bench: trying the usual peers (BCC, the bpftrace package's tools)");
    m.unavailable = peers::unavailable(&["tcpretrans", "tcprtt"]);
    for u in &m.unavailable {
        eprintln!("bench: peer {}: {}", u.tool, u.verdict);
    }
    pair.try_drop_random(
        SERVER,
        workload::LOSS_PERCENT,
        Some(workload::IPERF3_LOSS_PORT),
    )?;
    let server_addr = pair.v4(SERVER).to_string();
    let port = |p: u16| p.to_string();
    let pinned = |args: &[&str]| workload::pinned(args);
    let servers = Servers {
        pair,
        sockperf: netpair::server(
            pair,
            workload::SOCKPERF_PORT,
            &pinned(&[
                "sockperf",
                "server",
                "--tcp",
                "-i",
                &server_addr,
                "-p",
                &port(workload::SOCKPERF_PORT),
            ]),
            scratch,
        )?,
        iperf3: netpair::server(
            pair,
            workload::IPERF3_PORT,
            &pinned(&["iperf3", "-s", "-p", &port(workload::IPERF3_PORT)]),
            scratch,
        )?,
        iperf3_loss: netpair::server(
            pair,
            workload::IPERF3_LOSS_PORT,
            &pinned(&["iperf3", "-s", "-p", &port(workload::IPERF3_LOSS_PORT)]),
            scratch,
        )?,
    };
    eprintln!(
        "bench: {} <-> {} over veth {}/{} ({}), congestion control {}, clients and servers \
         on CPU {}, {} rounds x {} s per run",
        pair.netns(CLIENT),
        pair.netns(SERVER),
        pair.veth(CLIENT),
        pair.veth(SERVER),
        server_addr,
        m.congestion_control,
        workload::CPU,
        settings.rounds,
        settings.runtime_s
    );
    let mut st = State {
        servers,
        quiet: quiet_host,
        restarted: Vec::new(),
    };
    // Fault in the binaries, sockets and the first connection's state once,
    // so round 1's first runs do not pay for them alone.
    for w in &WORKLOADS {
        workload::run(&mut st.servers, w, 2, None)?;
    }
    let stats_sysctl = paired::stats_sysctl_on(&mut m.warnings);
    let ctx = Ctx {
        settings,
        bin,
        scratch,
        filters: ["--netns", client_netns.as_str()],
        stats_sysctl,
    };
    for round in 1..=settings.rounds {
        let parts = paired::parts(round, WORKLOADS.len());
        for block in paired::blocks(round) {
            match block {
                Block::Untraced => untraced(&ctx, &mut st, &mut m, round, &parts)?,
                Block::Traced => traced(&ctx, &mut st, &mut m, round, &parts)?,
                Block::Peer => peer(&ctx, &mut st, &mut m, round, &parts)?,
            }
        }
    }
    m.warnings.append(&mut st.restarted);
    Ok(m)
}

fn untraced(
    ctx: &Ctx,
    st: &mut State,
    m: &mut Measured,
    round: usize,
    parts: &[usize],
) -> anyhow::Result<()> {
    for &i in parts {
        let w = m.workloads[i].part;
        let label = ctx.label(round, w, "untraced");
        let run = quiet::retry_failures(&label, &mut m.warnings, || {
            st.prepare(ctx.scratch, &label, &[])?;
            let before = disturbance(&[]);
            let run = workload::run(&mut st.servers, w, ctx.settings.runtime_s, None)?;
            Ok((run, before.or_else(|| disturbance(&[]))))
        })?;
        progress(&label, w, &run);
        m.workloads[i].untraced.push(run);
    }
    Ok(())
}

/// What a block's runs are made under: the tool as the progress lines name
/// it, its programs (`ours`, for the quiet-host check; `ids`, those whose
/// counters are read), its process's use, and the daemon when it is one
/// (its user time is not "others'").
struct Under<'a> {
    tool: &'static str,
    ours: &'a [u64],
    ids: &'a [u64],
    usage: &'a dyn Fn() -> anyhow::Result<tracer::Usage>,
    daemon: Option<&'a Tracer>,
}

/// One run of workload `w` under `under`, with the accounting on when
/// `stats`; tried again (up to the usual attempts) when disturbed, its
/// warnings into `warnings`.
fn window(
    ctx: &Ctx,
    st: &mut State,
    warnings: &mut Vec<String>,
    (round, w): (usize, &Workload),
    under: &Under,
    stats: bool,
) -> anyhow::Result<Window<Run>> {
    let label = ctx.label(round, w, &paired::config(under.tool, stats));
    let win = quiet::retry(&label, warnings, || {
        st.prepare(ctx.scratch, &label, under.ours)?;
        let before = disturbance(under.ours);
        let runtime_s = ctx.settings.runtime_s;
        let servers = &mut st.servers;
        let win = paired::window(under.ids, stats, under.usage, || {
            workload::run(servers, w, runtime_s, under.daemon)
        })?;
        let disturbed = before.or_else(|| disturbance(under.ours)).or_else(|| {
            paired::stats_disturbance(stats, ctx.stats_sysctl, total_runs(&win.counters))
        });
        Ok((win, disturbed))
    })?;
    progress(&label, w, &win.run);
    Ok(win)
}

/// A block of runs under one tracer (`tool`), run again as a whole, with a
/// new tracer, when it fails (a server killed, the tracer gone):
/// `attempt(st, warnings, block)` runs it once, `block` its label. Only the
/// warnings of the attempt that succeeded are kept.
fn block_under<T>(
    ctx: &Ctx,
    st: &mut State,
    warnings: &mut Vec<String>,
    round: usize,
    tool: &str,
    mut attempt: impl FnMut(&mut State, &mut Vec<String>, &str) -> anyhow::Result<T>,
) -> anyhow::Result<T> {
    let block = format!("round {round}/{} {tool} block", ctx.settings.rounds);
    let mut inner = Vec::new();
    let done = quiet::retry_failures(&block, warnings, || {
        inner.clear();
        st.prepare(ctx.scratch, &block, &[])?;
        Ok((attempt(st, &mut inner, &block)?, None))
    })?;
    warnings.append(&mut inner);
    Ok(done)
}

/// One daemon for the round: each workload as deployed and with the
/// accounting on, each run's program counters read around it and named
/// after the daemon has stopped (by its stop record); then the floor on its
/// network-path hooks. A failure (a server killed, the daemon gone, the
/// floor not attaching) runs the whole block again with a new daemon, so
/// that a round's floor runs always follow its own daemon's.
fn traced(
    ctx: &Ctx,
    st: &mut State,
    m: &mut Measured,
    round: usize,
    parts: &[usize],
) -> anyhow::Result<()> {
    // Apart from `m.warnings`, which `block_under` holds for the block.
    let compiled = &mut m.floor;
    let (runs, life, hooks, floor_runs) = block_under(
        ctx,
        st,
        &mut m.warnings,
        round,
        "traced",
        |st, inner, block| {
            let tag = format!("r{round}-traced");
            let tracer = Tracer::start(ctx.bin, ctx.scratch, &tag, false, &ctx.filters)?;
            let hooks: Vec<String> = tracer
                .families()
                .into_iter()
                .filter(|f| on_net_path(f))
                .map(|f| format!("{f}: {}", tracer.hooks_of(&f).join(", ")))
                .collect();
            let points = net_points(&tracer.start)?;
            let attached = tracer.attached_programs();
            let ids: Vec<u64> = attached.iter().map(|(id, _, _)| *id).collect();
            let net_ids: Vec<u64> = attached
                .iter()
                .filter(|(_, f, _)| on_net_path(f))
                .map(|(id, _, _)| *id)
                .collect();
            let ours = tracer.prog_ids();
            let usage = || tracer.usage();
            let under = Under {
                tool: "traced",
                ours: &ours,
                ids: &ids,
                usage: &usage,
                daemon: Some(&tracer),
            };
            let runs = paired::each_run(round, parts, |i, stats| {
                let w = &WORKLOADS[i];
                let win = window(ctx, st, inner, (round, w), &under, stats)?;
                if stats {
                    let (n, ns) = win
                        .counters
                        .iter()
                        .filter(|(id, _)| net_ids.contains(id))
                        .fold((0, 0), |(n, ns), (_, c)| {
                            (n + c.run_count, ns + c.run_time_ns)
                        });
                    eprintln!(
                        "bench: {:<42} {n} network-path program runs ({:.0}/s), {:.0} ns per run",
                        "",
                        n as f64 / win.run.seconds,
                        ns as f64 / n.max(1) as f64
                    );
                }
                Ok(win)
            })?;
            let out = tracer.out().to_path_buf();
            let finished = tracer.stop()?;
            let (tx_seen, tx_counted) = transmits(&out, st.servers.pair.veth(CLIENT))?;
            eprintln!(
                "bench: {:<42} hooks saw {tx_seen} of {tx_counted} transmits on the client veth",
                format!("{block}:")
            );
            let runs = paired::named(runs, &attached, &finished.stop);
            let life = DaemonLife {
                stop: finished.stop,
                lifetime_cpu_s: finished.lifetime_cpu_s,
                tx_seen,
                tx_counted,
            };
            let floor_runs = floor_block(ctx, st, inner, (round, parts), &points, compiled)?;
            Ok((runs, life, hooks, floor_runs))
        },
    )?;
    if m.hooks.is_empty() {
        m.hooks = hooks;
    }
    for (i, stats, run) in runs {
        m.workloads[i].file_traced(stats, run);
    }
    for (i, run) in floor_runs {
        m.workloads[i].floor.push(run);
    }
    m.daemons.push(life);
    Ok(())
}

/// The network-path hooks the daemon attached (every family but block:
/// tcp, netdev, sqlserver), each attach point once: families share hooks
/// (netdev and sqlserver both attach tcp_probe), and the floor puts one
/// program on a point however many of the daemon's programs sit there.
fn net_points(start: &serde_json::Value) -> anyhow::Result<Vec<AttachPoint>> {
    let mut out: Vec<AttachPoint> = Vec::new();
    let mut families: Vec<&str> = Vec::new();
    let probes = start["probes"].as_array().into_iter().flatten();
    for f in probes.filter_map(|p| p["family"].as_str()) {
        if on_net_path(f) && !families.contains(&f) {
            families.push(f);
        }
    }
    for family in families {
        for p in floor::points_of(start, family)? {
            if !out.iter().any(|o| o.kind == p.kind && o.target == p.target) {
                out.push(p);
            }
        }
    }
    Ok(out)
}

/// The floor in the daemon's place, right after it stopped: empty programs
/// on `points` (its network-path hooks, as it attached them), each workload
/// once with the accounting on. Compiled once into `compiled`, and again
/// only if a daemon attached other hooks.
fn floor_block(
    ctx: &Ctx,
    st: &mut State,
    warnings: &mut Vec<String>,
    (round, parts): (usize, &[usize]),
    points: &[AttachPoint],
    compiled: &mut Option<floor::Object>,
) -> anyhow::Result<Vec<(usize, PeerRun)>> {
    if compiled.as_ref().is_none_or(|o| o.points != points) {
        *compiled = Some(floor::Object::compile(points, ctx.scratch)?);
    }
    let attached = Floor::attach(compiled.as_ref().expect("compiled above"))?;
    let ids = attached.prog_ids();
    let usage = || Ok(Floor::usage());
    let under = Under {
        tool: "floor",
        ours: &ids,
        ids: &ids,
        usage: &usage,
        daemon: None,
    };
    let mut out = Vec::new();
    for &i in parts {
        let win = window(ctx, st, warnings, (round, &WORKLOADS[i]), &under, true)?;
        out.push((
            i,
            PeerRun {
                programs: attached.costs(&win.counters),
                run: win.run,
                usage: win.usage,
            },
        ));
    }
    attached.detach()?;
    Ok(out)
}

/// One bpftrace for the round, the same two runs per workload as the daemon's.
fn peer(
    ctx: &Ctx,
    st: &mut State,
    m: &mut Measured,
    round: usize,
    parts: &[usize],
) -> anyhow::Result<()> {
    let runs = block_under(
        ctx,
        st,
        &mut m.warnings,
        round,
        "bpftrace",
        |st, inner, _| {
            let tag = format!("r{round}-bpftrace");
            let peer = Bpftrace::start(&peers::TCP_RETRANSMIT, ctx.scratch, &tag)?;
            let ids = peer.prog_ids();
            let usage = || peer.usage();
            let under = Under {
                tool: "bpftrace",
                ours: &ids,
                ids: &ids,
                usage: &usage,
                daemon: None,
            };
            let runs = paired::each_run(round, parts, |i, stats| {
                let win = window(ctx, st, inner, (round, &WORKLOADS[i]), &under, stats)?;
                Ok(PeerRun {
                    programs: peer.costs(&win.counters),
                    run: win.run,
                    usage: win.usage,
                })
            })?;
            peer.stop()?;
            Ok(runs)
        },
    )?;
    for (i, stats, run) in runs {
        m.workloads[i].file_peer(stats, run);
    }
    Ok(())
}

/// One line per run, figures lined up across configurations.
fn progress(label: &str, w: &Workload, run: &Run) {
    let head = format!("{label}:");
    let figures: Vec<String> = w
        .figures
        .iter()
        .map(|f| format!("{} {:.*}", f.header, f.digits, run.figure(f.key)))
        .collect();
    eprintln!(
        "bench: {head:<42} {} (steal {:.1}%)",
        figures.join(", "),
        run.steal_pct
    );
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    #[test]
    fn each_network_path_attach_point_once_and_no_block_hook() {
        let probe = |family: &str, hook: &str| {
            json!({"family": family, "hook": hook, "mode": "tp_btf", "attached": true,
                   "via": "tp_btf", "target": hook})
        };
        let start = json!({"type": "start", "probes": [
            probe("block", "block_rq_issue"),
            probe("tcp", "sock_recv_length"),
            probe("netdev", "tcp_probe"),
            probe("netdev", "net_dev_xmit"),
            probe("sqlserver", "tcp_probe"),
            probe("sqlserver", "tcp_sendmsg_locked"),
        ]});
        let points = super::net_points(&start).unwrap();
        let sections: Vec<String> = points.iter().map(|p| p.section()).collect();
        assert_eq!(
            sections,
            [
                "tp_btf/sock_recv_length",
                "tp_btf/tcp_probe",
                "tp_btf/net_dev_xmit",
                "tp_btf/tcp_sendmsg_locked",
            ]
        );
    }
}
