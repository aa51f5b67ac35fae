//! Command line: `stalltrace run`, `stalltrace check`.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::probes::ModeChoice;
use crate::stall::{DEFAULT_RECOVER, Thresholds};

#[derive(Parser, Debug)]
#[command(
    name = "stalltrace",
    version,
    // Each subcommand's man page carries the version too.
    propagate_version = true,
    about = "eBPF latency tracer for SQL Server on Linux: why did the database stall just now?"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
// Parsed once at start: the size of the larger variant costs nothing.
#[allow(clippy::large_enum_variant)]
pub enum Command {
    /// Attach to this host and stream JSON lines until stopped (SIGINT/SIGTERM) or --duration.
    #[command(after_help = RUN_EXAMPLES)]
    Run(RunArgs),
    /// Report what this host supports: kernel, BTF, privileges, and which probes attach.
    #[command(after_help = CHECK_EXAMPLES)]
    Check(CheckArgs),
    /// Print the report of a recorded stream (and write it as a page with --html).
    ///
    /// What the run was and whether anything was lost or cut short; the stall
    /// episodes ranked by impact with their cause, evidence, next step and the SQL
    /// Server sessions they hit; then the whole run's latency and in-flight
    /// histograms per disk and interface, TCP peers and bulk flows. --html writes the
    /// same as one self-contained page with latency heatmaps and an episode timeline.
    #[command(after_help = REPORT_EXAMPLES)]
    Report(ReportArgs),
    /// Record for a while (default 30 s), then print the report: stall episodes
    /// ranked by impact with their likely cause, evidence, next step and the
    /// sessions they hit, and each disk's and interface's histograms.
    // The run options are `run`'s, but two mean something else here.
    #[command(
        after_help = INVESTIGATE_EXAMPLES,
        mut_arg("duration", |a| a.help("How long to record (e.g. 30s, 5m) [default: 30s]")),
        mut_arg("out", |a| a.help("Also write the records to FILE (created or truncated)"))
    )]
    Investigate(InvestigateArgs),
}

const RUN_EXAMPLES: &str = "\
Examples:
  stalltrace run -d 30s                    30 seconds of records on stdout
  stalltrace run -o /var/log/stalltrace/stalltrace.jsonl --prometheus :9466
                                           what the service does: a file for the
                                           log shipper, metrics for Prometheus
  stalltrace run -p 1433 -i 5s             only TCP on port 1433, 5 s intervals
  stalltrace run --sql-pid 4242 --sql-dmv env
                                           this SQL Server, SPIDs of encrypted
                                           sessions also from the DMVs";

const CHECK_EXAMPLES: &str = "\
Examples:
  stalltrace check                         can stalltrace run here? (exit 0: yes)
  stalltrace check --probe-mode raw_tp     as a run forced to raw_tp would load";

