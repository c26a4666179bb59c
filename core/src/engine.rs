//! One request through every rule: match, key, cost, then a decision — in this Envoy's
//! shared data for local rules, from a lease or the bridge for global ones.
//!
//! Rules run in config order. Each rule that allows spends its units at once; the first
//! enforcing rule that denies stops the evaluation, so rules *before* it keep what they
//! spent and rules *after* it are not charged. Put the narrowest rules (per user) before
//! the broad ones (per route, per tenant) so that a client over its own limit does not
//! eat into a shared quota. Shadow rules decide, count and spend like enforcing ones but
//! never deny and never stop the evaluation.
//!
//! Global rules are served from a lease or a cached denial when the key has one, in
//! their place in that order. Otherwise they become [`PendingItem`]s, all sent to the
//! bridge in one call ([`Engine::bridge_request`]) once every rule has been looked at,
//! and the reply completes the evaluation ([`Engine::complete`]). So a global rule served
//! from a lease spends its unit even when the bridge then denies a rule before it.
//!
//! A shared-data failure or a CAS give-up fails open for a local rule (the request is
//! not denied by a store we cannot read) and sends a global rule to the bridge; both are
//! reported, to be counted. When the bridge fails (timeout, unavailable, bad reply), each
//! pending rule applies its failure mode, and further calls are skipped for
//! [`BRIDGE_BACKOFF_US`] so that a dead bridge does not cost every request a timeout.
//!
//! Every report, verdict and pending item names its rule by [`RuleId`].

use crate::algorithms::{Decision, Limit, SlotState, NS_PER_US};
use crate::config::Config;
use crate::key::{encode_part, KeyHash, KeyHasher, Seed};
use crate::lease::{self, Spend};
use crate::response::RuleVerdict;
use crate::rules::{FactSource, Facts, FailureMode, GlobalRule, Rule, RuleId, Scope};
use crate::store::{Placement, SharedStore, SlotTable, StoreError, UpdateError};
use crate::wire::{
    AcquireItem, AcquireRequest, AcquireResponse, ItemResult, ReplyError, WireLimit,
};

/// Shared-data key holding the instant (µs, little-endian) until which the bridge is
/// considered down.
pub const BRIDGE_DOWN_KEY: &str = "weir/v1/bridge/down_until";
/// How long a failed bridge is left alone before it is tried again.
pub const BRIDGE_BACKOFF_US: u64 = 1_000_000;

/// What happened to one rule on one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RuleOutcome {
    /// The rule's match did not hold.
    NotMatched,
    /// A key source had no value and no default: the rule did not apply.
    KeyMissing,
    Allowed,
    Limited,
    /// A shadow rule that would have denied.
    ShadowLimited,
    /// The store failed; the local rule let the request through.
    StoreFailed(UpdateError),
    /// The bridge could not answer; the rule's failure mode decided.
    BridgeFailed(FailureOutcome),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureOutcome {
    Allowed,
    /// `failure_mode: deny` (or a shadow rule that would have).
    Denied,
    /// `failure_mode: local`: decided by the local share; `true` if allowed.
    Local {
        allowed: bool,
    },
}

/// Where a decision came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// A local rule's slot.
    Slot,
    /// A global rule's lease.
    Lease,
    /// A cached denial of a global rule.
    DenialCache,
    /// The bridge, i.e. Redis.
    Bridge,
    /// A global rule's local fallback.
    Fallback,
}

/// A rule's report for metrics and logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RuleReport {
    pub rule: RuleId,
    pub outcome: RuleOutcome,
    pub source: Option<Source>,
    pub placement: Option<Placement>,
    /// CAS attempts lost, over every table update the rule made.
    pub cas_retries: u32,
    /// A global rule's lease table failed (the bridge or the failure mode decided).
    pub lease_store_error: Option<UpdateError>,
}

