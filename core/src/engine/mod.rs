//! One request through every rule: match, key, cost, then a decision — in this Envoy's
//! shared data for local rules, from held units or the bridge for global ones.
//!
//! Rules run in config order. Each rule that allows spends its units at once; the first
//! enforcing rule that denies stops the evaluation, so rules *before* it keep what they
//! spent and rules *after* it are not charged. Put the narrowest rules (per user) before
//! the broad ones (per route, per tenant) so that a client over its own limit does not
//! eat into a shared quota. Shadow rules decide, count and spend like enforcing ones but
//! never deny and never stop the evaluation.
//!
//! A global rule is served from what this Envoy holds for its key ([`crate::lease`]):
//! units due now, a reservation not due yet (denied until it is), or a cached denial — in
//! its place, like a local rule. Otherwise it becomes a [`PendingItem`]; all of them go to
//! the bridge in one call ([`Engine::bridge_request`]) once every rule has been looked
//! at, and the reply, matched to the items by rule id, completes the evaluation
//! ([`Engine::complete`]). So a rule served locally spends its unit even when the bridge
//! then denies a rule before it.
//!
//! A shared-data failure or a CAS give-up fails open for a local rule (the request is
//! not denied by a store we cannot read) and sends a global rule to the bridge; both are
//! reported, to be counted. When the bridge fails (no response, timeout, an error
//! status, a bad reply), each pending rule applies its failure mode, and further calls
//! of this plugin are skipped for [`BRIDGE_BACKOFF_US`] so that a failing bridge does not
//! cost every request a failed call.

mod report;

mod evaluation;

pub use evaluation::{BridgeError, Delayed, Evaluation, HeldRequest, PendingCommit, PendingItem};
pub use report::{FailureOutcome, RuleOutcome, RuleReport, Source, Verdict};

use evaluation::{applies, Applied, CommitKey, HoldOffer, Resume, Served};

use crate::adaptive::{
    measures_service, Adaptive, ControllerState, KeyedEntry, KeyedLatencies, Response,
    SharedRecord, WorkerLatency, KEY_PROBES,
};
use crate::algorithms::{
    Ahead, Decision, GlobalLimit, Hold, Limit, SlotState, TakenAhead, NS_PER_US,
};
use crate::bounds::MAX_WANT;
use crate::concurrency::{place_epoch, Concurrency, KeyPlaces, MAX_PLACE_UPDATES_PER_TICK};
use crate::config::Config;
use crate::delay::RELEASE_SLACK_US;
use crate::key::{encode_part, KeyHash, Seed};
use crate::lease::{Held, LeaseSlot, Settled, SettledOutcome, Spend};
use crate::reservoir::{Found, WorkerTable};
use crate::response::RuleVerdict;
use crate::rules::{
    Commit, CommitSource, Cost, Fact, FactSource, Facts, FailureMode, GlobalRule, Reservoir, Rule,
    RuleId, Scope,
};
use crate::store::slot_table::SlotTable;
use crate::store::{SharedStore, StoreError, UpdateError, Updated, Vacancy};
use crate::wire::v2::{self, Granted, Sent};
use crate::wire::v3;
use crate::wire::{ReplyError, WireLimit};
use crate::worker::Worker;

/// The longest a global rule with a commit trusts a denial from Redis: refunds of the
/// requests in flight may free its units at any time, so a denial cached until the
/// key's retry time (a refill an hour away) would deny what Redis would now admit.
pub const COMMIT_DENIAL_CACHE_US: u64 = 20_000;

/// How long a failed bridge is left alone before it is tried again.
pub const BRIDGE_BACKOFF_US: u64 = 1_000_000;

/// A limit decided in a slot table of this Envoy, and what to call the decision.
struct SlotDecision<'a> {
    limit: &'a Limit,
    table: &'a SlotTable,
    source: Source,
}

impl SlotDecision<'_> {
    /// Runs `decide` on the key's state in the table, with CAS (see [`SlotTable::update`]).
    fn update<S: SharedStore, R>(
        &self,
        store: &S,
        applied: &Applied<'_>,
        decide: impl FnMut(Option<SlotState>) -> (R, Option<SlotState>),
    ) -> Result<Updated<R>, UpdateError> {
        let now_us = applied.now_us;
        let vacancy = |state: SlotState| Vacancy {
            idle_at_us: self.limit.idle_at_us(state),
            in_use: self.limit.in_use(state, now_us),
        };
        self.table
            .update(store, &applied.hash, now_us, vacancy, decide)
    }
}

/// A rule's tables: its slots (local rules), or its lease table and, with
/// `failure_mode: local`, the local share's slots (global rules).
#[derive(Debug)]
enum RuleTables {
    Local(SlotTable),
    Global {
        leases: SlotTable<LeaseSlot>,
        fallback: Option<SlotTable>,
    },
}

/// A compiled config with its tables.
#[derive(Debug)]
pub struct Engine {
    pub config: Config,
    /// One per rule, at its id's index.
    tables: Vec<RuleTables>,
    /// The shared-data key holding the instant (µs, little-endian) until which this
    /// plugin's bridge is left alone.
    bridge_down_key: String,
    /// One per rule: the shared-data key of an adaptive concurrency rule's controller.
    adaptive_keys: Vec<Option<String>>,
}

/// An adaptive concurrency rule's controller after a tick, for metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Adapted {
    pub rule: RuleId,
    pub controller: ControllerState,
    /// The limit this worker decides with now.
    pub limit: u64,
    /// With `per_key`: the fingerprint of the key whose controller this is.
    pub key: Option<u64>,
}

/// What a worker's tick did to its places of concurrency rules, for metrics.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TendedPlaces {
    /// Units of ended requests given back on this tick (their give-back had failed).
    pub given_back: u64,
    /// Keys whose update failed again: tried on the next tick.
    pub failed: u64,
    /// Per rule, units of other places dropped (no live worker re-counted them).
    pub reclaimed: Vec<(RuleId, u64)>,
    /// More keys are due than one tick updates: tick again soon.
    pub more_due: bool,
}

impl Engine {
    pub fn new(config: Config) -> Self {
        Self::with_namespace(config, "")
    }

    /// An engine whose tables and bridge backoff are prefixed by `namespace` (the filter
    /// uses Envoy's plugin name), so that two plugins sharing one Wasm VM's shared data —
    /// Istio gives every WasmPlugin the same `vm_id` — never share counters, even with
    /// equal rule names, nor skip each other's bridge.
    pub fn with_namespace(config: Config, namespace: &str) -> Self {
        let owner = |rule: &Rule| {
            if namespace.is_empty() {
                rule.name.clone()
            } else {
                format!("{namespace}/{}", rule.name)
            }
        };
        let tables = config
            .rules
            .iter()
            .map(|rule| match &rule.scope {
                Scope::Local(limit) => RuleTables::Local(SlotTable::new(
                    &owner(rule),
                    limit.kind().name(),
                    rule.max_keys,
                )),
                Scope::Concurrency(_) => {
                    RuleTables::Local(SlotTable::new(&owner(rule), "in-flight", rule.max_keys))
                }
                Scope::Global(global) => RuleTables::Global {
                    leases: SlotTable::new(&owner(rule), &lease_label(global), rule.max_keys),
                    fallback: match &global.failure_mode {
                        FailureMode::Local(limit) => Some(SlotTable::new(
                            &owner(rule),
                            &format!("fallback-{}", limit.kind()),
                            rule.max_keys,
                        )),
                        FailureMode::Allow | FailureMode::Deny => None,
                    },
                },
            })
            .collect();
        let cluster = config.bridge.as_ref().map_or("", |b| b.cluster.as_str());
        let bridge_down_key = if namespace.is_empty() {
            format!("weir/v1/bridge/{cluster}/down_until")
        } else {
            format!("weir/v1/{namespace}/bridge/{cluster}/down_until")
        };
        let adaptive_keys = config
            .rules
            .iter()
            .map(|rule| match &rule.scope {
                Scope::Concurrency(c) if c.adaptive.is_some() => {
                    Some(format!("weir/v1/{}/adaptive", owner(rule)))
                }
                _ => None,
            })
            .collect();
        Engine {
            config,
            tables,
            bridge_down_key,
            adaptive_keys,
        }
    }

