//! The daemon's stream, read while it is written: each poll takes the
//! complete lines added since the last one (a line being written is left for
//! the next poll) and tallies them, so an hour's stream (hundreds of MB) is
//! read once, a minute at a time, and never held in memory.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::Serialize;
use serde_json::Value;

/// What the soak's books are kept on: its own disks and network namespaces
/// (the daemon records the whole host, other people's tests included).
pub struct Ours {
    pub devs: Vec<String>,
    pub netns: Vec<u64>,
}

/// Tallies of a stretch of the stream (a minute, or the whole run).
#[derive(Serialize, Default, Clone, Debug)]
pub struct Tally {
    /// Records by type.
    pub records: BTreeMap<String, u64>,
    /// Losses by source, summed over the `lost` records.
    pub lost: BTreeMap<String, u64>,
    /// Per soak disk, as the `block` records count it.
    pub disks: BTreeMap<String, DiskCounts>,
    /// `tcp_retransmit` records in the soak's namespaces; the segments of
    /// those that were sent, by the kernel's rule for RetransSegs on `err`
    /// (0, a positive qdisc verdict, -EPERM, -ENOBUFS: counted; -EBUSY and
    /// other early exits: not), whatever their `counted` says; the segments
    /// of those marked `counted`; and the timer RTOs.
    pub retransmits: u64,
    pub sent_segs: u64,
    pub counted_segs: u64,
    pub timer_rtos: u64,
    /// The most segments one `tcp_retransmit` carried: what one event lost
    /// to a full ring buffer can have carried at most.
    pub max_segs: u64,
    /// The per-peer counters (`tcp_rtt`) in the soak's namespaces, which do
    /// not go through the ring buffer.
    pub rtt_retrans_segs: u64,
    pub rtt_rtos: u64,
    /// Of the `tcp_retransmit` records in the soak's namespaces, those not
    /// marked `counted` (attempts that failed to send, or misjudged), and
    /// their segments: where a shortfall against RetransSegs would be.
    pub uncounted: u64,
    pub uncounted_segs: u64,
    /// Of those, how many by `err` (-16: the previous copy still queued,
    /// rightly not counted; 0: went out, yet judged not counted).
    pub uncounted_by_err: BTreeMap<String, u64>,
    /// Segments of the soak's `tcp_retransmit` records by `err`.
    pub segs_by_err: BTreeMap<String, u64>,
    /// `syn` records (SYN and SYN-ACK sent again) in the soak's namespaces.
    pub syn_retransmits: u64,
    /// Lines that are not JSON objects with a `type`.
    pub unreadable: u64,
}

/// One disk's completions, as stalltrace or /proc/diskstats count them.
#[derive(Serialize, Default, Clone, Copy, Debug, PartialEq)]
pub struct DiskCounts {
    /// Reads and writes completed (stalltrace: `count` + `completions_unseen`).
    pub requests: u64,
    /// Flush requests completed.
    pub flushes: u64,
    /// Bytes read and written.
    pub bytes: u64,
    /// Of `requests` and `flushes`, completions the hooks never saw (found
    /// afterwards by the daemon): no bytes are known for them.
    pub unseen: u64,
}

impl DiskCounts {
    pub fn add(&mut self, o: &DiskCounts) {
        self.requests += o.requests;
        self.flushes += o.flushes;
        self.bytes += o.bytes;
        self.unseen += o.unseen;
    }

    pub fn minus(&self, o: &DiskCounts) -> DiskCounts {
        DiskCounts {
            requests: self.requests.saturating_sub(o.requests),
            flushes: self.flushes.saturating_sub(o.flushes),
            bytes: self.bytes.saturating_sub(o.bytes),
            unseen: self.unseen.saturating_sub(o.unseen),
        }
    }
}

impl Tally {
    pub fn add(&mut self, o: &Tally) {
        let sum = |a: &mut BTreeMap<String, u64>, b: &BTreeMap<String, u64>| {
            for (k, v) in b {
                *a.entry(k.clone()).or_default() += v;
            }
        };
        sum(&mut self.records, &o.records);
        sum(&mut self.lost, &o.lost);
        for (d, c) in &o.disks {
            self.disks.entry(d.clone()).or_default().add(c);
        }
        self.retransmits += o.retransmits;
        self.sent_segs += o.sent_segs;
        self.counted_segs += o.counted_segs;
        self.timer_rtos += o.timer_rtos;
        self.max_segs = self.max_segs.max(o.max_segs);
        self.rtt_retrans_segs += o.rtt_retrans_segs;
        self.rtt_rtos += o.rtt_rtos;
        self.uncounted += o.uncounted;
        self.uncounted_segs += o.uncounted_segs;
        sum(&mut self.uncounted_by_err, &o.uncounted_by_err);
        sum(&mut self.segs_by_err, &o.segs_by_err);
        self.syn_retransmits += o.syn_retransmits;
        self.unreadable += o.unreadable;
    }

    pub fn total_records(&self) -> u64 {
        self.records.values().sum()
    }

    pub fn lost_of(&self, sources: &[&str]) -> u64 {
        sources.iter().filter_map(|s| self.lost.get(*s)).sum()
    }

