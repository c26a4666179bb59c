//! Fixed window: at most `limit` units per window, counted from zero in each window.
//!
//! Vocabulary:
//!
//! - **window**: an interval of fixed length aligned to the Unix epoch, `[k × window,
//!   (k + 1) × window)`. Every key rolls over at the same instants, which keeps the
//!   state to one counter and makes `reset_after` the same for everyone.
//! - **count**: the units allowed so far in the key's current window.
//! - **debt**: a count above the limit, left by a cost settled after the response
//!   (`commit`) that was larger than its estimate. What the window cannot hold is carried
//!   into the next ones: each later window starts with the count less `limit` per
//!   window elapsed (never below 0), so a window repays at most its own limit and later
//!   requests repay the rest. Without debt, a count from an earlier window is 0.
//!
//! The trade-off is the boundary: a client may spend `limit` at the end of one window
//! and `limit` again at the start of the next, up to 2 × limit within a short span. The
//! sliding window smooths that out.
//!
//! ```
//! use weir_protocol::algorithms::fixed_window::FixedWindow;
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

use super::saturating::{sat_u64, until_ns};
use super::window::{self, Window, WindowSum, Windowed};
use super::{
    values_of, Admission, AlgorithmKind, AlgorithmSpec, Breach, Decision, GlobalLimit, Limit,
    ParamError, Policy, SlotAlgorithm, SlotState, MAX_SCRIPT_EXACT,
};

/// The largest count a settle leaves (2^49 units): with the limit at most 2^48, every
/// sum the Lua scripts form with it stays below 2^53, where doubles are exact.
const MAX_DEBT_COUNT: u128 = 1 << 49;

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
    limit_parameter: window::LIMIT_PARAMETER,
    can_hold: false,
    has_schedule: false,
    frees_gradually: false,
    resets_each_window: true,
};

/// Fixed-window parameters, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FixedWindow {
    window: Window,
}

/// The per-key state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct State {
    /// Units counted in the window starting at `window_start_us` (slot word `a`); above
    /// the limit, a debt that the next windows carry (`limit` less per window).
    pub count: u64,
    /// Start of the window counted, µs since the Unix epoch (slot word `b`).
    pub window_start_us: u64,
}

impl State {
    /// Any slot decodes: a count from an earlier window carries what the limit of the
    /// windows since could not hold, one from a misaligned start is ignored.
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

    /// Decides `cost` units at `now_us`. A state from a later window than now's (this
    /// request read the clock before another that counted in the next window: a worker
    /// that lost a compare-and-swap race, a Redis clock that went back) admits nothing
    /// until the window it fits in: now's window is not counted any more, and a unit
    /// admitted now would count in a window it did not happen in. A state from an
    /// earlier window carries its debt (see the module docs); a misaligned one counts
    /// as 0. A request denied by a debt is told the window in which it fits, not the end
    /// of the current one.
    pub fn decide(
        &self,
        state: Option<State>,
        now_us: u64,
        cost: u64,
    ) -> (Decision, Option<State>) {
        let limit = self.window.limit;
        if let Some(s) = state.filter(|s| {
            self.window
                .is_later_window(s.window_start_us, self.window.start_of(now_us))
        }) {
            return (self.behind(s, now_us, cost), None);
        }
        let current = self.current(state, now_us);
        let allowed = u128::from(current.count) + u128::from(cost) <= u128::from(limit);
        let after = if allowed {
            State {
                count: current.count + cost,
                ..current
            }
        } else {
            current
        };
        // Denied: the count is above `limit − cost`; the window that carries little
        // enough of it is `⌈(count + cost − limit) / limit⌉` windows on (the next one
        // unless there is debt).
        let retry_after_ns = (!allowed && cost <= limit).then(|| {
            let windows = (u128::from(current.count) + u128::from(cost) - u128::from(limit))
                .div_ceil(u128::from(limit));
            until_ns(self.windows_on(current.window_start_us, windows), now_us)
        });
        let decision = Decision {
            allowed,
            limit,
            remaining: limit.saturating_sub(after.count),
            retry_after_ns,
            reset_after_ns: until_ns(self.idle_at_us(&after), now_us),
        };
        let new_state = (allowed && cost > 0).then_some(after);
        (decision, new_state)
    }

