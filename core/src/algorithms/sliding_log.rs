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
//! use weir_core::algorithms::sliding_log::SlidingLog;
//!
//! let log = SlidingLog::new(2, 1_000_000).unwrap(); // 2 per second
//! let t0 = 1_700_000_000_000_000;
//! let events = [t0, t0 + 400_000];
//! let (denied, granted) = log.acquire(&events, t0 + 500_000, 1, 1);
//! assert!(!denied.allowed && granted == 0);
//! // The first event leaves the window at t0 + 1 s.
//! assert_eq!(denied.retry_after_ns, Some(500_000_000));
//! ```

use super::{Decision, ParamError, Policy, NS_PER_US};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlidingLog {
    limit: u64,
    window_us: u64,
}

/// The most events one key's log may hold: bounds the sorted set in Redis.
pub const MAX_LOG_LIMIT: u64 = 100_000;

impl SlidingLog {
    /// `limit` (1..=[`MAX_LOG_LIMIT`]) units per `window_us` (≥ 1 µs).
    pub fn new(limit: u64, window_us: u64) -> Result<Self, ParamError> {
        if limit == 0 {
            return Err(ParamError::new("limit", "must be at least 1"));
        }
        if limit > MAX_LOG_LIMIT {
            return Err(ParamError::new(
                "limit",
                format!("must be at most {MAX_LOG_LIMIT} (the log keeps one entry per unit)"),
            ));
        }
        if window_us == 0 {
            return Err(ParamError::new("window", "must be at least 1us"));
        }
        Ok(SlidingLog { limit, window_us })
    }

    pub fn limit(&self) -> u64 {
        self.limit
    }

    pub fn window_us(&self) -> u64 {
        self.window_us
    }

    pub fn policy(&self) -> Policy {
        Policy {
            quota: self.limit,
            window_ns: self.window_us.saturating_mul(NS_PER_US),
        }
    }

    /// Decides `cost` units at `now_us`, granting up to `want` (≥ `cost`) when allowed.
    /// `events` are the logged event times (µs), in ascending order; events outside the
    /// window are ignored. Returns the decision for what was granted and the number of
    /// events to add at `now_us` (0 when denied).
    pub fn acquire(&self, events: &[u64], now_us: u64, cost: u64, want: u64) -> (Decision, u64) {
        let horizon = now_us.saturating_sub(self.window_us);
        let live: &[u64] = {
            let first = events.partition_point(|&t| t <= horizon && now_us >= self.window_us);
            events.get(first..).unwrap_or(&[])
        };
        let count = live.len() as u64;
        let free = self.limit.saturating_sub(count);
        let ns = |us: u64| us.saturating_mul(NS_PER_US);
        if cost > free {
            // When the oldest `count + cost − limit` events have left, `cost` fits.
            let retry_after_ns = (cost <= self.limit)
                .then(|| {
                    let leaving = usize::try_from(count + cost - self.limit).ok()?;
                    let last_to_leave = *live.get(leaving.checked_sub(1)?)?;
                    Some(ns((last_to_leave + self.window_us).saturating_sub(now_us)))
                })
                .flatten();
            let reset_after_ns = live
                .last()
                .map_or(0, |&t| ns((t + self.window_us).saturating_sub(now_us)));
            let decision = Decision {
                allowed: false,
                limit: self.limit,
                remaining: free,
                retry_after_ns,
                reset_after_ns,
            };
            return (decision, 0);
        }
        let granted = want.max(cost).min(free);
        let decision = Decision {
            allowed: true,
            limit: self.limit,
            remaining: free - granted,
            retry_after_ns: None,
            reset_after_ns: if granted > 0 {
                ns(self.window_us)
            } else {
                live.last()
                    .map_or(0, |&t| ns((t + self.window_us).saturating_sub(now_us)))
            },
        };
        (decision, granted)
    }
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