impl RuleReport {
    fn new(rule: RuleId) -> Self {
        RuleReport {
            rule,
            outcome: RuleOutcome::NotMatched,
            source: None,
            placement: None,
            cas_retries: 0,
            lease_store_error: None,
        }
    }

    /// Adds what one table update did (or how it failed) to the report.
    fn add_update<R>(&mut self, update: &Result<crate::store::Updated<R>, UpdateError>) {
        match update {
            Ok(u) => {
                self.placement = self.placement.or(u.placement);
                self.cas_retries = self.cas_retries.saturating_add(u.cas_retries);
            }
            Err(e) => self.cas_retries = self.cas_retries.saturating_add(e.lost_attempts()),
        }
    }
}

/// An enforcing rule's decision, for the RateLimit headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    pub rule: RuleId,
    pub decision: Decision,
}

/// A global rule that needs the bridge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingItem {
    pub rule: RuleId,
    pub hash: KeyHash,
    pub descriptor: Vec<String>,
    pub cost: u64,
    pub want: u64,
    /// What the lease lookup found (placement, CAS retries, a store error): the rule's
    /// final report starts from it.
    pub lookup: RuleReport,
}

/// The state of one request's evaluation. It owns everything, so the filter can keep
/// it while the request waits for the bridge.
#[derive(Debug, Default)]
pub struct Evaluation {
    /// One per enforcing rule that decided, in order; at most one is a denial.
    pub verdicts: Vec<Verdict>,
    /// The enforcing rule that denied the request.
    pub denied_by: Option<RuleId>,
    /// A rule whose bridge failed with `failure_mode: deny`.
    pub unavailable: Option<RuleId>,
    /// One per rule decided or skipped, in the order they were settled (rules after a
    /// denial are not looked at; a rule waiting for the bridge gets its report with the
    /// reply, from its [`PendingItem::lookup`]).
    pub reports: Vec<RuleReport>,
    /// The shadow rules that would have denied.
    pub shadow_limited: Vec<RuleId>,
    /// Global rules to ask the bridge about (empty once completed).
    pub pending: Vec<PendingItem>,
    /// Set when the bridge failed or was skipped (see [`BRIDGE_BACKOFF_US`]).
    pub bridge_error: Option<BridgeError>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BridgeError {
    /// Not called: it failed less than [`BRIDGE_BACKOFF_US`] ago.
    Skipped,
    Reply(ReplyError),
}

impl Evaluation {
    /// The request must not reach the upstream.
    pub fn denied(&self) -> bool {
        self.denied_by.is_some() || self.unavailable.is_some()
    }

    /// Records a decided rule: its report, and for enforcing rules the verdict (a
    /// denial stops the evaluation); shadow denials are only noted.
    fn record(&mut self, mut report: RuleReport, rule: &Rule, decision: Decision) {
        report.outcome = match (decision.allowed, rule.shadow) {
            (true, _) => RuleOutcome::Allowed,
            (false, true) => RuleOutcome::ShadowLimited,
            (false, false) => RuleOutcome::Limited,
        };
        self.reports.push(report);
        if rule.shadow {
            if !decision.allowed {
                self.shadow_limited.push(rule.id);
            }
            return;
        }
        self.verdicts.push(Verdict {
            rule: rule.id,
            decision,
        });
        if !decision.allowed {
            self.denied_by = Some(rule.id);
        }
    }
}

/// A rule that applies to the request decided at `now_us`: its key's hash and the
/// request's cost.
struct Applied<'a> {
    rule: &'a Rule,
    hash: KeyHash,
    cost: u64,
    now_us: u64,
}

/// A limit decided in a slot table of this Envoy, and what to call the decision.
struct SlotDecision<'a> {
    limit: &'a Limit,
    table: &'a SlotTable,
    source: Source,
}

/// A rule's tables: its slots (local rules) or leases (global rules), and for global
/// rules with `failure_mode: local` the local share's slots.
#[derive(Debug)]
struct RuleTables {
    main: SlotTable,
    fallback: Option<SlotTable>,
}

