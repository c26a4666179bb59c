//! What one Envoy holds for one key of a global rule, kept in a slot of the rule's
//! lease table in shared data: units Redis granted ahead of requests, a cached denial,
//! the Envoy's recent demand for the key, and what Redis said last.
//!
//! **Units held.** Redis consumes units before the filter spends them. Each unit has a
//! *due* time and may be spent from then until `window` after it, never outside: unit `i`
//! (from 0) of what is held is due at `next_due + i × spacing`. A lease (units free now)
//! has them all due at once (`spacing` 0); a reservation of a saturated GCRA key has one
//! due every emission interval. The bridge tells each unit's due time and validity
//! relative to the moment Redis decided, which the filter does not know exactly (it lies
//! between sending the call and receiving the reply), so the filter anchors both ends
//! safely: a unit becomes spendable when it is due counted from the reply's arrival, and
//! expires at its validity counted from the call's departure ([`Held::from_reply`]). So no
//! unit is spent before Redis's due time, nor later than Redis's due time plus the
//! validity, whatever the two clocks say, and a unit not spent in its window is dropped,
//! never carried. Units due at once (a lease) are due when the reply arrived, before
//! anyone could read them: a worker whose request read the clock a moment before another
//! worker stored them may spend them, and its admission counts from their due time
//! ([`Spend::Spent`]'s `at_us`). That is what makes leases conformant (docs/global.md, "What the limit
//! guarantees"): the displacement of every unit is bounded by the rule's hold, which the
//! rule pays for (GCRA: with burst; windows and token buckets: the validity ends with the
//! window or the refill period; the sliding log: Redis logs the unit at its latest spend).
//!
//! **Cached denial.** When Redis says "limited until T" for a request of cost c and
//! grants nothing, requests of cost ≥ c are denied locally until T (a request of a
//! smaller cost may fit, so it asks Redis), and an attacker cannot turn 429s into Redis
//! load.
//!
//! **Demand.** Every request adds its cost to `demand` once (a request that waited on a
//! call and looks again is not counted twice); when the filter asks Redis, the rate
//! `demand / (now − demand_since)` sizes what it asks for — units it can spend within the
//! hold, or reservations over the horizon — and when the call leaves, the count is halved
//! with its age ([`LeaseSlot::asked`]), so the rate decays smoothly instead of
//! restarting. Only a call halves it, not each request that missed: requests waiting on
//! a slow call are demand, and halving at each of them would take the count to nothing
//! and size the next call for one request.
//!
//! ```
//! use weir_core::lease::{Held, LeaseSlot, Spend};
//!
//! let now_us = 1_700_000_000_000_000;
//! let held = Held { count: 2, next_due_ns: now_us * 1_000, spacing_ns: 0, window_us: 10_000 };
//! let slot = LeaseSlot { held, ..LeaseSlot::default() };
//! let (spend, slot) = slot.spend(now_us, 1);
//! assert!(matches!(spend, Spend::Spent { held_left: 1, .. }));
//! let (spend, _) = slot.spend(now_us + 20_000, 1); // past its window: dropped
//! assert!(matches!(spend, Spend::Miss { .. }));
//! ```

/// Units held, and how replies become them.
mod held;

pub use held::Held;

use crate::algorithms::NS_PER_US;
use crate::store::slot_table::{SlotValue, Vacancy};

const LOW_32: u64 = 0xffff_ffff;

/// One key's slot in a lease table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LeaseSlot {
    pub held: Held,
    /// Requests of at least `denied_cost` are denied until `denied_until_us`.
    pub denied_until_us: u64,
    pub denied_cost: u64,
    /// Units this Envoy's requests asked for since `demand_since_us`.
    pub demand: u64,
    pub demand_since_us: u64,
    /// What Redis said last, at `remote_at_us`: units remaining, and ms until the key
    /// resets. For RateLimit headers of lease-served requests and the local fallback.
    pub remote_remaining: u64,
    pub remote_reset_ms: u64,
    pub remote_at_us: u64,
}

impl SlotValue for LeaseSlot {
    const WORDS: usize = 8;

    fn to_words(&self, words: &mut [u64]) {
        let h = &self.held;
        let values = [
            h.count.min(LOW_32) | h.window_us.min(LOW_32) << 32,
            h.next_due_ns,
            h.spacing_ns,
            self.denied_until_us,
            self.denied_cost.min(LOW_32) | self.demand.min(LOW_32) << 32,
            self.demand_since_us,
            self.remote_remaining.min(LOW_32) | self.remote_reset_ms.min(LOW_32) << 32,
            self.remote_at_us,
        ];
        for (dst, value) in words.iter_mut().zip(values) {
            *dst = value;
        }
    }

