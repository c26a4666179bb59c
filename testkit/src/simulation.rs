//! Many Envoys without Envoy: each simulated Envoy runs the engine over its own shared
//! data (a [`MemoryStore`]), as the filter does, and asks a bridge — here
//! [`ModelBridge`], weir-bridge's v2 semantics over an in-process model of Redis that
//! grants with the core's own references ([`Limit::grant`], [`SlidingLog::grant`]), or
//! the real bridge in weir-bench's simulation mode.
//!
//! [`Simulation`] plays requests in time order with a bridge call latency: a call leaves,
//! Redis decides half-way, the reply lands later, and other requests go on meanwhile
//! (each call stands for one Envoy worker's; there is no single flight here, so calls for
//! one key overlap as they would across workers). The admissions it returns are what
//! [`weir_core::conformance::check`] judges.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::sync::{Arc, Mutex};

use weir_core::algorithms::GlobalLimit;
use weir_core::config;
use weir_core::conformance::Admission;
use weir_core::engine::{Engine, Evaluation, RuleOutcome};
use weir_core::flight::{Call as FlightCall, Flights, Join};
use weir_core::key::Seed;
use weir_core::rules::{FactSource, RuleId, Scope};
use weir_core::store::memory::MemoryStore;
use weir_core::time::Micros;
use weir_core::wire::{v2, ReplyError};
use weir_core::worker::Worker;

pub use crate::model_bridge::ModelBridge;

/// One Envoy worker: its engine, and its Envoy's shared data (one worker's own, or
/// shared with the other workers of its Envoy: [`Simulation::with_workers`]).
pub struct SimEnvoy {
    pub engine: Engine,
    pub store: Arc<MemoryStore>,
    worker: Mutex<Worker>,
    seed: Seed,
}

impl SimEnvoy {
    /// An Envoy running `config` (the plugin JSON), its tables prepared. The seed is
    /// this Envoy's (each Envoy process draws its own).
    pub fn new(config_json: &str, seed: Seed) -> Result<SimEnvoy, String> {
        SimEnvoy::sharing(config_json, seed, Arc::new(MemoryStore::new()))
    }

    /// A worker running `config` over `store`, its Envoy's shared data, which other
    /// workers of the same Envoy (the same `seed`) share.
    pub fn sharing(
        config_json: &str,
        seed: Seed,
        store: Arc<MemoryStore>,
    ) -> Result<SimEnvoy, String> {
        let config = config::parse(config_json.as_bytes()).map_err(|e| e.to_string())?;
        let engine = Engine::new(config);
        engine.prepare(&*store).map_err(|e| format!("{e:?}"))?;
        Ok(SimEnvoy {
            worker: Mutex::new(engine.worker()),
            engine,
            store,
            seed,
        })
    }

    /// Evaluates one request at `now_us`: decided, or `pending` for the bridge.
    pub fn evaluate<F: FactSource>(&self, request: F, now_us: u64) -> Evaluation {
        let mut facts = self.engine.facts(request);
        let mut worker = self
            .worker
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        self.engine.evaluate(
            &*self.store,
            &mut worker,
            &self.seed,
            &mut facts,
            Micros(now_us),
        )
    }

    /// The body of the bridge call for an evaluation's pending rules.
    pub fn bridge_request(&self, eval: &Evaluation) -> Vec<u8> {
        self.engine.bridge_request(&eval.pending)
    }

    /// Finishes an evaluation with the bridge's answer (HTTP status and body, as the
    /// filter reads them), or a failure to call.
    pub fn complete(
        &self,
        eval: &mut Evaluation,
        sent_at_us: u64,
        now_us: u64,
        answer: Result<(u16, &[u8]), ReplyError>,
    ) {
        let sent = self.engine.sent(&eval.pending);
        let reply = answer.and_then(|(status, body)| v2::decode_reply(status, body, &sent));
        self.engine.complete(
            eval,
            &*self.store,
            Micros(sent_at_us),
            Micros(now_us),
            reply,
        );
        self.remember_answers(eval);
    }

