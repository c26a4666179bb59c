//! What a VM holds once configured: the compiled engine, the hashing seed and the metrics,
//! shared by every HTTP context of the VM.
//!
//! `configure` runs in every VM of the process (a base VM on the main thread, then one
//! per worker), so everything here is idempotent: the seed is whatever the first VM
//! stored, tables that exist keep their state, metrics map to the same stats.

use super::host::{self, Host, LogLevel};
use super::metrics::{Metrics, RuleStats, FLUSH_INTERVAL};
use crate::bounds::MAX_ITEMS;
use crate::bounds::{MAX_BODY_BYTES, MAX_CONFIG_BYTES};
use crate::buffers::BufferBudget;
use crate::config::{self, BridgeSettings};
use crate::delay::RELEASE_TICK_MS;
use crate::engine::{Engine, Evaluation, PendingCommit};
use crate::flight::{Call, Flights};
use crate::key::Seed;
use crate::rules::Rule;
use crate::rules::RuleId;
use crate::store::seed;
use crate::time::{Micros, Span};
use crate::usage::settlement::{ResponseSeen, Settlement};
use crate::wire::{v2, v3, ReplyError, SECRET_HEADER};
use crate::worker::Worker;
use std::cell::{Cell, RefCell};

/// The most sets of a table read at configure time to estimate its `slots_in_use`
/// gauge: a table of a million keys costs this many host calls, not 250,000.
const GAUGE_SAMPLE_SETS: u32 = 256;

/// The tick when no request is held: idle workers send their metrics, every VM checks
/// its hashing seed.
pub const SLOW_TICK_MS: u32 = FLUSH_INTERVAL.as_millis() as u32;

pub struct Plugin {
    pub engine: Engine,
    /// The process's hashing seed; replaced if a racing VM's seed is the one stored
    /// (see `crate::store::seed`).
    pub seed: Cell<Seed>,
    pub metrics: Metrics,
    /// Bridge calls of this plugin in flight in this VM.
    pub flights: RefCell<Flights>,
    /// This worker's reservoirs and cached denials of local rules, and the requests it
    /// holds (`on_limit.delay`).
    pub worker: RefCell<Worker>,
    /// Global commits waiting to be sent to the bridge, and the calls carrying them.
    pub commits: RefCell<CommitQueue>,
    /// Bytes this VM keeps for its requests in flight, against `max_buffered_bytes`.
    pub buffers: RefCell<BufferBudget>,
    /// The tick period set last (ms): every [`crate::delay::RELEASE_TICK_MS`] while
    /// requests are held, [`COMMIT_TICK_MS`] while commits or places wait, else every
    /// metrics flush.
    tick_ms: Cell<u32>,
    /// Places of concurrency rules wait to be given back or re-counted (see
    /// [`Plugin::tend_places`]).
    places_due: Cell<bool>,
    /// When this worker last swept expired units (see [`Plugin::on_tick`]).
    last_sweep: Cell<Micros>,
}

/// A bridge call answered and landed ([`Plugin::on_call_answer`]): its evaluation,
/// completed with the answer, for the request that made it, and the requests that waited
/// on it, to look again.
pub struct Landed {
    /// The request that made the call (it may be gone).
    pub owner: u32,
    pub eval: Evaluation,
    /// The requests that waited on it, by context id, in the order they joined.
    pub waiters: Vec<u32>,
    /// When the answer came.
    pub now: Micros,
}

/// How often commits waiting for the bridge are sent.
pub const COMMIT_TICK_MS: u32 = 10;

/// How often a worker sweeps the units that expired unspent out of its reservoirs and a
/// few sets of each lease table: the `outstanding_units` gauge lags their expiry by
/// about this much (more for lease tables of many sets).
pub const SWEEP_INTERVAL: Span = Span::from_millis(250);
/// Most commits a worker keeps waiting; past it a commit is dropped (its estimate
/// stands) and counted in `commit_errors`.
pub const MAX_WAITING_COMMITS: usize = 4_096;
/// Most `/v3/commit` calls a worker has in flight.
pub const MAX_COMMIT_CALLS: usize = 16;

/// A global commit: the item for the bridge, with what the metrics need.
pub struct QueuedCommit {
    pub rule: RuleId,
    pub item: v3::CommitItem,
}