    fn from_words(words: &[u64]) -> Self {
        let w = |i: usize| words.get(i).copied().unwrap_or(0);
        LeaseSlot {
            held: Held {
                count: w(0) & LOW_32,
                window_us: w(0) >> 32,
                next_due_ns: w(1),
                spacing_ns: w(2),
            },
            denied_until_us: w(3),
            denied_cost: w(4) & LOW_32,
            demand: w(4) >> 32,
            demand_since_us: w(5),
            remote_remaining: w(6) & LOW_32,
            remote_reset_ms: w(6) >> 32,
            remote_at_us: w(7),
        }
    }
}

/// The outcome of serving a request from the slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Spend {
    /// Served from units held; `held_left` remain. The admission counts at `at_us`: now,
    /// or the units' due time if this request read its clock before they were stored.
    Spent { held_left: u64, at_us: u64 },
    /// Units are held but not due yet (a reservation): denied until the request's last
    /// unit is due.
    NotYetDue { retry_after_ns: u64 },
    /// A cached denial holds.
    Denied { retry_after_ns: u64 },
    /// Redis must be asked; `demand_per_s` is this Envoy's recent demand for the key
    /// (units per second; 0 when not known yet).
    Miss { demand_per_s: u64 },
}

/// The shortest span a demand rate is measured over: one request alone is not a rate.
const MIN_DEMAND_SPAN_US: u64 = 1_000;

impl LeaseSlot {
    /// From when the slot carries no information that a fresh one would not: its units
    /// expired and its cached denial over. For takeover and eviction.
    pub fn idle_at_us(&self) -> u64 {
        self.held.expires_us().max(self.denied_until_us)
    }

    /// For the lease table: idle as above, and the units held (paid for in Redis, lost
    /// when the slot is evicted).
    pub fn vacancy(&self) -> Vacancy {
        Vacancy {
            idle_at_us: self.idle_at_us(),
            in_use: self.held.count,
        }
    }

    /// The slot with the units whose window ended before `now_us` dropped, and how many
    /// were: what a sweep writes so that units nobody spends leave the count of units
    /// outstanding when they expire, not when the key is next asked about.
    pub fn expire(mut self, now_us: u64) -> (LeaseSlot, u64) {
        let before = self.held.count;
        self.held.drop_expired(now_us);
        (self, before.saturating_sub(self.held.count))
    }

    /// Serves a request of `cost` units at `now_us`. Returns the outcome and the slot
    /// with the request counted in its demand (the caller decides whether to write it:
    /// see `UnwrittenDemand`).
    pub fn spend(self, now_us: u64, cost: u64) -> (Spend, LeaseSlot) {
        self.spend_with_demand(now_us, cost, cost)
    }

    /// [`LeaseSlot::spend`], adding `demand` units to the slot's demand instead of the
    /// request's cost: with requests this worker denied from the slot without writing
    /// it, or nothing for a request looking again after waiting on a call (it was counted
    /// when it first looked).
    pub fn spend_with_demand(mut self, now_us: u64, cost: u64, demand: u64) -> (Spend, LeaseSlot) {
        if self.demand_since_us == 0 || self.demand_since_us > now_us {
            self.demand_since_us = now_us;
            self.demand = 0;
        }
        self.demand = self.demand.saturating_add(demand).min(LOW_32);
        self.held.drop_expired(now_us);
        let now_ns = now_us.saturating_mul(NS_PER_US);
        if cost > 0 && self.held.count >= cost && self.held.can_serve(cost) {
            let last_due = self.held.due_ns(cost - 1);
            // A lease is due on arrival; reserved units when their time comes.
            if last_due <= now_ns || self.held.spacing_ns == 0 {
                let at_us = now_us.max(last_due.div_ceil(NS_PER_US));
                self.held.count -= cost;
                self.held.next_due_ns = self.held.due_ns(cost);
                let held_left = self.held.count;
                if held_left == 0 {
                    self.held = Held::default();
                }
                return (Spend::Spent { held_left, at_us }, self);
            }
            let retry_after_ns = last_due - now_ns;
            return (Spend::NotYetDue { retry_after_ns }, self);
        }
        if now_us < self.denied_until_us && cost >= self.denied_cost {
            let retry_after_ns = (self.denied_until_us - now_us).saturating_mul(NS_PER_US);
            return (Spend::Denied { retry_after_ns }, self);
        }
        let span_us = now_us - self.demand_since_us;
        let demand_per_s = if span_us == 0 {
            0
        } else {
            let per_s =
                u128::from(self.demand) * 1_000_000 / u128::from(span_us.max(MIN_DEMAND_SPAN_US));
            u64::try_from(per_s).unwrap_or(u64::MAX)
        };
        (Spend::Miss { demand_per_s }, self)
    }

