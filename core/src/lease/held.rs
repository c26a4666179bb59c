//! Units held: what Redis granted this Envoy for a key ahead of its requests, each unit due at
//! a time and spendable within a window after it (the module above says why), anchored on
//! the call's departure and the reply's arrival, and merged when two replies overlap.

use super::{clamp_u64, LOW_32};
use crate::algorithms::NS_PER_US;

/// Units this Envoy may spend for the key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Held {
    pub count: u64,
    /// When the first of them is due, ns since the epoch (filter clock).
    pub next_due_ns: u64,
    /// Between the due times of consecutive units (0: all due together).
    pub spacing_ns: u64,
    /// How long after its due time each unit may be spent, µs.
    pub window_us: u64,
}

impl Held {
    /// Units granted by a reply: `count` units, the first due `due_ns` after Redis decided
    /// (negative: already due), each next `spacing_ns` later, each valid `valid_ns` after
    /// its due time. Redis decided between `sent_us` and `received_us`: units become
    /// spendable counted from the reply, and expire counted from the call.
    pub fn from_reply(
        count: u64,
        due_ns: i64,
        spacing_ns: u64,
        valid_ns: u64,
        sent_us: u64,
        received_us: u64,
    ) -> Held {
        let received_ns = i128::from(received_us) * i128::from(NS_PER_US);
        let round_trip_ns = i128::from(received_us.saturating_sub(sent_us)) * i128::from(NS_PER_US);
        let window_ns = (i128::from(valid_ns) - round_trip_ns).max(0);
        let held = Held {
            count,
            next_due_ns: clamp_u64(received_ns + i128::from(due_ns)),
            spacing_ns,
            window_us: clamp_u64(window_ns / i128::from(NS_PER_US)).min(LOW_32),
        };
        if held.window_us == 0 {
            // The call took as long as the units were valid: none can be spent.
            return Held::default();
        }
        held
    }

    /// When unit `i` is due, ns.
    pub(super) fn due_ns(&self, i: u64) -> u64 {
        self.next_due_ns
            .saturating_add(i.saturating_mul(self.spacing_ns))
    }

    /// Whether `cost` units can ever be spent together: reserved units come due one
    /// spacing apart, and the first must not expire before the last is due.
    pub(super) fn can_serve(&self, cost: u64) -> bool {
        let spread_ns = u128::from(cost.saturating_sub(1)) * u128::from(self.spacing_ns);
        spread_ns <= u128::from(self.window_us) * u128::from(NS_PER_US)
    }

    /// When the last unit held stops being spendable, µs (0: none held).
    pub fn expires_us(&self) -> u64 {
        if self.count == 0 {
            return 0;
        }
        let last_due_us = self.due_ns(self.count - 1).div_ceil(NS_PER_US);
        last_due_us.saturating_add(self.window_us)
    }

    /// Drops the units whose window ended before `now_us`.
    pub(super) fn drop_expired(&mut self, now_us: u64) {
        if self.count == 0 {
            return;
        }
        let now_ns = u128::from(now_us) * u128::from(NS_PER_US);
        let window_ns = u128::from(self.window_us) * u128::from(NS_PER_US);
        // Unit i has expired when due_i + window < now, i.e. i × spacing < now − window − next_due.
        let Some(late) = now_ns.checked_sub(window_ns + u128::from(self.next_due_ns)) else {
            return;
        };
        if late == 0 {
            return;
        }
        let expired = if self.spacing_ns == 0 {
            u128::from(self.count)
        } else {
            late.div_ceil(u128::from(self.spacing_ns))
        };
        let expired = u64::try_from(expired).unwrap_or(u64::MAX).min(self.count);
        self.count -= expired;
        self.next_due_ns = self.due_ns(expired);
        if self.count == 0 {
            *self = Held::default();
        }
    }

    /// Adds what a reply granted to what is held. Units due at once (leases) stay together:
    /// the later due time and the earlier expiry of the two, so no unit leaves its own
    /// window. Two reservations of one schedule that follow each other (two workers' calls
    /// in flight at once book consecutive slots) become one, each unit at its own due time
    /// or later and expiring no later than its own. Anything else keeps the larger of the
    /// two: one arithmetic sequence is all a slot holds.
    pub(super) fn merge(self, new: Held) -> Held {
        if self.count == 0 {
            return new;
        }
        if new.count == 0 {
            return self;
        }
        let merged = match (self.spacing_ns, new.spacing_ns) {
            (0, 0) => Held::merge_leases(self, new),
            (a, b) if a == b => Held::merge_reservations(self, new),
            _ => None,
        };
        merged.unwrap_or(if new.count >= self.count { new } else { self })
    }

    fn expiry_ns(&self) -> u64 {
        self.next_due_ns
            .saturating_add(self.window_us.saturating_mul(NS_PER_US))
    }

    fn merge_leases(a: Held, b: Held) -> Option<Held> {
        let next_due_ns = a.next_due_ns.max(b.next_due_ns);
        let expiry_ns = a.expiry_ns().min(b.expiry_ns());
        let window_us = expiry_ns.saturating_sub(next_due_ns) / NS_PER_US;
        (window_us > 0).then_some(Held {
            count: a.count.saturating_add(b.count).min(LOW_32),
            next_due_ns,
            spacing_ns: 0,
            window_us,
        })
    }

