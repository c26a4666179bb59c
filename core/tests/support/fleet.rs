//! A fleet of scripted Envoys: the filter's whole lifecycle (`weir_core::filter`, over
//! the scripted host) on several Envoys of one or more workers each, against the model
//! of weir-bridge, in simulated time — and a record of **what happened**, kept by the
//! harness, never read from the engine's labels.
//!
//! - **Clients** send what a [`Plan`] says: headers, a body in pieces, at an instant, on
//!   a worker; crowds are many plans at one instant.
//! - **Envoy** is [`Envoy`]'s script: it pauses, buffers, holds, resumes and answers as
//!   the filter says, and records what reached the upstream.
//! - **The bridge** answers each call after a latency (half to Redis, half back), from
//!   [`ModelBridge`]; the harness injects what a bridge does wrong — an outage (its own
//!   503), a call slower than its timeout (Envoy's 504), a reset — and records each
//!   as an [`Excuse`]. A circuit breaker (Envoy refusing calls beyond a number in
//!   flight) is Envoy's, not the bridge's, and is no excuse.
//! - **The upstream** answers each request that reached it as its plan says: a usage, its
//!   own 5xx, Envoy's local reply (a route timeout's 504), or a client that leaves.
//!
//! What comes out ([`Outcome`]) is, per request: when it reached the upstream (it was
//! admitted), the body the upstream received, whether a denied request's body leaked,
//! what the client was answered, the instants the filter wrote for its decisions
//! (checked against the harness's own bounds: arrival to admission), when its response
//! ended — and, per `/v3/commit` call, when the model bridge ran its settles
//! ([`SettleCall`]): the instants a commit lands, for local rules and global ones.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::sync::Arc;

use weir_core::store::memory::MemoryStore;
use weir_core::wire::{v2, v3};
use weir_scripted::scripted_envoy::Envoy;
use weir_scripted::scripted_host::Dispatched;
use weir_testkit::simulation::ModelBridge;

/// One request, as its client plays it.
#[derive(Clone, Debug)]
pub struct Plan {
    pub at_us: u64,
    /// The worker it arrives at: `envoy × workers + worker`.
    pub worker: usize,
    pub headers: Vec<(String, String)>,
    /// Its body, in the pieces the client sends (all at `at_us`); `None`: no body.
    pub body: Option<Vec<Vec<u8>>>,
    pub response: Respond,
}

/// What the upstream (or Envoy, or the client) does once a request reached it.
#[derive(Clone, Debug)]
pub enum Respond {
    /// The upstream answers `status` after `after_us`, with these headers and body.
    Upstream {
        after_us: u64,
        status: u16,
        headers: Vec<(String, String)>,
        body: Vec<u8>,
    },
    /// Envoy answers itself after `after_us` (its 504 for a route timeout): the
    /// upstream was reached and may still be working.
    Local { after_us: u64, status: u16 },
    /// The client goes away after `after_us`, before any response.
    Leaves { after_us: u64 },
}

/// A bridge fault the harness caused: the Envoy whose call it was, and the instant it
/// landed there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Excuse {
    pub envoy: usize,
    pub at_us: u64,
}

/// One decision the filter wrote in the filter state `weir.decisions`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Written {
    pub rule: String,
    pub outcome: String,
    pub source: String,
    pub cost: u64,
    pub at_us: u64,
}

/// A `/v3/commit` call, as the harness saw it: the worker that made it, when, and when
/// the model bridge ran its settles in Redis (`None`: the harness reset the call, or the
/// bridge failed it: an outage's 503; a call Envoy gave up on still runs, as Redis
/// does). Its items are what the bridge settled: each a key, its reservation and the
/// actual cost.
#[derive(Clone, Debug)]
pub struct SettleCall {
    pub worker: usize,
    pub dispatched_us: u64,
    pub ran_us: Option<u64>,
    pub items: Vec<SettledItem>,
}

/// One settle a `/v3/commit` call carried.
#[derive(Clone, Debug)]
pub struct SettledItem {
    pub descriptor: Vec<String>,
    pub reserved: u64,
    pub actual: u64,
}

/// What became of one request.
#[derive(Clone, Debug, Default)]
pub struct Outcome {
    pub arrived_us: u64,
    /// When the whole request went on to the upstream: it was admitted.
    pub admitted_us: Option<u64>,
    /// The body the upstream received.
    pub upstream_body: Vec<u8>,
    /// Body bytes reached the upstream though the request was answered here (or never
    /// admitted): a leak.
    pub leaked: bool,
    /// The status the filter answered, when it did.
    pub answered: Option<u32>,
    /// The decisions the filter wrote (its own words: checked, never trusted).
    pub written: Vec<Written>,
    /// Still undecided when the run ended.
    pub stuck: bool,
    /// When its response ended, once it was admitted: the upstream's answer, Envoy's
    /// reply or the client leaving (a local rule's commit lands then).
    pub ended_us: Option<u64>,
}

