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
//! reported, to be counted. A call Envoy could not deliver (no healthy host, a
//! connection refused or reset) is sent once more within the bridge's timeout: Envoy
//! picks a host again ([`Engine::resend_timeout_ms`]). When the bridge fails (no
//! response, timeout, an error status, a bad reply), each pending rule applies its
//! failure mode; once [`BRIDGE_FAILURES_TO_SKIP`] calls have failed in a row over
//! [`BRIDGE_FAILING_FOR_US`], further calls of this plugin are skipped for
//! [`BRIDGE_BACKOFF_US`] so that a dead bridge does not cost every request a failed call.
//!
//! Each rule runs as one value built with the engine, its scope's parameters with the
//! tables it owns (`runtime.rs`); each scope has its file, and each file uses only the
//! ones listed before it (`core/tests/layers.rs` checks):
//!
//! - `report.rs`: what one rule did on one request (outcome, source, report, verdict).
//! - `evaluation.rs`: one request's evaluation, its pending items and commits, and the
//!   steps every scope shares.
//! - `local.rs`: local rules, in a slot table, a worker's reservoir or a held request
//!   (and a global rule's local fallback).
//! - `fair_share.rs`: local rules whose limit their keys share fairly (`share`).
//! - `in_flight.rs`: concurrency rules (requests in flight per key), their places and
//!   adaptive controllers.
//! - `asking.rs`: how much a global rule's call asks the bridge for.
//! - `global.rs`: global rules, their leases, the bridge's answers and failure modes.
//! - `runtime.rs`: the per-rule runtime value, and the [`Engine`] that holds them.
//! - `bridge_call.rs`: an evaluation's call to the bridge, and the backoff after a failure.
//! - `outstanding.rs`: units counted in the store and not admitted yet, and the sweep
//!   that drops those that expired unspent.
//! - this file: a request through every rule, commits, and the worker's tick.

mod report;

mod evaluation;

mod local;

mod fair_share;

mod in_flight;

mod asking;

mod global;

mod runtime;

mod bridge_call;

mod outstanding;

pub use bridge_call::{
    BRIDGE_BACKOFF_US, BRIDGE_DOWN_READ_US, BRIDGE_FAILING_FOR_US, BRIDGE_FAILURES_TO_SKIP,
};
pub use evaluation::{
    BridgeError, Clamped, Delayed, Evaluation, HeldRequest, PendingCommit, PendingItem,
};
pub use global::COMMIT_DENIAL_CACHE_US;
pub use in_flight::{Adapted, TendedPlaces};
pub use outstanding::{Expired, LEASE_SETS_PER_SWEEP};
use report::signed;
pub use report::{FailureOutcome, RuleOutcome, RuleReport, ShareReport, Source, Verdict};
pub use runtime::Engine;

use crate::adaptive::{measures_service, Response};
use crate::algorithms::Decision;
use crate::concurrency::{place_epoch, KeyPlaces, MAX_PLACE_UPDATES_PER_TICK};
use crate::key::Seed;
use crate::response::RuleVerdict;
use crate::rules::{Commit, CommitSource, Cost, Fact, FactSource, Facts, RuleId, Scope};
use crate::store::{SharedStore, StoreError, UpdateError};
use crate::time::{Micros, Span};
use crate::worker::Worker;

use evaluation::{applies, CommitKey, Resume};
use global::pending_item;
use in_flight::worker_latency;
use runtime::RuleRuntime;

