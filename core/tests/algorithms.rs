//! The algorithms against the scenario tables (natively and under wasm32) — through the
//! pure functions and through a slot table on the in-memory store — then their
//! properties (natively, with proptest).

// Test code: a failed expectation is meant to panic, helpers included.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use weir_core::algorithms::{
    fixed_window::{self, FixedWindow},
    gcra::{self, Gcra, ThrottleReply},
    sliding_window::{self, SlidingWindow},
    token_bucket::{self, TokenBucket},
    AlgorithmKind, GlobalLimit, Limit, ParamError, Policy, SlotState,
};
use weir_core::key::KeyHash;
use weir_core::scenarios::{
    self, expected, limit_of, log_of, Scenario, Throttle, MS_US, S_NS, S_US, T0,
};
use weir_core::store::memory::MemoryStore;
use weir_core::store::{Placement, SlotTable, Vacancy};

fn reply(t: &Throttle) -> ThrottleReply {
    ThrottleReply {
        limited: t.limited,
        limit: t.limit,
        remaining: t.remaining,
        retry_after: t.retry_after,
        reset_after: t.reset_after,
    }
}

/// Runs one scenario through `Limit::decide` (and, for GCRA, `Gcra::throttle` in step).
fn run(scenario: &Scenario) {
    let limit = limit_of(scenario.algo);
    let mut state: Option<SlotState> = None;
    for (i, step) in scenario.steps.iter().enumerate() {
        let at = format!("{} / step {i} ({step:?})", scenario.name);
        let (decision, next) = limit.decide(state, step.now_us, step.cost);
        assert_eq!(decision, expected(step), "{at}");
        if !decision.allowed || step.cost == 0 {
            assert_eq!(next, None, "{at}: a denial or a peek writes nothing");
        } else {
            assert!(next.is_some(), "{at}: an allowed request writes its state");
        }
        if let Limit::Gcra(g) = &limit {
            let (got, throttled) =
                g.throttle(state.map(gcra::State::from_slot), step.now_us, step.cost);
            let want = step
                .throttle
                .unwrap_or_else(|| panic!("{at}: GCRA rows carry a CL.THROTTLE reply"));
            assert_eq!(got, reply(&want), "{at}: CL.THROTTLE");
            assert_eq!(
                throttled.map(gcra::State::to_slot),
                next,
                "{at}: throttle and decide agree"
            );
        } else {
            assert_eq!(step.throttle, None, "{at}");
        }
        if next.is_some() {
            state = next;
        }
    }
}

/// Runs one scenario through a slot table in the in-memory store, as the filter stores
/// local rules: the same decisions, and the key keeps its one slot.
fn run_in_slot_table(scenario: &Scenario) {
    let limit = limit_of(scenario.algo);
    let store = MemoryStore::new();
    let table = SlotTable::new("scenario", limit.kind().name(), 4);
    table.create_missing(&store).unwrap();
    let key = KeyHash {
        set_hash: 7,
        fingerprint: 42,
    };
    let mut placed = false;
    for (i, step) in scenario.steps.iter().enumerate() {
        let at = format!("{} / slot table step {i} ({step:?})", scenario.name);
        let updated = table
            .update(
                &store,
                &key,
                step.now_us,
                |s| Vacancy {
                    idle_at_us: limit.idle_at_us(s),
                    in_use: limit.in_use(s, step.now_us),
                },
                |state| limit.decide(state, step.now_us, step.cost),
            )
            .unwrap();
        assert_eq!(updated.result, expected(step), "{at}");
        assert_eq!(updated.cas_retries, 0, "{at}");
        match updated.placement {
            None => assert!(!step.allowed || step.cost == 0, "{at}: nothing written"),
            Some(Placement::Empty) => {
                assert!(!placed, "{at}: the key found a new slot twice");
                placed = true;
            }
            Some(Placement::Existing) => assert!(placed, "{at}"),
            Some(other) => panic!("{at}: one key alone was placed by {other:?}"),
        }
    }
    assert_eq!(table.slots_in_use(&store).unwrap(), u64::from(placed));
}

fn run_all(scenarios: &[Scenario]) {
    assert!(!scenarios.is_empty());
    for scenario in scenarios {
        run(scenario);
        run_in_slot_table(scenario);
    }
}

#[cfg_attr(not(target_arch = "wasm32"), test)]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
fn gcra_scenarios() {
    run_all(scenarios::GCRA);
}

#[cfg_attr(not(target_arch = "wasm32"), test)]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
fn token_bucket_scenarios() {
    run_all(scenarios::TOKEN_BUCKET);
}

