//! The conformance checker (`weir_core::conformance`): hand-computed tables and worked
//! examples of mutants (natively and under wasm32), then properties (natively, with
//! proptest): a single central limiter never violates its bound, deliberate mutants
//! always do, and the checker agrees with a brute-force reading of the bounds.
//!
//! Every violation the checker reports is recomputed here from its definition: the sum
//! over `first..=last` of the sorted admissions really exceeds the bound there.

// Test code: a failed expectation is meant to panic, helpers included.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test as test;

use weir_core::algorithms::{
    fixed_window::FixedWindow, gcra::Gcra, sliding_log::SlidingLog, sliding_window::SlidingWindow,
    token_bucket::TokenBucket, AlgorithmKind, GlobalLimit, Limit, SlotState,
};
use weir_core::conformance::{check, Admission, Violation};
use weir_core::scenarios::{S_US, T0};

fn gcra(burst: u64, rate: u64, period_us: u64) -> GlobalLimit {
    GlobalLimit::Slot(Limit::Gcra(Gcra::new(burst, rate, period_us).unwrap()))
}

fn token_bucket(capacity: u64, refill: u64, period_us: u64) -> GlobalLimit {
    GlobalLimit::Slot(Limit::TokenBucket(
        TokenBucket::new(capacity, refill, period_us).unwrap(),
    ))
}

fn fixed_window(limit: u64, window_us: u64) -> GlobalLimit {
    GlobalLimit::Slot(Limit::FixedWindow(
        FixedWindow::new(limit, window_us).unwrap(),
    ))
}

fn sliding_window(limit: u64, window_us: u64) -> GlobalLimit {
    GlobalLimit::Slot(Limit::SlidingWindow(
        SlidingWindow::new(limit, window_us).unwrap(),
    ))
}

fn sliding_log(limit: u64, window_us: u64) -> GlobalLimit {
    GlobalLimit::SlidingLog(SlidingLog::new(limit, window_us).unwrap())
}

fn at(at_us: u64, cost: u64) -> Admission {
    Admission { at_us, cost }
}

/// The admissions as the checker indexes them: sorted stably by time.
fn sorted(admissions: &[Admission]) -> Vec<Admission> {
    let mut sorted = admissions.to_vec();
    sorted.sort_by_key(|a| a.at_us);
    sorted
}

fn sum(admissions: &[Admission]) -> u128 {
    admissions.iter().map(|a| u128::from(a.cost)).sum()
}

/// `(S_j − S_(i−1))` and the bound's own measure of how far it goes beyond the allowance
/// for the stretch `i..=j` (GCRA in ns, the token bucket in units), for the algorithms
/// whose violations are stretches.
fn stretch_excess(limit: &GlobalLimit, s: &[Admission], i: usize, j: usize) -> i128 {
    let admitted = sum(&s[i..=j]) as i128;
    let (from, to) = (s[i].at_us, s[j].at_us);
    match limit {
        GlobalLimit::Slot(Limit::Gcra(g)) => {
            let t = i128::from(g.emission_interval_ns());
            admitted * t - i128::from(g.tolerance_ns()) - i128::from(to - from) * 1_000
        }
        GlobalLimit::Slot(Limit::TokenBucket(b)) => {
            let instants = (to - from).div_ceil(b.period_us());
            admitted - i128::from(b.capacity()) - i128::from(b.refill()) * i128::from(instants)
        }
        _ => unreachable!("windows are not stretches"),
    }
}

/// Whether the admissions up to and including `j` (sorted) break the bound at `j`,
/// straight from CONFORMANCE.md's table, in O(n) per `j`.
fn breaks_at(limit: &GlobalLimit, s: &[Admission], j: usize) -> bool {
    let t = s[j].at_us;
    match limit {
        GlobalLimit::Slot(Limit::Gcra(_) | Limit::TokenBucket(_)) => {
            (0..=j).any(|i| stretch_excess(limit, s, i, j) > 0)
        }
        GlobalLimit::Slot(Limit::FixedWindow(w)) => {
            let k = t / w.window_us();
            let inside: Vec<Admission> = s[..=j]
                .iter()
                .filter(|a| a.at_us / w.window_us() == k)
                .copied()
                .collect();
            sum(&inside) > u128::from(w.limit())
        }
        GlobalLimit::SlidingLog(l) => {
            let inside: Vec<Admission> = s[..=j]
                .iter()
                .filter(|a| u128::from(a.at_us) + u128::from(l.window_us()) > u128::from(t))
                .copied()
                .collect();
            sum(&inside) > u128::from(l.limit())
        }
        GlobalLimit::Slot(Limit::SlidingWindow(w)) => {
            let width = w.window_us();
            let k = t / width;
            let in_window = |a: &&Admission, n: u64| a.at_us / width == n;
            let prev: Vec<Admission> = s
                .iter()
                .filter(|a| k > 0 && in_window(a, k - 1))
                .copied()
                .collect();
            let cur: Vec<Admission> = s[..=j]
                .iter()
                .filter(|a| in_window(a, k))
                .copied()
                .collect();
            let e = u128::from(t % width);
            sum(&prev) * (u128::from(width) - e) + sum(&cur) * u128::from(width)
                > u128::from(w.limit()) * u128::from(width)
        }
    }
}

