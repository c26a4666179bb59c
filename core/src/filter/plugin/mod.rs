//! What a VM holds once configured: the compiled engine, the hashing seed and the metrics,
//! shared by every HTTP context of the VM.
//!
//! `configure` runs in every VM of the process (a base VM on the main thread, then one
//! per worker), so everything here is idempotent: the seed is whatever the first VM
//! stored, tables that exist keep their state, metrics map to the same stats.
//!
//! What a plugin keeps that changes (the worker's reservoirs and held requests, calls in
//! flight, commits waiting, the bytes kept for bodies) is its own: requests and the VM
//! reach it through the methods here, never through the cells. Beside this file:
//! `calls` (a request's bridge call and its answer) and `commits` (global commits queued
//! and sent from the tick).

use super::host::{self, Host, LogLevel};
use super::metrics::{Metrics, RuleStats, FLUSH_INTERVAL};
use crate::adaptive::{Response, LEARNING_TICK_MS};
use crate::bounds::MAX_CONFIG_BYTES;
use crate::buffers::{BufferBudget, Buffered};
use crate::config;
use crate::delay::RELEASE_TICK_MS;
use crate::engine::{Engine, Evaluation, HeldRequest, PendingCommit, PendingItem};
use crate::flight::{Flights, Join};
use crate::key::Seed;
use crate::rules::{FactSource, Facts, Rule, RuleId};
use crate::store::seed;
use crate::time::{Micros, Span};
use crate::usage::settlement::{ResponseSeen, Settlement};
use crate::worker::Worker;
use std::cell::{Cell, RefCell};

/// A request's bridge call and its answer.
mod calls;

/// Global commits, queued and sent from the tick.
mod commits;

pub use calls::Landed;
pub use commits::{
    CommitQueue, QueuedCommit, COMMIT_TICK_MS, MAX_COMMIT_CALLS, MAX_WAITING_COMMITS,
};

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
    seed: Cell<Seed>,
    pub metrics: Metrics,
    /// Bridge calls of this plugin in flight in this VM.
    flights: RefCell<Flights>,
    /// This worker's reservoirs and cached denials of local rules, and the requests it
    /// holds (`on_limit.delay`).
    worker: RefCell<Worker>,
    /// Global commits waiting to be sent to the bridge, and the calls carrying them.
    commits: RefCell<CommitQueue>,
    /// Bytes this VM keeps for its requests in flight, against `max_buffered_bytes`.
    buffers: RefCell<BufferBudget>,
    /// The tick period set last (ms): every [`crate::delay::RELEASE_TICK_MS`] while
    /// requests are held, [`COMMIT_TICK_MS`] while commits or places wait,
    /// [`LEARNING_TICK_MS`] while an adaptive controller learns, else every metrics flush.
    tick_ms: Cell<u32>,
    /// Places of concurrency rules wait to be given back or re-counted (see
    /// [`Plugin::tend_places`]).
    places_due: Cell<bool>,
    /// An adaptive controller this worker merged into on its last tick is learning
    /// (see [`crate::adaptive::LEARNING_TICK_MS`]).
    learning: Cell<bool>,
    /// When this worker last swept expired units (see [`Plugin::on_tick`]).
    last_sweep: Cell<Micros>,
}