    /// As the filter does after a call lands: the worker keeps what Redis had left of
    /// the exact keys it answered.
    fn remember_answers(&self, eval: &Evaluation) {
        let mut worker = self
            .worker
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        self.engine.remember_answers(&mut worker, eval);
    }

    /// Finishes an evaluation with a reply already decoded.
    pub fn complete_with(
        &self,
        eval: &mut Evaluation,
        sent_at_us: u64,
        now_us: u64,
        reply: v2::Reply,
    ) {
        self.engine.complete(
            eval,
            &*self.store,
            Micros(sent_at_us),
            Micros(now_us),
            Ok(reply),
        );
        self.remember_answers(eval);
    }
}

/// The admissions an evaluation made, per rule: every rule that allowed the request
/// (shadow rules too: what they allow must keep their bound as well), with its cost and
/// the instant it decided. Requests let through by a failure mode are not the limit's
/// admissions and are left out.
pub fn admissions(eval: &Evaluation) -> Vec<(RuleId, Admission)> {
    eval.reports
        .iter()
        .filter(|r| r.outcome == RuleOutcome::Allowed)
        .map(|r| {
            let admission = Admission {
                at_us: r.decided_at_us,
                cost: r.cost,
            };
            (r.rule, admission)
        })
        .collect()
}

/// The limit a rule's admissions are checked against: the one configured (a global
/// rule's, not the one it runs with in Redis). `None` for a concurrency rule, whose
/// bound is on requests in flight, not on admissions over time.
pub fn configured_limit(engine: &Engine, rule: RuleId) -> Option<GlobalLimit> {
    match &engine.config.rule(rule)?.scope {
        Scope::Local(limit) => Some(GlobalLimit::Slot(limit.clone())),
        Scope::Global(global) => Some(global.limit.clone()),
        Scope::Concurrency(_) => None,
    }
}

/// `limit` with `extra` more bursts: the parameter its limit is made of
/// ([`weir_core::algorithms::AlgorithmSpec::limit_parameter`]) grown so that the limit is
/// `extra + 1` times its own (the GCRA burst by `extra × (burst + 1)`, a token bucket's
/// capacity or a window's limit by `extra ×` itself). A bound a little above
/// the algorithm's own, for paths documented to exceed it by that much (the local fallback
/// around an outage: docs/global.md).
pub fn with_extra_bursts(limit: &GlobalLimit, extra: u64) -> GlobalLimit {
    let spec = limit.kind().spec();
    spec.with_extra_limits(&limit.algorithm().parameters(), extra)
        .and_then(|values| GlobalLimit::build(spec.kind, &values).ok())
        .unwrap_or_else(|| limit.clone())
}

/// A request to play: when it arrives, at which Envoy.
#[derive(Clone)]
pub struct Arrival<F> {
    pub at_us: u64,
    pub envoy: usize,
    pub request: F,
}

/// What became of one request.
pub struct Decided {
    /// Its index in the arrivals played.
    pub index: usize,
    pub envoy: usize,
    pub arrived_us: u64,
    /// When it was decided: on arrival, or when the answer it waited for landed.
    pub decided_us: u64,
    pub eval: Evaluation,
}

/// Envoys sharing one model bridge, with a call latency.
pub struct Simulation {
    pub envoys: Vec<SimEnvoy>,
    pub bridge: ModelBridge,
    /// From a call leaving to Redis deciding, and again from there to the reply landing.
    pub half_latency_us: u64,
    /// Whether each Envoy shares calls as one filter worker does ([`weir_core::flight`]): a
    /// request whose keys a call of its Envoy already asks about waits for that call's
    /// answer and looks again. Off (the default), every request that misses makes its
    /// own call, so calls for one key overlap as they would across many workers.
    pub single_flight: bool,
    /// Each call's half latency varies by up to this much more (µs), drawn per call: so
    /// a plugin's measured round trip, and the holds it asks for, change as it goes.
    pub jitter_us: u64,
}

