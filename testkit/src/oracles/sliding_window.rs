//! The sliding-window counter's oracle: its rows, and its bound read from the
//! definition (the previous window's count weighed by the part of it still covered, plus
//! the current window's, at most the limit at every admission).

use weir_core::algorithms::sliding_window::SlidingWindow;
use weir_core::algorithms::{AlgorithmKind, SlotState};
use weir_core::conformance::{Admission, Violation};

use super::{in_a_later_window, sum, Oracle};
use crate::scenarios::{allow, deny, Algo, Scenario, S_NS, S_US, T0};

impl Algo {
    /// `limit` units per sliding window of `window_us`.
    pub const fn sliding_window(limit: u64, window_us: u64) -> Algo {
        Algo::of(AlgorithmKind::SlidingWindow, &[limit, window_us])
    }
}

impl Oracle for SlidingWindow {
    fn breaks_at(&self, s: &[Admission], j: usize) -> bool {
        let width = self.window_us();
        let t = s[j].at_us;
        let k = t / width;
        let in_window = |a: &&Admission, n: u64| a.at_us / width == n;
        let prev: Vec<Admission> = s
            .iter()
            .filter(|a| k > 0 && in_window(a, k - 1))
            .copied()
            .collect();
        let cur: Vec<Admission> = s[..=j]
            .iter()
            .filter(|a| in_window(a, k))
            .copied()
            .collect();
        let e = u128::from(t % width);
        sum(&prev) * (u128::from(width) - e) + sum(&cur) * u128::from(width)
            > u128::from(self.limit()) * u128::from(width)
    }

    fn check_violation(&self, s: &[Admission], v: &Violation, admitted: u128, allowed: u128) {
        let (first, last) = (v.first, v.last);
        let width = self.window_us();
        // Window numbers in u128: with 1 µs windows, u64::MAX + 1 is a window too.
        let window = |a: &Admission| u128::from(a.at_us / width);
        let k = window(&s[last]);
        // All of window k − 1 (if it has admissions), then window k up to `last`.
        assert!(s[first..=last].iter().all(|a| window(a) + 1 >= k), "{v}");
        assert!(
            first == 0 || window(&s[first - 1]) < window(&s[first]),
            "{v}"
        );
        assert!(window(&s[first]) + 1 == k || first == 0 || window(&s[first - 1]) + 2 <= k);
        let prev = sum(&s[first..=last]
            .iter()
            .filter(|a| window(a) + 1 == k)
            .copied()
            .collect::<Vec<_>>());
        let cur = admitted - prev;
        let (w128, e) = (u128::from(width), u128::from(s[last].at_us % width));
        assert!(
            prev * (w128 - e) + cur * w128 > u128::from(self.limit()) * w128,
            "{v}"
        );
        assert_eq!(allowed, u128::from(self.limit()) + prev * e / w128, "{v}");
    }

    /// A window's units spent two windows on (one on, the previous window still weighs).
    fn spent_after_lease(&self, t0: u64, _: u64, _: u64, extra: u64, late: u64) -> (u64, u64) {
        in_a_later_window(t0, self.window_us(), 2, extra, late)
    }
}

/// The script stores `prev curr window_start_us`; the slot packs both counts in word a.
pub fn redis_slot_state(words: &[u64]) -> Option<SlotState> {
    match *words {
        [prev, curr, start] => Some(SlotState {
            a: (prev << 32) | curr,
            b: start,
        }),
        _ => None,
    }
}

#[rustfmt::skip]
pub static SCENARIOS: &[Scenario] = &[
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