/// How the bridge and Envoy's side behave.
#[derive(Clone, Debug)]
pub struct BridgeModel {
    /// From a call leaving to Redis deciding, and again back, µs.
    pub half_latency_us: u64,
    /// Each call's half latency is up to this much longer.
    pub jitter_us: u64,
    /// Redis time spans `[from, to)` the bridge answers 503.
    pub outages: Vec<(u64, u64)>,
    /// One call in this many is reset before any response (0: none).
    pub reset_one_in: u64,
    /// Envoy refuses a worker's calls beyond this many in flight (a circuit breaker).
    pub circuit_breaker: Option<usize>,
}

enum Event {
    Arrive(usize),
    /// A call's answer reaches Redis (decide) or comes back (land).
    Decide {
        worker: usize,
        token: u32,
    },
    Land {
        worker: usize,
        token: u32,
    },
    /// Envoy gives up on a call: its 504.
    Timeout {
        worker: usize,
        token: u32,
    },
    Respond(usize),
    Tick(usize),
}

struct Worker {
    envoy: Envoy,
    /// The Envoy process it belongs to.
    process: usize,
    /// Calls the harness has taken up: the first this many the worker made.
    seen_calls: usize,
    /// Answers decided and not landed yet, by token.
    replies: BTreeMap<u32, (u16, Vec<u8>)>,
    /// The tick pending for it, if any.
    tick_at: Option<u64>,
    /// When a request or call of it last ended: it ticks for a while after (commits
    /// to send, stats).
    active_us: u64,
    /// Requests not settled yet: plan index by context.
    open: BTreeMap<u32, usize>,
}

/// Envoys of `workers` workers each, running `config`, against the model bridge.
pub struct Fleet {
    workers: Vec<Worker>,
    pub bridge: ModelBridge,
    model: BridgeModel,
    events: BTreeMap<(u64, u64), Event>,
    seq: u64,
    calls: u64,
    pub excuses: Vec<Excuse>,
    pub outcomes: Vec<Outcome>,
    /// Every `/v3/commit` call the workers made, in the order they made them.
    pub settles: Vec<SettleCall>,
    /// The index in `settles` of a commit call, by worker and token.
    settle_calls: BTreeMap<(usize, u32), usize>,
    contexts: Vec<Option<(usize, u32)>>,
    /// Bridge calls the bridge refused (400): a request of a config the check
    /// accepted that the bridge will not decide.
    pub refused_by_bridge: Vec<String>,
    /// Reads or writes of a request body Envoy no longer held for the filter: each
    /// would have crashed Envoy.
    pub dangling_body: u32,
    /// What the upstream does with each request that reached it (from its plan, or
    /// from the upstream given to [`Fleet::play_with`] when it was admitted).
    responses: Vec<Option<Respond>>,
    /// Each call's half latency, by worker and token.
    halves: BTreeMap<(usize, u32), u64>,
    /// Events other than ticks still to come, and when the last one happened.
    pending: usize,
    last_busy_us: u64,
}

/// How long ticks go on after the last event that was not a tick: the longest a request
/// may wait on anything but the tick (a hold is released by a tick, and schedules one).
const TICKS_AFTER_US: u64 = 120_000_000;

/// The instant the run starts from (any: the clock is simulated).
pub const FLEET_T0: u64 = 1_700_000_000_000_000;

impl Fleet {
    pub fn new(
        config: &str,
        envoys: usize,
        workers: usize,
        model: BridgeModel,
    ) -> Result<Fleet, String> {
        let mut all = Vec::new();
        for process in 0..envoys {
            let store = Arc::new(MemoryStore::new());
            for _ in 0..workers.max(1) {
                let mut envoy = Envoy::worker(config, Arc::clone(&store))?;
                envoy.set_now_us(FLEET_T0);
                envoy.host.state().refuse.calls_in_flight = model.circuit_breaker;
                all.push(Worker {
                    envoy,
                    process,
                    seen_calls: 0,
                    replies: BTreeMap::new(),
                    tick_at: None,
                    active_us: 0,
                    open: BTreeMap::new(),
                });
            }
        }
        Ok(Fleet {
            workers: all,
            bridge: ModelBridge::default(),
            model,
            events: BTreeMap::new(),
            seq: 0,
            calls: 0,
            excuses: Vec::new(),
            outcomes: Vec::new(),
            settles: Vec::new(),
            settle_calls: BTreeMap::new(),
            contexts: Vec::new(),
            refused_by_bridge: Vec::new(),
            dangling_body: 0,
            responses: Vec::new(),
            halves: BTreeMap::new(),
            pending: 0,
            last_busy_us: 0,
        })
    }