enum Event {
    Arrive(usize),
    Decide(usize),
    Land(usize),
}

struct Call {
    /// This call's half latency.
    half_latency_us: u64,
    index: usize,
    envoy: usize,
    arrived_us: u64,
    sent_at_us: u64,
    eval: Evaluation,
    reply: Option<Result<v2::Reply, (u16, String)>>,
}

impl Simulation {
    /// `n` Envoys running `config_json`, each with its own seed and one worker.
    pub fn new(config_json: &str, n: usize, half_latency_us: u64) -> Result<Simulation, String> {
        Simulation::with_workers(config_json, n, 1, half_latency_us)
    }

    /// `n` Envoys of `workers` workers each: [`Arrival::envoy`] `e · workers + w` is
    /// worker `w` of Envoy `e`. The workers of one Envoy share its seed and its shared
    /// data, and each has its own engine, calls and single flight, as in the filter.
    pub fn with_workers(
        config_json: &str,
        n: usize,
        workers: usize,
        half_latency_us: u64,
    ) -> Result<Simulation, String> {
        let mut envoys = Vec::with_capacity(n * workers);
        for i in 0..n {
            let mut seed = [0u8; 16];
            for (b, s) in seed.iter_mut().zip((i as u64 + 1).to_le_bytes()) {
                *b = s;
            }
            let store = Arc::new(MemoryStore::new());
            for _ in 0..workers.max(1) {
                envoys.push(SimEnvoy::sharing(
                    config_json,
                    Seed(seed),
                    Arc::clone(&store),
                )?);
            }
        }
        Ok(Simulation {
            envoys,
            bridge: ModelBridge::default(),
            half_latency_us,
            single_flight: false,
            jitter_us: 0,
        })
    }

