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
//! ## Places, epochs and what a lost place costs
//!
//! A key's state is its count in flight, kept in two **epochs** of [`PLACE_EPOCH_US`]:
//! the places counted (or re-counted) in the current epoch, and those counted in the one
//! before ([`InFlight`]). Each worker remembers the places it holds per key ([`KeyPlaces`],
//! in [`Places`]) and, on its tick, re-counts into the current epoch the places it holds
//! that were counted in an older one. A place nobody re-counted for a whole epoch is
//! dropped when the key's state next moves to a new epoch: the places of a VM that died
//! with requests in flight, or a give-back that shared data never accepted, are back
//! between one and two epochs after they were last counted (at most
//! `2 × PLACE_EPOCH_US`, 10 s).
//!
//! Giving a place back never fails closed: the worker first marks it ended in its
//! [`KeyPlaces`], then updates the key; if shared data refuses (a store error, or every CAS
//! attempt lost), the worker keeps it marked and gives it back on its next tick, and if
//! that never happens the epoch drops it anyway.
//!
//! What the epochs cost: a worker that does not tick for a whole epoch (a VM stalled
//! for 5 s) has its live places dropped; the key may then admit up to those places
//! beyond its limit until the worker re-counts them on its next tick or request.
//!
//! ```
//! use weir_core::concurrency::KeyPlaces;
//! use weir_core::rules::Concurrency;
//!
//! let limit = Concurrency::new(2, 1_000_000, None).unwrap();
//! let epoch = 7;
//! let mine = KeyPlaces::default();
//! let (first, state) = limit.admit(None, mine, epoch, 2, 1);
//! let mine = mine.wrote(1, epoch);
//! let (second, state) = limit.admit(state, mine, epoch, 2, 1);
//! let mine = mine.wrote(1, epoch);
//! let (third, _) = limit.admit(state, mine, epoch, 2, 1);
//! assert!(first.decision.allowed && second.decision.allowed && !third.decision.allowed);
//! // The first request ends: one more fits.
//! let mine = mine.ended(1);
//! let (state, _) = limit.give_back(state, mine, epoch);
//! let mine = mine.wrote(0, epoch);
//! assert!(limit.admit(state, mine, epoch, 2, 1).0.decision.allowed);
//! ```

use std::collections::BTreeMap;

use crate::algorithms::{Decision, Policy, SlotState, NS_PER_US};
use crate::rules::Concurrency;

/// How long an epoch of places lasts, µs: every live worker re-counts its places once
/// per epoch, and a place nobody re-counted for a whole epoch is dropped (see the module
/// docs). A leaked place is back within `2 × PLACE_EPOCH_US`.
pub const PLACE_EPOCH_US: u64 = 5_000_000;

/// The most keys a worker updates on one tick to give places back or re-count them;
/// the rest wait for the next tick (which comes sooner while some wait).
pub const MAX_PLACE_UPDATES_PER_TICK: usize = 256;

/// The epoch of the instant `now_us`.
pub fn place_epoch(now_us: u64) -> u64 {
    now_us / PLACE_EPOCH_US
}

/// A key's count in flight: units counted in `epoch` and in the epoch before it. Stored
/// in a slot as `a = previous << 32 | current`, `b = epoch` (counts never reach 2^32:
/// they stay within `max_in_flight` plus what live workers re-count).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct InFlight {
    pub current: u64,
    pub previous: u64,
    pub epoch: u64,
}

const COUNT_MASK: u64 = 0xffff_ffff;

impl InFlight {
    pub fn from_state(state: Option<SlotState>) -> InFlight {
        state.map_or_else(InFlight::default, |s| InFlight {
            current: s.a & COUNT_MASK,
            previous: s.a >> 32,
            epoch: s.b,
        })
    }

    pub fn state(self) -> SlotState {
        SlotState {
            a: (self.previous.min(COUNT_MASK) << 32) | self.current.min(COUNT_MASK),
            b: self.epoch,
        }
    }

    /// Units in flight.
    pub fn total(self) -> u64 {
        self.current.saturating_add(self.previous)
    }

