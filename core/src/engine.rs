//! One request through every local rule: match, key, cost, decide in the slot table.
//!
//! Rules run in config order. Each rule that allows spends its tokens at once; the
//! first enforcing rule that denies stops the evaluation, so rules *before* it keep
//! what they spent and rules *after* it are not charged. Put the narrowest rules
//! (per user) before the broad ones (per route, global) so that a client over its own
//! limit does not eat into a shared quota. Shadow rules decide, count and spend like
//! enforcing ones but never deny and never stop the evaluation.
//!
//! A shared-data failure or a CAS give-up fails open for that rule (the request is not
//! denied by a store we cannot read) and is reported, to be counted.

use crate::algorithms::SlotState;
use crate::config::Config;
use crate::response::RuleVerdict;
use crate::rules::{FactSource, Facts};
use crate::store::{KeyHasher, Placement, Seed, SharedStore, SlotTable, StoreError, UpdateError};

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
    /// The store failed; the rule let the request through.
    StoreFailed(UpdateError),
}

/// A rule's report for metrics and logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RuleReport {
    pub rule: usize,
    pub outcome: RuleOutcome,
    pub placement: Option<Placement>,
    pub cas_retries: u32,
}

/// The result of evaluating a request.
#[derive(Debug, Default)]
pub struct Evaluation<'c> {
    /// One per enforcing rule that decided, in order, for the RateLimit headers.
    pub verdicts: Vec<RuleVerdict<'c>>,
    /// Index into `verdicts` of the rule that denied the request.
    pub denied_by: Option<usize>,
    /// One per rule looked at (rules after a denial are not looked at).
    pub reports: Vec<RuleReport>,
    /// Names of the shadow rules that would have denied.
    pub shadow_limited: Vec<&'c str>,
}

impl Evaluation<'_> {
    pub fn denied(&self) -> bool {
        self.denied_by.is_some()
    }
}

/// A compiled config with a slot table per rule.
#[derive(Debug)]
pub struct Engine {
    pub config: Config,
    tables: Vec<SlotTable>,
}

impl Engine {
    pub fn new(config: Config) -> Self {
        let tables = config
            .rules
            .iter()
            .map(|rule| SlotTable::new(&rule.name, rule.limit.kind(), rule.max_keys))
            .collect();
        Engine { config, tables }
    }

    pub fn table(&self, rule: usize) -> Option<&SlotTable> {
        self.tables.get(rule)
    }

    /// Creates the slot tables that do not exist yet. Run before serving.
    pub fn prepare<S: SharedStore>(&self, store: &S) -> Result<u32, StoreError> {
        let mut created = 0;
        for table in &self.tables {
            created += table.create_missing(store)?;
        }
        Ok(created)
    }

    /// Evaluates every rule against one request at `now_us`.
    pub fn evaluate<'c, F: FactSource, S: SharedStore>(
        &'c self,
        store: &S,
        seed: &Seed,
        facts: &mut Facts<'_, F>,
        now_us: u64,
    ) -> Evaluation<'c> {
        let mut eval = Evaluation::default();
        for (index, (rule, table)) in self.config.rules.iter().zip(&self.tables).enumerate() {
            let mut report = RuleReport {
                rule: index,
                outcome: RuleOutcome::NotMatched,
                placement: None,
                cas_retries: 0,
            };
            if !rule.matches(facts) {
                eval.reports.push(report);
                continue;
            }
            let mut hasher = KeyHasher::new(seed);
            if !rule.visit_key(facts, |origin, bytes| hasher.part(origin, bytes)) {
                report.outcome = RuleOutcome::KeyMissing;
                eval.reports.push(report);
                continue;
            }
            let hash = hasher.finish();
            let cost = rule.cost(facts);
            let limit = &rule.limit;
            let updated = table.update(
                store,
                &hash,
                now_us,
                |state: SlotState| limit.idle_at_us(state),
                |state| limit.decide(state, now_us, cost),
            );
            let decision = match updated {
                Ok(updated) => {
                    report.placement = updated.placement;
                    report.cas_retries = updated.cas_retries;
                    updated.result
                }
                Err(error) => {
                    report.outcome = RuleOutcome::StoreFailed(error);
                    if let UpdateError::GaveUp { attempts } = error {
                        report.cas_retries = attempts;
                    }
                    eval.reports.push(report);
                    continue;
                }
            };
            if rule.shadow {
                report.outcome = if decision.allowed {
                    RuleOutcome::Allowed
                } else {
                    RuleOutcome::ShadowLimited
                };
                if !decision.allowed {
                    eval.shadow_limited.push(&rule.name);
                }
                eval.reports.push(report);
                continue;
            }
            eval.verdicts.push(RuleVerdict {
                rule: &rule.name,
                decision,
                policy: limit.policy(),
            });
            if decision.allowed {
                report.outcome = RuleOutcome::Allowed;
                eval.reports.push(report);
            } else {
                report.outcome = RuleOutcome::Limited;
                eval.reports.push(report);
                eval.denied_by = Some(eval.verdicts.len() - 1);
                break;
            }
        }
        eval
    }
}
