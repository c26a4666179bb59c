//! The algorithms' properties over random parameters, histories and states (natively:
//! proptest does not run under wasm32). The scenario tables are in `algorithms.rs`.
#![cfg(not(target_arch = "wasm32"))]
// Test code: a failed expectation is meant to panic, helpers included.

use crate::support::conformance::drawn_limit;
use weir_core::algorithms::{
    fixed_window, gcra,
    sliding_window::{self, SlidingWindow},
    token_bucket, AlgorithmKind, GlobalLimit, Limit, SlotState,
};
use weir_core::conformance::Admission;
use weir_testkit::oracles::oracle;
use weir_testkit::scenarios::{MS_US, S_US, T0};

/// Properties over random parameters, histories and states.
#[cfg(not(target_arch = "wasm32"))]
mod properties {
    use super::*;
    use proptest::prelude::*;

    /// A limit of any slot algorithm with parameters small enough that random histories
    /// hit its edges (counts up to 12, as an algorithm accepts them), and its natural time
    /// scale in µs.
    fn limits() -> impl Strategy<Value = (Limit, u64)> {
        let period = prop_oneof![1u64..=50, 1_000u64..=2_000_000, Just(S_US), Just(60 * S_US)];
        let slot_kinds: Vec<AlgorithmKind> = AlgorithmKind::ALL
            .into_iter()
            .filter(|kind| kind.spec().global_only.is_none())
            .collect();
        (
            prop::sample::select(slot_kinds),
            prop::array::uniform3(0u64..=12),
            prop::array::uniform3(period),
        )
            .prop_filter_map(
                "parameters the algorithm accepts",
                |(kind, counts, periods)| {
                    let (limit, scale) = drawn_limit(kind, &counts, &periods)?;
                    Some((limit.as_slot()?.clone(), scale))
                },
            )
    }

    /// Steps as (time since the previous step as a fraction of the scale in 1/64ths,
    /// cost); the start is a random instant.
    fn history() -> impl Strategy<Value = (u64, Vec<(u64, u64)>)> {
        let frac = prop_oneof![3 => 0u64..=8, 1 => 0u64..=96];
        let cost = prop_oneof![4 => 1u64..=3, 1 => 0u64..=12];
        (
            0u64..1_000 * S_US,
            prop::collection::vec((frac, cost), 0..48),
        )
    }

    fn dt(scale: u64, sixty_fourths: u64) -> u64 {
        // Mostly small steps, so that requests collide; a few long ones.
        scale * sixty_fourths / 64 + sixty_fourths % 3
    }

    fn ceil_us(ns: u64) -> u64 {
        ns.div_ceil(1_000)
    }

