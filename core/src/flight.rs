//! Bridge calls in flight in this VM, one per key at a time (single flight).
//!
//! A request whose global rules all miss, for keys a call of this VM is already asking
//! about, waits for that call instead of sending its own: when the answer has been
//! written to the lease table, the waiting request looks again and is served from what
//! the call brought back (or denied by it), and sends a call of its own only if it still
//! misses. So a burst of requests for one key costs one call per worker, not one per
//! request. Only rules with leases share calls: an exact rule's answer is for its own
//! request alone.
//!
//! Every call made here is Envoy's call of the plugin's root context, which outlives the
//! request that made it, so its answer always arrives (a 504 when it times out) and is
//! routed by token: the call's evaluation is completed even if its request is gone, so
//! what Redis granted is never lost, and its waiters are woken either way.
//!
//! A call holds at most [`MAX_WAITERS`] waiters, so that one answer wakes a bounded
//! number of requests. A request that finds the call for its keys full makes a call of
//! its own, which the key's next requests join instead: a crowd on one key costs a call
//! per [`MAX_WAITERS`] requests, each decided by Redis. A full waiter list is not an
//! outage, and never takes a rule into its failure mode. What bounds the calls in flight
//! is the bridge cluster's circuit breaker (`max_requests`): a call Envoy refuses for it
//! denies its request (see [`crate::wire::ReplyError::Overflow`]).

use crate::engine::{Evaluation, PendingItem};
use crate::key::KeyHash;
use crate::rules::RuleId;
use crate::time::Micros;
use std::collections::HashMap;

/// Requests that may wait on one call.
pub const MAX_WAITERS: usize = 64;
/// Calls in flight in one VM at once that others may join (more are still made, just
/// not shared).
pub const MAX_SHARED_CALLS: usize = 4_096;

/// A key of a global rule, as calls share it.
pub type FlightKey = (RuleId, KeyHash);

/// A call in flight.
#[derive(Debug)]
pub struct Call {
    /// The request that made it (it may be gone by the time the answer comes).
    pub owner: u32,
    /// When the call left, µs.
    pub sent_at: Micros,
    /// The owner's evaluation, completed with the answer.
    pub eval: Evaluation,
    /// The keys it asks about that other requests may wait on.
    pub keys: Vec<FlightKey>,
    /// Requests waiting on it, by context id.
    pub waiters: Vec<u32>,
    /// Sent once more after Envoy could not deliver it (see
    /// [`crate::engine::Engine::resend_timeout_ms`]).
    pub resent: bool,
}

/// Where a request with pending rules stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Join {
    /// Another call asks about every one of its keys: it waits on that call (token).
    Waiting(u32),
    /// No call with room for a waiter covers its keys: it must make its own.
    Alone,
}

/// The calls of one plugin in one VM, each known by the token of its first send: a call
/// sent once more stays joinable under it, and its waiters keep it.
#[derive(Debug, Default)]
pub struct Flights {
    calls: HashMap<u32, Call>,
    by_key: HashMap<FlightKey, u32>,
    /// Calls sent once more: the first token, by the token of the second send.
    resent: HashMap<u32, u32>,
}

impl Flights {
    /// Makes `waiter` wait on the call that covers all of `pending` (which all share
    /// calls), if one does.
    pub fn join(
        &mut self,
        waiter: u32,
        pending: &[PendingItem],
        shared: impl Fn(RuleId) -> bool,
    ) -> Join {
        if pending.is_empty() || !pending.iter().all(|item| shared(item.rule)) {
            return Join::Alone;
        }
        let mut token = None;
        for item in pending {
            match (self.by_key.get(&(item.rule, item.hash)), token) {
                (Some(&t), None) => token = Some(t),
                (Some(&t), Some(seen)) if t == seen => {}
                _ => return Join::Alone,
            }
        }
        let Some(call) = token.and_then(|t| self.calls.get_mut(&t)) else {
            return Join::Alone;
        };
        if call.waiters.len() >= MAX_WAITERS {
            // Its own call, which the next requests of these keys join.
            return Join::Alone;
        }
        call.waiters.push(waiter);
        token.map_or(Join::Alone, Join::Waiting)
    }

    /// Registers a call just made: its keys that share calls become joinable, unless
    /// another call with room for waiters already asks about them.
    pub fn start(&mut self, token: u32, call: Call) {
        if self.calls.len() < MAX_SHARED_CALLS {
            for key in &call.keys {
                let joinable = self.by_key.get(key).is_some_and(|t| {
                    self.calls
                        .get(t)
                        .is_some_and(|c| c.waiters.len() < MAX_WAITERS)
                });
                if !joinable {
                    self.by_key.insert(*key, token);
                }
            }
        }
        self.calls.insert(token, call);
    }

    /// The call whose answer (to its first send or its second) is `token`.
    pub fn get(&self, token: u32) -> Option<&Call> {
        self.calls.get(&self.first_token(token))
    }

    /// The call answered as `token` was sent once more as `again`: it stays in flight,
    /// joinable, with its waiters. False (nothing changed) when no such call is in flight.
    pub fn resend(&mut self, token: u32, again: u32) -> bool {
        let first = self.first_token(token);
        let Some(call) = self.calls.get_mut(&first) else {
            return false;
        };
        call.resent = true;
        self.resent.remove(&token);
        self.resent.insert(again, first);
        true
    }