const REPORT_EXAMPLES: &str = "\
Examples:
  stalltrace report run.jsonl
  stalltrace report /var/log/stalltrace/stalltrace.jsonl* --html stall.html
                                           a rotated set (gzip'd or not), in any
                                           order, and the page with heatmaps
  stalltrace report /var/log/stalltrace/stalltrace.jsonl* --since \"15m ago\"
                                           only the last 15 minutes";

const INVESTIGATE_EXAMPLES: &str = "\
Examples:
  stalltrace investigate                   record 30 s, then print the report
  stalltrace investigate -d 2m --html now.html -o now.jsonl
                                           2 minutes; the page and the records too
  stalltrace investigate --last 10m        what the service recorded in the last
                                           10 minutes (nothing new is recorded)
  stalltrace investigate --at 03:12 --around 2m
                                           03:10 to 03:14 UTC of that recording";

#[derive(Args, Debug, Clone)]
pub struct InvestigateArgs {
    /// Print the records (JSON lines, as `run` writes them) instead of the report.
    #[arg(long, conflicts_with_all = ["last", "at"])]
    pub json: bool,
    /// Look back instead of recording: the report of the last SPAN (e.g. 10m)
    /// of what the stalltrace service recorded (see --from). Records forward
    /// only when there is no recording, and says so.
    #[arg(long, value_name = "SPAN", value_parser = parse_duration, conflicts_with = "at")]
    pub last: Option<Duration>,
    /// Look back at the minutes around TIME: 2026-11-28T03:12:00Z,
    /// "2026-11-28 03:12", 03:12 (UTC, the last one before now) or "1h ago".
    #[arg(long, value_name = "TIME")]
    pub at: Option<String>,
    /// With --at: how far before and after TIME to look [5m].
    #[arg(long, value_name = "SPAN", value_parser = parse_duration, requires = "at")]
    pub around: Option<Duration>,
    /// With --last or --at: the recording, the file `run --out` writes (the
    /// files rotated from it are read too). Default: the --out of
    /// stalltrace.service, else /var/log/stalltrace/stalltrace.jsonl.
    #[arg(long, value_name = "FILE")]
    pub from: Option<PathBuf>,
    /// Also write the report as an HTML page.
    #[arg(long, value_name = "OUT.html")]
    pub html: Option<PathBuf>,
    /// Everything `run` takes; --duration defaults to 30s here, and --out keeps
    /// the records in a file as well.
    #[command(flatten)]
    pub run: RunArgs,
}

#[derive(Args, Debug, Clone)]
pub struct ProbeArgs {
    /// Hook flavour: tp_btf (cheapest), raw_tp, or auto (tp_btf, falling back to raw_tp).
    #[arg(long, value_enum, default_value_t = ModeChoice::Auto)]
    pub probe_mode: ModeChoice,
    /// Keep running without a probe family that cannot attach (reported in `start`) instead of exiting.
    #[arg(long)]
    pub degrade: bool,
}

#[derive(Args, Debug, Clone)]
pub struct RunArgs {
    /// Aggregation interval: one record per device (and op) per interval.
    #[arg(short, long, default_value = "1s", value_parser = parse_interval)]
    pub interval: Duration,
    /// Stop after this long (e.g. 30s, 5m); runs until SIGINT/SIGTERM when absent.
    #[arg(short, long, value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// Append records to FILE (created if missing) instead of writing them to
    /// stdout. On SIGHUP the run reopens FILE (logrotate `create` with
    /// `postrotate kill -HUP`); each new file begins with a `start` record.
    #[arg(short, long, value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// Rotate --out when it would pass MB megabytes (MiB): FILE becomes FILE.1,
    /// FILE.1 becomes FILE.2, and so on up to --out-keep.
    #[arg(long, value_name = "MB", requires = "out", value_parser = clap::value_parser!(u64).range(1..=1_048_576))]
    pub out_max_mb: Option<u64>,
    /// Rotated files kept beside --out (FILE.1 … FILE.K) when --out-max-mb rotates.
    #[arg(long, value_name = "K", default_value_t = 5, requires = "out_max_mb", value_parser = clap::value_parser!(u32).range(0..=1000))]
    pub out_keep: u32,
    /// Most memory (KiB) the records waiting for the output may take. A reader
    /// that falls this far behind loses records, counted in `lost` (source
    /// `output.queue_full`) and seen as gaps in `seqno`; the tracer itself never waits.
    #[arg(long, value_name = "KIB", default_value_t = 16384, value_parser = clap::value_parser!(u32).range(64..=4_194_304))]
    pub out_buffer_kib: u32,
    /// Serve the stream's figures as Prometheus metrics at http://ADDR:PORT/metrics
    /// (latency histograms, requests, bytes, retransmitted segments, stall episodes,
    /// lost events, each program's run time). Off unless given. The port is bound
    /// before anything attaches; a port in use is an error. `:PORT` listens on
    /// every IPv4 address; a host name is resolved (`localhost:9100`).
    #[arg(long, value_name = "ADDR:PORT", value_parser = parse_listen_address)]
    pub prometheus: Option<std::net::SocketAddr>,
    /// With --prometheus: retransmitted segments and retransmission timeouts per
    /// TCP peer for the first N peers (by namespace and address; a peer quiet for
    /// 10 minutes gives its place up); the rest are summed as peer="other".
    /// Off (0) by default: every peer is a series in every Prometheus that scrapes.
    #[arg(long, value_name = "N", default_value_t = 0, requires = "prometheus", value_parser = clap::value_parser!(u32).range(0..=i64::from(crate::metrics::MAX_PEERS)))]
    pub prometheus_peers: u32,
    /// With --prometheus: slow I/Os and SQL Server sessions' retransmitted segments per
    /// container (by short id) for the first N containers; the rest are summed as
    /// container="other". Off (0) by default: containers come and go.
    #[arg(long, value_name = "N", default_value_t = 0, requires = "prometheus", value_parser = clap::value_parser!(u32).range(0..=i64::from(crate::metrics::MAX_CONTAINERS)))]
    pub prometheus_containers: u32,
    /// Send each I/O slower than this many milliseconds as a `slow_io` record; 0 turns them off.
    #[arg(long, default_value_t = DEFAULT_SLOW_IO_MS, value_parser = parse_slow_io_ms, allow_negative_numbers = true)]
    pub slow_io_ms: f64,
    /// Turn on the kernel's per-program run-time accounting while running, and report
    /// each program's cost (ns per run) in the `stop` record. Costs ~20 ns per run.
    #[arg(long)]
    pub bpf_stats: bool,
    /// Every interval, a `tcp_flow` record for each TCP flow that sent at least this
    /// many Mbit/s (a bulk flow: a backup, an availability-group replica stream), with
    /// what limited it: network, receiver, send buffer or the sending application.
    /// 0 turns them off. The default, 8 Mbit/s (1 MB/s), is far above what interactive
    /// SQL sessions move, and below a healthy backup or replica stream, so one that
    /// crawls at a few MB/s is still reported.
    #[arg(long, value_name = "MBPS", default_value_t = 8.0, value_parser = parse_bulk_mbps, allow_negative_numbers = true)]
    pub bulk_mbps: f64,
    #[command(flatten)]
    pub probes: ProbeArgs,
    #[command(flatten)]
    pub filters: FilterArgs,
    #[command(flatten)]
    pub sql: SqlArgs,
    #[command(flatten)]
    pub stalls: StallArgs,
}

/// When a signal is a stall episode (`stall` records); the defaults are
/// `stall::Thresholds::default()`.
#[derive(Args, Debug, Clone)]
pub struct StallArgs {
    /// A connection that made no progress this long, or a retransmission
    /// timeout, is a network stall (ms).
    #[arg(long = "stall-net-ms", value_name = "MS", default_value_t = Thresholds::default().net_ms, value_parser = parse_positive)]
    pub net_ms: f64,
    /// Retransmitted segments per second to one peer that count as loss
    /// without any timeout.
    #[arg(long = "stall-retrans-per-s", value_name = "N", default_value_t = Thresholds::default().retrans_per_s, value_parser = parse_positive)]
    pub retrans_per_s: f64,
    /// Transmit queue (qdisc) wait at p99 that is a transmit stall (ms).
    #[arg(long = "stall-qdisc-ms", value_name = "MS", default_value_t = Thresholds::default().qdisc_ms, value_parser = parse_positive)]
    pub qdisc_ms: f64,
    /// Device time per request at p99 that is a slow device (ms).
    #[arg(long = "stall-io-ms", value_name = "MS", default_value_t = Thresholds::default().io_ms, value_parser = parse_positive)]
    pub io_ms: f64,
    /// How long a signal must stay below its threshold for an episode to end.
    #[arg(long = "stall-recover", value_name = "DURATION", default_value_t = DEFAULT_RECOVER.into(), value_parser = parse_recover)]
    pub recover: humantime::Duration,
    /// Detect no stall episodes (no `stall` records).
    #[arg(long = "no-stalls")]
    pub no_stalls: bool,
}

impl StallArgs {
    /// None with --no-stalls.
    pub fn thresholds(&self) -> Option<Thresholds> {
        (!self.no_stalls).then(|| Thresholds {
            net_ms: self.net_ms,
            retrans_per_s: self.retrans_per_s,
            qdisc_ms: self.qdisc_ms,
            io_ms: self.io_ms,
            recover_ms: Duration::from(self.recover).as_secs_f64() * 1000.0,
            ..Thresholds::default()
        })
    }
}

/// Where SQL Server is, when discovery should not find it by itself.
#[derive(Args, Debug, Clone, Default)]
pub struct SqlArgs {
    /// The SQL Server worker's pid (default: every `sqlservr` process that listens).
    #[arg(long = "sql-pid", value_name = "PID")]
    pub sql_pid: Option<u32>,
    /// A TDS port (default: every port the worker listens on, except the endpoint ports).
    #[arg(long = "sql-port", value_name = "PORT", value_parser = parse_port)]
    pub sql_ports: Vec<u16>,
    /// An availability-group / mirroring endpoint port (default 5022).
    #[arg(long = "sql-ag-port", value_name = "PORT", value_parser = parse_port)]
    pub sql_ag_ports: Vec<u16>,
    /// Enrich sessions from SQL Server's DMVs (off by default): a settings file
    /// readable by its owner only, or `env` for STALLTRACE_SQL_CONN and
    /// STALLTRACE_SQL_* (docs/sqlserver.md). Never credentials on the command line.
    #[arg(long = "sql-dmv", value_name = "FILE|env")]
    pub sql_dmv: Option<String>,
    /// When encrypted sessions' SPIDs are read in the TLS plaintext: uprobes on
    /// SSL_write and SSL_write_ex of the libssl the worker maps (docs/sqlserver.md).
    #[arg(long = "sql-tls", value_name = "WHEN", value_enum, default_value_t)]
    pub sql_tls: crate::records::sql::TlsPolicy,
}

/// What to watch; each flag may be repeated, and an absent flag means everything.
#[derive(Args, Debug, Clone, Default)]
pub struct FilterArgs {
    /// Only TCP connections with this port at either end.
    #[arg(short, long = "port", value_name = "PORT", value_parser = parse_port)]
    pub ports: Vec<u16>,
    /// Only this network namespace: a name from `ip netns list`, `host`, a path such as
    /// /proc/PID/ns/net, or a namespace inode number.
    #[arg(long = "netns", value_name = "NETNS")]
    pub netns: Vec<String>,
    /// Only this network interface (by name, in any watched namespace).
    #[arg(long = "iface", value_name = "IFACE")]
    pub ifaces: Vec<String>,
    /// Only this disk (block and slow_io records): a name from /sys/block (sda, nvme0n1),
    /// a /dev path (also /dev/disk/by-id/...), or MAJOR:MINOR; a partition means its disk.
    #[arg(long = "disk", value_name = "DISK")]
    pub disks: Vec<String>,
    /// Only this process (slow_io and TCP records): its pid as this host numbers it.
    /// The disks' histograms stay whole: its I/O waits behind everyone's.
    #[arg(long = "pid", value_name = "PID")]
    pub pids: Vec<u32>,
    /// Only processes of this name (slow_io and TCP records), as /proc/PID/comm gives it.
    #[arg(long = "comm", value_name = "NAME")]
    pub comms: Vec<String>,
    /// Only the processes of this running container (slow_io and TCP records): its full id,
    /// its name (podman's, docker's), or a unique prefix of its id.
    #[arg(long = "container", value_name = "ID|NAME")]
    pub containers: Vec<String>,
}

#[derive(Args, Debug, Clone)]
pub struct CheckArgs {
    #[command(flatten)]
    pub probes: ProbeArgs,
}

pub use crate::report::ReportArgs;

const DURATION_HINT: &str = "expected a duration such as 500ms, 1s, 30s or 5m";

fn parse_duration(s: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(s).map_err(|_| DURATION_HINT.to_string())?;
    if d.is_zero() {
        return Err(format!("must be longer than zero; {DURATION_HINT}"));
    }
    Ok(d)
}

fn parse_interval(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if d < Duration::from_millis(100) || d > Duration::from_secs(3600) {
        return Err("must be between 100ms and 1h".into());
    }
    Ok(d)
}

fn parse_port(s: &str) -> Result<u16, String> {
    match s.parse::<u16>() {
        Ok(0) | Err(_) => Err("expected a TCP port, 1 to 65535".into()),
        Ok(port) => Ok(port),
    }
}

/// What exporters take for a listen address: `HOST:PORT`, `[V6]:PORT`, or
/// `:PORT` for every address (node_exporter's `:9100`).
fn parse_listen_address(s: &str) -> Result<std::net::SocketAddr, String> {
    use std::net::ToSocketAddrs;
    let hint = "expected ADDR:PORT, such as 127.0.0.1:9100, localhost:9100, [::1]:9100 or :9100";
    let spec = match s.strip_prefix(':') {
        Some(port) => format!("0.0.0.0:{port}"),
        None => s.to_string(),
    };
    let port_given = spec
        .rsplit_once(':')
        .is_some_and(|(_, p)| parse_port(p).is_ok());
    if !port_given {
        return Err(hint.into());
    }
    let addrs: Vec<std::net::SocketAddr> = spec
        .to_socket_addrs()
        .map_err(|e| format!("{hint} ({e})"))?
        .collect();
    // Bound on one address: where a name has both families, the IPv4 one (localhost: 127.0.0.1).
    addrs
        .iter()
        .find(|a| a.is_ipv4())
        .or(addrs.first())
        .copied()
        .ok_or_else(|| hint.into())
}

/// `--slow-io-ms` when not given; `check` loads the block family as such a run does.
pub const DEFAULT_SLOW_IO_MS: f64 = 50.0;

/// `--slow-io-ms` as the block family takes it: none at 0.
pub fn slow_io_threshold(ms: f64) -> Option<Duration> {
    (ms > 0.0).then(|| Duration::from_secs_f64(ms / 1000.0))
}

fn parse_slow_io_ms(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
        _ => {
            Err("expected a number of milliseconds, 0 or more (0 turns slow_io records off)".into())
        }
    }
}

