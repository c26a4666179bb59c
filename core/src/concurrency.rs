//! Concurrency limits: how many requests of a key may be *in flight* at once, not how
//! many per unit of time. A request takes its cost from the key when it is admitted and
//! gives it back when its stream ends, whatever the end (response complete, upstream
//! error, client reset, timeout, Envoy draining the connection).
//!
//! A rate limit protects a quota; a concurrency limit protects a service's capacity: by
//! Little's law in-flight = rate × latency, so when the service slows down the same
//! rate holds more requests at once, and only a concurrency limit sees it. With
//! `adaptive`, the limit itself follows the latency the filter observes
//! ([`crate::adaptive`]).
//!
//! The state of a key is its count in flight (slot word `a`); a key with nothing in
//! flight carries no information and its slot may be reused.
//!
//! ```
//! use weir_core::concurrency::Concurrency;
//!
//! let limit = Concurrency::new(2, 1_000_000, None).unwrap();
//! let (first, state) = limit.decide(None, 2, 1);
//! let (second, state) = limit.decide(state, 2, 1);
//! let (third, _) = limit.decide(state, 2, 1);
//! assert!(first.allowed && second.allowed && !third.allowed);
//! // The first request ends: one more fits.
//! let state = limit.release(state, 1);
//! assert!(limit.decide(state, 2, 1).0.allowed);
//! ```

use crate::adaptive::Adaptive;
use crate::algorithms::{Decision, ParamError, Policy, SlotState, NS_PER_US};

/// The most requests of one key a rule may let in flight at once.
pub const MAX_IN_FLIGHT: u64 = 1_000_000;

/// `algorithm: "concurrency"`, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Concurrency {
    /// The most units in flight per key (with `adaptive`: the ceiling of the limit).
    pub max_in_flight: u64,
    /// What a denial tells the client to wait (`Retry-After`), µs: the time in which
    /// a request of the key usually ends.
    pub retry_after_us: u64,
    /// The limit follows the observed latency, between `adaptive.min` and
    /// `max_in_flight`.
    pub adaptive: Option<Adaptive>,
}

impl Concurrency {
    pub fn new(
        max_in_flight: u64,
        retry_after_us: u64,
        adaptive: Option<Adaptive>,
    ) -> Result<Concurrency, ParamError> {
        if !(1..=MAX_IN_FLIGHT).contains(&max_in_flight) {
            return Err(ParamError::new(
                "max_in_flight",
                format!("must be 1 to {MAX_IN_FLIGHT}"),
            ));
        }
        if !(1_000..=3_600_000_000).contains(&retry_after_us) {
            return Err(ParamError::new("retry_after", "must be 1ms to 1h"));
        }
        if let Some(adaptive) = &adaptive {
            adaptive.check(max_in_flight)?;
        }
        Ok(Concurrency {
            max_in_flight,
            retry_after_us,
            adaptive,
        })
    }

    /// Admits `cost` units if the key's count in flight stays within `limit` (the
    /// rule's `max_in_flight`, or the adaptive limit of the moment). Returns the decision
    /// and the state to store (`None` when denied: nothing changes).
    pub fn decide(
        &self,
        state: Option<SlotState>,
        limit: u64,
        cost: u64,
    ) -> (Decision, Option<SlotState>) {
        let in_flight = state.map_or(0, |s| s.a);
        let after = in_flight.saturating_add(cost);
        if after <= limit {
            let decision = Decision {
                allowed: true,
                limit,
                remaining: limit - after,
                retry_after_ns: None,
                reset_after_ns: 0,
            };
            return (decision, Some(SlotState { a: after, b: 0 }));
        }
        let decision = Decision {
            allowed: false,
            limit,
            remaining: limit.saturating_sub(in_flight),
            // A cost above `max_in_flight` never fits; one above an adaptive limit that
            // is lower for now fits once the limit grows back.
            retry_after_ns: (cost <= self.max_in_flight).then(|| self.retry_after_us * NS_PER_US),
            reset_after_ns: 0,
        };
        (decision, None)
    }

