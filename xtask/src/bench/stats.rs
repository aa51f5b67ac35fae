//! Order statistics of the rounds, and verdicts that hold from run to run.
//!
//! [`Summary`]: median and range, for figures that are shown but judge
//! nothing (a configuration's own IOPS, its neighbours' CPU).
//!
//! [`Estimate`]: the median of per-round values (a traced run over the
//! untraced run of the same round, a program's ns/event in one round) with a
//! distribution-free 95% confidence interval for that median, from order
//! statistics: with n rounds, independent and from the same distribution, the
//! number of them below the true median is Binomial(n, ½), so the interval
//! from the k-th smallest to the k-th largest value misses the median with
//! probability 2·P(Binomial(n, ½) ≤ k − 1). [`median_ci`] takes the largest k
//! for which that is at most 5%. It assumes nothing about the shape of the
//! distribution (a bimodal one, or one with outliers, is common on a shared
//! 2-vCPU VM), needs no random numbers, and its coverage is exact, not
//! asymptotic; the price is that it needs at least [`MIN_ROUNDS_FOR_CI`]
//! rounds (with 5, even min–max covers the median only 93.75% of the time).
//!
//! [`judge`]: a verdict only where the interval allows one: met when the whole
//! interval is on the good side of the target, missed when the whole interval
//! is on the bad side, inconclusive otherwise (or without an interval).

use serde::Serialize;

