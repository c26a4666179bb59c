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
//! Global rules are served from a lease or a cached denial when the key has one;
//! otherwise they become [`PendingItem`]s, all sent to the bridge in one call
//! ([`Engine::bridge_request`]), and the reply completes the evaluation
//! ([`Engine::complete`]). Global rules served from a lease are spent before the bridge
//! answers for the others, even if the bridge then denies an earlier rule.
//!
//! A shared-data failure or a CAS give-up fails open for a local rule (the request is
//! not denied by a store we cannot read) and sends a global rule to the bridge; both are
//! reported, to be counted. When the bridge fails (timeout, unavailable, bad reply), each
//! pending rule applies its failure mode, and further calls are skipped for
//! [`BRIDGE_BACKOFF_US`] so that a dead bridge does not cost every request a timeout.

use crate::algorithms::{Decision, Limit, SlotState, NS_PER_US};
use crate::config::Config;
use crate::lease::{self, Spend};
use crate::response::RuleVerdict;
use crate::rules::{FactSource, Facts, FailureMode, GlobalRule, Rule, Scope};
use crate::store::{
    KeyHash, KeyHasher, Placement, Seed, SharedStore, SlotTable, StoreError, UpdateError,
};
use crate::wire::{encode_part, AcquireItem, AcquireRequest, AcquireResponse, ReplyError};

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
    pub rule: usize,
    pub outcome: RuleOutcome,
    pub source: Option<Source>,
    pub placement: Option<Placement>,
    /// CAS attempts lost, over every table update the rule made.
    pub cas_retries: u32,
    /// A global rule's lease table failed (the bridge or the failure mode decided).
    pub lease_store_error: Option<UpdateError>,
}

impl RuleReport {
    fn new(rule: usize) -> Self {
        RuleReport {
            rule,
            outcome: RuleOutcome::NotMatched,
            source: None,
            placement: None,
            cas_retries: 0,
            lease_store_error: None,
        }
    }
}

/// An enforcing rule's decision, for the RateLimit headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    pub rule: usize,
    pub decision: Decision,
}

/// A global rule that needs the bridge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingItem {
    pub rule: usize,
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
    /// One per enforcing rule that decided, in order.
    pub verdicts: Vec<Verdict>,
    /// Index into `verdicts` of the rule that denied the request.
    pub denied_by: Option<usize>,
    /// A rule whose bridge failed with `failure_mode: deny`.
    pub unavailable: Option<usize>,
    /// One per rule decided or skipped, in the order they were settled (rules after a
    /// denial are not looked at; a rule waiting for the bridge gets its report with the
    /// reply, from its [`PendingItem::lookup`]).
    pub reports: Vec<RuleReport>,
    /// The shadow rules that would have denied.
    pub shadow_limited: Vec<usize>,
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

    fn deny(&mut self, verdict: Verdict) {
        self.verdicts.push(verdict);
        self.denied_by = Some(self.verdicts.len() - 1);
    }
}

/// A compiled config with its tables: per rule a slot table (local rules) or a lease
/// table (global rules), and for global rules with `failure_mode: local` a fallback.
#[derive(Debug)]
pub struct Engine {
    pub config: Config,
    tables: Vec<SlotTable>,
    fallbacks: Vec<Option<SlotTable>>,
}

impl Engine {
    pub fn new(config: Config) -> Self {
        Self::with_namespace(config, "")
    }

