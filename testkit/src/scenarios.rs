//! The behavioural scenarios' shape: one key, a sequence of requests at explicit
//! instants, and what each must be told. Each algorithm's rows are in its oracle
//! (`crate::oracles::<name>::SCENARIOS`), and every backend runs the same rows: the pure
//! functions and the slot table on the in-memory store (`core/tests/algorithms.rs`), and
//! the Redis Lua scripts on a real cluster (weir-bridge's `tests/conformance.rs`).
//! `oracles::slot_tables` chains the rows of the algorithms whose state fits a slot. The sliding
//! log's are apart: it keeps one event per unit and runs only in Redis, so it has no slot
//! state and no slot table; its runners keep the log (the events' times) beside the pure
//! `SlidingLog` and compare the same decisions.
//!
//! How to run a scenario: start with no state for the key; for each step decide `cost`
//! at `now_us`, compare the outcome with [`expected`], and store the new state if there
//! is one (there is none after a denial or a peek, cost 0).
//!
//! Units: instants (`now_us`) are µs since the Unix epoch; durations in the expected
//! outcome are ns (`retry_after_ns`, `reset_after_ns`); `throttle` is redis-cell's
//! `CL.THROTTLE` reply, in whole seconds.

use weir_core::algorithms::sliding_log::SlidingLog;
use weir_core::algorithms::{AlgorithmKind, Decision, GlobalLimit, Limit};

/// An instant: 2023-11-14T22:13:20Z, on a 10 s boundary (20 s into its minute).
pub const T0: u64 = 1_700_000_000_000_000;
/// One millisecond / second, in µs (for instants).
pub const MS_US: u64 = 1_000;
pub const S_US: u64 = 1_000_000;
/// One millisecond / second, in ns (for durations).
pub const MS_NS: u64 = 1_000_000;
pub const S_NS: u64 = 1_000_000_000;

/// An algorithm and its parameter values, in the order of its parameter table. Each
/// algorithm's oracle adds its constructor, in the order people say its parameters
/// (`Algo::gcra(burst, rate, period_us)`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Algo {
    pub kind: AlgorithmKind,
    pub(crate) values: [u64; 3],
    pub(crate) len: usize,
}

impl Algo {
    /// `kind` with `values` (at most 3), in the order of its parameter table. The tables
    /// call it in statics, where more than 3 values fails the build, not a test.
    #[allow(clippy::indexing_slicing)]
    pub(crate) const fn of(kind: AlgorithmKind, values: &[u64]) -> Algo {
        let mut all = [0; 3];
        let mut at = 0;
        while at < values.len() {
            all[at] = values[at];
            at += 1;
        }
        Algo {
            kind,
            values: all,
            len: values.len(),
        }
    }

    pub fn values(&self) -> &[u64] {
        self.values.get(..self.len).unwrap_or(&self.values)
    }
}

/// The core's limit for a table's algorithm (the tables hold only valid parameters of
/// algorithms with slot state).
pub fn limit_of(algo: Algo) -> Limit {
    match GlobalLimit::build(algo.kind, algo.values()) {
        Ok(GlobalLimit::Slot(limit)) => limit,
        other => unreachable!("{algo:?} is not a valid slot limit: {other:?}"),
    }
}

/// The core's sliding log for the sliding log's rows.
pub fn log_of(algo: Algo) -> SlidingLog {
    match GlobalLimit::build(algo.kind, algo.values()) {
        Ok(GlobalLimit::SlidingLog(log)) => log,
        other => unreachable!("{algo:?} is not a valid sliding log: {other:?}"),
    }
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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scenario {
    pub name: &'static str,
    pub algo: Algo,
    pub steps: &'static [Step],
}

/// One request and the decision it must get.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Step {
    pub now_us: u64,
    pub cost: u64,
    pub allowed: bool,
    pub limit: u64,
    pub remaining: u64,
    pub retry_after_ns: Option<u64>,
    pub reset_after_ns: u64,
    /// GCRA only: the `CL.THROTTLE` reply for the same request.
    pub throttle: Option<Throttle>,
}

/// `CL.THROTTLE`'s five integers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Throttle {
    pub limited: bool,
    pub limit: i64,
    pub remaining: i64,
    pub retry_after: i64,
    pub reset_after: i64,
}

pub(crate) const fn allow(
    now_us: u64,
    cost: u64,
    limit: u64,
    remaining: u64,
    reset_after_ns: u64,
) -> Step {
    Step {
        now_us,
        cost,
        allowed: true,
        limit,
        remaining,
        retry_after_ns: None,
        reset_after_ns,
        throttle: None,
    }
}

pub(crate) const fn deny(
    now_us: u64,
    cost: u64,
    limit: u64,
    remaining: u64,
    retry_after_ns: Option<u64>,
    reset_after_ns: u64,
) -> Step {
    Step {
        now_us,
        cost,
        allowed: false,
        limit,
        remaining,
        retry_after_ns,
        reset_after_ns,
        throttle: None,
    }
}

impl Step {
    /// Adds the expected `CL.THROTTLE` reply, in its order:
    /// `[limited, limit, remaining, retry_after, reset_after]`.
    pub(crate) const fn cl(self, reply: [i64; 5]) -> Step {
        let [limited, limit, remaining, retry_after, reset_after] = reply;
        Step {
            throttle: Some(Throttle {
                limited: limited != 0,
                limit,
                remaining,
                retry_after,
                reset_after,
            }),
            ..self
        }
    }
}