    /// The state read at `now_us`: the current window's count, the debt an earlier
    /// window carries into it, or a later window's (the clock went back: a settle
    /// counts there).
    fn current(&self, state: Option<State>, now_us: u64) -> State {
        let start = self.window.start_of(now_us);
        let fresh = State {
            count: 0,
            window_start_us: start,
        };
        let Some(s) = state else {
            return fresh;
        };
        if s.window_start_us == start || self.window.is_later_window(s.window_start_us, start) {
            return s;
        }
        if s.window_start_us > start || !s.window_start_us.is_multiple_of(self.window.window_us) {
            return fresh;
        }
        // Aligned and earlier: `limit` repaid per window elapsed.
        let elapsed = u128::from((start - s.window_start_us) / self.window.window_us);
        let repaid = elapsed * u128::from(self.window.limit);
        State {
            count: sat_u64(u128::from(s.count).saturating_sub(repaid)),
            window_start_us: start,
        }
    }

    /// The decision for a request whose clock is behind the key's window: nothing but
    /// a peek is admitted, and a cost that can fit is retried in the first window from
    /// the key's that has room for it.
    fn behind(&self, s: State, now_us: u64, cost: u64) -> Decision {
        let limit = self.window.limit;
        let retry_after_ns = (cost > 0 && cost <= limit).then(|| {
            let windows = (u128::from(s.count) + u128::from(cost) - 1) / u128::from(limit);
            until_ns(self.windows_on(s.window_start_us, windows), now_us)
        });
        Decision {
            allowed: cost == 0,
            limit,
            remaining: 0,
            retry_after_ns,
            reset_after_ns: until_ns(self.idle_at_us(&s), now_us),
        }
    }

    /// The start of the window `windows` after the one starting at `start_us`.
    fn windows_on(&self, start_us: u64, windows: u128) -> u64 {
        sat_u64(u128::from(start_us) + windows * u128::from(self.window.window_us))
    }

    /// The end of the last window the state's count reaches into: the end of its own
    /// window, or later while it carries debt.
    pub fn idle_at_us(&self, state: &State) -> u64 {
        let windows = u128::from(state.count)
            .div_ceil(u128::from(self.window.limit))
            .max(1);
        self.windows_on(state.window_start_us, windows)
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

    /// The bound (limit `N`, window `W`): windows `[kW, (k + 1)W)` aligned to the
    /// epoch of the µs clock; every window's sum is at most `N`.
    ///
    /// A breach reports as `allowed` `N`; `first` is the window's first admission.
    fn check_bound(&self, sorted: &[Admission]) -> Option<Breach> {
        breach(self, sorted)
    }
}

impl SlotAlgorithm for FixedWindow {
    /// A refund while the window the request was counted in is the key's window: the
    /// count is then exactly what the actual cost would have made it (and so is the
    /// debt it carries, if the key has written nothing since). An excess is added to
    /// now's window, carried debt included, beyond the limit if need be: what the window
    /// cannot hold is carried into the next ones (see the module docs), as far as
    /// [`MAX_SCRIPT_EXACT`] µs past now and never above 2^49 units; the rest is forgiven.
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
        let current = self.current(Some(s), now_us);
        let count = u128::from(current.count) + u128::from(actual - reserved);
        // The windows up to MAX_SCRIPT_EXACT µs past now, each holding `limit`.
        let horizon = u128::from(now_us) + u128::from(MAX_SCRIPT_EXACT);
        let windows = horizon.saturating_sub(u128::from(current.window_start_us))
            / u128::from(self.window.window_us);
        let most = (windows * u128::from(self.window.limit)).min(MAX_DEBT_COUNT);
        Some(
            State {
                count: sat_u64(count.min(most)),
                ..current
            }
            .to_slot(),
        )
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

/// Every window `[kW, (k + 1)W)` holds at most `N`.
fn breach(w: &FixedWindow, sorted: &[Admission]) -> Option<Breach> {
    let (limit, width) = (w.limit(), w.window_us());
    let mut current: Option<WindowSum> = None;
    for (j, a) in sorted.iter().enumerate() {
        let window = WindowSum::add(current, a.at_us / width, j, a.cost);
        current = Some(window);
        if window.sum > u128::from(limit) {
            let start = u128::from(window.k) * u128::from(width);
            let end = start + u128::from(width);
            let interval = format!("the window [{start}us, {end}us)");
            return Some(Breach::over_limit(
                window.first,
                j,
                window.sum,
                limit,
                interval,
            ));
        }
    }
    None
}