    /// A call about the key left at `now_us`: the demand count is halved with its age, so
    /// the rate it measured is kept but weighs less in the next call's.
    pub fn asked(mut self, now_us: u64) -> LeaseSlot {
        if self.demand_since_us == 0 || self.demand_since_us > now_us {
            return self;
        }
        let span_us = now_us - self.demand_since_us;
        self.demand /= 2;
        self.demand_since_us = now_us - span_us / 2;
        self
    }

    /// While a call about a saturated key is in flight: requests of at least `cost` are
    /// denied until `until_us` (the call's deadline), so the key's other requests, on
    /// every worker, are answered at once instead of waiting on the call or making their
    /// own: a saturated key's call brings back at most a reservation, whose first unit
    /// one request spends while the others would get a 429 after the round trip. A
    /// longer cached denial stays as it is.
    pub fn deny_while_asking(mut self, cost: u64, until_us: u64) -> LeaseSlot {
        if until_us > self.denied_until_us {
            self.denied_until_us = until_us;
            self.denied_cost = cost.min(LOW_32);
        }
        self
    }

    /// Ends the denial [`LeaseSlot::deny_while_asking`] set until `until_us`, if it is
    /// still the slot's: the call landed or failed. Returns `None` when nothing changed.
    pub fn stop_denying_for(mut self, until_us: u64) -> Option<LeaseSlot> {
        (until_us != 0 && self.denied_until_us == until_us).then(|| {
            self.denied_until_us = 0;
            self
        })
    }

    /// Records a reply in the slot: units granted beyond the request's own are
    /// held (`held`), or a denial is cached for requests of at least `cost` until
    /// `denied_until_us`; and what Redis said is remembered.
    pub fn record(mut self, reply: SlotReply, now_us: u64) -> LeaseSlot {
        self.held.drop_expired(now_us);
        match reply.outcome {
            SlotReplyOutcome::Held(held) => {
                self.held = self.held.merge(held);
                self.denied_until_us = 0;
            }
            SlotReplyOutcome::Denied { until_us, cost } => {
                // Units already held stay: they are paid for in Redis.
                self.denied_until_us = until_us;
                self.denied_cost = cost;
            }
            SlotReplyOutcome::Nothing => {}
        }
        if reply.exhausted_until_us > self.denied_until_us {
            self.denied_until_us = reply.exhausted_until_us;
            self.denied_cost = 1;
        }
        self.remote_remaining = reply.remaining.min(LOW_32);
        self.remote_reset_ms = reply.reset_after_ns.div_ceil(1_000_000).min(LOW_32);
        self.remote_at_us = now_us;
        self
    }

    /// The global quota as this Envoy last knew it, at `now_us`: units remaining (what
    /// Redis had left plus what this Envoy holds) and ns until the key resets.
    pub fn remote_view(&self, now_us: u64) -> (u64, u64) {
        let reset_at_us = self
            .remote_at_us
            .saturating_add(self.remote_reset_ms.saturating_mul(1_000));
        let remaining = self.remote_remaining.saturating_add(self.held.count);
        (
            remaining,
            reset_at_us.saturating_sub(now_us).saturating_mul(NS_PER_US),
        )
    }
}

/// A reply for one key as the slot keeps it: the bridge's (a lease), or for a reservoir what
/// the key's slot in shared data gave.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotReply {
    pub outcome: SlotReplyOutcome,
    /// Requests its held units cannot serve are denied until then (0: none): a key that
    /// Redis said is exhausted is not asked about again sooner.
    pub exhausted_until_us: u64,
    pub remaining: u64,
    pub reset_after_ns: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotReplyOutcome {
    /// Units to hold (a lease's leftover, or a reservation).
    Held(Held),
    /// Deny requests of at least `cost` until `until_us`.
    Denied { until_us: u64, cost: u64 },
    /// Nothing to keep (an exact call that was allowed).
    Nothing,
}

