//! The whole local pipeline on the in-memory store: rules, keys, slot tables and the CAS
//! loop, natively (threads racing) and under wasm32 (single-threaded parts).

use crate::support;

use support::{engine, run, user, FakeRequest, SEED, T0};
use weir_core::config;
use weir_core::engine::RuleOutcome;
use weir_core::rules::RuleId;
use weir_core::store::memory::MemoryStore;
use weir_core::store::{Placement, SharedStore, StoreError};
use weir_core::time::Micros;

#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test as test;

#[test]
fn keys_are_isolated_and_parts_cannot_be_spliced() {
    let e = engine(
        r#"{"rules":[{"name":"pair","key":[{"header":"x-a"},{"header":"x-b"}],
            "limit":{"algorithm":"fixed_window","limit":1,"window":"1h"}}]}"#,
    );
    let store = MemoryStore::new();
    e.prepare(&store).unwrap();
    let req = |a: &str, b: &str| FakeRequest::default().header("x-a", a).header("x-b", b);
    assert!(run(&e, &store, &req("a:b", "c"), T0).0);
    assert!(!run(&e, &store, &req("a:b", "c"), T0).0);
    assert!(run(&e, &store, &req("a", "b:c"), T0).0);
    assert!(run(&e, &store, &req("a:b:", "c"), T0).0);
    assert_eq!(
        run(&e, &store, &req("", "c"), T0).1,
        RuleOutcome::KeyMissing
    );
}

#[test]
fn tables_stay_bounded_and_reuse_idle_slots() {
    let e = engine(
        r#"{"rules":[{"name":"per-user","key":[{"header":"x-user"}],"max_keys":100,
            "limit":{"algorithm":"gcra","rate":1,"period":"1s","burst":0}}]}"#,
    );
    let store = MemoryStore::new();
    e.prepare(&store).unwrap();
    let keys_after_prepare = store.key_count();
    for i in 0..10_000 {
        assert!(
            run(&e, &store, &user(&format!("u{i}")), T0).0,
            "fresh key limited"
        );
    }
    assert_eq!(
        store.key_count(),
        keys_after_prepare,
        "a client got a key of its own"
    );
    assert_eq!(
        e.estimate_slots_in_use(RuleId(0), &store, u32::MAX)
            .unwrap(),
        100
    );

    // One second later every bucket is full again: new keys take idle slots over.
    let mut facts = e.facts(user("late"));
    let eval = e.evaluate(
        &store,
        &mut e.worker(),
        &SEED,
        &mut facts,
        Micros(T0 + 1_000_000),
    );
    assert_eq!(eval.reports[0].placement, Some(Placement::Takeover));
}

#[test]
fn a_live_key_is_never_charged_by_another() {
    // Fill a tiny table with live keys, then hammer it with new ones: the first key's
    // state may be evicted (it restarts fresh), but never charged by someone else.
    let e = engine(
        r#"{"rules":[{"name":"per-user","key":[{"header":"x-user"}],"max_keys":4,
            "limit":{"algorithm":"fixed_window","limit":3,"window":"1h"}}]}"#,
    );
    let store = MemoryStore::new();
    e.prepare(&store).unwrap();
    for _ in 0..3 {
        assert!(run(&e, &store, &user("victim"), T0).0);
    }
    assert!(!run(&e, &store, &user("victim"), T0).0);
    for i in 0..50 {
        run(&e, &store, &user(&format!("attacker-{i}")), T0);
        let mut facts = e.facts(user("victim"));
        let eval = e.evaluate(&store, &mut e.worker(), &SEED, &mut facts, Micros(T0));
        // Either still limited (its slot survived) or fresh (evicted): never "1 left".
        let remaining = eval.verdicts[0].decision.remaining;
        assert!(
            remaining == 0 || remaining == 2,
            "victim saw remaining {remaining}"
        );
    }
}

/// A store whose writes fail with a CAS mismatch every other time: the loop re-decides.
struct Contended {
    inner: MemoryStore,
    flip: std::sync::atomic::AtomicBool,
}