/// Recomputes a reported violation from the definitions: its admissions really exceed
/// the bound there, `admitted` and `allowed` say so, and `first` is the start the
/// module docs promise.
fn assert_real(limit: &GlobalLimit, admissions: &[Admission], v: &Violation) {
    let s = sorted(admissions);
    let (first, last) = (v.first, v.last);
    assert!(first <= last && last < s.len(), "{v:?}");
    let admitted = sum(&s[first..=last]);
    assert_eq!(
        u128::from(v.admitted),
        admitted.min(u128::from(u64::MAX)),
        "{v}"
    );
    let allowed: u128 = v.allowed.parse().unwrap();
    assert!(admitted > allowed, "{v}");
    assert_eq!(v.to_string(), v.message);
    assert!(
        v.message.starts_with(limit.kind().name()),
        "the message names the algorithm: {v}"
    );
    let (from, to) = (s[first].at_us, s[last].at_us);
    match limit {
        GlobalLimit::Slot(Limit::Gcra(g)) => {
            let t = u128::from(g.emission_interval_ns());
            let span_ns = u128::from(to - from) * 1_000;
            assert_eq!(allowed, (u128::from(g.tolerance_ns()) + span_ns) / t, "{v}");
            assert!(admitted * t > u128::from(g.tolerance_ns()) + span_ns, "{v}");
        }
        GlobalLimit::Slot(Limit::TokenBucket(b)) => {
            let instants = u128::from((to - from).div_ceil(b.period_us()));
            let bound = u128::from(b.capacity()) + u128::from(b.refill()) * instants;
            assert_eq!(allowed, bound, "{v}");
        }
        GlobalLimit::Slot(Limit::FixedWindow(w)) => {
            let k = to / w.window_us();
            assert_eq!(from / w.window_us(), k, "one window: {v}");
            assert!(first == 0 || s[first - 1].at_us / w.window_us() < k, "{v}");
            assert_eq!(allowed, u128::from(w.limit()), "{v}");
        }
        GlobalLimit::SlidingLog(l) => {
            let leaves = |a: &Admission| u128::from(a.at_us) + u128::from(l.window_us());
            assert!(leaves(&s[first]) > u128::from(to), "one log window: {v}");
            assert!(first == 0 || leaves(&s[first - 1]) <= u128::from(to), "{v}");
            assert_eq!(allowed, u128::from(l.limit()), "{v}");
        }
        GlobalLimit::Slot(Limit::SlidingWindow(w)) => {
            let width = w.window_us();
            // Window numbers in u128: with 1 µs windows, u64::MAX + 1 is a window too.
            let window = |a: &Admission| u128::from(a.at_us / width);
            let k = window(&s[last]);
            // All of window k − 1 (if it has admissions), then window k up to `last`.
            assert!(s[first..=last].iter().all(|a| window(a) + 1 >= k), "{v}");
            assert!(
                first == 0 || window(&s[first - 1]) < window(&s[first]),
                "{v}"
            );
            assert!(window(&s[first]) + 1 == k || first == 0 || window(&s[first - 1]) + 2 <= k);
            let prev = sum(&s[first..=last]
                .iter()
                .filter(|a| window(a) + 1 == k)
                .copied()
                .collect::<Vec<_>>());
            let cur = admitted - prev;
            let (w128, e) = (u128::from(width), u128::from(to % width));
            assert!(
                prev * (w128 - e) + cur * w128 > u128::from(w.limit()) * w128,
                "{v}"
            );
            assert_eq!(allowed, u128::from(w.limit()) + prev * e / w128, "{v}");
        }
    }
}

/// Checks, expecting a violation over `first..=last` with `admitted` and `allowed`.
fn expect_violation(
    limit: &GlobalLimit,
    admissions: &[Admission],
    (first, last): (usize, usize),
    admitted: u64,
    allowed: &str,
) -> Violation {
    let v = check(limit, admissions).unwrap_err();
    assert_eq!(
        (v.first, v.last, v.admitted, v.allowed.as_str()),
        (first, last, admitted, allowed),
        "{v}"
    );
    assert_real(limit, admissions, &v);
    v
}

/// A single central limiter: the core's algorithm with one state for the key (an event
/// list for the sliding log). A `skew` makes it a mutant that decides with a clock
/// `skew` µs off the one the admissions (and the log's events) are recorded with.
struct Central {
    limit: GlobalLimit,
    state: Option<SlotState>,
    events: Vec<u64>,
    skew: i64,
    admitted: Vec<Admission>,
}

impl Central {
    fn new(limit: &GlobalLimit) -> Self {
        Self::skewed(limit, 0)
    }

