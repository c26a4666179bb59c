//! The behavioural scenario tables: one key, a sequence of requests at explicit instants,
//! and what each must be told. Every backend runs the same rows: the pure functions and
//! the slot table on the in-memory store (`core/tests/algorithms.rs`), and the Redis Lua
//! scripts on a real cluster (weir-bridge's `tests/conformance.rs`). There is one table
//! per algorithm; [`slot_tables`] chains those of the algorithms whose state fits a slot.
//! [`SLIDING_LOG`] is apart: a sliding log keeps one event per unit and runs only in
//! Redis, so it has no slot state and no slot table; its runners keep the log (the
//! events' times) beside the pure [`SlidingLog`] and compare the same decisions.
//!
//! Compiled only with the `scenarios` feature, which the test suites turn on.
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

/// An algorithm and its parameter values, in the order of its parameter table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Algo {
    pub kind: AlgorithmKind,
    values: [u64; 3],
    len: usize,
}

impl Algo {
    pub const fn gcra(burst: u64, rate: u64, period_us: u64) -> Algo {
        Algo {
            kind: AlgorithmKind::Gcra,
            values: [rate, period_us, burst],
            len: 3,
        }
    }

    pub const fn token_bucket(capacity: u64, refill: u64, period_us: u64) -> Algo {
        Algo {
            kind: AlgorithmKind::TokenBucket,
            values: [capacity, refill, period_us],
            len: 3,
        }
    }

    pub const fn fixed_window(limit: u64, window_us: u64) -> Algo {
        Algo {
            kind: AlgorithmKind::FixedWindow,
            values: [limit, window_us, 0],
            len: 2,
        }
    }

    pub const fn sliding_window(limit: u64, window_us: u64) -> Algo {
        Algo {
            kind: AlgorithmKind::SlidingWindow,
            values: [limit, window_us, 0],
            len: 2,
        }
    }