/// Global commits of one worker: waiting, and in flight by call token.
#[derive(Default)]
pub struct CommitQueue {
    waiting: Vec<QueuedCommit>,
    in_flight: Vec<(u32, Vec<QueuedCommit>)>,
}

impl CommitQueue {
    /// Queues a commit; false when the queue is full.
    pub fn push(&mut self, commit: QueuedCommit) -> bool {
        if self.waiting.len() >= MAX_WAITING_COMMITS {
            return false;
        }
        self.waiting.push(commit);
        true
    }

    pub fn is_waiting(&self) -> bool {
        !self.waiting.is_empty()
    }

    /// The commits the call `token` carried, if it was a commit call.
    pub fn land(&mut self, token: u32) -> Option<Vec<QueuedCommit>> {
        let at = self.in_flight.iter().position(|(t, _)| *t == token)?;
        Some(self.in_flight.swap_remove(at).1)
    }
}

impl Plugin {
    /// Reads, compiles and prepares the plugin configuration. The error is the line to
    /// log: it names the field and the value that were wrong.
    pub fn configure<H: Host>(host: &H) -> Result<Plugin, String> {
        // One byte more than allowed, so that a config that is too large gets the size
        // message, not a parse error at the cut.
        let json = host
            .plugin_configuration(MAX_CONFIG_BYTES + 1)
            .map_err(|e| format!("cannot read the plugin configuration: {e}"))?
            .unwrap_or_default();
        let mut config = config::parse(&json).map_err(|e| format!("invalid configuration: {e}"))?;
        if let Some(bridge) = config.bridge.as_mut() {
            if let Some(name) = &bridge.secret_env {
                // WASI's environment: Envoy's `vm_config.environment_variables`.
                match host.environment_variable(name) {
                    Some(secret) if !secret.is_empty() => bridge.secret = Some(secret),
                    _ => {
                        return Err(format!(
                            "invalid configuration: bridge.secret_env: the environment variable {name:?} is \
                             not set in the Wasm VM (set it in vm_config.environment_variables)"
                        ))
                    }
                }
            }
        }
        let fresh = host
            .entropy()
            .map_err(|e| format!("no entropy for the hashing seed: {e}"))?;
        let seed = seed::load_or_create(host, fresh)
            .map_err(|e| format!("cannot share the hashing seed: {e}"))?;
        // Envoy's plugin name (the filter's `config.name`; in Istio the WasmPlugin's
        // namespace.name) keeps the tables of two plugins in one VM apart.
        let plugin_name = host
            .property(&["plugin_name".to_string()])
            .ok()
            .flatten()
            .and_then(|name| String::from_utf8(name).ok())
            .unwrap_or_default();
        let engine = Engine::with_namespace(config, &plugin_name);
        engine
            .prepare(host)
            .map_err(|e| format!("cannot create the slot tables: {e}"))?;
        let rules: Vec<RuleStats<'_>> = engine
            .config
            .rules
            .iter()
            .map(|rule| RuleStats {
                rule,
                capacity: engine.capacity(rule.id),
                in_use: engine
                    .estimate_slots_in_use(rule.id, host, GAUGE_SAMPLE_SETS)
                    .unwrap_or(0),
                limit_units: engine.limit_units(rule.id),
            })
            .collect();
        let metrics = Metrics::define(host, &plugin_name, &engine.config, &rules)
            .map_err(|e| format!("cannot define metrics: {e}"))?;
        let mut worker = engine.worker();
        // Each VM sweeps the lease tables from its own place: together they read them
        // through sooner than in step.
        let [a, b, c, d, ..] = fresh;
        worker.lease_sweep_next = u32::from_le_bytes([a, b, c, d]);
        Ok(Plugin {
            buffers: RefCell::new(BufferBudget::new(engine.config.max_buffered_bytes)),
            worker: RefCell::new(worker),
            commits: RefCell::new(CommitQueue::default()),
            tick_ms: Cell::new(SLOW_TICK_MS),
            places_due: Cell::new(false),
            last_sweep: Cell::new(Micros::ZERO),
            engine,
            seed: Cell::new(seed),
            metrics,
            flights: RefCell::new(Flights::default()),
        })
    }