#[derive(Serialize, Clone, Copy, Debug, PartialEq)]
pub struct Summary {
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

impl Summary {
    /// None for no samples.
    pub fn of(samples: &[f64]) -> Option<Self> {
        if samples.is_empty() {
            return None;
        }
        let mut v = samples.to_vec();
        v.sort_by(f64::total_cmp);
        Some(Self {
            median: median_of_sorted(&v),
            min: v[0],
            max: v[v.len() - 1],
        })
    }
}

fn median_of_sorted(v: &[f64]) -> f64 {
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// The summary of one figure over the rounds, which are never none.
pub fn summary(v: impl IntoIterator<Item = f64>) -> Summary {
    Summary::of(&v.into_iter().collect::<Vec<_>>()).expect("at least one round")
}

/// "min–max" of `s`, with `digits` decimals.
pub fn range(s: &Summary, digits: usize) -> String {
    format!("{:.digits$}–{:.digits$}", s.min, s.max)
}

/// The confidence the intervals are built for.
pub const CONFIDENCE: f64 = 0.95;

/// The fewest rounds for which an order-statistic interval reaches
/// [`CONFIDENCE`]: min–max of 6 rounds misses the median with probability
/// 2/2⁶ = 3.1%; of 5 rounds, 6.25%.
pub const MIN_ROUNDS_FOR_CI: usize = 6;

/// A distribution-free confidence interval for a median.
#[derive(Serialize, Clone, Copy, Debug, PartialEq)]
pub struct Ci {
    pub low: f64,
    pub high: f64,
    /// Its exact coverage, 1 − 2·P(Binomial(n, ½) ≤ rank − 1): at least [`CONFIDENCE`].
    pub coverage: f64,
    /// The order statistics it runs between: the `rank`-th smallest and the
    /// `rank`-th largest value (1 = min–max).
    pub rank: usize,
}

/// The median of per-round values, their range, and a 95% interval for the
/// median when there are rounds enough.
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct Estimate {
    /// Rounds that gave a value (a round whose value is not a finite number,
    /// e.g. a ratio over 0, gives none).
    pub rounds: usize,
    pub median: f64,
    pub min: f64,
    pub max: f64,
    /// None below [`MIN_ROUNDS_FOR_CI`] rounds.
    pub ci: Option<Ci>,
    /// The rounds' values, ascending: an inconclusive verdict reads from
    /// them how many rounds would decide it ([`rounds_to_decide`]).
    #[serde(skip)]
    sorted: Vec<f64>,
}

impl Estimate {
    /// None when no round gave a finite value.
    pub fn of(samples: impl IntoIterator<Item = f64>) -> Option<Self> {
        let mut v: Vec<f64> = samples.into_iter().filter(|x| x.is_finite()).collect();
        if v.is_empty() {
            return None;
        }
        v.sort_by(f64::total_cmp);
        Some(Estimate {
            rounds: v.len(),
            median: median_of_sorted(&v),
            min: v[0],
            max: v[v.len() - 1],
            ci: median_ci(&v),
            sorted: v,
        })
    }

    /// The same estimate of `f(value)` for a monotonically increasing `f`
    /// (a change of unit: ns per I/O to % of a core at some rate).
    pub fn scaled(&self, f: impl Fn(f64) -> f64) -> Self {
        Estimate {
            rounds: self.rounds,
            median: f(self.median),
            min: f(self.min),
            max: f(self.max),
            ci: self.ci.map(|c| Ci {
                low: f(c.low),
                high: f(c.high),
                ..c
            }),
            sorted: self.sorted.iter().map(|&x| f(x)).collect(),
        }
    }

    /// "median [low–high]" with `digits` decimals, or "median [n rounds: no CI]".
    pub fn text(&self, digits: usize) -> String {
        format!("{:.digits$} [{}]", self.median, self.ci_text(digits))
    }

    /// "low–high", or why there is no interval.
    pub fn ci_text(&self, digits: usize) -> String {
        match self.ci {
            Some(c) => format!("{:.digits$}–{:.digits$}", c.low, c.high),
            None => format!("{} rounds: no CI", self.rounds),
        }
    }

    /// "min–max" with `digits` decimals.
    pub fn range_text(&self, digits: usize) -> String {
        format!("{:.digits$}–{:.digits$}", self.min, self.max)
    }
}

/// P(Binomial(n, ½) ≤ j), summed in log space so that large n cannot underflow
/// the terms that matter.
fn binomial_half_cdf(n: usize, j: usize) -> f64 {
    let mut ln_term = -(n as f64) * std::f64::consts::LN_2;
    let mut sum = 0.0;
    for i in 0..=j.min(n) {
        if i > 0 {
            ln_term += ((n - i + 1) as f64).ln() - (i as f64).ln();
        }
        sum += ln_term.exp();
    }
    sum
}

/// The widest-confidence-first search for the narrowest order-statistic
/// interval of `sorted` (ascending) that still covers the median with at
/// least [`CONFIDENCE`]: the largest rank k with 2·P(Bin(n, ½) ≤ k − 1) ≤ 5%.
/// None when even min–max falls short (fewer than [`MIN_ROUNDS_FOR_CI`]).
pub fn median_ci(sorted: &[f64]) -> Option<Ci> {
    let n = sorted.len();
    let k = ci_rank(n)?;
    Some(Ci {
        low: sorted[k - 1],
        high: sorted[n - k],
        coverage: 1.0 - ci_miss(n, k),
        rank: k,
    })
}

/// The chance that the interval between the k-th smallest and the k-th
/// largest of n values misses their median: 2·P(Bin(n, ½) ≤ k − 1).
fn ci_miss(n: usize, k: usize) -> f64 {
    2.0 * binomial_half_cdf(n, k - 1)
}

/// The rank [`median_ci`] takes for n values, None below [`MIN_ROUNDS_FOR_CI`].
fn ci_rank(n: usize) -> Option<usize> {
    // Small float slack: a miss chance equal to 5% still qualifies.
    let ok = |k: usize| ci_miss(n, k) <= 1.0 - CONFIDENCE + 1e-12;
    if n == 0 || !ok(1) {
        return None;
    }
    let mut k = 1;
    while k < n.div_ceil(2) && ok(k + 1) {
        k += 1;
    }
    Some(k)
}

/// The most rounds [`rounds_to_decide`] looks at: more would take hours
/// (block: ~45 s a round), and the host's drift would outweigh the spread.
pub const MAX_ROUNDS_TO_DECIDE: usize = 200;

/// The fewest rounds N (> `sorted.len()`) from which every count up to
/// [`MAX_ROUNDS_TO_DECIDE`] leaves `goal`'s bound outside the 95% interval,
/// if rounds to come vary as these did: N rounds' interval ([`median_ci`],
/// ranks k(N)) is read off these rounds' quantiles at (k − 1)/(N − 1) and
/// (N − k)/(N − 1), interpolated. From, not at: k(N) grows in steps and the
/// interval widens between them. None when none does (the bound too near
/// the median, or too few rounds). An extrapolation: a shifted host shifts it.
pub fn rounds_to_decide(sorted: &[f64], goal: Goal) -> Option<usize> {
    let n = sorted.len();
    if n < MIN_ROUNDS_FOR_CI {
        return None;
    }
    let quantile = |p: f64| {
        let h = (n - 1) as f64 * p;
        let below = h.floor() as usize;
        let above = (below + 1).min(n - 1);
        sorted[below] + (h - below as f64) * (sorted[above] - sorted[below])
    };
    let decides = |rounds: usize| {
        let k = ci_rank(rounds).expect("more than 6 rounds have an interval");
        let span = (rounds - 1) as f64;
        let (low, high) = (
            quantile((k - 1) as f64 / span),
            quantile((rounds - k) as f64 / span),
        );
        goal.holds(low) == goal.holds(high)
    };
    (n + 1..=MAX_ROUNDS_TO_DECIDE)
        .rev()
        .take_while(|&rounds| decides(rounds))
        .last()
}

/// A verdict's three ways.
#[derive(Serialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    Met,
    Missed,
    /// The interval straddles the target, or there is no interval.
    Inconclusive,
}

impl From<bool> for Outcome {
    /// For targets judged on exact counts, not on noisy rounds.
    fn from(met: bool) -> Self {
        if met { Outcome::Met } else { Outcome::Missed }
    }
}

impl Outcome {
    /// As the targets tables print it.
    pub fn bold(self) -> &'static str {
        match self {
            Outcome::Met => "**met**",
            Outcome::Missed => "**missed**",
            Outcome::Inconclusive => "**inconclusive**",
        }
    }