    /// An engine whose tables are prefixed by `namespace` (the filter uses Envoy's
    /// plugin name), so that two plugins sharing one Wasm VM's shared data — Istio gives
    /// every WasmPlugin the same `vm_id` — never share counters, even with equal rule names.
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
            .map(|rule| {
                let label = match &rule.scope {
                    Scope::Local(limit) => limit.kind().name().to_string(),
                    Scope::Global(global) => format!("lease-{}", global.limit.kind()),
                };
                SlotTable::new(&owner(rule), &label, rule.max_keys)
            })
            .collect();
        let fallbacks = config
            .rules
            .iter()
            .map(|rule| match &rule.scope {
                Scope::Global(GlobalRule {
                    failure_mode: FailureMode::Local(limit),
                    ..
                }) => {
                    let label = format!("fallback-{}", limit.kind());
                    Some(SlotTable::new(&owner(rule), &label, rule.max_keys))
                }
                _ => None,
            })
            .collect();
        Engine {
            config,
            tables,
            fallbacks,
        }
    }

    pub fn table(&self, rule: usize) -> Option<&SlotTable> {
        self.tables.get(rule)
    }

    /// Creates the tables that do not exist yet. Run before serving.
    pub fn prepare<S: SharedStore>(&self, store: &S) -> Result<u32, StoreError> {
        let mut created = 0;
        for table in self.tables.iter().chain(self.fallbacks.iter().flatten()) {
            created += table.create_missing(store)?;
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
        for (index, (rule, table)) in self.config.rules.iter().zip(&self.tables).enumerate() {
            if eval.denied() {
                break;
            }
            let mut report = RuleReport::new(index);
            if !rule.matches(facts) {
                eval.reports.push(report);
                continue;
            }
            let mut hasher = KeyHasher::new(seed);
            let complete = rule.visit_key(facts, |origin, bytes| hasher.part(origin, bytes));
            if !complete {
                report.outcome = RuleOutcome::KeyMissing;
                eval.reports.push(report);
                continue;
            }
            let hash = hasher.finish();
            let cost = rule.cost(facts);
            match &rule.scope {
                Scope::Local(limit) => {
                    decide_locally(
                        &mut eval,
                        report,
                        rule,
                        limit,
                        table,
                        store,
                        &hash,
                        now_us,
                        cost,
                        Source::Slot,
                    );
                }
                Scope::Global(global) => {
                    let spent = table.update(store, &hash, now_us, lease::idle_at_us, |state| {
                        lease::spend(state, now_us, cost)
                    });
                    let (spend, placement, retries) = match spent {
                        Ok(u) => (u.result, u.placement, u.cas_retries),
                        // Shared data failed: Redis can still decide.
                        Err(e) => {
                            report.lease_store_error = Some(e);
                            (Spend::Miss { want_hint: 1 }, None, gave_up_attempts(e))
                        }
                    };
                    report.placement = placement;
                    report.cas_retries = retries;
                    let policy = global.limit.policy();
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
                            report.source = Some(Source::Lease);
                            let reset = expires_us.saturating_sub(now_us).saturating_mul(NS_PER_US);
                            let d = decision(true, tokens_left, None, reset);
                            record(&mut eval, report, rule, d);
                        }
                        Spend::Denied {
                            retry_after_ns,
                            reset_after_ns,
                        } => {
                            report.source = Some(Source::DenialCache);
                            let d = decision(false, 0, Some(retry_after_ns), reset_after_ns);
                            record(&mut eval, report, rule, d);
                        }
                        Spend::Miss { want_hint } => {
                            let want = if global.lease_max <= 1 {
                                cost
                            } else {
                                want_hint.min(global.lease_max).max(cost)
                            };
                            // Only the bridge needs the descriptor; facts are cached, so
                            // visiting the key again costs no host call.
                            let mut descriptor = Vec::new();
                            rule.visit_key(facts, |origin, bytes| {
                                descriptor.push(encode_part(origin, bytes))
                            });
                            eval.pending.push(PendingItem {
                                rule: index,
                                hash,
                                descriptor,
                                cost,
                                want,
                                lookup: report,
                            });
                        }
                    }
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

    /// The body of the `POST /v1/acquire` call for `pending`.
    pub fn bridge_request(&self, pending: &[PendingItem]) -> Vec<u8> {
        let domain = self
            .config
            .bridge
            .as_ref()
            .map_or("weir", |b| b.domain.as_str());
        let items = pending
            .iter()
            .filter_map(|item| {
                let rule = self.config.rules.get(item.rule)?;
                let Scope::Global(global) = &rule.scope else {
                    return None;
                };
                Some(AcquireItem {
                    rule: rule.name.clone(),
                    descriptor: item.descriptor.clone(),
                    limit: global.limit.to_wire(),
                    cost: item.cost,
                    want: item.want,
                })
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
                    let until = now_us.saturating_add(BRIDGE_BACKOFF_US);
                    let _ = store.set(BRIDGE_DOWN_KEY, &until.to_le_bytes(), None);
                }
                self.fail_pending(eval, store, now_us, BridgeError::Reply(error));
                return;
            }
        };
        let base = sent_at_us.min(now_us);
        let pending = std::mem::take(&mut eval.pending);
        for (item, result) in pending.iter().zip(&reply.items) {
            let (Some(rule), Some(table)) =
                (self.config.rules.get(item.rule), self.tables.get(item.rule))
            else {
                continue;
            };
            let Scope::Global(global) = &rule.scope else {
                continue;
            };
            let decision = Decision {
                allowed: result.allowed,
                limit: result.limit,
                remaining: result.remaining,
                retry_after_ns: result.retry_after_ns,
                reset_after_ns: result.reset_after_ns,
            };
            // A denial is cached; an allowed lease keeps what it did not spend.
            let write = if !result.allowed {
                let retry = result.retry_after_ns.unwrap_or(result.reset_after_ns);
                Some(LeaseWrite::Deny(lease::deny(
                    base,
                    retry,
                    result.reset_after_ns,
                )))
            } else if global.lease_max > 1 {
                let ttl_us = result.lease_ttl_ns.map_or(global.lease_ttl_us, |ns| {
                    global.lease_ttl_us.min(ns / NS_PER_US)
                });
                Some(LeaseWrite::Merge {
                    leftover: result.granted.saturating_sub(item.cost),
                    expires_us: base.saturating_add(ttl_us),
                    next_want: lease::next_want(
                        item.want,
                        result.granted,
                        result.remaining,
                        global.expected_instances,
                        global.lease_max,
                    ),
                })
            } else {
                None
            };
            let stored = write.map(|write| {
                table.update(store, &item.hash, now_us, lease::idle_at_us, |state| {
                    let next = match write {
                        LeaseWrite::Deny(denied) => lease::after_denial(state, now_us, denied),
                        LeaseWrite::Merge {
                            leftover,
                            expires_us,
                            next_want,
                        } => lease::merge(state, now_us, leftover, expires_us, next_want),
                    };
                    ((), Some(next))
                })
            });
            let mut report = item.lookup;
            report.source = Some(Source::Bridge);
            match stored {
                Some(Ok(u)) => {
                    report.placement = report.placement.or(u.placement);
                    report.cas_retries = report.cas_retries.saturating_add(u.cas_retries);
                }
                Some(Err(e)) => {
                    report.lease_store_error.get_or_insert(e);
                    report.cas_retries = report.cas_retries.saturating_add(gave_up_attempts(e));
                }
                None => {}
            }
            record(eval, report, rule, decision);
            // Items the bridge did not evaluate (after a denial) were not charged.
            if eval.denied() {
                break;
            }
        }
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
            let Some(rule) = self.config.rules.get(item.rule) else {
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
                        eval.shadow_limited.push(item.rule);
                    } else {
                        eval.unavailable = Some(item.rule);
                    }
                }
                FailureMode::Local(limit) => {
                    let Some(Some(table)) = self.fallbacks.get(item.rule) else {
                        continue;
                    };
                    decide_locally(
                        eval,
                        report,
                        rule,
                        limit,
                        table,
                        store,
                        &item.hash,
                        now_us,
                        item.cost,
                        Source::Fallback,
                    );
                    // `decide_locally` recorded the verdict; the report says how it came.
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
                let rule = self.config.rules.get(v.rule)?;
                Some(RuleVerdict {
                    rule: &rule.name,
                    decision: v.decision,
                    policy: rule.policy(),
                })
            })
            .collect()
    }

    pub fn rule_name(&self, rule: usize) -> &str {
        self.config.rules.get(rule).map_or("", |r| r.name.as_str())
    }
}

