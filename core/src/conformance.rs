//! Conformance: whether the admissions of one key keep their algorithm's own bound.
//!
//! weir's promise (`CONFORMANCE.md` in the shared docs) is not "the same decisions as one
//! central limiter" but the bound a client of one central limiter is guaranteed: the
//! admissions of one key, from every worker and every Envoy together, with their costs
//! and the times at which they were decided, satisfy the algorithm's bound. [`check`]
//! decides that for a list of [`Admission`]s, exactly, in integers, in O(n log n).
//!
//! ## Notation
//!
//! The admissions sorted by time (stably: equal times keep their order), `(t_1, c_1) …
//! (t_n, c_n)`, `t` in µs, `c` the cost; prefix sums `S_0 = 0`, `S_j = c_1 + … + c_j`.
//! Zero-cost admissions are allowed and count 0.
//!
//! ## The bounds
//!
//! - **GCRA** (burst `b`, emission interval `T`, tolerance `τ = (b + 1)·T`, both in ns):
//!   for all `i ≤ j`, `(S_j − S_(i−1))·T ≤ τ + (t_j − t_i)` with `t` in ns: over any
//!   stretch, `b + 1` units plus one per `T` elapsed. Each admitted unit pushes the TAT
//!   by `T`, and an admission needs `TAT − τ ≤ now`; over admissions `i..=j` the TAT rises
//!   by at least `T·(S_j − S_(i−1))` from at least `t_i` and ends at most at `t_j + τ`.
//!   A central GCRA with its TAT in ns never breaks it. Checked in one pass: with
//!   `m = min over i ≤ j of (S_(i−1)·T − t_i)`, a violation is `S_j·T − t_j − m > τ`.
//! - **Token bucket** with discrete refills (capacity `C`, refill `R` every period `P`):
//!   refills happen every `P` from the key's first request, a phase the checker cannot
//!   know, so the bound is the one every phase keeps: for all `i ≤ j`,
//!   `S_j − S_(i−1) ≤ C + R·⌈(t_j − t_i) / P⌉`, the most refill instants any phase puts
//!   in `(t_i, t_j]`. Not the continuous `C + R·(t_j − t_i)/P`: a central bucket takes
//!   `C` just before a refill and `R` just after, `C + R` within a microsecond.
//!   With `k = ⌊t/P⌋` and `r = t mod P`, `⌈(t_j − t_i)/P⌉ = k_j − k_i + [r_j > r_i]`,
//!   so for each `j` the worst `i` is the one with the largest `R·k_i − S_(i−1)` among
//!   the earlier admissions whose remainder is below `r_j` (one more refill instant) and
//!   among those at or above it: two prefix-maximum Fenwick trees over the remainders.
//! - **Fixed window** (limit `N`, window `W`): windows `[kW, (k + 1)W)` aligned to the
//!   epoch of the µs clock; every window's sum is at most `N`.
//! - **Sliding-window log** (limit `N`, window `W`): for every `j`, the sum over the
//!   admissions with `t ∈ (t_j − W, t_j]` is at most `N`: an event at `t` counts while
//!   `now − W < t`, as the Lua script trims (`ZREMRANGEBYSCORE key -inf now−window`).
//! - **Sliding-window counter** (limit `N`, window `W`, windows as the fixed window's): at
//!   every admission `j`, in window `k`, `e = t_j − kW` into it, with `prev` the sum over
//!   window `k − 1` and `cur` the sum over window `k` up to and including `j` (the
//!   admissions at the same instant sorted before `j` included), the algorithm's own
//!   integer test holds: `prev·(W − e) + cur·W ≤ N·W`.
//!
//! ## Reading a [`Violation`]
//!
//! [`check`] reports the violation that ends first: the smallest `last`. `first..=last`
//! are indices into the admissions sorted stably by time (sort a copy with
//! `sort_by_key(|a| a.at_us)` to look them up), `admitted` is the sum of their costs
//! (saturated at `u64::MAX`; the message has it exactly), and `allowed` the most units
//! the bound lets those admissions add up to, a decimal integer (it may not fit a `u64`):
//!
//! - GCRA: `⌊(τ + (t_last − t_first)) / T⌋`, over the stretch with the largest excess
//!   (the shortest one on a tie).
//! - Token bucket: `C + R·⌈(t_last − t_first) / P⌉`, chosen the same way.
//! - Fixed window: `N`; `first` is the window's first admission.
//! - Sliding log: `N`; `first` is the first admission inside `(t_last − W, t_last]`.
//! - Sliding-window counter: `N + ⌊prev·e / W⌋` for the sum `prev + cur`, which is the
//!   algorithm's test divided by `W`: the units of the previous window that have slid out
//!   no longer count. `first` is the previous window's first admission (the current
//!   window's if the previous one has none).
//!
//! The message says the same in words: the algorithm and its parameters, the
//! admissions, their times and what they add up to against what is allowed.
//!
//! `core/tests/conformance.rs` holds the checker to these definitions: on random
//! admissions it agrees with a brute-force reading of them; what one central limiter of
//! each algorithm admits (requests and leases, spent where granted) always passes; and
//! deliberate mutants (one unit more of burst, units spent after their lease, a refill
//! counted twice, a window boundary off by one) always fail, where the recomputed sum
//! really exceeds the bound.
//!
//! ## Clocks
//!
//! Every time must come from one clock, and be the time at which the admission was
//! decided: the Envoy's clock for local decisions and for units spent from a lease or a
//! reservation, the `now` Redis used (returned by the bridge) for units Redis admitted
//! itself. A unit granted at one time and spent at another is recorded when it is spent:
//! that displacement is exactly what the bound must survive.
//!
//! ```
//! use weir_core::algorithms::{fixed_window::FixedWindow, GlobalLimit, Limit};
//! use weir_core::conformance::{check, Admission};
//!
//! // 3 per second, windows aligned to whole seconds.
//! let limit = GlobalLimit::Slot(Limit::FixedWindow(FixedWindow::new(3, 1_000_000).unwrap()));
//! let second = 1_700_000_000_000_000;
//! let at = |at_us, cost| Admission { at_us, cost };
//! // 3 at the end of one window and 3 at the start of the next: the fixed window's price.
//! let ok = [at(second - 1, 3), at(second, 3)];
//! assert_eq!(check(&limit, &ok), Ok(()));
//!
//! // One more unit in the second window.
//! let violation = check(&limit, &[at(second - 1, 3), at(second, 3), at(second + 5, 1)]).unwrap_err();
//! assert_eq!((violation.first, violation.last, violation.admitted), (1, 2, 4));
//! assert_eq!(violation.allowed, "3");
//! ```

