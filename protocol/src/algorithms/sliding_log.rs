//! Sliding-window log: every admitted unit is an event with its time; a request is
//! allowed if the events of the last `window` plus its cost fit in `limit`.
//!
//! Exact at every instant (no window boundaries, no weighting), at the price of memory
//! O(limit) per key. That is why it runs only in Redis, as a sorted set of event times
//! (global rules); this module is the pure reference the Lua script is checked against.
//!
//! An event at time `t` counts while `now − window < t`, i.e. it leaves the log at
//! `t + window` (Redis: `ZREMRANGEBYSCORE key -inf now−window`). A denied request adds
//! nothing, so an attacker hammering a limited key does not extend its own ban.
//!
//! ```
//! use weir_protocol::algorithms::sliding_log::SlidingLog;
//!
//! let log = SlidingLog::new(2, 1_000_000).unwrap(); // 2 per second
//! let t0 = 1_700_000_000_000_000;
//! let events = [t0, t0 + 400_000];
//! let (denied, granted) = log.acquire(&events, t0 + 500_000, 1, 1);
//! assert!(!denied.allowed && granted == 0);
//! // The first event leaves the window at t0 + 1 s.
//! assert_eq!(denied.retry_after_ns, Some(500_000_000));
//! ```

use super::sliding_window::SlidingWindow;
use super::window::{self, Window, Windowed};
use super::{
    values_of, Admission, AlgorithmKind, AlgorithmSpec, Ask, Breach, Decision, GlobalLimit, Grant,
    Limit, ParamError, Policy, NS_PER_US,
};

pub const SPEC: AlgorithmSpec = AlgorithmSpec {
    kind: AlgorithmKind::SlidingLog,
    name: "sliding_log",
    parameters: window::PARAMETERS,
    global_only: Some(
        "sliding_log keeps one entry per event and runs only in Redis; use it with \
         \"scope\": \"global\", or use sliding_window locally",
    ),
    script: "sliding_log",
    settle_script: None,
    extra_script_keys: &[SEQ_KEY_SUFFIX],
    build: |values| {
        let [limit, window_us] = values_of(values, window::PARAMETERS)?;
        SlidingLog::new(limit, window_us).map(GlobalLimit::SlidingLog)
    },
    limit_parameter: window::LIMIT_PARAMETER,
    can_hold: false,
    has_schedule: false,
    frees_gradually: false,
    resets_each_window: false,
};

/// The log's second Redis key, `<state key>:seq`: a counter that keeps members unique
/// when events share a timestamp.
pub const SEQ_KEY_SUFFIX: &str = ":seq";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlidingLog {
    window: Window,
}

/// The most events one key's log may hold: bounds the sorted set in Redis.
pub const MAX_LOG_LIMIT: u64 = 100_000;

impl SlidingLog {
    /// `limit` (1..=[`MAX_LOG_LIMIT`]) units per `window_us` (≥ 1 µs).
    pub fn new(limit: u64, window_us: u64) -> Result<Self, ParamError> {
        let max = (MAX_LOG_LIMIT, " (the log keeps one entry per unit)");
        Window::new(limit, window_us, Some(max)).map(|window| SlidingLog { window })
    }

    pub fn limit(&self) -> u64 {
        self.window.limit
    }

    pub fn window_us(&self) -> u64 {
        self.window.window_us
    }

    pub fn policy(&self) -> Policy {
        self.window.policy()
    }

    /// Decides `cost` units at `now_us`, granting up to `want` (≥ `cost`) when allowed.
    /// `events` are the logged event times (µs), in ascending order; events outside the
    /// window are ignored. Returns the decision for what was granted and the number of
    /// events to add at `now_us` (0 when denied).
    pub fn acquire(&self, events: &[u64], now_us: u64, cost: u64, want: u64) -> (Decision, u64) {
        let grant = self.grant(events, now_us, Ask::exact(cost).with_want(want));
        (grant.decision, grant.granted)
    }