    /// Empty reservoirs and no held request, for one worker (see [`crate::reservoir`],
    /// [`crate::delay`]); each worker keeps its own and passes it to every
    /// [`Engine::evaluate`].
    pub fn worker(&self) -> Worker {
        Worker::for_rules(&self.config.rules)
    }

    /// The shared-data key of this engine's bridge backoff.
    pub fn bridge_down_key(&self) -> &str {
        &self.bridge_down_key
    }

    /// Keys a rule's table holds at once (its slot table, or its lease table).
    pub fn capacity(&self, rule: RuleId) -> u64 {
        match self.tables.get(rule.index()) {
            Some(RuleTables::Local(t)) => t.capacity(),
            Some(RuleTables::Global { leases, .. }) => leases.capacity(),
            None => 0,
        }
    }

    /// The slots of a rule's table that hold a key, read from at most `max_sets_read`
    /// sets (see [`SlotTable::estimate_slots_in_use`]).
    pub fn estimate_slots_in_use<S: SharedStore>(
        &self,
        rule: RuleId,
        store: &S,
        max_sets_read: u32,
    ) -> Result<u64, StoreError> {
        match self.tables.get(rule.index()) {
            Some(RuleTables::Local(t)) => t.estimate_slots_in_use(store, max_sets_read),
            Some(RuleTables::Global { leases, .. }) => {
                leases.estimate_slots_in_use(store, max_sets_read)
            }
            None => Ok(0),
        }
    }

    /// Creates the tables (and adaptive controllers' records) that do not exist yet.
    /// Run before serving.
    pub fn prepare<S: SharedStore>(&self, store: &S) -> Result<u32, StoreError> {
        let mut created = 0;
        for (rule, base) in self.config.rules.iter().zip(&self.adaptive_keys) {
            let Some(base) = base else {
                continue;
            };
            let records: Vec<String> = match rule.adaptive().and_then(|a| a.key_controllers) {
                Some(n) => (0..n).map(|i| key_record(base, i)).collect(),
                None => vec![base.clone()],
            };
            for key in records {
                if store.get(&key)?.1.is_none() {
                    // Empty: the first merge (or a key's claim) starts the controller.
                    store.create(&key, &[])?;
                    created += 1;
                }
            }
        }
        for tables in &self.tables {
            match tables {
                RuleTables::Local(t) => created += t.create_missing(store)?,
                RuleTables::Global { leases, fallback } => {
                    created += leases.create_missing(store)?;
                    if let Some(fallback) = fallback {
                        created += fallback.create_missing(store)?;
                    }
                }
            }
        }
        Ok(created)
    }

    /// Evaluates every rule against one request at `now_us`. When `pending` is not empty
    /// (and the request not denied), send [`Engine::bridge_request`] and finish with
    /// [`Engine::complete`].
    ///
    /// When [`Evaluation::held`] is set, a rule holds the request: release it with
    /// [`Engine::release`] once it is due.
    pub fn evaluate<F: FactSource, S: SharedStore>(
        &self,
        store: &S,
        worker: &mut Worker,
        seed: &Seed,
        facts: &mut Facts<'_, F>,
        now_us: u64,
    ) -> Evaluation {
        let mut eval = Evaluation::default();
        let from = Resume {
            first_rule: 0,
            arrived_us: now_us,
        };
        self.evaluate_from(&mut eval, store, worker, seed, facts, from, now_us);
        eval
    }

    /// Releases a held request at `now_us`. On time (by [`Hold::release_by_us`]), the
    /// holding rule admits it and the rules after it decide now; later, its slot is
    /// lost and the holding rule decides it again, with what is left of its delay's
    /// `max` (it may hold the request once more).
    pub fn release<F: FactSource, S: SharedStore>(
        &self,
        eval: &mut Evaluation,
        store: &S,
        worker: &mut Worker,
        seed: &Seed,
        facts: &mut Facts<'_, F>,
        now_us: u64,
    ) {
        let Some(held) = eval.held.take() else {
            return;
        };
        let Some(rule) = self.config.rule(held.rule) else {
            return;
        };
        let on_time = now_us <= held.hold.release_by_us;
        eval.delayed = Some(Delayed {
            rule: held.rule,
            waited_us: now_us.saturating_sub(held.arrived_us),
            late: !on_time,
        });
        let first_rule = if on_time {
            let mut report = held.report;
            report.decided_at_us = now_us;
            eval.record(report, rule, held.decision);
            held.rule.index() + 1
        } else {
            held.rule.index()
        };
        let from = Resume {
            first_rule,
            arrived_us: held.arrived_us,
        };
        self.evaluate_from(eval, store, worker, seed, facts, from, now_us);
    }

    /// Evaluates the rules from `from.first_rule` on, at `now_us`.
    #[allow(clippy::too_many_arguments)]
    fn evaluate_from<F: FactSource, S: SharedStore>(
        &self,
        eval: &mut Evaluation,
        store: &S,
        worker: &mut Worker,
        seed: &Seed,
        facts: &mut Facts<'_, F>,
        from: Resume,
        now_us: u64,
    ) {
        for rule in self.config.rules.iter().skip(from.first_rule) {
            if eval.stopped() {
                break;
            }
            let Some(applied) = applies(rule, seed, facts, now_us, eval) else {
                continue;
            };
            match (&rule.scope, self.tables.get(rule.id.index())) {
                (Scope::Local(limit), Some(RuleTables::Local(table))) => {
                    let slot = SlotDecision {
                        limit,
                        table,
                        source: Source::Slot,
                    };
                    // A rule holds a request only when no rule counted it before: it
                    // would be admitted later than they counted it.
                    let offer = rule.delay.filter(|_| !eval.counted()).map(|d| HoldOffer {
                        max_wait_us: d
                            .max_us
                            .saturating_sub(now_us.saturating_sub(from.arrived_us)),
                        room: worker.waiting.has_room(rule.id),
                    });
                    match (rule.reservoir, worker.reservoirs.table(rule.id)) {
                        (Some(settings), Some(table)) => {
                            let reservoir = ReservoirDecision {
                                settings,
                                worker: table,
                            };
                            decide_with_reservoir(eval, store, &applied, slot, reservoir, offer);
                        }
                        _ => {
                            let report = applied.report();
                            decide_in_slot(eval, store, &applied, slot, report, None, offer);
                        }
                    }
                    if let Some(held) = eval.held.as_mut() {
                        held.arrived_us = from.arrived_us;
                    }
                }
                (Scope::Concurrency(limit), Some(RuleTables::Local(table))) => {
                    let records = self
                        .adaptive_keys
                        .get(rule.id.index())
                        .and_then(Option::as_deref);
                    decide_in_flight(eval, store, &applied, limit, table, worker, records);
                }
                (Scope::Global(global), Some(RuleTables::Global { leases, .. })) => {
                    let lookup = LeaseLookup { global, leases };
                    if let Some(item) = spend_or_ask(eval, store, &applied, lookup) {
                        eval.pending.push(pending_item(applied, facts, item));
                    }
                }
                _ => {}
            }
        }
        self.after_local_decisions(eval, store, now_us);
    }