    fn skewed(limit: &GlobalLimit, skew: i64) -> Self {
        Central {
            limit: limit.clone(),
            state: None,
            events: Vec::new(),
            skew,
            admitted: Vec::new(),
        }
    }

    /// Grants `cost` to `want` units at `now`, as many as fit; `None` when denied.
    /// Granted units are not recorded: [`Central::request`] spends them at once, a test
    /// that leases spends them when it says.
    fn grant(&mut self, now: u64, cost: u64, want: u64) -> Option<u64> {
        let decided_at = now.checked_add_signed(self.skew).unwrap();
        match &self.limit {
            GlobalLimit::Slot(limit) => {
                let (decision, granted, next) = if want == cost {
                    let (d, next) = limit.decide(self.state, decided_at, cost);
                    (d, cost, next)
                } else {
                    limit.acquire(self.state, decided_at, cost, want)
                };
                if next.is_some() {
                    self.state = next;
                }
                decision.allowed.then_some(granted)
            }
            GlobalLimit::SlidingLog(log) => {
                let (decision, granted) = log.acquire(&self.events, decided_at, cost, want);
                self.events
                    .extend(std::iter::repeat_n(now, usize::try_from(granted).unwrap()));
                decision.allowed.then_some(granted)
            }
        }
    }

    /// A request decided and spent at `now`, taking up to `want` units.
    fn request(&mut self, now: u64, cost: u64, want: u64) -> bool {
        match self.grant(now, cost, want) {
            Some(granted) => {
                self.admitted.push(at(now, granted));
                true
            }
            None => false,
        }
    }

    /// Requests of cost 1 at `now` until one is denied: what a burst gets.
    fn burst(&mut self, now: u64) -> u64 {
        let mut n = 0;
        while self.request(now, 1, 1) {
            n += 1;
            assert!(n <= 1_000, "a burst that never ends");
        }
        n
    }

    /// The instant from which the key's state says nothing any more.
    fn idle_at(&self) -> u64 {
        match (&self.limit, self.state) {
            (GlobalLimit::Slot(limit), Some(state)) => limit.idle_at_us(state),
            (GlobalLimit::SlidingLog(log), _) => {
                self.events.last().map_or(0, |&t| t + log.window_us())
            }
            (_, None) => 0,
        }
    }
}

// ---------------------------------------------------------------------------------
// Tables: a schedule exactly at the bound passes; one unit more fails, where expected.
// ---------------------------------------------------------------------------------

#[test]
fn nothing_and_zero_costs_conform() {
    // Stretches start where the excess is largest, the latest such start, so past a
    // leading zero; windows report the whole window.
    for (limit, first) in [
        (gcra(0, 1, S_US), 1),
        (token_bucket(1, 1, S_US), 1),
        (fixed_window(1, S_US), 0),
        (sliding_window(1, S_US), 0),
        (sliding_log(1, S_US), 0),
    ] {
        assert_eq!(check(&limit, &[]), Ok(()));
        assert_eq!(check(&limit, &[at(T0, 0); 100]), Ok(()));
        assert_eq!(check(&limit, &[at(T0, 0), at(T0, 1), at(T0, 0)]), Ok(()));
        let v = expect_violation(
            &limit,
            &[at(T0, 0), at(T0, 1), at(T0, 1)],
            (first, 2),
            2,
            "1",
        );
        assert!(
            v.message.contains(&format!("admissions {first}..=2 (of 3")),
            "{v}"
        );
    }
}

#[test]
fn gcra_table() {
    // Burst 2 at 1 per second: T = 1 s, τ = 3 s. Three at once, then one a second.
    let limit = gcra(2, 1, S_US);
    let mut schedule = vec![at(T0, 3), at(T0 + S_US, 1), at(T0 + 2 * S_US, 1)];
    assert_eq!(check(&limit, &schedule), Ok(()));
    // One more at 2 s: 6 units in 2 s where ⌊(3 s + 2 s) / 1 s⌋ = 5 fit.
    schedule.push(at(T0 + 2 * S_US, 1));
    let v = expect_violation(&limit, &schedule, (0, 3), 6, "5");
    assert_eq!(
        v.message,
        "gcra (rate 1, period 1000000us, burst 2): admissions 0..=3 (of 4, sorted by time), \
         decided from 1700000000000000us to 1700000002000000us (2000000us), add up to 6 \
         units where the bound allows 5: 6 × T (1000000000ns) is more than τ \
         (3000000000ns) + 2000000000ns"
    );
    // The same admissions in any order: indices are into the sorted list.
    let mut shuffled = schedule.clone();
    shuffled.reverse();
    assert_eq!(check(&limit, &shuffled), Err(v));

    // Exactly at the rate, every stretch ties: the shortest is reported.
    let drip = gcra(0, 1, S_US);
    let mut schedule = vec![at(T0, 1), at(T0 + S_US, 1), at(T0 + 2 * S_US, 1)];
    assert_eq!(check(&drip, &schedule), Ok(()));
    schedule.push(at(T0 + 2 * S_US, 1));
    expect_violation(&drip, &schedule, (2, 3), 2, "1");

    // T is not a whole µs (3 per second: T = 333_333_333 ns, τ = 999_999_999 ns). The
    // bound is in ns, like the central TAT: a fourth unit 333_334 µs after a burst of 3
    // fits with 667 ns to spare; 1 µs earlier it does not.
    let limit = gcra(2, 3, S_US);
    assert_eq!(check(&limit, &[at(T0, 3), at(T0 + 333_334, 1)]), Ok(()));
    expect_violation(&limit, &[at(T0, 3), at(T0 + 333_333, 1)], (0, 1), 4, "3");
}

