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
//! ## One home per algorithm
//!
//! Each algorithm lives in its own module, which holds everything weir knows about it:
//! its [`AlgorithmSpec`] (name, parameter table, Lua script name, builder), parameter
//! validation, its state and the state's slot codec, the decision, and its
//! [`Algorithm`] implementation (policy, local share, lease lifetime, the Lua script's
//! arguments and the limits of exact arithmetic in Lua). The config, the wire format and
//! the bridge read all of that through the spec and the traits; the only list of
//! algorithms is [`AlgorithmKind`] with [`AlgorithmKind::spec`], and the only dispatch is
//! [`Limit::algorithm`] / [`GlobalLimit::algorithm`]. docs/algorithms.md ("Adding an
//! algorithm") lists the files a new one needs.
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
mod time;
pub mod token_bucket;
mod window;

use std::fmt;

/// Nanoseconds in a microsecond.
pub const NS_PER_US: u64 = 1_000;

/// The largest count or duration (µs) a Lua script is given: 2^48 (about 8.9 years in
/// µs). With instants below 2^52 µs (year 2112) every sum the scripts form stays below
/// 2^53, where Lua's doubles are exact. [`Algorithm::check_script_exact`] refuses
/// parameters that would break it, for the config checker and the bridge alike.
pub const MAX_SCRIPT_EXACT: u64 = 1 << 48;

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

/// A parameter an algorithm cannot work with. `field` is the parameter's name in its
/// algorithm's [`AlgorithmSpec::parameters`].
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

/// How a parameter's value is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// A whole number of units (requests, tokens).
    Count,
    /// A duration: `"500ms"` in the config, whole µs on the wire (`<name>_us`).
    Duration,
}

/// One parameter of an algorithm, as the config and the wire name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Parameter {
    /// The config's name (`period`); the wire's is [`Parameter::wire_name`].
    pub name: &'static str,
    pub unit: Unit,
    /// The value when the config leaves it out; `None`: required.
    pub default: Option<u64>,
}

impl Parameter {
    pub const fn required(name: &'static str, unit: Unit) -> Parameter {
        Parameter {
            name,
            unit,
            default: None,
        }
    }

    pub const fn optional(name: &'static str, unit: Unit, default: u64) -> Parameter {
        Parameter {
            name,
            unit,
            default: Some(default),
        }
    }

    /// `period` → `period_us`: on the wire every duration is whole µs.
    pub fn wire_name(&self) -> String {
        match self.unit {
            Unit::Count => self.name.to_string(),
            Unit::Duration => format!("{}_us", self.name),
        }
    }
}

/// Everything the config, the wire and the bridge need to know about an algorithm
/// before they hold one: its name, its parameters, where it can run and how to build it.
#[derive(Debug)]
pub struct AlgorithmSpec {
    pub kind: AlgorithmKind,
    /// As written in the config and on the wire.
    pub name: &'static str,
    /// Required parameters first; values are passed to `build` in this order, with
    /// defaults applied.
    pub parameters: &'static [Parameter],
    /// Why the algorithm cannot keep its state in a shared-data slot (and so runs only in
    /// Redis, for global rules); `None` when it can run locally.
    pub global_only: Option<&'static str>,
    /// Its Lua script's file name in `bridge/lua/`, without `.lua`.
    pub script: &'static str,
    /// The Lua script that settles a cost after the response (`commit`,
    /// [`SlotAlgorithm::settle`]) in Redis, for the algorithms that can.
    pub settle_script: Option<&'static str>,
    /// The script's KEYS after the state key, as suffixes of it (same hash slot).
    pub extra_script_keys: &'static [&'static str],
    /// Validates the values (in the order of `parameters`) and builds the limit.
    pub build: fn(&[u64]) -> Result<GlobalLimit, ParamError>,
}

impl AlgorithmSpec {
    /// The parameter called `name`, if the algorithm takes one.
    pub fn parameter(&self, name: &str) -> Option<&'static Parameter> {
        self.parameters.iter().find(|p| p.name == name)
    }
}

/// Values in the order of `params`, or the error naming the first one missing.
fn values_of<const N: usize>(values: &[u64], params: &[Parameter]) -> Result<[u64; N], ParamError> {
    <[u64; N]>::try_from(values).map_err(|_| {
        let missing = params.get(values.len()).map_or("parameters", |p| p.name);
        ParamError::new(missing, format!("expected {N} parameter values"))
    })
}