    fn first_token(&self, token: u32) -> u32 {
        self.resent.get(&token).copied().unwrap_or(token)
    }

    /// The call whose answer arrived: no longer joinable.
    pub fn land(&mut self, token: u32) -> Option<Call> {
        let token = self.resent.remove(&token).unwrap_or(token);
        let call = self.calls.remove(&token)?;
        for key in &call.keys {
            if self.by_key.get(key) == Some(&token) {
                self.by_key.remove(key);
            }
        }
        Some(call)
    }

    /// A request that is gone stops waiting.
    pub fn forget_waiter(&mut self, token: u32, waiter: u32) {
        if let Some(call) = self.calls.get_mut(&token) {
            call.waiters.retain(|&w| w != waiter);
        }
    }

    pub fn in_flight(&self) -> usize {
        self.calls.len()
    }
}

#[cfg(test)]
mod tests {
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    use super::*;
    use crate::engine::RuleReport;

    fn item(rule: u16, key: u64) -> PendingItem {
        PendingItem {
            rule: RuleId(rule),
            hash: KeyHash {
                set_hash: key,
                fingerprint: key,
            },
            descriptor: Vec::new(),
            cost: 1,
            want: 1,
            reserve: 0,
            last_known: None,
            asking_until_us: 0,
            clamp_prompt: None,
            lookup: RuleReport::new(RuleId(rule), 0),
            limit: None,
            share: None,
        }
    }

    fn call(owner: u32, items: &[PendingItem]) -> Call {
        Call {
            owner,
            sent_at: Micros::ZERO,
            eval: Evaluation::default(),
            keys: items.iter().map(|i| (i.rule, i.hash)).collect(),
            waiters: Vec::new(),
            resent: false,
        }
    }

    #[test]
    fn requests_wait_on_a_call_that_covers_all_their_keys() {
        let mut flights = Flights::default();
        let all = |_| true;
        flights.start(7, call(1, &[item(0, 10), item(1, 20)]));
        assert_eq!(flights.join(2, &[item(0, 10)], all), Join::Waiting(7));
        assert_eq!(
            flights.join(3, &[item(0, 10), item(1, 20)], all),
            Join::Waiting(7)
        );
        assert_eq!(
            flights.join(4, &[item(0, 10), item(2, 30)], all),
            Join::Alone
        );
        assert_eq!(flights.join(5, &[item(0, 11)], all), Join::Alone);
        assert_eq!(
            flights.join(6, &[item(0, 10)], |_| false),
            Join::Alone,
            "exact rules"
        );
        flights.forget_waiter(7, 3);
        let landed = flights.land(7).unwrap();
        assert_eq!(landed.waiters, [2]);
        assert_eq!(flights.join(8, &[item(0, 10)], all), Join::Alone, "landed");
    }

    #[test]
    fn a_call_sent_once_more_keeps_its_token_its_keys_and_its_waiters() {
        let mut flights = Flights::default();
        let all = |_| true;
        flights.start(7, call(1, &[item(0, 10)]));
        assert_eq!(flights.join(2, &[item(0, 10)], all), Join::Waiting(7));
        assert!(flights.resend(7, 12));
        assert!(flights.get(12).is_some_and(|c| c.resent));
        assert!(flights.get(7).is_some(), "known by its first token");
        assert_eq!(
            flights.join(3, &[item(0, 10)], all),
            Join::Waiting(7),
            "still joinable"
        );
        flights.forget_waiter(7, 2);
        let landed = flights.land(12).unwrap();
        assert_eq!((landed.owner, landed.waiters), (1, vec![3]));
        assert!(flights.get(12).is_none() && flights.get(7).is_none());
        assert_eq!(flights.join(4, &[item(0, 10)], all), Join::Alone, "landed");
        assert!(!flights.resend(12, 13), "nothing in flight");
        assert_eq!(flights.in_flight(), 0);
    }

    #[test]
    fn a_full_call_sends_the_next_request_on_a_call_of_its_own_that_others_join() {
        let mut flights = Flights::default();
        flights.start(1, call(1, &[item(0, 10)]));
        for w in 0..MAX_WAITERS as u32 {
            assert_eq!(
                flights.join(100 + w, &[item(0, 10)], |_| true),
                Join::Waiting(1)
            );
        }
        assert_eq!(flights.join(999, &[item(0, 10)], |_| true), Join::Alone);
        flights.start(2, call(999, &[item(0, 10)]));
        assert_eq!(
            flights.join(1_000, &[item(0, 10)], |_| true),
            Join::Waiting(2),
            "the key's next request waits on the new call"
        );
        // The full call lands: its waiters are woken, the new call stays joinable.
        assert_eq!(flights.land(1).unwrap().waiters.len(), MAX_WAITERS);
        assert_eq!(
            flights.join(1_001, &[item(0, 10)], |_| true),
            Join::Waiting(2)
        );
        assert_eq!(flights.land(2).unwrap().waiters, [1_000, 1_001]);
        assert_eq!(flights.in_flight(), 0);
    }
}
