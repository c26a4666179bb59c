//! The fixed window's oracle: its rows, and its bound read from the definition (each
//! window aligned to the epoch admits at most the limit).

use weir_core::algorithms::fixed_window::FixedWindow;
use weir_core::algorithms::{AlgorithmKind, SlotState};
use weir_core::conformance::{Admission, Violation};

use super::{Oracle, in_a_later_window, sum, two_words};
use crate::scenarios::{allow, deny, Algo, Scenario, S_NS, S_US, T0};

impl Algo {
    /// `limit` units per window of `window_us`, aligned to the epoch.
    pub const fn fixed_window(limit: u64, window_us: u64) -> Algo {
        Algo::of(AlgorithmKind::FixedWindow, &[limit, window_us])
    }
}

impl Oracle for FixedWindow {
    fn breaks_at(&self, s: &[Admission], j: usize) -> bool {
        let window = s[j].at_us / self.window_us();
        let inside: Vec<Admission> = s[..=j]
            .iter()
            .filter(|a| a.at_us / self.window_us() == window)
            .copied()
            .collect();
        sum(&inside) > u128::from(self.limit())
    }

    fn check_violation(&self, s: &[Admission], v: &Violation, _admitted: u128, allowed: u128) {
        let width = self.window_us();
        let window = s[v.last].at_us / width;
        assert_eq!(s[v.first].at_us / width, window, "one window: {v}");
        assert!(v.first == 0 || s[v.first - 1].at_us / width < window, "{v}");
        assert_eq!(allowed, u128::from(self.limit()), "{v}");
    }

    /// A window's units spent in the next.
    fn spent_after_lease(&self, t0: u64, _: u64, _: u64, extra: u64, late: u64) -> (u64, u64) {
        in_a_later_window(t0, self.window_us(), 1, extra, late)
    }
}

/// The script stores `count window_start_us`, the slot's words.
pub fn redis_slot_state(words: &[u64]) -> Option<SlotState> {
    two_words(words)
}

#[rustfmt::skip]
pub static SCENARIOS: &[Scenario] = &[
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