/// The algorithms, as named in the config and on the wire. This enum and
/// [`AlgorithmKind::spec`] are the one list of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
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

    pub fn spec(self) -> &'static AlgorithmSpec {
        match self {
            AlgorithmKind::TokenBucket => &token_bucket::SPEC,
            AlgorithmKind::Gcra => &gcra::SPEC,
            AlgorithmKind::FixedWindow => &fixed_window::SPEC,
            AlgorithmKind::SlidingWindow => &sliding_window::SPEC,
            AlgorithmKind::SlidingLog => &sliding_log::SPEC,
        }
    }

    pub fn name(self) -> &'static str {
        self.spec().name
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|kind| kind.name() == name)
    }

    /// Every parameter name any algorithm takes, once each, in the order of
    /// [`AlgorithmKind::ALL`] and then of each table: what a parser of limits may meet.
    pub fn all_parameters() -> Vec<&'static Parameter> {
        let mut all: Vec<&'static Parameter> = Vec::new();
        for kind in Self::ALL {
            for p in kind.spec().parameters {
                if !all.iter().any(|seen| seen.name == p.name) {
                    all.push(p);
                }
            }
        }
        all
    }
}

impl fmt::Display for AlgorithmKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

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
    /// [`MAX_SCRIPT_EXACT`]), naming the parameter.
    fn check_script_exact(&self) -> Result<(), ParamError>;
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

    /// Whether [`SlotAlgorithm::settle`] can correct a cost after the response: the
    /// algorithms whose spec names a settle script (Redis must be able to do it too).
    fn settles_after_response(&self) -> bool {
        self.spec().settle_script.is_some()
    }

    /// A request counted at `counted_at_us` with `reserved` units really cost `actual`,
    /// known at `now_us` (its response ended): `state` with the difference settled, or
    /// `None` to write nothing. A refund is given only while it is exact — while nothing
    /// that happened to the key since could have depended on the units being counted
    /// otherwise (the same window, the same refill period); later it is forgotten (the
    /// key admitted less than it could have, never more). An excess is charged now, so
    /// the requests that follow repay it: beyond what the key has left, it is a debt the
    /// key carries exactly (a token bucket's later refills, a window's later windows),
    /// at most [`MAX_SCRIPT_EXACT`] µs (about 8.9 years) ahead of `now_us` — what lies
    /// beyond is forgiven, so every instant the Lua scripts form stays exact.
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
    /// How long after its due time a unit may be spent (µs): the rule's hold.
    pub hold_us: u64,
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
            hold_us: 0,
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
use slot_algorithm;

/// A compiled limit whose state fits a slot: local rules and fallbacks, and most global
/// rules. The sliding-window log keeps one entry per admitted event, so it has no
/// fixed-size state and runs only in Redis: it is a [`GlobalLimit`], never a `Limit`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Limit {
    TokenBucket(token_bucket::TokenBucket),
    Gcra(gcra::Gcra),
    FixedWindow(fixed_window::FixedWindow),
    SlidingWindow(sliding_window::SlidingWindow),
}

impl Limit {
    /// The algorithm behind the limit: every other method goes through it.
    pub fn algorithm(&self) -> &dyn SlotAlgorithm {
        match self {
            Limit::TokenBucket(a) => a,
            Limit::Gcra(a) => a,
            Limit::FixedWindow(a) => a,
            Limit::SlidingWindow(a) => a,
        }
    }

    pub fn kind(&self) -> AlgorithmKind {
        self.algorithm().spec().kind
    }

    /// See [`SlotAlgorithm::decide_slot`].
    pub fn decide(
        &self,
        state: Option<SlotState>,
        now_us: u64,
        cost: u64,
    ) -> (Decision, Option<SlotState>) {
        self.algorithm().decide_slot(state, now_us, cost)
    }

    /// The instant (µs since the epoch) from which `state` carries no information: a
    /// fresh key would be decided the same — exactly for GCRA and the windows; for the
    /// token bucket the bucket is full but a fresh one starts its refill period anew.
    /// Slots idle at `now` may be reused.
    pub fn idle_at_us(&self, state: SlotState) -> u64 {
        self.algorithm().idle_at_slot(state)
    }

