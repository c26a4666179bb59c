//! The algorithms against the scenario tables (natively and under wasm32) — through the
//! pure functions and through a slot table on the in-memory store — and their parameters.
//! Their properties (natively, with proptest) are in `algorithm_properties.rs`.

// Test code: a failed expectation is meant to panic, helpers included.

use weir_core::algorithms::{
    fixed_window::{self, FixedWindow},
    gcra::{self, Gcra, ThrottleReply},
    sliding_window::{self, SlidingWindow},
    token_bucket::{self, TokenBucket},
    AlgorithmKind, GlobalLimit, Limit, ParamError, Policy, SlotState,
};
use weir_core::conformance::Admission;
use weir_core::key::KeyHash;
use weir_core::store::memory::MemoryStore;
use weir_core::store::{Placement, SlotTable, Vacancy};
use weir_testkit::oracles;
use weir_testkit::scenarios::{
    expected, limit_of, log_of, Scenario, Throttle, MS_US, S_NS, S_US, T0,
};

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

/// Every table of an algorithm with slot state, whatever the algorithm, on the pure
/// function: a new algorithm's rows run here and in a slot table without a test of their
/// own (a throwaway algorithm's wrong row passed natively, and failed only against Lua,
/// before the tables ran whatever their algorithm).
#[cfg_attr(not(target_arch = "wasm32"), test)]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
fn every_slot_table_runs_on_the_pure_function() {
    oracles::slot_tables().for_each(run);
}

/// The same rows in a slot table, as the filter keeps local rules.
#[cfg_attr(not(target_arch = "wasm32"), test)]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
fn every_slot_table_runs_in_a_slot_table() {
    oracles::slot_tables().for_each(run_in_slot_table);
}

/// The sliding log's rows, on its own runner (it has no slot state).
#[cfg_attr(not(target_arch = "wasm32"), test)]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
fn sliding_log_scenarios() {
    assert!(!oracles::sliding_log::SCENARIOS.is_empty());
    for scenario in oracles::sliding_log::SCENARIOS {
        run_log(scenario);
    }
}

/// The rows and the oracles agree: what each table admits (every allowed request with a
/// cost, at its instant) keeps the bound its algorithm's oracle reads from the definition.
/// A row that admits past the bound is a wrong row or a wrong oracle, and the tables and
/// the oracles are written apart from the algorithms' code.
#[cfg_attr(not(target_arch = "wasm32"), test)]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
fn every_table_keeps_its_oracles_bound() {
    for kind in AlgorithmKind::ALL {
        for scenario in oracles::scenarios(kind) {
            let limit = GlobalLimit::build(kind, scenario.algo.values()).unwrap();
            let mut admitted: Vec<Admission> = scenario
                .steps
                .iter()
                .filter(|step| step.allowed && step.cost > 0)
                .map(|step| Admission {
                    at_us: step.now_us,
                    cost: step.cost,
                })
                .collect();
            admitted.sort_by_key(|a| a.at_us);
            for j in 0..admitted.len() {
                assert!(
                    !oracles::oracle(&limit).breaks_at(&admitted, j),
                    "{}: admission {j} breaks the bound: {admitted:?}",
                    scenario.name
                );
            }
        }
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

/// What the tables must cover: every algorithm has a table of its own kind (its oracle's
/// `SCENARIOS`, found through the one list of algorithms, so a kind without one does not
/// compile) with at least two scenarios or [`MIN_STEPS`] rows, with an allowed request
/// and a denial with a retry time; every table of an algorithm with slot state is in
/// `slot_tables()`, which the bridge runs against Lua; and no scenario is named twice.
#[cfg_attr(not(target_arch = "wasm32"), test)]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
fn every_algorithm_has_a_scenario_table() {
    const MIN_STEPS: usize = 10;
    let mut names = std::collections::BTreeSet::new();
    for kind in AlgorithmKind::ALL {
        let table = oracles::scenarios(kind);
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
                oracles::slot_tables().any(|r| r.name == s.name),
                has_slot,
                "{}: in slot_tables() exactly when its state fits a slot",
                s.name
            );
        }
    }
    assert_eq!(
        AlgorithmKind::ALL
            .into_iter()
            .map(|kind| oracles::scenarios(kind).len())
            .sum::<usize>(),
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
    let s = |tat_ns| gcra::State {
        tat_ns,
        emission_interval_ns: 0,
    };
    assert_eq!(g.idle_at_us(&s(T0 * 1_000 + 333_333_333)), T0 + 333_334);
    assert_eq!(g.idle_at_us(&s(T0 * 1_000)), T0);
    assert_eq!(g.idle_at_us(&s(u64::MAX)), u64::MAX / 1_000 + 1);
    // The TAT is stored in ns: three requests at 3 per second land on T0 + 999_999_999 ns,
    // with the emission interval they were counted in beside it.
    let mut state = None;
    for _ in 0..3 {
        state = g.decide(state, T0, 1).1.or(state);
    }
    let counted = gcra::State {
        tat_ns: T0 * 1_000 + 999_999_999,
        emission_interval_ns: 333_333_333,
    };
    assert_eq!(state, Some(counted));
    assert_eq!(
        state.map(|st| st.to_slot()),
        Some(SlotState {
            a: T0 * 1_000 + 999_999_999,
            b: 333_333_333
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
    for s in oracles::slot_tables() {
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