    /// The count as seen in `epoch`, and the units dropped on the way: the current
    /// count becomes the previous one an epoch later, and what nobody re-counted for a
    /// whole epoch is dropped.
    pub fn at(self, epoch: u64) -> (InFlight, u64) {
        if epoch <= self.epoch {
            return (self, 0);
        }
        if epoch == self.epoch.saturating_add(1) {
            let next = InFlight {
                current: 0,
                previous: self.current,
                epoch,
            };
            return (next, self.previous);
        }
        let empty = InFlight {
            epoch,
            ..InFlight::default()
        };
        (empty, self.total())
    }

    /// From when the state carries no information (every unit in it dropped), µs.
    pub fn idle_at_us(self) -> u64 {
        let epochs_left = match (self.current, self.previous) {
            (0, 0) => return 0,
            (0, _) => 1,
            _ => 2,
        };
        self.epoch
            .saturating_add(epochs_left)
            .saturating_mul(PLACE_EPOCH_US)
    }
}

/// The places one worker holds of one key: `counted` units it counted (or re-counted)
/// in the key's state in `epoch`, of which `ended` belong to requests that ended and
/// are still to be given back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct KeyPlaces {
    pub counted: u64,
    pub ended: u64,
    pub epoch: u64,
}

impl KeyPlaces {
    /// `units` more ended (never more than are counted).
    pub fn ended(self, units: u64) -> KeyPlaces {
        KeyPlaces {
            ended: self.ended.saturating_add(units).min(self.counted),
            ..self
        }
    }

    /// After this worker wrote the key's state in `epoch` (its ended places given back,
    /// the others re-counted there) admitting `admitted` more units.
    pub fn wrote(self, admitted: u64, epoch: u64) -> KeyPlaces {
        KeyPlaces {
            counted: self
                .counted
                .saturating_sub(self.ended)
                .saturating_add(admitted),
            ended: 0,
            epoch,
        }
    }

    /// Nothing to give back, nothing to re-count in `epoch`.
    pub fn up_to_date_in(self, epoch: u64) -> bool {
        self.ended == 0 && (self.counted == 0 || self.epoch == epoch)
    }

    /// The key's state as this worker's write leaves it in `epoch`, before any
    /// admission: aged to `epoch` (the units dropped on the way are returned), the
    /// worker's places taken out of the epoch they were counted in, its open ones counted
    /// again in the current epoch, the ended ones given back.
    /// A state already in a later epoch (another worker's clock read a moment later)
    /// is kept in its epoch: the result's `epoch` is the one written.
    pub fn apply(self, state: Option<SlotState>, epoch: u64) -> (InFlight, u64) {
        let stored = InFlight::from_state(state);
        let epoch = epoch.max(stored.epoch);
        let (mut s, dropped) = stored.at(epoch);
        if self.epoch == epoch {
            s.current = s.current.saturating_sub(self.counted);
        } else if self.epoch.saturating_add(1) == epoch {
            s.previous = s.previous.saturating_sub(self.counted);
        }
        // Counted longer ago: dropped already; the open ones are counted again.
        s.current = s
            .current
            .saturating_add(self.counted.saturating_sub(self.ended));
        (s, dropped)
    }
}

/// What one worker holds of every key of its concurrency rules: (rule index, set hash,
/// fingerprint) → [`KeyPlaces`]. At most one entry per key with a request of this worker in
/// flight or a give-back waiting.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Places {
    held: BTreeMap<(usize, u64, u64), KeyPlaces>,
}

impl Places {
    pub fn get(&self, id: (usize, u64, u64)) -> KeyPlaces {
        self.held.get(&id).copied().unwrap_or_default()
    }

    pub fn set(&mut self, id: (usize, u64, u64), held: KeyPlaces) {
        if held.counted == 0 {
            self.held.remove(&id);
        } else {
            self.held.insert(id, held);
        }
    }

    /// Up to `max` keys with places to give back or re-count in `epoch`.
    pub fn due(&self, epoch: u64, max: usize) -> Vec<((usize, u64, u64), KeyPlaces)> {
        self.held
            .iter()
            .filter(|(_, h)| !h.up_to_date_in(epoch))
            .take(max)
            .map(|(id, h)| (*id, *h))
            .collect()
    }

    /// Units this worker holds (counted, ended or not), over every key.
    pub fn units(&self) -> u64 {
        self.held.values().map(|h| h.counted).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    /// Some places ended and wait to be given back.
    pub fn has_ended(&self) -> bool {
        self.held.values().any(|h| h.ended > 0)
    }
}

/// What a worker's admission did to a key: the decision, the units of other places
/// dropped because nobody re-counted them, and the epoch its places are counted in now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Admission {
    pub decision: Decision,
    pub dropped: u64,
    pub epoch: u64,
}