#[cfg_attr(not(target_arch = "wasm32"), test)]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
fn fixed_window_scenarios() {
    run_all(scenarios::FIXED_WINDOW);
}

#[cfg_attr(not(target_arch = "wasm32"), test)]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
fn sliding_window_scenarios() {
    run_all(scenarios::SLIDING_WINDOW);
}

#[cfg_attr(not(target_arch = "wasm32"), test)]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
fn sliding_log_scenarios() {
    assert!(!scenarios::SLIDING_LOG.is_empty());
    for scenario in scenarios::SLIDING_LOG {
        run_log(scenario);
    }
}

/// Runs one sliding-log scenario through `SlidingLog::acquire`, keeping the log as Redis
/// does (events at `now`, sorted, trimmed one window back). The log has no slot state,
/// so it has no slot-table run; the bridge runs the same rows against its Lua script.
fn run_log(scenario: &Scenario) {
    let log = log_of(scenario.algo);
    let mut events: Vec<u64> = Vec::new();
    for (i, step) in scenario.steps.iter().enumerate() {
        let at = format!("{} / step {i} ({step:?})", scenario.name);
        assert_eq!(step.throttle, None, "{at}");
        let (decision, granted) = log.acquire(&events, step.now_us, step.cost, step.cost);
        assert_eq!(decision, expected(step), "{at}");
        assert_eq!(granted, if step.allowed { step.cost } else { 0 }, "{at}");
        let pos = events.partition_point(|&t| t <= step.now_us);
        events.splice(pos..pos, std::iter::repeat_n(step.now_us, granted as usize));
        events.retain(|&t| t > step.now_us.saturating_sub(log.window_us()));
    }
}

/// What the tables must cover, listed here by hand rather than taken from
/// `scenarios::slot_tables()` (which is defined as the chain of the tables, so counting it
/// proves nothing): every algorithm has a table of its own kind with at least two
/// scenarios or [`MIN_STEPS`] rows, with an allowed request and a denial with a retry
/// time; every table of an algorithm with slot state is in `slot_tables()`, which the
/// bridge runs against Lua; and no scenario is named twice.
#[cfg_attr(not(target_arch = "wasm32"), test)]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
fn every_algorithm_has_a_scenario_table() {
    const MIN_STEPS: usize = 10;
    let tables: [(AlgorithmKind, &[Scenario]); 5] = [
        (AlgorithmKind::Gcra, scenarios::GCRA),
        (AlgorithmKind::TokenBucket, scenarios::TOKEN_BUCKET),
        (AlgorithmKind::FixedWindow, scenarios::FIXED_WINDOW),
        (AlgorithmKind::SlidingWindow, scenarios::SLIDING_WINDOW),
        (AlgorithmKind::SlidingLog, scenarios::SLIDING_LOG),
    ];
    let mut names = std::collections::BTreeSet::new();
    for kind in AlgorithmKind::ALL {
        let table = tables
            .iter()
            .find(|(k, _)| *k == kind)
            .map(|(_, t)| *t)
            .unwrap_or_else(|| panic!("{}: no scenario table", kind.name()));
        let steps: Vec<_> = table.iter().flat_map(|s| s.steps).collect();
        assert!(
            table.len() >= 2 || steps.len() >= MIN_STEPS,
            "{}: {} scenarios, {} rows",
            kind.name(),
            table.len(),
            steps.len()
        );
        assert!(
            steps.iter().any(|s| s.allowed && s.cost > 0),
            "{}: no admission",
            kind.name()
        );
        assert!(
            steps
                .iter()
                .any(|s| !s.allowed && s.retry_after_ns.is_some()),
            "{}: no denial with a retry time",
            kind.name()
        );
        for s in table {
            assert_eq!(
                s.algo.kind,
                kind,
                "{} is in {}'s table",
                s.name,
                kind.name()
            );
            assert!(
                names.insert(s.name),
                "{}: two scenarios of that name",
                s.name
            );
            let has_slot = GlobalLimit::build(kind, s.algo.values())
                .unwrap()
                .as_slot()
                .is_some();
            assert_eq!(
                scenarios::slot_tables().any(|r| r.name == s.name),
                has_slot,
                "{}: in slot_tables() exactly when its state fits a slot",
                s.name
            );
        }
    }
    assert_eq!(
        scenarios::slot_tables().count() + scenarios::SLIDING_LOG.len(),
        names.len()
    );
}