    /// Settles what a rule counted for a request (`commit`) with its actual cost (at
    /// most [`MAX_WANT`]), known at `now_us` (see
    /// [`crate::algorithms::SlotAlgorithm::settle`]). Returns whether
    /// the key's state changed: a key that lost its slot since, or a refund no longer
    /// exact, changes nothing. A concurrency rule's place is not settled here but given
    /// back with [`Engine::end_in_flight`], which knows the worker's places.
    pub fn commit<S: SharedStore>(
        &self,
        store: &S,
        commit: &PendingCommit,
        actual: u64,
        now_us: u64,
    ) -> Result<bool, UpdateError> {
        let CommitKey::Local(hash) = &commit.key else {
            return Ok(false);
        };
        // What one response may claim: as for a global rule's item (a response saying
        // 2^64 tokens would push the key's refills out of reach).
        let actual = actual.min(MAX_WANT);
        let Some(rule) = self.config.rule(commit.rule) else {
            return Ok(false);
        };
        // Counted in this Envoy's shared data: by a local rule, or by a global rule's
        // local fallback while the bridge failed (its share's slots). A concurrency
        // rule's place is given back by `end_in_flight`, which knows the worker's places.
        let (limit, table) = match (&rule.scope, self.tables.get(commit.rule.index())) {
            (Scope::Local(limit), Some(RuleTables::Local(table))) => (limit, table),
            (
                Scope::Global(GlobalRule {
                    failure_mode: FailureMode::Local(limit),
                    ..
                }),
                Some(RuleTables::Global {
                    fallback: Some(table),
                    ..
                }),
            ) => (limit, table),
            _ => return Ok(false),
        };
        let vacancy = |state: SlotState| Vacancy {
            idle_at_us: limit.idle_at_us(state),
            in_use: limit.in_use(state, now_us),
        };
        table
            .update(store, hash, now_us, vacancy, |state| {
                let next =
                    limit.settle(state, commit.counted_at_us, commit.reserved, actual, now_us);
                (next.is_some(), next)
            })
            .map(|updated| updated.result)
    }

    /// The stream of a request a concurrency rule admitted (`admitted`: its commit for
    /// the rule) ended at `now_us`, however it ended: its place is marked ended in the
    /// worker and given back. Never fails closed: when shared data refuses (an error, or
    /// every CAS attempt lost), the worker keeps it marked and [`Engine::tend_places`]
    /// gives it back on the next tick. Returns whether the key's state was written now;
    /// the error says why not.
    pub fn end_in_flight<S: SharedStore>(
        &self,
        store: &S,
        worker: &mut Worker,
        admitted: &PendingCommit,
        now_us: u64,
    ) -> Result<bool, UpdateError> {
        let CommitKey::Local(hash) = &admitted.key else {
            return Ok(false);
        };
        let id = (admitted.rule.index(), hash.set_hash, hash.fingerprint);
        let held = worker.places.get(id).ended(admitted.reserved);
        worker.places.set(id, held);
        self.give_back(store, worker, id, now_us)
            .map(|(wrote, _)| wrote)
    }

    /// The worker's tick for concurrency rules: gives back the places whose give-back
    /// failed, and re-counts in the current epoch those counted in an older one, for up to
    /// [`MAX_PLACE_UPDATES_PER_TICK`] keys. Places are only ever dropped from a key when
    /// no live worker re-counted them for a whole epoch.
    pub fn tend_places<S: SharedStore>(
        &self,
        store: &S,
        worker: &mut Worker,
        now_us: u64,
    ) -> TendedPlaces {
        let mut tended = TendedPlaces::default();
        let due = worker
            .places
            .due(place_epoch(now_us), MAX_PLACE_UPDATES_PER_TICK + 1);
        tended.more_due = due.len() > MAX_PLACE_UPDATES_PER_TICK;
        for (id, held) in due.into_iter().take(MAX_PLACE_UPDATES_PER_TICK) {
            match self.give_back(store, worker, id, now_us) {
                Ok((_, dropped)) => {
                    tended.given_back += held.ended;
                    if let (Ok(rule), true) = (u16::try_from(id.0), dropped > 0) {
                        tended.reclaimed.push((RuleId(rule), dropped));
                    }
                }
                Err(_) => tended.failed += 1,
            }
        }
        tended
    }

    /// Writes the worker's places of one key (ended ones given back, open ones re-counted
    /// in the current epoch); on success the worker's [`KeyPlaces`] say so. Returns whether
    /// the state was written and the units of other places dropped.
    fn give_back<S: SharedStore>(
        &self,
        store: &S,
        worker: &mut Worker,
        id: (usize, u64, u64),
        now_us: u64,
    ) -> Result<(bool, u64), UpdateError> {
        let held = worker.places.get(id);
        let (
            Some(Rule {
                scope: Scope::Concurrency(limit),
                ..
            }),
            Some(RuleTables::Local(table)),
        ) = (self.config.rules.get(id.0), self.tables.get(id.0))
        else {
            // Not a concurrency rule of this config: nothing of it is counted here.
            worker.places.set(id, KeyPlaces::default());
            return Ok((false, 0));
        };
        let hash = KeyHash {
            set_hash: id.1,
            fingerprint: id.2,
        };
        let vacancy = |state: SlotState| Vacancy {
            idle_at_us: Concurrency::idle_at_us(state),
            in_use: Concurrency::in_use(state, now_us),
        };
        let updated = table.update(store, &hash, now_us, vacancy, |state| {
            let (next, dropped) = limit.give_back(state, held, place_epoch(now_us));
            ((next.map(|s| s.b), dropped), next)
        })?;
        let (written, dropped) = updated.result;
        match written {
            Some(epoch) => worker.places.set(id, held.wrote(0, epoch)),
            // Nothing to write: the key lost its slot, or nothing was due.
            None if held.settled_in(place_epoch(now_us)) => {}
            None => worker.places.set(id, KeyPlaces::default()),
        }
        Ok((written.is_some(), dropped))
    }

    /// A response of a request admitted by an adaptive concurrency rule came back
    /// `latency_us` after the rule admitted it (`admitted`: the request's commit for the
    /// rule): the worker records it for its next merge ([`Engine::adapt`]).
    pub fn observe_latency(&self, worker: &mut Worker, admitted: &PendingCommit, latency_us: u64) {
        let CommitKey::Local(hash) = &admitted.key else {
            return;
        };
        if let Some(latency) = worker_latency(worker, admitted.rule, hash) {
            latency.sketch.record(latency_us);
        }
    }

    /// The response of a request admitted by an adaptive concurrency rule (`admitted`)
    /// came back `latency_us` after the rule admitted it: recorded only when it
    /// measures the service ([`crate::adaptive::measures_service`]). Returns whether it
    /// was.
    pub fn observe_response(
        &self,
        worker: &mut Worker,
        admitted: &PendingCommit,
        response: Response,
        latency_us: u64,
    ) -> bool {
        if !measures_service(response) {
            return false;
        }
        self.observe_latency(worker, admitted, latency_us);
        true
    }

    /// Whether `rule` is an adaptive concurrency rule (its latencies are wanted).
    pub fn is_adaptive(&self, rule: RuleId) -> bool {
        self.adaptive_keys
            .get(rule.index())
            .is_some_and(Option::is_some)
    }