    /// Sends `eval.pending` to the bridge for the request `owner`; the call is in
    /// flight, holding the evaluation, until its answer comes. Gives the evaluation back
    /// when the call cannot be made.
    pub fn call_bridge<H: Host>(
        &self,
        host: &H,
        owner: u32,
        mut eval: Evaluation,
        now: Micros,
    ) -> Result<(), Box<(Evaluation, ReplyError)>> {
        let Some(bridge) = &self.engine.config.bridge else {
            return Err(Box::new((eval, ReplyError::Unavailable)));
        };
        let body = self.engine.bridge_request(&eval.pending);
        let headers = call_headers(bridge, v2::ACQUIRE_PATH);
        match host.dispatch_call(&bridge.cluster, &headers, &body, bridge.timeout_ms) {
            Ok(token) => {
                self.metrics.bridge_call();
                self.engine.note_call_made(host, now.us());
                self.engine.note_call_sent(&mut eval, host, now);
                let keys = eval
                    .pending
                    .iter()
                    .filter(|item| self.engine.shares_calls(item.rule))
                    .map(|item| (item.rule, item.hash))
                    .collect();
                let call = Call {
                    owner,
                    sent_at: now,
                    eval,
                    keys,
                    waiters: Vec::new(),
                    resent: false,
                };
                self.flights.borrow_mut().start(token, call);
                Ok(())
            }
            // Envoy refused it at once: the cluster's circuit breaker is full, or it has
            // no host (or no such cluster).
            Err(e) => {
                self.metrics.bridge_refused();
                host::log(host, owner, LogLevel::Debug, || {
                    format!("cannot call the bridge cluster {:?}: {e}", bridge.cluster)
                });
                Err(Box::new((eval, ReplyError::Refused)))
            }
        }
    }

    /// The answer of the call `token`, on the plugin's root context. A commit call
    /// settles its commits. A bridge call Envoy could not deliver is sent once more (see
    /// [`Plugin::resend`]). A bridge call that landed has its evaluation completed: what
    /// Redis granted goes into the lease table whether or not its request is still
    /// there, and the call is returned for the VM to hand to its requests. `None` for
    /// every other answer.
    pub fn on_call_answer<H: Host>(
        &self,
        host: &H,
        token: u32,
        body_size: usize,
    ) -> Option<Landed> {
        let commits = self.commits.borrow_mut().land(token);
        if let Some(commits) = commits {
            self.commits_answered(host, commits, body_size);
            return None;
        }
        let (reply, sent_at) = {
            let flights = self.flights.borrow();
            let call = flights.get(token)?;
            (self.read_bridge_reply(host, call, body_size), call.sent_at)
        };
        let now = host.now().unwrap_or(sent_at);
        // Envoy could not deliver it: another host of the cluster may answer.
        let reply = match self.resend(host, token, &reply, now) {
            Ok(true) => return None,
            Ok(false) => reply,
            Err(refused) => Err(refused),
        };
        let call = self.flights.borrow_mut().land(token)?;
        self.metrics
            .bridge_latency(host, now.saturating_sub(call.sent_at));
        let mut eval = call.eval;
        self.engine
            .complete(&mut eval, host, call.sent_at, now, reply);
        Some(Landed {
            owner: call.owner,
            eval,
            waiters: call.waiters,
            now,
        })
    }

    /// The request of a landed call is gone: what the call decided is still counted, and
    /// what its rules hold for a response that will never come is settled now (a
    /// concurrency rule's place given back; an estimate given back too: the request,
    /// paused for this call, never reached the upstream).
    pub fn on_owner_gone<H: Host>(&self, host: &H, landed: &Landed) {
        self.metrics.record(host, &landed.eval, landed.now);
        for commit in &landed.eval.commits {
            self.settle(host, landed.owner, commit, None);
        }
    }

    /// Sends the call answered as `token` once more, if its `reply` says Envoy could not
    /// deliver it and there is time left (see [`crate::engine::Engine::resend_timeout_ms`]):
    /// it stays in flight with its waiters. Returns whether it was sent, or
    /// [`ReplyError::Refused`] when Envoy refused the second send at once (its circuit
    /// breaker): that, not the first answer, is what the call got.
    fn resend<H: Host>(
        &self,
        host: &H,
        token: u32,
        reply: &Result<v2::Reply, ReplyError>,
        now: Micros,
    ) -> Result<bool, ReplyError> {
        let (Some(bridge), Err(error)) = (&self.engine.config.bridge, reply) else {
            return Ok(false);
        };
        let (body, timeout_ms, owner) = {
            let flights = self.flights.borrow();
            let Some(call) = flights.get(token) else {
                return Ok(false);
            };
            let Some(timeout_ms) =
                self.engine
                    .resend_timeout_ms(error, call.resent, call.sent_at, now)
            else {
                return Ok(false);
            };
            let body = self.engine.bridge_request(&call.eval.pending);
            (body, timeout_ms, call.owner)
        };
        let headers = call_headers(bridge, v2::ACQUIRE_PATH);
        match host.dispatch_call(&bridge.cluster, &headers, &body, timeout_ms) {
            Ok(again) => {
                self.engine.note_call_made(host, now.us());
                self.flights.borrow_mut().resend(token, again);
                self.metrics.bridge_call();
                self.metrics.bridge_resent();
                host::log(host, owner, LogLevel::Debug, || {
                    format!("{error}; the call is sent once more")
                });
                Ok(true)
            }
            Err(_) => {
                self.metrics.bridge_refused();
                Err(ReplyError::Refused)
            }
        }
    }