use std::fmt;

use crate::algorithms::{
    fixed_window::FixedWindow, gcra::Gcra, sliding_log::SlidingLog, sliding_window::SlidingWindow,
    token_bucket::TokenBucket, Algorithm, GlobalLimit, Limit, Unit, NS_PER_US,
};

/// One admission of one key: when it was decided (µs since the Unix epoch, one clock)
/// and its cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Admission {
    pub at_us: u64,
    pub cost: u64,
}

/// Where the admissions break the algorithm's bound: the admissions `first..=last`
/// (indices into the admissions sorted by time, stable), what they add up to, what the
/// bound allows there, and a message that says it in words (algorithm, interval, times,
/// admitted vs allowed). See the module docs for how each algorithm fills it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub first: usize,
    pub last: usize,
    pub admitted: u64,
    pub allowed: String,
    pub message: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Violation {}

/// Checks that `admissions` (any order; sorted stably by time inside) satisfy `limit`'s
/// own bound. On failure, reports the violation that ends first.
pub fn check(limit: &GlobalLimit, admissions: &[Admission]) -> Result<(), Violation> {
    let mut sorted = admissions.to_vec();
    sorted.sort_by_key(|a| a.at_us);
    let found = match limit {
        GlobalLimit::Slot(Limit::Gcra(g)) => gcra(g, &sorted),
        GlobalLimit::Slot(Limit::TokenBucket(b)) => token_bucket(b, &sorted),
        GlobalLimit::Slot(Limit::FixedWindow(w)) => fixed_window(w, &sorted),
        GlobalLimit::Slot(Limit::SlidingWindow(w)) => sliding_window(w, &sorted),
        GlobalLimit::SlidingLog(l) => sliding_log(l, &sorted),
    };
    match found {
        None => Ok(()),
        Some(found) => Err(found.violation(limit.algorithm(), &sorted)),
    }
}

/// A violation before it is put in words: the admissions, their exact sum, what the
/// bound allows them, and how the algorithm got there.
struct Found {
    first: usize,
    last: usize,
    admitted: u128,
    allowed: u128,
    why: String,
}