    fn at(&mut self, at_us: u64, event: Event) {
        if !matches!(event, Event::Tick(_)) {
            self.pending += 1;
        }
        self.events.insert((at_us, self.seq), event);
        self.seq += 1;
    }

    /// Plays `plans` to the end: every request decided and answered, every call landed.
    pub fn play(&mut self, plans: &[Plan]) {
        self.play_with(plans, &mut |i, _| plans[i].response.clone());
    }

    /// [`Fleet::play`], with an upstream that decides how to answer request `i` from the
    /// body it received, when it is admitted.
    pub fn play_with(&mut self, plans: &[Plan], upstream: &mut dyn FnMut(usize, &[u8]) -> Respond) {
        self.outcomes = vec![Outcome::default(); plans.len()];
        self.contexts = vec![None; plans.len()];
        self.responses = vec![None; plans.len()];
        for (i, plan) in plans.iter().enumerate() {
            self.at(plan.at_us, Event::Arrive(i));
        }
        while let Some(((now, _), event)) = self.events.pop_first() {
            if !matches!(event, Event::Tick(_)) {
                self.pending -= 1;
                self.last_busy_us = now;
            }
            for w in &mut self.workers {
                w.envoy.set_now_us(now);
            }
            match event {
                Event::Arrive(i) => self.arrive(plans, i, now),
                Event::Decide { worker, token } => self.decide(worker, token, now),
                Event::Land { worker, token } => {
                    let w = &mut self.workers[worker];
                    if let Some((status, body)) = w.replies.remove(&token) {
                        if status != 200 {
                            let process = w.process;
                            self.excuses.push(Excuse {
                                envoy: process,
                                at_us: now,
                            });
                        }
                        self.workers[worker].envoy.answer(token, status, &body);
                    }
                }
                Event::Timeout { worker, token } => {
                    let w = &mut self.workers[worker];
                    let open = call(&w.envoy, token).is_some_and(|c| !c.answered);
                    if open {
                        w.replies.remove(&token);
                        let process = w.process;
                        w.envoy.answer(token, 504, b"upstream request timeout");
                        self.excuses.push(Excuse {
                            envoy: process,
                            at_us: now,
                        });
                    }
                }
                Event::Respond(i) => self.respond(i, now),
                Event::Tick(worker) => {
                    let w = &mut self.workers[worker];
                    w.tick_at = None;
                    let root = w.envoy.root;
                    w.envoy.tick(root);
                }
            }
            self.after(now, upstream);
        }
        self.dangling_body = self
            .workers
            .iter()
            .map(|w| w.envoy.host.state().dangling_body)
            .sum();
        for w in &self.workers {
            for &i in w.open.values() {
                self.outcomes[i].stuck =
                    self.outcomes[i].admitted_us.is_none() && self.outcomes[i].answered.is_none();
            }
        }
    }

    fn arrive(&mut self, plans: &[Plan], i: usize, now: u64) {
        let plan = &plans[i];
        let headers: Vec<(&str, &str)> = plan
            .headers
            .iter()
            .map(|(n, v)| (n.as_str(), v.as_str()))
            .collect();
        let w = &mut self.workers[plan.worker];
        self.outcomes[i].arrived_us = now;
        let context = match &plan.body {
            None => w.envoy.request(&headers).0,
            Some(pieces) => {
                let (context, _) = w.envoy.request_headers(&headers);
                let last = pieces.len().saturating_sub(1);
                for (k, piece) in pieces.iter().enumerate() {
                    w.envoy.body(context, piece, k == last);
                }
                if pieces.is_empty() {
                    w.envoy.body(context, b"", true);
                }
                context
            }
        };
        w.open.insert(context, i);
        self.contexts[i] = Some((plan.worker, context));
    }