/// How often a worker sweeps the units that expired unspent out of its reservoirs and a
/// few sets of each lease table: the `outstanding_units` gauge lags their expiry by
/// about this much (more for lease tables of many sets).
pub const SWEEP_INTERVAL: Span = Span::from_millis(250);

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
            learning: Cell::new(false),
            last_sweep: Cell::new(Micros::ZERO),
            engine,
            seed: Cell::new(seed),
            metrics,
            flights: RefCell::new(Flights::default()),
        })
    }

    /// Grows what `kept` holds of the VM's `max_buffered_bytes` to `bytes` (or shrinks
    /// it); false, holding what it held, when the budget has no room.
    pub fn keep(&self, kept: &mut Buffered, bytes: usize) -> bool {
        kept.grow_to(&mut self.buffers.borrow_mut(), bytes)
    }

    /// Gives back all `kept` holds of the VM's budget.
    pub fn give_back(&self, kept: &mut Buffered) {
        kept.release(&mut self.buffers.borrow_mut());
    }

    /// Evaluates a request's rules now ([`Engine::evaluate`]) against this worker's
    /// reservoirs and the process's hashing seed.
    pub fn evaluate<H: Host, F: FactSource>(
        &self,
        host: &H,
        facts: &mut Facts<'_, F>,
        now: Micros,
    ) -> Evaluation {
        let mut worker = self.worker.borrow_mut();
        let seed = self.seed.get();
        self.engine.evaluate(host, &mut worker, &seed, facts, now)
    }

    /// Releases a held request that is due ([`Engine::release`]).
    pub fn release<H: Host, F: FactSource>(
        &self,
        eval: &mut Evaluation,
        host: &H,
        facts: &mut Facts<'_, F>,
        now: Micros,
    ) {
        let mut worker = self.worker.borrow_mut();
        let seed = self.seed.get();
        self.engine
            .release(eval, host, &mut worker, &seed, facts, now);
    }

    /// Holds request `context_id` as its rule says (until it is due, waiting its turn
    /// when it has one); false when the worker has no room for it.
    pub fn hold(&self, context_id: u32, held: &HeldRequest) -> bool {
        self.worker
            .borrow_mut()
            .waiting
            .hold(context_id, held.rule, held.hold.due_us, held.turn)
    }

    /// A held request is gone: it leaves the queue. The rule that held it, if it was held.
    pub fn forget_held(&self, context_id: u32) -> Option<RuleId> {
        self.worker.borrow_mut().waiting.forget(context_id)
    }

    /// Whether this worker holds no request.
    pub fn holds_none(&self) -> bool {
        self.worker.borrow().waiting.is_empty()
    }

    /// The held requests due at `now`, out of the queue, by context id.
    pub fn take_due(&self, now: Micros) -> Vec<u32> {
        self.worker.borrow_mut().waiting.take_due(now.us())
    }

    /// The held requests another key's pushed out of a full queue since the last tick.
    pub fn take_pushed_out(&self) -> Vec<u32> {
        self.worker.borrow_mut().waiting.take_pushed_out()
    }

    /// Every held request, out of the queue (the plugin goes away).
    pub fn take_all_held(&self) -> Vec<u32> {
        self.worker.borrow_mut().waiting.take_all()
    }

    /// Request `context_id` waits on a call of this VM for its `pending` rules, if one
    /// asks about all their keys ([`Join::Waiting`]), or must make its own.
    pub fn join_flight(&self, context_id: u32, pending: &[PendingItem]) -> Join {
        self.flights
            .borrow_mut()
            .join(context_id, pending, |rule| self.engine.shares_calls(rule))
    }

    /// Request `context_id` stops waiting on the call `flight` (it is gone).
    pub fn leave_flight(&self, flight: u32, context_id: u32) {
        self.flights.borrow_mut().forget_waiter(flight, context_id);
    }

    /// A response of a request an adaptive concurrency rule admitted came back
    /// ([`Engine::observe_response`]); whether its latency was recorded.
    pub fn observe_response(
        &self,
        admitted: &PendingCommit,
        response: Response,
        latency: Span,
    ) -> bool {
        self.engine
            .observe_response(&mut self.worker.borrow_mut(), admitted, response, latency)
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
        self.learning.set(adapted.iter().any(|a| a.learning));
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
    /// concurrency rules wait to be given back, every [`LEARNING_TICK_MS`] while an
    /// adaptive controller learns (slow start, this worker's limit in use), else every
    /// metrics flush. Called after a request is held, a commit queued or a give-back
    /// refused, and on every tick.
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
        } else if self.learning.get() {
            LEARNING_TICK_MS
        } else {
            SLOW_TICK_MS
        };
        if period != self.tick_ms.get() && host.set_tick_period_ms(period).is_ok() {
            self.tick_ms.set(period);
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