fn err(field: &'static str, reason: &str) -> ParamError {
    ParamError::new(field, reason)
}

#[cfg_attr(not(target_arch = "wasm32"), test)]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
fn gcra_params_are_validated() {
    assert_eq!(
        Gcra::new(4, 0, S_US),
        Err(err("rate", "must be at least 1"))
    );
    assert_eq!(
        Gcra::new(4, 1, 0),
        Err(err("period", "must be at least 1us"))
    );
    assert_eq!(
        Gcra::new(4, 1_001, S_US / 1_000),
        Err(err(
            "rate",
            "is too high for the period: 1001 per 1000us leaves less than 1us between requests"
        ))
    );
    // T = 1 µs exactly is fine.
    assert!(Gcra::new(4, 1_000, S_US / 1_000).is_ok());
    // τ just under 2^52 ns is fine, one burst more is not.
    let tau_cap = Gcra::new(0, 1, (1u64 << 52) / 1_000).map(|g| g.tolerance_ns());
    assert_eq!(tau_cap, Ok((1u64 << 52) / 1_000 * 1_000));
    assert_eq!(
        Gcra::new(1, 1, (1u64 << 52) / 1_000),
        Err(err(
            "burst",
            "(burst + 1) × period / rate must be at most 2^52 ns (about 52 days)"
        ))
    );
    assert!(Gcra::new(u64::MAX, 1, S_US).is_err());
    // Huge but consistent: T = 1 µs.
    assert_eq!(
        Gcra::new(0, u64::MAX, u64::MAX).map(|g| g.emission_interval_ns()),
        Ok(1_000)
    );
}

#[cfg_attr(not(target_arch = "wasm32"), test)]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
fn gcra_emission_interval_and_policy() {
    let g = Gcra::new(2, 3, S_US).unwrap();
    assert_eq!(
        (g.emission_interval_ns(), g.tolerance_ns(), g.limit()),
        (333_333_333, 999_999_999, 3)
    );
    assert_eq!(
        g.policy(),
        Policy {
            quota: 3,
            window_ns: 999_999_999
        }
    );
    let g = Gcra::new(9, 7, 60 * S_US).unwrap();
    assert_eq!(g.emission_interval_ns(), 8_571_428_571);
    // Beyond 2^53 ns redis-cell's double division is not the integer quotient.
    let g = Gcra::new(0, 7, 22_260_000_000_001).unwrap();
    assert_eq!(22_260_000_000_001_000u64 / 7, 3_180_000_000_000_142);
    assert_eq!(g.emission_interval_ns(), 3_180_000_000_000_143);
}

#[cfg_attr(not(target_arch = "wasm32"), test)]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
fn gcra_idle_at_rounds_the_tat_up_to_the_microsecond() {
    let g = Gcra::new(2, 3, S_US).unwrap();
    let s = |tat_ns| gcra::State { tat_ns };
    assert_eq!(g.idle_at_us(&s(T0 * 1_000 + 333_333_333)), T0 + 333_334);
    assert_eq!(g.idle_at_us(&s(T0 * 1_000)), T0);
    assert_eq!(g.idle_at_us(&s(u64::MAX)), u64::MAX / 1_000 + 1);
    // The TAT is stored in ns: three requests at 3 per second land on T0 + 999_999_999 ns.
    let mut state = None;
    for _ in 0..3 {
        state = g.decide(state, T0, 1).1.or(state);
    }
    assert_eq!(state, Some(s(T0 * 1_000 + 999_999_999)));
    assert_eq!(
        state.map(|st| st.to_slot()),
        Some(SlotState {
            a: T0 * 1_000 + 999_999_999,
            b: 0
        })
    );
}

#[cfg_attr(not(target_arch = "wasm32"), test)]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
fn token_bucket_params_policy_and_idle() {
    assert_eq!(
        TokenBucket::new(0, 1, S_US),
        Err(err("capacity", "must be at least 1"))
    );
    assert_eq!(
        TokenBucket::new(1, 0, S_US),
        Err(err("refill", "must be at least 1"))
    );
    assert_eq!(
        TokenBucket::new(1, 1, 0),
        Err(err("period", "must be at least 1us"))
    );
    let b = TokenBucket::new(5, 2, S_US).unwrap();
    assert_eq!(
        b.policy(),
        Policy {
            quota: 5,
            window_ns: 3 * S_NS
        }
    );
    assert_eq!(
        TokenBucket::new(2, 10, S_US).unwrap().policy(),
        Policy {
            quota: 2,
            window_ns: S_NS
        }
    );
    let s = token_bucket::State {
        tokens: 0,
        last_refill_us: T0,
    };
    assert_eq!(b.idle_at_us(&s), T0 + 3 * S_US);
    assert_eq!(
        b.idle_at_us(&token_bucket::State {
            tokens: 9,
            last_refill_us: T0
        }),
        T0
    );
    assert_eq!(
        b.idle_at_us(&token_bucket::State {
            tokens: 0,
            last_refill_us: u64::MAX
        }),
        u64::MAX
    );
}

