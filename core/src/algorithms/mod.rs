//! Rate-limit algorithms as pure functions of `(params, state, now, cost)`.
//!
//! Vocabulary, as users see it in replies and headers:
//!
//! - **limit**: the most a key can ever be allowed at once (GCRA: `burst + 1`; token
//!   bucket: its capacity; windows: the window's limit).
//! - **remaining**: how much more would be allowed right now, after this decision.
//! - **retry_after**: when denied, how long until the same request would be allowed;
//!   `None` when it never can be (its cost is above the limit).
//! - **reset_after**: how long until the key's state carries no information any more
//!   (bucket full again, window over): from then on the key behaves as if never seen.
//! - **TAT** (GCRA): theoretical arrival time, the instant at which the key would be
//!   back to an empty schedule. **Emission interval** `T = period / rate`: the spacing
//!   of requests at exactly the sustained rate. **Tolerance** `τ = T × (burst + 1)`.
//!
//! Nothing here reads a clock, allocates or fails: time enters as `now_us`
//! (microseconds since the Unix epoch) and every decision returns the new state to
//! store, or `None` when nothing must be written (a denial or a peek).
//!
//! ```
//! use weir_core::algorithms::{gcra::Gcra, Limit};
//!
//! // 1 request per second with a burst of 4: five at once, then one a second.
//! let limit = Limit::Gcra(Gcra::new(4, 1, 1_000_000).unwrap());
//! let t0 = 1_700_000_000_000_000;
//! let mut state = None;
//! for _ in 0..5 {
//!     let (decision, next) = limit.decide(state, t0, 1);
//!     assert!(decision.allowed);
//!     state = next;
//! }
//! let (denied, _) = limit.decide(state, t0, 1);
//! assert!(!denied.allowed);
//! assert_eq!(denied.retry_after_ns, Some(1_000_000_000));
//! ```

pub mod fixed_window;
pub mod gcra;
pub mod sliding_log;
pub mod sliding_window;
pub mod token_bucket;

use std::fmt;

/// Nanoseconds in a microsecond.
pub const NS_PER_US: u64 = 1_000;

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

/// The 16 bytes of per-key state every algorithm fits in, stored in a shared-data slot
/// (and mirrored by the Redis scripts). What `a` and `b` mean is the algorithm's
/// business; `from_slot`/`to_slot` on each state type are the only translators.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SlotState {
    pub a: u64,
    pub b: u64,
}

/// The algorithm names, as written in the config and on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AlgorithmKind {
    TokenBucket,
    Gcra,
    FixedWindow,
    SlidingWindow,
    SlidingLog,
}

impl AlgorithmKind {
    pub const ALL: [AlgorithmKind; 5] = [
        AlgorithmKind::TokenBucket,
        AlgorithmKind::Gcra,
        AlgorithmKind::FixedWindow,
        AlgorithmKind::SlidingWindow,
        AlgorithmKind::SlidingLog,
    ];

    pub fn name(self) -> &'static str {
        match self {
            AlgorithmKind::TokenBucket => "token_bucket",
            AlgorithmKind::Gcra => "gcra",
            AlgorithmKind::FixedWindow => "fixed_window",
            AlgorithmKind::SlidingWindow => "sliding_window",
            AlgorithmKind::SlidingLog => "sliding_log",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|kind| kind.name() == name)
    }
}

impl fmt::Display for AlgorithmKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What the `RateLimit-Policy` header advertises: `quota` units per `window`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    pub quota: u64,
    pub window_ns: u64,
}

/// A parameter an algorithm cannot work with. `field` is the parameter's config name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParamError {
    pub field: &'static str,
    pub reason: String,
}

impl ParamError {
    pub fn new(field: &'static str, reason: impl Into<String>) -> Self {
        ParamError {
            field,
            reason: reason.into(),
        }
    }
}

impl fmt::Display for ParamError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.reason)
    }
}

/// A compiled limit: one algorithm with parameters that are known to be valid.
///
/// The sliding-window log keeps one entry per admitted event, so it has no
/// fixed-size state and runs only in Redis (global rules); it is not a `Limit` here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Limit {
    TokenBucket(token_bucket::TokenBucket),
    Gcra(gcra::Gcra),
    FixedWindow(fixed_window::FixedWindow),
    SlidingWindow(sliding_window::SlidingWindow),
}