    /// After every event: new calls are taken up, requests that reached the upstream or
    /// were answered are recorded, ticks scheduled.
    fn after(&mut self, now: u64, upstream: &mut dyn FnMut(usize, &[u8]) -> Respond) {
        for worker in 0..self.workers.len() {
            let calls: Vec<(u32, u64, Option<Vec<SettledItem>>)> = {
                let w = &mut self.workers[worker];
                let state = w.envoy.host.state();
                let new = state.dispatched.get(w.seen_calls..).unwrap_or_default();
                let calls = new
                    .iter()
                    .map(|d| {
                        let settles = (d.path() == v3::COMMIT_PATH).then(|| settled_items(&d.body));
                        (d.token, d.timeout_ms, settles)
                    })
                    .collect();
                w.seen_calls = state.dispatched.len();
                calls
            };
            for (token, timeout_ms, settles) in calls {
                if let Some(items) = settles {
                    self.settle_calls
                        .insert((worker, token), self.settles.len());
                    self.settles.push(SettleCall {
                        worker,
                        dispatched_us: now,
                        ran_us: None,
                        items,
                    });
                }
                self.calls += 1;
                let half = self.half_latency(self.calls);
                self.halves.insert((worker, token), half);
                let timeout_us = timeout_ms.saturating_mul(1_000);
                self.at(now + half, Event::Decide { worker, token });
                if 2 * half > timeout_us {
                    self.at(now + timeout_us, Event::Timeout { worker, token });
                }
            }
            self.track(worker, now, upstream);
            // Ticks while anything is left to do: the filter's periodic work (commits to
            // send, held requests, stats) is for requests and calls still around.
            // A worker ticks while it has requests or calls, and for a second after the
            // last of them (commits to send, stats); a request the filter never decides
            // would tick forever: ticks stop `TICKS_AFTER_US` after the last event that
            // was not one.
            let quiet = now > self.last_busy_us + TICKS_AFTER_US;
            let w = &mut self.workers[worker];
            let (period_ms, in_flight) = {
                let state = w.envoy.host.state();
                (state.tick_ms.get(&w.envoy.root).copied(), state.in_flight)
            };
            if !w.open.is_empty() || in_flight > 0 {
                w.active_us = now;
            }
            let idle = quiet || now > w.active_us + 1_000_000;
            if let (Some(ms), None, false) = (period_ms.filter(|&ms| ms > 0), w.tick_at, idle) {
                let at = now + u64::from(ms) * 1_000;
                w.tick_at = Some(at);
                self.at(at, Event::Tick(worker));
            }
        }
    }