    /// The worker's tick for adaptive concurrency rules: adds what it saw since its last
    /// merge into each controller's record in shared data (CAS) — the rule's, or with
    /// `per_key` each key's the worker saw lately — which runs the controller when the
    /// interval is over (see [`crate::adaptive`]), and takes the limit back. A record
    /// that cannot be updated keeps the samples for the next tick.
    pub fn adapt<S: SharedStore>(
        &self,
        store: &S,
        worker: &mut Worker,
        now_us: u64,
    ) -> Vec<Adapted> {
        let mut adapted = Vec::new();
        for rule in &self.config.rules {
            let (Scope::Concurrency(limit), Some(Some(base))) =
                (&rule.scope, self.adaptive_keys.get(rule.id.index()))
            else {
                continue;
            };
            let Some(adaptive) = &limit.adaptive else {
                continue;
            };
            if let Some(keyed) = worker.keyed(rule.id) {
                let records = KeyRecords {
                    store,
                    base,
                    adaptive,
                    max_in_flight: limit.max_in_flight,
                };
                // Keys not seen for a while are forgotten: their records go stale (a
                // while later) and can serve other keys.
                keyed.forget_idle(now_us.saturating_sub(adaptive.forget_after_us()));
                for (&(set_hash, fingerprint), entry) in keyed.entries.iter_mut() {
                    let hash = KeyHash {
                        set_hash,
                        fingerprint,
                    };
                    let Some(index) = entry.record else {
                        // A key without a controller looks for one again.
                        if let Some((index, limit)) = records.find(&hash, now_us) {
                            entry.record = Some(index);
                            entry.latency.merged(limit);
                        }
                        continue;
                    };
                    let owner = fingerprint.max(1);
                    let merged = merge_record(
                        store,
                        &key_record(base, index),
                        &entry.latency,
                        (adaptive, limit.max_in_flight),
                        Some(owner),
                        now_us,
                    );
                    match merged {
                        Merge::Done(controller, now_limit) => {
                            entry.latency.merged(now_limit);
                            adapted.push(Adapted {
                                rule: rule.id,
                                controller,
                                limit: now_limit,
                                key: Some(owner),
                            });
                        }
                        // Taken by another key while this one was idle: look again.
                        Merge::NotOwner => {
                            entry.record = None;
                            entry.latency.merged(limit.max_in_flight);
                        }
                        Merge::Failed => {}
                    }
                }
                continue;
            }
            let Some(latency) = worker.latency(rule.id) else {
                continue;
            };
            let merged = merge_record(
                store,
                base,
                latency,
                (adaptive, limit.max_in_flight),
                None,
                now_us,
            );
            if let Merge::Done(controller, now_limit) = merged {
                latency.merged(now_limit);
                adapted.push(Adapted {
                    rule: rule.id,
                    controller,
                    limit: now_limit,
                    key: None,
                });
            }
        }
        adapted
    }

    /// The bridge item settling a global rule's commit with its actual cost (capped at
    /// what one item may carry); `None` for a local rule's.
    pub fn global_commit(&self, commit: &PendingCommit, actual: u64) -> Option<v3::CommitItem> {
        let CommitKey::Global(descriptor) = &commit.key else {
            return None;
        };
        let rule = self.config.rule(commit.rule)?;
        let Scope::Global(global) = &rule.scope else {
            return None;
        };
        Some(v3::CommitItem {
            rule: rule.name.clone(),
            descriptor: descriptor.clone(),
            limit: WireLimit::from(&global.redis_limit),
            counted_at_us: commit.counted_at_us,
            reserved: commit.reserved,
            actual: actual.min(MAX_WANT),
        })
    }

    /// The body of a `/v3/commit` call.
    pub fn commit_request(&self, items: Vec<v3::CommitItem>) -> Vec<u8> {
        let domain = self
            .config
            .bridge
            .as_ref()
            .map_or("weir", |b| b.domain.as_str())
            .to_string();
        serde_json::to_vec(&v3::CommitRequest { domain, items }).unwrap_or_default()
    }

    /// Looks again at the rules still waiting for the bridge, at `now_us`: another call
    /// for the same keys (single flight) may have left units or a denial since. Each rule
    /// served that way is decided; the others stay pending, asking for what their
    /// Envoy's demand now says.
    pub fn revisit<S: SharedStore>(&self, eval: &mut Evaluation, store: &S, now_us: u64) {
        let pending = std::mem::take(&mut eval.pending);
        for mut item in pending {
            if eval.denied() {
                break;
            }
            let (Some(rule), Some(RuleTables::Global { leases, .. })) = (
                self.config.rule(item.rule),
                self.tables.get(item.rule.index()),
            ) else {
                continue;
            };
            let Scope::Global(global) = &rule.scope else {
                continue;
            };
            let applied = Applied {
                rule,
                hash: item.hash,
                cost: item.cost,
                now_us,
            };
            let lookup = LeaseLookup { global, leases };
            if let Some(asked) = spend_or_ask(eval, store, &applied, lookup) {
                item.want = asked.want;
                item.reserve = asked.reserve;
                item.last_known = asked.last_known;
                item.lookup = asked.lookup;
                eval.pending.push(item);
            }
        }
        self.after_local_decisions(eval, store, now_us);
    }

    /// Once every rule has been looked at: a denied request asks nobody; otherwise the
    /// pending rules go to the bridge, unless it failed a moment ago.
    fn after_local_decisions<S: SharedStore>(&self, eval: &mut Evaluation, store: &S, now_us: u64) {
        if eval.denied() {
            eval.pending.clear();
        } else if !eval.pending.is_empty() && self.bridge_down(store, now_us) {
            self.fail_pending(eval, store, now_us, BridgeError::Skipped);
        }
    }

    /// The body of the `POST /v2/acquire` call for `pending`: one item per pending rule,
    /// with the rule's id.
    pub fn bridge_request(&self, pending: &[PendingItem]) -> Vec<u8> {
        let domain = self
            .config
            .bridge
            .as_ref()
            .map_or("weir", |b| b.domain.as_str());
        let items: Vec<v2::Item> = pending
            .iter()
            .filter_map(|item| {
                let rule = self.config.rule(item.rule)?;
                let Scope::Global(global) = &rule.scope else {
                    return None;
                };
                Some(v2::Item {
                    id: rule.id.0,
                    rule: rule.name.clone(),
                    descriptor: item.descriptor.clone(),
                    limit: WireLimit::from(&global.redis_limit),
                    cost: item.cost,
                    want: item.want,
                    reserve: item.reserve,
                    hold_us: global.lease.map_or(0, |l| l.hold_us),
                    horizon_us: global.lease.map_or(0, |l| l.horizon_us),
                    shadow: rule.shadow,
                })
            })
            .collect();
        let request = v2::Request {
            domain: domain.to_string(),
            items,
        };
        serde_json::to_vec(&request).unwrap_or_default()
    }

    /// What a reply to `pending` is checked against (see [`v2::decode_reply`]).
    pub fn sent(&self, pending: &[PendingItem]) -> Vec<Sent> {
        pending
            .iter()
            .map(|item| Sent {
                id: item.rule.0,
                shadow: self.config.rule(item.rule).is_some_and(|r| r.shadow),
            })
            .collect()
    }