    pub fn word(self) -> &'static str {
        match self {
            Outcome::Met => "met",
            Outcome::Missed => "missed",
            Outcome::Inconclusive => "inconclusive",
        }
    }
}

/// Which side of a bound is good.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Goal {
    /// The figure must be at least this (a throughput ratio, a factor).
    AtLeast(f64),
    /// The figure must be at most this (a latency ratio, ns/event).
    AtMost(f64),
}

impl Goal {
    pub fn bound(self) -> f64 {
        match self {
            Goal::AtLeast(b) | Goal::AtMost(b) => b,
        }
    }

    /// Whether `x` is on the good side (the bound itself is good).
    pub fn holds(self, x: f64) -> bool {
        match self {
            Goal::AtLeast(b) => x >= b,
            Goal::AtMost(b) => x <= b,
        }
    }

    /// ">= 0.97", "<= 150".
    pub fn text(self, digits: usize) -> String {
        match self {
            Goal::AtLeast(b) => format!(">= {b:.digits$}"),
            Goal::AtMost(b) => format!("<= {b:.digits$}"),
        }
    }
}

/// An outcome and why, in words.
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct Judgement {
    pub outcome: Outcome,
    pub why: String,
}

impl Judgement {
    /// The detail of a traced / untraced ratio's verdict: this judgement,
    /// how far traced moved the figure at the median (`moved`: which way,
    /// in words; `what`: after the percentage), what was allowed, and the
    /// per-round ratios' min–max.
    pub fn ratio_detail(&self, e: &Estimate, moved: &str, what: &str, allowed_pct: f64) -> String {
        format!(
            "{}: {}; at the median traced {moved} {:.1}%{what} ({allowed_pct:.0}% allowed); \
             per-round ratios min–max {}",
            self.outcome.word(),
            self.why,
            (e.median - 1.0).abs() * 100.0,
            e.range_text(3)
        )
    }
}

