//! Reading records: by type, by disk, and histograms re-merged from their
//! buckets independently of stalltrace's own code.

use serde_json::Value;

pub fn of_type<'a>(records: &'a [Value], kind: &str) -> Vec<&'a Value> {
    records.iter().filter(|r| r["type"] == kind).collect()
}

/// `block` records of one disk and op, in order.
pub fn block_records<'a>(records: &'a [Value], disk: &str, op: &str) -> Vec<&'a Value> {
    records
        .iter()
        .filter(|r| r["type"] == "block" && r["dev"] == disk && r["op"] == op)
        .collect()
}

/// The `tcp_retransmit` records of `netns` (a namespace inode).
pub fn retransmits_in(records: &[Value], netns: u64) -> Vec<&Value> {
    of_type(records, "tcp_retransmit")
        .into_iter()
        .filter(|r| r["netns"].as_u64() == Some(netns))
        .collect()
}

/// The SQL Server worker `worker` on `server_port`, and its clients at
/// `client_ip`: what each session's records must say.
pub struct SqlSide<'a> {
    pub worker: u32,
    pub server_port: u16,
    pub client_ip: &'a str,
    /// Client port -> the SPID the client got on that connection.
    pub sessions: &'a std::collections::BTreeMap<u16, u16>,
}

impl SqlSide<'_> {
    /// The retransmit records that do not name their session as its client
    /// knows it: the worker, a client session, its SPID and client port.
    pub fn misnamed<'r>(&self, retransmits: &[&'r Value]) -> Vec<&'r Value> {
        retransmits
            .iter()
            .copied()
            .filter(|r| {
                let port = r["dport"].as_u64().unwrap_or(0) as u16;
                let sql = &r["sql"];
                !(r["sport"] == self.server_port
                    && self.sessions.get(&port).is_some_and(|&spid| {
                        sql["pid"] == self.worker
                            && sql["kind"] == "client"
                            && sql["spid"] == spid
                            && sql["client"] == format!("{}:{port}", self.client_ip).as_str()
                    }))
            })
            .collect()
    }
}

/// Segments of the retransmit records `keep` selects (a record without `segs` panics).
pub fn sum_segs(events: &[&Value], keep: impl Fn(&Value) -> bool) -> u64 {
    events
        .iter()
        .filter(|r| keep(r))
        .map(|r| r["segs"].as_u64().expect("tcp_retransmit without segs"))
        .sum()
}

pub fn sum_field(records: &[&Value], field: &str) -> u64 {
    records.iter().map(|r| r[field].as_u64().unwrap()).sum()
}

/// Whether a `lost` source counts hooks the kernel did not run (a program
/// already running on that CPU: docs/records.md): host-wide, more of them
/// the busier the host, and no test's doing.
pub fn kernel_skipped(source: &str) -> bool {
    source == "block.kernel_skipped"
        || source == "tcp.retransmit_unseen_segs"
        || source.contains(".recursion_miss.")
}

/// Requests a SQL Server session may be short of in `sql_requests`: those the
/// kernel could not time (`sqlserver.request_untimed`: it skipped the hook
/// for their arrival or answer), and those whose close it skipped (their
/// last request is never ended).
pub fn requests_untimed(records: &[Value]) -> u64 {
    lost_from(
        records,
        &[
            "sqlserver.request_untimed",
            "sqlserver.recursion_miss.on_inet_sock_set_state",
        ],
    )
}

/// Retransmissions of a SQL Server session that may lack their record or the
/// sqlserver family's verdict on them: those whose hook the kernel skipped,
/// in either family.
pub fn retransmits_unjudged(records: &[Value]) -> u64 {
    retransmits_unseen(records) + sql_retransmit_hooks_skipped(records)
}

/// Retransmitted segments with no record of their own, as `lost` declares them.
pub fn retransmits_unseen(records: &[Value]) -> u64 {
    lost_from(records, &["tcp.retransmit_unseen_segs"])
}

/// Runs of the sqlserver family's retransmit hook the kernel skipped (a
/// recursion miss): the tcp family may have recorded those retransmissions.
pub fn sql_retransmit_hooks_skipped(records: &[Value]) -> u64 {
    lost_from(records, &["sqlserver.recursion_miss.on_tcp_retransmit_skb"])
}

/// What the run's `lost` records counted from `sources`.
fn lost_from(records: &[Value], sources: &[&str]) -> u64 {
    records
        .iter()
        .filter(|r| r["type"] == "lost")
        .flat_map(|r| sources.iter().filter_map(|s| r["by_source"][*s].as_u64()))
        .sum()
}

/// A histogram rebuilt from the buckets of many records, keyed by each
/// bucket's `[low, high]` in thousandths of the field's unit. Decoded here
/// from the published format (docs/records.md, schema 2 and 3; schema 1 triples
/// too) and percentiles computed independently of stalltrace's own code.
#[derive(Default, Debug)]
pub struct Buckets(std::collections::BTreeMap<(u64, u64), u64>);

