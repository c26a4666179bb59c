//! Sliding window (counter): a fixed window whose boundary is smoothed by weighing in
//! the previous window's count.
//!
//! Vocabulary:
//!
//! - **window** `W`: an interval aligned to the Unix epoch, as in the fixed window. The
//!   key counts units in the **current** window and remembers the **previous** one's.
//! - **elapsed** `e`: how far now is into the current window.
//! - **estimate** `= previous × (W − e) / W + current`: the units taken over the last
//!   `W`, assuming the previous window's were spread evenly. A request is allowed if the
//!   estimate, with it, stays within the limit.
//!
//! All comparisons are done on `estimate × W` in u128 integers, so there is no rounding:
//! `previous × (W − e) + (current + cost) × W ≤ limit × W`. Memory is two counters and a
//! window start, whatever the limit; the price is that the estimate is an approximation
//! of the true count over the last `W`.
//!
//! ```
//! use weir_protocol::algorithms::sliding_window::SlidingWindow;
//!
//! // 10 per minute.
//! let window = SlidingWindow::new(10, 60_000_000).unwrap();
//! let minute = 1_700_000_040_000_000; // a minute boundary
//! let (_, state) = window.decide(None, minute - 1_000_000, 10);
//!
//! // 15 s into the next minute the previous 10 still weigh 10 × 45/60 = 7.5.
//! let (d, _) = window.decide(state, minute + 15_000_000, 2);
//! assert!(d.allowed);
//! assert_eq!(d.remaining, 0);
//! ```

use super::saturating::{add_us, sat_u64, until_ns};
use super::window::{self, Window, WindowSum, Windowed};
use super::{
    values_of, Admission, AlgorithmKind, AlgorithmSpec, Breach, Decision, GlobalLimit, Limit,
    ParamError, Policy, SlotAlgorithm, SlotState,
};

pub const SPEC: AlgorithmSpec = AlgorithmSpec {
    kind: AlgorithmKind::SlidingWindow,
    name: "sliding_window",
    parameters: window::PARAMETERS,
    global_only: None,
    script: "sliding_window",
    settle_script: None,
    extra_script_keys: &[],
    build: |values| {
        let [limit, window_us] = values_of(values, window::PARAMETERS)?;
        SlidingWindow::new(limit, window_us).map(|w| GlobalLimit::Slot(Limit::SlidingWindow(w)))
    },
    limit_parameter: window::LIMIT_PARAMETER,
    can_hold: false,
    has_schedule: false,
    frees_gradually: true,
    resets_each_window: false,
};

/// Sliding-window parameters, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlidingWindow {
    window: Window,
}

/// The per-key state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct State {
    /// Units allowed in the window before `window_start_us` (high half of slot word `a`).
    pub prev: u32,
    /// Units allowed in the window starting at `window_start_us` (low half of `a`).
    pub curr: u32,
    /// Start of the current window, µs since the Unix epoch (slot word `b`).
    pub window_start_us: u64,
}

impl State {
    /// Any slot decodes: each half of `a` is a count of at most `u32::MAX`, and counts
    /// from windows other than now's and the one before are ignored.
    pub fn from_slot(s: SlotState) -> Self {
        State {
            prev: (s.a >> 32) as u32,
            curr: s.a as u32,
            window_start_us: s.b,
        }
    }

    pub fn to_slot(self) -> SlotState {
        SlotState {
            a: (u64::from(self.prev) << 32) | u64::from(self.curr),
            b: self.window_start_us,
        }
    }
}

impl SlidingWindow {
    /// `limit` units (1 to `u32::MAX`, so that both counts fit one slot word) per
    /// `window_us` (≥ 1 µs).
    pub fn new(limit: u64, window_us: u64) -> Result<Self, ParamError> {
        Window::new(limit, window_us, Some((u64::from(u32::MAX), "")))
            .map(|window| SlidingWindow { window })
    }

    pub fn limit(&self) -> u64 {
        self.window.limit
    }

    pub fn window_us(&self) -> u64 {
        self.window.window_us
    }

