//! How long a suite measures: rounds and seconds per run, with defaults per
//! suite and environment overrides: `STALLTRACE_BENCH_ROUNDS` and
//! `STALLTRACE_BENCH_RUNTIME_S` for every suite (so
//! `STALLTRACE_BENCH_ROUNDS=2 cargo xtask bench all` is a quick look at every
//! suite, whose verdicts are then inconclusive: a 95% interval needs 6
//! rounds), and `STALLTRACE_BENCH_<SUITE>_ROUNDS` /
//! `STALLTRACE_BENCH_<SUITE>_RUNTIME_S` (e.g. `STALLTRACE_BENCH_NET_ROUNDS=20`)
//! for one suite, which win over the former. The published figures say what
//! they were made with.

use anyhow::bail;

pub struct Settings {
    pub rounds: usize,
    pub runtime_s: u64,
}

impl Settings {
    /// `STALLTRACE_BENCH_ROUNDS` and `STALLTRACE_BENCH_RUNTIME_S`, or the suite's defaults.
    pub fn from_env(default_rounds: u64, default_runtime_s: u64) -> anyhow::Result<Self> {
        Self::lookup(None, default_rounds, default_runtime_s, |k| {
            std::env::var(k).ok()
        })
    }

    /// The same, with `suite`'s own variables first.
    pub fn for_suite(
        suite: &str,
        default_rounds: u64,
        default_runtime_s: u64,
    ) -> anyhow::Result<Self> {
        Self::lookup(Some(suite), default_rounds, default_runtime_s, |k| {
            std::env::var(k).ok()
        })
    }

    fn lookup(
        suite: Option<&str>,
        default_rounds: u64,
        default_runtime_s: u64,
        env: impl Fn(&str) -> Option<String>,
    ) -> anyhow::Result<Self> {
        let value = |what: &str, default: u64| -> anyhow::Result<u64> {
            let names: Vec<String> = suite
                .map(|s| format!("STALLTRACE_BENCH_{}_{what}", s.to_uppercase()))
                .into_iter()
                .chain([format!("STALLTRACE_BENCH_{what}")])
                .collect();
            for name in &names {
                if let Some(v) = env(name) {
                    return whole_number(name, &v);
                }
            }
            Ok(default)
        };
        Ok(Settings {
            rounds: value("ROUNDS", default_rounds)? as usize,
            runtime_s: value("RUNTIME_S", default_runtime_s)?,
        })
    }
}

fn whole_number(name: &str, v: &str) -> anyhow::Result<u64> {
    match v.parse::<u64>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => bail!("{name}={v}: expected a whole number of 1 or more"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| {
            vars.iter()
                .find(|(name, _)| *name == k)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn suite_variables_win_over_the_shared_ones_and_defaults() {
        let s = Settings::lookup(Some("net"), 9, 1, env(&[])).unwrap();
        assert_eq!((s.rounds, s.runtime_s), (9, 1));
        let vars = [
            ("STALLTRACE_BENCH_ROUNDS", "3"),
            ("STALLTRACE_BENCH_NET_ROUNDS", "20"),
            ("STALLTRACE_BENCH_RUNTIME_S", "2"),
        ];
        let s = Settings::lookup(Some("net"), 9, 1, env(&vars)).unwrap();
        assert_eq!((s.rounds, s.runtime_s), (20, 2));
        let s = Settings::lookup(Some("block"), 12, 1, env(&vars)).unwrap();
        assert_eq!((s.rounds, s.runtime_s), (3, 2));
        let s = Settings::lookup(None, 5, 4, env(&vars)).unwrap();
        assert_eq!((s.rounds, s.runtime_s), (3, 2));
    }

    #[test]
    fn zero_and_words_are_refused() {
        for bad in ["0", "x", "-1", "1.5"] {
            let vars = [("STALLTRACE_BENCH_BLOCK_ROUNDS", bad)];
            let e = Settings::lookup(Some("block"), 12, 1, env(&vars));
            assert!(e.is_err(), "{bad}");
        }
    }
}