    /// What the log grants `ask` at `now_us` (the reference of the Lua script): up to
    /// `want` units when `cost` fits. Each granted unit is logged at `now_us +
    /// ask.ttl_us`, the latest instant it may be spent, so the log counts it in every
    /// window that can contain its real spend; it may be spent until then.
    pub fn grant(&self, events: &[u64], now_us: u64, ask: Ask) -> Grant {
        let Window { limit, window_us } = self.window;
        let horizon = now_us.saturating_sub(window_us);
        let live: &[u64] = {
            let first = events.partition_point(|&t| t <= horizon && now_us >= window_us);
            events.get(first..).unwrap_or(&[])
        };
        let count = live.len() as u64;
        let free = limit.saturating_sub(count);
        let ns = |us: u64| us.saturating_mul(NS_PER_US);
        let idle_ns = || {
            live.last()
                .map_or(0, |&t| ns((t + window_us).saturating_sub(now_us)))
        };
        let (cost, want) = (ask.cost, ask.want);
        if cost > free {
            // When the oldest `count + cost − limit` events have left, `cost` fits.
            let retry_after_ns = (cost <= limit)
                .then(|| {
                    let leaving = usize::try_from(count + cost - limit).ok()?;
                    let last_to_leave = *live.get(leaving.checked_sub(1)?)?;
                    Some(ns((last_to_leave + window_us).saturating_sub(now_us)))
                })
                .flatten();
            let decision = Decision {
                allowed: false,
                limit,
                remaining: free,
                retry_after_ns,
                reset_after_ns: idle_ns(),
            };
            return Grant::denied(decision);
        }
        let granted = want.max(cost).min(free);
        let decision = Decision {
            allowed: true,
            limit,
            remaining: free - granted,
            retry_after_ns: None,
            reset_after_ns: if granted > 0 {
                ns(ask.ttl_us.saturating_add(window_us))
            } else {
                idle_ns()
            },
        };
        Grant {
            decision,
            granted,
            due_ns: 0,
            spacing_ns: 0,
            valid_ns: if granted > 0 { ns(ask.ttl_us) } else { 0 },
        }
    }
}

impl Windowed for SlidingLog {
    const SPEC: &'static AlgorithmSpec = &SPEC;

    fn window(&self) -> &Window {
        &self.window
    }

    /// A sliding-window counter's share of the same limit: it needs no log.
    fn local_share(&self, instances: u64) -> Result<Limit, ParamError> {
        let counter = SlidingWindow::new(self.window.limit, self.window.window_us)?;
        Windowed::local_share(&counter, instances)
    }

    /// One window: logged units leave the log then.
    fn lease_ttl_ns(&self, _now_us: u64) -> Option<u64> {
        Some(self.window.window_us.saturating_mul(NS_PER_US))
    }

    /// The bound (limit `N`, window `W`): for every `j`, the sum over the
    /// admissions with `t ∈ (t_j − W, t_j]` is at most `N`: an event at `t` counts while
    /// `now − W < t`, as the Lua script trims (`ZREMRANGEBYSCORE key -inf now−window`).
    ///
    /// A breach reports as `allowed` `N`; `first` is the first admission inside
    /// `(t_last − W, t_last]`.
    fn check_bound(&self, sorted: &[Admission]) -> Option<Breach> {
        breach(self, sorted)
    }

    /// A tenth of the window (at least 1 µs, at most `default_us`): a leased unit stays
    /// in the log that much longer.
    fn default_lease_ttl_us(&self, default_us: u64) -> u64 {
        (self.window_us() / 10).min(default_us).max(1)
    }
}

/// Every `(t_j − W, t_j]` holds at most `N`: two pointers.
fn breach(l: &SlidingLog, sorted: &[Admission]) -> Option<Breach> {
    let (limit, width) = (l.limit(), l.window_us());
    let mut first = 0;
    let mut sum: u128 = 0;
    for (j, a) in sorted.iter().enumerate() {
        sum = sum.saturating_add(u128::from(a.cost));
        // Events at or before t_j − W have left (the Lua trim's inclusive bound).
        while let Some(old) = sorted.get(first) {
            if u128::from(old.at_us) + u128::from(width) > u128::from(a.at_us) {
                break;
            }
            sum = sum.saturating_sub(u128::from(old.cost));
            first += 1;
        }
        if sum > u128::from(limit) {
            let from = i128::from(a.at_us) - i128::from(width);
            let interval = format!("the log's window ({from}us, {}us]", a.at_us);
            return Some(Breach::over_limit(first, j, sum, limit, interval));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    use super::*;

    const T0: u64 = 1_700_000_000_000_000;

    #[test]
    fn events_leave_exactly_one_window_later() {
        let log = SlidingLog::new(3, 10_000_000).unwrap();
        let events = [T0, T0 + 1_000_000, T0 + 2_000_000];
        assert!(!log.acquire(&events, T0 + 9_999_999, 1, 1).0.allowed);
        let (d, g) = log.acquire(&events, T0 + 10_000_000, 1, 1);
        assert!(d.allowed && g == 1 && d.remaining == 0);
        // Two units wait for the second event to leave.
        let (d, _) = log.acquire(&events, T0 + 5_000_000, 2, 2);
        assert_eq!(d.retry_after_ns, Some(6_000_000_000));
        assert_eq!(d.reset_after_ns, 7_000_000_000);
        // More than the limit never fits.
        assert_eq!(log.acquire(&[], T0, 4, 4).0.retry_after_ns, None);
    }

    #[test]
    fn grants_up_to_what_is_free() {
        let log = SlidingLog::new(10, 1_000_000).unwrap();
        let (d, g) = log.acquire(&[T0, T0], T0 + 1, 1, 50);
        assert_eq!((d.allowed, g, d.remaining), (true, 8, 0));
        let (d, g) = log.acquire(&[], T0, 0, 0);
        assert_eq!(
            (d.allowed, g, d.remaining, d.reset_after_ns),
            (true, 0, 10, 0)
        );
    }
}