    /// Decides `cost` units at `now_us`. A state from a later window than now's (this
    /// request read the clock before another that counted in the next window: a worker
    /// that lost a compare-and-swap race, a Redis clock that went back) admits nothing
    /// until its window starts: the units of now's window it no longer holds could not
    /// be weighed, and one admitted now would count in a window it did not happen in.
    pub fn decide(
        &self,
        state: Option<State>,
        now_us: u64,
        cost: u64,
    ) -> (Decision, Option<State>) {
        let w = self.window.window_us;
        let aligned = self.window.start_of(now_us);
        let (prev, curr, start) = match state {
            Some(s) if self.window.is_later_window(s.window_start_us, aligned) => {
                return (self.behind(s, now_us, cost), None);
            }
            Some(s) if s.window_start_us == aligned => (s.prev, s.curr, s.window_start_us),
            Some(s) if s.window_start_us.checked_add(w) == Some(aligned) => (s.curr, 0, aligned),
            _ => (0, 0, aligned),
        };
        let elapsed = now_us.max(start) - start;

        let w128 = u128::from(w);
        let budget = u128::from(self.window.limit) * w128;
        let prev_weight = u128::from(prev) * u128::from(w - elapsed);
        // A cost near u64::MAX would overflow even u128 here: such a request does not fit.
        let fits = |curr: u128| {
            curr.checked_mul(w128)
                .and_then(|c| c.checked_add(prev_weight))
                .is_some_and(|x| x <= budget)
        };

        let allowed = fits(u128::from(curr) + u128::from(cost));
        // Allowed means curr + cost ≤ limit ≤ u32::MAX.
        let curr_after = if allowed {
            u32::try_from(u64::from(curr) + cost).unwrap_or(u32::MAX)
        } else {
            curr
        };
        let remaining = budget.saturating_sub(prev_weight + u128::from(curr_after) * w128) / w128;

        let retry_after_ns = if allowed || cost > self.window.limit {
            None
        } else {
            Some(until_ns(
                self.allowed_again_at_us(prev, curr, start, cost),
                now_us,
            ))
        };
        let reset_at = if curr_after > 0 {
            add_us(start, 2 * w128)
        } else if prev > 0 {
            add_us(start, w128)
        } else {
            now_us
        };
        let decision = Decision {
            allowed,
            limit: self.window.limit,
            remaining: sat_u64(remaining),
            retry_after_ns,
            reset_after_ns: until_ns(reset_at, now_us),
        };
        let new_state = (allowed && cost > 0).then_some(State {
            prev,
            curr: curr_after,
            window_start_us: start,
        });
        (decision, new_state)
    }

    /// When the estimate drops to 0: two windows after the start of the current one if
    /// it counted anything, the end of the current one if only the previous did.
    /// The decision for a request whose clock is behind the key's window: nothing but
    /// a peek is admitted, and a cost that can fit is retried when the window starts.
    fn behind(&self, s: State, now_us: u64, cost: u64) -> Decision {
        let w = u128::from(self.window.window_us);
        let reset_at = if s.curr > 0 {
            add_us(s.window_start_us, 2 * w)
        } else if s.prev > 0 {
            add_us(s.window_start_us, w)
        } else {
            now_us
        };
        Decision {
            allowed: cost == 0,
            limit: self.window.limit,
            remaining: 0,
            retry_after_ns: (cost > 0 && cost <= self.window.limit)
                .then(|| until_ns(s.window_start_us, now_us)),
            reset_after_ns: until_ns(reset_at, now_us),
        }
    }

    pub fn idle_at_us(&self, state: &State) -> u64 {
        let w = u128::from(self.window.window_us);
        if state.curr > 0 {
            add_us(state.window_start_us, 2 * w)
        } else if state.prev > 0 {
            add_us(state.window_start_us, w)
        } else {
            state.window_start_us
        }
    }

    /// `limit` units per window.
    pub fn policy(&self) -> Policy {
        self.window.policy()
    }

    /// The first instant (µs) at which `cost` units are allowed, for a request denied
    /// now with counts `prev`/`curr` in the window at `start`, and `cost ≤ limit`.
    fn allowed_again_at_us(&self, prev: u32, curr: u32, start: u64, cost: u64) -> u64 {
        let w = u128::from(self.window.window_us);
        let limit = u128::from(self.window.limit);
        let (prev, curr, cost) = (u128::from(prev), u128::from(curr), u128::from(cost));
        if curr + cost <= limit {
            // The previous window's weight blocks: wait until it has faded enough,
            // prev × (W − e) ≤ (limit − curr − cost) × W, within this window (or at its
            // end, where the previous window weighs nothing).
            let slack = (limit - curr - cost) * w;
            let fade = slack.checked_div(prev).unwrap_or(w).min(w);
            add_us(start, w - fade)
        } else {
            // This window is full: in the next one, this window's count fades instead,
            // curr × (W − e) ≤ (limit − cost) × W.
            let fade = ((limit - cost) * w).checked_div(curr).unwrap_or(w).min(w);
            add_us(start, w + (w - fade))
        }
    }
}