impl Engine {
    /// A request's facts as this engine's rules read them: each fetched from `source` at
    /// most once, when a rule first asks for it.
    pub fn facts<F: FactSource>(&self, source: F) -> Facts<'_, F> {
        Facts::new(&self.config.facts, source)
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
        self.rule(rule).map_or(0, |(_, runtime)| runtime.capacity())
    }

    /// The slots of a rule's table that hold a key, read from at most `max_sets_read`
    /// sets (see [`crate::store::slot_table::SlotTable::estimate_slots_in_use`]).
    pub fn estimate_slots_in_use<S: SharedStore>(
        &self,
        rule: RuleId,
        store: &S,
        max_sets_read: u32,
    ) -> Result<u64, StoreError> {
        match self.rule(rule) {
            Some((_, runtime)) => runtime.estimate_slots_in_use(store, max_sets_read),
            None => Ok(0),
        }
    }

    /// Creates the tables (and adaptive controllers' records) that do not exist yet.
    /// Run before serving.
    pub fn prepare<S: SharedStore>(&self, store: &S) -> Result<u32, StoreError> {
        let mut created = 0;
        for (_, runtime) in self.rules() {
            created += runtime.create_missing(store)?;
        }
        Ok(created)
    }

    /// Evaluates every rule against one request at `now`. When `pending` is not empty
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
        now: Micros,
    ) -> Evaluation {
        let now_us = now.us();
        let mut eval = Evaluation::default();
        let from = Resume {
            first_rule: 0,
            arrived_us: now_us,
        };
        self.evaluate_from(&mut eval, store, worker, seed, facts, from, now_us);
        eval
    }

    /// Releases a held request at `now`. On time (by [`Hold::release_by_us`]), the
    /// holding rule admits it and the rules after it decide now; later, its slot is
    /// lost and the holding rule decides it again, with what is left of its delay's
    /// `max` (it may hold the request once more). A request a shared rule held waited
    /// its turn with no slot: its rule decides it again.
    pub fn release<F: FactSource, S: SharedStore>(
        &self,
        eval: &mut Evaluation,
        store: &S,
        worker: &mut Worker,
        seed: &Seed,
        facts: &mut Facts<'_, F>,
        now: Micros,
    ) {
        let now_us = now.us();
        let Some(held) = eval.held.take() else {
            return;
        };
        let Some(rule) = self.config.rule(held.rule) else {
            return;
        };
        // A request that waited its turn took no place: it is decided again, never late.
        let placed = held.turn.is_none();
        let on_time = placed && now_us <= held.hold.release_by_us;
        let past_deadline = held.deadline_us.is_some_and(|at| now_us > at);
        eval.delayed = Some(Delayed {
            rule: held.rule,
            waited: now.saturating_sub(Micros(held.arrived_us)),
            late: placed && !on_time,
            past_deadline,
        });
        // Outstanding since it was held: admitted now, or counted and never admitted.
        let released = held.report.outstanding_units - signed(held.units());
        if past_deadline {
            // Its client no longer waits for it: not forwarded. Its slot stays counted.
            let mut report = held.report;
            report.decided_at_us = now_us;
            report.delay_past_deadline = true;
            report.outstanding_units = released;
            let denied = Decision {
                allowed: false,
                retry_after_ns: Some(0),
                ..held.decision
            };
            eval.record(report, rule, denied);
            return;
        }
        let first_rule = if on_time {
            let mut report = held.report;
            report.decided_at_us = now_us;
            report.outstanding_units = released;
            eval.record(report, rule, held.decision);
            held.rule.index() + 1
        } else {
            // Its slot is lost, or it waited a turn (its report too): decided again, as a
            // new request.
            eval.carried.push((held.rule, released));
            held.rule.index()
        };
        let from = Resume {
            first_rule,
            arrived_us: held.arrived_us,
        };
        self.evaluate_from(eval, store, worker, seed, facts, from, now_us);
    }

    /// Evaluates the rules from `from.first_rule` on, at `now`.
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
        for (rule, runtime) in self.rules().skip(from.first_rule) {
            if eval.stopped() {
                break;
            }
            let Some(applied) = applies(rule, seed, facts, now_us, eval) else {
                continue;
            };
            // A delaying rule holds a request no later than its own deadline: read only
            // when the rule could hold it.
            let deadline_us = rule
                .delay
                .filter(|_| !eval.counted())
                .and_then(|d| d.deadline.deadline_us(facts, from.arrived_us));
            let arrival = (from.arrived_us, deadline_us);
            match runtime {
                RuleRuntime::Local(local) => local.decide(eval, store, worker, &applied, arrival),
                RuleRuntime::Share(share) => share.decide(eval, store, worker, &applied, arrival),
                RuleRuntime::Concurrency(concurrency) => {
                    concurrency.decide(eval, store, &applied, worker);
                }
                RuleRuntime::Global(global) => {
                    let seen = (
                        Some(&mut worker.unwritten_demand),
                        Some(&worker.last_answers),
                    );
                    if let Some(item) =
                        global.spend_or_ask(eval, store, &applied, seen, self.asking_for(now_us, 0))
                    {
                        eval.pending.push(pending_item(applied, facts, item));
                    }
                }
            }
        }
        self.after_local_decisions(eval, store, now_us);
    }

    /// Settles what a rule counted for a request (`commit`) with its actual cost (at
    /// most [`crate::bounds::MAX_WANT`]), known at `now` (see
    /// [`crate::algorithms::SlotAlgorithm::settle`]). Returns whether
    /// the key's state changed: a key that lost its slot since, or a refund no longer
    /// exact, changes nothing. A concurrency rule's place is not settled here but given
    /// back with [`Engine::end_in_flight`], which knows the worker's places.
    pub fn commit<S: SharedStore>(
        &self,
        store: &S,
        commit: &PendingCommit,
        actual: u64,
        now: Micros,
    ) -> Result<bool, UpdateError> {
        let hash = match &commit.key {
            CommitKey::Local(hash) => hash,
            CommitKey::Share { parent, key } => {
                return match self.rule(commit.rule) {
                    Some((_, RuleRuntime::Share(share))) => {
                        share.settle(store, (parent, *key), commit, actual, now.us())
                    }
                    _ => Ok(false),
                }
            }
            CommitKey::Global { .. } => return Ok(false),
        };
        // Counted in this Envoy's shared data: by a local rule, or by a global rule's
        // local fallback while the bridge failed (its share's slots). A concurrency
        // rule's place is given back by `end_in_flight`, which knows the worker's places.
        let slots = match self.rule(commit.rule) {
            Some((_, RuleRuntime::Local(local))) => &local.slots,
            Some((_, RuleRuntime::Global(global))) => match global.fallback() {
                Some(slots) => slots,
                None => return Ok(false),
            },
            // A shared rule's commits are settled above.
            Some((_, RuleRuntime::Share(_) | RuleRuntime::Concurrency(_))) | None => {
                return Ok(false)
            }
        };
        slots.settle(store, hash, commit, actual, now.us())
    }

    /// The stream of a request a concurrency rule admitted (`admitted`: its commit for
    /// the rule) ended at `now`, however it ended: its place is marked ended in the
    /// worker and given back. Never fails closed: when shared data refuses (an error, or
    /// every CAS attempt lost), the worker keeps it marked and [`Engine::tend_places`]
    /// gives it back on the next tick. Returns whether the key's state was written now;
    /// the error says why not.
    pub fn end_in_flight<S: SharedStore>(
        &self,
        store: &S,
        worker: &mut Worker,
        admitted: &PendingCommit,
        now: Micros,
    ) -> Result<bool, UpdateError> {
        let CommitKey::Local(hash) = &admitted.key else {
            return Ok(false);
        };
        let id = (admitted.rule.index(), hash.set_hash, hash.fingerprint);
        let held = worker.places.get(id).ended(admitted.reserved);
        worker.places.set(id, held);
        self.give_back(store, worker, id, now.us())
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
        now: Micros,
    ) -> TendedPlaces {
        let now_us = now.us();
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

    /// Writes the worker's places of one key (see [`ConcurrencyRuntime::give_back`]); the
    /// places of a rule that is not a concurrency rule of this config are forgotten.
    fn give_back<S: SharedStore>(
        &self,
        store: &S,
        worker: &mut Worker,
        id: (usize, u64, u64),
        now_us: u64,
    ) -> Result<(bool, u64), UpdateError> {
        let runtime = u16::try_from(id.0)
            .ok()
            .and_then(|rule| self.rule(RuleId(rule)));
        let Some((_, RuleRuntime::Concurrency(concurrency))) = runtime else {
            // Not a concurrency rule of this config: nothing of it is counted here.
            worker.places.set(id, KeyPlaces::default());
            return Ok((false, 0));
        };
        concurrency.give_back(store, worker, id, now_us)
    }

    /// A response of a request admitted by an adaptive concurrency rule came back
    /// `latency` after the rule admitted it (`admitted`: the request's commit for the
    /// rule): the worker records it for its next merge ([`Engine::adapt`]).
    pub fn observe_latency(&self, worker: &mut Worker, admitted: &PendingCommit, latency: Span) {
        let CommitKey::Local(hash) = &admitted.key else {
            return;
        };
        if let Some(observed) = worker_latency(worker, admitted.rule, hash) {
            observed.sketch.record(latency.us());
        }
    }

    /// The response of a request admitted by an adaptive concurrency rule (`admitted`)
    /// came back `latency` after the rule admitted it: recorded only when it
    /// measures the service ([`crate::adaptive::measures_service`]). Returns whether it
    /// was.
    pub fn observe_response(
        &self,
        worker: &mut Worker,
        admitted: &PendingCommit,
        response: Response,
        latency: Span,
    ) -> bool {
        if !measures_service(response) {
            return false;
        }
        self.observe_latency(worker, admitted, latency);
        true
    }

    /// Whether `rule` is an adaptive concurrency rule (its latencies are wanted).
    pub(crate) fn is_adaptive(&self, rule: RuleId) -> bool {
        matches!(self.rule(rule), Some((_, RuleRuntime::Concurrency(c))) if c.is_adaptive())
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
        now: Micros,
    ) -> Vec<Adapted> {
        let now_us = now.us();
        let mut adapted = Vec::new();
        for (rule, runtime) in self.rules() {
            if let RuleRuntime::Concurrency(concurrency) = runtime {
                concurrency.adapt(rule.id, store, worker, now_us, &mut adapted);
            }
        }
        adapted
    }

    /// The verdicts as the response headers name them.
    pub fn rule_verdicts<'c>(&'c self, eval: &Evaluation) -> Vec<RuleVerdict<'c>> {
        eval.verdicts
            .iter()
            .filter_map(|v| {
                let rule = self.config.rule(v.rule)?;
                let own = eval.own_policies.iter().find(|(id, _)| *id == v.rule);
                let mut policy = own.map_or_else(|| rule.policy(), |(_, policy)| *policy);
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

    /// Whether an enforcing rule with `commit.clamp` matches the request: its body may be
    /// rewritten, so the filter drops its `content-length` before the headers go on.
    pub(crate) fn may_clamp<S: FactSource>(&self, facts: &mut Facts<'_, S>) -> bool {
        self.config
            .rules
            .iter()
            .any(|rule| rule.clamp().is_some() && rule.matches(facts))
    }

    /// The request body as the clamping rules that admitted the request leave it: the
    /// max-token fields of each lowered to the least output any of them reserved (see
    /// [`crate::usage::clamp`]). `None` when no rule clamped it or nothing changes.
    pub fn clamped_body(&self, eval: &Evaluation, body: &[u8]) -> Option<Vec<u8>> {
        let output = eval.clamped.iter().map(|c| c.output).min()?;
        let mut rewritten: Option<Vec<u8>> = None;
        for clamped in &eval.clamped {
            let Some(clamp) = self.config.rule(clamped.rule).and_then(|r| r.clamp()) else {
                continue;
            };
            let current = rewritten.as_deref().unwrap_or(body);
            if let Some(next) = clamp.body.apply(current, output) {
                rewritten = Some(next);
            }
        }
        rewritten
    }

    /// Whether a rule that reads its cost from the response body (`commit.body`) matches
    /// the request: the filter then asks the upstream for an uncompressed body, which is
    /// the only kind it can read.
    pub(crate) fn reads_response_body<S: FactSource>(&self, facts: &mut Facts<'_, S>) -> bool {
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
}
