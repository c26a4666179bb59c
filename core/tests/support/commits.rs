//! What the commit suites share: a rule whose cost is estimated from `x-estimate` and
//! committed from the response's `x-tokens`, and its limit.
#![allow(dead_code)]

use super::{engine, FakeRequest, Rng};
use weir_core::algorithms::{GlobalLimit, Limit};
use weir_core::engine::Engine;
use weir_core::rules::{Fact, FactSource, RuleId};
use weir_core::usage::RequestBody;
use weir_testkit::simulation::configured_limit;

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

/// A request with a body, as the filter's facts read it.
pub struct WithBody<'a>(pub FakeRequest, pub RequestBody<'a>);

impl FactSource for WithBody<'_> {
    fn fetch(&mut self, fact: &Fact) -> Option<Vec<u8>> {
        match fact {
            Fact::RequestBodyEstimate(estimate) => estimate
                .estimate(self.1)
                .map(|n| n.to_string().into_bytes()),
            Fact::RequestBodyPrompt(clamp) => {
                clamp.prompt(self.1).map(|n| n.to_string().into_bytes())
            }
            _ => self.0.fetch(fact),
        }
    }
}

/// A number from `1..=max` drawn evenly on a log scale (then anything in between).
pub fn log_uniform(rng: &mut Rng, max: u64) -> u64 {
    let bits = 64 - max.leading_zeros() as u64;
    let top = 1u64 << rng.below(bits);
    (top + rng.below(top)).clamp(1, max)
}

/// A random limit that can settle costs, over the range the config accepts: a token
/// bucket or a fixed window of up to a million, periods and windows from 1 µs to 10
/// minutes, refills below and above the capacity.
pub struct SettlingLimit {
    pub json: String,
    pub bucket: bool,
    pub size: u64,
    /// The period or window, µs.
    pub scale: u64,
    pub refill: u64,
}

pub fn settling_limit(rng: &mut Rng) -> SettlingLimit {
    let bucket = rng.below(2) == 0;
    let size = log_uniform(rng, 1_000_000);
    let scale = log_uniform(rng, 600_000_000);
    let refill = log_uniform(rng, size.saturating_mul(2));
    let json = if bucket {
        format!(
            r#"{{"algorithm":"token_bucket","capacity":{size},"refill":{refill},"period":"{scale}us"}}"#
        )
    } else {
        format!(r#"{{"algorithm":"fixed_window","limit":{size},"window":"{scale}us"}}"#)
    };
    SettlingLimit {
        json,
        bucket,
        size,
        scale,
        refill,
    }
}