    /// Finishes an evaluation with the bridge's reply (or its failure), at `now_us`. The
    /// call left at `sent_at_us`: Redis decided between the two, and what it granted is
    /// anchored on both ([`Held::from_reply`]).
    pub fn complete<S: SharedStore>(
        &self,
        eval: &mut Evaluation,
        store: &S,
        sent_at_us: u64,
        now_us: u64,
        reply: Result<v2::Reply, ReplyError>,
    ) {
        let reply = match reply {
            Ok(reply) => reply,
            Err(error) => {
                self.note_bridge_down(store, now_us.saturating_add(BRIDGE_BACKOFF_US));
                self.fail_pending(eval, store, now_us, BridgeError::Reply(error));
                return;
            }
        };
        let pending = std::mem::take(&mut eval.pending);
        // Each result names its item by rule id; items after the bridge stopped were not
        // decided, and are not charged.
        for result in &reply.items {
            let Some(item) = pending.iter().find(|item| item.rule.0 == result.id) else {
                continue;
            };
            self.settle(eval, store, item, result, sent_at_us, now_us);
        }
    }

    /// Records the bridge's answer for one pending rule and writes what it leaves for
    /// later requests: units held, or a cached denial.
    fn settle<S: SharedStore>(
        &self,
        eval: &mut Evaluation,
        store: &S,
        item: &PendingItem,
        result: &Granted,
        sent_at_us: u64,
        now_us: u64,
    ) {
        let (Some(rule), Some(RuleTables::Global { leases, .. })) = (
            self.config.rule(item.rule),
            self.tables.get(item.rule.index()),
        ) else {
            return;
        };
        let Scope::Global(global) = &rule.scope else {
            return;
        };
        let settled = settled_from(
            item,
            result,
            sent_at_us,
            now_us,
            global,
            rule.commit.is_some(),
        );
        let stored = leases.update(
            store,
            &item.hash,
            now_us,
            |s: LeaseSlot| s.vacancy(),
            |state| ((), Some(state.unwrap_or_default().settle(settled, now_us))),
        );
        let mut report = RuleReport {
            source: Some(Source::Bridge),
            decided_at_us: result.now_us,
            ..item.lookup
        };
        report.add_update(&stored);
        if let Err(e) = stored {
            report.lease_store_error.get_or_insert(e);
        }
        let quota = global.limit.policy().quota;
        let decision = Decision {
            limit: quota,
            remaining: result.remaining.min(quota),
            ..result.decision()
        };
        if result.allowed && rule.commit.is_some() && item.cost > 0 {
            // Counted in Redis at its clock: settled there when the response ends.
            eval.commits.push(PendingCommit {
                rule: rule.id,
                key: CommitKey::Global(item.descriptor.clone()),
                reserved: item.cost,
                counted_at_us: result.now_us,
            });
        }
        eval.record(report, rule, decision);
    }

    /// Applies each pending rule's failure mode now, without asking the bridge and
    /// without holding later calls back.
    pub fn fail_now<S: SharedStore>(
        &self,
        eval: &mut Evaluation,
        store: &S,
        now_us: u64,
        error: BridgeError,
    ) {
        self.fail_pending(eval, store, now_us, error);
    }

    /// Applies each pending rule's failure mode.
    fn fail_pending<S: SharedStore>(
        &self,
        eval: &mut Evaluation,
        store: &S,
        now_us: u64,
        error: BridgeError,
    ) {
        eval.bridge_error = Some(error);
        let pending = std::mem::take(&mut eval.pending);
        for item in pending {
            if eval.denied() {
                break;
            }
            let Some(rule) = self.config.rule(item.rule) else {
                continue;
            };
            let Scope::Global(global) = &rule.scope else {
                continue;
            };
            let mut report = RuleReport {
                decided_at_us: now_us,
                ..item.lookup
            };
            match &global.failure_mode {
                FailureMode::Allow => {
                    report.outcome = RuleOutcome::BridgeFailed(FailureOutcome::Allowed);
                    eval.reports.push(report);
                }
                FailureMode::Deny => {
                    report.outcome = RuleOutcome::BridgeFailed(FailureOutcome::Denied);
                    eval.reports.push(report);
                    if rule.shadow {
                        eval.shadow_limited.push(rule.id);
                    } else {
                        eval.unavailable = Some(rule.id);
                    }
                }
                FailureMode::Local(limit) => {
                    let Some(RuleTables::Global {
                        fallback: Some(table),
                        ..
                    }) = self.tables.get(rule.id.index())
                    else {
                        continue;
                    };
                    let seed = item.last_known.map(|(remaining, at_us)| {
                        limit.state_with_remaining(remaining / global.expected_instances, at_us)
                    });
                    let applied = Applied {
                        rule,
                        hash: item.hash,
                        cost: item.cost,
                        now_us,
                    };
                    let slot = SlotDecision {
                        limit,
                        table,
                        source: Source::Fallback,
                    };
                    decide_in_slot(eval, store, &applied, slot, report, seed, None);
                    // The verdict is recorded; the report says how it came.
                    if let Some(last) = eval.reports.last_mut() {
                        if let RuleOutcome::Allowed | RuleOutcome::Limited = last.outcome {
                            let allowed = last.outcome == RuleOutcome::Allowed;
                            last.outcome =
                                RuleOutcome::BridgeFailed(FailureOutcome::Local { allowed });
                        }
                    }
                }
            }
        }
    }

    /// The verdicts as the response headers name them.
    pub fn rule_verdicts<'c>(&'c self, eval: &Evaluation) -> Vec<RuleVerdict<'c>> {
        eval.verdicts
            .iter()
            .filter_map(|v| {
                let rule = self.config.rule(v.rule)?;
                let mut policy = rule.policy();
                if let Scope::Concurrency(_) = rule.scope {
                    // An adaptive rule's quota is the limit the request met, not its
                    // ceiling (the same for a fixed one).
                    policy.quota = v.decision.limit;
                }
                Some(RuleVerdict {
                    rule: &rule.name,
                    decision: v.decision,
                    policy,
                })
            })
            .collect()
    }

    /// How much of the request body to read before deciding: the largest `max_bytes` of
    /// the rules matching this request whose cost is estimated from the body, or `None`
    /// when none is (the request is decided on its headers).
    pub fn request_body_wanted<S: FactSource>(&self, facts: &mut Facts<'_, S>) -> Option<usize> {
        let mut wanted = None;
        for rule in &self.config.rules {
            let Cost::FromRequest { fact, .. } = rule.cost else {
                continue;
            };
            let Some(Fact::RequestBodyEstimate(estimate)) = self.config.facts.get(fact) else {
                continue;
            };
            if rule.matches(facts) {
                wanted = wanted.max(Some(estimate.max_bytes));
            }
        }
        wanted
    }

    /// Whether a rule that reads its cost from the response body (`commit.body`) matches
    /// the request: the filter then asks the upstream for an uncompressed body, which is
    /// the only kind it can read.
    pub fn reads_response_body<S: FactSource>(&self, facts: &mut Facts<'_, S>) -> bool {
        self.config.rules.iter().any(|rule| {
            matches!(
                rule.commit,
                Some(Commit {
                    source: CommitSource::Body { .. },
                    ..
                })
            ) && rule.matches(facts)
        })
    }

    pub fn rule_name(&self, rule: RuleId) -> &str {
        self.config.rule(rule).map_or("", |r| r.name.as_str())
    }

    /// Whether calls for `rule` may be shared between requests (see `crate::flight`): a
    /// global rule with leases, whose answers serve whoever comes next.
    pub fn shares_calls(&self, rule: RuleId) -> bool {
        matches!(
            self.config.rule(rule).map(|r| &r.scope),
            Some(Scope::Global(GlobalRule { lease: Some(_), .. }))
        )
    }

    fn bridge_down<S: SharedStore>(&self, store: &S, now_us: u64) -> bool {
        let Ok((Some(value), _)) = store.get(&self.bridge_down_key) else {
            return false;
        };
        let until = <[u8; 8]>::try_from(value.as_slice()).map_or(0, u64::from_le_bytes);
        now_us < until
    }

    /// Remembers that the bridge failed: calls are skipped until `until_us`. Racing
    /// writers each write a time about a second ahead; whichever lands is good enough.
    fn note_bridge_down<S: SharedStore>(&self, store: &S, until_us: u64) {
        let key = &self.bridge_down_key;
        let value = until_us.to_le_bytes();
        let _ = match store.get(key) {
            Ok((_, Some(version))) => store.compare_and_set(key, &value, version),
            Ok((_, None)) => store.create(key, &value),
            Err(e) => Err(e),
        };
    }
}