impl SharedStore for Contended {
    fn get(&self, key: &str) -> Result<(Option<Vec<u8>>, Option<u32>), StoreError> {
        self.inner.get(key)
    }
    fn compare_and_set(&self, key: &str, value: &[u8], version: u32) -> Result<(), StoreError> {
        if self
            .flip
            .fetch_xor(true, std::sync::atomic::Ordering::SeqCst)
        {
            // Another worker wins this round with the same decision.
            let (current, now) = self.inner.get(key)?;
            self.inner
                .compare_and_set(key, &current.unwrap_or_default(), now.unwrap())?;
        }
        self.inner.compare_and_set(key, value, version)
    }
    fn create(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        self.inner.create(key, value)
    }
}

#[test]
fn cas_conflicts_are_retried_and_counted() {
    let e = engine(
        r#"{"rules":[{"name":"r","limit":{"algorithm":"token_bucket","capacity":5,"refill":1,"period":"1h"}}]}"#,
    );
    let store = Contended {
        inner: MemoryStore::new(),
        flip: false.into(),
    };
    e.prepare(&store.inner).unwrap();
    let mut retries = 0;
    let mut allowed = 0;
    for _ in 0..10 {
        let mut facts = e.facts(FakeRequest::default());
        let eval = e.evaluate(&store, &mut e.worker(), &SEED, &mut facts, Micros(T0));
        retries += eval.reports[0].cas_retries;
        allowed += usize::from(!eval.denied());
    }
    assert_eq!(allowed, 5);
    assert_eq!(retries, 4, "every other write loses a race once");
}

#[cfg(not(target_arch = "wasm32"))]
#[test]
fn threads_racing_admit_exactly_what_one_would() {
    let e = std::sync::Arc::new(engine(
        r#"{"rules":[{"name":"r","key":[{"header":"x-user"}],
            "limit":{"algorithm":"gcra","rate":1,"period":"1h","burst":999}}]}"#,
    ));
    let store = std::sync::Arc::new(MemoryStore::new());
    e.prepare(&*store).unwrap();
    let handles: Vec<_> = (0..8)
        .map(|_| {
            let (e, store) = (e.clone(), store.clone());
            std::thread::spawn(move || {
                (0..500)
                    .filter(|_| run(&e, &store, &user("alice"), T0).0)
                    .count()
            })
        })
        .collect();
    let admitted: usize = handles.into_iter().map(|h| h.join().unwrap()).sum();
    assert_eq!(admitted, 1000);
}

// ---- Costs: a request never costs 0 (it would only peek at its key and always pass).

/// Each local algorithm at its limit, then requests that claim a cost of 0 in the
/// header: they are charged `min` (1) and denied like any other.
#[test]
fn a_cost_header_of_zero_is_charged_the_minimum() {
    let limits = [
        r#"{"algorithm":"gcra","rate":1,"period":"1h","burst":2}"#,
        r#"{"algorithm":"token_bucket","capacity":3,"refill":1,"period":"1h"}"#,
        r#"{"algorithm":"fixed_window","limit":3,"window":"1h"}"#,
        r#"{"algorithm":"sliding_window","limit":3,"window":"1h"}"#,
    ];
    for limit in limits {
        let e = engine(&format!(
            r#"{{"rules":[{{"name":"r","key":[{{"header":"x-user"}}],
                "cost":{{"header":"x-cost","max":3}},"limit":{limit}}}]}}"#
        ));
        let store = MemoryStore::new();
        e.prepare(&store).unwrap();
        let req = |cost: &str| user("alice").header("x-cost", cost);
        assert!(run(&e, &store, &req("3"), T0).0, "{limit}: the first 3 fit");
        for zero in ["0", "00", " 0", "000000"] {
            for _ in 0..3 {
                assert!(
                    !run(&e, &store, &req(zero), T0).0,
                    "{limit}: x-cost {zero:?} passed a key at its limit"
                );
            }
        }
    }
}