/// A compiled config with its tables.
#[derive(Debug)]
pub struct Engine {
    pub config: Config,
    /// One per rule, at its id's index.
    tables: Vec<RuleTables>,
}

impl Engine {
    pub fn new(config: Config) -> Self {
        Self::with_namespace(config, "")
    }

    /// An engine whose tables are prefixed by `namespace` (the filter uses Envoy's
    /// plugin name), so that two plugins sharing one Wasm VM's shared data — Istio gives
    /// every WasmPlugin the same `vm_id` — never share counters, even with equal rule names.
    pub fn with_namespace(config: Config, namespace: &str) -> Self {
        let tables = config
            .rules
            .iter()
            .map(|rule| {
                let owner = if namespace.is_empty() {
                    rule.name.clone()
                } else {
                    format!("{namespace}/{}", rule.name)
                };
                let (label, fallback) = match &rule.scope {
                    Scope::Local(limit) => (limit.kind().name().to_string(), None),
                    Scope::Global(global) => {
                        let fallback = match &global.failure_mode {
                            FailureMode::Local(limit) => Some(SlotTable::new(
                                &owner,
                                &format!("fallback-{}", limit.kind()),
                                rule.max_keys,
                            )),
                            FailureMode::Allow | FailureMode::Deny => None,
                        };
                        (format!("lease-{}", global.limit.kind()), fallback)
                    }
                };
                RuleTables {
                    main: SlotTable::new(&owner, &label, rule.max_keys),
                    fallback,
                }
            })
            .collect();
        Engine { config, tables }
    }

    /// The slot table of a local rule, or the lease table of a global one.
    pub fn table(&self, rule: RuleId) -> Option<&SlotTable> {
        self.tables.get(rule.index()).map(|t| &t.main)
    }

    fn fallback_table(&self, rule: RuleId) -> Option<&SlotTable> {
        self.tables.get(rule.index())?.fallback.as_ref()
    }

    /// Creates the tables that do not exist yet. Run before serving.
    pub fn prepare<S: SharedStore>(&self, store: &S) -> Result<u32, StoreError> {
        let mut created = 0;
        for tables in &self.tables {
            created += tables.main.create_missing(store)?;
            if let Some(fallback) = &tables.fallback {
                created += fallback.create_missing(store)?;
            }
        }
        Ok(created)
    }

    /// Evaluates every rule against one request at `now_us`. When `pending` is not empty
    /// (and the request not denied), send [`Engine::bridge_request`] and finish with
    /// [`Engine::complete`].
    pub fn evaluate<F: FactSource, S: SharedStore>(
        &self,
        store: &S,
        seed: &Seed,
        facts: &mut Facts<'_, F>,
        now_us: u64,
    ) -> Evaluation {
        let mut eval = Evaluation::default();
        for rule in &self.config.rules {
            if eval.denied() {
                break;
            }
            let Some(table) = self.table(rule.id) else {
                continue;
            };
            let Some(applied) = applies(rule, seed, facts, now_us, &mut eval) else {
                continue;
            };
            match &rule.scope {
                Scope::Local(limit) => {
                    let slot = SlotDecision {
                        limit,
                        table,
                        source: Source::Slot,
                    };
                    let report = RuleReport::new(rule.id);
                    decide_in_slot(&mut eval, store, &applied, slot, report);
                }
                Scope::Global(global) => {
                    let lease = LeaseLookup { global, table };
                    spend_or_ask(&mut eval, store, facts, applied, lease)
                }
            }
        }
        if eval.denied() {
            // The request is denied anyway: nobody asks the bridge.
            eval.pending.clear();
        } else if !eval.pending.is_empty() && bridge_down(store, now_us) {
            self.fail_pending(&mut eval, store, now_us, BridgeError::Skipped);
        }
        eval
    }