/// Issue 19, defect 1: a bucket counted at a future refill (a held request, a debt)
/// has its tokens from that refill on, not before: read earlier, they were spent before
/// the refill came.
#[cfg_attr(not(target_arch = "wasm32"), test)]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
fn a_token_bucket_counted_at_a_future_refill_has_no_tokens_before_it() {
    let b = TokenBucket::new(10, 10, S_US).unwrap();
    let held = token_bucket::State {
        tokens: 9,
        last_refill_us: T0 + S_US,
    };
    let (early, next) = b.decide(Some(held), T0 + 1, 1);
    assert!(
        !early.allowed,
        "a request before the refill finds no tokens"
    );
    assert_eq!(next, None);
    assert_eq!(early.remaining, 0);
    assert_eq!(
        early.retry_after_ns,
        Some(S_NS - 1_000),
        "retry at the refill"
    );
    let (peek, _) = b.decide(Some(held), T0 + 1, 0);
    assert!(peek.allowed && peek.remaining == 0);
    let (on_time, next) = b.decide(Some(held), T0 + S_US, 9);
    assert!(on_time.allowed, "from the refill on, its tokens are there");
    assert_eq!(next.map(|s| s.tokens), Some(0));
}

#[cfg_attr(not(target_arch = "wasm32"), test)]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
fn fixed_window_params_policy_and_idle() {
    assert_eq!(
        FixedWindow::new(0, S_US),
        Err(err("limit", "must be at least 1"))
    );
    assert_eq!(
        FixedWindow::new(1, 0),
        Err(err("window", "must be at least 1us"))
    );
    let w = FixedWindow::new(3, 10 * S_US).unwrap();
    assert_eq!(
        w.policy(),
        Policy {
            quota: 3,
            window_ns: 10 * S_NS
        }
    );
    assert_eq!(
        w.idle_at_us(&fixed_window::State {
            count: 3,
            window_start_us: T0
        }),
        T0 + 10 * S_US
    );
    // A count from a window of another length (misaligned) counts as 0.
    let misaligned = fixed_window::State {
        count: 3,
        window_start_us: T0 + 5 * S_US,
    };
    assert!(w.decide(Some(misaligned), T0 + 2 * S_US, 3).0.allowed);
}

#[cfg_attr(not(target_arch = "wasm32"), test)]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
fn sliding_window_params_policy_idle_and_packing() {
    assert_eq!(
        SlidingWindow::new(0, S_US),
        Err(err("limit", "must be at least 1"))
    );
    assert_eq!(
        SlidingWindow::new(1 << 32, S_US),
        Err(err("limit", "must be at most 4294967295"))
    );
    assert!(SlidingWindow::new(u64::from(u32::MAX), S_US).is_ok());
    assert_eq!(
        SlidingWindow::new(1, 0),
        Err(err("window", "must be at least 1us"))
    );
    let w = SlidingWindow::new(10, 10 * S_US).unwrap();
    assert_eq!(
        w.policy(),
        Policy {
            quota: 10,
            window_ns: 10 * S_NS
        }
    );
    let st = |prev, curr| sliding_window::State {
        prev,
        curr,
        window_start_us: T0,
    };
    assert_eq!(w.idle_at_us(&st(3, 1)), T0 + 20 * S_US);
    assert_eq!(w.idle_at_us(&st(3, 0)), T0 + 10 * S_US);
    assert_eq!(w.idle_at_us(&st(0, 0)), T0);
    assert_eq!(
        st(3, 7).to_slot(),
        SlotState {
            a: (3 << 32) | 7,
            b: T0
        }
    );
    assert_eq!(
        sliding_window::State::from_slot(SlotState { a: u64::MAX, b: 1 }),
        sliding_window::State {
            prev: u32::MAX,
            curr: u32::MAX,
            window_start_us: 1
        }
    );
}