#[test]
fn cost_headers_fall_back_to_the_default_and_stay_within_min_and_max() {
    let e = engine(
        r#"{"rules":[{"name":"r","cost":{"header":"x-cost","min":2,"default":4,"max":8},
            "limit":{"algorithm":"fixed_window","limit":100,"window":"1h"}}]}"#,
    );
    let store = MemoryStore::new();
    e.prepare(&store).unwrap();
    let mut spent = 0;
    for (header, charged) in [
        (None, 4),
        (Some("-1"), 4),
        (Some("abc"), 4),
        (Some("1.5"), 4),
        (Some(""), 4),
        (Some("0"), 2),
        (Some("1"), 2),
        (Some(" 5 "), 5),
        (Some("99999999999999999999999"), 4),
        (Some("9"), 8),
    ] {
        let mut req = FakeRequest::default();
        if let Some(value) = header {
            req = req.header("x-cost", value);
        }
        let mut facts = e.facts(req);
        let eval = e.evaluate(&store, &mut e.worker(), &SEED, &mut facts, Micros(T0));
        spent += charged;
        assert_eq!(
            eval.verdicts[0].decision.remaining,
            100 - spent,
            "x-cost {header:?} should cost {charged}"
        );
    }
}

#[test]
fn a_global_rule_never_asks_the_bridge_for_zero() {
    let e = engine(
        r#"{"bridge":{"cluster":"weir_bridge"},"rules":[{"name":"tenant","scope":"global",
            "key":[{"header":"x-user"}],"cost":{"header":"x-cost"},
            "limit":{"algorithm":"token_bucket","capacity":100,"refill":100,"period":"1m"}}]}"#,
    );
    let store = MemoryStore::new();
    e.prepare(&store).unwrap();
    for zero in ["0", "00", " 0"] {
        let mut facts = e.facts(user("acme").header("x-cost", zero));
        let eval = e.evaluate(&store, &mut e.worker(), &SEED, &mut facts, Micros(T0));
        assert_eq!((eval.pending[0].cost, eval.pending[0].want), (1, 1));
    }
}

// ---- The config checker refuses what the bridge would: every request a valid config
// builds is one the bridge accepts.

use weir_core::bounds::{MAX_BODY_BYTES, MAX_KEY_PARTS, MAX_KEY_VALUE_BYTES, MAX_RULES};
use weir_core::wire::v2;

/// The largest request a valid config can make: every rule global and matching, every
/// key at its most parts, each part a configured value at its longest, made of quotes
/// that JSON must escape, plus request values that travel plain or hashed.
#[test]
fn the_largest_bridge_request_a_config_can_build_is_accepted() {
    let quotes = "\\\"".repeat(MAX_KEY_VALUE_BYTES);
    let mut parts: Vec<String> = (0..MAX_KEY_PARTS - 2)
        .map(|_| format!(r#"{{"static":"{quotes}"}}"#))
        .collect();
    parts.push(r#"{"header":"x-plain"}"#.into());
    parts.push(r#"{"header":"x-long"}"#.into());
    let key = parts.join(",");
    let rules: Vec<String> = (0..MAX_RULES)
        .map(|i| {
            format!(
                r#"{{"name":"rule-{i:02}-{}","scope":"global","key":[{key}],
                    "cost":{{"header":"x-cost"}},
                    "global":{{"lease":{{"max":1000000}}}},
                    "limit":{{"algorithm":"token_bucket","capacity":1000000,"refill":1000000,"period":"30d"}}}}"#,
                "n".repeat(50)
            )
        })
        .collect();
    let json = format!(
        r#"{{"bridge":{{"cluster":"b","domain":"{}"}},"rules":[{}]}}"#,
        "d".repeat(64),
        rules.join(",")
    );
    let e = engine(&json);
    let store = MemoryStore::new();
    e.prepare(&store).unwrap();
    let req = FakeRequest::default()
        .header("x-plain", "p".repeat(128))
        .header("x-long", "l".repeat(10_000))
        .header("x-cost", "999999999");
    let mut facts = e.facts(req);
    let eval = e.evaluate(&store, &mut e.worker(), &SEED, &mut facts, Micros(T0));
    assert_eq!(eval.pending.len(), MAX_RULES);
    let body = e.bridge_request(&eval.pending);
    assert!(
        body.len() <= MAX_BODY_BYTES,
        "{} bytes > {MAX_BODY_BYTES}",
        body.len()
    );
    let request = v2::Request::parse(&body).unwrap_or_else(|e| panic!("refused: {e}"));
    assert_eq!(
        request.items[0].item.cost, 1_000_000,
        "the cost is capped at the wire's want"
    );
}

#[test]
fn configs_the_bridge_would_refuse_are_refused() {
    let refused = |rule: &str| {
        let json = format!(r#"{{"bridge":{{"cluster":"b"}},"rules":[{rule}]}}"#);
        config::parse(json.as_bytes()).unwrap_err().to_string()
    };
    assert_eq!(
        refused(
            r#"{"name":"r","scope":"global","cost":1000001,
                "limit":{"algorithm":"fixed_window","limit":2000000,"window":"1m"}}"#
        ),
        "rules[0].cost: 1000001 can never be admitted: the limit allows at most 1000000 at once"
    );
    assert_eq!(
        refused(
            r#"{"name":"r","scope":"global","cost":{"header":"x-cost","max":1000001},
                "limit":{"algorithm":"fixed_window","limit":2000000,"window":"1m"}}"#
        ),
        "rules[0].cost.max: 1000001 can never be admitted: the limit allows at most 1000000 at once"
    );
    assert_eq!(
        refused(
            r#"{"name":"r","scope":"global",
                "limit":{"algorithm":"fixed_window","limit":281474976710657,"window":"1m"}}"#
        ),
        "rules[0].limit.limit: must be at most 2^48 for exact arithmetic in Redis (global rules run in Redis)"
    );
    assert_eq!(
        refused(
            r#"{"name":"r","scope":"global",
                "limit":{"algorithm":"token_bucket","capacity":1000000,"refill":1,"period":"30d"}}"#
        ),
        "rules[0].limit.period: period × ⌈capacity / refill⌉ must be at most 2^48 us (about 8.9 years) for exact arithmetic in Redis (global rules run in Redis)"
    );
    // The same limits are fine locally, where no Lua computes them.
    assert!(config::parse(
        br#"{"rules":[{"name":"r","limit":{"algorithm":"token_bucket","capacity":1000000,"refill":1,"period":"30d"}}]}"#
    )
    .is_ok());
}

