//! The token bucket's oracle: its rows, and its bound read from the definition (a
//! stretch may take the capacity plus one refill per refill instant inside it).

use weir_core::algorithms::token_bucket::TokenBucket;
use weir_core::algorithms::{AlgorithmKind, SlotState};
use weir_core::conformance::{Admission, Violation};

use super::{Oracle, sum, two_words};
use crate::scenarios::{allow, deny, Algo, Scenario, MS_NS, MS_US, S_NS, S_US, T0};

impl Algo {
    /// A bucket of `capacity` tokens, `refill` more every `period_us`.
    pub const fn token_bucket(capacity: u64, refill: u64, period_us: u64) -> Algo {
        Algo::of(AlgorithmKind::TokenBucket, &[capacity, refill, period_us])
    }
}

impl Oracle for TokenBucket {
    /// `S − C − R × ⌈span / P⌉`, in units.
    fn stretch_excess(&self, s: &[Admission], i: usize, j: usize) -> Option<i128> {
        let admitted = sum(s.get(i..=j)?) as i128;
        let span_us = s.get(j)?.at_us - s.get(i)?.at_us;
        let instants = span_us.div_ceil(self.period_us());
        Some(
            admitted
                - i128::from(self.capacity())
                - i128::from(self.refill()) * i128::from(instants),
        )
    }

    fn check_violation(&self, s: &[Admission], v: &Violation, _admitted: u128, allowed: u128) {
        let span_us = s[v.last].at_us - s[v.first].at_us;
        let instants = u128::from(span_us.div_ceil(self.period_us()));
        let bound = u128::from(self.capacity()) + u128::from(self.refill()) * instants;
        assert_eq!(allowed, bound, "{v}");
    }

    /// Fewer refill instants between them than it takes the refills to make up the
    /// capacity.
    fn spent_after_lease(
        &self,
        _t0: u64,
        idle_at: u64,
        scale: u64,
        extra: u64,
        late: u64,
    ) -> (u64, u64) {
        let fresh_at = idle_at + scale * extra / 64;
        let room = self.period_us() * ((self.capacity() - 1) / self.refill());
        (fresh_at, fresh_at + room * late / 64)
    }
}

/// The script stores `tokens last_refill_us`, the slot's words.
pub fn redis_slot_state(words: &[u64]) -> Option<SlotState> {
    two_words(words)
}

#[rustfmt::skip]
pub static SCENARIOS: &[Scenario] = &[
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