/// A global rule's lease table is labelled with the limit Redis enforces, parameters
/// included: units held or denials cached under other parameters never apply.
fn lease_label(global: &GlobalRule) -> String {
    let values: Vec<String> = global
        .redis_limit
        .algorithm()
        .parameters()
        .iter()
        .map(u64::to_string)
        .collect();
    format!("lease-{}-{}", global.redis_limit.kind(), values.join("-"))
}

/// Decides a limit in a slot table and records it; a store failure lets the request
/// through and is reported. A key without state starts from `seed` when there is one
/// (a local fallback starts from what this Envoy last knew of the global key, so an
/// exhausted key does not restart full).
fn decide_in_slot<S: SharedStore>(
    eval: &mut Evaluation,
    store: &S,
    applied: &Applied<'_>,
    slot: SlotDecision<'_>,
    mut report: RuleReport,
    seed: Option<SlotState>,
    offer: Option<HoldOffer>,
) {
    let now_us = applied.now_us;
    report.source = Some(slot.source);
    let updated = slot.update(store, applied, |state| {
        let state = state.or(seed);
        match offer.filter(|o| o.room) {
            Some(o) => {
                let (decision, hold, next) =
                    slot.limit
                        .hold(state, now_us, applied.cost, o.max_wait_us, RELEASE_SLACK_US);
                ((decision, hold), next)
            }
            None => {
                let (decision, next) = slot.limit.decide(state, now_us, applied.cost);
                ((decision, None), next)
            }
        }
    });
    report.add_update(&updated);
    match updated {
        Ok(updated) => {
            let (decision, hold) = updated.result;
            if decision.allowed && applied.rule.commit.is_some() && applied.cost > 0 {
                eval.commits.push(PendingCommit {
                    rule: applied.rule.id,
                    key: CommitKey::Local(applied.hash),
                    reserved: applied.cost,
                    counted_at_us: now_us,
                });
            }
            record_or_hold(eval, report, applied.rule, decision, hold, offer);
        }
        Err(error) => {
            report.outcome = RuleOutcome::StoreFailed(error);
            eval.reports.push(report);
        }
    }
}

/// A concurrency rule: the key's count in flight against the rule's limit (the
/// worker's adaptive limit of the moment, or `max_in_flight`). An admission is given
/// back when the stream ends ([`PendingCommit`], given back by [`Engine::end_in_flight`]
/// on the worker that admitted it, which keeps its places in [`Worker::places`]).
fn decide_in_flight<S: SharedStore>(
    eval: &mut Evaluation,
    store: &S,
    applied: &Applied<'_>,
    limit: &Concurrency,
    table: &SlotTable,
    worker: &mut Worker,
    records: Option<&str>,
) {
    let mut report = applied.report();
    report.source = Some(Source::Slot);
    let now_limit = match (limit.adaptive, worker.keyed(applied.rule.id), records) {
        (Some(adaptive), Some(keyed), Some(base)) => {
            let found = KeyRecords {
                store,
                base,
                adaptive: &adaptive,
                max_in_flight: limit.max_in_flight,
            }
            .entry(keyed, &applied.hash, applied.now_us);
            match found {
                Some(entry) if entry.record.is_some() => entry.latency.limit,
                _ => {
                    report.key_without_controller = true;
                    limit.max_in_flight
                }
            }
        }
        _ => worker
            .latency(applied.rule.id)
            .map_or(limit.max_in_flight, |l| l.limit),
    };
    let now_us = applied.now_us;
    let vacancy = |state: SlotState| Vacancy {
        idle_at_us: Concurrency::idle_at_us(state),
        in_use: Concurrency::in_use(state, now_us),
    };
    let id = (
        applied.rule.id.index(),
        applied.hash.set_hash,
        applied.hash.fingerprint,
    );
    let held = worker.places.get(id);
    let epoch = place_epoch(now_us);
    let updated = table.update(store, &applied.hash, now_us, vacancy, |state| {
        limit.admit(state, held, epoch, now_limit, applied.cost)
    });
    report.add_update(&updated);
    match updated {
        Ok(updated) => {
            let admission = updated.result;
            let decision = admission.decision;
            report.in_flight_reclaimed = admission.dropped;
            if updated.placement.is_some() {
                let admitted = if decision.allowed { applied.cost } else { 0 };
                worker.places.set(id, held.wrote(admitted, admission.epoch));
            }
            let in_flight = decision.limit.saturating_sub(decision.remaining);
            if let Some(latency) = worker_latency(worker, applied.rule.id, &applied.hash) {
                latency.peak_in_flight = latency.peak_in_flight.max(in_flight);
            }
            if decision.allowed && applied.cost > 0 {
                eval.commits.push(PendingCommit {
                    rule: applied.rule.id,
                    key: CommitKey::Local(applied.hash),
                    reserved: applied.cost,
                    counted_at_us: applied.now_us,
                });
            }
            eval.record(report, applied.rule, decision);
        }
        Err(error) => {
            report.outcome = RuleOutcome::StoreFailed(error);
            eval.reports.push(report);
        }
    }
}

/// What merging a worker's latencies into a controller's record came to.
enum Merge {
    /// The controller after the merge, and the limit to decide with.
    Done(ControllerState, u64),
    /// With `per_key`: the record belongs to another key now.
    NotOwner,
    /// Shared data failed, or CAS lost every race: the samples wait for the next tick.
    Failed,
}

/// Adds `latency` into the record at `key` with CAS (see [`SharedRecord::merge`]); with
/// `owner`, only while the record is that key's.
fn merge_record<S: SharedStore>(
    store: &S,
    key: &str,
    latency: &WorkerLatency,
    (adaptive, max_in_flight): (&Adaptive, u64),
    owner: Option<u64>,
    now_us: u64,
) -> Merge {
    for _ in 0..crate::store::MAX_CAS_ATTEMPTS {
        let Ok((value, Some(version))) = store.get(key) else {
            return Merge::Failed;
        };
        let current = value.as_deref().and_then(SharedRecord::decode);
        if owner.is_some() && current.as_ref().map(|r| r.owner) != owner {
            return Merge::NotOwner;
        }
        let record = SharedRecord::merge(current, latency, adaptive, max_in_flight, now_us);
        match store.compare_and_set(key, &record.encode(), version) {
            Ok(()) => {
                let now_limit = record
                    .controller
                    .limit()
                    .clamp(adaptive.min_limit, max_in_flight);
                return Merge::Done(record.controller, now_limit);
            }
            Err(StoreError::CasMismatch) => continue,
            Err(_) => return Merge::Failed,
        }
    }
    Merge::Failed
}