    fn half_latency(&self, call: u64) -> u64 {
        if self.model.jitter_us == 0 {
            return self.model.half_latency_us;
        }
        let mut z = call.wrapping_add(1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        self.model.half_latency_us + z % (self.model.jitter_us + 1)
    }

    fn decide(&mut self, worker: usize, token: u32, now: u64) {
        let Some((path, body, answered)) = call(&self.workers[worker].envoy, token)
            .map(|c| (c.path().to_string(), c.body, c.answered))
        else {
            return;
        };
        if answered {
            // Envoy gave up on it already: Redis decides all the same.
            let (status, _) = self.model_answer(&path, &body, now);
            self.settle_ran(worker, token, status, now);
            return;
        }
        let half = self
            .halves
            .remove(&(worker, token))
            .unwrap_or(self.model.half_latency_us);
        let reset = self.model.reset_one_in > 0
            && (half ^ u64::from(token)).is_multiple_of(self.model.reset_one_in);
        let (status, body) = if reset {
            (0, Vec::new())
        } else {
            self.model_answer(&path, &body, now)
        };
        self.settle_ran(worker, token, status, now);
        if status == 400 {
            self.refused_by_bridge
                .push(String::from_utf8_lossy(&body).into_owned());
        }
        self.workers[worker].replies.insert(token, (status, body));
        self.at(now + half, Event::Land { worker, token });
    }

    /// Records that the model bridge ran the settles of a commit call at `now` (status
    /// 200: it did; anything else, or a reset: it did not).
    fn settle_ran(&mut self, worker: usize, token: u32, status: u16, now: u64) {
        if let Some(&at) = self.settle_calls.get(&(worker, token)) {
            if status == 200 {
                self.settles[at].ran_us = Some(now);
            }
        }
    }

    fn model_answer(&mut self, path: &str, body: &[u8], now: u64) -> (u16, Vec<u8>) {
        let answer = if path == v3::COMMIT_PATH {
            self.bridge
                .commit(body, now)
                .map(|reply| serde_json::to_vec(&reply).unwrap())
        } else {
            debug_assert_eq!(path, v2::ACQUIRE_PATH);
            self.bridge
                .acquire(body, now)
                .map(|reply| serde_json::to_vec(&reply).unwrap())
        };
        match answer {
            Ok(bytes) => (200, bytes),
            Err((status, body)) => (status, body.into_bytes()),
        }
    }

    /// Records what changed for `worker`'s open requests: admitted (the whole request
    /// reached the upstream), answered here, or body bytes leaked.
    fn track(
        &mut self,
        worker: usize,
        now: u64,
        upstream: &mut dyn FnMut(usize, &[u8]) -> Respond,
    ) {
        let changed = self.workers[worker].envoy.take_changed();
        let mut respond = Vec::new();
        let mut answered = Vec::new();
        {
            let w = &self.workers[worker];
            let state = w.envoy.host.state();
            for context in changed {
                let (Some(&i), Some(stream)) = (w.open.get(&context), state.streams.get(&context))
                else {
                    continue;
                };
                let out = &mut self.outcomes[i];
                let reply = stream.local_reply.as_ref().map(|r| r.status);
                let admitted = stream.upstream.ended && out.admitted_us.is_none();
                if reply.is_some() || admitted {
                    if let Some(state) = stream.filter_state.get("weir.decisions") {
                        out.written = parse_written(state);
                    }
                }
                if let Some(status) = reply {
                    out.answered = Some(status);
                    out.leaked |= !stream.upstream.body.is_empty();
                    answered.push(context);
                    continue;
                }
                if admitted {
                    out.admitted_us = Some(now);
                    out.upstream_body = stream.upstream.body.clone();
                    respond.push(i);
                }
            }
        }
        let w = &mut self.workers[worker];
        for context in answered {
            w.open.remove(&context);
            w.envoy.deliver_local_reply(context);
            w.envoy.close(context);
        }
        for i in respond {
            let response = upstream(i, &self.outcomes[i].upstream_body);
            self.at(now + response_after_us(&response), Event::Respond(i));
            self.responses[i] = Some(response);
        }
    }

    /// What the upstream was told to do with request `i`, once it was admitted.
    pub fn answered_with(&self, i: usize) -> Option<Respond> {
        self.responses.get(i).cloned().flatten()
    }

    fn respond(&mut self, i: usize, now: u64) {
        let (Some((worker, context)), Some(response)) =
            (self.contexts[i], self.responses[i].clone())
        else {
            return;
        };
        let w = &mut self.workers[worker];
        match &response {
            Respond::Upstream {
                status,
                headers,
                body,
                ..
            } => {
                let headers: Vec<(&str, &str)> = headers
                    .iter()
                    .map(|(n, v)| (n.as_str(), v.as_str()))
                    .collect();
                w.envoy.respond(context, *status, &headers, body);
            }
            Respond::Local { status, .. } => {
                w.envoy
                    .local_reply(context, *status, "upstream_response_timeout")
            }
            Respond::Leaves { .. } => {}
        }
        w.envoy.close(context);
        w.open.remove(&context);
        self.outcomes[i].ended_us = Some(now);
    }
}

/// The settles a `/v3/commit` body carries (none when the bridge would refuse it).
fn settled_items(body: &[u8]) -> Vec<SettledItem> {
    serde_json::from_slice::<v3::CommitRequest>(body)
        .map(|r| {
            r.items
                .into_iter()
                .map(|item| SettledItem {
                    descriptor: item.descriptor,
                    reserved: item.reserved,
                    actual: item.actual,
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The call `token` of `envoy` (a clone).
fn call(envoy: &Envoy, token: u32) -> Option<Dispatched> {
    let index = usize::try_from(token).ok()?.checked_sub(1)?;
    envoy.host.state().dispatched.get(index).cloned()
}

/// The decisions of a `weir.decisions` filter state:
/// `rule:outcome:source:cost:decided_at_us`, comma-separated.
pub fn parse_written(state: &[u8]) -> Vec<Written> {
    let text = String::from_utf8_lossy(state);
    text.split(',')
        .filter(|d| !d.is_empty())
        .filter_map(|d| {
            let f: Vec<&str> = d.split(':').collect();
            match f.as_slice() {
                [rule, outcome, source, cost, at] => Some(Written {
                    rule: rule.to_string(),
                    outcome: outcome.to_string(),
                    source: source.to_string(),
                    cost: cost.parse().ok()?,
                    at_us: at.parse().ok()?,
                }),
                _ => None,
            }
        })
        .collect()
}

/// When a plan's response comes, after the request reached the upstream.
pub fn response_after_us(respond: &Respond) -> u64 {
    match respond {
        Respond::Upstream { after_us, .. }
        | Respond::Local { after_us, .. }
        | Respond::Leaves { after_us } => *after_us,
    }
}