#[test]
fn gcra_spent_away_from_where_counted_breaks_the_bound() {
    // CONFORMANCE.md's displacement: burst 0, one per T; units counted at 0 and T but
    // spent at T/2 and T are two admissions in half a period.
    let limit = gcra(0, 1, S_US);
    let mut central = Central::new(&limit);
    assert_eq!(central.grant(T0, 1, 1), Some(1));
    assert_eq!(central.grant(T0 + S_US, 1, 1), Some(1));
    let spent = [at(T0 + S_US / 2, 1), at(T0 + S_US, 1)];
    expect_violation(&limit, &spent, (0, 1), 2, "1");
}

#[test]
fn token_bucket_table() {
    // Capacity 3, 2 more every ms. The phase of the refills is unknown, so any ms may
    // hold one: 3 at 999 µs and 2 at 1000 µs are C + R within 1 µs, and allowed.
    let limit = token_bucket(3, 2, 1_000);
    let mut schedule = vec![
        at(T0 + 999, 3),
        at(T0 + 1_000, 2),
        at(T0 + 2_000, 2),
        at(T0 + 2_999, 0),
        at(T0 + 3_000, 2),
    ];
    // 0..=4: 9 in 2001 µs, 3 refill instants; 1..=4: 6 in 2000 µs, 2; 2..=4: 4 in 1 ms, 1.
    assert_eq!(check(&limit, &schedule), Ok(()));
    schedule.push(at(T0 + 3_000, 1));
    let v = expect_violation(&limit, &schedule, (0, 5), 10, "9");
    assert!(
        v.message.ends_with(
            "capacity 3 + 2 × 3 refill instant(s), the most that any phase of refills every \
             1000us puts in (1700000000000999us, 1700000000003000us]"
        ),
        "{v}"
    );

    // A central bucket does exactly that: drained at T0 + 1 (the phase: refills at
    // T0 + 1 + k ms), full again at T0 + 2001, then C just before the next refill and R
    // just after it. The continuous bound would allow 3 + 2 × 1/1000 in that µs.
    let mut central = Central::new(&limit);
    assert!(central.request(T0 + 1, 3, 3));
    assert_eq!(central.burst(T0 + 3_000), 3);
    assert_eq!(central.burst(T0 + 3_001), 2);
    assert_eq!(check(&limit, &central.admitted), Ok(()));
    let mut over = central.admitted.clone();
    over.push(at(T0 + 3_001, 1));
    expect_violation(&limit, &over, (1, 6), 6, "5");
}

#[test]
fn fixed_window_table() {
    let limit = fixed_window(3, S_US);
    let mut schedule = vec![at(T0 - 1, 3), at(T0, 0), at(T0, 1), at(T0 + S_US - 1, 2)];
    assert_eq!(check(&limit, &schedule), Ok(()));
    schedule.push(at(T0 + 5, 1));
    // Sorted: T0 − 1, T0, T0, T0 + 5, T0 + 1 s − 1: the window's admissions 1..=4.
    let v = expect_violation(&limit, &schedule, (1, 4), 4, "3");
    assert!(
        v.message.ends_with(
            "they are all in the window [1700000000000000us, 1700000001000000us), which \
             holds at most 3"
        ),
        "{v}"
    );
}

#[test]
fn sliding_log_table() {
    // 3 per ms. An event at t counts while now − 1 ms < t: at T0 + 1 ms, T0's has left.
    let limit = sliding_log(3, 1_000);
    let mut schedule = vec![at(T0, 1), at(T0 + 500, 2), at(T0 + 1_000, 1)];
    assert_eq!(check(&limit, &schedule), Ok(()));
    schedule.push(at(T0 + 1_000, 1));
    let v = expect_violation(&limit, &schedule, (1, 3), 4, "3");
    assert!(
        v.message.ends_with(
            "they are all in the log's window (1700000000000000us, 1700000000001000us], \
             which holds at most 3"
        ),
        "{v}"
    );
    // 1 µs earlier, T0's event still counts.
    let early = [at(T0, 1), at(T0 + 500, 2), at(T0 + 999, 1)];
    expect_violation(&limit, &early, (0, 2), 4, "3");
}