/// The verdict on `estimate` against `goal`, figures printed with `digits`
/// decimals: met if the whole 95% interval is on the good side, missed if it
/// is all on the bad side, inconclusive if it straddles the bound or there
/// are too few rounds for an interval (never a verdict from the median alone).
pub fn judge(estimate: Option<&Estimate>, goal: Goal, digits: usize) -> Judgement {
    let Some(e) = estimate else {
        return Judgement {
            outcome: Outcome::Inconclusive,
            why: "no round measured it".into(),
        };
    };
    let bound = goal.bound();
    let Some(ci) = e.ci else {
        return Judgement {
            outcome: Outcome::Inconclusive,
            why: format!(
                "{} round(s): a {:.0}% interval for the median needs at least \
                 {MIN_ROUNDS_FOR_CI}, so no verdict (median {:.digits$}, {} the bound)",
                e.rounds,
                CONFIDENCE * 100.0,
                e.median,
                if goal.holds(e.median) {
                    "inside"
                } else {
                    "outside"
                }
            ),
        };
    };
    let interval = format!(
        "95% interval {:.digits$}–{:.digits$} over {} rounds",
        ci.low, ci.high, e.rounds
    );
    let (low_ok, high_ok) = (goal.holds(ci.low), goal.holds(ci.high));
    if low_ok && high_ok {
        Judgement {
            outcome: Outcome::Met,
            why: format!("the whole {interval} is {}", goal.text(digits)),
        }
    } else if !low_ok && !high_ok {
        Judgement {
            outcome: Outcome::Missed,
            why: format!("the whole {interval} is on the wrong side of {bound:.digits$}"),
        }
    } else {
        Judgement {
            outcome: Outcome::Inconclusive,
            why: format!(
                "the {interval} straddles {bound:.digits$}; {}",
                match rounds_to_decide(&e.sorted, goal) {
                    Some(rounds) => format!(
                        "about {rounds} rounds would decide it if the rounds to come vary \
                         as these did (STALLTRACE_BENCH_<SUITE>_ROUNDS)"
                    ),
                    None => format!(
                        "no number of rounds up to {MAX_ROUNDS_TO_DECIDE} would decide it at \
                         this spread: the median {:.digits$} is too near the bound",
                        e.median
                    ),
                }
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even_counts() {
        let s = Summary::of(&[5.0, 1.0, 3.0]).unwrap();
        assert_eq!((s.median, s.min, s.max), (3.0, 1.0, 5.0));
        assert_eq!(Summary::of(&[4.0, 1.0, 2.0, 3.0]).unwrap().median, 2.5);
        assert_eq!(Summary::of(&[]), None);
    }

    #[test]
    fn summary_and_range_of_rounds() {
        let s = summary([2.0, 0.5, 1.25]);
        assert_eq!((s.median, s.min, s.max), (1.25, 0.5, 2.0));
        assert_eq!(range(&s, 1), "0.5–2.0");
        assert_eq!(range(&s, 0), "0–2");
    }

    #[test]
    fn binomial_tail() {
        assert!((binomial_half_cdf(6, 0) - 1.0 / 64.0).abs() < 1e-15);
        assert!((binomial_half_cdf(10, 1) - 11.0 / 1024.0).abs() < 1e-15);
        assert!((binomial_half_cdf(4, 4) - 1.0).abs() < 1e-12);
        // Large n: the terms near the tail must not underflow to 0.
        let p = binomial_half_cdf(2000, 955);
        assert!(p > 0.01 && p < 0.03, "{p}");
    }

    /// The ranks and coverages of the usual tables of order-statistic
    /// intervals for the median at 95%.
    #[test]
    fn interval_ranks_for_known_round_counts() {
        let ranks = |n: usize| {
            let v: Vec<f64> = (1..=n).map(|i| i as f64).collect();
            median_ci(&v).map(|c| (c.rank, c.low, c.high))
        };
        assert_eq!(ranks(5), None);
        assert_eq!(ranks(6), Some((1, 1.0, 6.0)));
        assert_eq!(ranks(8), Some((1, 1.0, 8.0)));
        assert_eq!(ranks(9), Some((2, 2.0, 8.0)));
        assert_eq!(ranks(12), Some((3, 3.0, 10.0)));
        assert_eq!(ranks(20), Some((6, 6.0, 15.0)));
        let c = median_ci(&[1.0; 6]).unwrap();
        assert!((c.coverage - (1.0 - 2.0 / 64.0)).abs() < 1e-12);
        let c = median_ci(&(1..=12).map(f64::from).collect::<Vec<_>>()).unwrap();
        assert!(
            c.coverage >= CONFIDENCE && c.coverage < 0.97,
            "{}",
            c.coverage
        );
    }

    #[test]
    fn estimates_sort_and_drop_non_finite_rounds() {
        let e = Estimate::of([1.3, f64::NAN, 0.9, 1.0, f64::INFINITY, 1.1, 1.2, 0.8]).unwrap();
        assert_eq!(e.rounds, 6);
        assert!((e.median - 1.05).abs() < 1e-12);
        assert_eq!((e.min, e.max), (0.8, 1.3));
        let ci = e.ci.unwrap();
        assert_eq!((ci.low, ci.high), (0.8, 1.3));
        assert_eq!(Estimate::of([f64::NAN]), None);
        assert_eq!(Estimate::of([]), None);
        let few = Estimate::of([1.0, 2.0]).unwrap();
        assert_eq!(few.ci, None);
        assert_eq!(few.text(1), "1.5 [2 rounds: no CI]");
        assert_eq!(e.text(2), "1.05 [0.80–1.30]");
        let pct = e.scaled(|x| x * 100.0);
        assert_eq!(pct.ci.unwrap().low, 80.0);
        assert_eq!(pct.rounds, 6);
    }

    fn rounds(v: &[f64]) -> Estimate {
        Estimate::of(v.iter().copied()).unwrap()
    }

    #[test]
    fn all_rounds_above_the_target_is_met() {
        let e = rounds(&[0.981, 0.99, 1.01, 0.985, 1.02, 0.995, 1.0, 0.99, 0.983]);
        let j = judge(Some(&e), Goal::AtLeast(0.97), 3);
        assert_eq!(j.outcome, Outcome::Met, "{}", j.why);
        assert!(j.why.contains("0.983–1.010"), "{}", j.why);
        assert!(j.why.contains("over 9 rounds"), "{}", j.why);
    }

    #[test]
    fn all_rounds_below_the_target_is_missed() {
        let e = rounds(&[0.90, 0.91, 0.93, 0.92, 0.95, 0.96, 0.94]);
        let j = judge(Some(&e), Goal::AtLeast(0.97), 3);
        assert_eq!(j.outcome, Outcome::Missed, "{}", j.why);
        // Lower is better: ns/event all over 150.
        let ns = rounds(&[180.0, 175.0, 190.0, 185.0, 181.0, 179.0]);
        assert_eq!(
            judge(Some(&ns), Goal::AtMost(150.0), 0).outcome,
            Outcome::Missed
        );
        assert_eq!(
            judge(Some(&ns), Goal::AtMost(200.0), 0).outcome,
            Outcome::Met
        );
    }

    #[test]
    fn an_interval_that_straddles_the_target_is_inconclusive() {
        // The median (0.975) meets 0.97, but the interval reaches below it.
        let e = rounds(&[0.95, 0.96, 0.97, 0.975, 0.975, 0.98, 0.99, 1.0]);
        assert!(e.median >= 0.97);
        let j = judge(Some(&e), Goal::AtLeast(0.97), 3);
        assert_eq!(j.outcome, Outcome::Inconclusive);
        assert!(j.why.contains("straddles 0.970"), "{}", j.why);
        let j = judge(Some(&e), Goal::AtMost(0.97), 3);
        assert_eq!(j.outcome, Outcome::Inconclusive);
    }

    /// n values evenly over [0, 1]: the rounds of a uniform host, with no noise of their own.
    fn uniform(n: usize) -> Vec<f64> {
        (0..n).map(|i| i as f64 / (n - 1) as f64).collect()
    }

    #[test]
    fn the_rounds_that_would_decide_are_the_rounds_whose_own_interval_decides() {
        // 12 rounds spread evenly over [0, 1], target <= 0.6: the interval
        // (about 0.2-0.8) straddles it. The oracle is median_ci itself, run on
        // N rounds of the same spread: N rounds decide, a tenth fewer do not.
        let twelve = uniform(12);
        let goal = Goal::AtMost(0.6);
        let j = judge(Estimate::of(twelve.clone()).as_ref(), goal, 2);
        assert_eq!(j.outcome, Outcome::Inconclusive, "{}", j.why);
        let n = rounds_to_decide(&twelve, goal).expect("a spread this wide decides");
        let decided = |rounds: usize| {
            let ci = median_ci(&uniform(rounds)).unwrap();
            goal.holds(ci.low) == goal.holds(ci.high)
        };
        // every number of rounds from n on decides, the one before does not
        for rounds in n..=MAX_ROUNDS_TO_DECIDE {
            assert!(decided(rounds), "{n} given, yet {rounds} do not decide");
        }
        assert!(!decided(n - 1), "{n} given, yet {} decide", n - 1);
        // the normal approximation: 0.5 + 0.98/sqrt(N) <= 0.6 from N ~ 96;
        // k(N)'s steps put the last undecided N a little later
        assert!((90..=120).contains(&n), "{n}");
        assert!(
            j.why.contains(&format!("about {n} rounds would decide it")),
            "{}",
            j.why
        );
    }

    #[test]
    fn a_median_on_the_bound_is_decided_by_no_number_of_rounds() {
        let twelve = uniform(12);
        for goal in [Goal::AtMost(0.5), Goal::AtLeast(0.5)] {
            assert_eq!(rounds_to_decide(&twelve, goal), None);
            let j = judge(Estimate::of(twelve.clone()).as_ref(), goal, 2);
            assert!(j.why.contains("no number of rounds up to 200"), "{}", j.why);
        }
        // and too few rounds to read a spread from
        assert_eq!(rounds_to_decide(&uniform(5), Goal::AtMost(0.9)), None);
    }

    #[test]
    fn too_few_rounds_for_an_interval_is_inconclusive_with_the_reason() {
        // Every round far above the target, but 5 rounds give no 95% interval.
        let e = rounds(&[1.2, 1.3, 1.25, 1.22, 1.28]);
        let j = judge(Some(&e), Goal::AtLeast(0.97), 3);
        assert_eq!(j.outcome, Outcome::Inconclusive);
        assert!(
            j.why
                .starts_with("5 round(s): a 95% interval for the median needs at least 6"),
            "{}",
            j.why
        );
        let j = judge(None, Goal::AtLeast(0.97), 3);
        assert_eq!(j.outcome, Outcome::Inconclusive);
        assert_eq!(j.why, "no round measured it");
    }

    #[test]
    fn the_bound_itself_is_on_the_good_side() {
        let e = rounds(&[0.97; 6]);
        assert_eq!(
            judge(Some(&e), Goal::AtLeast(0.97), 2).outcome,
            Outcome::Met
        );
        assert_eq!(judge(Some(&e), Goal::AtMost(0.97), 2).outcome, Outcome::Met);
    }

    #[test]
    fn outcomes_print_and_serialize() {
        assert_eq!(Outcome::from(true), Outcome::Met);
        assert_eq!(Outcome::from(false).bold(), "**missed**");
        assert_eq!(
            serde_json::to_value(Outcome::Inconclusive).unwrap(),
            "inconclusive"
        );
    }
}
