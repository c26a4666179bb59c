//! Leases and cached denials of global rules, kept per key in shared data.
//!
//! A **lease** is a batch of units that Redis already consumed for this Envoy: the
//! filter spends them locally (CAS on a slot, like local rules) without asking the
//! bridge. Every unit is consumed in Redis before it is spent, so over any span the
//! units spent never exceed the units Redis granted; units leased but not spent before
//! the lease expires are lost (*under*-admission). That is a bound on totals only: a
//! unit spent later than Redis counted it can exceed the algorithm's own bound in a
//! shorter interval (docs/global.md, "What the limit guarantees"). A **cached denial** remembers that Redis
//! said "limited until T", so that requests for the key are denied locally until T and
//! an attacker cannot turn 429s into Redis load.
//!
//! Lease size adapts ([`next_want`]): it starts at 1, doubles while requests keep
//! draining full leases, halves when a lease expires with units left (the key is slower
//! than the lease is large), and never asks for more than the global remaining divided
//! by the expected number of Envoys — so near the limit leases shrink to exact (1).
//!
//! Slot layout (two words): a lease is `a = tokens | next_want << 32`, `b = expires_us`;
//! a cached denial is `a = DENIED | reset_at_us`, `b = until_us`; `0, 0` is empty.
//!
//! ```
//! use weir_core::lease::{self, LeaseState, Spend};
//!
//! let now = 1_700_000_000_000_000;
//! let held = LeaseState::Lease { tokens: 3, expires_us: now + 1_000_000, next_want: 8 };
//! let (spend, left) = lease::spend(Some(held.to_slot()), now, 2);
//! assert_eq!(spend, Spend::Spent { tokens_left: 1, expires_us: now + 1_000_000 });
//! let (spend, _) = lease::spend(left, now, 2); // 1 left, 2 wanted: ask the bridge
//! assert_eq!(spend, Spend::Miss { want_hint: 8 });
//! ```

use crate::algorithms::{SlotState, NS_PER_US};

const DENIED: u64 = 1 << 63;
const LOW_32: u64 = 0xffff_ffff;
/// `next_want` is kept below 2^31 so that it never reaches the `DENIED` bit.
const MAX_HINT: u64 = (1 << 31) - 1;

/// What one key's slot holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseState {
    Empty,
    Lease {
        tokens: u64,
        expires_us: u64,
        next_want: u64,
    },
    Denied {
        until_us: u64,
        reset_at_us: u64,
    },
}

impl LeaseState {
    pub fn from_slot(s: SlotState) -> LeaseState {
        if s.a & DENIED != 0 {
            LeaseState::Denied {
                until_us: s.b,
                reset_at_us: s.a & !DENIED,
            }
        } else if s.a == 0 && s.b == 0 {
            LeaseState::Empty
        } else {
            LeaseState::Lease {
                tokens: s.a & LOW_32,
                expires_us: s.b,
                next_want: s.a >> 32,
            }
        }
    }

    pub fn to_slot(self) -> SlotState {
        match self {
            LeaseState::Empty => SlotState::default(),
            LeaseState::Lease {
                tokens,
                expires_us,
                next_want,
            } => SlotState {
                a: tokens.min(LOW_32) | next_want.min(MAX_HINT) << 32,
                b: expires_us,
            },
            LeaseState::Denied {
                until_us,
                reset_at_us,
            } => SlotState {
                a: DENIED | (reset_at_us & !DENIED),
                b: until_us,
            },
        }
    }
}

/// From when a slot's state carries no information (for takeover and eviction).
pub fn idle_at_us(s: SlotState) -> u64 {
    match LeaseState::from_slot(s) {
        LeaseState::Empty => 0,
        LeaseState::Lease { expires_us, .. } => expires_us,
        LeaseState::Denied { until_us, .. } => until_us,
    }
}

/// The outcome of trying to serve a request from the slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Spend {
    /// Served from the lease.
    Spent { tokens_left: u64, expires_us: u64 },
    /// A cached denial holds.
    Denied {
        retry_after_ns: u64,
        reset_after_ns: u64,
    },
    /// The bridge must be asked; `want_hint` is the lease size to ask for.
    Miss { want_hint: u64 },
}