impl Found {
    fn violation(self, algorithm: &dyn Algorithm, sorted: &[Admission]) -> Violation {
        let spec = algorithm.spec();
        let parameters: Vec<String> = spec
            .parameters
            .iter()
            .zip(algorithm.parameters())
            .map(|(p, v)| match p.unit {
                Unit::Count => format!("{} {v}", p.name),
                Unit::Duration => format!("{} {v}us", p.name),
            })
            .collect();
        let at = |i: usize| sorted.get(i).map_or(0, |a| a.at_us);
        let (from, to) = (at(self.first), at(self.last));
        let message = format!(
            "{} ({}): admissions {}..={} (of {}, sorted by time), decided from {from}us to \
             {to}us ({}us), add up to {} units where the bound allows {}: {}",
            spec.name,
            parameters.join(", "),
            self.first,
            self.last,
            sorted.len(),
            to.saturating_sub(from),
            self.admitted,
            self.allowed,
            self.why,
        );
        Violation {
            first: self.first,
            last: self.last,
            admitted: u64::try_from(self.admitted).unwrap_or(u64::MAX),
            allowed: self.allowed.to_string(),
            message,
        }
    }
}

/// `S_(i−1)·T − t_i` for the best start `i` so far, with what the report needs of it.
#[derive(Debug, Clone, Copy)]
struct GcraStart {
    key: i128,
    index: usize,
    at_us: u64,
    sum_before: u128,
}

/// `(S_j − S_(i−1))·T ≤ τ + (t_j − t_i)`, in ns. Until the first violation every
/// `S_j·T` is at most `τ + t_j − t_1 < 2^76`, and a cost times `T` is below `2^117`,
/// so i128 holds every value the pass forms; the checked operations only guard that.
fn gcra(g: &Gcra, sorted: &[Admission]) -> Option<Found> {
    let t = i128::from(g.emission_interval_ns());
    let tau = i128::from(g.tolerance_ns());
    let ns = |at_us: u64| i128::from(at_us) * i128::from(NS_PER_US);
    let times_t = |sum: u128| i128::try_from(sum).ok()?.checked_mul(t);
    let mut sum: u128 = 0;
    let mut best: Option<GcraStart> = None;
    for (j, a) in sorted.iter().enumerate() {
        let now = ns(a.at_us);
        // A product beyond i128 is no smallest start: skipping it changes nothing.
        if let Some(key) = times_t(sum).map(|x| x - now) {
            // `<=`: on a tie the later start, the shorter stretch.
            if best.is_none_or(|b| key <= b.key) {
                best = Some(GcraStart {
                    key,
                    index: j,
                    at_us: a.at_us,
                    sum_before: sum,
                });
            }
        }
        sum = sum.saturating_add(u128::from(a.cost));
        // Set at the first admission (`S_0·T − t_1` always fits), so never `None` here.
        let start = best?;
        let excess = times_t(sum).and_then(|x| x.checked_sub(now)?.checked_sub(start.key));
        // Beyond i128 the excess is beyond τ too (`m ≤ −t_1`, and `S_j·T > 2^127`).
        if excess.is_some_and(|e| e <= tau) {
            continue;
        }
        let span_ns = now - ns(start.at_us);
        let allowed = (tau + span_ns) / t;
        return Some(Found {
            first: start.index,
            last: j,
            admitted: sum - start.sum_before,
            allowed: u128::try_from(allowed).unwrap_or(0),
            why: format!(
                "{} × T ({t}ns) is more than τ ({tau}ns) + {span_ns}ns",
                sum - start.sum_before,
            ),
        });
    }
    None
}

/// An earlier admission `i` as a start for the token bucket: `R·k_i` and `S_(i−1)`,
/// whose difference ranks it (see [`TbStart::beats`]).
#[derive(Debug, Clone, Copy)]
struct TbStart {
    /// `R·⌊t_i / P⌋`: below `2^128` since both factors are below `2^64`.
    refills: u128,
    sum_before: u128,
    index: usize,
    at_us: u64,
}

impl TbStart {
    /// A larger `R·k − S` (a worse stretch for every later end), or the same and later.
    /// The difference may need 129 bits, so the sides are compared as
    /// `R·k_a + S_b` against `R·k_b + S_a`, each summed with its carry.
    fn beats(&self, other: &TbStart) -> bool {
        let wide = |x: u128, y: u128| {
            let (sum, carry) = x.overflowing_add(y);
            (carry, sum)
        };
        let mine = wide(self.refills, other.sum_before);
        let theirs = wide(other.refills, self.sum_before);
        mine > theirs || (mine == theirs && self.index > other.index)
    }
}

