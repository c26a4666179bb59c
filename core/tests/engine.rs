//! The whole local pipeline on the in-memory store: rules, keys, slot tables and the CAS
//! loop, natively (threads racing) and under wasm32 (single-threaded parts).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::collections::HashMap;
use weir_core::config;
use weir_core::engine::{Engine, RuleOutcome};
use weir_core::key::Seed;
use weir_core::rules::RuleId;
use weir_core::rules::{Fact, FactSource, Facts};
use weir_core::store::memory::MemoryStore;
use weir_core::store::{Placement, SharedStore, StoreError};

#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test as test;

const T0: u64 = 1_700_000_000_000_000;
const SEED: Seed = Seed([7; 16]);

/// A request as a map of headers (`:path`, `:method` included) and attributes.
#[derive(Default, Clone)]
struct FakeRequest(HashMap<Fact, Vec<u8>>);

impl FakeRequest {
    fn header(mut self, name: &str, value: impl AsRef<[u8]>) -> Self {
        self.0
            .insert(Fact::Header(name.to_string()), value.as_ref().to_vec());
        self
    }
}

impl FactSource for FakeRequest {
    fn fetch(&mut self, fact: &Fact) -> Option<Vec<u8>> {
        self.0.get(fact).cloned()
    }
}

fn engine(json: &str) -> Engine {
    Engine::new(config::parse(json.as_bytes()).unwrap())
}

/// Runs one request; returns whether it was allowed and the first rule's outcome.
fn run(engine: &Engine, store: &MemoryStore, req: &FakeRequest, now: u64) -> (bool, RuleOutcome) {
    let mut facts = Facts::new(&engine.config.facts, req.clone());
    let eval = engine.evaluate(store, &SEED, &mut facts, now);
    (!eval.denied(), eval.reports[0].outcome)
}

fn user(name: &str) -> FakeRequest {
    FakeRequest::default()
        .header(":path", "/")
        .header("x-user", name)
}

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
    let table = e.table(RuleId(0)).unwrap();
    assert_eq!(table.slots_in_use(&store).unwrap(), 100);

    // One second later every bucket is full again: new keys take idle slots over.
    let mut facts = Facts::new(&e.config.facts, user("late"));
    let eval = e.evaluate(&store, &SEED, &mut facts, T0 + 1_000_000);
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
        let mut facts = Facts::new(&e.config.facts, user("victim"));
        let eval = e.evaluate(&store, &SEED, &mut facts, T0);
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
        let mut facts = Facts::new(&e.config.facts, FakeRequest::default());
        let eval = e.evaluate(&store, &SEED, &mut facts, T0);
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

// ---- Global rules: leases, cached denials and failure modes, with the bridge's replies
// written out by hand (the real bridge is exercised by the end-to-end suite).

use weir_core::engine::{BridgeError, Evaluation, FailureOutcome, Source, BRIDGE_DOWN_KEY};
use weir_core::wire::{AcquireResponse, ItemResult, ReplyError};

fn global(extra: &str) -> Engine {
    engine(&format!(
        r#"{{"bridge":{{"cluster":"weir_bridge"}},"rules":[{{"name":"tenant","scope":"global",
            "key":[{{"header":"x-user"}}],
            "limit":{{"algorithm":"token_bucket","capacity":100,"refill":100,"period":"1m"}}{extra}}}]}}"#
    ))
}

fn eval_at(e: &Engine, store: &MemoryStore, now: u64) -> Evaluation {
    let mut facts = Facts::new(&e.config.facts, user("acme"));
    e.evaluate(store, &SEED, &mut facts, now)
}

fn granted(granted: u64, remaining: u64) -> AcquireResponse {
    AcquireResponse {
        now_us: T0,
        items: vec![ItemResult {
            allowed: true,
            granted,
            limit: 100,
            remaining,
            retry_after_ns: None,
            reset_after_ns: 1,
            lease_ttl_ns: None,
        }],
    }
}

fn denied(retry_after_ns: u64) -> AcquireResponse {
    AcquireResponse {
        now_us: T0,
        items: vec![ItemResult {
            allowed: false,
            granted: 0,
            limit: 100,
            remaining: 0,
            retry_after_ns: Some(retry_after_ns),
            reset_after_ns: 60_000_000_000,
            lease_ttl_ns: None,
        }],
    }
}

