//! The floor under a family's BPF cost: what *empty* programs cost on
//! exactly the hooks stalltrace attached, with the same attach types, so
//! that its cost can be told apart as floor (the kernel's entry into a BPF
//! program on that hook, plus the one clock read and per-CPU store any timing
//! hook makes) and work (what stalltrace's programs do beyond that).
//!
//! The hooks come from the daemon's `start` record (each attached hook's
//! `via` and `target`: a tracepoint, or on a kernel without it the kernel
//! function standing in for it). For them a C source is generated (one
//! program per hook, each with [`BODY`]), compiled by clang as the daemon's
//! own programs are (userspace/build.rs), and loaded and attached by this
//! process with aya; [`Floor`] holds them and detaches them on drop, and the
//! kernel drops them anyway when this process dies (their descriptors close).

mod load;

use serde::Serialize;

pub use load::{Floor, Object};

use super::peers::RoundCost;

/// How a program attaches: the same four ways the daemon's can
/// (userspace/src/records/run.rs, `AttachKind`).
#[derive(Serialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// A BTF-typed tracepoint.
    TpBtf,
    /// A raw tracepoint.
    RawTp,
    /// The entry of a kernel function, BTF-typed (a trampoline).
    Fentry,
    /// The entry of a kernel function through a kprobe.
    Kprobe,
}

impl Kind {
    /// As the start record's `via` (and `mode`) name it.
    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "tp_btf" => Kind::TpBtf,
            "raw_tp" => Kind::RawTp,
            "fentry" => Kind::Fentry,
            "kprobe" => Kind::Kprobe,
            _ => return None,
        })
    }

    /// The ELF section prefix that tells libbpf and aya how to attach.
    pub fn name(self) -> &'static str {
        match self {
            Kind::TpBtf => "tp_btf",
            Kind::RawTp => "raw_tp",
            Kind::Fentry => "fentry",
            Kind::Kprobe => "kprobe",
        }
    }
}

/// One hook as the daemon attached it.
#[derive(Serialize, Clone, Debug, PartialEq, Eq)]
pub struct AttachPoint {
    /// The hook: the tracepoint it is named after.
    pub hook: String,
    pub kind: Kind,
    /// The tracepoint or kernel function attached to.
    pub target: String,
}

impl AttachPoint {
    /// Its ELF section: "tp_btf/block_rq_issue", "kprobe/blk_mq_start_request".
    pub fn section(&self) -> String {
        format!("{}/{}", self.kind.name(), self.target)
    }
}

/// What every floor program does, as its C says it.
pub const BODY: &str = "a bpf_ktime_get_ns() call whose result it stores into its own slot \
     of a per-CPU array (found with bpf_map_lookup_elem), and nothing else";

/// The attached hooks of `family` in a daemon's `start` record, in its
/// order, each attach point once (a hook attached twice at one point would
/// be one program for the floor too).
pub fn points_of(start: &serde_json::Value, family: &str) -> anyhow::Result<Vec<AttachPoint>> {
    let mut out: Vec<AttachPoint> = Vec::new();
    let probes = start["probes"].as_array().into_iter().flatten();
    // A program the daemon runs itself (`prog_run`) is attached nowhere: no floor for it.
    let attached = |p: &&serde_json::Value| p["attached"] == true && p["via"] != "prog_run";
    for p in probes.filter(|p| p["family"] == family).filter(attached) {
        let text = |k: &str| p[k].as_str();
        let hook = text("hook").ok_or_else(|| anyhow::anyhow!("a probe without a hook: {p}"))?;
        // An older record has no `via`/`target`: its hook was its tracepoint, in its mode.
        let via = text("via").or(text("mode")).unwrap_or("?");
        let kind = Kind::parse(via)
            .ok_or_else(|| anyhow::anyhow!("hook {hook}: unknown attach type `{via}`"))?;
        let target = text("target").unwrap_or(hook);
        // The name goes into C source and a section name as is.
        let ok = |s: &str| {
            !s.is_empty()
                && s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.')
        };
        if !ok(hook) || !ok(target) {
            anyhow::bail!("hook {hook:?} at {target:?}: not a kernel symbol name");
        }
        let point = AttachPoint {
            hook: hook.to_string(),
            kind,
            target: target.to_string(),
        };
        if !out.contains(&point) {
            out.push(point);
        }
    }
    Ok(out)
}