/// docs/records.md: bucket `i` holds kernel values `low..=high`.
fn kernel_bucket(i: u64) -> (u64, u64) {
    if i < 16 {
        return (i, i);
    }
    let shift = i / 16 - 1;
    let low = (16 + i % 16) << shift;
    (low, low + (1 << shift) - 1)
}

impl Buckets {
    pub fn merge(records: &[&Value], field: &str) -> Self {
        let mut b = Self::default();
        for r in records {
            let h = &r[field];
            if let Some(counts) = h["counts"].as_array() {
                let scale = h["scale"].as_f64().expect("a histogram without scale");
                let milli = |v: u64| (v as f64 * scale * 1000.0).round() as u64;
                let mut i = h["first_bucket"].as_u64().expect("without first_bucket");
                for c in counts {
                    let c = c.as_i64().unwrap();
                    assert_ne!(c, 0, "a zero in counts: {h}");
                    if c < 0 {
                        i = i.saturating_add(c.unsigned_abs());
                        continue;
                    }
                    let (lo, hi) = kernel_bucket(i);
                    *b.0.entry((milli(lo), milli(hi))).or_default() += c as u64;
                    i += 1;
                }
                continue;
            }
            for bucket in h["buckets"].as_array().unwrap() {
                let lo = (bucket[0].as_f64().unwrap() * 1000.0).round() as u64;
                let hi = (bucket[1].as_f64().unwrap() * 1000.0).round() as u64;
                *b.0.entry((lo, hi)).or_default() += bucket[2].as_u64().unwrap();
            }
        }
        b
    }

    pub fn count(&self) -> u64 {
        self.0.values().sum()
    }

    /// Mean from bucket midpoints (within the bucket error of the true mean).
    pub fn mean(&self) -> f64 {
        let total: f64 = self
            .0
            .iter()
            .map(|(&(lo, hi), &n)| (lo + hi) as f64 / 2.0 * n as f64)
            .sum();
        total / self.count() as f64 / 1000.0
    }

    /// Nearest-rank percentile as the bucket midpoint, in the field's unit.
    pub fn percentile(&self, q: f64) -> f64 {
        let total = self.count();
        assert!(total > 0, "empty histogram");
        let rank = ((q * total as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (&(lo, hi), &n) in &self.0 {
            seen += n;
            if seen >= rank {
                return (lo + hi) as f64 / 2.0 / 1000.0;
            }
        }
        unreachable!()
    }

    /// Upper edge of the highest non-empty bucket, in the field's unit.
    pub fn max(&self) -> f64 {
        self.0
            .keys()
            .next_back()
            .map(|&(_, hi)| hi as f64 / 1000.0)
            .unwrap()
    }

    /// Samples in buckets entirely at or above `v` / touching `v` or above.
    pub fn count_at_least(&self, v: f64) -> (u64, u64) {
        let v = (v * 1000.0).round() as u64;
        let surely = self
            .0
            .iter()
            .filter(|((lo, _), _)| *lo >= v)
            .map(|(_, n)| n)
            .sum();
        let maybe = self
            .0
            .iter()
            .filter(|((_, hi), _)| *hi >= v)
            .map(|(_, n)| n)
            .sum();
        (surely, maybe)
    }
}

/// Relative error of one bucket: a reported midpoint is within half of it.
pub const HIST_BUCKET_ERROR: f64 = 1.0 / 16.0;

/// The most instructions the verifier may walk for any one of stalltrace's
/// programs: 40% of its limit of a million (`BPF_COMPLEXITY_LIMIT_INSNS`),
/// so that a program growing toward the limit fails here first. The walk
/// differs from kernel to kernel (older verifiers prune less: the block
/// completion takes 20 000 on 6.18 and 7.3, 47 000 on 6.12 and 266 000 on
/// 6.1, 2026-12-03), and what it costs is paid at every start: in a TCG
/// guest, a program at half the limit took most of a family's load time.
pub const VERIFIER_BUDGET: u64 = 400_000;

/// The `start` record's programs and the instructions the verifier walked for
/// each (kernels that report it, 5.16+), as `family/hook N`, and those over
/// [`VERIFIER_BUDGET`].
pub fn verified_insns(start: &Value) -> (Vec<String>, Vec<String>) {
    let (mut all, mut over) = (Vec::new(), Vec::new());
    for probe in start["probes"].as_array().into_iter().flatten() {
        if let Some(n) = probe["verified_insns"].as_u64() {
            let said = format!(
                "{}/{} {n}",
                probe["family"].as_str().unwrap_or("?"),
                probe["hook"].as_str().unwrap_or("?")
            );
            if n > VERIFIER_BUDGET {
                over.push(said.clone());
            }
            all.push(said);
        }
    }
    (all, over)
}
