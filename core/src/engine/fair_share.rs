//! Local rules whose limit their keys share (`share`): decided in the rule's table of
//! parents, each parent's window and keys in one shared-data value (see
//! [`crate::share`] for the rule, [`crate::store::share_table`] for the layout).

use crate::algorithms::{Hold, Policy};
use crate::bounds::MAX_WANT;
use crate::delay::Turn;
use crate::key::KeyHash;
use crate::rules::{Rule, Share};
use crate::share::{ShareAsk, ShareLimit};
use crate::store::{ShareTable, SharedStore, UpdateError};
use crate::time::{Micros, Nanos};
use crate::worker::Worker;

use super::evaluation::{Applied, CommitKey, Evaluation, HoldOffer, PendingCommit};
use super::report::{RuleOutcome, ShareReport, Source};

/// A shared rule as the engine runs it: its limit and table of parents.
#[derive(Debug)]
pub(super) struct ShareRuntime {
    share: Share,
    pub(super) table: ShareTable,
}

impl ShareRuntime {
    /// The rule's runtime, its table named after `owner`.
    pub(super) fn new(rule: &Rule, share: &Share, owner: &str) -> Self {
        ShareRuntime {
            share: share.clone(),
            table: ShareTable::new(owner, rule.max_keys, share.limit.window_us),
        }
    }

    /// Settles what `commit` counted for the key `key` within `parent` with its actual
    /// cost (see [`ShareLimit::settle`]); returns whether the parent's state changed.
    pub(super) fn settle<S: SharedStore>(
        &self,
        store: &S,
        (parent, key): (&KeyHash, Option<u64>),
        commit: &PendingCommit,
        actual: u64,
        now_us: u64,
    ) -> Result<bool, UpdateError> {
        let limit = self.share.limit;
        let amounts = (commit.reserved, actual.min(MAX_WANT));
        self.table
            .update(store, parent, now_us, |state| {
                let at = (commit.counted_at.us(), now_us);
                let next = limit.settle(state, at, key, amounts);
                (next.is_some(), next)
            })
            .map(|updated| updated.result)
    }

    /// The parent's limit and window, and the keys it tracks.
    pub(super) fn limit(&self) -> ShareLimit {
        self.share.limit
    }

    /// Decides the request of the key within the parent `applied` names, for a request
    /// that arrived at `arrived_us` (and must be answered by `deadline_us`, if it said
    /// so). A store failure lets the request through and is reported, as for any local
    /// rule. A rule with a delay holds a request it denies until the window ends, when
    /// the request waits its key's turn to be decided again ([`crate::delay`]).
    pub(super) fn decide<S: SharedStore>(
        &self,
        eval: &mut Evaluation,
        store: &S,
        worker: &Worker,
        applied: &Applied<'_>,
        (arrived_us, deadline_us): (u64, Option<u64>),
    ) {
        let Some(of) = applied.share else {
            return;
        };
        let rule = applied.rule;
        let turn = Turn {
            parent: applied.hash,
            key: of.key,
            weight: of.weight,
            cost: applied.cost,
        };
        // Looked for only when the rule delays: a full queue's search is over its keys.
        let room = rule.delay.is_some() && worker.waiting.has_room_for(rule.id, &turn);
        let arrival = (arrived_us, deadline_us);
        let offer = HoldOffer::of(rule.delay, eval, room, applied.now_us, arrival);
        let limit = self.share.limit;
        let mut report = applied.report();
        report.source = Some(Source::Slot);
        report.limit_invalid = of.weight_invalid;
        let ask = ShareAsk::exact(of.key, of.weight, applied.cost);
        let updated = self
            .table
            .update(store, &applied.hash, applied.now_us, |state| {
                let (decided, next) = limit.decide(state, applied.now_us, ask);
                (decided, Some(next))
            });
        report.add_update(&updated);
        match updated {
            Ok(updated) => {
                let decided = updated.result;
                report.share = Some(ShareReport {
                    keys: decided.keys,
                    share: decided.share,
                    untracked: decided.untracked,
                });
                // The RateLimit headers describe the key's share, not the parent's.
                let policy = Policy {
                    quota: decided.share,
                    window_ns: limit.window_us.saturating_mul(1000),
                };
                eval.own_policies.push((applied.rule.id, policy));
                if decided.decision.allowed && applied.rule.commit.is_some() && applied.cost > 0 {
                    eval.commits.push(PendingCommit {
                        rule: applied.rule.id,
                        key: CommitKey::Share {
                            parent: applied.hash,
                            key: of.key,
                        },
                        reserved: applied.cost,
                        counted_at: Micros(applied.now_us),
                        limit: None,
                    });
                }
                let decision = decided.decision;
                let due_us = offer
                    .filter(|o| !decision.allowed && o.room && o.covers(decision.retry_after_ns))
                    .and(decision.retry_after_ns)
                    .map(|ns| applied.now_us + Nanos(ns).as_micros_ceil().us());
                match due_us {
                    // Held to the window's end, with no unit taken: decided again then.
                    Some(due_us) => {
                        let hold = Hold {
                            due_us,
                            release_by_us: due_us,
                        };
                        eval.hold(report, rule, decision, hold, Some(turn));
                    }
                    None => eval.record_or_hold(report, rule, decision, None, offer),
                }
                if let Some(held) = eval.held.as_mut() {
                    held.arrived_us = arrived_us;
                    held.deadline_us = deadline_us;
                }
            }
            Err(error) => {
                report.outcome = RuleOutcome::StoreFailed(error);
                eval.reports.push(report);
            }
        }
    }
}