#[test]
fn sliding_window_table() {
    // 10 per minute; docs' example: 10 in the last second of a minute, then 15 s into
    // the next one they weigh 10 × 45/60 = 7.5, so 2 more fit and a third does not.
    let limit = sliding_window(10, 60 * S_US);
    let minute = 1_700_000_040_000_000;
    let mut schedule = vec![at(minute - S_US, 10), at(minute + 15 * S_US, 2)];
    assert_eq!(check(&limit, &schedule), Ok(()));
    schedule.push(at(minute + 15 * S_US, 1));
    // 13 where 10 + ⌊10 × 15/60⌋ = 12 are allowed.
    let v = expect_violation(&limit, &schedule, (0, 2), 13, "12");
    assert!(
        v.message.ends_with(
            "at 1700000055000000us, 15000000us into its window, the previous window's 10 \
             units (admissions 0..=0) weigh (60000000 − 15000000)/60000000 and this \
             window's 3 units (admissions 1..=2) count in full: 10 × 45000000 + 3 × \
             60000000 is more than 10 × 60000000"
        ),
        "{v}"
    );
    // With nothing in the previous window, the current one's first admission starts it.
    let alone = [at(minute - 61 * S_US, 10), at(minute, 6), at(minute + 1, 5)];
    expect_violation(&limit, &alone, (1, 2), 11, "10");
}

#[test]
fn huge_costs_and_times_neither_overflow_nor_panic() {
    let max = u64::MAX;
    let huge = [at(max, max), at(max, max), at(0, max), at(max - 1, 1)];
    let limits = [
        gcra(0, 1, 1),
        gcra(0, 1, 1 << 40),
        token_bucket(max, max, 1),
        token_bucket(max, max, max),
        token_bucket(1, max, 1),
        fixed_window(max, max),
        fixed_window(1, 1),
        sliding_window(u64::from(u32::MAX), max),
        sliding_window(1, 1),
        sliding_log(100_000, max),
        sliding_log(1, 1),
    ];
    for limit in &limits {
        let v = check(limit, &huge).unwrap_err();
        assert_real(limit, &huge, &v);
        // The sum of two u64::MAX costs saturates `admitted`, not the message.
        let two = [at(max, max), at(max, max)];
        if let Err(v) = check(limit, &two) {
            assert_real(limit, &two, &v);
        }
    }
    // A capacity of u64::MAX and refills of u64::MAX every µs: 2 × u64::MAX over 1 µs fit.
    let bucket = token_bucket(max, max, 1);
    assert_eq!(check(&bucket, &[at(max - 1, max), at(max, max)]), Ok(()));
    let v = check(&bucket, &[at(max, max), at(max, max)]).unwrap_err();
    assert_eq!(
        (v.admitted, v.allowed.as_str()),
        (max, "18446744073709551615")
    );
    assert!(
        v.message.contains("add up to 36893488147419103230 units"),
        "{v}"
    );
}

// ---------------------------------------------------------------------------------
// Worked mutants (tables): each breaks the bound where its schedule puts it.
// ---------------------------------------------------------------------------------

#[test]
fn a_burst_one_too_large_breaks_every_bound() {
    let cases = [
        (gcra(4, 1, S_US), gcra(5, 1, S_US), 6),
        (token_bucket(5, 1, S_US), token_bucket(6, 1, S_US), 6),
        (fixed_window(5, S_US), fixed_window(6, S_US), 6),
        (sliding_window(5, S_US), sliding_window(6, S_US), 6),
        (sliding_log(5, S_US), sliding_log(6, S_US), 6),
    ];
    for (limit, mutant, n) in cases {
        let mut central = Central::new(&mutant);
        assert_eq!(central.burst(T0 + 7), n);
        expect_violation(
            &limit,
            &central.admitted,
            (0, n as usize - 1),
            n,
            &(n - 1).to_string(),
        );
    }
}

#[test]
fn a_refill_counted_twice_breaks_the_token_bucket() {
    let limit = token_bucket(5, 2, 1_000);
    let mut mutant = Central::new(&token_bucket(5, 4, 1_000));
    assert_eq!(mutant.burst(T0), 5);
    assert_eq!(mutant.burst(T0 + 1_000), 4);
    // The eighth unit: 8 in 1 ms where 5 + 2 × 1 fit.
    expect_violation(&limit, &mutant.admitted, (0, 7), 8, "7");
}

#[test]
fn a_window_boundary_off_by_one_breaks_the_windows() {
    let window = 1_000;
    let boundary = T0 + window;
    // Windows (kW, (k+1)W]: the mutant counts an admission at (k+1)W in window k.
    let limit = fixed_window(3, window);
    let mut mutant = Central::skewed(&limit, -1);
    assert_eq!(mutant.burst(boundary), 3);
    assert_eq!(mutant.burst(boundary + 1), 3);
    expect_violation(&limit, &mutant.admitted, (0, 3), 4, "3");

    // The log trims one µs early: T0's events leave at T0 + W − 1.
    let limit = sliding_log(3, window);
    let mut mutant = Central::skewed(&limit, 1);
    assert_eq!(mutant.burst(T0), 3);
    assert_eq!(mutant.burst(T0 + window - 1), 3);
    expect_violation(&limit, &mutant.admitted, (0, 3), 4, "3");

    // The counter's windows start 1 µs late: a burst at (k+1)W lands in the mutant's
    // window k, and its weight lets one more in at half a window.
    let limit = sliding_window(4, window);
    let mut mutant = Central::skewed(&limit, -1);
    assert_eq!(mutant.burst(boundary), 4);
    assert_eq!(mutant.burst(boundary + window / 2 + 1), 2);
    expect_violation(&limit, &mutant.admitted, (0, 4), 5, "4");
}

