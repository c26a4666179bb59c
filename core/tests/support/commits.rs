//! What the commit suites share: a rule whose cost is estimated from `x-estimate` and
//! committed from the response's `x-tokens`, and its limit.
#![allow(dead_code, clippy::unwrap_used)]

use super::engine;
use weir_core::algorithms::{GlobalLimit, Limit};
use weir_core::engine::Engine;
use weir_core::rules::RuleId;
use weir_core::simulation::configured_limit;

pub fn committed_rule(limit: &str, max_estimate: u64) -> Engine {
    engine(&format!(
        r#"{{"rules":[{{"name":"llm","key":[{{"header":"x-user"}}],
            "limit":{limit},
            "cost":{{"header":"x-estimate","max":{max_estimate}}},
            "commit":{{"header":"x-tokens"}}}}]}}"#
    ))
}

pub fn limit_of(e: &Engine) -> GlobalLimit {
    configured_limit(e, RuleId(0)).unwrap()
}

pub fn local(e: &Engine) -> Limit {
    match limit_of(e) {
        GlobalLimit::Slot(l) => l,
        GlobalLimit::SlidingLog(_) => unreachable!(),
    }
}