    /// Units `state` holds against its key at `now_us`: what starting the key afresh
    /// would hand back to it.
    pub fn in_use(&self, state: SlotState, now_us: u64) -> u64 {
        let (peek, _) = self.decide(Some(state), now_us, 0);
        peek.limit.saturating_sub(peek.remaining)
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

    /// What the key grants `ask` at `now_us`: the request's decision and the units
    /// granted ahead of it — as many as fit now, up to `want`, when the request fits;
    /// else a reservation of the future schedule when the algorithm has one and `ask`
    /// wants it. Units granted now may be spent until `hold_us` or the algorithm's own
    /// cap ([`SlotAlgorithm::lease_cap_ns`]), reserved ones `hold_us` after each is due.
    ///
    /// This is the reference weir-bridge's Lua scripts are checked against, field for
    /// field, for the slot algorithms.
    pub fn grant(
        &self,
        state: Option<SlotState>,
        now_us: u64,
        ask: Ask,
    ) -> (Grant, Option<SlotState>) {
        let hold_ns = ask.hold_us.saturating_mul(NS_PER_US);
        let (decision, granted, next) = self.acquire(state, now_us, ask.cost, ask.want);
        if decision.allowed {
            // Units granted (a peek grants none, and none has a validity).
            let valid_ns = match next {
                Some(after) if granted > 0 => self
                    .algorithm()
                    .lease_cap_ns(after, now_us)
                    .map_or(hold_ns, |cap| cap.min(hold_ns)),
                _ => 0,
            };
            let grant = Grant {
                decision,
                granted,
                due_ns: 0,
                spacing_ns: 0,
                valid_ns,
            };
            return (grant, next);
        }
        let reserved = (ask.reserve > 0 && ask.horizon_us > 0 && decision.retry_after_ns.is_some())
            .then(|| {
                self.algorithm()
                    .reserve(state, now_us, ask.reserve, ask.horizon_us)
            })
            .flatten();
        match reserved {
            Some((r, next)) => {
                let grant = Grant {
                    decision,
                    granted: r.units,
                    due_ns: r.due_ns,
                    spacing_ns: r.spacing_ns,
                    valid_ns: hold_ns,
                };
                (grant, Some(next))
            }
            None => (Grant::denied(decision), None),
        }
    }

    /// Decides `cost` units at `now_us` like [`Limit::decide`] and, when they are
    /// allowed, takes more for a worker's reservoir: units the worker spends from its own
    /// memory, each at most [`TakenAhead::valid_ns`] (≤ `ahead.hold_us`) after now — as
    /// many as its demand would spend in that time, at most `ahead.max`. Returns the
    /// request's decision, what was taken, and the state to store.
    ///
    /// A unit taken at `t` and spent at `s` must count, in the key's state, for an
    /// instant no earlier than `s`: windows and the token bucket are safe until their
    /// window ends or their next refill; GCRA charges its schedule as if the units were
    /// spent at the end of their validity ([`SlotAlgorithm::hold_ahead`]). What the
    /// take costs the key — its units and the charge for their time — is at most
    /// `1 / RESERVOIR_SHARE` of what the key had left after the request, and nothing is
    /// taken once half the limit or less is left.
    pub fn take_ahead(
        &self,
        state: Option<SlotState>,
        now_us: u64,
        cost: u64,
        ahead: Ahead,
    ) -> (Decision, TakenAhead, Option<SlotState>) {
        let (decision, next) = self.decide(state, now_us, cost);
        let nothing = TakenAhead::default();
        let after = match next {
            Some(after) if decision.allowed && cost > 0 && ahead.max > 0 => after,
            _ => return (decision, nothing, next),
        };
        // Near the limit (half of it or less left) every request decides in shared data.
        let share = decision.remaining / RESERVOIR_SHARE;
        if share == 0 || decision.remaining.saturating_mul(2) <= decision.limit {
            return (decision, nothing, next);
        }
        let hold_ns = ahead.hold_us.saturating_mul(NS_PER_US);
        let (valid_ns, charged) = self.algorithm().hold_ahead(after, now_us, hold_ns);
        let demand = u128::from(ahead.demand_per_s) * u128::from(valid_ns) / 1_000_000_000;
        let want = u64::try_from(demand).unwrap_or(u64::MAX).min(ahead.max);
        if valid_ns < NS_PER_US || want == 0 {
            return (decision, nothing, next);
        }
        let (peek, _) = self.decide(Some(charged), now_us, 0);
        let paid_for_time = decision.remaining.saturating_sub(peek.remaining);
        let budget = share.saturating_sub(paid_for_time).min(want);
        if budget == 0 {
            return (decision, nothing, next);
        }
        let (taken, units, taken_state) = self.acquire(Some(charged), now_us, 1, budget);
        match taken_state {
            Some(taken_state) if taken.allowed && units > 0 => {
                (decision, TakenAhead { units, valid_ns }, Some(taken_state))
            }
            _ => (decision, nothing, next),
        }
    }

    /// Decides `cost` units at `now_us` like [`Limit::decide`]; a denied request that
    /// would fit within `max_wait_us` is held instead: its place in the schedule is taken
    /// now (the state returned counts it), and it must be released between
    /// [`Hold::due_us`] and [`Hold::release_by_us`], which the release timer may miss by
    /// at most `slack_us`. Returns the decision (for a hold, the decision at the instant
    /// the state counts it), the hold, and the state to store.
    ///
    /// A held request is counted at an instant no earlier than its release can be: GCRA
    /// charges it at the latest release, `due` plus the larger of `slack_us` and what
    /// the key's burst leaves free (the TAT is already that far ahead, so it costs
    /// nothing); the token bucket at its refill `due`, which covers releases until the
    /// next refill. Windows have no schedule: never held.
    pub fn hold(
        &self,
        state: Option<SlotState>,
        now_us: u64,
        cost: u64,
        max_wait_us: u64,
        slack_us: u64,
    ) -> (Decision, Option<Hold>, Option<SlotState>) {
        let (decision, next) = self.decide(state, now_us, cost);
        let wait_us = match decision.retry_after_ns {
            Some(retry_ns) if !decision.allowed => retry_ns.div_ceil(NS_PER_US),
            _ => return (decision, None, next),
        };
        if wait_us > max_wait_us {
            return (decision, None, next);
        }
        let due_us = now_us.saturating_add(wait_us);
        let Some((count_at_us, release_by_us)) =
            self.algorithm().delay_window(due_us, cost, slack_us)
        else {
            return (decision, None, next);
        };
        match self.decide(state, count_at_us, cost) {
            (counted, Some(held)) if counted.allowed => {
                let hold = Hold {
                    due_us,
                    release_by_us,
                };
                (counted, Some(hold), Some(held))
            }
            _ => (decision, None, next),
        }
    }

    /// See [`SlotAlgorithm::settle`]. A key without state (never seen, its slot taken
    /// over, its Redis key expired) is a fresh key at `now_us`: it has nothing to refund
    /// (it is full: the refund would be capped away), and an excess is charged to the
    /// state a request deciding now would have started from — a debt is never dropped
    /// because the key went quiet while the response ran.
    pub fn settle(
        &self,
        state: Option<SlotState>,
        counted_at_us: u64,
        reserved: u64,
        actual: u64,
        now_us: u64,
    ) -> Option<SlotState> {
        if actual == reserved || (actual < reserved && state.is_none()) {
            return None;
        }
        let state = state.unwrap_or_else(|| self.state_with_remaining(self.max_cost(), now_us));
        self.algorithm()
            .settle(state, counted_at_us, reserved, actual, now_us)
    }

    /// See [`SlotAlgorithm::state_with_remaining`].
    pub fn state_with_remaining(&self, remaining: u64, at_us: u64) -> SlotState {
        self.algorithm().state_with_remaining(remaining, at_us)
    }

    /// The largest cost a single request can ever be granted.
    pub fn max_cost(&self) -> u64 {
        self.policy().quota
    }

    pub fn policy(&self) -> Policy {
        self.algorithm().policy()
    }
}

/// A compiled limit of any algorithm: what a global rule counts with in Redis.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GlobalLimit {
    /// An algorithm with slot state (it can also run locally).
    Slot(Limit),
    SlidingLog(sliding_log::SlidingLog),
}

