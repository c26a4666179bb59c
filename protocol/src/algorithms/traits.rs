//! The questions every algorithm answers about itself: [`Algorithm`] for any, and
//! [`SlotAlgorithm`] for those whose state fits a slot. Callers ask these, never an
//! algorithm's name.

use super::{
    Admission, AlgorithmSpec, Breach, Decision, LeaseCost, Limit, ParamError, Policy, Reservation,
    SlotState,
};

/// What every algorithm knows about itself, whatever its state.
pub trait Algorithm {
    fn spec(&self) -> &'static AlgorithmSpec;

    /// Its parameter values, in the order of `spec().parameters`.
    fn parameters(&self) -> Vec<u64>;

    /// What the `RateLimit-Policy` header advertises.
    fn policy(&self) -> Policy;

    /// The share of this limit that one of `instances` Envoys enforces on its own when
    /// the bridge cannot answer (`failure_mode: local`).
    fn local_share(&self, instances: u64) -> Result<Limit, ParamError>;

    /// How long units leased at `now_us` may be spent; `None`: no bound of the
    /// algorithm's own (the rule's lease ttl applies).
    fn lease_ttl_ns(&self, now_us: u64) -> Option<u64>;

    /// The Lua script's parameters (ARGV 4 onwards; see `bridge/lua/`).
    fn script_args(&self) -> Vec<u64>;

    /// Refuses parameters the Lua script cannot decide exactly with doubles (see
    /// [`MAX_SCRIPT_EXACT`](super::MAX_SCRIPT_EXACT)), naming the parameter.
    fn check_script_exact(&self) -> Result<(), ParamError>;

    /// How long a leased unit may be spent after it is due when the rule's `lease.ttl`
    /// is not set, given the rule's default `default_us`. By default: that default.
    fn default_lease_ttl_us(&self, default_us: u64) -> u64 {
        default_us
    }

    /// What a global rule's lease whose units may be spent up to `ttl_us` after they
    /// are due costs the key in Redis. By default nothing: the algorithm's own bound
    /// caps how long a leased unit lives ([`Algorithm::lease_ttl_ns`],
    /// [`SlotAlgorithm::lease_cap_ns`]).
    fn lease_cost(&self, ttl_us: u64) -> LeaseCost {
        let _ = ttl_us;
        LeaseCost::Free
    }

    /// The first place where `sorted` (one key's admissions, sorted stably by time)
    /// breaks the algorithm's own bound, or `None`: the bound each algorithm promises a
    /// client of one central limiter, which [`crate::conformance::check`] holds every
    /// path to. Exact, in integers; each implementation says its bound and what a
    /// [`Breach`] of it reports.
    fn check_bound(&self, sorted: &[Admission]) -> Option<Breach>;
}

/// The decision of an algorithm whose per-key state fits one [`SlotState`], in terms of
/// slot words (the codec between its own state type and the slot).
pub trait SlotCodec {
    /// Decides `cost` units at `now_us` against `state` (`None`: a key never seen, or
    /// one whose state carries no information). Returns the decision and the state to
    /// store, or `None` when the store must not be written.
    fn decide_slot(
        &self,
        state: Option<SlotState>,
        now_us: u64,
        cost: u64,
    ) -> (Decision, Option<SlotState>);

    /// The instant (µs) from which `state` carries no information.
    fn idle_at_slot(&self, state: SlotState) -> u64;
}

/// An algorithm whose per-key state fits one [`SlotState`]: it runs in shared data
/// (local rules, fallbacks) as well as in Redis, where its script grants units ahead of
/// the request that asked ([`Limit::grant`] is the reference the scripts are checked
/// against).
pub trait SlotAlgorithm: Algorithm + SlotCodec {
    /// How long units granted now (leaving the key at `state`) may still be spent, by
    /// the algorithm's own bound: until the window ends (windows), until the next
    /// refill (token bucket); `None` when only the rule's hold bounds it (GCRA, whose
    /// hold is paid for by a reduced burst instead).
    fn lease_cap_ns(&self, state: SlotState, now_us: u64) -> Option<u64>;