/// The latencies a worker gathers for `rule` — for the key `hash` with `per_key`.
fn worker_latency<'w>(
    worker: &'w mut Worker,
    rule: RuleId,
    hash: &KeyHash,
) -> Option<&'w mut WorkerLatency> {
    if worker.keyed(rule).is_some() {
        return worker
            .keyed(rule)?
            .entries
            .get_mut(&(hash.set_hash, hash.fingerprint))
            .map(|e| &mut e.latency);
    }
    worker.latency(rule)
}

/// The shared-data key of record `index` of a `per_key` rule whose records start with
/// `base`.
fn key_record(base: &str, index: u32) -> String {
    format!("{base}/{index}")
}

/// The records of a `per_key` rule's controllers in shared data.
struct KeyRecords<'a, S> {
    store: &'a S,
    base: &'a str,
    adaptive: &'a Adaptive,
    /// The rule's ceiling now: a record's limit from before a reload that lowered it
    /// is clamped to it.
    max_in_flight: u64,
}

impl<S: SharedStore> KeyRecords<'_, S> {
    /// The worker's entry for the key `hash`, made the first time the worker sees the key
    /// (finding or claiming its controller's record); `None` when the worker's table is
    /// full of keys with samples waiting.
    fn entry<'k>(
        &self,
        keyed: &'k mut KeyedLatencies,
        hash: &KeyHash,
        now_us: u64,
    ) -> Option<&'k mut KeyedEntry> {
        let id = (hash.set_hash, hash.fingerprint);
        if !keyed.entries.contains_key(&id) {
            if !keyed.make_room() {
                return None;
            }
            let mut latency = WorkerLatency::new(self.adaptive);
            let record = self.find(hash, now_us).map(|(index, limit)| {
                latency.limit = limit;
                index
            });
            keyed.entries.insert(
                id,
                KeyedEntry {
                    latency,
                    record,
                    last_seen_us: now_us,
                },
            );
        }
        let entry = keyed.entries.get_mut(&id)?;
        entry.last_seen_us = now_us;
        Some(entry)
    }

    /// The record holding the key's controller and its limit: the key's own among the
    /// [`KEY_PROBES`] records from the one its hash names, else the first of them that is
    /// free, claimed with a fresh controller. `None` when all belong to active keys.
    fn find(&self, hash: &KeyHash, now_us: u64) -> Option<(u32, u64)> {
        let records = self.adaptive.key_controllers?;
        let owner = hash.fingerprint.max(1);
        let first = hash.set_hash % u64::from(records);
        let mut free = None;
        for probe in 0..u64::from(KEY_PROBES.min(records)) {
            let index = u32::try_from((first + probe) % u64::from(records)).ok()?;
            let Ok((value, Some(version))) = self.store.get(&key_record(self.base, index)) else {
                continue;
            };
            match value.as_deref().and_then(SharedRecord::decode) {
                Some(r) if r.owner == owner => {
                    let limit = r
                        .controller
                        .limit()
                        .clamp(self.adaptive.min_limit, self.max_in_flight);
                    return Some((index, limit));
                }
                Some(r) if !r.free_for(owner, self.adaptive, now_us) => {}
                _ => {
                    free = free.or(Some((index, version)));
                }
            }
        }
        let (index, version) = free?;
        let claimed = SharedRecord::claimed(owner, self.adaptive, now_us);
        self.store
            .compare_and_set(&key_record(self.base, index), &claimed.encode(), version)
            .ok()?;
        Some((index, claimed.controller.limit()))
    }
}

/// Records a local rule's decision, or holds the request when the rule did.
fn record_or_hold(
    eval: &mut Evaluation,
    mut report: RuleReport,
    rule: &Rule,
    decision: Decision,
    hold: Option<Hold>,
    offer: Option<HoldOffer>,
) {
    if let Some(hold) = hold {
        eval.hold(report, rule, decision, hold);
        return;
    }
    report.delay_queue_full =
        !decision.allowed && offer.is_some_and(|o| !o.room && o.covers(decision.retry_after_ns));
    eval.record(report, rule, decision);
}

/// A local rule's reservoir settings and this worker's table of them.
struct ReservoirDecision<'a> {
    settings: Reservoir,
    worker: &'a mut WorkerTable,
}

/// A local rule with reservoirs: served from what this worker took ahead for the key, or
/// denied by what it cached, with no shared-data call; otherwise decided in the slot
/// like any local rule, taking ahead what the worker's demand for the key would spend
/// within the hold (see [`Limit::take_ahead`]).
fn decide_with_reservoir<S: SharedStore>(
    eval: &mut Evaluation,
    store: &S,
    applied: &Applied<'_>,
    slot: SlotDecision<'_>,
    reservoir: ReservoirDecision<'_>,
    offer: Option<HoldOffer>,
) {
    let now_us = applied.now_us;
    let cost = applied.cost;
    let mut report = applied.report();
    let (entry, found) = reservoir.worker.entry(&applied.hash, now_us);
    report.reservoir_lost = match found {
        Found::Evicted { lost_units } => Some(lost_units),
        Found::Existing | Found::Empty => None,
    };
    let held_before = entry.held.count;
    let (spend, next) = entry.spend(now_us, cost);
    *entry = next;
    let spent = match spend {
        Spend::Spent { .. } => cost,
        _ => 0,
    };
    report.reservoir_expired = held_before.saturating_sub(spent + next.held.count);
    let quota = slot.limit.policy().quota;
    // A cached denial the rule's delay covers goes to shared data, to be held there.
    let demand_per_s = match spend {
        Spend::Miss { demand_per_s } => demand_per_s,
        Spend::Denied { retry_after_ns }
            if offer.is_some_and(|o| o.covers(Some(retry_after_ns))) =>
        {
            0
        }
        _ => {
            if let Some(served) = Served::from_spend(spend, &next, quota, now_us, Source::Reservoir)
            {
                served.record(eval, report, applied.rule);
            }
            return;
        }
    };
    // Units still held (too few for this request) are not added to: a worker keeps one
    // take at a time.
    let settings = reservoir.settings;
    let ahead = Ahead {
        max: if entry.held.count > 0 {
            0
        } else {
            settings.max.saturating_sub(cost)
        },
        demand_per_s,
        hold_us: settings.hold_us,
    };
    report.source = Some(Source::Slot);
    let updated = slot.update(store, applied, |state| {
        let (decision, taken, next) = slot.limit.take_ahead(state, now_us, cost, ahead);
        match offer.filter(|o| o.room && !decision.allowed) {
            Some(o) => {
                let (decision, hold, next) =
                    slot.limit
                        .hold(state, now_us, cost, o.max_wait_us, RELEASE_SLACK_US);
                ((decision, TakenAhead::default(), hold), next)
            }
            None => ((decision, taken, None), next),
        }
    });
    report.add_update(&updated);
    let (decision, taken, hold) = match updated {
        Ok(updated) => updated.result,
        Err(error) => {
            report.outcome = RuleOutcome::StoreFailed(error);
            eval.reports.push(report);
            return;
        }
    };
    if hold.is_some() {
        // Nothing to cache: the request has its place in the schedule.
        *entry = entry.settle(
            Settled {
                outcome: SettledOutcome::Nothing,
                exhausted_until_us: 0,
                remaining: decision.remaining,
                reset_after_ns: decision.reset_after_ns,
            },
            now_us,
        );
        record_or_hold(eval, report, applied.rule, decision, hold, offer);
        return;
    }
    let outcome = if taken.units > 0 {
        // Spendable until just before the end of their validity (a window's end belongs
        // to the next window).
        let window_us = (taken.valid_ns / NS_PER_US).saturating_sub(1);
        SettledOutcome::Held(Held {
            count: taken.units,
            next_due_ns: now_us.saturating_mul(NS_PER_US),
            spacing_ns: 0,
            window_us,
        })
    } else if let (false, Some(retry_after_ns)) = (decision.allowed, decision.retry_after_ns) {
        SettledOutcome::Denied {
            until_us: now_us.saturating_add(retry_after_ns / NS_PER_US),
            cost,
        }
    } else {
        SettledOutcome::Nothing
    };
    let settled = Settled {
        outcome,
        exhausted_until_us: 0,
        remaining: decision.remaining.saturating_sub(taken.units),
        reset_after_ns: decision.reset_after_ns,
    };
    *entry = entry.settle(settled, now_us);
    report.reservoir_taken = taken.units;
    record_or_hold(eval, report, applied.rule, decision, None, offer);
}