/// Tries to serve `cost` units at `now_us`. Returns the outcome and the state to write
/// (`None`: nothing to write).
pub fn spend(state: Option<SlotState>, now_us: u64, cost: u64) -> (Spend, Option<SlotState>) {
    let state = state.map_or(LeaseState::Empty, LeaseState::from_slot);
    match state {
        LeaseState::Denied {
            until_us,
            reset_at_us,
        } if now_us < until_us => {
            let ns = |us: u64| us.saturating_sub(now_us).saturating_mul(NS_PER_US);
            let spend = Spend::Denied {
                retry_after_ns: ns(until_us),
                reset_after_ns: ns(reset_at_us),
            };
            (spend, None)
        }
        LeaseState::Lease {
            tokens,
            expires_us,
            next_want,
        } if now_us < expires_us => {
            if tokens >= cost {
                let left = LeaseState::Lease {
                    tokens: tokens - cost,
                    expires_us,
                    next_want,
                };
                let write = (cost > 0).then(|| left.to_slot());
                (
                    Spend::Spent {
                        tokens_left: tokens - cost,
                        expires_us,
                    },
                    write,
                )
            } else {
                (
                    Spend::Miss {
                        want_hint: next_want.max(1),
                    },
                    None,
                )
            }
        }
        // An expired lease with units left was too large for this key's pace.
        LeaseState::Lease {
            tokens, next_want, ..
        } if tokens > 0 => (
            Spend::Miss {
                want_hint: (next_want / 2).max(1),
            },
            None,
        ),
        LeaseState::Lease { next_want, .. } => (
            Spend::Miss {
                want_hint: next_want.max(1),
            },
            None,
        ),
        LeaseState::Denied { .. } | LeaseState::Empty => (Spend::Miss { want_hint: 1 }, None),
    }
}

/// The lease size to ask for next time, after asking for `asked` and getting `granted`
/// with `remaining` left in Redis: double when fully granted, but never more than an
/// even share of what remains (`remaining / instances`), at least 1, at most `max`.
pub fn next_want(asked: u64, granted: u64, remaining: u64, instances: u64, max: u64) -> u64 {
    let grown = if granted >= asked {
        asked.saturating_mul(2)
    } else {
        granted.max(1)
    };
    let share = remaining / instances.max(1);
    grown.min(share).clamp(1, max.max(1))
}

/// Adds `tokens` units leased at `now_us`, valid until `expires_us`, to the slot. A live
/// lease keeps its units and the earlier of the two expiries (so no unit outlives the
/// bound of the lease it came from); anything else is replaced.
pub fn merge(
    state: Option<SlotState>,
    now_us: u64,
    tokens: u64,
    expires_us: u64,
    next_want: u64,
) -> SlotState {
    let current = state.map_or(LeaseState::Empty, LeaseState::from_slot);
    let merged = match current {
        LeaseState::Lease {
            tokens: held,
            expires_us: held_until,
            ..
        } if now_us < held_until && held > 0 => LeaseState::Lease {
            tokens: held.saturating_add(tokens),
            expires_us: held_until.min(expires_us),
            next_want,
        },
        _ => LeaseState::Lease {
            tokens,
            expires_us,
            next_want,
        },
    };
    merged.to_slot()
}

/// What a denial from Redis leaves in the slot at `now_us`: a live lease with units left
/// is kept (they are already paid for in Redis; throwing them away would under-admit),
/// anything else becomes the cached denial.
pub fn after_denial(state: Option<SlotState>, now_us: u64, denial: SlotState) -> SlotState {
    match state.map(LeaseState::from_slot) {
        Some(LeaseState::Lease {
            tokens, expires_us, ..
        }) if tokens > 0 && now_us < expires_us => state.unwrap_or(denial),
        _ => denial,
    }
}

/// Remembers a denial: deny locally until `now + retry_after`.
pub fn deny(now_us: u64, retry_after_ns: u64, reset_after_ns: u64) -> SlotState {
    let at = |ns: u64| now_us.saturating_add(ns.div_ceil(NS_PER_US));
    LeaseState::Denied {
        until_us: at(retry_after_ns),
        reset_at_us: at(reset_after_ns),
    }
    .to_slot()
}