#[cfg_attr(not(target_arch = "wasm32"), test)]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
fn max_cost_is_the_limit() {
    for s in scenarios::slot_tables() {
        let limit = limit_of(s.algo);
        let max = limit.max_cost();
        let (d, _) = limit.decide(None, T0 + 123 * MS_US, max);
        assert!(d.allowed, "{}", s.name);
        let (d, next) = limit.decide(None, T0 + 123 * MS_US, max + 1);
        assert!(
            !d.allowed && d.retry_after_ns.is_none() && next.is_none(),
            "{}",
            s.name
        );
    }
}

/// Properties over random parameters, histories and states.
#[cfg(not(target_arch = "wasm32"))]
mod properties {
    use super::*;
    use proptest::prelude::*;

    /// A limit with parameters small enough that random histories hit its edges, and its
    /// natural time scale in µs.
    fn limits() -> impl Strategy<Value = (Limit, u64)> {
        let period = prop_oneof![1u64..=50, 1_000u64..=2_000_000, Just(S_US), Just(60 * S_US)];
        prop_oneof![
            (0u64..=8, 1u64..=9, period.clone()).prop_filter_map("valid gcra", |(b, r, p)| {
                Gcra::new(b, r, p).ok().map(|g| {
                    let scale = g.tolerance_ns() / 1_000 + 1;
                    (Limit::Gcra(g), scale)
                })
            }),
            (1u64..=10, 1u64..=12, period.clone()).prop_map(|(c, r, p)| {
                (
                    Limit::TokenBucket(TokenBucket::new(c, r, p).unwrap()),
                    p * c.div_ceil(r),
                )
            }),
            (1u64..=10, period.clone())
                .prop_map(|(l, w)| (Limit::FixedWindow(FixedWindow::new(l, w).unwrap()), w)),
            (1u64..=10, period)
                .prop_map(|(l, w)| (Limit::SlidingWindow(SlidingWindow::new(l, w).unwrap()), w)),
        ]
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
        let (mut now, mut state, mut admitted) = (t0, None, 0u64);
        let mut window_counts: Vec<(u64, u64)> = Vec::new();
        for &(frac, cost) in steps {
            now += dt(scale, frac);
            let (d, next) = limit.decide(state, now, cost);
            assert_eq!(d.limit, limit.max_cost());
            if !d.allowed || cost == 0 {
                assert_eq!(next, None, "a denial or a peek writes nothing");
            }
            if d.allowed {
                admitted += cost;
            }
            if next.is_some() {
                state = next;
            }
            let elapsed_us = now - t0;
            match limit {
                Limit::Gcra(g) => {
                    assert!(d.remaining <= g.limit());
                    let bound = g.limit()
                        + u64::try_from(
                            u128::from(elapsed_us) * 1_000 / u128::from(g.emission_interval_ns()),
                        )
                        .unwrap();
                    assert!(
                        admitted <= bound,
                        "gcra admitted {admitted} > {bound} in {elapsed_us}us"
                    );
                }
                Limit::TokenBucket(b) => {
                    let bound = b.capacity() + b.refill() * (elapsed_us / b.period_us());
                    assert!(
                        admitted <= bound,
                        "token bucket admitted {admitted} > {bound} in {elapsed_us}us"
                    );
                }
                Limit::FixedWindow(w) => {
                    let start = now - now % w.window_us();
                    if d.allowed {
                        match window_counts.iter_mut().find(|(s, _)| *s == start) {
                            Some((_, n)) => *n += cost,
                            None => window_counts.push((start, cost)),
                        }
                    }
                    assert!(window_counts.iter().all(|&(_, n)| n <= w.limit()));
                }
                Limit::SlidingWindow(w) => {
                    if let (true, Some(s)) = (d.allowed, next) {
                        let s = sliding_window::State::from_slot(s);
                        let width = u128::from(w.window_us());
                        let e = u128::from(now.max(s.window_start_us) - s.window_start_us);
                        let estimate =
                            u128::from(s.prev) * (width - e) + u128::from(s.curr) * width;
                        assert!(
                            estimate <= u128::from(w.limit()) * width,
                            "estimate above the limit"
                        );
                    }
                }
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
            let g = gcra::State { tat_ns: a };
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
            let [x, y, z] = p;
            let limits = [
                Gcra::new(x, y, z).map(Limit::Gcra),
                TokenBucket::new(x, y, z).map(Limit::TokenBucket),
                FixedWindow::new(x, y).map(Limit::FixedWindow),
                SlidingWindow::new(x, y).map(Limit::SlidingWindow),
            ];
            for limit in limits.into_iter().flatten() {
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
                    let _ = g.throttle(Some(gcra::State { tat_ns: a }), now, cost);
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