/// Each point's program name in the generated C: `floor_<target>`, made a C
/// identifier, and told apart by its index where two would collide.
fn program_names(points: &[AttachPoint]) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for (i, p) in points.iter().enumerate() {
        let base = format!("floor_{}", p.target.replace('.', "_"));
        let name = if names.contains(&base) {
            format!("{base}_{i}")
        } else {
            base
        };
        names.push(name);
    }
    names
}

/// The C source of the floor for `points`: one program per point, slot i of
/// the per-CPU array for the i-th, all with the same body.
pub fn c_source(points: &[AttachPoint]) -> String {
    let mut s = format!(
        "// SPDX-License-Identifier: GPL-2.0 OR MIT
/*
 * The floor under stalltrace's BPF cost, generated by xtask/src/bench/floor.rs:
 * one program per hook the daemon attached, with the same attach type, each
 * doing only what any timing hook does at least.
 */
#include \"vmlinux.h\"
#include <bpf/bpf_helpers.h>

char LICENSE[] SEC(\"license\") = \"Dual MIT/GPL\";

struct {{
\t__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
\t__uint(max_entries, {});
\t__type(key, __u32);
\t__type(value, __u64);
}} floor_clock SEC(\".maps\");

/* The whole of a floor program: one clock read, stored into its own per-CPU slot. */
static __always_inline int floor_body(__u32 slot)
{{
\t__u64 *v = bpf_map_lookup_elem(&floor_clock, &slot);

\tif (v)
\t\t*v = bpf_ktime_get_ns();
\treturn 0;
}}
",
        points.len().max(1)
    );
    for (i, (p, name)) in points.iter().zip(program_names(points)).enumerate() {
        s += &format!(
            "\nSEC(\"{}\")\nint {name}(void *ctx)\n{{\n\treturn floor_body({i});\n}}\n",
            p.section()
        );
    }
    s
}

/// What a suite's floor is, as published: what each program does, where
/// it sits (one program per hook the daemon attached, as it attached
/// them), and the C as compiled.
#[derive(Serialize)]
pub struct Description {
    pub body: &'static str,
    pub attach_points: Vec<AttachPoint>,
    pub source: String,
}

impl Description {
    pub fn of(object: &Object) -> Self {
        Description {
            body: BODY,
            attach_points: object.points.clone(),
            source: object.source.clone(),
        }
    }

    /// Its C, as the sections show it, with how it was built.
    pub fn source_text(&self) -> String {
        format!(
            "The programs, generated for the hooks the daemon reported (compiled with clang \
             `-target bpf -O2 -g -mcpu=v3`, loaded and attached with aya by the bench):\n\n\
             ```c\n{}```",
            self.source
        )
    }

    /// The setup line: how the floor ran (`how`), what each program does,
    /// and where; `section` is the subsection that shows the C, at
    /// `anchor`; stalltrace's work is per `unit`.
    pub fn setup_line(
        floor: Option<&Self>,
        how: &str,
        (section, anchor): (&str, &str),
        unit: &str,
    ) -> String {
        let Some(f) = floor else {
            return "- Floor: not measured (no traced block ran)\n".into();
        };
        let points: Vec<String> = f.attach_points.iter().map(|p| p.section()).collect();
        format!(
            "- Floor (\"floor+bpf-stats\"): {how}. Each program does {} (the C is under \
             [{section}]({anchor})); programs: {}. stalltrace's work over the floor is, round \
             by round, its BPF ns per {unit} less the floor's\n",
            f.body,
            points.join(", "),
        )
    }
}

/// A tool's work over the floor, round by round: its BPF time per unit in
/// each round's accounting run minus the floor's in the same round
/// (`costs[i]` and `floor[i]` are round i + 1's; a round without both gives
/// nothing).
pub fn over_floor(costs: &[RoundCost], floor: &[RoundCost]) -> Vec<f64> {
    costs
        .iter()
        .zip(floor)
        .map(|(c, f)| c.per_unit() - f.per_unit())
        .collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn point(hook: &str, kind: Kind, target: &str) -> AttachPoint {
        AttachPoint {
            hook: hook.into(),
            kind,
            target: target.into(),
        }
    }

    #[test]
    fn the_start_record_gives_each_hook_its_attach_type() {
        let start = json!({"type": "start", "probes": [
            {"family": "block", "hook": "block_bio_queue", "mode": "tp_btf", "attached": true,
             "via": "tp_btf", "target": "block_bio_queue", "program_id": 1},
            {"family": "block", "hook": "block_rq_issue", "mode": "tp_btf", "attached": true,
             "via": "fentry", "target": "blk_mq_start_request", "program_id": 2},
            {"family": "block", "hook": "block_rq_complete", "mode": "raw_tp", "attached": true,
             "via": "kprobe", "target": "blk_mq_end_request.isra.0", "program_id": 3},
            {"family": "block", "hook": "block_rq_requeue", "mode": "raw_tp", "attached": true},
            {"family": "block", "hook": "block_rq_merge", "mode": "tp_btf", "attached": false},
            {"family": "block", "hook": "settle_freed_requests", "mode": "tp_btf",
             "attached": true, "via": "prog_run", "target": "settle_freed_requests"},
            {"family": "tcp", "hook": "tcp_probe", "mode": "tp_btf", "attached": true,
             "via": "tp_btf", "target": "tcp_probe"},
        ]});
        let points = points_of(&start, "block").unwrap();
        assert_eq!(
            points,
            [
                point("block_bio_queue", Kind::TpBtf, "block_bio_queue"),
                point("block_rq_issue", Kind::Fentry, "blk_mq_start_request"),
                point(
                    "block_rq_complete",
                    Kind::Kprobe,
                    "blk_mq_end_request.isra.0"
                ),
                // Without `via`/`target`: its tracepoint, in its mode.
                point("block_rq_requeue", Kind::RawTp, "block_rq_requeue"),
            ]
        );
        assert_eq!(points[1].section(), "fentry/blk_mq_start_request");
        assert!(points_of(&start, "netdev").unwrap().is_empty());

        let odd = json!({"probes": [{"family": "block", "hook": "x", "attached": true,
            "via": "uprobe", "target": "x"}]});
        assert!(points_of(&odd, "block").is_err());
        let injected = json!({"probes": [{"family": "block", "hook": "x", "attached": true,
            "via": "tp_btf", "target": "x\")\nint y"}]});
        assert!(points_of(&injected, "block").is_err());
    }

    #[test]
    fn one_program_per_hook_with_its_section_and_slot() {
        let points = [
            point("block_rq_issue", Kind::TpBtf, "block_rq_issue"),
            point("block_rq_complete", Kind::RawTp, "block_rq_complete"),
            point("block_bio_queue", Kind::Fentry, "submit_bio.part.0"),
            point("block_bio_queue", Kind::Kprobe, "submit_bio.part.0"),
        ];
        let c = c_source(&points);
        assert!(c.contains("__uint(max_entries, 4);"), "{c}");
        for needle in [
            "SEC(\"tp_btf/block_rq_issue\")\nint floor_block_rq_issue(void *ctx)\n{\n\treturn floor_body(0);\n}",
            "SEC(\"raw_tp/block_rq_complete\")\nint floor_block_rq_complete(void *ctx)\n{\n\treturn floor_body(1);\n}",
            "SEC(\"fentry/submit_bio.part.0\")\nint floor_submit_bio_part_0(void *ctx)",
            "SEC(\"kprobe/submit_bio.part.0\")\nint floor_submit_bio_part_0_3(void *ctx)\n{\n\treturn floor_body(3);",
            "*v = bpf_ktime_get_ns();",
        ] {
            assert!(c.contains(needle), "{needle}\n---\n{c}");
        }
        assert_eq!(
            c.matches("SEC(\"").count(),
            2 + 4,
            "license, map, 4 programs"
        );
        // No hooks: still valid C (a map of one slot, no program).
        assert!(c_source(&[]).contains("__uint(max_entries, 1);"));
    }

    #[test]
    fn work_over_the_floor_is_taken_round_by_round() {
        let r = |ns: f64, units: f64| RoundCost { ns, units };
        // 600 ns and 580 ns per I/O over floors of 190 and 200 in the same rounds.
        let st = [r(60_000.0, 100.0), r(116_000.0, 200.0), r(1.0, 1.0)];
        let floor = [r(19_000.0, 100.0), r(40_000.0, 200.0)];
        assert_eq!(over_floor(&st, &floor), [410.0, 380.0]);
        assert!(over_floor(&st, &[]).is_empty());
    }
}