    /// Replays a history from a fresh key, checking what holds at every step, and
    /// returns the final state and time.
    fn replay(
        limit: &Limit,
        scale: u64,
        start: u64,
        steps: &[(u64, u64)],
    ) -> (Option<SlotState>, u64) {
        let t0 = T0 + start;
        let (mut now, mut state) = (t0, None);
        // What the key admitted, in time order (the walk's clock only moves on), judged
        // at every admission by the algorithm's oracle: its bound read from the definition.
        let mut admissions: Vec<Admission> = Vec::new();
        let whole = GlobalLimit::Slot(limit.clone());
        for &(frac, cost) in steps {
            now += dt(scale, frac);
            let (d, next) = limit.decide(state, now, cost);
            assert_eq!(d.limit, limit.max_cost());
            if !d.allowed || cost == 0 {
                assert_eq!(next, None, "a denial or a peek writes nothing");
            }
            assert!(d.remaining <= d.limit);
            if next.is_some() {
                state = next;
            }
            if d.allowed && cost > 0 {
                admissions.push(Admission { at_us: now, cost });
                let last = admissions.len() - 1;
                assert!(
                    !oracle(&whole).breaks_at(&admissions, last),
                    "{limit:?} admitted past its bound: {admissions:?}"
                );
            }
            // `remaining` is exact for all but GCRA (whose µs truncation is redis-cell's).
            if !matches!(limit, Limit::Gcra(_)) {
                if d.remaining > 0 {
                    assert!(
                        limit.decide(state, now, d.remaining).0.allowed,
                        "remaining {} fits",
                        d.remaining
                    );
                }
                assert!(
                    !limit.decide(state, now, d.remaining + 1).0.allowed,
                    "remaining {} is all",
                    d.remaining
                );
            }
        }
        (state, now)
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 1024, ..ProptestConfig::default() })]

        #[test]
        fn never_admits_more_than_the_bound(
            (limit, scale) in limits(),
            (start, steps) in history(),
        ) {
            replay(&limit, scale, start, &steps);
        }

        #[test]
        fn a_denied_request_is_allowed_exactly_at_retry_after(
            (limit, scale) in limits(),
            (start, steps) in history(),
            frac in prop_oneof![3 => 0u64..=4, 1 => 0u64..=96],
            cost in prop_oneof![3 => 1u64..=6, 1 => 0u64..=12],
        ) {
            let (state, now) = replay(&limit, scale, start, &steps);
            let now = now + dt(scale, frac);
            let (d, next) = limit.decide(state, now, cost);
            if !d.allowed {
                prop_assert_eq!(next, None);
                match d.retry_after_ns {
                    None => {
                        prop_assert!(cost > limit.max_cost(), "no retry for a cost that fits: {:?}", d)
                    }
                    Some(retry) => {
                        prop_assert!(cost <= limit.max_cost());
                        let at = now + ceil_us(retry);
                        let (then, _) = limit.decide(state, at, cost);
                        prop_assert!(then.allowed, "denied at now + retry_after");
                        if at > now {
                            let (before, _) = limit.decide(state, at - 1, cost);
                            prop_assert!(!before.allowed, "allowed 1us before retry_after");
                        }
                    }
                }
            }
        }

        #[test]
        fn from_idle_at_the_state_carries_no_information(
            (limit, scale) in limits(),
            (start, steps) in history(),
            after in 0u64..3,
            cost in 0u64..=12,
        ) {
            let (state, _) = replay(&limit, scale, start, &steps);
            if let Some(s) = state {
                let at = limit.idle_at_us(s) + after * scale;
                let (with, _) = limit.decide(Some(s), at, cost);
                let (fresh, _) = limit.decide(None, at, cost);
                if let Limit::TokenBucket(_) = limit {
                    // Full either way; only the phase of the next refill differs.
                    prop_assert_eq!(with.allowed, fresh.allowed);
                    prop_assert_eq!(with.remaining, fresh.remaining);
                } else {
                    prop_assert_eq!(with, fresh);
                }
            }
        }

        #[test]
        fn states_round_trip_through_slots(
            a in any::<u64>(),
            b in any::<u64>(),
            prev in any::<u32>(),
            curr in any::<u32>(),
        ) {
            let g = gcra::State { tat_ns: a, emission_interval_ns: b };
            prop_assert_eq!(gcra::State::from_slot(g.to_slot()), g);
            let t = token_bucket::State { tokens: a, last_refill_us: b };
            prop_assert_eq!(token_bucket::State::from_slot(t.to_slot()), t);
            let f = fixed_window::State { count: a, window_start_us: b };
            prop_assert_eq!(fixed_window::State::from_slot(f.to_slot()), f);
            let s = sliding_window::State { prev, curr, window_start_us: b };
            prop_assert_eq!(sliding_window::State::from_slot(s.to_slot()), s);
            let slot = SlotState { a, b };
            prop_assert_eq!(sliding_window::State::from_slot(slot).to_slot(), slot);
        }

        #[test]
        fn garbage_states_never_panic(
            (limit, _) in limits(),
            a in prop_oneof![any::<u64>(), Just(0), Just(u64::MAX), (T0 - S_US..T0 + S_US)],
            b in prop_oneof![any::<u64>(), Just(0), Just(u64::MAX), (T0 - S_US..T0 + S_US)],
            now in prop_oneof![any::<u64>(), Just(0), Just(u64::MAX), (T0 - S_US..T0 + S_US)],
            cost in prop_oneof![any::<u64>(), 0u64..=12, Just(u64::MAX)],
        ) {
            let slot = SlotState { a, b };
            let (d, next) = limit.decide(Some(slot), now, cost);
            prop_assert!(d.remaining <= d.limit);
            if !d.allowed || cost == 0 {
                prop_assert_eq!(next, None);
            }
            let _ = limit.idle_at_us(slot);
            let _ = limit.decide(None, now, cost);
        }

        #[test]
        fn extreme_parameters_never_panic(
            p in prop::array::uniform3(prop_oneof![
                any::<u64>(),
                Just(0),
                Just(1),
                Just(u64::MAX),
                0u64..=1_000_000,
            ]),
            a in any::<u64>(),
            b in any::<u64>(),
            now in prop_oneof![any::<u64>(), Just(0), Just(u64::MAX)],
            cost in prop_oneof![any::<u64>(), Just(0), Just(1), Just(u64::MAX)],
        ) {
            // Every slot algorithm, its parameters taken from `p` in its table's order.
            let limits = AlgorithmKind::ALL.into_iter().filter_map(|kind| {
                let values = p.get(..kind.spec().parameters.len())?;
                GlobalLimit::build(kind, values).ok()?.as_slot().cloned()
            });
            for limit in limits {
                let _ = limit.policy();
                let (d, next) = limit.decide(None, now, cost);
                if d.allowed && cost > 0 {
                    let s = next.unwrap();
                    let _ = limit.idle_at_us(s);
                    let _ = limit.decide(Some(s), now, cost);
                    let _ = limit.decide(Some(s), now.saturating_add(1), cost);
                    let _ = limit.decide(Some(s), now.saturating_sub(1), cost);
                }
                let _ = limit.decide(Some(SlotState { a, b }), now, cost);
                if let Limit::Gcra(g) = &limit {
                    let _ = g.throttle(Some(gcra::State::from_slot(SlotState { a, b })), now, cost);
                }
            }
        }

        #[test]
        fn peeks_never_write(
            (limit, scale) in limits(),
            (start, steps) in history(),
            frac in 0u64..=200,
        ) {
            let (state, now) = replay(&limit, scale, start, &steps);
            let (d, next) = limit.decide(state, now + dt(scale, frac), 0);
            prop_assert!(d.allowed);
            prop_assert_eq!(next, None);
        }
    }
}

/// docs/algorithms.md: a full burst at the very end of a window, then requests as fast as
/// the fading weight lets them through, put nearly twice the limit in one window-long span
/// (never more than twice).
#[test]
fn sliding_window_worst_case_span_holds_nearly_twice_the_limit() {
    let window_us = 60 * S_US;
    let limit = Limit::SlidingWindow(SlidingWindow::new(100, window_us).unwrap());
    let burst_at = T0 - T0 % window_us + window_us - 1;
    let mut state = None;
    let mut admitted = 0;
    let mut t = burst_at;
    while t < burst_at + window_us {
        // The burst: everything it takes at the last µs of the window.
        let attempts = if t == burst_at { 100 } else { 1 };
        for _ in 0..attempts {
            let (decision, next) = limit.decide(state, t, 1);
            if decision.allowed {
                admitted += 1;
                state = next.or(state);
            }
        }
        t += if t == burst_at { 1 } else { MS_US };
    }
    println!("admitted in one window-long span: {admitted} for a limit of 100");
    assert_eq!(admitted, 199);
}