#[test]
fn exact_global_rules_ask_the_bridge_every_time() {
    let e = global("");
    let store = MemoryStore::new();
    e.prepare(&store).unwrap();
    for _ in 0..3 {
        let mut eval = eval_at(&e, &store, T0);
        assert_eq!(eval.pending.len(), 1);
        assert_eq!((eval.pending[0].cost, eval.pending[0].want), (1, 1));
        let body = String::from_utf8(e.bridge_request(&eval.pending)).unwrap();
        assert!(body.contains(r#""descriptor":["=acme"]"#), "{body}");
        assert!(body.contains(r#""algorithm":"token_bucket""#), "{body}");
        e.complete(&mut eval, &store, T0, T0, Ok(granted(1, 50)));
        assert!(!eval.denied());
        assert_eq!(eval.verdicts[0].decision.remaining, 50);
        assert_eq!(eval.reports[0].source, Some(Source::Bridge));
    }
}

#[test]
fn leases_grow_and_serve_requests_locally() {
    let e = global(r#","global":{"lease":{"max":16,"ttl":"1s"}}"#);
    let store = MemoryStore::new();
    e.prepare(&store).unwrap();
    let mut wants = Vec::new();
    let mut bridge_calls = 0;
    for i in 0..40 {
        let mut eval = eval_at(&e, &store, T0 + i);
        if let Some(item) = eval.pending.first() {
            wants.push(item.want);
            bridge_calls += 1;
            let want = item.want;
            e.complete(&mut eval, &store, T0 + i, T0 + i, Ok(granted(want, 1000)));
        } else {
            assert_eq!(eval.reports[0].source, Some(Source::Lease));
        }
        assert!(!eval.denied());
    }
    // 1 + 2 + 4 + 8 + 16 = 31 requests in 5 calls, then 16 at a time.
    assert_eq!(wants, [1, 2, 4, 8, 16, 16]);
    assert_eq!(bridge_calls, 6);
    // Leased units expire: a second later the lease is gone and the size halves.
    let eval = eval_at(&e, &store, T0 + 2_000_000);
    assert_eq!(eval.pending[0].want, 8);
}

#[test]
fn a_denial_is_cached_until_retry_after() {
    let e = global(r#","global":{"lease":{"max":16}}"#);
    let store = MemoryStore::new();
    e.prepare(&store).unwrap();
    let mut eval = eval_at(&e, &store, T0);
    e.complete(&mut eval, &store, T0, T0, Ok(denied(5_000_000_000)));
    assert!(eval.denied());
    for t in [1, 1_000_000, 4_999_999] {
        let eval = eval_at(&e, &store, T0 + t);
        assert!(eval.pending.is_empty(), "a cached denial called the bridge");
        assert!(eval.denied());
        assert_eq!(eval.reports[0].source, Some(Source::DenialCache));
        let retry = eval.verdicts[0].decision.retry_after_ns.unwrap();
        assert_eq!(retry, (5_000_000 - t) * 1_000);
    }
    assert_eq!(eval_at(&e, &store, T0 + 5_000_000).pending.len(), 1);
}

#[test]
fn failure_modes_apply_and_the_bridge_is_left_alone_for_a_while() {
    for (mode, expect_denied, expect_unavailable) in [
        ("allow", false, false),
        ("deny", false, true),
        ("local", false, false),
    ] {
        let e = global(&format!(
            r#","global":{{"failure_mode":"{mode}","expected_instances":50}}"#
        ));
        let store = MemoryStore::new();
        e.prepare(&store).unwrap();
        let mut eval = eval_at(&e, &store, T0);
        e.complete(&mut eval, &store, T0, T0, Err(ReplyError::Timeout));
        assert_eq!(eval.denied_by.is_some(), expect_denied, "{mode}");
        assert_eq!(eval.unavailable.is_some(), expect_unavailable, "{mode}");
        assert!(store.get(BRIDGE_DOWN_KEY).unwrap().0.is_some());
        // Within the backoff: no call, the failure mode again.
        let eval = eval_at(&e, &store, T0 + 10);
        assert!(
            eval.pending.is_empty(),
            "{mode}: called a bridge that just failed"
        );
        assert_eq!(eval.bridge_error, Some(BridgeError::Skipped));
        let outcome = eval.reports[0].outcome;
        match mode {
            "allow" => assert_eq!(outcome, RuleOutcome::BridgeFailed(FailureOutcome::Allowed)),
            "deny" => assert_eq!(outcome, RuleOutcome::BridgeFailed(FailureOutcome::Denied)),
            _ => assert_eq!(
                outcome,
                RuleOutcome::BridgeFailed(FailureOutcome::Local { allowed: true })
            ),
        }
        // After the backoff the bridge is asked again.
        assert_eq!(
            eval_at(&e, &store, T0 + 1_000_000).pending.len(),
            1,
            "{mode}"
        );
    }
}

#[test]
fn the_local_fallback_enforces_a_share_of_the_quota() {
    // 100 per minute over 50 instances: 2 each while the bridge is away.
    let e = global(r#","global":{"failure_mode":"local","expected_instances":50}"#);
    let store = MemoryStore::new();
    e.prepare(&store).unwrap();
    let mut allowed = 0;
    for i in 0..5 {
        let mut eval = eval_at(&e, &store, T0 + i);
        if !eval.pending.is_empty() {
            e.complete(
                &mut eval,
                &store,
                T0 + i,
                T0 + i,
                Err(ReplyError::Unavailable),
            );
        }
        allowed += usize::from(!eval.denied());
    }
    assert_eq!(allowed, 2);
}

#[test]
fn rules_after_a_bridge_denial_are_not_charged() {
    let e = engine(
        r#"{"bridge":{"cluster":"b"},"rules":[
            {"name":"first","scope":"global","limit":{"algorithm":"fixed_window","limit":5,"window":"1m"}},
            {"name":"second","scope":"global","limit":{"algorithm":"fixed_window","limit":5,"window":"1m"}}]}"#,
    );
    let store = MemoryStore::new();
    e.prepare(&store).unwrap();
    let mut facts = Facts::new(&e.config.facts, FakeRequest::default());
    let mut eval = e.evaluate(&store, &SEED, &mut facts, T0);
    assert_eq!(eval.pending.len(), 2, "both rules go in one call");
    e.complete(&mut eval, &store, T0, T0, Ok(denied(1_000)));
    assert!(eval.denied());
    assert_eq!(eval.reports.len(), 1, "the second rule was not evaluated");
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
        let mut facts = Facts::new(&e.config.facts, req);
        let eval = e.evaluate(&store, &SEED, &mut facts, T0);
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
    let e = global(r#","cost":{"header":"x-cost"}"#);
    let store = MemoryStore::new();
    e.prepare(&store).unwrap();
    for zero in ["0", "00", " 0"] {
        let mut facts = Facts::new(&e.config.facts, user("acme").header("x-cost", zero));
        let eval = e.evaluate(&store, &SEED, &mut facts, T0);
        assert_eq!((eval.pending[0].cost, eval.pending[0].want), (1, 1));
    }
}

// ---- The config checker refuses what the bridge would: every request a valid config
// builds is one the bridge accepts.

use weir_core::bounds::{MAX_BODY_BYTES, MAX_KEY_PARTS, MAX_KEY_VALUE_BYTES, MAX_RULES};
use weir_core::wire::AcquireRequest;

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
    let mut facts = Facts::new(&e.config.facts, req);
    let eval = e.evaluate(&store, &SEED, &mut facts, T0);
    assert_eq!(eval.pending.len(), MAX_RULES);
    let body = e.bridge_request(&eval.pending);
    assert!(
        body.len() <= MAX_BODY_BYTES,
        "{} bytes > {MAX_BODY_BYTES}",
        body.len()
    );
    let (request, _) = AcquireRequest::parse(&body).unwrap_or_else(|e| panic!("refused: {e}"));
    assert_eq!(
        request.items[0].cost, 1_000_000,
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
    let mut facts = Facts::new(&e.config.facts, FakeRequest::default());
    let eval = e.evaluate(&store, &SEED, &mut facts, T0);
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
    let table = e.table(RuleId(0)).unwrap();
    let exact = table.slots_in_use(&store).unwrap();
    let estimate = table.estimate_slots_in_use(&store, 256).unwrap();
    // 8,000 keys hashed into 10,000 sets: the sample of 256 sets is within a few percent.
    assert!(exact > 7_000, "{exact}");
    let error = estimate.abs_diff(exact) as f64 / exact as f64;
    assert!(error < 0.2, "estimate {estimate} vs exact {exact}");
    // A table with few sets is read whole: exact.
    assert_eq!(
        table.estimate_slots_in_use(&store, 1_000_000).unwrap(),
        exact
    );
}