    /// `a` then `b` as one sequence of `a.count + b.count` slots `spacing` apart, starting
    /// where neither's units come early; `None` when that leaves them less than half of
    /// their windows (they did not follow each other).
    fn merge_reservations(a: Held, b: Held) -> Option<Held> {
        let (first, second) = if a.next_due_ns <= b.next_due_ns {
            (a, b)
        } else {
            (b, a)
        };
        let spacing = u128::from(first.spacing_ns);
        let first_span = u128::from(first.count) * spacing;
        let start = u128::from(first.next_due_ns)
            .max(u128::from(second.next_due_ns).saturating_sub(first_span));
        // Each unit's new due time minus its own: the first's all move by the same
        // amount, the second's too.
        let first_shift = start - u128::from(first.next_due_ns);
        let second_shift = (start + first_span).saturating_sub(u128::from(second.next_due_ns));
        let ns = |us: u64| u128::from(us) * u128::from(NS_PER_US);
        let window_ns = ns(first.window_us)
            .checked_sub(first_shift)?
            .min(ns(second.window_us).checked_sub(second_shift)?);
        let window_us = u64::try_from(window_ns / u128::from(NS_PER_US)).ok()?;
        if window_us == 0 || 2 * window_us < first.window_us.min(second.window_us) {
            return None;
        }
        Some(Held {
            count: first.count.saturating_add(second.count).min(LOW_32),
            next_due_ns: u64::try_from(start).ok()?,
            spacing_ns: first.spacing_ns,
            window_us,
        })
    }
}

/// The lease tests' instants and shorthand.
#[cfg(test)]
pub(super) mod fixtures {
    use super::Held;

    pub const NOW: u64 = 1_700_000_000_000_000;
    pub const MS: u64 = 1_000;

    /// A [`Held`] of `count` units, the first due at `due_us`, each next `spacing_us`
    /// later, each valid `window_us`.
    pub fn held(count: u64, due_us: u64, spacing_us: u64, window_us: u64) -> Held {
        Held {
            count,
            next_due_ns: due_us * 1_000,
            spacing_ns: spacing_us * 1_000,
            window_us,
        }
    }
}

#[cfg(test)]
mod tests {
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    use super::fixtures::{held, MS, NOW};
    use super::*;

    #[test]
    fn replies_are_anchored_so_no_unit_leaves_its_window() {
        // Sent at NOW, received 2 ms later; Redis said: 5 units due 1 ms after it decided,
        // every 1 ms, valid 10 ms each. Spendable from receipt + 1 ms; expiring 10 ms
        // after sending + 1 ms.
        let h = Held::from_reply(5, 1_000_000, 1_000_000, 10_000_000, NOW, NOW + 2 * MS);
        assert_eq!(h, held(5, NOW + 3 * MS, MS, 8 * MS));
        // A round trip as long as the validity leaves nothing spendable.
        assert_eq!(
            Held::from_reply(5, 0, 0, 2_000_000, NOW, NOW + 2 * MS),
            Held::default()
        );
        // Negative due: already due at receipt.
        let h = Held::from_reply(2, -500_000, 0, 4_000_000, NOW, NOW + MS);
        assert_eq!(h.next_due_ns, (NOW + MS) * 1_000 - 500_000);
    }

    #[test]
    fn leases_merge_into_the_tighter_window() {
        let a = held(2, NOW, 0, 10 * MS);
        let b = held(3, NOW + MS, 0, 20 * MS);
        assert_eq!(a.merge(b), held(5, NOW + MS, 0, 9 * MS));
        // A lease and a reservation are not one sequence: the larger stays.
        let r = held(4, NOW + MS, MS, 5 * MS);
        assert_eq!(a.merge(r), r);
        assert_eq!(r.merge(a), r);
    }

    #[test]
    fn reservations_that_follow_each_other_become_one() {
        // Two workers' calls booked slots 0..50 ms and 50..100 ms (1 ms apart); the
        // second reply was anchored 300 µs late.
        let first = held(50, NOW, MS, 20 * MS);
        let second = held(50, NOW + 50 * MS + 300, MS, 20 * MS);
        let one = held(100, NOW + 300, MS, 20 * MS - 300);
        assert_eq!(first.merge(second), one);
        assert_eq!(second.merge(first), one);
        // No unit comes before its own due time nor expires after its own expiry.
        for i in 0..100u64 {
            let own_due_us = if i < 50 {
                NOW + i * MS
            } else {
                NOW + 50 * MS + 300 + (i - 50) * MS
            };
            let due_us = one.next_due_ns / 1_000 + i * MS;
            assert!(due_us >= own_due_us, "unit {i} early");
            assert!(
                due_us + one.window_us <= own_due_us + 20 * MS,
                "unit {i} late"
            );
        }
        // Far apart, they are not one sequence: the larger stays.
        let later = held(10, NOW + 500 * MS, MS, 20 * MS);
        assert_eq!(first.merge(later), first);
    }
}
