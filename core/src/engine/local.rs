//! Local rules: decided in this Envoy's shared data, in the rule's slot table — or from
//! what the worker took ahead for the key (a reservoir), or held instead of denied (a
//! delay). A global rule's local fallback decides here too, in its own slots.

use crate::algorithms::{Ahead, GlobalLimit, Limit, SlotState, TakenAhead};
use crate::bounds::MAX_WANT;
use crate::delay::RELEASE_SLACK_US;
use crate::key::KeyHash;
use crate::lease::{Held, SlotReply, SlotReplyOutcome, Spend};
use crate::reservoir::{Found, WorkerTable};
use crate::rules::{Delay, Reservoir, Rule};
use crate::store::slot_table::SlotTable;
use crate::store::{SharedStore, UpdateError, Updated, Vacancy};
use crate::time::{Micros, Nanos};
use crate::worker::Worker;

use super::evaluation::{Applied, CommitKey, Evaluation, HoldOffer, PendingCommit, Served};
use super::report::{signed, RuleOutcome, RuleReport, Source};

/// A limit and the slot table of this Envoy it is decided in.
#[derive(Debug)]
pub(super) struct LimitTable {
    pub(super) limit: Limit,
    pub(super) table: SlotTable,
    /// When requests carry limits of their own ([`Rule::limit_from`]): the limits at
    /// the corners of their ranges. A key's state says nothing any more only once it
    /// says nothing under every one of them, so a slot is not taken from a key whose
    /// state still matters under another request's limit.
    pub(super) other_limits: Vec<Limit>,
}

impl LimitTable {
    /// Runs `decide` on the key's state in the table, with CAS (see [`SlotTable::update`]).
    fn update<S: SharedStore, R>(
        &self,
        store: &S,
        hash: &KeyHash,
        now_us: u64,
        decide: impl FnMut(Option<SlotState>) -> (R, Option<SlotState>),
    ) -> Result<Updated<R>, UpdateError> {
        let vacancy = |state: SlotState| Vacancy {
            idle_at_us: self
                .other_limits
                .iter()
                .map(|limit| limit.idle_at_us(state))
                .fold(self.limit.idle_at_us(state), u64::max),
            in_use: self.limit.in_use(state, now_us),
        };
        self.table.update(store, hash, now_us, vacancy, decide)
    }

    /// Settles what the key counted for a request (`commit`) with its actual cost (at
    /// most [`MAX_WANT`]), known at `now_us`; returns whether the key's state changed.
    pub(super) fn settle<S: SharedStore>(
        &self,
        store: &S,
        hash: &KeyHash,
        commit: &PendingCommit,
        actual: u64,
        now_us: u64,
    ) -> Result<bool, UpdateError> {
        // What one response may claim: as for a global rule's item (a response saying
        // 2^64 tokens would push the key's refills out of reach).
        let actual = actual.min(MAX_WANT);
        let limit = commit
            .limit
            .as_ref()
            .and_then(GlobalLimit::as_slot)
            .unwrap_or(&self.limit);
        self.update(store, hash, now_us, |state| {
            let next = limit.settle(
                state,
                commit.counted_at.us(),
                commit.reserved,
                actual,
                now_us,
            );
            (next.is_some(), next)
        })
        .map(|updated| updated.result)
    }
}

/// A local rule as the engine runs it: its limit and slots, and what its worker may do
/// beside them (take units ahead, hold a request it would deny).
#[derive(Debug)]
pub(super) struct LocalRuntime {
    pub(super) slots: LimitTable,
    reservoir: Option<Reservoir>,
    pub(super) delay: Option<Delay>,
}

impl LocalRuntime {
    /// The rule's runtime, its slot table named after `owner`.
    pub(super) fn new(rule: &Rule, limit: &Limit, owner: &str) -> Self {
        LocalRuntime {
            slots: LimitTable {
                limit: limit.clone(),
                table: SlotTable::new(owner, limit.kind().name(), rule.max_keys),
                other_limits: rule.request_limit_corners(),
            },
            reservoir: rule.reservoir,
            delay: rule.delay,
        }
    }

    /// Decides the rule for a request that arrived at `arrived_us`: from the worker's
    /// reservoir when the rule has one, else in the slot; held when the rule delays —
    /// but never past `deadline_us`, the request's own deadline when it stated one.
    pub(super) fn decide<S: SharedStore>(
        &self,
        eval: &mut Evaluation,
        store: &S,
        worker: &mut Worker,
        applied: &Applied<'_>,
        (arrived_us, deadline_us): (u64, Option<u64>),
    ) {
        let rule = applied.rule;
        let now_us = applied.now_us;
        let slot = SlotDecision {
            slots: &self.slots,
            source: Source::Slot,
        };
        let room = worker.waiting.has_room(rule.id);
        let offer = HoldOffer::of(self.delay, eval, room, now_us, (arrived_us, deadline_us));
        match (self.reservoir, worker.reservoirs.table(rule.id)) {
            (Some(settings), Some(table)) => {
                let reservoir = ReservoirDecision {
                    settings,
                    worker: table,
                };
                decide_with_reservoir(eval, store, applied, slot, reservoir, offer);
            }
            _ => {
                let report = applied.report();
                decide_in_slot(eval, store, applied, slot, report, None, offer);
            }
        }
        if let Some(held) = eval.held.as_mut() {
            held.arrived_us = arrived_us;
            held.deadline_us = deadline_us;
        }
    }
}

