//! What the engine suites share: requests as maps of facts, an engine from JSON, the
//! instant and the seed they run at.
#![allow(dead_code)]

pub mod commits;
pub mod conformance;
pub mod fleet;
pub mod hostile_json;
pub mod places;
pub mod python_json;
pub mod search;

use std::collections::HashMap;
use weir_core::config;
use weir_core::engine::{Engine, Evaluation, RuleOutcome};
use weir_core::key::Seed;
use weir_core::rules::{Fact, FactSource};
use weir_core::store::memory::MemoryStore;
use weir_core::time::Micros;
use weir_core::worker::Worker;

pub const T0: u64 = 1_700_000_000_000_000;
pub const SEED: Seed = Seed([7; 16]);

/// A request as a map of headers (`:path`, `:method` included) and attributes.
#[derive(Default, Clone)]
pub struct FakeRequest(HashMap<Fact, Vec<u8>>);

impl FakeRequest {
    pub fn header(mut self, name: &str, value: impl AsRef<[u8]>) -> Self {
        self.0
            .insert(Fact::Header(name.to_string()), value.as_ref().to_vec());
        self
    }

    /// An Envoy attribute at `path` (dynamic metadata included), as the host returns it.
    pub fn attribute(mut self, path: &[&str], value: impl AsRef<[u8]>) -> Self {
        let path = path.iter().map(|s| s.to_string()).collect();
        self.0.insert(Fact::Property(path), value.as_ref().to_vec());
        self
    }
}

impl FactSource for FakeRequest {
    fn fetch(&mut self, fact: &Fact) -> Option<Vec<u8>> {
        self.0.get(fact).cloned()
    }
}

pub fn engine(json: &str) -> Engine {
    Engine::new(config::parse(json.as_bytes()).unwrap())
}

/// Evaluates one request at `now`, on a worker of its own: a worker that has seen no
/// demand takes nothing ahead, so every local rule decides in shared data, exactly.
pub fn evaluate(engine: &Engine, store: &MemoryStore, req: &FakeRequest, now: u64) -> Evaluation {
    evaluate_on(engine, store, &mut engine.worker(), req, now)
}

/// Evaluates one request at `now` on `worker`.
pub fn evaluate_on(
    engine: &Engine,
    store: &MemoryStore,
    worker: &mut Worker,
    req: &FakeRequest,
    now: u64,
) -> Evaluation {
    let mut facts = engine.facts(req.clone());
    engine.evaluate(store, worker, &SEED, &mut facts, Micros(now))
}

/// Runs one request; returns whether it was allowed and the first rule's outcome.
pub fn run(
    engine: &Engine,
    store: &MemoryStore,
    req: &FakeRequest,
    now: u64,
) -> (bool, RuleOutcome) {
    let eval = evaluate(engine, store, req, now);
    (!eval.denied(), eval.reports[0].outcome)
}

pub fn user(name: &str) -> FakeRequest {
    FakeRequest::default()
        .header(":path", "/")
        .header("x-user", name)
}

/// A deterministic generator (xorshift64*), so that a failure replays.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}