    /// The answer of the call `call` made, read in the callback of its response: its
    /// status (0: none, the connection failed) and body, decoded against what was sent.
    fn read_bridge_reply<H: Host>(
        &self,
        host: &H,
        call: &Call,
        body_size: usize,
    ) -> Result<v2::Reply, ReplyError> {
        let status = host
            .call_response_header(":status")
            .ok()
            .flatten()
            .and_then(|s| {
                std::str::from_utf8(&s)
                    .ok()
                    .and_then(|s| s.parse::<u16>().ok())
            })
            .unwrap_or(0);
        // Envoy's own 503 for a call its circuit breaker turned away once it was taken
        // (a stream over `max_pending_requests` while the connection opens): a full
        // breaker, like a call refused at once, not a bridge that is down.
        let overloaded = status == 503
            && host
                .call_response_header("x-envoy-overloaded")
                .ok()
                .flatten()
                .is_some();
        if overloaded {
            self.metrics.bridge_refused();
            return Err(ReplyError::Refused);
        }
        if body_size > MAX_BODY_BYTES {
            return Err(ReplyError::BadBody(format!("{body_size} bytes")));
        }
        let body = host
            .call_response_body(body_size)
            .ok()
            .flatten()
            .unwrap_or_default();
        v2::decode_reply(status, &body, &self.engine.sent(&call.eval.pending))
    }

    /// Settles what a rule counted for request `context_id` when its response ended (or
    /// never will): a cost as the core decides from what was `seen` of the response
    /// (`None`: the request never reached the upstream, it costs nothing), a concurrency
    /// rule's place given back. Logged at debug on the request's context.
    pub fn settle<H: Host>(
        &self,
        host: &H,
        context_id: u32,
        commit: &PendingCommit,
        seen: Option<&ResponseSeen>,
    ) {
        let Some(rule) = self.engine.config.rule(commit.rule) else {
            return;
        };
        let now = || host.now().unwrap_or(commit.counted_at);
        let Some(cost) = &rule.commit else {
            // A concurrency rule: the stream is over. A give-back shared data refuses
            // stays marked in the worker and is done on its next tick.
            let released = match self.worker.try_borrow_mut() {
                Ok(mut worker) => self
                    .engine
                    .end_in_flight(host, &mut worker, commit, now())
                    .is_ok(),
                // Never expected (no caller holds the worker here); the place is then
                // dropped when its epoch passes, as a dead VM's would be.
                Err(_) => false,
            };
            self.metrics.in_flight_released(commit.rule, released);
            if !released {
                self.adjust_tick(host);
            }
            host::log(host, context_id, LogLevel::Debug, || {
                format!("rule {}: place given back", rule.name)
            });
            return;
        };
        let settlement = match seen {
            Some(seen) => Settlement::of(commit.reserved, cost.on_error, seen),
            None => Settlement::not_forwarded(),
        };
        let value = settlement.cost;
        self.metrics.committed(commit.rule, settlement.reason);
        if let Some(item) = self.engine.global_commit(commit, value) {
            // Settled in Redis: queued for the bridge, sent from the worker's tick.
            if commit.reserved != value {
                let queued = self.commits.borrow_mut().push(QueuedCommit {
                    rule: commit.rule,
                    item,
                });
                if queued {
                    self.adjust_tick(host);
                } else {
                    self.metrics.commit_failed(commit.rule);
                }
            }
        } else {
            match self.engine.commit(host, commit, value, now()) {
                Ok(true) => self
                    .metrics
                    .commit_settled(commit.rule, commit.reserved, value),
                Ok(false) => {}
                Err(_) => self.metrics.commit_failed(commit.rule),
            }
        }
        host::log(host, context_id, LogLevel::Debug, || {
            format!(
                "rule {}: cost {} settled as {value} ({:?})",
                rule.name, commit.reserved, settlement.reason
            )
        });
    }