impl Limit {
    pub fn kind(&self) -> AlgorithmKind {
        match self {
            Limit::TokenBucket(_) => AlgorithmKind::TokenBucket,
            Limit::Gcra(_) => AlgorithmKind::Gcra,
            Limit::FixedWindow(_) => AlgorithmKind::FixedWindow,
            Limit::SlidingWindow(_) => AlgorithmKind::SlidingWindow,
        }
    }

    /// Decides one request of `cost` units at `now_us` against `state` (`None`: a key
    /// never seen, or one whose state carries no information). Returns the decision and
    /// the state to store, or `None` when the store must not be written.
    pub fn decide(
        &self,
        state: Option<SlotState>,
        now_us: u64,
        cost: u64,
    ) -> (Decision, Option<SlotState>) {
        match self {
            Limit::TokenBucket(p) => {
                let (d, s) = p.decide(state.map(token_bucket::State::from_slot), now_us, cost);
                (d, s.map(|s| s.to_slot()))
            }
            Limit::Gcra(p) => {
                let (d, s) = p.decide(state.map(gcra::State::from_slot), now_us, cost);
                (d, s.map(|s| s.to_slot()))
            }
            Limit::FixedWindow(p) => {
                let (d, s) = p.decide(state.map(fixed_window::State::from_slot), now_us, cost);
                (d, s.map(|s| s.to_slot()))
            }
            Limit::SlidingWindow(p) => {
                let (d, s) = p.decide(state.map(sliding_window::State::from_slot), now_us, cost);
                (d, s.map(|s| s.to_slot()))
            }
        }
    }

    /// The instant (µs since the epoch) from which `state` carries no information: a
    /// fresh key would be decided the same — exactly for GCRA and the windows; for the
    /// token bucket the bucket is full but a fresh one starts its refill period anew.
    /// Slots idle at `now` may be reused.
    pub fn idle_at_us(&self, state: SlotState) -> u64 {
        match self {
            Limit::TokenBucket(p) => p.idle_at_us(&token_bucket::State::from_slot(state)),
            Limit::Gcra(p) => p.idle_at_us(&gcra::State::from_slot(state)),
            Limit::FixedWindow(p) => p.idle_at_us(&fixed_window::State::from_slot(state)),
            Limit::SlidingWindow(p) => p.idle_at_us(&sliding_window::State::from_slot(state)),
        }
    }

    /// Like [`Limit::decide`], but grants as much as it can up to `want` (≥ `cost`):
    /// the largest `g` in `cost..=want` that [`Limit::decide`] would allow at once, so
    /// a lease of `g` units is exactly `g` requests decided in a row. Returns the
    /// decision for `g` units (or for `cost` units when even those are denied), `g`
    /// (0 when denied), and the state to store.
    ///
    /// This is the reference the Redis scripts are checked against: they compute `g`
    /// in closed form, this searches for it over `decide`, which is monotone in the
    /// cost (if `g` units fit, so do `g − 1`).
    pub fn acquire(
        &self,
        state: Option<SlotState>,
        now_us: u64,
        cost: u64,
        want: u64,
    ) -> (Decision, u64, Option<SlotState>) {
        let (decision, next) = self.decide(state, now_us, cost);
        if !decision.allowed {
            return (decision, 0, next);
        }
        let mut best = (cost, decision, next);
        let (mut low, mut high) = (cost, want.min(self.max_cost()));
        while low < high {
            let mid = low + (high - low).div_ceil(2);
            let (d, s) = self.decide(state, now_us, mid);
            if d.allowed {
                best = (mid, d, s);
                low = mid;
            } else {
                high = mid - 1;
            }
        }
        let (granted, decision, next) = best;
        (decision, granted, next)
    }

    /// The largest cost a single request can ever be granted.
    pub fn max_cost(&self) -> u64 {
        self.policy().quota
    }

    pub fn policy(&self) -> Policy {
        match self {
            Limit::TokenBucket(p) => p.policy(),
            Limit::Gcra(p) => p.policy(),
            Limit::FixedWindow(p) => p.policy(),
            Limit::SlidingWindow(p) => p.policy(),
        }
    }
}
