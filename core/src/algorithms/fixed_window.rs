//! Fixed window: at most `limit` units per window, counted from zero in each window.
//!
//! Vocabulary:
//!
//! - **window**: an interval of fixed length aligned to the Unix epoch, `[k × window,
//!   (k + 1) × window)`. Every key rolls over at the same instants, which keeps the
//!   state to one counter and makes `reset_after` the same for everyone.
//! - **count**: the units allowed so far in the key's current window.
//!
//! The trade-off is the boundary: a client may spend `limit` at the end of one window
//! and `limit` again at the start of the next, up to 2 × limit within a short span. The
//! sliding window smooths that out.
//!
//! ```
//! use weir_core::algorithms::fixed_window::FixedWindow;
//!
//! // 3 per minute.
//! let window = FixedWindow::new(3, 60_000_000).unwrap();
//! let now = 1_700_000_050_000_000; // 10 s into a minute
//! let (d, state) = window.decide(None, now, 3);
//! assert!(d.allowed);
//! assert_eq!(d.reset_after_ns, 50_000_000_000);
//! let (d, _) = window.decide(state, now, 1);
//! assert!(!d.allowed);
//! assert_eq!(d.retry_after_ns, Some(50_000_000_000)); // the next minute
//! ```

use super::time::until_ns;
use super::window::{self, Window, Windowed};
use super::{
    values_of, AlgorithmKind, AlgorithmSpec, Decision, GlobalLimit, Limit, ParamError, Policy,
    SlotAlgorithm, SlotState,
};

pub const SPEC: AlgorithmSpec = AlgorithmSpec {
    kind: AlgorithmKind::FixedWindow,
    name: "fixed_window",
    parameters: window::PARAMETERS,
    global_only: None,
    script: "fixed_window",
    settle_script: Some("fixed_window_settle"),
    extra_script_keys: &[],
    build: |values| {
        let [limit, window_us] = values_of(values, window::PARAMETERS)?;
        FixedWindow::new(limit, window_us).map(|w| GlobalLimit::Slot(Limit::FixedWindow(w)))
    },
};

/// Fixed-window parameters, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FixedWindow {
    window: Window,
}

/// The per-key state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct State {
    /// Units allowed in the window starting at `window_start_us` (slot word `a`).
    pub count: u64,
    /// Start of the window counted, µs since the Unix epoch (slot word `b`).
    pub window_start_us: u64,
}

impl State {
    /// Any slot decodes: a count from another window is ignored, and a count beyond the
    /// limit only denies until its window ends.
    pub fn from_slot(s: SlotState) -> Self {
        State {
            count: s.a,
            window_start_us: s.b,
        }
    }

    pub fn to_slot(self) -> SlotState {
        SlotState {
            a: self.count,
            b: self.window_start_us,
        }
    }
}

impl FixedWindow {
    /// `limit` (≥ 1) units per `window_us` (≥ 1 µs).
    pub fn new(limit: u64, window_us: u64) -> Result<Self, ParamError> {
        Window::new(limit, window_us, None).map(|window| FixedWindow { window })
    }

    pub fn limit(&self) -> u64 {
        self.window.limit
    }

    pub fn window_us(&self) -> u64 {
        self.window.window_us
    }

    /// Decides `cost` units at `now_us`. A state from a later window than now's (the
    /// clock went back) is read as if no time had elapsed: its window is still current.
    /// A state from any other window counts as 0.
    pub fn decide(
        &self,
        state: Option<State>,
        now_us: u64,
        cost: u64,
    ) -> (Decision, Option<State>) {
        let limit = self.window.limit;
        let start = self.window.start_of(now_us);
        let current = match state {
            Some(s)
                if s.window_start_us == start
                    || self.window.is_later_window(s.window_start_us, start) =>
            {
                s
            }
            _ => State {
                count: 0,
                window_start_us: start,
            },
        };
        let allowed = u128::from(current.count) + u128::from(cost) <= u128::from(limit);
        let count = if allowed {
            current.count + cost
        } else {
            current.count
        };
        let until_end = until_ns(self.window.end_of(current.window_start_us), now_us);
        let decision = Decision {
            allowed,
            limit,
            remaining: limit.saturating_sub(count),
            retry_after_ns: (!allowed && cost <= limit).then_some(until_end),
            reset_after_ns: until_end,
        };
        let new_state = (allowed && cost > 0).then_some(State {
            count,
            window_start_us: current.window_start_us,
        });
        (decision, new_state)
    }

    /// The end of the state's window.
    pub fn idle_at_us(&self, state: &State) -> u64 {
        self.window.end_of(state.window_start_us)
    }

    /// `limit` units per window.
    pub fn policy(&self) -> Policy {
        self.window.policy()
    }
}

impl Windowed for FixedWindow {
    const SPEC: &'static AlgorithmSpec = &SPEC;

    fn window(&self) -> &Window {
        &self.window
    }

    fn local_share(&self, instances: u64) -> Result<Limit, ParamError> {
        FixedWindow::new(self.window.share(instances), self.window.window_us)
            .map(Limit::FixedWindow)
    }

    /// Until the window ends: spent later, a unit would count against the next window.
    fn lease_ttl_ns(&self, now_us: u64) -> Option<u64> {
        Some(self.window.until_window_end_ns(now_us))
    }
}

impl SlotAlgorithm for FixedWindow {
    /// A refund while the window the request was counted in is the key's window: the
    /// count is then exactly what the actual cost would have made it. An excess is
    /// added to now's window (the key's debt, beyond the limit if need be: denied until
    /// the window ends).
    fn settle(
        &self,
        state: SlotState,
        counted_at_us: u64,
        reserved: u64,
        actual: u64,
        now_us: u64,
    ) -> Option<SlotState> {
        let s = State::from_slot(state);
        if actual < reserved {
            if s.window_start_us != self.window.start_of(counted_at_us) {
                return None;
            }
            let count = s.count.saturating_sub(reserved - actual);
            return Some(State { count, ..s }.to_slot());
        }
        let excess = actual - reserved;
        let now_start = self.window.start_of(now_us);
        let current = s.window_start_us == now_start
            || self.window.is_later_window(s.window_start_us, now_start);
        let next = if current {
            State {
                count: s.count.saturating_add(excess),
                ..s
            }
        } else {
            State {
                count: excess,
                window_start_us: now_start,
            }
        };
        Some(next.to_slot())
    }

    /// Until the window ends: spent later, a unit would count against the next window.
    fn lease_cap_ns(&self, state: SlotState, now_us: u64) -> Option<u64> {
        let end = self.window.end_of(State::from_slot(state).window_start_us);
        Some(until_ns(end, now_us))
    }

    /// `limit − remaining` counted in the window of `at_us`.
    fn state_with_remaining(&self, remaining: u64, at_us: u64) -> SlotState {
        State {
            count: self.window.limit - remaining.min(self.window.limit),
            window_start_us: self.window.start_of(at_us),
        }
        .to_slot()
    }
}

super::slot_algorithm!(FixedWindow);