fn parse_recover(s: &str) -> Result<humantime::Duration, String> {
    parse_duration(s).map(Into::into)
}

fn parse_positive(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
        _ => Err("expected a number greater than 0".into()),
    }
}

fn parse_bulk_mbps(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
        _ => Err("expected Mbit/s, 0 or more (0 turns tcp_flow records off)".into()),
    }
}

/// A clap parse failure as the one line stalltrace prints for any error.
pub fn usage_error_line(err: &clap::Error) -> String {
    let rendered = err.to_string();
    let first = rendered.lines().next().unwrap_or("invalid arguments");
    let problem = first.trim_start_matches("error: ").trim();
    format!("{problem}: see `stalltrace --help` or `stalltrace <command> --help`")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("stalltrace").chain(args.iter().copied()))
    }

    #[test]
    fn the_common_options_have_short_flags_and_every_command_examples() {
        let Command::Run(r) = parse(&[
            "run", "-d", "30s", "-i", "5s", "-o", "x.jsonl", "-p", "1433",
        ])
        .unwrap()
        .command
        else {
            panic!()
        };
        assert_eq!(r.duration, Some(Duration::from_secs(30)));
        assert_eq!(r.interval, Duration::from_secs(5));
        assert_eq!(r.out, Some(PathBuf::from("x.jsonl")));
        assert_eq!(r.filters.ports, [1433]);
        use clap::CommandFactory;
        let mut cli = Cli::command();
        for sub in ["run", "check", "report", "investigate"] {
            let help = cli
                .find_subcommand_mut(sub)
                .unwrap()
                .render_long_help()
                .to_string();
            let example = format!("Examples:\n  stalltrace {sub}");
            assert!(help.contains(&example), "{sub}: {help}");
        }
    }

    #[test]
    fn run_defaults() {
        let Command::Run(r) = parse(&["run"]).unwrap().command else {
            panic!()
        };
        assert_eq!(r.interval, Duration::from_secs(1));
        assert_eq!(r.duration, None);
        assert_eq!(r.slow_io_ms, 50.0);
        assert_eq!(r.bulk_mbps, 8.0);
        assert_eq!(r.probes.probe_mode, ModeChoice::Auto);
        assert!(!r.probes.degrade);
    }

    #[test]
    fn run_flags_parse() {
        let Command::Run(r) = parse(&[
            "run",
            "--interval",
            "250ms",
            "--duration",
            "30s",
            "--out",
            "/tmp/x.jsonl",
            "--slow-io-ms",
            "0.5",
            "--probe-mode",
            "raw_tp",
            "--port",
            "1433",
            "--port",
            "5022",
            "--netns",
            "db",
        ])
        .unwrap()
        .command
        else {
            panic!()
        };
        assert_eq!(r.interval, Duration::from_millis(250));
        assert_eq!(r.duration, Some(Duration::from_secs(30)));
        assert_eq!(r.slow_io_ms, 0.5);
        assert_eq!(r.probes.probe_mode, ModeChoice::RawTp);
        assert_eq!(r.filters.ports, [1433, 5022]);
        assert_eq!(r.filters.netns, ["db"]);
    }

    #[test]
    fn prometheus_takes_what_exporters_take() {
        let addr = |s: &str| match parse(&["run", "--prometheus", s]).unwrap().command {
            Command::Run(r) => r.prometheus.unwrap().to_string(),
            _ => unreachable!(),
        };
        assert_eq!(addr(":9100"), "0.0.0.0:9100");
        assert_eq!(addr("localhost:9100"), "127.0.0.1:9100");
        assert_eq!(addr("127.0.0.1:9100"), "127.0.0.1:9100");
        assert_eq!(addr("[::1]:9100"), "[::1]:9100");
    }

    #[test]
    fn bad_flags_give_one_line_naming_problem_and_fix() {
        for (args, needle) in [
            (&["run", "--interval", "1x"][..], "--interval"),
            (&["run", "--interval", "10ms"][..], "between 100ms and 1h"),
            (&["run", "--duration", "0s"][..], "longer than zero"),
            (&["run", "--slow-io-ms", "-3"][..], "--slow-io-ms"),
            (&["run", "--bulk-mbps", "fast"][..], "--bulk-mbps"),
            (
                &["run", "--bulk-mbps", "-1"][..],
                "0 turns tcp_flow records off",
            ),
            (&["run", "--port", "0"][..], "1 to 65535"),
            (&["run", "--sql-port", "70000"][..], "--sql-port"),
            (&["run", "--prometheus", "9100"][..], "ADDR:PORT"),
            (&["run", "--prometheus", "localhost:0"][..], "ADDR:PORT"),
            (&["run", "--bogus"][..], "--bogus"),
            (&["frobnicate"][..], "frobnicate"),
        ] {
            let err = parse(args).unwrap_err();
            let line = usage_error_line(&err);
            assert!(!line.contains('\n'), "{line}");
            assert!(line.contains(needle), "{args:?}: {line}");
            assert!(line.contains("--help"), "{line}");
        }
    }
}