    /// Adaptive concurrency rules, from the root context's tick: this worker's latencies
    /// merged into shared data, its limits taken back (see `crate::adaptive`).
    pub fn adapt<H: Host>(&self, host: &H) {
        if !self
            .engine
            .config
            .rules
            .iter()
            .any(|r| self.engine.is_adaptive(r.id))
        {
            return;
        }
        let Ok(now) = host.now() else {
            return;
        };
        let adapted = self.engine.adapt(host, &mut self.worker.borrow_mut(), now);
        for a in &adapted {
            self.metrics.adapted(host, a);
        }
    }

    /// Concurrency rules, from the root context's tick: places whose give-back failed
    /// are given back, places counted in an older epoch re-counted (see
    /// `crate::concurrency`), at most a bounded number of keys per tick.
    pub fn tend_places<H: Host>(&self, host: &H, now: Micros) {
        let Ok(mut worker) = self.worker.try_borrow_mut() else {
            return;
        };
        if worker.places.is_empty() {
            self.places_due.set(false);
            return;
        }
        let tended = self.engine.tend_places(host, &mut worker, now);
        for &(rule, units) in &tended.reclaimed {
            self.metrics.in_flight_reclaimed(rule, units);
        }
        self.places_due.set(tended.more_due || tended.failed > 0);
    }

    /// The tick this plugin needs: every [`RELEASE_TICK_MS`] while requests are held,
    /// every [`COMMIT_TICK_MS`] while commits wait for the bridge or places of
    /// concurrency rules wait to be given back, else every metrics flush. Called after a
    /// request is held, a commit queued or a give-back refused, and on every tick.
    pub fn adjust_tick<H: Host>(&self, host: &H) {
        let period = if self
            .worker
            .try_borrow()
            .is_ok_and(|w| !w.waiting.is_empty())
        {
            RELEASE_TICK_MS
        } else if self.commits.borrow().is_waiting()
            || self.places_due.get()
            || self.worker.try_borrow().is_ok_and(|w| w.places.has_ended())
        {
            COMMIT_TICK_MS
        } else {
            SLOW_TICK_MS
        };
        if period != self.tick_ms.get() && host.set_tick_period_ms(period).is_ok() {
            self.tick_ms.set(period);
        }
    }

    /// Sends the commits waiting for the bridge (from the root context's tick), in calls
    /// of at most [`MAX_ITEMS`] items, at most [`MAX_COMMIT_CALLS`] in flight.
    pub fn send_commits<H: Host>(&self, host: &H) {
        let Some(bridge) = &self.engine.config.bridge else {
            return;
        };
        let mut queue = self.commits.borrow_mut();
        while queue.is_waiting() && queue.in_flight.len() < MAX_COMMIT_CALLS {
            let take = queue.waiting.len().min(MAX_ITEMS);
            let mut batch: Vec<QueuedCommit> = queue.waiting.drain(..take).collect();
            // Ids unique within the call: the reply is matched to the batch by them.
            for (id, commit) in (0u16..).zip(batch.iter_mut()) {
                commit.item.id = id;
            }
            let body = self
                .engine
                .commit_request(batch.iter().map(|c| c.item.clone()).collect());
            let headers = call_headers(bridge, v3::COMMIT_PATH);
            match host.dispatch_call(&bridge.cluster, &headers, &body, bridge.timeout_ms) {
                Ok(token) => {
                    if let Ok(now) = host.now() {
                        self.engine.note_call_made(host, now.us());
                    }
                    queue.in_flight.push((token, batch));
                }
                Err(e) => {
                    host.log(
                        LogLevel::Warn,
                        &format!(
                            "cannot send commits to the bridge cluster {:?}: {e}",
                            bridge.cluster
                        ),
                    );
                    for commit in &batch {
                        self.metrics.commit_failed(commit.rule);
                    }
                }
            }
        }
    }