#[test]
fn units_spent_after_their_lease_should_have_expired_break_the_bound() {
    // GCRA, burst 4 at 1 per second: the whole burst leased at T0, the bucket full again
    // at T0 + 5 s, then the saved 5 spent with a fresh 5.
    let limit = gcra(4, 1, S_US);
    let mut central = Central::new(&limit);
    assert_eq!(central.grant(T0, 1, 5), Some(5));
    let full = central.idle_at();
    assert_eq!(full, T0 + 5 * S_US);
    assert_eq!(central.grant(full, 1, 5), Some(5));
    expect_violation(&limit, &[at(full, 5), at(full, 5)], (0, 1), 10, "5");

    // The log: 3 granted at T0 and spent at the end of the next window, T0 + 2W − 1,
    // beside 3 granted at T0 + W.
    let window = 1_000;
    let limit = sliding_log(3, window);
    let mut central = Central::new(&limit);
    assert_eq!(central.grant(T0, 1, 3), Some(3));
    assert_eq!(central.grant(T0 + window - 1, 1, 3), None);
    assert_eq!(central.grant(T0 + window, 1, 3), Some(3));
    let spent = [at(T0 + window, 3), at(T0 + 2 * window - 1, 3)];
    expect_violation(&limit, &spent, (0, 1), 6, "3");
}

#[test]
fn two_hundred_thousand_admissions_check_in_n_log_n() {
    // Not timed: a quadratic checker would take minutes here, this takes milliseconds
    // (in release). Every algorithm, from a central limiter, so the whole list is read.
    let n = 200_000;
    // About the demand (1000 units a second), so that most requests are admitted.
    let limits = [
        gcra(49, 500, S_US),
        token_bucket(100, 7, 9_997),
        fixed_window(1_000, S_US),
        sliding_window(1_000, S_US),
        sliding_log(1_000, S_US),
    ];
    for limit in &limits {
        let mut central = Central::new(limit);
        let mut now = T0;
        let mut i: u64 = 0;
        while central.admitted.len() < n {
            // Steps of 1 to 4_000 µs, so remainders and windows vary.
            i += 1;
            now += 1 + (i * 7_919) % 4_000;
            central.request(now, 1 + i % 3, 1 + i % 3);
        }
        assert_eq!(check(limit, &central.admitted), Ok(()), "{limit:?}");
        // One unit too many at the end is found after all of them.
        let last = central.admitted.last().copied().unwrap();
        let mut over = central.admitted.clone();
        over.push(at(last.at_us, limit.max_cost()));
        let v = check(limit, &over).unwrap_err();
        assert_eq!(v.last, n, "{v}");
    }
}

/// Properties over random limits and schedules (natively: proptest does not run under
/// wasm32).
#[cfg(not(target_arch = "wasm32"))]
mod properties {
    use super::*;
    use proptest::prelude::*;

    /// A duration for small parameters: a few µs (so that instants collide with
    /// boundaries), ms, or a second.
    fn period() -> impl Strategy<Value = u64> {
        prop_oneof![2u64..=50, 1_000u64..=2_000_000, Just(S_US)]
    }

    /// A limit of any algorithm with small parameters, and its natural time scale (µs):
    /// how long an emptied key takes to be fresh again.
    fn limits() -> impl Strategy<Value = (GlobalLimit, u64)> {
        prop_oneof![
            (0u64..=6, 1u64..=9, period()).prop_filter_map("valid gcra", |(b, r, p)| {
                let g = Gcra::new(b, r, p).ok()?;
                let scale = g.tolerance_ns().div_ceil(1_000);
                Some((GlobalLimit::Slot(Limit::Gcra(g)), scale))
            }),
            (1u64..=8, 1u64..=10, period())
                .prop_map(|(c, r, p)| (token_bucket(c, r, p), p * c.div_ceil(r))),
            (1u64..=8, period()).prop_map(|(n, w)| (fixed_window(n, w), w)),
            (1u64..=8, period()).prop_map(|(n, w)| (sliding_window(n, w), w)),
            (1u64..=8, period()).prop_map(|(n, w)| (sliding_log(n, w), w)),
        ]
    }

    /// The gap before a step: the same instant, 1 µs, a fraction of the scale, or an idle
    /// stretch longer than it.
    fn gap(scale: u64, kind: u8, frac: u64) -> u64 {
        match kind {
            0 => 0,
            1 => 1,
            2 => scale * frac / 64 + frac % 3,
            _ => scale + scale * frac / 16 + frac % 5,
        }
    }