/// A limit decided in a slot table of this Envoy, and what to call the decision.
pub(super) struct SlotDecision<'a> {
    pub(super) slots: &'a LimitTable,
    pub(super) source: Source,
}

/// Decides a limit in a slot table and records it; a store failure lets the request
/// through and is reported. A key without state starts from `seed` when there is one
/// (a local fallback starts from what this Envoy last knew of the global key, so an
/// exhausted key does not restart full).
pub(super) fn decide_in_slot<S: SharedStore>(
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
    let limit = applied.limit_or(&slot.slots.limit);
    let updated = slot.slots.update(store, &applied.hash, now_us, |state| {
        let state = state.or(seed);
        match offer.filter(|o| o.room) {
            Some(o) => {
                let (decision, hold, next) =
                    limit.hold(state, now_us, applied.cost, o.max_wait_us, RELEASE_SLACK_US);
                ((decision, hold, applied.cost), next)
            }
            // A clamping rule takes what the key has left, down to the least.
            None => {
                let (decision, granted, next) =
                    limit.acquire(state, now_us, applied.least, applied.cost);
                ((decision, None, granted), next)
            }
        }
    });
    report.add_update(&updated);
    match updated {
        Ok(updated) => {
            let (decision, hold, granted) = updated.result;
            if decision.allowed && applied.rule.commit.is_some() && applied.cost > 0 {
                let reserved = applied.reserved(eval, granted);
                report.cost = reserved;
                eval.commits.push(PendingCommit {
                    rule: applied.rule.id,
                    key: CommitKey::Local(applied.hash),
                    reserved,
                    counted_at: Micros(now_us),
                    limit: applied.limit.as_ref().map(|own| own.limit.clone()),
                });
            }
            eval.record_or_hold(report, applied.rule, decision, hold, offer);
        }
        Err(error) => {
            report.outcome = RuleOutcome::StoreFailed(error);
            eval.reports.push(report);
        }
    }
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
    let (entry, found) = reservoir.worker.entry(&applied.units_hash(), now_us);
    report.reservoir_lost = match found {
        Found::Evicted { lost_units } => Some(lost_units),
        Found::Existing | Found::Empty => None,
    };
    let held_before = entry.held.count;
    // The change to the worker's units outstanding once the entry is final: its units
    // after less before, and the units an evicted key's entry held.
    let lost = report.reservoir_lost.unwrap_or(0);
    let outstanding = |held_after: u64| signed(held_after) - signed(held_before) - signed(lost);
    let (spend, next) = entry.spend(now_us, cost);
    // A miss asks the shared slot at once: its demand count is halved as a call's is.
    *entry = match spend {
        Spend::Miss { .. } => next.asked(now_us),
        _ => next,
    };
    let spent = match spend {
        Spend::Spent { .. } => cost,
        _ => 0,
    };
    report.reservoir_expired = held_before.saturating_sub(spent + next.held.count);
    let limit = applied.limit_or(&slot.slots.limit);
    let quota = limit.policy().quota;
    // A cached denial the rule's delay covers goes to shared data, to be held there.
    let demand_per_s = match spend {
        Spend::Miss { demand_per_s } => demand_per_s,
        Spend::Denied { retry_after_ns }
            if offer.is_some_and(|o| o.covers(Some(retry_after_ns))) =>
        {
            0
        }
        _ => {
            report.outstanding_units = outstanding(entry.held.count);
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
    let updated = slot.slots.update(store, &applied.hash, now_us, |state| {
        let (decision, taken, next) = limit.take_ahead(state, now_us, cost, ahead);
        match offer.filter(|o| o.room && !decision.allowed) {
            Some(o) => {
                let (decision, hold, next) =
                    limit.hold(state, now_us, cost, o.max_wait_us, RELEASE_SLACK_US);
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
            report.outstanding_units = outstanding(entry.held.count);
            eval.reports.push(report);
            return;
        }
    };
    if hold.is_some() {
        // Nothing to cache: the request has its place in the schedule.
        *entry = entry.record(
            SlotReply {
                outcome: SlotReplyOutcome::Nothing,
                exhausted_until_us: 0,
                remaining: decision.remaining,
                reset_after_ns: decision.reset_after_ns,
            },
            now_us,
        );
        report.outstanding_units = outstanding(entry.held.count);
        eval.record_or_hold(report, applied.rule, decision, hold, offer);
        return;
    }
    let outcome = if taken.units > 0 {
        // Spendable until just before the end of their validity (a window's end belongs
        // to the next window).
        let window_us = Nanos(taken.valid_ns)
            .as_micros_floor()
            .us()
            .saturating_sub(1);
        SlotReplyOutcome::Held(Held {
            count: taken.units,
            next_due_ns: Micros(now_us).as_epoch_nanos(),
            spacing_ns: 0,
            window_us,
        })
    } else if let (false, Some(retry_after_ns)) = (decision.allowed, decision.retry_after_ns) {
        SlotReplyOutcome::Denied {
            until_us: now_us.saturating_add(Nanos(retry_after_ns).as_micros_floor().us()),
            cost,
        }
    } else {
        SlotReplyOutcome::Nothing
    };
    let reply = SlotReply {
        outcome,
        exhausted_until_us: 0,
        remaining: decision.remaining.saturating_sub(taken.units),
        reset_after_ns: decision.reset_after_ns,
    };
    *entry = entry.record(reply, now_us);
    report.outstanding_units = outstanding(entry.held.count);
    report.reservoir_taken = taken.units;
    eval.record_or_hold(report, applied.rule, decision, None, offer);
}