    /// The answer to a commit call: each commit settled or not (its result found by its
    /// id), or the call failed (the estimates stand): a bad reply fails the whole call.
    fn commits_answered<H: Host>(&self, host: &H, commits: Vec<QueuedCommit>, body_size: usize) {
        let status = host
            .call_response_header(":status")
            .ok()
            .flatten()
            .and_then(|s| std::str::from_utf8(&s).ok()?.parse::<u16>().ok())
            .unwrap_or(0);
        let body = if body_size <= MAX_BODY_BYTES {
            host.call_response_body(body_size)
                .ok()
                .flatten()
                .unwrap_or_default()
        } else {
            Vec::new()
        };
        let answered = match v3::decode_reply(status, &body, &commits, |c| c.item.id) {
            Ok(answered) => answered,
            Err(error) => {
                host.log(
                    LogLevel::Warn,
                    &format!(
                        "the bridge did not settle {} commits ({error}): their estimates stand",
                        commits.len()
                    ),
                );
                for commit in &commits {
                    self.metrics.commit_failed(commit.rule);
                }
                return;
            }
        };
        for (commit, result) in answered {
            if result.settled {
                self.metrics
                    .commit_settled(commit.rule, commit.item.reserved, commit.item.actual);
            }
        }
    }

    /// The rules as the configure log line lists them.
    pub fn summary(&self) -> String {
        let describe = |r: &Rule| {
            format!(
                "{} ({} {}, max_keys {})",
                r.name,
                if r.is_global() { "global" } else { "local" },
                r.algorithm_name(),
                r.max_keys
            )
        };
        let rules: Vec<String> = self.engine.config.rules.iter().map(describe).collect();
        format!("configured {} rules: {}", rules.len(), rules.join(", "))
    }

    /// Periodic work of the VM: tend the places of concurrency rules, send pending
    /// metrics, adopt the stored seed if a racing
    /// VM's replaced ours. Returns whether the seed changed.
    pub fn on_tick<H: Host>(&self, host: &H, now: Micros) -> bool {
        self.tend_places(host, now);
        self.sweep_expired(host, now);
        let reseeded = match seed::reload(host, self.seed.get()) {
            Ok(Some(stored)) => {
                self.seed.set(stored);
                // Keys hash to other fingerprints now: what the reservoirs hold under
                // the old ones is dropped (never admitted).
                self.drop_reservoirs();
                true
            }
            _ => false,
        };
        self.metrics.flush(host, now);
        reseeded
    }

    /// Every [`SWEEP_INTERVAL`], drops the units that expired unspent in this worker's
    /// reservoirs and in a few sets of each lease table (see
    /// `weir_core::engine::LEASE_SETS_PER_SWEEP`), so that the `outstanding_units` gauge
    /// falls when their time ends, not when their key is next asked for.
    fn sweep_expired<H: Host>(&self, host: &H, now: Micros) {
        if now.saturating_sub(self.last_sweep.get()) < SWEEP_INTERVAL {
            return;
        }
        self.last_sweep.set(now);
        let Ok(mut worker) = self.worker.try_borrow_mut() else {
            return;
        };
        for expired in self.engine.expire_outstanding(host, &mut worker, now) {
            self.metrics.expired(&expired);
        }
    }

    /// The plugin is replaced by a new configuration, or its root context is gone:
    /// what its worker's reservoirs hold is lost with it (lease slots stay in shared
    /// data, for the next plugin with the same limits), and its stats are sent.
    pub fn retire<H: Host>(&self, host: &H) {
        self.drop_reservoirs();
        self.metrics.flush(host, host.now().unwrap_or(Micros::ZERO));
    }

    /// Forgets what this worker's reservoirs hold (a new seed, or the plugin going
    /// away): counted in shared data, never admitted, no longer outstanding.
    pub fn drop_reservoirs(&self) {
        let Ok(mut worker) = self.worker.try_borrow_mut() else {
            return;
        };
        for (rule, lost) in worker.reservoirs.clear() {
            self.metrics.reservoirs_dropped(rule, lost);
        }
    }
}

/// The headers of a call to the bridge's `path`.
fn call_headers<'a>(bridge: &'a BridgeSettings, path: &'a str) -> Vec<(&'a str, &'a str)> {
    let mut headers = vec![
        (":method", "POST"),
        (":path", path),
        (":authority", bridge.authority.as_str()),
        ("content-type", "application/json"),
    ];
    if let Some(secret) = &bridge.secret {
        headers.push((SECRET_HEADER, secret.as_str()));
    }
    headers
}
