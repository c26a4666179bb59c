//! Local rules whose limit their keys share (`share`): decided in the rule's table of
//! parents, each parent's window and keys in one shared-data value (see
//! [`crate::share`] for the rule, [`crate::store::share_table`] for the layout).

use crate::algorithms::Policy;
use crate::rules::{Rule, Share};
use crate::share::{ShareAsk, ShareLimit};
use crate::store::{ShareTable, SharedStore};

use super::evaluation::{Applied, Evaluation};
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

    /// The parent's limit and window, and the keys it tracks.
    pub(super) fn limit(&self) -> ShareLimit {
        self.share.limit
    }

    /// Decides the request of the key within the parent `applied` names. A store failure lets the request through and is reported, as for any local rule.
    pub(super) fn decide<S: SharedStore>(
        &self,
        eval: &mut Evaluation,
        store: &S,
        applied: &Applied<'_>,
    ) {
        let Some(of) = applied.share else {
            return;
        };
        let limit = self.share.limit;
        let mut report = applied.report();
        report.source = Some(Source::Slot);
        report.limit_invalid = of.weight_invalid;
        let ask = ShareAsk {
            key: of.key,
            weight: of.weight,
            cost: applied.cost,
        };
        let updated = self
            .table
            .update(store, &applied.hash, applied.now_us, |state| {
                limit.decide(state, applied.now_us, ask)
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
                eval.record(report, applied.rule, decided.decision);
            }
            Err(error) => {
                report.outcome = RuleOutcome::StoreFailed(error);
                eval.reports.push(report);
            }
        }
    }
}
