//! Global rules: one quota across every Envoy, kept in Redis by weir-bridge. A rule is
//! served from what this Envoy holds for its key ([`crate::lease`]) or asks the bridge;
//! the bridge's answer is recorded in the rule's lease table, and when the bridge fails the
//! rule's failure mode decides — with `failure_mode: local`, in a local share's slots.

use std::borrow::Cow;

use crate::algorithms::{Decision, GlobalLimit, Policy};
use crate::bounds::MAX_WANT;
use crate::key::encode_part;
use crate::key::KeyHash;
use crate::lease::{Held, LeaseSlot, SlotReply, SlotReplyOutcome, Spend};
use crate::rules::{FactSource, Facts, FailureMode, GlobalRule, Rule};
use crate::store::slot_table::SlotTable;
use crate::store::{SharedStore, UpdateError, Updated};
use crate::time::{Micros, Nanos};
use crate::wire::v2::{self, Granted};
use crate::wire::{v3, WireLimit};

use super::asking::{ask_for, has_schedule, Asked, AskingFor};
use super::evaluation::{Applied, CommitKey, Evaluation, PendingCommit, PendingItem, Served};
use super::local::{decide_in_slot, LimitTable, SlotDecision};
use super::report::{signed, FailureOutcome, RuleOutcome, RuleReport, Source};
use crate::worker::{LastAnswers, UnwrittenDemand};

/// The longest a global rule with a commit trusts a denial from Redis: refunds of the
/// requests in flight may free its units at any time, so a denial cached until the
/// key's retry time (a refill an hour away) would deny what Redis would now admit.
pub const COMMIT_DENIAL_CACHE_US: u64 = 20_000;

/// A global rule as the engine runs it: the rule, its lease table, and what it does
/// when the bridge cannot answer.
#[derive(Debug)]
pub(super) struct GlobalRuntime {
    pub(super) global: GlobalRule,
    leases: SlotTable<LeaseSlot>,
    on_failure: OnFailure,
}

/// A global rule's failure mode, with the local share's slots for `failure_mode: local`.
#[derive(Debug)]
enum OnFailure {
    Allow,
    Deny,
    Local(LimitTable),
}

impl GlobalRuntime {
    /// The rule's runtime, its tables named after `owner`.
    pub(super) fn new(rule: &Rule, global: &GlobalRule, owner: &str) -> Self {
        let on_failure = match &global.failure_mode {
            FailureMode::Allow => OnFailure::Allow,
            FailureMode::Deny => OnFailure::Deny,
            FailureMode::Local(limit) => OnFailure::Local(LimitTable {
                limit: limit.clone(),
                table: SlotTable::new(owner, &format!("fallback-{}", limit.kind()), rule.max_keys),
                other_limits: Vec::new(),
            }),
        };
        GlobalRuntime {
            global: global.clone(),
            leases: SlotTable::new(owner, &lease_label(global), rule.max_keys),
            on_failure,
        }
    }

    pub(super) fn leases(&self) -> &SlotTable<LeaseSlot> {
        &self.leases
    }

