//! Envoy stats for every decision.
//!
//! Envoy shows them as `wasmcustom.weir.…` in `/stats` and without that prefix in
//! `/stats/prometheus`. Every worker defines the same names, which Envoy maps to the
//! same stats, so the counters are process-wide.
//!
//! Per rule (`weir.rule.<name>.<counter>`): `allowed`, `limited`, `shadow_limited`,
//! `key_missing` (a key source had no value: the rule did not apply), `store_errors`
//! (shared data failed or the CAS gave up: the rule let the request through), and the
//! gauges `slots_in_use` and `slots_capacity` of its slot table. Global rules also
//! count `lease_hits` (served from a lease), `denial_cache_hits` (denied by a cached
//! denial, no bridge call), `bridge_decisions` (decided by Redis), and what their failure
//! mode did: `failure_allowed`, `failure_denied`, `failure_local`. For the store
//! (`weir.store.<counter>`): `cas_retries`, `cas_give_ups`, `slot_takeovers`,
//! `slot_evictions`. For the bridge (`weir.bridge.<counter>`): `calls`, `skipped` (not
//! called: it failed less than a second ago), `errors_timeout`, `errors_unavailable`,
//! `errors_status`, `errors_bad_body`, and the histogram `latency_us`.

use crate::host::{self, HostResult, MetricType};
use weir_core::engine::{BridgeError, Evaluation, FailureOutcome, RuleOutcome, Source};
use weir_core::store::{Placement, UpdateError};
use weir_core::wire::ReplyError;

#[derive(Debug, Default)]
struct RuleMetrics {
    allowed: u32,
    limited: u32,
    shadow_limited: u32,
    key_missing: u32,
    store_errors: u32,
    slots_in_use: u32,
    lease_hits: u32,
    denial_cache_hits: u32,
    bridge_decisions: u32,
    failure_allowed: u32,
    failure_denied: u32,
    failure_local: u32,
}

#[derive(Debug, Default)]
pub struct Metrics {
    rules: Vec<RuleMetrics>,
    cas_retries: u32,
    cas_give_ups: u32,
    slot_takeovers: u32,
    slot_evictions: u32,
    bridge_calls: u32,
    bridge_skipped: u32,
    bridge_timeouts: u32,
    bridge_unavailable: u32,
    bridge_bad_status: u32,
    bridge_bad_body: u32,
    bridge_latency_us: u32,
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
                lease_hits: counter(&format!("{prefix}.lease_hits"))?,
                denial_cache_hits: counter(&format!("{prefix}.denial_cache_hits"))?,
                bridge_decisions: counter(&format!("{prefix}.bridge_decisions"))?,
                failure_allowed: counter(&format!("{prefix}.failure_allowed"))?,
                failure_denied: counter(&format!("{prefix}.failure_denied"))?,
                failure_local: counter(&format!("{prefix}.failure_local"))?,
            });
        }
        Ok(Metrics {
            rules,
            cas_retries: counter("weir.store.cas_retries")?,
            cas_give_ups: counter("weir.store.cas_give_ups")?,
            slot_takeovers: counter("weir.store.slot_takeovers")?,
            slot_evictions: counter("weir.store.slot_evictions")?,
            bridge_calls: counter("weir.bridge.calls")?,
            bridge_skipped: counter("weir.bridge.skipped")?,
            bridge_timeouts: counter("weir.bridge.errors_timeout")?,
            bridge_unavailable: counter("weir.bridge.errors_unavailable")?,
            bridge_bad_status: counter("weir.bridge.errors_status")?,
            bridge_bad_body: counter("weir.bridge.errors_bad_body")?,
            bridge_latency_us: host::define_metric(
                MetricType::Histogram,
                "weir.bridge.latency_us",
            )?,
        })
    }

    pub fn bridge_call(&self) {
        bump(self.bridge_calls, 1);
    }

    pub fn bridge_latency(&self, us: u64) {
        let _ = host::record_metric(self.bridge_latency_us, us);
    }

    pub fn bridge_error(&self, error: &ReplyError) {
        let id = match error {
            ReplyError::Timeout => self.bridge_timeouts,
            ReplyError::Unavailable => self.bridge_unavailable,
            ReplyError::Status(_) => self.bridge_bad_status,
            ReplyError::BadBody(_) => self.bridge_bad_body,
        };
        bump(id, 1);
    }

    pub fn record(&self, eval: &Evaluation) {
        if eval.bridge_error == Some(BridgeError::Skipped) {
            bump(self.bridge_skipped, 1);
        }
        for report in &eval.reports {
            let Some(rule) = self.rules.get(report.rule) else {
                continue;
            };
            match report.outcome {
                RuleOutcome::NotMatched | RuleOutcome::Pending => continue,
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
                RuleOutcome::BridgeFailed(FailureOutcome::Allowed) => bump(rule.failure_allowed, 1),
                RuleOutcome::BridgeFailed(FailureOutcome::Denied) => bump(rule.failure_denied, 1),
                RuleOutcome::BridgeFailed(FailureOutcome::Local { allowed }) => {
                    bump(rule.failure_local, 1);
                    bump(if allowed { rule.allowed } else { rule.limited }, 1);
                }
            }
            match report.source {
                Some(Source::Lease) => bump(rule.lease_hits, 1),
                Some(Source::DenialCache) => bump(rule.denial_cache_hits, 1),
                Some(Source::Bridge) => bump(rule.bridge_decisions, 1),
                Some(Source::Slot | Source::Fallback) | None => {}
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