    pub const fn sliding_log(limit: u64, window_us: u64) -> Algo {
        Algo {
            kind: AlgorithmKind::SlidingLog,
            values: [limit, window_us, 0],
            len: 2,
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

/// The core's sliding log for [`SLIDING_LOG`]'s rows.
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

const fn allow(now_us: u64, cost: u64, limit: u64, remaining: u64, reset_after_ns: u64) -> Step {
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

const fn deny(
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
    const fn cl(self, reply: [i64; 5]) -> Step {
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

/// The tables of the algorithms with slot state (every algorithm but the sliding log).
pub fn slot_tables() -> impl Iterator<Item = &'static Scenario> {
    GCRA.iter()
        .chain(TOKEN_BUCKET)
        .chain(FIXED_WINDOW)
        .chain(SLIDING_WINDOW)
}

#[rustfmt::skip]
pub static GCRA: &[Scenario] = &[
    Scenario {
        // redis-cell's own `it_rate_limits` table (redis-cell-impl/src/lib.rs), rows 0–14.
        name: "gcra: redis-cell it_rate_limits, burst 4, 1 per second",
        algo: Algo::gcra(4, 1, S_US),
        steps: &[
            // You can never make a request larger than the maximum.
            deny(T0, 6, 5, 5, None, 0).cl([1, 5, 5, -1, 0]),
            // Rate limit normal requests appropriately.
            allow(T0, 1, 5, 4, S_NS).cl([0, 5, 4, -1, 1]),
            allow(T0, 1, 5, 3, 2 * S_NS).cl([0, 5, 3, -1, 2]),
            allow(T0, 1, 5, 2, 3 * S_NS).cl([0, 5, 2, -1, 3]),
            allow(T0, 1, 5, 1, 4 * S_NS).cl([0, 5, 1, -1, 4]),
            allow(T0, 1, 5, 0, 5 * S_NS).cl([0, 5, 0, -1, 5]),
            deny(T0, 1, 5, 0, Some(S_NS), 5 * S_NS).cl([1, 5, 0, 1, 5]),
            allow(T0 + 3_000 * MS_US, 1, 5, 2, 3_000 * MS_NS).cl([0, 5, 2, -1, 3]),
            // 3.9 s rounds up to 4 in the reply.
            allow(T0 + 3_100 * MS_US, 1, 5, 1, 3_900 * MS_NS).cl([0, 5, 1, -1, 4]),
            allow(T0 + 4_000 * MS_US, 1, 5, 1, 4_000 * MS_NS).cl([0, 5, 1, -1, 4]),
            allow(T0 + 8_000 * MS_US, 1, 5, 4, 1_000 * MS_NS).cl([0, 5, 4, -1, 1]),
            allow(T0 + 9_500 * MS_US, 1, 5, 4, 1_000 * MS_NS).cl([0, 5, 4, -1, 1]),
            // Zero-volume request just peeks at the state.
            allow(T0 + 9_500 * MS_US, 0, 5, 4, S_NS).cl([0, 5, 4, -1, 1]),
            // High-volume request uses up more of the limit.
            allow(T0 + 9_500 * MS_US, 2, 5, 2, 3 * S_NS).cl([0, 5, 2, -1, 3]),
            // Large requests cannot exceed limits.
            deny(T0 + 9_500 * MS_US, 5, 5, 2, Some(3 * S_NS), 3 * S_NS).cl([1, 5, 2, 3, 3]),
        ],
    },
    Scenario {
        // T = 333_333_333 ns, τ = 999_999_999 ns. A TAT truncated to µs would drift here.
        name: "gcra: 3 per second (T not a whole µs), burst 2",
        algo: Algo::gcra(2, 3, S_US),
        steps: &[
            allow(T0, 1, 3, 2, 333_333_333).cl([0, 3, 2, -1, 1]),
            allow(T0, 1, 3, 1, 666_666_666).cl([0, 3, 1, -1, 1]),
            allow(T0, 1, 3, 0, 999_999_999).cl([0, 3, 0, -1, 1]),
            deny(T0, 1, 3, 0, Some(333_333_333), 999_999_999).cl([1, 3, 0, 1, 1]),
            // 333 ns early. redis-cell's µs-truncated `remaining` says 1 while limited,
            // and the 333 ns retry rounds to 0 s.
            deny(T0 + 333_333, 1, 3, 1, Some(333), 666_666_999).cl([1, 3, 1, 0, 1]),
            // ceil_us(retry_after): allowed.
            allow(T0 + 333_334, 1, 3, 0, 999_999_332).cl([0, 3, 0, -1, 1]),
            // Idle again: the schedule restarts from now.
            allow(T0 + 2 * S_US, 1, 3, 2, 333_333_333).cl([0, 3, 2, -1, 1]),
            // An oversized quantity on an idle key (TAT 1.67 s in the past): redis-cell
            // replies reset_after = TAT − now, negative (−1.67 s → −1), and a remaining
            // above the limit; the Decision clamps both.
            deny(T0 + 4 * S_US, 4, 3, 3, None, 0).cl([1, 3, 8, -1, -1]),
        ],
    },
    Scenario {
        // T = 60 s / 7 = 8_571_428_571 ns, τ = 10 T = 85_714_285_710 ns.
        name: "gcra: 7 per minute (T not a whole µs), burst 9",
        algo: Algo::gcra(9, 7, 60 * S_US),
        steps: &[
            allow(T0, 1, 10, 9, 8_571_428_571).cl([0, 10, 9, -1, 9]),
            deny(T0, 10, 10, 9, Some(8_571_428_571), 8_571_428_571).cl([1, 10, 9, 9, 9]),
            // At ceil_us(retry_after) the whole limit fits.
            allow(T0 + 8_571_429, 10, 10, 0, 85_714_285_710).cl([0, 10, 0, -1, 86]),
            allow(T0 + 8_571_429, 0, 10, 0, 85_714_285_710).cl([0, 10, 0, -1, 86]),
            allow(T0 + 68_571_429, 1, 10, 6, 34_285_714_281).cl([0, 10, 6, -1, 35]),
        ],
    },
    Scenario {
        name: "gcra: reply rounding of sub-second durations, burst 0",
        algo: Algo::gcra(0, 1, S_US),
        steps: &[
            allow(T0, 1, 1, 0, S_NS).cl([0, 1, 0, -1, 1]),
            // 0.0005 s: below a millisecond, both round to 0 although limited.
            deny(T0 + 999_500, 1, 1, 0, Some(500_000), 500_000).cl([1, 1, 0, 0, 0]),
            allow(T0 + S_US, 1, 1, 0, S_NS).cl([0, 1, 0, -1, 1]),
        ],
    },
    Scenario {
        name: "gcra: reply rounding around whole seconds, burst 1",
        algo: Algo::gcra(1, 1, S_US),
        steps: &[
            allow(T0, 2, 2, 0, 2 * S_NS).cl([0, 2, 0, -1, 2]),
            // retry 0.002 s → 1, reset 1.002 s → 2.
            deny(T0 + 998 * MS_US, 1, 2, 0, Some(2 * MS_NS), 1_002 * MS_NS).cl([1, 2, 0, 1, 2]),
            // retry 0.0004 s → 0, reset 1.0004 s → 1.
            deny(T0 + 999_600, 1, 2, 0, Some(400_000), 1_000_400_000).cl([1, 2, 0, 0, 1]),
            allow(T0 + 999_600, 0, 2, 0, 1_000_400_000).cl([0, 2, 0, -1, 1]),
        ],
    },
    Scenario {
        name: "gcra: oversized quantity on a key idle for 2.5 s, burst 4",
        algo: Algo::gcra(4, 1, S_US),
        steps: &[
            allow(T0, 1, 5, 4, S_NS).cl([0, 5, 4, -1, 1]),
            // TAT − now = −2.5 s → −2; remaining (5 s + 2.5 s) / 1 s = 7 in the reply.
            deny(T0 + 3_500 * MS_US, 6, 5, 5, None, 0).cl([1, 5, 7, -1, -2]),
            allow(T0 + 3_500 * MS_US, 5, 5, 0, 5 * S_NS).cl([0, 5, 0, -1, 5]),
        ],
    },
    Scenario {
        name: "gcra: peeks (quantity 0) never change the state",
        algo: Algo::gcra(4, 1, S_US),
        steps: &[
            allow(T0, 0, 5, 5, 0).cl([0, 5, 5, -1, 0]),
            allow(T0, 0, 5, 5, 0).cl([0, 5, 5, -1, 0]),
            allow(T0, 5, 5, 0, 5 * S_NS).cl([0, 5, 0, -1, 5]),
            allow(T0, 0, 5, 0, 5 * S_NS).cl([0, 5, 0, -1, 5]),
            allow(T0 + 2_500 * MS_US, 0, 5, 2, 2_500 * MS_NS).cl([0, 5, 2, -1, 3]),
            deny(T0 + 2_500 * MS_US, 3, 5, 2, Some(500 * MS_NS), 2_500 * MS_NS).cl([1, 5, 2, 1, 3]),
        ],
    },
    Scenario {
        // period 22_260_000_000_001 µs (≈ 258 days) / 7: the exact quotient is
        // 3_180_000_000_000_142.86 ns. redis-cell divides in doubles and gets …143; so do we.
        name: "gcra: T rounds as redis-cell's double division for periods beyond 2^53 ns",
        algo: Algo::gcra(0, 7, 22_260_000_000_001),
        steps: &[
            allow(T0, 1, 1, 0, 3_180_000_000_000_143).cl([0, 1, 0, -1, 3_180_000]),
            deny(T0, 1, 1, 0, Some(3_180_000_000_000_143), 3_180_000_000_000_143)
                .cl([1, 1, 0, 3_180_000, 3_180_000]),
        ],
    },
];

#[rustfmt::skip]
pub static TOKEN_BUCKET: &[Scenario] = &[
    Scenario {
        name: "token_bucket: 5 tokens, 2 more every second",
        algo: Algo::token_bucket(5, 2, S_US),
        steps: &[
            // A new key starts full; refills happen at T0 + k s from now on.
            allow(T0, 1, 5, 4, S_NS),
            allow(T0, 4, 5, 0, 3 * S_NS),
            deny(T0 + 500 * MS_US, 1, 5, 0, Some(500 * MS_NS), 2_500 * MS_NS),
            // One refill: 2 tokens.
            allow(T0 + S_US, 1, 5, 1, 2 * S_NS),
            // More than the capacity: never.
            deny(T0 + S_US, 6, 5, 1, None, 2 * S_NS),
            // 3 tokens need one more refill, at T0 + 2 s.
            deny(T0 + 1_500 * MS_US, 3, 5, 1, Some(500 * MS_NS), 1_500 * MS_NS),
            allow(T0 + 2 * S_US, 3, 5, 0, 3 * S_NS),
            // 8 refills owed, capped at the capacity. A peek stores nothing…
            allow(T0 + 10 * S_US, 0, 5, 5, 0),
            // …and the same refills are applied again here; the phase is still T0's.
            allow(T0 + 10_250 * MS_US, 5, 5, 0, 2_750 * MS_NS),
            // The clock went back 1.25 s: no time elapsed, next refill still at T0 + 11 s.
            deny(T0 + 9 * S_US, 1, 5, 0, Some(2 * S_NS), 4 * S_NS),
        ],
    },
    Scenario {
        name: "token_bucket: a refill larger than the capacity fills the bucket",
        algo: Algo::token_bucket(2, 10, 100 * MS_US),
        steps: &[
            allow(T0, 2, 2, 0, 100 * MS_NS),
            allow(T0 + 100 * MS_US, 2, 2, 0, 100 * MS_NS),
            deny(T0 + 150 * MS_US, 1, 2, 0, Some(50 * MS_NS), 50 * MS_NS),
            deny(T0 + 150 * MS_US, 3, 2, 0, None, 50 * MS_NS),
        ],
    },
];

#[rustfmt::skip]
pub static FIXED_WINDOW: &[Scenario] = &[
    Scenario {
        // T0 is on a 10 s boundary.
        name: "fixed_window: 3 per 10 s",
        algo: Algo::fixed_window(3, 10 * S_US),
        steps: &[
            allow(T0 + 2 * S_US, 1, 3, 2, 8 * S_NS),
            allow(T0 + 3 * S_US, 2, 3, 0, 7 * S_NS),
            deny(T0 + 4 * S_US, 1, 3, 0, Some(6 * S_NS), 6 * S_NS),
            deny(T0 + 4 * S_US, 4, 3, 0, None, 6 * S_NS),
            allow(T0 + 4 * S_US, 0, 3, 0, 6 * S_NS),
            // The next window starts from 0: 6 allowed within 7 s (the boundary spike).
            allow(T0 + 10 * S_US, 3, 3, 0, 10 * S_NS),
            deny(T0 + 19_999_999, 1, 3, 0, Some(1_000), 1_000),
            allow(T0 + 20 * S_US, 1, 3, 2, 10 * S_NS),
            // The clock went back into the previous window, behind the key's: nothing
            // is admitted until the key's window (T0 + 20 s) starts.
            deny(T0 + 15 * S_US, 1, 3, 0, Some(5 * S_NS), 15 * S_NS),
            allow(T0 + 15 * S_US, 0, 3, 0, 15 * S_NS),
            // A count from an older window counts as 0.
            allow(T0 + 45 * S_US, 2, 3, 1, 5 * S_NS),
        ],
    },
    Scenario {
        // T0 is 20 s into its minute: windows are aligned to the epoch, not the first request.
        name: "fixed_window: 100 per minute",
        algo: Algo::fixed_window(100, 60 * S_US),
        steps: &[
            allow(T0, 100, 100, 0, 40 * S_NS),
            deny(T0 + 39 * S_US, 1, 100, 0, Some(S_NS), S_NS),
            allow(T0 + 40 * S_US, 1, 100, 99, 60 * S_NS),
        ],
    },
];

#[rustfmt::skip]
pub static SLIDING_WINDOW: &[Scenario] = &[
    Scenario {
        // T0 is on a 10 s boundary. Estimate = prev × (10 s − e) / 10 s + curr.
        name: "sliding_window: 10 per 10 s",
        algo: Algo::sliding_window(10, 10 * S_US),
        steps: &[
            allow(T0 + 5 * S_US, 4, 10, 6, 15 * S_NS),
            allow(T0 + 9 * S_US, 6, 10, 0, 11 * S_NS),
            // This window is full: in the next one, 10 × (10 − e)/10 + 1 ≤ 10 from e = 1 s.
            deny(T0 + 9 * S_US, 1, 10, 0, Some(2 * S_NS), 11 * S_NS),
            allow(T0 + 11 * S_US, 1, 10, 0, 19 * S_NS),
            // 10 × 8/10 + 1 + 2 = 11 > 10; 10 × (10 − e)/10 + 3 ≤ 10 from e = 3 s.
            deny(T0 + 12 * S_US, 2, 10, 1, Some(S_NS), 18 * S_NS),
            allow(T0 + 13 * S_US, 2, 10, 0, 17 * S_NS),
            allow(T0 + 13 * S_US, 0, 10, 0, 17 * S_NS),
            deny(T0 + 13 * S_US, 11, 10, 0, None, 17 * S_NS),
            // prev 3 at e = 5 s weighs 1.5: all 10 fit only when it has faded, at T0 + 30 s.
            deny(T0 + 25 * S_US, 10, 10, 8, Some(5 * S_NS), 5 * S_NS),
            allow(T0 + 25 * S_US, 8, 10, 0, 15 * S_NS),
            // Two windows later both counts are forgotten.
            allow(T0 + 50 * S_US, 10, 10, 0, 20 * S_NS),
            // The clock went back 5 s, behind the window the key counts in: nothing is
            // admitted until that window starts (the units of the window the request
            // happens in are not held any more).
            deny(T0 + 45 * S_US, 1, 10, 0, Some(5 * S_NS), 25 * S_NS),
            allow(T0 + 45 * S_US, 0, 10, 0, 25 * S_NS),
        ],
    },
];

#[rustfmt::skip]
pub static SLIDING_LOG: &[Scenario] = &[
    Scenario {
        // Exact asks (no hold): each granted unit is an event at `now`, and leaves the log
        // one window later. An allowed request's reset is one window; a denial's and a
        // peek's is when the newest event leaves.
        name: "sliding_log: 3 per 10 s",
        algo: Algo::sliding_log(3, 10 * S_US),
        steps: &[
            allow(T0, 1, 3, 2, 10 * S_NS),
            allow(T0 + 2 * S_US, 1, 3, 1, 10 * S_NS),
            // Two units fit when the oldest event (T0) has left: at T0 + 10 s.
            deny(T0 + 4 * S_US, 2, 3, 1, Some(6 * S_NS), 8 * S_NS),
            allow(T0 + 4 * S_US, 1, 3, 0, 10 * S_NS),
            deny(T0 + 5 * S_US, 1, 3, 0, Some(5 * S_NS), 9 * S_NS),
            // A peek (cost 0) is allowed and logs nothing.
            allow(T0 + 5 * S_US, 0, 3, 0, 9 * S_NS),
            // One µs before T0's event leaves, and a denial adds nothing to the log.
            deny(T0 + 10 * S_US - 1, 1, 3, 0, Some(1_000), 4 * S_NS + 1_000),
            allow(T0 + 10 * S_US, 1, 3, 0, 10 * S_NS),
            // More than the limit never fits.
            deny(T0 + 10 * S_US, 4, 3, 0, None, 10 * S_NS),
            allow(T0 + 12 * S_US, 1, 3, 0, 10 * S_NS),
            // Every event has left: the whole limit at once.
            allow(T0 + 30 * S_US, 3, 3, 0, 10 * S_NS),
            // The clock went back 5 s: the events logged at T0 + 30 s still count, and
            // leave at T0 + 40 s.
            deny(T0 + 25 * S_US, 1, 3, 0, Some(15 * S_NS), 15 * S_NS),
        ],
    },
];
