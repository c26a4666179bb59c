//! Units outstanding (`weir_core::engine` `outstanding.rs`): random traffic through the
//! engine — two workers of one Envoy, a local rule with reservoirs and a delay, a global
//! rule with leases behind a model bridge with latency, requests joining a call in flight
//! for their key as the filter's do — and, at every step, the sum of
//! every change the engine reported (drained as the filter drains them) must equal a
//! count taken from the tables themselves: units in the workers' reservoirs, units in the
//! lease slots in shared data, units of the requests held now (by the test's own list).
//! When the traffic stops and the units' time is over, the sweep brings both to 0.
#![cfg(not(target_arch = "wasm32"))]

use crate::support;

use std::collections::BTreeMap;

use support::{engine, user, Rng, SEED, T0};
use weir_core::engine::{Engine, Evaluation, LEASE_SETS_PER_SWEEP};
use weir_core::flight::{Call as FlightCall, Flights, Join};
use weir_core::rules::RuleId;
use weir_core::store::memory::MemoryStore;
use weir_core::time::Micros;
use weir_core::wire::ReplyError;
use weir_core::worker::Worker;
use weir_testkit::simulation::ModelBridge;

#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test as test;

const MS: u64 = 1_000;
const LOCAL: RuleId = RuleId(0);
const GLOBAL: RuleId = RuleId(1);

/// A random config: a local GCRA or token bucket with reservoirs (few keys per worker,
/// so entries are evicted) and maybe a delay; a global rule with leases (a small lease
/// table, so slots are taken from other keys).
fn config(rng: &mut Rng) -> String {
    let local_limit = if rng.below(2) == 0 {
        format!(
            r#"{{"algorithm":"gcra","rate":{},"period":"{}ms","burst":{}}}"#,
            1 + rng.below(50),
            100 + rng.below(900),
            rng.below(20)
        )
    } else {
        format!(
            r#"{{"algorithm":"token_bucket","capacity":{},"refill":{},"period":"{}ms"}}"#,
            1 + rng.below(30),
            1 + rng.below(10),
            50 + rng.below(500)
        )
    };
    let delay = if rng.below(3) > 0 {
        format!(
            r#","on_limit":{{"delay":{{"max":"{}ms","queue":{}}}}}"#,
            20 + rng.below(300),
            1 + rng.below(6)
        )
    } else {
        String::new()
    };
    let global_limit = match rng.below(3) {
        0 => format!(
            r#"{{"algorithm":"gcra","rate":{},"period":"1s","burst":{}}}"#,
            20 + rng.below(200),
            10 + rng.below(40)
        ),
        1 => format!(
            r#"{{"algorithm":"token_bucket","capacity":{},"refill":{},"period":"1s"}}"#,
            10 + rng.below(100),
            10 + rng.below(100)
        ),
        _ => format!(
            r#"{{"algorithm":"fixed_window","limit":{},"window":"{}ms"}}"#,
            5 + rng.below(100),
            100 + rng.below(900)
        ),
    };
    format!(
        r#"{{"bridge":{{"cluster":"weir_bridge"}},"rules":[
            {{"name":"local","key":[{{"header":"x-user"}}],"cost":{{"header":"x-cost","max":3}},
              "limit":{local_limit},
              "reservoir":{{"max":{},"hold":"{}ms","max_keys":{}}}{delay}}},
            {{"name":"global","scope":"global","key":[{{"header":"x-user"}}],"max_keys":{},
              "cost":{{"header":"x-cost","max":3}},"limit":{global_limit},
              "global":{{"lease":{{"max":{},"ttl":"{}ms"}}}}}}]}}"#,
        1 + rng.below(20),
        1 + rng.below(50),
        4 * (1 + rng.below(2)),
        4 * (1 + rng.below(2)),
        1 + rng.below(40),
        5 + rng.below(60),
    )
}

enum Event {
    Arrive { worker: usize, user: u64, cost: u64 },
    Land { call: usize },
    Release { context: u32 },
    Sweep { worker: usize },
    NewSeed { worker: usize },
}

struct Call {
    worker: usize,
    sent_at_us: u64,
    eval: Evaluation,
    request: support::FakeRequest,
}

struct Run<'e> {
    e: &'e Engine,
    store: MemoryStore,
    workers: Vec<Worker>,
    bridge: ModelBridge,
    /// The sum of every change reported, per rule (what the gauge shows).
    gauge: BTreeMap<RuleId, i64>,
    /// Held requests by context: the evaluation, its worker, its request and the
    /// units the test itself knows it holds (its cost).
    held: BTreeMap<u32, (Evaluation, usize, support::FakeRequest, u64)>,
    calls: Vec<Option<Call>>,
    /// Each worker's calls others may join (single flight, as the filter), and the
    /// requests waiting on them by context: the evaluation and its request.
    flights: Vec<Flights>,
    waiting: BTreeMap<u32, (Evaluation, support::FakeRequest)>,
    events: BTreeMap<(u64, u64), Event>,
    seq: u64,
    next_context: u32,
    rng: Rng,
    steps: u64,
}

