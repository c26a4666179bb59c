//! Envoy stats for every decision.
//!
//! Envoy shows them as `wasmcustom.weir.…` in `/stats` and without that prefix in
//! `/stats/prometheus`. Every worker defines the same names, which Envoy maps to the
//! same stats, so the counters are process-wide.
//!
//! Per rule (`weir.rule.<name>.<counter>`): `allowed`, `limited`, `shadow_limited`,
//! `key_missing` (a key source had no value: the rule did not apply), `store_errors`
//! (shared data failed or the CAS gave up: the rule let the request through), and the
//! gauges `slots_in_use` and `slots_capacity` of its slot table. For the store
//! (`weir.store.<counter>`): `cas_retries`, `cas_give_ups`, `slot_takeovers`,
//! `slot_evictions`.

use crate::host::{self, HostResult, MetricType};
use weir_core::engine::{Evaluation, RuleOutcome};
use weir_core::store::{Placement, UpdateError};

#[derive(Debug, Default)]
struct RuleMetrics {
    allowed: u32,
    limited: u32,
    shadow_limited: u32,
    key_missing: u32,
    store_errors: u32,
    slots_in_use: u32,
}

#[derive(Debug, Default)]
pub struct Metrics {
    rules: Vec<RuleMetrics>,
    cas_retries: u32,
    cas_give_ups: u32,
    slot_takeovers: u32,
    slot_evictions: u32,
}

fn counter(name: &str) -> HostResult<u32> {
    host::define_metric(MetricType::Counter, name)
}

fn bump(id: u32, by: i64) {
    // A stat that cannot be incremented is not worth failing a request for.
    let _ = host::increment_metric(id, by);
}

impl Metrics {
    /// Defines every metric. `tables` gives, per rule, the table capacity and the slots
    /// already in use (tables survive config reloads).
    pub fn define(rule_names: &[&str], tables: &[(u64, u64)]) -> HostResult<Metrics> {
        let mut rules = Vec::with_capacity(rule_names.len());
        for (i, name) in rule_names.iter().enumerate() {
            let prefix = format!("weir.rule.{name}");
            let slots_in_use =
                host::define_metric(MetricType::Gauge, &format!("{prefix}.slots_in_use"))?;
            let slots_capacity =
                host::define_metric(MetricType::Gauge, &format!("{prefix}.slots_capacity"))?;
            let (capacity, in_use) = tables.get(i).copied().unwrap_or((0, 0));
            host::record_metric(slots_capacity, capacity)?;
            host::record_metric(slots_in_use, in_use)?;
            rules.push(RuleMetrics {
                allowed: counter(&format!("{prefix}.allowed"))?,
                limited: counter(&format!("{prefix}.limited"))?,
                shadow_limited: counter(&format!("{prefix}.shadow_limited"))?,
                key_missing: counter(&format!("{prefix}.key_missing"))?,
                store_errors: counter(&format!("{prefix}.store_errors"))?,
                slots_in_use,
            });
        }
        Ok(Metrics {
            rules,
            cas_retries: counter("weir.store.cas_retries")?,
            cas_give_ups: counter("weir.store.cas_give_ups")?,
            slot_takeovers: counter("weir.store.slot_takeovers")?,
            slot_evictions: counter("weir.store.slot_evictions")?,
        })
    }

    pub fn record(&self, eval: &Evaluation<'_>) {
        for report in &eval.reports {
            let Some(rule) = self.rules.get(report.rule) else {
                continue;
            };
            match report.outcome {
                RuleOutcome::NotMatched => continue,
                RuleOutcome::KeyMissing => bump(rule.key_missing, 1),
                RuleOutcome::Allowed => bump(rule.allowed, 1),
                RuleOutcome::Limited => bump(rule.limited, 1),
                RuleOutcome::ShadowLimited => bump(rule.shadow_limited, 1),
                RuleOutcome::StoreFailed(error) => {
                    bump(rule.store_errors, 1);
                    if let UpdateError::GaveUp { .. } = error {
                        bump(self.cas_give_ups, 1);
                    }
                }
            }
            if report.cas_retries > 0 {
                bump(self.cas_retries, i64::from(report.cas_retries));
            }
            match report.placement {
                Some(Placement::Empty) => bump(rule.slots_in_use, 1),
                Some(Placement::Takeover) => bump(self.slot_takeovers, 1),
                Some(Placement::Eviction) => bump(self.slot_evictions, 1),
                Some(Placement::Existing) | None => {}
            }
        }
    }
}