/// A Fenwick tree answering "the best start among positions below `len`".
struct PrefixBest {
    nodes: Vec<Option<TbStart>>,
}

impl PrefixBest {
    fn new(len: usize) -> Self {
        PrefixBest {
            nodes: vec![None; len],
        }
    }

    fn insert(&mut self, position: usize, start: TbStart) {
        let mut i = position + 1;
        while let Some(node) = self.nodes.get_mut(i - 1) {
            if node.is_none_or(|n| start.beats(&n)) {
                *node = Some(start);
            }
            i += i & i.wrapping_neg();
        }
    }

    fn best_below(&self, len: usize) -> Option<TbStart> {
        let mut best: Option<TbStart> = None;
        let mut i = len;
        while i > 0 {
            if let Some(Some(node)) = self.nodes.get(i - 1) {
                if best.is_none_or(|b| node.beats(&b)) {
                    best = Some(*node);
                }
            }
            i &= i - 1;
        }
        best
    }
}

/// `S_j − S_(i−1) ≤ C + R·⌈(t_j − t_i)/P⌉`, the bound of every refill phase.
fn token_bucket(b: &TokenBucket, sorted: &[Admission]) -> Option<Found> {
    let (capacity, refill, period) = (b.capacity(), b.refill(), b.period_us());
    let mut remainders: Vec<u64> = sorted.iter().map(|a| a.at_us % period).collect();
    remainders.sort_unstable();
    remainders.dedup();
    let ranks = remainders.len();
    // `below` by rank: the starts with a smaller remainder. `at_or_above` by rank
    // reversed: the starts with the same or a larger one.
    let mut below = PrefixBest::new(ranks);
    let mut at_or_above = PrefixBest::new(ranks);
    let mut sum: u128 = 0;
    for (j, a) in sorted.iter().enumerate() {
        let k = a.at_us / period;
        let rank = remainders.partition_point(|&r| r < a.at_us % period);
        let start = TbStart {
            refills: u128::from(refill) * u128::from(k),
            sum_before: sum,
            index: j,
            at_us: a.at_us,
        };
        below.insert(rank, start);
        at_or_above.insert(ranks - 1 - rank, start);
        sum = sum.saturating_add(u128::from(a.cost));

        // Refill instants any phase can put in (t_i, t_j]: k_j − k_i, plus one when
        // r_i < r_j. The worst start of each kind, then the worse of the two.
        let candidates = [
            (below.best_below(rank), 1),
            (at_or_above.best_below(ranks - rank), 0),
        ];
        let mut worst: Option<(u128, TbStart, u128)> = None;
        for (start, extra) in candidates {
            let Some(start) = start else { continue };
            let instants = u128::from(k - start.at_us / period) + extra;
            let admitted = sum - start.sum_before;
            let allowed = u128::from(refill)
                .checked_mul(instants)
                .and_then(|x| x.checked_add(u128::from(capacity)));
            let Some(allowed) = allowed.filter(|&x| admitted > x) else {
                continue;
            };
            let excess = admitted - allowed;
            if worst.is_none_or(|(e, s, _)| excess > e || (excess == e && start.index > s.index)) {
                worst = Some((excess, start, instants));
            }
        }
        if let Some((excess, start, instants)) = worst {
            let admitted = sum - start.sum_before;
            return Some(Found {
                first: start.index,
                last: j,
                admitted,
                allowed: admitted - excess,
                why: format!(
                    "capacity {capacity} + {refill} × {instants} refill instant(s), the most \
                     that any phase of refills every {period}us puts in ({}us, {}us]",
                    start.at_us, a.at_us,
                ),
            });
        }
    }
    None
}

/// The admissions of one window (fixed, or of the sliding-window counter): its number,
/// its first admission and their sum so far.
#[derive(Debug, Clone, Copy)]
struct WindowSum {
    k: u64,
    first: usize,
    sum: u128,
}

impl WindowSum {
    /// `current` with admission `j` (in window `k`) added, or a new window.
    fn add(current: Option<WindowSum>, k: u64, j: usize, cost: u64) -> WindowSum {
        match current {
            Some(c) if c.k == k => WindowSum {
                sum: c.sum.saturating_add(u128::from(cost)),
                ..c
            },
            _ => WindowSum {
                k,
                first: j,
                sum: u128::from(cost),
            },
        }
    }
}