    /// Units of the future schedule, for a request that does not fit now: at most
    /// `max_units`, none due later than `horizon_us` from now. Only GCRA's schedule has
    /// slots to reserve; the others return `None`.
    fn reserve(
        &self,
        state: Option<SlotState>,
        now_us: u64,
        max_units: u64,
        horizon_us: u64,
    ) -> Option<(Reservation, SlotState)> {
        let _ = (state, now_us, max_units, horizon_us);
        None
    }

    /// A state in which `remaining` units (at most the limit) are left at `at_us`: what
    /// a local fallback starts from when the global key was last seen with `remaining`.
    fn state_with_remaining(&self, remaining: u64, at_us: u64) -> SlotState;

    /// For units a worker takes now from a key left at `state` and keeps in its own
    /// memory: how long (ns from `now_us`, at most `hold_ns`) each may be spent, and
    /// the state that pays for that time. Spent anywhere in it, a unit keeps the
    /// algorithm's bound (see [`Limit::take_ahead`]). By default the units live no longer
    /// than [`SlotAlgorithm::lease_cap_ns`] allows and cost nothing more.
    fn hold_ahead(&self, state: SlotState, now_us: u64, hold_ns: u64) -> (u64, SlotState) {
        let cap = self.lease_cap_ns(state, now_us).unwrap_or(0);
        (cap.min(hold_ns), state)
    }

    /// For a request of `cost` held until `due_us`, the first instant at which it fits,
    /// and released by a timer that may be `slack_us` late: the instant the key's state
    /// counts it at, and the last instant it may be released (at least `slack_us` after
    /// `due_us` when the algorithm allows it, more when that is free). Released anywhere
    /// in between, its admission keeps the algorithm's bound (see [`Limit::hold`]).
    /// `None`: the algorithm has no schedule to hold requests on (windows).
    fn delay_window(&self, due_us: u64, cost: u64, slack_us: u64) -> Option<(u64, u64)> {
        let _ = (due_us, cost, slack_us);
        None
    }

    /// A request counted at `counted_at_us` with `reserved` units really cost `actual`,
    /// known at `now_us` (its response ended): `state` with the difference settled, or
    /// `None` to write nothing. A refund is given only while it is exact — while nothing
    /// that happened to the key since could have depended on the units being counted
    /// otherwise (the same window, the same refill period); later it is forgotten (the
    /// key admitted less than it could have, never more). An excess is charged now, so
    /// the requests that follow repay it: beyond what the key has left, it is a debt the
    /// key carries exactly (a token bucket's later refills, a window's later windows),
    /// at most [`MAX_SCRIPT_EXACT`](super::MAX_SCRIPT_EXACT) µs (about 8.9 years) ahead
    /// of `now_us` — what lies beyond is forgiven, so every instant the Lua scripts form
    /// stays exact.
    fn settle(
        &self,
        state: SlotState,
        counted_at_us: u64,
        reserved: u64,
        actual: u64,
        now_us: u64,
    ) -> Option<SlotState> {
        let _ = (state, counted_at_us, reserved, actual, now_us);
        None
    }
}

/// Implements [`SlotCodec`] for an algorithm whose module has a `State` with
/// `from_slot`/`to_slot`, and whose type has inherent `decide` and `idle_at_us` over it:
/// the codec between the algorithm's own state and the slot's two words.
macro_rules! slot_algorithm {
    ($algorithm:ty) => {
        impl $crate::algorithms::SlotCodec for $algorithm {
            fn decide_slot(
                &self,
                state: Option<$crate::algorithms::SlotState>,
                now_us: u64,
                cost: u64,
            ) -> (
                $crate::algorithms::Decision,
                Option<$crate::algorithms::SlotState>,
            ) {
                let (decision, next) = self.decide(state.map(State::from_slot), now_us, cost);
                (decision, next.map(State::to_slot))
            }

            fn idle_at_slot(&self, state: $crate::algorithms::SlotState) -> u64 {
                self.idle_at_us(&State::from_slot(state))
            }
        }
    };
}
pub(super) use slot_algorithm;