/// What a bridge reply writes to a global rule's slot.
#[derive(Debug, Clone, Copy)]
enum LeaseWrite {
    Deny(SlotState),
    Merge {
        leftover: u64,
        expires_us: u64,
        next_want: u64,
    },
}

/// Records a decided rule: its report, and for enforcing rules the verdict (stopping
/// the evaluation on a denial); shadow denials are only noted.
fn record(eval: &mut Evaluation, mut report: RuleReport, rule: &Rule, decision: Decision) {
    let index = report.rule;
    report.outcome = match (decision.allowed, rule.shadow) {
        (true, _) => RuleOutcome::Allowed,
        (false, true) => RuleOutcome::ShadowLimited,
        (false, false) => RuleOutcome::Limited,
    };
    eval.reports.push(report);
    if rule.shadow {
        if !decision.allowed {
            eval.shadow_limited.push(index);
        }
        return;
    }
    let verdict = Verdict {
        rule: index,
        decision,
    };
    if decision.allowed {
        eval.verdicts.push(verdict);
    } else {
        eval.deny(verdict);
    }
}

#[allow(clippy::too_many_arguments)]
fn decide_locally<S: SharedStore>(
    eval: &mut Evaluation,
    mut report: RuleReport,
    rule: &Rule,
    limit: &Limit,
    table: &SlotTable,
    store: &S,
    hash: &KeyHash,
    now_us: u64,
    cost: u64,
    source: Source,
) {
    report.source = Some(source);
    let updated = table.update(
        store,
        hash,
        now_us,
        |state: SlotState| limit.idle_at_us(state),
        |state| limit.decide(state, now_us, cost),
    );
    match updated {
        Ok(updated) => {
            report.placement = updated.placement;
            report.cas_retries = report.cas_retries.saturating_add(updated.cas_retries);
            record(eval, report, rule, updated.result);
        }
        Err(error) => {
            report.outcome = RuleOutcome::StoreFailed(error);
            report.cas_retries = report.cas_retries.saturating_add(gave_up_attempts(error));
            eval.reports.push(report);
        }
    }
}

fn gave_up_attempts(error: UpdateError) -> u32 {
    match error {
        UpdateError::GaveUp { attempts } => attempts,
        UpdateError::Store(_) => 0,
    }
}

fn bridge_down<S: SharedStore>(store: &S, now_us: u64) -> bool {
    let Ok((Some(value), _)) = store.get(BRIDGE_DOWN_KEY) else {
        return false;
    };
    let until = <[u8; 8]>::try_from(value.as_slice()).map_or(0, u64::from_le_bytes);
    now_us < until
}
