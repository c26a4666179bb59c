//! The conformance checker's properties (natively: proptest does not run under
//! wasm32): a single central limiter never violates its bound, deliberate mutants always
//! do, and the checker agrees with a brute-force reading of the bounds. The tables and
//! worked mutants are in `conformance.rs`.
#![cfg(not(target_arch = "wasm32"))]
// Test code: a failed expectation is meant to panic, helpers included.

use crate::support::conformance as checked;

use checked::*;
use weir_core::algorithms::{AlgorithmKind, GlobalLimit};
use weir_core::conformance::{check, Admission, Violation};
use weir_testkit::oracles::oracle;
use weir_testkit::scenarios::{S_US, T0};

/// Properties over random limits and schedules (natively: proptest does not run under
/// wasm32).
#[cfg(not(target_arch = "wasm32"))]
mod properties {
    use super::*;
    use proptest::prelude::*;

    /// Every algorithm is drawn: small counts and durations build a limit of each kind
    /// through its spec (a new algorithm whose parameters these cannot build fails here,
    /// not silently in the draws).
    #[test]
    fn every_algorithm_can_be_drawn() {
        for kind in AlgorithmKind::ALL {
            let drawn = drawn_limit(kind, &[3, 3, 3], &[1_000, 1_000, 1_000]);
            let (limit, scale) = drawn.unwrap_or_else(|| panic!("{kind}: not drawn"));
            assert_eq!(limit.kind(), kind);
            assert!(scale >= 1, "{kind}: scale {scale}");
        }
    }

    /// A duration for small parameters: a few µs (so that instants collide with
    /// boundaries), ms, or a second.
    fn period() -> impl Strategy<Value = u64> {
        prop_oneof![2u64..=50, 1_000u64..=2_000_000, Just(S_US)]
    }

    /// A limit of any algorithm with small parameters (counts up to 9, as an algorithm
    /// accepts them), and its natural time scale (µs): how long an emptied key takes to be
    /// fresh again.
    fn limits() -> impl Strategy<Value = (GlobalLimit, u64)> {
        (
            prop::sample::select(AlgorithmKind::ALL.to_vec()),
            prop::array::uniform3(0u64..=9),
            prop::array::uniform3(period()),
        )
            .prop_filter_map(
                "parameters the algorithm accepts",
                |(kind, counts, periods)| drawn_limit(kind, &counts, &periods),
            )
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

    /// The same algorithm with one unit more of burst, capacity or limit: its spec's
    /// `limit_parameter` grown by one.
    fn plus_one(limit: &GlobalLimit) -> GlobalLimit {
        let spec = limit.kind().spec();
        let mut values = limit.algorithm().parameters();
        let at = spec
            .parameters
            .iter()
            .position(|p| p.name == spec.limit_parameter.name)
            .unwrap();
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
                    let excess = |i| oracle(&limit).stretch_excess(&s, i, j);
                    if excess(j).is_some() {
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
            let (fresh_at, saved_at) =
                oracle(&limit).spent_after_lease(t0, central.idle_at(), scale, extra, late);
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
