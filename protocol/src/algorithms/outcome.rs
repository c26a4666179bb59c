//! What decisions and grants answer, named as clients and the bridge see them.

use super::GlobalLimit;

/// The outcome of one decision, named as clients see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    pub allowed: bool,
    pub limit: u64,
    pub remaining: u64,
    /// Set only when denied and a later retry can succeed.
    pub retry_after_ns: Option<u64>,
    pub reset_after_ns: u64,
}

/// The 16 bytes of per-key state every slot algorithm fits in, stored in a shared-data
/// slot (and mirrored by the Redis scripts). What `a` and `b` mean is the algorithm's
/// business; `from_slot`/`to_slot` on each state type are the only translators.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SlotState {
    pub a: u64,
    pub b: u64,
}

/// What the `RateLimit-Policy` header advertises: `quota` units per `window`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    pub quota: u64,
    pub window_ns: u64,
}

/// A request held instead of denied: its slot in the key's schedule is taken, so it
/// is admitted when released in `[due_us, release_by_us]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hold {
    /// The first instant (µs since the epoch) at which the request fits.
    pub due_us: u64,
    /// The last instant it may be released; later, its slot is lost and the request
    /// is decided again.
    pub release_by_us: u64,
}

/// A worker never takes more than this fraction (1 / `RESERVOIR_SHARE`) of what a key
/// has left, whatever its demand, and nothing once half the limit or less is left:
/// near the limit every request decides in shared data, exactly.
pub const RESERVOIR_SHARE: u64 = 8;

/// What a worker asks to take ahead of its requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ahead {
    /// Most units beyond the request's own.
    pub max: u64,
    /// The worker's recent demand for the key, units per second.
    pub demand_per_s: u64,
    /// Longest the worker may keep a unit, µs.
    pub hold_us: u64,
}

/// Units taken ahead of requests for one worker's reservoir.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TakenAhead {
    pub units: u64,
    /// How long after the take each may be spent, ns.
    pub valid_ns: u64,
}

/// Units reserved on a key's future schedule: `units` units, the first due `due_ns`
/// from now (negative: already due), each next `spacing_ns` after the previous.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reservation {
    pub units: u64,
    pub due_ns: i64,
    pub spacing_ns: u64,
}

/// What one bridge item asks of a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ask {
    /// Units the request needs now (≥ 1; 0 only peeks).
    pub cost: u64,
    /// Units to take now if they are there (≥ `cost`): a lease.
    pub want: u64,
    /// Units to reserve from the future schedule when `cost` does not fit now (0: none).
    pub reserve: u64,
    /// How long after its due time a unit may be spent (µs): the lease's ttl.
    pub ttl_us: u64,
    /// How far ahead reserved units may be due (µs).
    pub horizon_us: u64,
}

impl Ask {
    /// One request of `cost`, nothing ahead: what an exact call asks.
    pub fn exact(cost: u64) -> Ask {
        Ask {
            cost,
            want: cost,
            reserve: 0,
            ttl_us: 0,
            horizon_us: 0,
        }
    }

    /// The same, taking up to `want` now.
    pub fn with_want(self, want: u64) -> Ask {
        Ask { want, ..self }
    }
}

/// What a key grants one [`Ask`]: the request's decision, and the units consumed for
/// this caller with the times they may be spent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grant {
    /// The decision for the request's cost, now.
    pub decision: Decision,
    /// Units consumed in the key's state for this caller (the request's own included
    /// when allowed); 0 when nothing was.
    pub granted: u64,
    /// When the granted units are due, from now (≤ 0: now): unit `i` (from 0) is due
    /// at `due_ns + i × spacing_ns`.
    pub due_ns: i64,
    pub spacing_ns: u64,
    /// How long after its due time each unit may be spent.
    pub valid_ns: u64,
}

impl Grant {
    /// A denial that grants nothing.
    pub fn denied(decision: Decision) -> Grant {
        Grant {
            decision,
            granted: 0,
            due_ns: 0,
            spacing_ns: 0,
            valid_ns: 0,
        }
    }
}

/// What a global rule's lease costs its key in Redis ([`super::Algorithm::lease_cost`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseCost {
    /// Nothing: the algorithm's own bound caps how long a leased unit lives.
    Free,
    /// `units` of the burst: a unit spent up to the ttl after it was counted must have
    /// been paid for when it was, so Redis decides with `limit`, the burst reduced by
    /// them.
    Burst { units: u64, limit: GlobalLimit },
    /// The ttl costs `units` of the burst, one unit per `per_unit_us`, and the burst has
    /// only `burst` (at most `affordable_us` of ttl), or the ttl is 0.
    Unaffordable {
        units: u64,
        burst: u64,
        per_unit_us: u64,
        affordable_us: u64,
    },
}