    /// The body of the `POST /v1/acquire` call for `pending`: one item per pending rule,
    /// in the same order (the reply answers them in that order).
    pub fn bridge_request(&self, pending: &[PendingItem]) -> Vec<u8> {
        let domain = self
            .config
            .bridge
            .as_ref()
            .map_or("weir", |b| b.domain.as_str());
        let items: Vec<AcquireItem> = pending
            .iter()
            .map(|item| {
                let (name, limit) = match self.config.rule(item.rule) {
                    Some(
                        rule @ Rule {
                            scope: Scope::Global(global),
                            ..
                        },
                    ) => (rule.name.clone(), Some(WireLimit::from(&global.limit))),
                    _ => (String::new(), None),
                };
                AcquireItem {
                    rule: name,
                    descriptor: item.descriptor.clone(),
                    // Unreachable (pending items are global rules of this config); an
                    // empty limit makes the bridge refuse the call, never misattribute.
                    limit: limit.unwrap_or(WireLimit {
                        kind: crate::algorithms::AlgorithmKind::Gcra,
                        values: Vec::new(),
                    }),
                    cost: item.cost,
                    want: item.want,
                }
            })
            .collect();
        let request = AcquireRequest {
            domain: domain.to_string(),
            items,
        };
        serde_json::to_vec(&request).unwrap_or_default()
    }

    /// Finishes an evaluation with the bridge's reply (or its failure), at `now_us`. Lease
    /// expiries and cached denials count from `sent_at_us`, when the call left: Redis
    /// decided after that, so no leased unit outlives its bound.
    pub fn complete<S: SharedStore>(
        &self,
        eval: &mut Evaluation,
        store: &S,
        sent_at_us: u64,
        now_us: u64,
        reply: Result<AcquireResponse, ReplyError>,
    ) {
        let reply = match reply {
            Ok(reply) => reply,
            Err(error) => {
                if matches!(
                    error,
                    ReplyError::Timeout | ReplyError::Unavailable | ReplyError::Status(500..)
                ) {
                    note_bridge_down(store, now_us.saturating_add(BRIDGE_BACKOFF_US));
                }
                self.fail_pending(eval, store, now_us, BridgeError::Reply(error));
                return;
            }
        };
        let base = sent_at_us.min(now_us);
        let pending = std::mem::take(&mut eval.pending);
        // The reply answers the request's items in order; `decode_reply` checked that it
        // answers no more of them than were sent, and items after a denial go unanswered.
        for (item, result) in pending.iter().zip(&reply.items) {
            self.settle(eval, store, item, result, base, now_us);
            if eval.denied() {
                break;
            }
        }
    }

    /// Records the bridge's answer for one pending rule and writes what it leaves for
    /// later requests (a lease or a cached denial).
    fn settle<S: SharedStore>(
        &self,
        eval: &mut Evaluation,
        store: &S,
        item: &PendingItem,
        result: &ItemResult,
        base_us: u64,
        now_us: u64,
    ) {
        let (Some(rule), Some(table)) = (self.config.rule(item.rule), self.table(item.rule)) else {
            return;
        };
        let Scope::Global(global) = &rule.scope else {
            return;
        };
        let decision = Decision {
            allowed: result.allowed,
            limit: result.limit,
            remaining: result.remaining,
            retry_after_ns: result.retry_after_ns,
            reset_after_ns: result.reset_after_ns,
        };
        let mut report = RuleReport {
            source: Some(Source::Bridge),
            ..item.lookup
        };
        if let Some(write) = lease_write(global, item, result, base_us) {
            let stored = table.update(store, &item.hash, now_us, lease::idle_at_us, |state| {
                ((), Some(write.apply(state, now_us)))
            });
            report.add_update(&stored);
            if let Err(e) = stored {
                report.lease_store_error.get_or_insert(e);
            }
        }
        eval.record(report, rule, decision);
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
            let mut report = item.lookup;
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
                    let Some(table) = self.fallback_table(rule.id) else {
                        continue;
                    };
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
                    decide_in_slot(eval, store, &applied, slot, report);
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
                Some(RuleVerdict {
                    rule: &rule.name,
                    decision: v.decision,
                    policy: rule.policy(),
                })
            })
            .collect()
    }

    pub fn rule_name(&self, rule: RuleId) -> &str {
        self.config.rule(rule).map_or("", |r| r.name.as_str())
    }
}