/// A global rule and its lease table.
struct LeaseLookup<'a> {
    global: &'a GlobalRule,
    leases: &'a SlotTable<LeaseSlot>,
}

/// What a global rule that must ask the bridge asks for.
struct Asked {
    want: u64,
    reserve: u64,
    last_known: Option<(u64, u64)>,
    lookup: RuleReport,
}

/// A global rule: served from what this Envoy holds for the key (units due, a
/// reservation not due yet, a cached denial) — then recorded here — or it must ask the
/// bridge, for as much as this Envoy's demand says.
fn spend_or_ask<S: SharedStore>(
    eval: &mut Evaluation,
    store: &S,
    applied: &Applied<'_>,
    lookup: LeaseLookup<'_>,
) -> Option<Asked> {
    let now_us = applied.now_us;
    let mut report = applied.report();
    let spent = lookup.leases.update(
        store,
        &applied.hash,
        now_us,
        |s: LeaseSlot| s.vacancy(),
        |state| {
            let (spend, next) = state.unwrap_or_default().spend(now_us, applied.cost);
            ((spend, next), Some(next))
        },
    );
    report.add_update(&spent);
    let (spend, slot) = match spent {
        Ok(updated) => updated.result,
        Err(e) => {
            report.lease_store_error = Some(e);
            (Spend::Miss { demand_per_s: 0 }, LeaseSlot::default())
        }
    };
    let quota = lookup.global.limit.policy().quota;
    if let Some(served) = Served::from_spend(spend, &slot, quota, now_us, Source::Lease) {
        served.record(eval, report, applied.rule);
        return None;
    }
    let Spend::Miss { demand_per_s } = spend else {
        return None;
    };
    let (want, reserve) = ask_for(lookup.global, &slot, applied.cost, demand_per_s);
    Some(Asked {
        want,
        reserve,
        last_known: (slot.remote_at_us > 0).then_some((slot.remote_remaining, slot.remote_at_us)),
        lookup: report,
    })
}

/// How much a global rule asks for: exact rules their cost. With leases, what this
/// Envoy's demand would spend within the hold — but no more than an even share of what
/// Redis had left last time — and, for a saturated GCRA key, what it would spend over the
/// reservation horizon.
fn ask_for(global: &GlobalRule, slot: &LeaseSlot, cost: u64, demand_per_s: u64) -> (u64, u64) {
    let Some(lease) = global.lease else {
        return (cost, 0);
    };
    if slot.held.count > 0 {
        // Units held (too few for this request, or a reservation it cannot use): ask
        // for this request alone, so a grant never replaces units Redis has counted.
        return (cost, 0);
    }
    let over = |span_us: u64| {
        let units = u128::from(demand_per_s) * u128::from(span_us);
        u64::try_from(units.div_ceil(1_000_000)).unwrap_or(u64::MAX)
    };
    let mut want = over(lease.hold_us);
    if slot.remote_at_us > 0 {
        let share = (slot.remote_remaining / global.expected_instances.max(1)).max(1);
        want = want.min(share);
    }
    let want = want.clamp(cost, lease.max.max(cost));
    let reserve = if has_schedule(global) && lease.horizon_us > 0 {
        over(lease.horizon_us).clamp(cost, lease.max.max(cost))
    } else {
        0
    };
    (want, reserve)
}

/// Whether the rule's Redis limit has a schedule whose slots can be reserved (GCRA).
fn has_schedule(global: &GlobalRule) -> bool {
    matches!(global.redis_limit, GlobalLimit::Slot(Limit::Gcra(_)))
}

/// A global rule queued for the bridge, with its descriptor (built only now: facts are
/// cached, so visiting the key again costs no host call).
fn pending_item<F: FactSource>(
    applied: Applied<'_>,
    facts: &mut Facts<'_, F>,
    asked: Asked,
) -> PendingItem {
    let mut descriptor = Vec::new();
    applied.rule.visit_key(facts, |origin, bytes| {
        descriptor.push(encode_part(origin, bytes))
    });
    PendingItem {
        rule: applied.rule.id,
        hash: applied.hash,
        descriptor,
        cost: applied.cost,
        want: asked.want,
        reserve: asked.reserve,
        last_known: asked.last_known,
        lookup: asked.lookup,
    }
}

/// What a result leaves in the key's slot: the units granted beyond the request's own
/// (a lease's leftover, or a whole reservation), or a cached denial for requests of at
/// least this cost, until the result's retry time counted from when the call left.
///
/// A saturated token bucket or sliding-window counter frees a unit or two at a time and
/// every Envoy would ask for each: such a key is asked about at most once per horizon —
/// a cached denial lasts at least that long, and so does one after a grant that left
/// Redis with nothing. What frees up meanwhile is not lost: it waits in Redis (tokens up
/// to the capacity, a window's unspent share) for whoever asks next. GCRA reserves its
/// schedule instead; a fixed window's retry time is its end anyway; a sliding log's unit
/// claimed late would leave the log late too, so it is asked for when due.
fn settled_from(
    item: &PendingItem,
    result: &Granted,
    sent_at_us: u64,
    now_us: u64,
    global: &GlobalRule,
    commits: bool,
) -> Settled {
    let floor_us = match (&global.redis_limit, global.lease) {
        (GlobalLimit::Slot(Limit::TokenBucket(_) | Limit::SlidingWindow(_)), Some(lease)) => {
            lease.horizon_us
        }
        _ => 0,
    };
    let extra = if result.allowed {
        result.granted.saturating_sub(item.cost)
    } else {
        result.granted
    };
    let outcome = if extra > 0 {
        let held = Held::from_reply(
            extra,
            result.due_ns,
            result.spacing_ns,
            result.valid_ns,
            sent_at_us,
            now_us,
        );
        SettledOutcome::Held(held)
    } else if !result.allowed {
        let mut retry_us = result.retry_after_ns.unwrap_or(result.reset_after_ns) / 1_000;
        if commits {
            // Commits give units back at any time: a denial is trusted only briefly.
            retry_us = retry_us.min(COMMIT_DENIAL_CACHE_US);
        }
        SettledOutcome::Denied {
            until_us: sent_at_us.saturating_add(retry_us.max(floor_us)),
            cost: item.cost,
        }
    } else {
        SettledOutcome::Nothing
    };
    let exhausted_until_us = if result.allowed && result.remaining == 0 && floor_us > 0 {
        sent_at_us.saturating_add(floor_us)
    } else {
        0
    };
    Settled {
        outcome,
        exhausted_until_us,
        remaining: result.remaining,
        reset_after_ns: result.reset_after_ns,
    }
}