impl GlobalLimit {
    /// The algorithm behind the limit.
    pub fn algorithm(&self) -> &dyn Algorithm {
        match self {
            GlobalLimit::Slot(limit) => limit.algorithm(),
            GlobalLimit::SlidingLog(a) => a,
        }
    }

    /// Builds a limit of `kind` from values in the order of its parameter table.
    pub fn build(kind: AlgorithmKind, values: &[u64]) -> Result<GlobalLimit, ParamError> {
        (kind.spec().build)(values)
    }

    pub fn kind(&self) -> AlgorithmKind {
        self.algorithm().spec().kind
    }

    /// The limit, if its state fits a slot (it can run locally).
    pub fn as_slot(&self) -> Option<&Limit> {
        match self {
            GlobalLimit::Slot(limit) => Some(limit),
            GlobalLimit::SlidingLog(_) => None,
        }
    }

    pub fn max_cost(&self) -> u64 {
        self.policy().quota
    }

    pub fn policy(&self) -> Policy {
        self.algorithm().policy()
    }

    /// See [`Algorithm::local_share`]: the quota divided evenly (at least 1), at the
    /// same pace. A sliding log becomes a sliding-window counter, which needs no log.
    pub fn local_share(&self, instances: u64) -> Result<Limit, ParamError> {
        self.algorithm().local_share(instances)
    }