#[cfg(test)]
mod tests {
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    use super::*;

    const NOW: u64 = 1_700_000_000_000_000;

    #[test]
    fn states_round_trip() {
        for s in [
            LeaseState::Empty,
            LeaseState::Lease {
                tokens: 5,
                expires_us: NOW,
                next_want: 64,
            },
            LeaseState::Denied {
                until_us: NOW + 1,
                reset_at_us: NOW + 2,
            },
        ] {
            assert_eq!(LeaseState::from_slot(s.to_slot()), s);
        }
    }

    #[test]
    fn leases_are_spent_until_they_expire() {
        let lease = LeaseState::Lease {
            tokens: 2,
            expires_us: NOW + 10,
            next_want: 4,
        }
        .to_slot();
        let (s, w) = spend(Some(lease), NOW, 2);
        assert_eq!(
            s,
            Spend::Spent {
                tokens_left: 0,
                expires_us: NOW + 10
            }
        );
        assert!(w.is_some());
        assert_eq!(
            spend(Some(lease), NOW + 10, 1).0,
            Spend::Miss { want_hint: 2 },
            "expired unused: halve"
        );
        let drained = LeaseState::Lease {
            tokens: 0,
            expires_us: NOW + 10,
            next_want: 4,
        }
        .to_slot();
        assert_eq!(
            spend(Some(drained), NOW + 20, 1).0,
            Spend::Miss { want_hint: 4 }
        );
        assert_eq!(spend(None, NOW, 1).0, Spend::Miss { want_hint: 1 });
    }

    #[test]
    fn denials_hold_until_retry() {
        let denied = deny(NOW, 1_500, 9_000_000);
        assert_eq!(
            spend(Some(denied), NOW, 1).0,
            Spend::Denied {
                retry_after_ns: 2_000,
                reset_after_ns: 9_000_000
            }
        );
        assert_eq!(
            spend(Some(denied), NOW + 2, 1).0,
            Spend::Miss { want_hint: 1 }
        );
    }

    #[test]
    fn a_denial_never_drops_units_already_leased() {
        let denial = deny(NOW, 1_000, 1_000);
        let held = LeaseState::Lease {
            tokens: 3,
            expires_us: NOW + 10,
            next_want: 4,
        }
        .to_slot();
        assert_eq!(after_denial(Some(held), NOW, denial), held);
        assert_eq!(
            after_denial(Some(held), NOW + 10, denial),
            denial,
            "expired: cache the denial"
        );
        let drained = LeaseState::Lease {
            tokens: 0,
            expires_us: NOW + 10,
            next_want: 4,
        }
        .to_slot();
        assert_eq!(after_denial(Some(drained), NOW, denial), denial);
        assert_eq!(after_denial(None, NOW, denial), denial);
    }

    #[test]
    fn lease_size_adapts() {
        assert_eq!(next_want(8, 8, 1000, 2, 100), 16, "fully granted: double");
        assert_eq!(next_want(64, 64, 1000, 2, 100), 100, "capped by max");
        assert_eq!(
            next_want(64, 64, 10, 2, 100),
            5,
            "near the limit: a fair share"
        );
        assert_eq!(next_want(64, 3, 0, 2, 100), 1, "at the limit: exact");
        assert_eq!(next_want(1, 1, 5, 1, 1), 1, "max 1 is exact");
    }

    #[test]
    fn merging_keeps_live_units_and_the_earlier_expiry() {
        let live = LeaseState::Lease {
            tokens: 3,
            expires_us: NOW + 5,
            next_want: 4,
        }
        .to_slot();
        assert_eq!(
            LeaseState::from_slot(merge(Some(live), NOW, 7, NOW + 9, 8)),
            LeaseState::Lease {
                tokens: 10,
                expires_us: NOW + 5,
                next_want: 8
            }
        );
        assert_eq!(
            LeaseState::from_slot(merge(Some(live), NOW + 6, 7, NOW + 9, 8)),
            LeaseState::Lease {
                tokens: 7,
                expires_us: NOW + 9,
                next_want: 8
            }
        );
    }
}
