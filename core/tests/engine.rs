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
use weir_core::rules::{Fact, FactSource, Facts};
use weir_core::store::memory::MemoryStore;
use weir_core::store::{Placement, Seed, SharedStore, StoreError};

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
    let table = e.table(0).unwrap();
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
    fn set(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), StoreError> {
        if self
            .flip
            .fetch_xor(true, std::sync::atomic::Ordering::SeqCst)
        {
            // Another worker wins this round with the same decision.
            let (current, version) = self.inner.get(key)?;
            self.inner.set(key, &current.unwrap_or_default(), version)?;
        }
        self.inner.set(key, value, cas)
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