impl Windowed for SlidingWindow {
    const SPEC: &'static AlgorithmSpec = &SPEC;

    fn window(&self) -> &Window {
        &self.window
    }

    fn local_share(&self, instances: u64) -> Result<Limit, ParamError> {
        SlidingWindow::new(self.window.share(instances), self.window.window_us)
            .map(Limit::SlidingWindow)
    }

    /// Until the window ends: a unit spent in the next window would be counted in the
    /// window it was granted in, as part of the previous window's weight, not in full.
    fn lease_ttl_ns(&self, now_us: u64) -> Option<u64> {
        Some(self.window.until_window_end_ns(now_us))
    }

    /// The bound (limit `N`, window `W`, windows as the fixed window's): at
    /// every admission `j`, in window `k`, `e = t_j − kW` into it, with `prev` the sum over
    /// window `k − 1` and `cur` the sum over window `k` up to and including `j` (the
    /// admissions at the same instant sorted before `j` included), the algorithm's own
    /// integer test holds: `prev·(W − e) + cur·W ≤ N·W`.
    ///
    /// A breach reports as `allowed` `N + ⌊prev·e / W⌋` for the sum `prev + cur`, which is the
    /// algorithm's test divided by `W`: the units of the previous window that have slid out
    /// no longer count. `first` is the previous window's first admission (the current
    /// window's if the previous one has none).
    fn check_bound(&self, sorted: &[Admission]) -> Option<Breach> {
        breach(self, sorted)
    }
}

impl SlotAlgorithm for SlidingWindow {
    /// Until the window ends: within its window a unit spent later than counted only
    /// meets a smaller weight of the previous window.
    fn lease_cap_ns(&self, state: SlotState, now_us: u64) -> Option<u64> {
        let end = self.window.end_of(State::from_slot(state).window_start_us);
        Some(until_ns(end, now_us))
    }

    /// `limit − remaining` counted in the window of `at_us`, nothing in the one before.
    fn state_with_remaining(&self, remaining: u64, at_us: u64) -> SlotState {
        let used = self.window.limit - remaining.min(self.window.limit);
        State {
            prev: 0,
            curr: u32::try_from(used).unwrap_or(u32::MAX),
            window_start_us: self.window.start_of(at_us),
        }
        .to_slot()
    }
}

super::slot_algorithm!(SlidingWindow);

/// `prev·(W − e) + cur·W ≤ N·W` at every admission, as `SlidingWindow::decide` tests it.
fn breach(w: &SlidingWindow, sorted: &[Admission]) -> Option<Breach> {
    let (limit, width) = (w.limit(), w.window_us());
    let w128 = u128::from(width);
    let budget = u128::from(limit) * w128;
    let mut current: Option<WindowSum> = None;
    let mut previous: Option<WindowSum> = None;
    for (j, a) in sorted.iter().enumerate() {
        let k = a.at_us / width;
        let cur = WindowSum::add(current, k, j, a.cost);
        if cur.first == j {
            previous = current;
        }
        current = Some(cur);
        let prev = previous.filter(|p| p.k.checked_add(1) == Some(k));
        let prev_sum = prev.map_or(0, |p| p.sum);
        let elapsed = u128::from(a.at_us % width);
        // As in `decide`: a product beyond u128 does not fit.
        let weighed = prev_sum
            .checked_mul(w128 - elapsed)
            .and_then(|x| x.checked_add(cur.sum.checked_mul(w128)?));
        if weighed.is_some_and(|x| x <= budget) {
            continue;
        }
        // ⌊prev·e / W⌋ without overflow: e < W.
        let slid_out = (prev_sum / w128) * elapsed + (prev_sum % w128) * elapsed / w128;
        let prev_first = prev.map(|p| p.first);
        let prev_text = match prev_first {
            Some(first) => format!("admissions {first}..={}", cur.first - 1),
            None => "none".to_string(),
        };
        return Some(Breach {
            first: prev_first.unwrap_or(cur.first),
            last: j,
            admitted: prev_sum.saturating_add(cur.sum),
            allowed: u128::from(limit).saturating_add(slid_out),
            why: format!(
                "at {}us, {elapsed}us into its window, the previous window's {prev_sum} \
                 units ({prev_text}) weigh ({width} − {elapsed})/{width} and this window's \
                 {} units (admissions {}..={j}) count in full: {prev_sum} × {} + {} × \
                 {width} is more than {limit} × {width}",
                a.at_us,
                cur.sum,
                cur.first,
                w128 - elapsed,
                cur.sum,
            ),
        });
    }
    None
}
