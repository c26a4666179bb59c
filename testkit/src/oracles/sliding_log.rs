//! The sliding log's oracle: its rows, and its bound read from the definition (every
//! window of the log's width, wherever it starts, admits at most the limit). It has no
//! slot state: its runners keep the log (the events' times) beside the pure
//! [`SlidingLog`] and compare the same decisions.

use weir_core::algorithms::sliding_log::SlidingLog;
use weir_core::algorithms::AlgorithmKind;
use weir_core::conformance::{Admission, Violation};

use super::{sum, Oracle};
use crate::scenarios::{allow, deny, Algo, Scenario, S_NS, S_US, T0};

impl Algo {
    /// `limit` units in any window of `window_us`.
    pub const fn sliding_log(limit: u64, window_us: u64) -> Algo {
        Algo::of(AlgorithmKind::SlidingLog, &[limit, window_us])
    }
}

impl Oracle for SlidingLog {
    fn breaks_at(&self, s: &[Admission], j: usize) -> bool {
        let t = u128::from(s[j].at_us);
        let inside: Vec<Admission> = s[..=j]
            .iter()
            .filter(|a| u128::from(a.at_us) + u128::from(self.window_us()) > t)
            .copied()
            .collect();
        sum(&inside) > u128::from(self.limit())
    }

    fn check_violation(&self, s: &[Admission], v: &Violation, _admitted: u128, allowed: u128) {
        let leaves = |a: &Admission| u128::from(a.at_us) + u128::from(self.window_us());
        let to = u128::from(s[v.last].at_us);
        assert!(leaves(&s[v.first]) > to, "one log window: {v}");
        assert!(v.first == 0 || leaves(&s[v.first - 1]) <= to, "{v}");
        assert_eq!(allowed, u128::from(self.limit()), "{v}");
    }

    /// The saved units spent at the end of the next window.
    fn spent_after_lease(
        &self,
        t0: u64,
        _idle_at: u64,
        _scale: u64,
        extra: u64,
        _late: u64,
    ) -> (u64, u64) {
        let width = self.window_us();
        (t0 + width + (width - 1) * extra / 64, t0 + 2 * width - 1)
    }
}

#[rustfmt::skip]
pub static SCENARIOS: &[Scenario] = &[
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