    fn line(&mut self, r: &Value, ours: &Ours) {
        let Some(kind) = r["type"].as_str() else {
            self.unreadable += 1;
            return;
        };
        *self.records.entry(kind.to_string()).or_default() += 1;
        let n = |f: &str| r[f].as_u64().unwrap_or(0);
        let in_ours = r["netns"].as_u64().is_some_and(|n| ours.netns.contains(&n));
        match kind {
            "lost" => {
                for (source, v) in r["by_source"].as_object().into_iter().flatten() {
                    *self.lost.entry(source.clone()).or_default() += v.as_u64().unwrap_or(0);
                }
            }
            "block" => {
                let Some(dev) = r["dev"]
                    .as_str()
                    .filter(|d| ours.devs.iter().any(|o| o == d))
                else {
                    return;
                };
                let d = self.disks.entry(dev.to_string()).or_default();
                let unseen = n("completions_unseen");
                match r["op"].as_str() {
                    Some("read" | "write") => {
                        d.requests += n("count") + unseen;
                        d.bytes += n("bytes");
                    }
                    Some("flush") => d.flushes += n("count") + unseen,
                    _ => return,
                }
                d.unseen += unseen;
            }
            "tcp_retransmit" if in_ours => {
                self.retransmits += 1;
                self.max_segs = self.max_segs.max(n("segs"));
                let err = r["err"].as_i64().unwrap_or(0);
                *self.segs_by_err.entry(err.to_string()).or_default() += n("segs");
                if err >= 0 || err == -1 || err == -105 {
                    self.sent_segs += n("segs");
                }
                if r["counted"] == true {
                    self.counted_segs += n("segs");
                } else {
                    self.uncounted += 1;
                    self.uncounted_segs += n("segs");
                    *self
                        .uncounted_by_err
                        .entry(r["err"].to_string())
                        .or_default() += 1;
                }
                if r["kind"] == "syn" {
                    self.syn_retransmits += 1;
                }
                if r["kind"] == "rto" && r["timer"] == true && r["err"] == 0 {
                    self.timer_rtos += 1;
                }
            }
            "tcp_rtt" if in_ours => {
                self.rtt_retrans_segs += n("retrans_segs");
                self.rtt_rtos += n("rtos");
            }
            _ => {}
        }
    }
}

pub struct Stream {
    path: PathBuf,
    offset: u64,
    /// The start of a line not yet finished at the last poll.
    partial: Vec<u8>,
    pub start: Option<Value>,
    pub stop: Option<Value>,
    /// `sqlservr` worker pids the daemon reported in `sql_instance` records.
    pub sql_workers: BTreeSet<u64>,
}

impl Stream {
    pub fn new(path: &Path) -> Self {
        Stream {
            path: path.to_path_buf(),
            offset: 0,
            partial: Vec::new(),
            start: None,
            stop: None,
            sql_workers: BTreeSet::new(),
        }
    }

    /// Tally the lines written since the last poll into `t`.
    pub fn poll(&mut self, t: &mut Tally, ours: &Ours) -> anyhow::Result<()> {
        let mut f = File::open(&self.path)
            .with_context(|| format!("cannot open {}", self.path.display()))?;
        f.seek(SeekFrom::Start(self.offset))?;
        let mut buf = std::mem::take(&mut self.partial);
        let read = f.read_to_end(&mut buf)?;
        self.offset += read as u64;
        let whole = buf.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
        self.partial = buf.split_off(whole);
        for line in buf.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
            let Ok(r) = serde_json::from_slice::<Value>(line) else {
                t.unreadable += 1;
                continue;
            };
            t.line(&r, ours);
            match r["type"].as_str() {
                Some("start") => self.start = Some(r),
                Some("stop") => self.stop = Some(r),
                Some("sql_instance") => self.sql_workers.extend(r["pid"].as_u64()),
                _ => {}
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tallies_only_complete_lines_and_only_ours() {
        let dir = std::env::temp_dir().join(format!("soak-stream-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("s.jsonl");
        let ours = Ours {
            devs: vec!["loop7".into()],
            netns: vec![42],
        };
        std::fs::write(
            &path,
            concat!(
                r#"{"type":"block","dev":"loop7","op":"read","count":10,"completions_unseen":1}"#,
                "\n",
                r#"{"type":"block","dev":"vda","op":"read","count":99,"completions_unseen":0}"#,
                "\n",
                r#"{"type":"tcp_retransmit","netns":42,"segs":3,"counted":true,"kind":"rto","timer":true,"err":0}"#,
                "\n",
                r#"{"type":"tcp_retransmit","netns":7,"segs":5,"counted":true}"#,
                "\n",
                r#"{"type":"lost","by_source":{"tcp.retransmit_ringbuf_full":2}}"#,
                "\n",
                r#"{"type":"tcp_rtt","netns":42,"retrans_segs":3,"rtos":1}"#,
                "\n",
                r#"{"type":"sto"#
            ),
        )
        .unwrap();
        let mut s = Stream::new(&path);
        let mut t = Tally::default();
        s.poll(&mut t, &ours).unwrap();
        assert_eq!(t.disks["loop7"].requests, 11);
        assert_eq!(t.disks["loop7"].unseen, 1);
        assert!(!t.disks.contains_key("vda"));
        assert_eq!((t.retransmits, t.counted_segs, t.sent_segs), (1, 3, 3));
        assert_eq!(t.timer_rtos, 1);
        assert_eq!((t.rtt_retrans_segs, t.rtt_rtos), (3, 1));
        assert_eq!(t.lost["tcp.retransmit_ringbuf_full"], 2);
        assert_eq!(t.total_records(), 6);
        assert!(s.stop.is_none());
        // The half-written line is finished later and read then, once.
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        std::io::Write::write_all(&mut f, b"p\",\"records\":{}}\n").unwrap();
        let mut t2 = Tally::default();
        s.poll(&mut t2, &ours).unwrap();
        assert_eq!(t2.records["stop"], 1);
        assert!(s.stop.is_some());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