impl Found {
    /// `first..=last`, all in `interval`, add up to `sum`, above `limit`.
    fn over_limit(first: usize, last: usize, sum: u128, limit: u64, interval: String) -> Found {
        Found {
            first,
            last,
            admitted: sum,
            allowed: u128::from(limit),
            why: format!("they are all in {interval}, which holds at most {limit}"),
        }
    }
}

/// Every window `[kW, (k + 1)W)` holds at most `N`.
fn fixed_window(w: &FixedWindow, sorted: &[Admission]) -> Option<Found> {
    let (limit, width) = (w.limit(), w.window_us());
    let mut current: Option<WindowSum> = None;
    for (j, a) in sorted.iter().enumerate() {
        let window = WindowSum::add(current, a.at_us / width, j, a.cost);
        current = Some(window);
        if window.sum > u128::from(limit) {
            let start = u128::from(window.k) * u128::from(width);
            let end = start + u128::from(width);
            let interval = format!("the window [{start}us, {end}us)");
            return Some(Found::over_limit(
                window.first,
                j,
                window.sum,
                limit,
                interval,
            ));
        }
    }
    None
}

/// Every `(t_j − W, t_j]` holds at most `N`: two pointers.
fn sliding_log(l: &SlidingLog, sorted: &[Admission]) -> Option<Found> {
    let (limit, width) = (l.limit(), l.window_us());
    let mut first = 0;
    let mut sum: u128 = 0;
    for (j, a) in sorted.iter().enumerate() {
        sum = sum.saturating_add(u128::from(a.cost));
        // Events at or before t_j − W have left (the Lua trim's inclusive bound).
        while let Some(old) = sorted.get(first) {
            if u128::from(old.at_us) + u128::from(width) > u128::from(a.at_us) {
                break;
            }
            sum = sum.saturating_sub(u128::from(old.cost));
            first += 1;
        }
        if sum > u128::from(limit) {
            let from = i128::from(a.at_us) - i128::from(width);
            let interval = format!("the log's window ({from}us, {}us]", a.at_us);
            return Some(Found::over_limit(first, j, sum, limit, interval));
        }
    }
    None
}

/// `prev·(W − e) + cur·W ≤ N·W` at every admission, as `SlidingWindow::decide` tests it.
fn sliding_window(w: &SlidingWindow, sorted: &[Admission]) -> Option<Found> {
    let (limit, width) = (w.limit(), w.window_us());
    let w128 = u128::from(width);
    let budget = u128::from(limit) * w128;
    let mut current: Option<WindowSum> = None;
    let mut previous: Option<WindowSum> = None;
    for (j, a) in sorted.iter().enumerate() {
        let k = a.at_us / width;
        let cur = WindowSum::add(current, k, j, a.cost);
        if cur.first == j {
            previous = current;
        }
        current = Some(cur);
        let prev = previous.filter(|p| p.k.checked_add(1) == Some(k));
        let prev_sum = prev.map_or(0, |p| p.sum);
        let elapsed = u128::from(a.at_us % width);
        // As in `decide`: a product beyond u128 does not fit.
        let weighed = prev_sum
            .checked_mul(w128 - elapsed)
            .and_then(|x| x.checked_add(cur.sum.checked_mul(w128)?));
        if weighed.is_some_and(|x| x <= budget) {
            continue;
        }
        // ⌊prev·e / W⌋ without overflow: e < W.
        let slid_out = (prev_sum / w128) * elapsed + (prev_sum % w128) * elapsed / w128;
        let prev_first = prev.map(|p| p.first);
        let prev_text = match prev_first {
            Some(first) => format!("admissions {first}..={}", cur.first - 1),
            None => "none".to_string(),
        };
        return Some(Found {
            first: prev_first.unwrap_or(cur.first),
            last: j,
            admitted: prev_sum.saturating_add(cur.sum),
            allowed: u128::from(limit).saturating_add(slid_out),
            why: format!(
                "at {}us, {elapsed}us into its window, the previous window's {prev_sum} \
                 units ({prev_text}) weigh ({width} − {elapsed})/{width} and this window's \
                 {} units (admissions {}..={j}) count in full: {prev_sum} × {} + {} × \
                 {width} is more than {limit} × {width}",
                a.at_us,
                cur.sum,
                cur.first,
                w128 - elapsed,
                cur.sum,
            ),
        });
    }
    None
}