    /// Steps: a gap, then a burst of requests at one instant, each a cost and the extra
    /// units it would like (a lease when above 0).
    type Step = (u8, u64, Vec<(u64, u64)>);

    fn schedule() -> impl Strategy<Value = (u64, Vec<Step>)> {
        let cost = prop_oneof![8 => 1u64..=3, 1 => Just(0u64), 1 => 4u64..=9];
        let extra = prop_oneof![4 => Just(0u64), 1 => 1u64..=4];
        let step = (
            0u8..4,
            0u64..=64,
            prop::collection::vec((cost, extra), 1..8),
        );
        (0u64..1_000 * S_US, prop::collection::vec(step, 1..40))
    }

    /// Runs `steps` through `central` from `T0 + start`.
    fn run(central: &mut Central, scale: u64, start: u64, steps: &[Step]) {
        let mut now = T0 + start;
        for (kind, frac, requests) in steps {
            now += gap(scale, *kind, *frac);
            for &(cost, extra) in requests {
                central.request(now, cost, cost + extra);
            }
        }
    }

    /// Random admissions with small costs at instants that collide: for the brute force.
    fn admissions() -> impl Strategy<Value = (u64, Vec<(u8, u64, u64)>)> {
        let cost = prop_oneof![6 => 0u64..=3, 1 => 4u64..=12];
        (
            0u64..1_000 * S_US,
            prop::collection::vec((0u8..4, 0u64..=64, cost), 0..40),
        )
    }

    fn expect_violation_real(limit: &GlobalLimit, admitted: &[Admission]) -> Violation {
        match check(limit, admitted) {
            Ok(()) => panic!("a mutant passed {limit:?}: {admitted:?}"),
            Err(v) => {
                assert_real(limit, admitted, &v);
                v
            }
        }
    }

    /// The most units a fresh key gets at once.
    fn full(limit: &GlobalLimit) -> u64 {
        limit.max_cost()
    }