impl Run<'_> {
    fn at(&mut self, at_us: u64, event: Event) {
        self.events.insert((at_us, self.seq), event);
        self.seq += 1;
    }

    fn drain(&mut self, eval: &mut Evaluation) {
        let gauge = &mut self.gauge;
        eval.drain_outstanding(|rule, units| *gauge.entry(rule).or_default() += units);
    }

    fn add(&mut self, rule: RuleId, units: i64) {
        *self.gauge.entry(rule).or_default() += units;
    }

    /// What the tables hold, counted from them.
    fn counted(&self) -> (i64, i64) {
        let reservoirs: u64 = self
            .workers
            .iter()
            .flat_map(|w| w.reservoirs.units_held())
            .filter(|&(rule, _)| rule == LOCAL)
            .map(|(_, units)| units)
            .sum();
        let held: u64 = self.held.values().map(|h| h.3).sum();
        let leases = self.e.lease_units_held(&self.store, GLOBAL).unwrap();
        ((reservoirs + held) as i64, leases as i64)
    }

    fn check(&mut self, what: &str) {
        self.steps += 1;
        let gauge = (
            self.gauge.get(&LOCAL).copied().unwrap_or(0),
            self.gauge.get(&GLOBAL).copied().unwrap_or(0),
        );
        assert_eq!(
            gauge,
            self.counted(),
            "after {what} (step {}): (local, global) reported vs counted",
            self.steps
        );
    }

    /// An evaluation after a step: drained, then held, sent to the bridge, or done.
    fn go_on(
        &mut self,
        mut eval: Evaluation,
        worker: usize,
        request: support::FakeRequest,
        now: u64,
    ) {
        self.drain(&mut eval);
        if let Some(h) = eval.held {
            let context = self.next_context;
            self.next_context += 1;
            assert!(self.workers[worker]
                .waiting
                .hold(context, h.rule, h.hold.due_us, h.turn));
            let cost: u64 = std::str::from_utf8(&request_cost(&request))
                .unwrap()
                .parse()
                .unwrap();
            if self.rng.below(8) == 0 {
                // The client leaves: the filter subtracts its units.
                self.workers[worker].waiting.forget(context);
                self.add(h.rule, -(h.units() as i64));
                assert_eq!(h.units(), cost);
                return;
            }
            self.held.insert(context, (eval, worker, request, cost));
            // Mostly on time, sometimes too late for its slot.
            let late = if self.rng.below(6) == 0 {
                5 * MS
            } else {
                self.rng.below(2 * MS)
            };
            self.at(h.hold.due_us + late, Event::Release { context });
            return;
        }
        if !eval.pending.is_empty() {
            let context = self.next_context;
            self.next_context += 1;
            let e = self.e;
            match self.flights[worker].join(context, &eval.pending, |rule| e.shares_calls(rule)) {
                Join::Waiting(_) => {
                    self.waiting.insert(context, (eval, request));
                    return;
                }
                Join::Alone => {}
            }
            self.e.note_call_sent(&mut eval, &self.store, Micros(now));
            self.drain(&mut eval);
            let call = self.calls.len();
            let keys = eval
                .pending
                .iter()
                .filter(|item| e.shares_calls(item.rule))
                .map(|item| (item.rule, item.hash))
                .collect();
            self.flights[worker].start(
                call as u32,
                FlightCall {
                    owner: context,
                    sent_at: Micros(now),
                    eval: Evaluation::default(),
                    keys,
                    waiters: Vec::new(),
                    resent: false,
                },
            );
            let latency = self.rng.below(4 * MS);
            self.calls.push(Some(Call {
                worker,
                sent_at_us: now,
                eval,
                request,
            }));
            self.at(now + latency, Event::Land { call });
        }
    }

    fn step(&mut self, now: u64, event: Event) {
        match event {
            Event::Arrive {
                worker,
                user: u,
                cost,
            } => {
                let request = user(&format!("u{u}")).header("x-cost", cost.to_string());
                let mut facts = self.e.facts(request.clone());
                let eval = self.e.evaluate(
                    &self.store,
                    &mut self.workers[worker],
                    &SEED,
                    &mut facts,
                    Micros(now),
                );
                self.go_on(eval, worker, request, now);
                self.check("an arrival");
            }
            Event::Land { call } => {
                let c = self.calls[call].take().unwrap();
                let mut eval = c.eval;
                // Redis decides half-way.
                let decided_us = (c.sent_at_us + now) / 2;
                let body = self.e.bridge_request(&eval.pending);
                let reply = match self.bridge.acquire(&body, decided_us) {
                    Ok(reply) => Ok(reply),
                    Err(_) => Err(ReplyError::Unavailable),
                };
                self.e.complete(
                    &mut eval,
                    &self.store,
                    Micros(c.sent_at_us),
                    Micros(now),
                    reply,
                );
                self.go_on(eval, c.worker, c.request, now);
                self.check("a reply");
                // Its waiters look again, as the filter's: served from what it brought,
                // or a call of their own (which the next of them joins).
                let waiters = self.flights[c.worker]
                    .land(call as u32)
                    .map(|landed| landed.waiters)
                    .unwrap_or_default();
                let count = waiters.len();
                for (looked, waiter) in waiters.into_iter().enumerate() {
                    let (mut eval, request) = self.waiting.remove(&waiter).unwrap();
                    let still = (count - looked) as u64;
                    self.e.revisit(&mut eval, &self.store, Micros(now), still);
                    self.go_on(eval, c.worker, request, now);
                    self.check("a waiter's second look");
                }
            }
            Event::Release { context } => {
                let (mut eval, worker, request, _) = self.held.remove(&context).unwrap();
                assert!(self.workers[worker].waiting.forget(context).is_some());
                let mut facts = self.e.facts(request.clone());
                self.e.release(
                    &mut eval,
                    &self.store,
                    &mut self.workers[worker],
                    &SEED,
                    &mut facts,
                    Micros(now),
                );
                self.go_on(eval, worker, request, now);
                self.check("a release");
            }
            Event::Sweep { worker } => {
                for expired in
                    self.e
                        .expire_outstanding(&self.store, &mut self.workers[worker], Micros(now))
                {
                    assert!(expired.units > 0);
                    self.add(expired.rule, -(expired.units as i64));
                }
                self.check("a sweep");
            }
            Event::NewSeed { worker } => {
                for (rule, lost) in self.workers[worker].reservoirs.clear() {
                    self.add(rule, -(lost as i64));
                }
                self.check("a new seed");
            }
        }
    }
}