    /// The half latency of call number `call`: the base, plus its share of the jitter.
    fn half_latency_of(&self, call: usize) -> u64 {
        if self.jitter_us == 0 {
            return self.half_latency_us;
        }
        // splitmix64 of the call's number: the same run gives the same latencies.
        let mut z = (call as u64)
            .wrapping_add(1)
            .wrapping_mul(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        self.half_latency_us + z % (self.jitter_us + 1)
    }

    /// Sends the call of request `index` (of `envoy`, arrived at `arrived_us`) at
    /// `now_us` as the next of `calls`; returns when Redis decides it.
    fn send(
        &self,
        calls: &mut Vec<Option<Call>>,
        (index, envoy, arrived_us): (usize, usize, u64),
        now_us: u64,
        mut eval: Evaluation,
    ) -> u64 {
        if let Some(sim) = self.envoys.get(envoy) {
            sim.engine
                .note_call_sent(&mut eval, &*sim.store, Micros(now_us));
        }
        let half_latency_us = self.half_latency_of(calls.len());
        calls.push(Some(Call {
            half_latency_us,
            index,
            envoy,
            arrived_us,
            sent_at_us: now_us,
            eval,
            reply: None,
        }));
        now_us + half_latency_us
    }

    /// Plays `arrivals` (any order) to the end: every request decided, every call landed.
    /// Returns each request's evaluation, in the order they finished.
    pub fn play<F: FactSource + Clone>(&mut self, arrivals: &[Arrival<F>]) -> Vec<Decided> {
        self.run(arrivals.iter().map(Arrival::clone).collect(), None)
    }

    /// Plays a closed loop, as wrk drives Envoy: each of `clients` sends its request
    /// when it arrives, and again `think_us` after each answer, until `until_us`. A
    /// limiter that keeps requests waiting is offered less: what it is offered depends on
    /// how fast it answers. Returns each request's evaluation, in the order they finished
    /// ([`Decided::index`] counts requests in the order they were sent, clients first).
    pub fn play_closed<F: FactSource + Clone>(
        &mut self,
        clients: &[Arrival<F>],
        think_us: u64,
        until_us: u64,
    ) -> Vec<Decided> {
        let clients = clients.iter().map(Arrival::clone).collect();
        self.run(clients, Some((think_us, until_us)))
    }

    fn run<F: FactSource + Clone>(
        &mut self,
        mut arrivals: Vec<Arrival<F>>,
        closed: Option<(u64, u64)>,
    ) -> Vec<Decided> {
        let mut queue: BinaryHeap<Reverse<(u64, u64, usize)>> = BinaryHeap::new();
        let mut events: Vec<Event> = Vec::new();
        let mut calls: Vec<Option<Call>> = Vec::new();
        let push = |queue: &mut BinaryHeap<_>, events: &mut Vec<Event>, at: u64, e: Event| {
            let seq = events.len() as u64;
            queue.push(Reverse((at, seq, events.len())));
            events.push(e);
        };
        for (i, a) in arrivals.iter().enumerate() {
            push(&mut queue, &mut events, a.at_us, Event::Arrive(i));
        }
        let mut decided: Vec<Decided> = Vec::with_capacity(arrivals.len());
        // Single flight: each Envoy's calls that others may join, and the requests
        // waiting on them (by arrival index).
        let mut flights: Vec<Flights> = self.envoys.iter().map(|_| Flights::default()).collect();
        let mut waiting: BTreeMap<u32, (u64, Evaluation)> = BTreeMap::new();
        let mut answered = 0;
        loop {
            // A closed loop: each request answered sends its client's next one.
            if let Some((think_us, until_us)) = closed {
                for d in decided.get(answered..).unwrap_or_default() {
                    let at_us = d.decided_us.saturating_add(think_us);
                    let Some(client) = arrivals.get(d.index) else {
                        continue;
                    };
                    if at_us < until_us {
                        let next = Arrival {
                            at_us,
                            ..client.clone()
                        };
                        push(
                            &mut queue,
                            &mut events,
                            at_us,
                            Event::Arrive(arrivals.len()),
                        );
                        arrivals.push(next);
                    }
                }
                answered = decided.len();
            }
            let Some(Reverse((now_us, _, at))) = queue.pop() else {
                break;
            };
            let Some(event) = events.get(at) else {
                continue;
            };
            match *event {
                Event::Arrive(index) => {
                    let Some(arrival) = arrivals.get(index) else {
                        continue;
                    };
                    let Some(envoy) = self.envoys.get(arrival.envoy) else {
                        continue;
                    };
                    let mut eval = envoy.evaluate(arrival.request.clone(), now_us);
                    let at_once = |eval| Decided {
                        index,
                        envoy: arrival.envoy,
                        arrived_us: now_us,
                        decided_us: now_us,
                        eval,
                    };
                    if eval.pending.is_empty() {
                        decided.push(at_once(eval));
                        continue;
                    }
                    let waiter = u32::try_from(index).unwrap_or(u32::MAX);
                    let Some(flights) = flights.get_mut(arrival.envoy) else {
                        continue;
                    };
                    if self.single_flight {
                        match envoy.join(flights, &mut waiting, (waiter, now_us), eval) {
                            Some(alone) => eval = alone,
                            None => continue,
                        }
                    }
                    let call = calls.len();
                    if self.single_flight {
                        flights.start(call as u32, flight_call(&envoy.engine, &eval, now_us));
                    }
                    let at = self.send(&mut calls, (index, arrival.envoy, now_us), now_us, eval);
                    push(&mut queue, &mut events, at, Event::Decide(call));
                }
                Event::Decide(call) => {
                    let Some(Some(c)) = calls.get_mut(call) else {
                        continue;
                    };
                    let Some(envoy) = self.envoys.get(c.envoy) else {
                        continue;
                    };
                    let body = envoy.bridge_request(&c.eval);
                    c.reply = Some(self.bridge.acquire(&body, now_us));
                    let at = now_us + c.half_latency_us;
                    push(&mut queue, &mut events, at, Event::Land(call));
                }
                Event::Land(call) => {
                    let Some(mut c) = calls.get_mut(call).and_then(Option::take) else {
                        continue;
                    };
                    let Some(envoy) = self.envoys.get(c.envoy) else {
                        continue;
                    };
                    match c.reply.take() {
                        Some(Ok(reply)) => {
                            envoy.complete_with(&mut c.eval, c.sent_at_us, now_us, reply)
                        }
                        Some(Err((status, body))) => envoy.complete(
                            &mut c.eval,
                            c.sent_at_us,
                            now_us,
                            Ok((status, body.as_bytes())),
                        ),
                        None => {}
                    }
                    decided.push(Decided {
                        index: c.index,
                        envoy: c.envoy,
                        arrived_us: c.arrived_us,
                        decided_us: now_us,
                        eval: c.eval,
                    });
                    // Its waiters look again: served from what it brought back, or they
                    // make their own calls.
                    let Some(flights) = flights.get_mut(c.envoy) else {
                        continue;
                    };
                    let waiters = flights
                        .land(call as u32)
                        .map(|landed| landed.waiters)
                        .unwrap_or_default();
                    let count = waiters.len();
                    let envoy_index = c.envoy;
                    let done = |index, arrived_us, eval| Decided {
                        index,
                        envoy: envoy_index,
                        arrived_us,
                        decided_us: now_us,
                        eval,
                    };
                    for (looked, waiter) in waiters.into_iter().enumerate() {
                        let Some((arrived_us, mut eval)) = waiting.remove(&waiter) else {
                            continue;
                        };
                        let still = (count - looked) as u64;
                        envoy
                            .engine
                            .revisit(&mut eval, &*envoy.store, Micros(now_us), still);
                        let index = waiter as usize;
                        if eval.pending.is_empty() {
                            decided.push(done(index, arrived_us, eval));
                            continue;
                        }
                        // As the filter: the first of them to miss again makes a call,
                        // and the others join it.
                        let joined = envoy.join(flights, &mut waiting, (waiter, arrived_us), eval);
                        let Some(eval) = joined else {
                            continue;
                        };
                        let own = calls.len();
                        flights.start(own as u32, flight_call(&envoy.engine, &eval, now_us));
                        let at = self.send(&mut calls, (index, c.envoy, arrived_us), now_us, eval);
                        push(&mut queue, &mut events, at, Event::Decide(own));
                    }
                }
            }
        }
        decided
    }
}

impl SimEnvoy {
    /// As the filter: a request whose keys a call of this Envoy already asks about waits
    /// on it (kept with the `waiting` requests: `None`), unless no such call has room for
    /// a waiter: then it makes its own, which others join (its evaluation comes back).
    fn join(
        &self,
        flights: &mut Flights,
        waiting: &mut BTreeMap<u32, (u64, Evaluation)>,
        (waiter, arrived_us): (u32, u64),
        eval: Evaluation,
    ) -> Option<Evaluation> {
        let shared = |rule| self.engine.shares_calls(rule);
        match flights.join(waiter, &eval.pending, shared) {
            Join::Waiting(_) => {
                waiting.insert(waiter, (arrived_us, eval));
                None
            }
            Join::Alone => Some(eval),
        }
    }
}

/// What [`Flights`] keeps of a call: the keys others may wait on (the simulation keeps
/// the evaluation itself).
fn flight_call(engine: &Engine, eval: &Evaluation, now_us: u64) -> FlightCall {
    FlightCall {
        owner: 0,
        sent_at: Micros(now_us),
        eval: Evaluation::default(),
        keys: eval
            .pending
            .iter()
            .filter(|item| engine.shares_calls(item.rule))
            .map(|item| (item.rule, item.hash))
            .collect(),
        waiters: Vec::new(),
        resent: false,
    }
}