    /// The same algorithm with one unit more of burst, capacity or limit.
    fn plus_one(limit: &GlobalLimit) -> GlobalLimit {
        let mut values = limit.algorithm().parameters();
        let at = if limit.kind() == AlgorithmKind::Gcra {
            2
        } else {
            0
        };
        values[at] += 1;
        GlobalLimit::build(limit.kind(), &values).unwrap()
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 4096, ..ProptestConfig::default() })]

        /// Thousands of schedules, every algorithm: what one central limiter admits
        /// (requests and leases alike, spent where granted) keeps the bound.
        #[test]
        fn a_single_central_limiter_never_violates(
            (limit, scale) in limits(),
            (start, steps) in schedule(),
        ) {
            let mut central = Central::new(&limit);
            run(&mut central, scale, start, &steps);
            if let Err(v) = check(&limit, &central.admitted) {
                panic!("central {limit:?} violates: {v}\n{:?}", central.admitted);
            }
        }

        /// On any admissions: Ok exactly when no prefix breaks the bound; otherwise the
        /// violation ends at the first admission that does, and (stretches) starts
        /// where the excess is largest, the latest such start.
        #[test]
        fn the_checker_agrees_with_the_definitions(
            (limit, scale) in limits(),
            (start, steps) in admissions(),
        ) {
            let mut now = T0 + start;
            let mut list = Vec::new();
            for (kind, frac, cost) in steps {
                now += gap(scale, kind, frac);
                list.push(at(now, cost));
            }
            // Unsorted input, sorted indices: reversed, so equal instants swap too.
            list.reverse();
            let s = sorted(&list);
            let expected = (0..s.len()).find(|&j| breaks_at(&limit, &s, j));
            match (check(&limit, &list), expected) {
                (Ok(()), None) => {}
                (Err(v), Some(j)) => {
                    prop_assert_eq!(v.last, j, "{}", v);
                    assert_real(&limit, &list, &v);
                    if matches!(limit, GlobalLimit::Slot(Limit::Gcra(_) | Limit::TokenBucket(_))) {
                        let excess = |i| stretch_excess(&limit, &s, i, j);
                        let best = (0..=j).map(excess).max().unwrap();
                        let latest = (0..=j).rev().find(|&i| excess(i) == best).unwrap();
                        prop_assert_eq!(v.first, latest, "{}", v);
                    }
                }
                (got, want) => panic!("checker {got:?}, definitions {want:?} for {s:?}"),
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 1024, ..ProptestConfig::default() })]

        /// One unit more of burst, capacity or limit, hit with a burst at one instant
        /// (after a random history and an idle stretch that empties the key).
        #[test]
        fn a_burst_one_too_large_always_violates(
            (limit, scale) in limits(),
            (start, steps) in schedule(),
            history in any::<bool>(),
        ) {
            let mutant = plus_one(&limit);
            let mut central = Central::new(&mutant);
            let mut now = T0 + start;
            if history {
                run(&mut central, scale, start, &steps);
                now = central.admitted.last().map_or(now, |a| a.at_us);
                now = now.max(central.idle_at()) + 2 * scale + 1;
            }
            prop_assert_eq!(central.burst(now), full(&limit) + 1);
            let v = expect_violation_real(&limit, &central.admitted);
            prop_assert!(v.last < central.admitted.len());
        }

        /// Units granted at once, not spent, and spent after the key is fresh again
        /// beside a fresh grant: GCRA and the token bucket idle until full, the windows
        /// spend a window's units in the next (the counter: two windows on), the log at
        /// the end of the next window.
        #[test]
        fn units_spent_after_their_lease_always_violate(
            (limit, scale) in limits(),
            start in 0u64..1_000 * S_US,
            extra in 0u64..=64,
            late in 0u64..=64,
        ) {
            let mut central = Central::new(&limit);
            let t0 = T0 + start;
            let n = full(&limit);
            prop_assert_eq!(central.grant(t0, 1, n), Some(n));
            let (fresh_at, saved_at) = match &limit {
                GlobalLimit::Slot(Limit::Gcra(g)) => {
                    // The saved units within τ of the fresh ones.
                    let t1 = central.idle_at() + scale * extra / 64;
                    let room = g.tolerance_ns().div_ceil(1_000) - 1;
                    (t1, t1 + room * late / 64)
                }
                GlobalLimit::Slot(Limit::TokenBucket(b)) => {
                    // Fewer refill instants between them than it takes R to make up C.
                    let t1 = central.idle_at() + scale * extra / 64;
                    let room = b.period_us() * ((b.capacity() - 1) / b.refill());
                    (t1, t1 + room * late / 64)
                }
                GlobalLimit::Slot(Limit::FixedWindow(w)) => {
                    let next = (t0 / w.window_us() + 1) * w.window_us();
                    let t1 = next + (w.window_us() - 1) * extra / 64;
                    (t1, t1 + (next + w.window_us() - 1 - t1) * late / 64)
                }
                GlobalLimit::Slot(Limit::SlidingWindow(w)) => {
                    let next = (t0 / w.window_us() + 2) * w.window_us();
                    let t1 = next + (w.window_us() - 1) * extra / 64;
                    (t1, t1 + (next + w.window_us() - 1 - t1) * late / 64)
                }
                GlobalLimit::SlidingLog(l) => {
                    let t1 = t0 + l.window_us() + (l.window_us() - 1) * extra / 64;
                    (t1, t0 + 2 * l.window_us() - 1)
                }
            };
            prop_assert_eq!(central.grant(fresh_at, 1, n), Some(n));
            let spent = [at(fresh_at, n), at(saved_at, n)];
            let v = expect_violation_real(&limit, &spent);
            prop_assert_eq!((v.first, v.last), (0, 1));
        }

        /// A token bucket that refills 2R (R < C): drained, then emptied again at each of
        /// its next refills.
        #[test]
        fn a_refill_counted_twice_always_violates(
            capacity in 2u64..=10,
            refill_at in 0u64..=100,
            period in period(),
            start in 0u64..1_000 * S_US,
            refills in 1u64..=4,
        ) {
            let refill = 1 + (capacity - 2) * refill_at / 100; // 1..C−1
            let limit = token_bucket(capacity, refill, period);
            let mut mutant = Central::new(&token_bucket(capacity, 2 * refill, period));
            let t0 = T0 + start;
            prop_assert_eq!(mutant.burst(t0), capacity);
            for m in 1..=refills {
                prop_assert_eq!(mutant.burst(t0 + m * period), (2 * refill).min(capacity));
            }
            expect_violation_real(&limit, &mutant.admitted);
        }

        /// Windows 1 µs off, either way, with the limit on each side of the mutant's
        /// boundary: a fixed window (both shifts), a counter whose windows start late,
        /// a log that trims 1 µs early.
        #[test]
        fn a_window_boundary_off_by_one_always_violates(
            limit_units in 1u64..=8,
            window in 2u64..=3_000,
            k in 0u64..1_000_000,
            kind in 0u8..4,
        ) {
            let boundary = (T0 / window + k) * window;
            let (limit, skew, times): (GlobalLimit, i64, Vec<u64>) = match kind {
                // Counts (k+1)W in window k.
                0 => (fixed_window(limit_units, window), -1, vec![boundary, boundary + 1]),
                // Starts window k+1 at (k+1)W − 1.
                1 => (fixed_window(limit_units, window), 1, vec![boundary - 2, boundary - 1]),
                // The counter 1 µs late: a burst at (k+1)W, then at every µs after.
                2 => (
                    sliding_window(limit_units, window),
                    -1,
                    (boundary..boundary + 2 * window + 2).collect(),
                ),
                // The log trims events at now − W + 1.
                _ => (sliding_log(limit_units, window), 1, vec![boundary, boundary + window - 1]),
            };
            let mut mutant = Central::skewed(&limit, skew);
            for t in times {
                mutant.burst(t);
            }
            expect_violation_real(&limit, &mutant.admitted);
        }
    }
}