fn request_cost(request: &support::FakeRequest) -> Vec<u8> {
    use weir_core::rules::{Fact, FactSource};
    request
        .clone()
        .fetch(&Fact::Header("x-cost".to_string()))
        .unwrap()
}

/// One random run; returns how many steps were checked and whether the tables held
/// units at some point (the test must not pass vacuously).
fn run_case(case: u64) -> (u64, bool, bool) {
    let mut rng = Rng(0x0075_7a4d_1e55 ^ case.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    // Draws the config accepts (a cost above what a lease can serve is refused).
    let json = (0..100)
        .map(|_| config(&mut rng))
        .find(|json| weir_core::config::parse(json.as_bytes()).is_ok())
        .expect("a config the compiler accepts");
    let e = engine(&json);
    let store = MemoryStore::new();
    e.prepare(&store).unwrap();
    let workers = (0..2).map(|_| e.worker()).collect();
    let mut run = Run {
        e: &e,
        store,
        workers,
        bridge: ModelBridge::default(),
        gauge: BTreeMap::new(),
        held: BTreeMap::new(),
        calls: Vec::new(),
        flights: vec![Flights::default(), Flights::default()],
        waiting: BTreeMap::new(),
        events: BTreeMap::new(),
        seq: 0,
        next_context: 1,
        rng: Rng(rng.next() | 1),
        steps: 0,
    };
    // Bursts and idle gaps, over a dozen users.
    let mut now = T0;
    for _ in 0..600 {
        now += if rng.below(10) == 0 {
            rng.below(300 * MS)
        } else {
            rng.below(3 * MS)
        };
        let worker = rng.below(2) as usize;
        let event = match rng.below(40) {
            0..=2 => Event::Sweep { worker },
            3 => Event::NewSeed { worker },
            _ => Event::Arrive {
                worker,
                user: rng.below(12),
                cost: 1 + rng.below(3),
            },
        };
        run.at(now, event);
    }
    let (mut saw_local, mut saw_global) = (false, false);
    while let Some(((at, _), event)) = run.events.pop_first() {
        run.step(at, event);
        let (local, global) = run.counted();
        saw_local |= local > 0;
        saw_global |= global > 0;
    }
    // Traffic over, every held request released: once the units' time is over, a sweep
    // of every set by both workers leaves nothing outstanding.
    let end = now + 10_000 * MS;
    let sets = 8 / 4 + 1;
    for worker in 0..2 {
        for _ in 0..=sets / LEASE_SETS_PER_SWEEP + 1 {
            run.step(end, Event::Sweep { worker });
        }
    }
    assert_eq!(
        run.counted(),
        (0, 0),
        "{json}: nothing left after the sweep"
    );
    assert!(run.gauge.values().all(|&units| units == 0), "{json}");
    (run.steps, saw_local, saw_global)
}

#[test]
fn reported_changes_add_up_to_what_reservoirs_leases_and_held_requests_hold() {
    let (mut steps, mut local, mut global) = (0, 0, 0);
    for case in 0..60 {
        let (s, l, g) = run_case(case);
        steps += s;
        local += u64::from(l);
        global += u64::from(g);
    }
    eprintln!("{steps} steps checked; cases holding units: local {local}, global {global}");
    assert!(steps > 30_000, "{steps} steps checked");
    assert!(
        local > 40 && global > 40,
        "cases holding units: local {local}, global {global}"
    );
}