impl Concurrency {
    /// Admits `cost` units if the key's count in flight stays within `limit` (the
    /// rule's `max_in_flight`, or the adaptive limit of the moment, never above it), in
    /// `epoch`, by a worker holding `mine` of the key (given back and re-counted in the
    /// same write, see [`KeyPlaces::apply`]). Returns the decision, with the units of
    /// other places dropped, and the state to store (`None` when nothing changes).
    pub fn admit(
        &self,
        state: Option<SlotState>,
        mine: KeyPlaces,
        epoch: u64,
        limit: u64,
        cost: u64,
    ) -> (Admission, Option<SlotState>) {
        let limit = limit.min(self.max_in_flight);
        let (mut s, dropped) = mine.apply(state, epoch);
        let in_flight = s.total();
        let after = in_flight.saturating_add(cost);
        if after <= limit {
            let decision = Decision {
                allowed: true,
                limit,
                remaining: limit - after,
                retry_after_ns: None,
                reset_after_ns: 0,
            };
            s.current = s.current.saturating_add(cost);
            return (
                Admission {
                    decision,
                    dropped,
                    epoch: s.epoch,
                },
                Some(s.state()),
            );
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
        // Denied, but the worker's own places may still have to be written.
        let next = (!mine.up_to_date_in(epoch)).then(|| s.state());
        let admission = Admission {
            decision,
            dropped,
            epoch: s.epoch,
        };
        (admission, next)
    }

    /// The key's state once the worker holding `mine` gave its ended places back and
    /// re-counted its open ones in `epoch` (`None`: nothing to write), and the units of
    /// other places dropped.
    pub fn give_back(
        &self,
        state: Option<SlotState>,
        mine: KeyPlaces,
        epoch: u64,
    ) -> (Option<SlotState>, u64) {
        if mine.up_to_date_in(epoch) {
            return (None, 0);
        }
        let (s, dropped) = mine.apply(state, epoch);
        if state.is_none() && s.total() == 0 {
            // The key lost its slot and nothing of it is open: nothing to keep.
            return (None, dropped);
        }
        (Some(s.state()), dropped)
    }

    /// Units in flight at `now_us`: what a slot table must not throw away.
    pub fn in_use(state: SlotState, now_us: u64) -> u64 {
        InFlight::from_state(Some(state))
            .at(place_epoch(now_us))
            .0
            .total()
    }

    /// A key with nothing in flight carries no information; one with requests in flight
    /// carries it until its places would be dropped.
    pub fn idle_at_us(state: SlotState) -> u64 {
        InFlight::from_state(Some(state)).idle_at_us()
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

    const E: u64 = 100;

    fn decide(
        c: &Concurrency,
        state: Option<SlotState>,
        mine: KeyPlaces,
        epoch: u64,
        limit: u64,
        cost: u64,
    ) -> (Decision, Option<SlotState>) {
        let (admission, next) = c.admit(state, mine, epoch, limit, cost);
        (admission.decision, next)
    }

    fn back(
        c: &Concurrency,
        state: Option<SlotState>,
        mine: KeyPlaces,
        epoch: u64,
    ) -> Option<SlotState> {
        c.give_back(state, mine, epoch).0
    }

    /// A worker holding `counted` units of a key, counted in `epoch`.
    fn holding(counted: u64, epoch: u64) -> KeyPlaces {
        KeyPlaces {
            counted,
            ended: 0,
            epoch,
        }
    }

    /// A key with `current` units counted in `epoch`.
    fn counted(current: u64, epoch: u64) -> SlotState {
        InFlight {
            current,
            previous: 0,
            epoch,
        }
        .state()
    }

    /// One worker: admits `cost`, and its places after.
    fn admit(
        c: &Concurrency,
        state: Option<SlotState>,
        mine: KeyPlaces,
        max: u64,
        cost: u64,
    ) -> (Decision, Option<SlotState>, KeyPlaces) {
        let (d, next) = decide(c, state, mine, E, max, cost);
        let mine = if next.is_some() {
            mine.wrote(if d.allowed { cost } else { 0 }, E)
        } else {
            mine
        };
        (d, next.or(state), mine)
    }

    #[test]
    fn admits_up_to_the_limit_and_frees_on_give_back() {
        let c = limit(3);
        let (mut state, mut mine) = (None, KeyPlaces::default());
        for expected_remaining in [2, 1, 0] {
            let (d, next, held) = admit(&c, state, mine, 3, 1);
            assert!(d.allowed);
            assert_eq!(d.remaining, expected_remaining);
            (state, mine) = (next, held);
        }
        let (denied, unchanged) = decide(&c, state, mine, E, 3, 1);
        assert!(!denied.allowed);
        assert_eq!(unchanged, None);
        assert_eq!(denied.retry_after_ns, Some(1_000_000_000));
        mine = mine.ended(1);
        state = back(&c, state, mine, E);
        mine = mine.wrote(0, E);
        assert_eq!(InFlight::from_state(state).total(), 2);
        assert_eq!(mine.counted, 2);
        assert!(decide(&c, state, mine, E, 3, 1).0.allowed);
    }

    #[test]
    fn costs_count_as_several_in_flight() {
        let c = limit(10);
        let (d, state, mine) = admit(&c, None, KeyPlaces::default(), 10, 7);
        assert!(d.allowed);
        assert!(!decide(&c, state, mine, E, 10, 4).0.allowed);
        // A cost above the limit never fits: no retry.
        assert_eq!(
            decide(&c, None, KeyPlaces::default(), E, 10, 11)
                .0
                .retry_after_ns,
            None
        );
        // Above an adaptive limit that is lower for now, it fits later: a retry.
        let (d, _) = decide(&c, None, KeyPlaces::default(), E, 3, 5);
        assert!(!d.allowed);
        assert_eq!(d.retry_after_ns, Some(1_000_000_000));
        // A limit above max_in_flight (an adaptive limit from before a reload) is
        // clamped.
        assert_eq!(decide(&c, None, KeyPlaces::default(), E, 50, 1).0.limit, 10);
    }

    #[test]
    fn places_nobody_recounts_are_dropped_after_one_to_two_epochs() {
        let c = limit(4);
        // A worker that died holding 3, counted in epoch E.
        let dead = counted(3, E);
        let other = KeyPlaces::default();
        // Next epoch: still counted (as previous).
        let (d, _) = decide(&c, Some(dead), other, E + 1, 4, 2);
        assert!(!d.allowed);
        // The epoch after: dropped.
        let (a, next) = c.admit(Some(dead), other, E + 2, 4, 2);
        assert!(a.decision.allowed);
        assert_eq!(a.dropped, 3);
        assert_eq!(InFlight::from_state(next).total(), 2);
        assert_eq!(Concurrency::idle_at_us(dead), (E + 2) * PLACE_EPOCH_US);
    }

    #[test]
    fn a_live_worker_recounts_its_places_into_the_current_epoch() {
        let c = limit(4);
        let mine = holding(3, E);
        let state = Some(counted(3, E));
        let refreshed = back(&c, state, mine, E + 1);
        let s = InFlight::from_state(refreshed);
        assert_eq!((s.current, s.previous, s.epoch), (3, 0, E + 1));
        let mine = mine.wrote(0, E + 1);
        // Two epochs later they are still there.
        let (d, _) = decide(&c, refreshed, KeyPlaces::default(), E + 2, 4, 2);
        assert!(!d.allowed);
        // Late by an epoch (the worker stalled): they were dropped, and come back.
        let late = back(&c, Some(counted(0, 0)), mine, E + 3);
        assert_eq!(InFlight::from_state(late).current, 3);
    }

    #[test]
    fn a_give_back_never_goes_below_zero() {
        let c = limit(2);
        let mine = holding(1, E).ended(5);
        assert_eq!(mine.ended, 1);
        // The key lost its slot: nothing to write.
        assert_eq!(back(&c, None, mine, E), None);
        let state = back(&c, Some(SlotState { a: 0, b: E }), mine, E).unwrap();
        assert_eq!(InFlight::from_state(Some(state)).total(), 0);
        assert_eq!(Concurrency::idle_at_us(state), 0);
        assert_eq!(
            Concurrency::in_use(SlotState { a: 3, b: E }, E * PLACE_EPOCH_US),
            3
        );
        assert_eq!(
            Concurrency::in_use(SlotState { a: 3, b: E }, (E + 2) * PLACE_EPOCH_US),
            0
        );
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