    /// See [`Algorithm::lease_ttl_ns`].
    pub fn lease_ttl_ns(&self, now_us: u64) -> Option<u64> {
        self.algorithm().lease_ttl_ns(now_us)
    }
}

impl From<Limit> for GlobalLimit {
    fn from(limit: Limit) -> Self {
        GlobalLimit::Slot(limit)
    }
}

#[cfg(test)]
mod tests {
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    use super::*;

    #[test]
    fn every_kind_has_its_own_spec_and_name() {
        for kind in AlgorithmKind::ALL {
            let spec = kind.spec();
            assert_eq!(spec.kind, kind);
            assert_eq!(AlgorithmKind::from_name(spec.name), Some(kind));
            // Required parameters come first, so messages can list them in order.
            let first_optional = spec.parameters.iter().position(|p| p.default.is_some());
            if let Some(at) = first_optional {
                assert!(spec.parameters.iter().skip(at).all(|p| p.default.is_some()));
            }
        }
        assert_eq!(AlgorithmKind::from_name("leaky"), None);
    }

    #[test]
    fn a_parameter_name_means_the_same_unit_in_every_algorithm() {
        // The config and the wire parse a value by its name before they know the
        // algorithm; that needs one unit per name.
        for kind in AlgorithmKind::ALL {
            for p in kind.spec().parameters {
                let seen = AlgorithmKind::all_parameters()
                    .into_iter()
                    .find(|q| q.name == p.name)
                    .map(|q| q.unit);
                assert_eq!(seen, Some(p.unit), "{kind}: {}", p.name);
            }
        }
    }

    #[test]
    fn limits_round_trip_through_their_parameters() {
        let samples: [(AlgorithmKind, &[u64]); 5] = [
            (AlgorithmKind::TokenBucket, &[10, 2, 1_000_000]),
            (AlgorithmKind::Gcra, &[100, 1_000_000, 9]),
            (AlgorithmKind::FixedWindow, &[5, 60_000_000]),
            (AlgorithmKind::SlidingWindow, &[5, 60_000_000]),
            (AlgorithmKind::SlidingLog, &[5, 60_000_000]),
        ];
        for (kind, values) in samples {
            let limit = GlobalLimit::build(kind, values).unwrap();
            assert_eq!(limit.kind(), kind);
            assert_eq!(limit.algorithm().parameters(), values.to_vec());
            assert_eq!(limit.as_slot().is_none(), kind.spec().global_only.is_some());
            assert!(limit.algorithm().check_script_exact().is_ok());
        }
        let short = GlobalLimit::build(AlgorithmKind::Gcra, &[1]).unwrap_err();
        assert_eq!(short.field, "period");
    }

    #[test]
    fn local_shares_divide_the_quota() {
        let share = |kind, values: &[u64], n| {
            GlobalLimit::build(kind, values)
                .unwrap()
                .local_share(n)
                .unwrap()
        };
        let limit = |kind, values: &[u64]| GlobalLimit::build(kind, values).unwrap();
        // Token bucket 100, 10 per second over 4: 25, 10 every 4 seconds.
        assert_eq!(
            GlobalLimit::Slot(share(AlgorithmKind::TokenBucket, &[100, 10, 1_000_000], 4)),
            limit(AlgorithmKind::TokenBucket, &[25, 10, 4_000_000])
        );
        // GCRA 100 per second, burst 99, over 3: limit 33 (burst 32) at 100 per 3 s.
        assert_eq!(
            GlobalLimit::Slot(share(AlgorithmKind::Gcra, &[100, 1_000_000, 99], 3)),
            limit(AlgorithmKind::Gcra, &[100, 3_000_000, 32])
        );
        // A log of 10 per second over 20: a sliding window of 1 (never 0).
        assert_eq!(
            GlobalLimit::Slot(share(AlgorithmKind::SlidingLog, &[10, 1_000_000], 20)),
            limit(AlgorithmKind::SlidingWindow, &[1, 1_000_000])
        );
    }
}