    /// The rule as a request carrying `limit` (its own, read from the request) meets it:
    /// that limit in Redis. Only algorithms without a schedule take a limit from the
    /// request globally (the config refuses the others), and for them Redis runs the
    /// configured limit as it is, so the request's is Redis's too.
    fn carrying(&self, limit: Option<&GlobalLimit>) -> Cow<'_, GlobalRule> {
        match limit {
            None => Cow::Borrowed(&self.global),
            Some(limit) => Cow::Owned(GlobalRule {
                limit: limit.clone(),
                redis_limit: limit.clone(),
                ..self.global.clone()
            }),
        }
    }

    /// Updates the key's lease slot as [`SlotTable::update`] does, and adds to `report`
    /// the change the write made to the units the table holds: the key's after minus
    /// its before, less the units of another key's slot it replaced — lost with it, so
    /// also dropped unspent (`lease_units_expired`). Nothing written, no change.
    fn update_lease<S: SharedStore, R>(
        &self,
        store: &S,
        (hash, report): (&KeyHash, &mut RuleReport),
        now_us: u64,
        mut decide: impl FnMut(Option<LeaseSlot>) -> (R, Option<LeaseSlot>),
    ) -> Result<Updated<R>, UpdateError> {
        let mut change = 0;
        let updated = self.leases.update(
            store,
            hash,
            now_us,
            |s: LeaseSlot| s.vacancy(),
            |state| {
                let before = state.map_or(0, |s| s.held.count);
                let (result, next) = decide(state);
                change = next.map_or(0, |n| signed(n.held.count) - signed(before));
                (result, next)
            },
        );
        if let Ok(u) = &updated {
            if u.placement.is_some() {
                report.outstanding_units += change - signed(u.replaced_in_use);
                report.lease_units_expired += u.replaced_in_use;
            }
        }
        updated
    }

    /// Drops the units held in set `index` of the lease table whose window ended before
    /// `now_us`; returns how many (written: they left the table).
    pub(super) fn expire_set<S: SharedStore>(&self, store: &S, index: u32, now_us: u64) -> u64 {
        self.leases
            .tidy_set(store, index, |slot: LeaseSlot| slot.expire(now_us))
            .map_or(0, |u| u.result)
    }

    /// Whether landing `result` for `item` needs the instant the answer came back (see
    /// [`Engine::answer_needs_instant`](super::Engine::answer_needs_instant)): anything
    /// but a grant of what the request costs for a rule that answers plainly (a rule
    /// without a lease never reserves nor marks its key while asking).
    pub(super) fn needs_instant(
        &self,
        rule: &Rule,
        item: &PendingItem,
        result: Option<&Granted>,
    ) -> bool {
        !(self.answers_plainly(rule) && result.is_some_and(|r| r.allowed && r.granted == item.cost))
    }

    /// Whether Redis's answer to a request of this rule is the request's alone, and the
    /// Envoy keeps nothing of it but a denial: no lease, no local fallback, no commit, no
    /// delay.
    pub(super) fn answers_plainly(&self, rule: &Rule) -> bool {
        self.global.lease.is_none()
            && self.fallback().is_none()
            && rule.commit.is_none()
            && rule.delay.is_none()
    }

    /// The local share's slots (`failure_mode: local`).
    pub(super) fn fallback(&self) -> Option<&LimitTable> {
        match &self.on_failure {
            OnFailure::Local(slots) => Some(slots),
            OnFailure::Allow | OnFailure::Deny => None,
        }
    }

    /// A global rule: served from what this Envoy holds for the key (units due, a
    /// reservation not due yet, a cached denial) — then recorded here — or it must ask the
    /// bridge, for as much as this Envoy's demand says (see [`AskingFor`]).
    pub(super) fn spend_or_ask<S: SharedStore>(
        &self,
        eval: &mut Evaluation,
        store: &S,
        applied: &Applied<'_>,
        (mut demand, last_answers): (Option<&mut UnwrittenDemand>, Option<&LastAnswers>),
        asking: AskingFor,
    ) -> Option<Asked> {
        let now_us = applied.now_us;
        let mut report = applied.report();
        // A clamping rule's request is denied, or asked about, for the least it may
        // be reserved.
        let (rule, cost) = (applied.rule.id, applied.least);
        // What this Envoy keeps for the key (units, a cached denial, the demand) is the
        // key's and the limit its request carries.
        let hash = applied.units_hash();
        let global = self.carrying(applied.limit.as_ref().map(|own| &own.limit));
        // A shared limit's every request asks Redis (its asks are its key's demand, which
        // entitles the key in the next window), or spends what its key leased.
        let shared = applied.rule.share.is_some() && self.global.lease.is_none();
        if shared
            || self.answers_plainly(applied.rule)
                && last_answers.is_some_and(|a| a.had_left(rule, &hash, cost))
        {
            // Redis last had enough left for it: ask again, with no look at the cached
            // denials (see `LastAnswers`).
            return Some(Asked {
                want: cost,
                reserve: 0,
                last_known: None,
                lookup: report,
            });
        }
        let leased = self.global.lease.is_some();
        let unwritten = demand.as_mut().map_or(0, |d| d.take(rule, &hash));
        // A request looking again after waiting on a call was counted when it first looked.
        let counted = if demand.is_some() { cost } else { 0 };
        let spent = self.update_lease(store, (&hash, &mut report), now_us, |state| {
            let before = state.unwrap_or_default();
            let (spend, next) =
                before.spend_with_demand(now_us, cost, counted.saturating_add(unwritten));
            // Only what later requests read is written: units spent, and the demand
            // that sizes a lease's asks — which a denial's worker keeps instead (see
            // `UnwrittenDemand`), and an exact rule never reads.
            let write = match spend {
                Spend::Spent { .. } => true,
                Spend::Miss { .. } => leased,
                Spend::Denied { .. } | Spend::NotYetDue { .. } => leased && demand.is_none(),
            };
            let spent = if matches!(spend, Spend::Spent { .. }) {
                cost
            } else {
                0
            };
            let expired = if write {
                before.held.count.saturating_sub(spent + next.held.count)
            } else {
                0
            };
            ((spend, next, expired), write.then_some(next))
        });
        if let Ok(updated) = &spent {
            report.lease_units_expired += updated.result.2;
        }
        if let (Ok(updated), Some(demand), true) = (&spent, demand, leased) {
            if matches!(
                updated.result.0,
                Spend::Denied { .. } | Spend::NotYetDue { .. }
            ) {
                demand.add(rule, &hash, cost.saturating_add(unwritten));
            }
        }
        report.add_update(&spent);
        let (spend, slot) = match spent {
            Ok(updated) => (updated.result.0, updated.result.1),
            Err(e) => {
                report.lease_store_error = Some(e);
                (Spend::Miss { demand_per_s: 0 }, LeaseSlot::default())
            }
        };
        let quota = global.limit.policy().quota;
        if let Some(served) = Served::from_spend(spend, &slot, quota, now_us, Source::Lease) {
            served.record(eval, report, applied.rule);
            return None;
        }
        let Spend::Miss { demand_per_s } = spend else {
            return None;
        };
        let (want, reserve) = ask_for(&global, &slot, cost, demand_per_s, asking);
        Some(Asked {
            want,
            reserve,
            last_known: (slot.remote_at_us > 0)
                .then_some((slot.remote_remaining, slot.remote_at_us)),
            lookup: report,
        })
    }

    /// The call about `item` has left at `now_us`, with `deadline_us` as its timeout. A
    /// leased key's demand count is halved ([`LeaseSlot::asked`]). And if the key was
    /// saturated when Redis last spoke of it (nothing remaining, within the span a
    /// reservation covers), its slot denies the key's other requests until the call lands
    /// or fails ([`LeaseSlot::deny_while_asking`]); `item` keeps the mark to end it then.
    /// A saturated key's call brings at most a reservation, one unit per emission
    /// interval: the requests that would wait on it, or make calls of their own from
    /// other workers, would mostly get a 429 one round trip later — and behind a slow
    /// bridge each waiting request is a connection held for that round trip. A denial is
    /// always within the bound; what it costs is the requests of one round trip, whose
    /// share of the schedule Redis keeps as burst for the next call.
    pub(super) fn asking<S: SharedStore>(
        &self,
        store: &S,
        item: &mut PendingItem,
        now_us: u64,
        deadline_us: u64,
    ) {
        let Some(lease) = self.global.lease else {
            return;
        };
        // A shared limit's asks are its key's demand: none is denied here, unasked.
        let saturated = item.share.is_none()
            && item
                .last_known
                .is_some_and(|(remaining, at_us)| lease.saturated(remaining, at_us, now_us))
            && deadline_us > now_us;
        let cost = item.cost.max(1);
        let marked = self.update_lease(store, (&item.hash, &mut item.lookup), now_us, |state| {
            let slot = state.map(|s| s.asked(now_us));
            let slot = match slot {
                Some(s) if saturated => Some(s.deny_while_asking(cost, deadline_us)),
                other => other,
            };
            ((), slot)
        });
        item.lookup.add_update(&marked);
        if saturated && marked.is_ok() {
            item.asking_until_us = deadline_us;
        }
    }

    /// Ends the denial [`GlobalRuntime::asking`] set for `item`, when its call
    /// failed or left it undecided (a landed answer ends it in [`Self::record_reply`]).
    pub(super) fn stop_asking<S: SharedStore>(
        &self,
        store: &S,
        item: &mut PendingItem,
        now_us: u64,
    ) {
        let until_us = std::mem::take(&mut item.asking_until_us);
        if until_us == 0 {
            return;
        }
        let stopped = self.update_lease(store, (&item.hash, &mut item.lookup), now_us, |state| {
            ((), state.and_then(|s| s.stop_denying_for(until_us)))
        });
        item.lookup.add_update(&stopped);
    }

    /// Records the bridge's answer for one pending rule and writes what it leaves for
    /// later requests: units held, or a cached denial.
    pub(super) fn record_reply<S: SharedStore>(
        &self,
        eval: &mut Evaluation,
        store: &S,
        rule: &Rule,
        item: &PendingItem,
        result: &Granted,
        (sent_at_us, now_us): (u64, u64),
    ) {
        let global = &self.global;
        if self.answers_plainly(rule) {
            eval.answered.push((rule.id, item.hash, result.remaining));
        }
        let (mut reply, granted) = slot_reply(
            item,
            result,
            sent_at_us,
            now_us,
            global,
            rule.commit.is_some(),
        );
        if item.share.is_some() && matches!(reply.outcome, SlotReplyOutcome::Denied { .. }) {
            // A shared limit's asks are its key's demand, which entitles it in the next
            // window: no denial is kept here, every ask reaches Redis.
            reply.outcome = SlotReplyOutcome::Nothing;
        }
        let kept = match reply.outcome {
            SlotReplyOutcome::Held(held) => held.count,
            SlotReplyOutcome::Denied { .. } | SlotReplyOutcome::Nothing => 0,
        };
        // What later requests read: units held and cached denials; what Redis said last,
        // for a lease's asks and headers and for the local fallback's start. An exact
        // rule's plain answer leaves none of these.
        let read_later = !matches!(reply.outcome, SlotReplyOutcome::Nothing)
            || reply.exhausted_until_us > 0
            || global.lease.is_some()
            || self.fallback().is_some();
        let mut report = RuleReport {
            source: Some(Source::Bridge),
            decided_at_us: result.now_us,
            lease_units_granted: granted,
            lease_units_late: granted.saturating_sub(kept),
            ..item.lookup
        };
        if read_later {
            let stored = self.update_lease(store, (&item.hash, &mut report), now_us, |state| {
                let slot = state.unwrap_or_default();
                let slot = slot.stop_denying_for(item.asking_until_us).unwrap_or(slot);
                let recorded = slot.record(reply, now_us);
                // Recording spends nothing: what it holds less than before plus the
                // grant expired, or could not be kept beside the units held.
                let dropped = (slot.held.count + kept).saturating_sub(recorded.held.count);
                (dropped, Some(recorded))
            });
            if let Ok(updated) = &stored {
                // With what the request's own look at the slot dropped.
                report.lease_units_expired += updated.result;
            }
            report.add_update(&stored);
            if let Err(e) = stored {
                report.lease_store_error.get_or_insert(e);
            }
        }
        let mut quota = item.limit.as_ref().unwrap_or(&global.limit).policy().quota;
        if item.share.is_some() {
            // A shared limit's answer and headers are the key's share, not the parent's.
            quota = result.limit;
            let window_ns = global.limit.policy().window_ns;
            eval.own_policies
                .push((rule.id, Policy { quota, window_ns }));
        }
        let decision = Decision {
            limit: quota,
            remaining: result.remaining.min(quota),
            ..result.decision()
        };
        if result.allowed && rule.commit.is_some() && item.cost > 0 {
            // Counted in Redis at its clock: settled there when the response ends. A
            // clamping rule's request was granted up to its estimate.
            let granted = result.granted.clamp(item.cost, item.want.max(item.cost));
            let reserved = item.applied(rule, now_us).reserved(eval, granted);
            report.cost = reserved;
            eval.commits.push(PendingCommit {
                rule: rule.id,
                key: CommitKey::Global {
                    descriptor: item.descriptor.clone(),
                    share_key: item.share.as_ref().map(|s| s.key.clone()),
                },
                reserved,
                counted_at: Micros(result.now_us),
                limit: item.limit.clone(),
            });
        }
        eval.record(report, rule, decision);
    }

    /// Applies the rule's failure mode to one pending item at `now_us`: allow, deny, or
    /// decide in the local share's slots, starting from what this Envoy last knew of the
    /// global key.
    pub(super) fn fail<S: SharedStore>(
        &self,
        eval: &mut Evaluation,
        store: &S,
        rule: &Rule,
        item: PendingItem,
        now_us: u64,
    ) {
        let global = &self.global;
        let mut report = RuleReport {
            decided_at_us: now_us,
            ..item.lookup
        };
        match &self.on_failure {
            OnFailure::Allow => {
                report.outcome = RuleOutcome::BridgeFailed(FailureOutcome::Allowed);
                eval.reports.push(report);
            }
            OnFailure::Deny => {
                report.outcome = RuleOutcome::BridgeFailed(FailureOutcome::Denied);
                eval.reports.push(report);
                if rule.shadow {
                    eval.shadow_limited.push(rule.id);
                } else {
                    eval.unavailable = Some(rule.id);
                }
            }
            OnFailure::Local(slots) => {
                let limit = &slots.limit;
                let seed = item.last_known.map(|(remaining, at_us)| {
                    limit.state_with_remaining(remaining / global.expected_instances, at_us)
                });
                let applied = item.applied(rule, now_us);
                let slot = SlotDecision {
                    slots,
                    source: Source::Fallback,
                };
                decide_in_slot(eval, store, &applied, slot, report, seed, None);
                // The verdict is recorded; the report says how it came.
                if let Some(last) = eval.reports.last_mut() {
                    if let RuleOutcome::Allowed | RuleOutcome::Limited = last.outcome {
                        let allowed = last.outcome == RuleOutcome::Allowed;
                        last.outcome = RuleOutcome::BridgeFailed(FailureOutcome::Local { allowed });
                    }
                }
            }
        }
    }

    /// The `/v2/acquire` item asking about `item`, with the rule's id and the hold its
    /// lease sizes from the bridge's measured round trip.
    pub(super) fn wire_item(
        &self,
        rule: &Rule,
        item: &PendingItem,
        round_trip_us: u64,
    ) -> v2::Item {
        let global = &self.global;
        v2::Item {
            id: rule.id.0,
            rule: rule.name.clone(),
            descriptor: item.descriptor.clone(),
            limit: WireLimit::from(item.limit.as_ref().unwrap_or(&global.redis_limit)),
            cost: item.cost,
            want: item.want,
            reserve: item.reserve,
            ttl_us: global.lease.map_or(0, |l| l.hold_for(round_trip_us)),
            horizon_us: global.lease.map_or(0, |l| l.horizon_us),
            shadow: rule.shadow,
            share: item.share.clone(),
            // Only where Redis keeps a schedule (gcra): every other algorithm's item is
            // what bridges before this field decide.
            limit_from_request: !rule.limit_from.is_empty()
                && global.redis_limit.kind().spec().has_schedule,
        }
    }

    /// The `/v3/commit` item settling `commit` (counted in Redis under `descriptor`) with
    /// its actual cost, capped at what one item may carry.
    pub(super) fn commit_item(
        &self,
        rule: &Rule,
        (descriptor, share_key): (&[String], Option<&Vec<String>>),
        commit: &PendingCommit,
        actual: u64,
    ) -> v3::CommitItem {
        v3::CommitItem {
            id: 0, // numbered when its batch is sent
            rule: rule.name.clone(),
            descriptor: descriptor.to_vec(),
            limit: WireLimit::from(commit.limit.as_ref().unwrap_or(&self.global.redis_limit)),
            counted_at_us: commit.counted_at.us(),
            reserved: commit.reserved,
            actual: actual.min(MAX_WANT),
            share_key: share_key.cloned(),
        }
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

/// A global rule queued for the bridge, with its descriptor (built only now: facts are
/// cached, so visiting the key again costs no host call).
pub(super) fn pending_item<F: FactSource>(
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
        hash: applied.units_hash(),
        descriptor,
        cost: applied.least,
        // A clamping rule (exact: it has a commit) asks for up to its estimate.
        want: if applied.prompt.is_some() {
            applied.cost
        } else {
            asked.want
        },
        reserve: asked.reserve,
        last_known: asked.last_known,
        asking_until_us: 0,
        clamp_prompt: applied.prompt,
        lookup: asked.lookup,
        share: wire_share(&applied, facts),
        limit: applied.limit.map(|own| own.limit),
    }
}

