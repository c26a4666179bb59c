//! GCRA's oracle: redis-cell's `CL.THROTTLE` rows, and its bound read from the
//! definition (a stretch of admissions may take τ plus one T per unit of its span).

use weir_core::algorithms::gcra::Gcra;
use weir_core::algorithms::{AlgorithmKind, SlotState};
use weir_core::conformance::{Admission, Violation};

use super::{sum, Oracle};
use crate::scenarios::{allow, deny, Algo, Scenario, MS_NS, MS_US, S_NS, S_US, T0};

impl Algo {
    /// GCRA in the order people say it: `burst` beyond the first, `rate` per `period_us`.
    pub const fn gcra(burst: u64, rate: u64, period_us: u64) -> Algo {
        Algo::of(AlgorithmKind::Gcra, &[rate, period_us, burst])
    }
}

impl Oracle for Gcra {
    /// `S × T − τ − span`, in ns: positive when the stretch took more than τ and its span
    /// allow.
    fn stretch_excess(&self, s: &[Admission], i: usize, j: usize) -> Option<i128> {
        let admitted = sum(s.get(i..=j)?) as i128;
        let span_us = s.get(j)?.at_us - s.get(i)?.at_us;
        let t = i128::from(self.emission_interval_ns());
        Some(admitted * t - i128::from(self.tolerance_ns()) - i128::from(span_us) * 1_000)
    }

    fn check_violation(&self, s: &[Admission], v: &Violation, admitted: u128, allowed: u128) {
        let t = u128::from(self.emission_interval_ns());
        let span_ns = u128::from(s[v.last].at_us - s[v.first].at_us) * 1_000;
        let tau = u128::from(self.tolerance_ns());
        assert_eq!(allowed, (tau + span_ns) / t, "{v}");
        assert!(admitted * t > tau + span_ns, "{v}");
    }

    /// The saved units within τ of the fresh ones.
    fn spent_after_lease(
        &self,
        _t0: u64,
        idle_at: u64,
        scale: u64,
        extra: u64,
        late: u64,
    ) -> (u64, u64) {
        let fresh_at = idle_at + scale * extra / 64;
        let room = self.tolerance_ns().div_ceil(1_000) - 1;
        (fresh_at, fresh_at + room * late / 64)
    }
}

/// The script stores the TAT as `µs ns-remainder`, and the emission interval it was
/// counted in after them when the rule's rate comes with each request.
pub fn redis_slot_state(words: &[u64]) -> Option<SlotState> {
    match *words {
        [us, rem] if rem < 1_000 => Some(SlotState {
            a: us * 1_000 + rem,
            b: 0,
        }),
        [us, rem, t] if rem < 1_000 => Some(SlotState {
            a: us * 1_000 + rem,
            b: t,
        }),
        _ => None,
    }
}

#[rustfmt::skip]
pub static SCENARIOS: &[Scenario] = &[
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
