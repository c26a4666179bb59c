//! Prometheus metrics, served as text at `/metrics`.
//!
//! | metric | labels |
//! |---|---|
//! | `weir_bridge_requests_total` | `code` (HTTP status) |
//! | `weir_bridge_decisions_total` | `rule` (at most [`MAX_RULE_LABELS`] names, then `_other`), `result` = allowed/denied |
//! | `weir_bridge_errors_total` | `class` (bad_request, unauthorized, too_large, timeout, io, clusterdown, …) |
//! | `weir_bridge_redis_call_duration_seconds` | `algorithm` (histogram, 50 µs … 1 s) |
//! | `weir_bridge_script_fallbacks_total` | `algorithm`: NOSCRIPT answered by EVAL |
//! | `weir_bridge_items_evaluated_total` | |
//! | `weir_bridge_units_granted_total` | `rule` (as for decisions) |
//! | `weir_bridge_commits_total` | `rule` (as for decisions), `result` = settled/unchanged: costs settled after the response (`/v3/commit`) |

use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::collections::HashSet;
use std::sync::{Mutex, PoisonError};

/// Distinct `rule` label values kept; later rule names are counted as `_other`, so a
/// misbehaving client cannot grow the metrics without bound.
pub const MAX_RULE_LABELS: usize = 256;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CodeLabel {
    code: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DecisionLabels {
    rule: String,
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RuleLabel {
    rule: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClassLabel {
    class: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AlgorithmLabel {
    algorithm: &'static str,
}

fn redis_histogram() -> Histogram {
    // 50 µs × 2^k: 50 µs … ~0.8 s.
    Histogram::new(exponential_buckets(0.000_05, 2.0, 15))
}

pub struct Metrics {
    registry: Registry,
    requests: Family<CodeLabel, Counter>,
    decisions: Family<DecisionLabels, Counter>,
    errors: Family<ClassLabel, Counter>,
    redis_latency: Family<AlgorithmLabel, Histogram, fn() -> Histogram>,
    fallbacks: Family<AlgorithmLabel, Counter>,
    items: Counter,
    granted: Family<RuleLabel, Counter>,
    commits: Family<DecisionLabels, Counter>,
    rules: Mutex<HashSet<String>>,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("weir_bridge");
        let requests = Family::<CodeLabel, Counter>::default();
        registry.register(
            "requests",
            "HTTP requests answered, by status code",
            requests.clone(),
        );
        let decisions = Family::<DecisionLabels, Counter>::default();
        registry.register(
            "decisions",
            "Items decided, by rule and result",
            decisions.clone(),
        );
        let errors = Family::<ClassLabel, Counter>::default();
        registry.register("errors", "Failed requests, by class", errors.clone());
        let redis_latency =
            Family::<AlgorithmLabel, Histogram, fn() -> Histogram>::new_with_constructor(
                redis_histogram,
            );
        registry.register(
            "redis_call_duration_seconds",
            "Time of one script call (EVALSHA, and EVAL on NOSCRIPT)",
            redis_latency.clone(),
        );
        let fallbacks = Family::<AlgorithmLabel, Counter>::default();
        registry.register(
            "script_fallbacks",
            "NOSCRIPT replies answered by sending the script with EVAL",
            fallbacks.clone(),
        );
        let items = Counter::default();
        registry.register("items_evaluated", "Items evaluated by Redis", items.clone());
        let granted = Family::<RuleLabel, Counter>::default();
        registry.register(
            "units_granted",
            "Units granted (consumed in Redis), leases included",
            granted.clone(),
        );
        let commits = Family::<DecisionLabels, Counter>::default();
        registry.register(
            "commits",
            "Costs settled after the response, by rule and whether the key changed",
            commits.clone(),
        );
        Metrics {
            registry,
            requests,
            decisions,
            errors,
            redis_latency,
            fallbacks,
            items,
            granted,
            commits,
            rules: Mutex::new(HashSet::new()),
        }
    }
}

impl Metrics {
    pub fn request(&self, code: u16) {
        self.requests.get_or_create(&CodeLabel { code }).inc();
    }

    pub fn error(&self, class: &'static str) {
        self.errors.get_or_create(&ClassLabel { class }).inc();
    }

    pub fn decision(&self, rule: &str, allowed: bool, granted: u64) {
        let result = if allowed { "allowed" } else { "denied" };
        let rule = self.rule_label(rule);
        self.granted
            .get_or_create(&RuleLabel { rule: rule.clone() })
            .inc_by(granted);
        self.decisions
            .get_or_create(&DecisionLabels { rule, result })
            .inc();
        self.items.inc();
    }

    pub fn commit(&self, rule: &str, changed: bool) {
        let result = if changed { "settled" } else { "unchanged" };
        let rule = self.rule_label(rule);
        self.commits
            .get_or_create(&DecisionLabels { rule, result })
            .inc();
    }

    pub fn observe_redis(&self, algorithm: &'static str, seconds: f64) {
        self.redis_latency
            .get_or_create(&AlgorithmLabel { algorithm })
            .observe(seconds);
    }

    pub fn script_fallback(&self, algorithm: &'static str) {
        self.fallbacks
            .get_or_create(&AlgorithmLabel { algorithm })
            .inc();
    }

    fn rule_label(&self, rule: &str) -> String {
        let mut rules = self.rules.lock().unwrap_or_else(PoisonError::into_inner);
        if rules.contains(rule) {
            return rule.to_string();
        }
        if rules.len() < MAX_RULE_LABELS {
            rules.insert(rule.to_string());
            return rule.to_string();
        }
        "_other".to_string()
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        if encode(&mut out, &self.registry).is_err() {
            tracing::error!("encoding the metrics failed");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rule_labels_are_capped() {
        let m = Metrics::default();
        for i in 0..MAX_RULE_LABELS + 10 {
            m.decision(&format!("r{i}"), true, 2);
        }
        m.decision("r0", false, 0);
        let text = m.render();
        assert!(text.contains(r#"weir_bridge_decisions_total{rule="_other",result="allowed"} 10"#));
        assert!(text.contains(r#"weir_bridge_decisions_total{rule="r0",result="denied"} 1"#));
        assert!(text.contains(r#"weir_bridge_units_granted_total{rule="_other"} 20"#));
        assert!(text.contains(r#"weir_bridge_units_granted_total{rule="r1"} 2"#));
        assert!(text.contains(&format!(
            "weir_bridge_items_evaluated_total {}",
            MAX_RULE_LABELS + 11
        )));
    }
}