    /// The key's state once `units` of it are no longer in flight (never below 0: a
    /// release of a key that lost its slot in between finds less than it gave).
    pub fn release(&self, state: Option<SlotState>, units: u64) -> Option<SlotState> {
        let state = state?;
        Some(SlotState {
            a: state.a.saturating_sub(units),
            b: 0,
        })
    }

    /// Units in flight: what a slot table must not throw away.
    pub fn in_use(state: SlotState) -> u64 {
        state.a
    }

    /// A key with nothing in flight carries no information; one with requests in flight
    /// is never idle.
    pub fn idle_at_us(state: SlotState) -> u64 {
        if state.a == 0 {
            0
        } else {
            u64::MAX
        }
    }

    /// What the RateLimit headers advertise: the limit in flight as the quota, over
    /// the window of `retry_after` (a concurrency limit has no window of its own).
    pub fn policy(&self) -> Policy {
        Policy {
            quota: self.max_in_flight,
            window_ns: self.retry_after_us * NS_PER_US,
        }
    }
}

#[cfg(test)]
mod tests {
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    use super::*;

    fn limit(max: u64) -> Concurrency {
        Concurrency::new(max, 1_000_000, None).unwrap()
    }

    #[test]
    fn admits_up_to_the_limit_and_frees_on_release() {
        let c = limit(3);
        let mut state = None;
        for expected_remaining in [2, 1, 0] {
            let (d, next) = c.decide(state, 3, 1);
            assert!(d.allowed);
            assert_eq!(d.remaining, expected_remaining);
            state = next;
        }
        let (denied, unchanged) = c.decide(state, 3, 1);
        assert!(!denied.allowed);
        assert_eq!(unchanged, None);
        assert_eq!(denied.retry_after_ns, Some(1_000_000_000));
        state = c.release(state, 1);
        assert_eq!(state, Some(SlotState { a: 2, b: 0 }));
        assert!(c.decide(state, 3, 1).0.allowed);
    }

    #[test]
    fn costs_count_as_several_in_flight() {
        let c = limit(10);
        let (d, state) = c.decide(None, 10, 7);
        assert!(d.allowed);
        assert!(!c.decide(state, 10, 4).0.allowed);
        // A cost above the limit never fits: no retry.
        assert_eq!(c.decide(None, 10, 11).0.retry_after_ns, None);
        // Above an adaptive limit that is lower for now, it fits later: a retry.
        let (d, _) = c.decide(None, 3, 5);
        assert!(!d.allowed);
        assert_eq!(d.retry_after_ns, Some(1_000_000_000));
    }

    #[test]
    fn a_lower_limit_denies_until_enough_ended() {
        // An adaptive limit went from 4 to 2 while 4 were in flight.
        let c = limit(4);
        let state = Some(SlotState { a: 4, b: 0 });
        let (d, _) = c.decide(state, 2, 1);
        assert!(!d.allowed);
        assert_eq!(d.remaining, 0);
        let state = c.release(c.release(c.release(state, 1), 1), 1);
        assert!(c.decide(state, 2, 1).0.allowed);
    }

    #[test]
    fn release_never_goes_below_zero_and_idle_keys_free_their_slot() {
        let c = limit(2);
        assert_eq!(c.release(None, 1), None);
        let state = c.release(Some(SlotState { a: 1, b: 0 }), 5).unwrap();
        assert_eq!(state.a, 0);
        assert_eq!(Concurrency::idle_at_us(state), 0);
        assert_eq!(Concurrency::idle_at_us(SlotState { a: 1, b: 0 }), u64::MAX);
        assert_eq!(Concurrency::in_use(SlotState { a: 3, b: 0 }), 3);
    }

    #[test]
    fn parameters_are_checked() {
        assert_eq!(
            Concurrency::new(0, 1_000_000, None).unwrap_err().field,
            "max_in_flight"
        );
        assert_eq!(
            Concurrency::new(1, 10, None).unwrap_err().field,
            "retry_after"
        );
    }
}