/// A shared limit's item: the key within the parent as descriptor parts, its weight and
/// how many keys the parent tracks.
fn wire_share<F: FactSource>(
    applied: &Applied<'_>,
    facts: &mut Facts<'_, F>,
) -> Option<v2::WireShare> {
    let share = applied.rule.share.as_ref()?;
    let mut key = Vec::new();
    applied
        .rule
        .visit_share_key(facts, |origin, bytes| key.push(encode_part(origin, bytes)));
    Some(v2::WireShare {
        key,
        weight: applied.share.map_or(1, |s| s.weight),
        max_keys: share.limit.max_keys,
    })
}

/// What a result leaves in the key's slot: the units granted beyond the request's own
/// (a lease's leftover, or a whole reservation), or a cached denial for requests of at
/// least this cost, until the result's retry time counted from when the call left; and
/// how many units were granted beyond the request's own (the slot keeps none of them
/// when the call took longer than they were valid).
///
/// A saturated token bucket or sliding-window counter frees a unit or two at a time and
/// every Envoy would ask for each: such a key is asked about at most once per horizon —
/// a cached denial lasts at least that long, and so does one after a grant that left
/// Redis with nothing. What frees up meanwhile is not lost: it waits in Redis (tokens up
/// to the capacity, a window's unspent share) for whoever asks next. GCRA reserves its
/// schedule instead; a fixed window's retry time is its end anyway; a sliding log's unit
/// claimed late would leave the log late too, so it is asked for when due.
fn slot_reply(
    item: &PendingItem,
    result: &Granted,
    sent_at_us: u64,
    now_us: u64,
    global: &GlobalRule,
    commits: bool,
) -> (SlotReply, u64) {
    let floor_us = match global.lease {
        Some(lease) if global.redis_limit.kind().spec().frees_gradually => lease.horizon_us,
        // A schedule's key is reserved once Redis denies it; a grant of the last units
        // it had means it refills a unit or two between calls, each call taking them as
        // a lease (a request that fits is never denied, so never reserves): a call per
        // round trip. Not asking for half the burst's time lets what frees up wait in
        // Redis as burst, well within what it can hold, for the next call.
        Some(lease) if has_schedule(global) => lease.horizon_us.min(
            Nanos(global.redis_limit.policy().window_ns / 2)
                .as_micros_floor()
                .us(),
        ),
        _ => 0,
    };
    let extra = if result.allowed {
        // A commit's grant is the request's own: an exact rule's, or a clamping rule's
        // reservation up to its estimate.
        if commits {
            0
        } else {
            result.granted.saturating_sub(item.cost)
        }
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
        SlotReplyOutcome::Held(held)
    } else if !result.allowed {
        let mut retry_us = Nanos(result.retry_after_ns.unwrap_or(result.reset_after_ns))
            .as_micros_floor()
            .us();
        if commits {
            // Commits give units back at any time: a denial is trusted only briefly.
            retry_us = retry_us.min(COMMIT_DENIAL_CACHE_US);
        }
        SlotReplyOutcome::Denied {
            until_us: sent_at_us.saturating_add(retry_us.max(floor_us)),
            cost: item.cost,
        }
    } else {
        SlotReplyOutcome::Nothing
    };
    let exhausted_until_us = if result.allowed && result.remaining == 0 && floor_us > 0 {
        sent_at_us.saturating_add(floor_us)
    } else {
        0
    };
    let reply = SlotReply {
        outcome,
        exhausted_until_us,
        remaining: result.remaining,
        reset_after_ns: result.reset_after_ns,
    };
    (reply, extra)
}