// ---- Shared data: sets are created once, at configure time, and never blindly written.

#[test]
fn an_update_never_writes_a_set_that_is_missing() {
    let e = engine(
        r#"{"rules":[{"name":"r","limit":{"algorithm":"fixed_window","limit":3,"window":"1h"}}]}"#,
    );
    let store = MemoryStore::new();
    // Not prepared: the set is missing, so the rule fails open and writes nothing.
    let mut facts = e.facts(FakeRequest::default());
    let eval = e.evaluate(&store, &mut e.worker(), &SEED, &mut facts, Micros(T0));
    assert!(!eval.denied());
    assert_eq!(
        eval.reports[0].outcome,
        RuleOutcome::StoreFailed(weir_core::store::UpdateError::Store(StoreError::Missing))
    );
    assert_eq!(store.key_count(), 0, "nothing was created by a request");
}

#[test]
fn the_configure_gauge_reads_a_bounded_sample_of_sets() {
    let e = engine(
        r#"{"rules":[{"name":"r","key":[{"header":"x-user"}],"max_keys":40000,
            "limit":{"algorithm":"fixed_window","limit":3,"window":"1h"}}]}"#,
    );
    let store = MemoryStore::new();
    e.prepare(&store).unwrap();
    for i in 0..8_000 {
        run(&e, &store, &user(&format!("u{i}")), T0);
    }
    let exact = e
        .estimate_slots_in_use(RuleId(0), &store, u32::MAX)
        .unwrap();
    let estimate = e.estimate_slots_in_use(RuleId(0), &store, 256).unwrap();
    // 8,000 keys hashed into 10,000 sets: the sample of 256 sets is within a few percent.
    assert!(exact > 7_000, "{exact}");
    let error = estimate.abs_diff(exact) as f64 / exact as f64;
    assert!(error < 0.2, "estimate {estimate} vs exact {exact}");
    // A table with few sets is read whole: exact.
    assert_eq!(
        e.estimate_slots_in_use(RuleId(0), &store, 1_000_000)
            .unwrap(),
        exact
    );
}