/// A global rule and its lease table.
struct LeaseLookup<'a> {
    global: &'a GlobalRule,
    table: &'a SlotTable,
}

/// A global rule: served from its lease or cached denial, or queued for the bridge.
fn spend_or_ask<F: FactSource, S: SharedStore>(
    eval: &mut Evaluation,
    store: &S,
    facts: &mut Facts<'_, F>,
    applied: Applied<'_>,
    lease: LeaseLookup<'_>,
) {
    let (spend, report) = lookup_lease(store, lease.table, &applied);
    let policy = lease.global.limit.policy();
    let decision = |allowed, remaining, retry_after_ns, reset_after_ns| Decision {
        allowed,
        limit: policy.quota,
        remaining,
        retry_after_ns,
        reset_after_ns,
    };
    match spend {
        Spend::Spent {
            tokens_left,
            expires_us,
        } => {
            let reset = expires_us
                .saturating_sub(applied.now_us)
                .saturating_mul(NS_PER_US);
            let report = RuleReport {
                source: Some(Source::Lease),
                ..report
            };
            eval.record(
                report,
                applied.rule,
                decision(true, tokens_left, None, reset),
            );
        }
        Spend::Denied {
            retry_after_ns,
            reset_after_ns,
        } => {
            let report = RuleReport {
                source: Some(Source::DenialCache),
                ..report
            };
            let denied = decision(false, 0, Some(retry_after_ns), reset_after_ns);
            eval.record(report, applied.rule, denied);
        }
        Spend::Miss { want_hint } => {
            let lease_max = lease.global.lease_max;
            let want = if lease_max <= 1 {
                applied.cost
            } else {
                want_hint.min(lease_max).max(applied.cost)
            };
            eval.pending
                .push(pending_item(applied, facts, want, report));
        }
    }
}

/// Whether `rule` applies to the request, and if so its key's hash and the cost. A rule
/// that does not match or whose key is missing is reported here.
fn applies<'r, F: FactSource>(
    rule: &'r Rule,
    seed: &Seed,
    facts: &mut Facts<'_, F>,
    now_us: u64,
    eval: &mut Evaluation,
) -> Option<Applied<'r>> {
    let mut report = RuleReport::new(rule.id);
    if !rule.matches(facts) {
        eval.reports.push(report);
        return None;
    }
    let mut hasher = KeyHasher::new(seed);
    if !rule.visit_key(facts, |origin, bytes| hasher.part(origin, bytes)) {
        report.outcome = RuleOutcome::KeyMissing;
        eval.reports.push(report);
        return None;
    }
    Some(Applied {
        rule,
        hash: hasher.finish(),
        cost: rule.cost(facts),
        now_us,
    })
}

/// Decides a limit in a slot table and records it; a store failure lets the request
/// through and is reported.
fn decide_in_slot<S: SharedStore>(
    eval: &mut Evaluation,
    store: &S,
    applied: &Applied<'_>,
    slot: SlotDecision<'_>,
    mut report: RuleReport,
) {
    let now_us = applied.now_us;
    report.source = Some(slot.source);
    let updated = slot.table.update(
        store,
        &applied.hash,
        now_us,
        |state: SlotState| slot.limit.idle_at_us(state),
        |state| slot.limit.decide(state, now_us, applied.cost),
    );
    report.add_update(&updated);
    match updated {
        Ok(updated) => eval.record(report, applied.rule, updated.result),
        Err(error) => {
            report.outcome = RuleOutcome::StoreFailed(error);
            eval.reports.push(report);
        }
    }
}

