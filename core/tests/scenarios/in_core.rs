//! The scenario tables in the core's types: every suite that runs the tables against the
//! core (`core/tests/algorithms.rs`, weir-bridge's conformance tests) includes this beside
//! `mod.rs` (`#[path = "…/core/tests/scenarios/in_core.rs"] mod scenarios_in_core;`), which
//! stays plain data.

use crate::scenarios::{Algo, Step};
use weir_core::algorithms::fixed_window::FixedWindow;
use weir_core::algorithms::gcra::Gcra;
use weir_core::algorithms::sliding_window::SlidingWindow;
use weir_core::algorithms::token_bucket::TokenBucket;
use weir_core::algorithms::{Decision, Limit};

/// The core's limit for a table's algorithm (the tables hold only valid parameters).
pub fn limit_of(algo: Algo) -> Limit {
    let limit = match algo {
        Algo::Gcra {
            burst,
            rate,
            period_us,
        } => Gcra::new(burst, rate, period_us).map(Limit::Gcra),
        Algo::TokenBucket {
            capacity,
            refill,
            period_us,
        } => TokenBucket::new(capacity, refill, period_us).map(Limit::TokenBucket),
        Algo::FixedWindow { limit, window_us } => {
            FixedWindow::new(limit, window_us).map(Limit::FixedWindow)
        }
        Algo::SlidingWindow { limit, window_us } => {
            SlidingWindow::new(limit, window_us).map(Limit::SlidingWindow)
        }
    };
    limit.unwrap_or_else(|e| panic!("{algo:?}: {e}"))
}

/// The decision a step must get.
pub fn expected(step: &Step) -> Decision {
    Decision {
        allowed: step.allowed,
        limit: step.limit,
        remaining: step.remaining,
        retry_after_ns: step.retry_after_ns,
        reset_after_ns: step.reset_after_ns,
    }
}