fn clamp_u64(x: i128) -> u64 {
    u64::try_from(x.max(0)).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    use super::held::fixtures::{held, MS, NOW};
    use super::*;

    #[test]
    fn slots_round_trip_through_words() {
        let slot = LeaseSlot {
            held: held(7, NOW, 3, 500),
            denied_until_us: NOW + 9,
            denied_cost: 4,
            demand: 99,
            demand_since_us: NOW - 5,
            remote_remaining: 12,
            remote_reset_ms: 345,
            remote_at_us: NOW - 1,
        };
        let mut words = [0; LeaseSlot::WORDS];
        slot.to_words(&mut words);
        assert_eq!(LeaseSlot::from_words(&words), slot);
        assert_eq!(LeaseSlot::from_words(&[0; 8]), LeaseSlot::default());
    }

    #[test]
    fn a_lease_is_spent_within_its_window_only() {
        let slot = LeaseSlot {
            held: held(3, NOW, 0, 10 * MS),
            ..LeaseSlot::default()
        };
        let (spend, slot) = slot.spend(NOW, 2);
        assert_eq!(
            spend,
            Spend::Spent {
                held_left: 1,
                at_us: NOW
            }
        );
        let (spend, after) = slot.spend(NOW + 10 * MS, 1);
        assert_eq!(
            spend,
            Spend::Spent {
                held_left: 0,
                at_us: NOW + 10 * MS
            },
            "the last µs of the window"
        );
        assert_eq!(after.held, Held::default());
        let (spend, _) = slot.spend(NOW + 10 * MS + 1, 1);
        assert!(matches!(spend, Spend::Miss { .. }), "expired: dropped");
    }

    #[test]
    fn reserved_units_are_spent_at_their_due_times() {
        // Four units due every 2 ms from NOW + 1 ms, each valid 3 ms after its due time.
        let slot = LeaseSlot {
            held: held(4, NOW + MS, 2 * MS, 3 * MS),
            ..LeaseSlot::default()
        };
        let (spend, slot) = slot.spend(NOW, 1);
        assert_eq!(
            spend,
            Spend::NotYetDue {
                retry_after_ns: 1_000_000
            }
        );
        let (spend, slot) = slot.spend(NOW + MS, 1);
        assert_eq!(
            spend,
            Spend::Spent {
                held_left: 3,
                at_us: NOW + MS
            }
        );
        // Two units at once need the second's due time (NOW + 5 ms).
        let (spend, slot) = slot.spend(NOW + 3 * MS, 2);
        assert_eq!(
            spend,
            Spend::NotYetDue {
                retry_after_ns: 2_000_000
            }
        );
        // At NOW + 9 ms the units due at NOW + 3 ms and NOW + 5 ms have expired (their
        // windows ended at NOW + 6 ms and NOW + 8 ms): only the one due at NOW + 7 ms is
        // left.
        let (spend, slot) = slot.spend(NOW + 9 * MS, 1);
        assert_eq!(
            spend,
            Spend::Spent {
                held_left: 0,
                at_us: NOW + 9 * MS
            }
        );
        assert_eq!(slot.held, Held::default());
    }

    #[test]
    fn a_lease_stored_after_a_request_read_its_clock_is_spent_at_its_due_time() {
        // Another worker stored a lease due at NOW + 5 µs; this request read NOW.
        let slot = LeaseSlot {
            held: held(2, NOW + 5, 0, 10 * MS),
            ..LeaseSlot::default()
        };
        let (spend, _) = slot.spend(NOW, 1);
        assert_eq!(
            spend,
            Spend::Spent {
                held_left: 1,
                at_us: NOW + 5
            }
        );
    }

    #[test]
    fn denials_hold_for_the_cost_that_was_denied_and_above() {
        let slot = LeaseSlot::default().record(
            SlotReply {
                outcome: SlotReplyOutcome::Denied {
                    until_us: NOW + 5 * MS,
                    cost: 10,
                },
                exhausted_until_us: 0,
                remaining: 3,
                reset_after_ns: 1,
            },
            NOW,
        );
        let (spend, _) = slot.spend(NOW + MS, 10);
        assert_eq!(
            spend,
            Spend::Denied {
                retry_after_ns: 4_000_000
            }
        );
        let (spend, _) = slot.spend(NOW + MS, 11);
        assert!(matches!(spend, Spend::Denied { .. }));
        let (spend, _) = slot.spend(NOW + MS, 1);
        assert!(
            matches!(spend, Spend::Miss { .. }),
            "a smaller cost may fit"
        );
        let (spend, _) = slot.spend(NOW + 5 * MS, 10);
        assert!(matches!(spend, Spend::Miss { .. }), "over at until");
    }

    #[test]
    fn demand_is_a_rate_that_decays_at_each_call_not_at_each_miss() {
        // 99 units held; 100 requests over 9.9 ms: the last one misses, at 10,101 per second.
        let mut slot = LeaseSlot {
            held: held(99, NOW, 0, 60_000 * MS),
            ..LeaseSlot::default()
        };
        for i in 0..99 {
            let (spend, next) = slot.spend(NOW + i * 100, 1);
            assert!(matches!(spend, Spend::Spent { .. }));
            slot = next;
        }
        let (spend, slot) = slot.spend(NOW + 9_900, 1);
        assert_eq!(
            spend,
            Spend::Miss {
                demand_per_s: 10_101
            }
        );
        // Requests waiting on the call are demand too: a miss does not halve it.
        assert_eq!(slot.demand, 100);
        let (spend, waiting) = slot.spend(NOW + 10_000, 1);
        assert!(matches!(spend, Spend::Miss { .. }));
        assert_eq!(waiting.demand, 101);
        // When the call leaves.
        let slot = slot.asked(NOW + 9_900);
        assert_eq!(slot.demand, 50, "halved");
        assert_eq!(slot.demand_since_us, NOW + 4_950, "with half its age");
    }
}