/// Tries to serve a global rule from its key's lease or cached denial. A lease table
/// that fails is reported and treated as a miss: Redis can still decide.
fn lookup_lease<S: SharedStore>(
    store: &S,
    table: &SlotTable,
    applied: &Applied<'_>,
) -> (Spend, RuleReport) {
    let now_us = applied.now_us;
    let mut report = RuleReport::new(applied.rule.id);
    let spent = table.update(store, &applied.hash, now_us, lease::idle_at_us, |state| {
        lease::spend(state, now_us, applied.cost)
    });
    report.add_update(&spent);
    match spent {
        Ok(updated) => (updated.result, report),
        Err(e) => {
            report.lease_store_error = Some(e);
            (Spend::Miss { want_hint: 1 }, report)
        }
    }
}

/// A global rule queued for the bridge, with its descriptor (built only now: facts are
/// cached, so visiting the key again costs no host call).
fn pending_item<F: FactSource>(
    applied: Applied<'_>,
    facts: &mut Facts<'_, F>,
    want: u64,
    lookup: RuleReport,
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
        want,
        lookup,
    }
}

/// What a bridge reply writes to a global rule's slot: a denial is cached; an allowed
/// lease keeps what its request did not spend. Exact rules (lease max 1) write nothing
/// when allowed.
#[derive(Debug, Clone, Copy)]
enum LeaseWrite {
    Deny(SlotState),
    Merge {
        leftover: u64,
        expires_us: u64,
        next_want: u64,
    },
}

impl LeaseWrite {
    fn apply(self, state: Option<SlotState>, now_us: u64) -> SlotState {
        match self {
            LeaseWrite::Deny(denied) => lease::after_denial(state, now_us, denied),
            LeaseWrite::Merge {
                leftover,
                expires_us,
                next_want,
            } => lease::merge(state, now_us, leftover, expires_us, next_want),
        }
    }
}

fn lease_write(
    global: &GlobalRule,
    item: &PendingItem,
    result: &ItemResult,
    base_us: u64,
) -> Option<LeaseWrite> {
    if !result.allowed {
        let retry = result.retry_after_ns.unwrap_or(result.reset_after_ns);
        return Some(LeaseWrite::Deny(lease::deny(
            base_us,
            retry,
            result.reset_after_ns,
        )));
    }
    if global.lease_max <= 1 {
        return None;
    }
    let ttl_us = result.lease_ttl_ns.map_or(global.lease_ttl_us, |ns| {
        global.lease_ttl_us.min(ns / NS_PER_US)
    });
    Some(LeaseWrite::Merge {
        leftover: result.granted.saturating_sub(item.cost),
        expires_us: base_us.saturating_add(ttl_us),
        next_want: lease::next_want(
            item.want,
            result.granted,
            result.remaining,
            global.expected_instances,
            global.lease_max,
        ),
    })
}

fn bridge_down<S: SharedStore>(store: &S, now_us: u64) -> bool {
    let Ok((Some(value), _)) = store.get(BRIDGE_DOWN_KEY) else {
        return false;
    };
    let until = <[u8; 8]>::try_from(value.as_slice()).map_or(0, u64::from_le_bytes);
    now_us < until
}

/// Remembers that the bridge failed: calls are skipped until `until_us`. Racing writers
/// each write a time about a second ahead; whichever lands is good enough.
fn note_bridge_down<S: SharedStore>(store: &S, until_us: u64) {
    let value = until_us.to_le_bytes();
    let _ = match store.get(BRIDGE_DOWN_KEY) {
        Ok((_, Some(version))) => store.compare_and_set(BRIDGE_DOWN_KEY, &value, version),
        Ok((_, None)) => store.create(BRIDGE_DOWN_KEY, &value),
        Err(e) => Err(e),
    };
}
