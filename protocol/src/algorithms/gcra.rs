//! GCRA, the generic cell rate algorithm: exactly redis-cell's
//! `CL.THROTTLE key burst rate period [quantity]`.
//!
//! Vocabulary (the names redis-cell uses):
//!
//! - **emission interval** `T = period / rate`: the spacing of requests at exactly the
//!   sustained rate, in whole nanoseconds (rate 3 per second: `T = 333_333_333 ns`).
//! - **burst**: how many requests beyond the first may arrive back to back.
//!   **limit** `= burst + 1`.
//! - **tolerance** (redis-cell's *delay variation tolerance*) `τ = T × (burst + 1)`: how
//!   far ahead of the clock the schedule may run. Think of it as the bucket's size.
//! - **TAT**, theoretical arrival time: the instant at which the key's schedule is empty
//!   again. A request of `quantity` units pushes it `T × quantity` further; it is allowed
//!   when the pushed TAT stays within `τ` of now. The TAT is the whole state.
//!
//! A quantity of 0 is a **peek**: it reports the state and changes nothing.
//!
//! ```
//! use weir_protocol::algorithms::gcra::Gcra;
//!
//! // CL.THROTTLE user 4 1 1: 1 per second with a burst of 4.
//! let gcra = Gcra::new(4, 1, 1_000_000).unwrap();
//! let now = 1_700_000_000_000_000;
//! let (reply, state) = gcra.throttle(None, now, 1);
//! assert!(!reply.limited);
//! assert_eq!((reply.limit, reply.remaining, reply.retry_after, reply.reset_after), (5, 4, -1, 1));
//!
//! // Five more units at the same instant do not fit: retry in 1 s, empty in 1 s.
//! let (reply, _) = gcra.throttle(state, now, 5);
//! assert!(reply.limited);
//! assert_eq!((reply.remaining, reply.retry_after, reply.reset_after), (4, 1, 1));
//! ```
//!
//! Why the arithmetic looks the way it does:
//!
//! - The TAT is kept in **nanoseconds** since the epoch, not microseconds: `T` is a whole
//!   number of nanoseconds, and a TAT truncated to µs after every request would drift
//!   away from redis-cell by up to 1 µs per request.
//! - `T` is computed as redis-cell does, `(period_ns as f64 / rate as f64) as i64`. This
//!   is the integer quotient `period_ns / rate` for every period up to 2^53 ns (104
//!   days); beyond that the double rounds, and redis-cell and a Lua twin working in
//!   doubles round the same way, so we do too.
//! - `τ` is capped at 2^52 ns (about 52 days) so that every TAT and duration of a key
//!   stays exact in the doubles of a Redis Lua script.
//! - `remaining` is `(τ − ttl)` divided by `T`, both first truncated to whole
//!   microseconds: redis-cell's rounding, kept so the numbers match. It may therefore
//!   over-report by one unit when `T` is not a whole number of microseconds.

use super::{
    values_of, Admission, Algorithm, AlgorithmKind, AlgorithmSpec, Breach, Decision, GlobalLimit,
    LeaseCost, Limit, LimitParameter, ParamError, Parameter, Policy, Reservation, SlotAlgorithm,
    SlotState, Unit, NS_PER_US,
};

const PARAMETERS: &[Parameter] = &[
    Parameter::required("rate", Unit::Count),
    Parameter::required("period", Unit::Duration),
    Parameter::optional("burst", Unit::Count, 0),
];

pub const SPEC: AlgorithmSpec = AlgorithmSpec {
    kind: AlgorithmKind::Gcra,
    name: "gcra",
    parameters: PARAMETERS,
    global_only: None,
    script: "gcra",
    settle_script: None,
    extra_script_keys: &[],
    build: |values| {
        let [rate, period_us, burst] = values_of(values, PARAMETERS)?;
        Gcra::new(burst, rate, period_us).map(|g| GlobalLimit::Slot(Limit::Gcra(g)))
    },
    limit_parameter: LimitParameter {
        name: "burst",
        plus: 1,
    },
    can_hold: true,
    has_schedule: true,
    frees_gradually: false,
    resets_each_window: false,
};

/// The largest tolerance `τ = T × (burst + 1)` accepted, in ns: 2^52 ns, about 52 days.
pub const MAX_TOLERANCE_NS: u64 = 1 << 52;

const NS_PER_MS: i128 = 1_000_000;
const NS_PER_S: i128 = 1_000_000_000;

/// GCRA parameters, validated: `burst` extra units on top of a sustained `rate` per
/// `period`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gcra {
    burst: u64,
    rate: u64,
    period_us: u64,
    emission_interval_ns: u64,
    tolerance_ns: u64,
}

/// The per-key state: the TAT.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct State {
    /// Theoretical arrival time, ns since the Unix epoch (slot word `a`).
    pub tat_ns: u64,
    /// The emission interval the TAT was counted in, ns (slot word `b`); 0 when unknown
    /// (a state written before it was kept), read as the current one. A limit whose `T`
    /// changed reads the TAT in its own `T` ([`Gcra::tat_in_own_interval`]).
    pub emission_interval_ns: u64,
}

impl State {
    /// Any slot decodes: a TAT in the past is an idle key, one in the future a key that
    /// waits until then.
    pub fn from_slot(s: SlotState) -> Self {
        State {
            tat_ns: s.a,
            emission_interval_ns: s.b,
        }
    }

    pub fn to_slot(self) -> SlotState {
        SlotState {
            a: self.tat_ns,
            b: self.emission_interval_ns,
        }
    }
}

/// The reply of `CL.THROTTLE`, integer for integer. Durations are in whole seconds,
/// rounded as redis-cell rounds them (see [`Gcra::throttle`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ThrottleReply {
    pub limited: bool,
    /// `burst + 1`.
    pub limit: i64,
    pub remaining: i64,
    /// Seconds until the same request would be allowed; `-1` when allowed, or when the
    /// quantity is above the limit and never can be.
    pub retry_after: i64,
    /// Seconds until the key is back to an empty schedule. Negative when an oversized
    /// quantity is refused on a key whose TAT is already in the past: redis-cell reports
    /// `TAT − now` there, and so does this reply.
    pub reset_after: i64,
}

/// What one evaluation found, at full precision. `decide` and `throttle` both read it.
struct Outcome {
    limited: bool,
    /// `TAT − now` after the decision (before it when limited); may be negative.
    ttl_ns: i128,
    /// Only when limited and the quantity fits in `τ`.
    retry_after_ns: Option<i128>,
    remaining: i128,
    new_state: Option<State>,
}

impl Gcra {
    /// `burst` (≥ 0), `rate` (≥ 1) units per `period_us` (≥ 1 µs). The emission interval
    /// must be at least 1 µs and the tolerance at most [`MAX_TOLERANCE_NS`].
    pub fn new(burst: u64, rate: u64, period_us: u64) -> Result<Self, ParamError> {
        if rate == 0 {
            return Err(ParamError::new("rate", "must be at least 1"));
        }
        if period_us == 0 {
            return Err(ParamError::new("period", "must be at least 1us"));
        }
        let period_ns = u128::from(period_us) * u128::from(NS_PER_US);
        // redis-cell's `Rate::per_period`; `as` saturates, and the result is at most
        // period_ns because rate >= 1.
        let emission_interval_ns = (period_ns as f64 / rate as f64) as u64;
        if emission_interval_ns < NS_PER_US {
            return Err(ParamError::new(
                "rate",
                format!(
                    "is too high for the period: {rate} per {period_us}us leaves less than \
                     1us between requests"
                ),
            ));
        }
        let tolerance_ns = u128::from(emission_interval_ns) * (u128::from(burst) + 1);
        if tolerance_ns > u128::from(MAX_TOLERANCE_NS) {
            return Err(ParamError::new(
                "burst",
                "(burst + 1) × period / rate must be at most 2^52 ns (about 52 days)",
            ));
        }
        Ok(Gcra {
            burst,
            rate,
            period_us,
            emission_interval_ns,
            tolerance_ns: tolerance_ns as u64,
        })
    }

    pub fn burst(&self) -> u64 {
        self.burst
    }

    pub fn rate(&self) -> u64 {
        self.rate
    }

    pub fn period_us(&self) -> u64 {
        self.period_us
    }

    /// `T`, in ns.
    pub fn emission_interval_ns(&self) -> u64 {
        self.emission_interval_ns
    }

    /// `τ = T × (burst + 1)`, in ns.
    pub fn tolerance_ns(&self) -> u64 {
        self.tolerance_ns
    }

    /// `burst + 1`: the most units a key can be granted at once.
    pub fn limit(&self) -> u64 {
        self.burst.saturating_add(1)
    }

    /// Decides `cost` units at `now_us`. `remaining` is redis-cell's, kept within
    /// `[0, limit]`; `reset_after_ns` is `TAT − now`, at least 0.
    pub fn decide(
        &self,
        state: Option<State>,
        now_us: u64,
        cost: u64,
    ) -> (Decision, Option<State>) {
        let o = self.evaluate(state, now_us, cost);
        let decision = Decision {
            allowed: !o.limited,
            limit: self.limit(),
            remaining: clamp_u64(o.remaining).min(self.limit()),
            retry_after_ns: o.retry_after_ns.map(clamp_u64),
            reset_after_ns: clamp_u64(o.ttl_ns),
        };
        (decision, o.new_state)
    }

    /// `CL.THROTTLE key burst rate period quantity` against `state`: the five integers
    /// redis-cell replies, and the state to store (`None`: nothing to write).
    ///
    /// Durations become whole seconds as redis-cell rounds them: truncated toward zero,
    /// plus one if the sub-second part has at least one whole millisecond. So 1.002 s →
    /// 2, 1.0004 s → 1, 0.0005 s → 0 (a limited reply may say "retry in 0 s"), and
    /// −2.5 s → −2.
    pub fn throttle(
        &self,
        state: Option<State>,
        now_us: u64,
        quantity: u64,
    ) -> (ThrottleReply, Option<State>) {
        let o = self.evaluate(state, now_us, quantity);
        let reply = ThrottleReply {
            limited: o.limited,
            limit: i64::try_from(self.limit()).unwrap_or(i64::MAX),
            remaining: clamp_i64(o.remaining),
            retry_after: o.retry_after_ns.map_or(-1, reply_seconds),
            reset_after: reply_seconds(o.ttl_ns),
        };
        (reply, o.new_state)
    }

    /// The TAT, rounded up to the µs: from then on the key behaves as if never seen.
    pub fn idle_at_us(&self, state: &State) -> u64 {
        state.tat_ns.div_ceil(NS_PER_US)
    }

    /// `burst + 1` units per `τ`: what a key may take at once, and the time it takes to
    /// earn it all back.
    pub fn policy(&self) -> Policy {
        Policy {
            quota: self.limit(),
            window_ns: self.tolerance_ns,
        }
    }

    /// The state that stores `tat_ns`, counted in this limit's emission interval.
    fn state_at(&self, tat_ns: i128) -> State {
        State {
            tat_ns: clamp_u64(tat_ns),
            emission_interval_ns: self.emission_interval_ns,
        }
    }

    /// The TAT of `state` read in this limit's emission interval at `now_ns`. A TAT
    /// counted in another `T` (the rule's rate changed: a reload, or a limit that comes
    /// with the request) keeps the units the key owes: `(TAT − now) / T_old` of them,
    /// each now `T` long, rounded up to the ns. Read as it was, a TAT counted at a
    /// higher rate would let a key that just took its whole burst take most of another
    /// one at once (rate 100/s → 10/s, burst 10: 9 more units at the same instant), past
    /// either limit's bound; kept in units, the key's admissions across the change stay
    /// within the bound of the larger limit. The new `T` applies from the key's first
    /// admission after the change, which writes it; until then a denial reads the old
    /// TAT again. A TAT behind now, or in a state that does not say its `T`, is as it is.
    pub fn tat_in_own_interval(&self, state: State, now_ns: i128) -> i128 {
        let tat = i128::from(state.tat_ns);
        let (old, new) = (
            i128::from(state.emission_interval_ns),
            i128::from(self.emission_interval_ns),
        );
        if old == 0 || old == new || tat <= now_ns {
            return tat;
        }
        let owed = tat - now_ns;
        // owed < 2^64 and new < 2^53: no overflow in i128.
        now_ns + (owed * new + old - 1) / old
    }

    /// redis-cell's `RateLimiter::rate_limit`, in i128 so no input can overflow.
    fn evaluate(&self, state: Option<State>, now_us: u64, quantity: u64) -> Outcome {
        let t = i128::from(self.emission_interval_ns);
        let tau = i128::from(self.tolerance_ns);
        let now = i128::from(now_us) * i128::from(NS_PER_US);
        // A TAT ahead of now is the normal case (a clock that went back just makes the
        // key wait longer); one behind now is an idle key.
        let tat = state.map_or(now, |s| self.tat_in_own_interval(s, now));
        let increment = t * i128::from(quantity);
        let new_tat = now.max(tat) + increment;
        let allow_at = new_tat - tau;
        let diff = now - allow_at;

        let (limited, ttl, retry_after_ns, new_state) = if diff < 0 {
            // An increment beyond τ can never fit: no retry time to give.
            let retry = (increment <= tau).then_some(-diff);
            (true, tat - now, retry, None)
        } else {
            // A peek would store max(now, TAT), which says the same as what is stored.
            let new_state = (quantity > 0).then(|| self.state_at(new_tat));
            (false, new_tat - now, None, new_state)
        };

        let next = tau - ttl;
        let remaining = if next > -t {
            (next / i128::from(NS_PER_US))
                .checked_div(t / i128::from(NS_PER_US))
                .unwrap_or(0)
        } else {
            0
        };
        Outcome {
            limited,
            ttl_ns: ttl,
            retry_after_ns,
            remaining,
            new_state,
        }
    }
}

impl Algorithm for Gcra {
    fn spec(&self) -> &'static AlgorithmSpec {
        &SPEC
    }

    fn parameters(&self) -> Vec<u64> {
        vec![self.rate, self.period_us, self.burst]
    }

    fn policy(&self) -> Policy {
        Gcra::policy(self)
    }

    /// An even share of `burst + 1` (at least 1), at an even share of the rate (the same
    /// rate per `instances` periods).
    fn local_share(&self, instances: u64) -> Result<Limit, ParamError> {
        let n = instances.max(1);
        let share = (self.limit() / n).max(1);
        Gcra::new(share - 1, self.rate, self.period_us.saturating_mul(n)).map(Limit::Gcra)
    }

    fn lease_ttl_ns(&self, _now_us: u64) -> Option<u64> {
        None
    }

    /// `[burst + 1, T (ns), τ (ns)]`: the script works on the schedule, not the rate.
    fn script_args(&self) -> Vec<u64> {
        vec![self.limit(), self.emission_interval_ns, self.tolerance_ns]
    }

    /// τ is at most 2^52 ns already ([`MAX_TOLERANCE_NS`]): every TAT and duration of a
    /// key stays exact in Lua's doubles.
    fn check_script_exact(&self) -> Result<(), ParamError> {
        Ok(())
    }

    /// The bound (burst `b`, emission interval `T`, tolerance `τ = (b + 1)·T`, both in ns):
    /// for all `i ≤ j`, `(S_j − S_(i−1))·T ≤ τ + (t_j − t_i)` with `t` in ns: over any
    /// stretch, `b + 1` units plus one per `T` elapsed. Each admitted unit pushes the TAT
    /// by `T`, and an admission needs `TAT − τ ≤ now`; over admissions `i..=j` the TAT rises
    /// by at least `T·(S_j − S_(i−1))` from at least `t_i` and ends at most at `t_j + τ`.
    /// A central GCRA with its TAT in ns never breaks it. Checked in one pass: with
    /// `m = min over i ≤ j of (S_(i−1)·T − t_i)`, a violation is `S_j·T − t_j − m > τ`.
    ///
    /// A breach reports as `allowed` `⌊(τ + (t_last − t_first)) / T⌋`, over the stretch
    /// with the largest excess (the shortest one on a tie).
    fn check_bound(&self, sorted: &[Admission]) -> Option<Breach> {
        breach(self, sorted)
    }

    /// ⌊burst / 4⌋ × T: a quarter of the burst pays for the hold, at most `default_us`.
    fn default_lease_ttl_us(&self, default_us: u64) -> u64 {
        (self.burst / 4)
            .saturating_mul(self.emission_interval_ns / NS_PER_US)
            .min(default_us)
    }

    /// Paid with burst: a leased unit may be spent up to `ttl_us` after it was counted,
    /// which a schedule can only keep if the key counted it that much earlier, so Redis
    /// decides with the burst reduced by `⌈ttl / T⌉` units (a smaller burst of valid
    /// parameters is valid: the reduced limit always builds).
    fn lease_cost(&self, ttl_us: u64) -> LeaseCost {
        let t_ns = self.emission_interval_ns;
        let units =
            u64::try_from((u128::from(ttl_us) * u128::from(NS_PER_US)).div_ceil(u128::from(t_ns)))
                .unwrap_or(u64::MAX);
        let reduced = (ttl_us > 0 && units <= self.burst)
            .then(|| Gcra::new(self.burst - units, self.rate, self.period_us).ok())
            .flatten();
        match reduced {
            Some(g) => LeaseCost::Burst {
                units,
                limit: GlobalLimit::Slot(Limit::Gcra(g)),
            },
            None => LeaseCost::Unaffordable {
                units,
                burst: self.burst,
                per_unit_us: t_ns.div_ceil(NS_PER_US).max(1),
                affordable_us: self.burst.saturating_mul(t_ns / NS_PER_US),
            },
        }
    }
}

impl SlotAlgorithm for Gcra {
    /// Counted at the latest release: released earlier, the request only comes sooner
    /// than its charge says, never sooner than it fits. At `due` the TAT is `τ − T ×
    /// cost` ahead (that is what makes `due` the first instant it fits), so a charge up
    /// to there is free; the slack beyond it costs the schedule that much time.
    fn delay_window(&self, due_us: u64, cost: u64, slack_us: u64) -> Option<(u64, u64)> {
        let per_cost = u128::from(self.emission_interval_ns) * u128::from(cost);
        let free_ns = u128::from(self.tolerance_ns).saturating_sub(per_cost);
        let free_us = u64::try_from(free_ns / u128::from(NS_PER_US)).unwrap_or(u64::MAX);
        let latest = due_us.saturating_add(slack_us.max(free_us));
        Some((latest, latest))
    }

    /// A GCRA lease is bounded by the rule's hold alone, which the burst pays for.
    fn lease_cap_ns(&self, _state: SlotState, _now_us: u64) -> Option<u64> {
        None
    }

    /// The next slots of the schedule: with the TAT `base` ahead of now, the `i`-th unit
    /// (counting from one) is due when a central limiter would first admit it,
    /// `base + i × T − τ` from now; as many as are due within `horizon_us`, at most
    /// `max_units`. The TAT moves past them, so nobody else gets them.
    fn reserve(
        &self,
        state: Option<SlotState>,
        now_us: u64,
        max_units: u64,
        horizon_us: u64,
    ) -> Option<(Reservation, SlotState)> {
        let t = i128::from(self.emission_interval_ns);
        let tau = i128::from(self.tolerance_ns);
        let now = i128::from(now_us) * i128::from(NS_PER_US);
        let tat = state.map_or(now, |s| self.tat_in_own_interval(State::from_slot(s), now));
        let base = tat.max(now) - now;
        let reach = i128::from(horizon_us) * i128::from(NS_PER_US) + tau - base;
        let units = (reach / t).min(i128::from(max_units));
        if units < 1 {
            return None;
        }
        let reservation = Reservation {
            units: clamp_u64(units),
            due_ns: i64::try_from(base + t - tau).unwrap_or(i64::MAX),
            spacing_ns: self.emission_interval_ns,
        };
        let next = self.state_at(now + base + units * t);
        Some((reservation, next.to_slot()))
    }

    /// A unit a worker holds may be spent until its *charge*: the TAT moves to at least
    /// then, as if it were spent at the last instant it may be. Up to the TAT already
    /// ahead of now the time is free; beyond it, the charge costs the key what the
    /// schedule would have refilled meanwhile, so it stops at a sixteenth of `τ`.
    fn hold_ahead(&self, state: SlotState, now_us: u64, hold_ns: u64) -> (u64, SlotState) {
        let now = u128::from(now_us) * u128::from(NS_PER_US);
        let own = self.tat_in_own_interval(State::from_slot(state), now as i128);
        let tat = u128::try_from(own).unwrap_or(0);
        let free = tat.saturating_sub(now);
        let bought = u128::from(self.tolerance_ns / 16);
        let valid = free.max(bought).min(u128::from(hold_ns));
        let charged = self.state_at(tat.max(now + valid) as i128);
        (u64::try_from(valid).unwrap_or(u64::MAX), charged.to_slot())
    }

    /// The TAT `τ − remaining × T` ahead of `at_us`.
    fn state_with_remaining(&self, remaining: u64, at_us: u64) -> SlotState {
        let units = i128::from(remaining.min(self.limit()));
        let at = i128::from(at_us) * i128::from(NS_PER_US);
        let tat =
            at + i128::from(self.tolerance_ns) - units * i128::from(self.emission_interval_ns);
        self.state_at(tat.max(at)).to_slot()
    }
}

super::slot_algorithm!(Gcra);

/// A duration as the whole seconds `CL.THROTTLE` replies (see [`Gcra::throttle`]).
fn reply_seconds(ns: i128) -> i64 {
    let whole = ns / NS_PER_S;
    let subsec_ms = (ns % NS_PER_S) / NS_PER_MS;
    clamp_i64(if subsec_ms > 0 { whole + 1 } else { whole })
}

fn clamp_u64(x: i128) -> u64 {
    u64::try_from(x.max(0)).unwrap_or(u64::MAX)
}

fn clamp_i64(x: i128) -> i64 {
    i64::try_from(x).unwrap_or(if x < 0 { i64::MIN } else { i64::MAX })
}

/// `S_(i−1)·T − t_i` for the best start `i` so far, with what the report needs of it.
#[derive(Debug, Clone, Copy)]
struct GcraStart {
    key: i128,
    index: usize,
    at_us: u64,
    sum_before: u128,
}

/// `(S_j − S_(i−1))·T ≤ τ + (t_j − t_i)`, in ns. Until the first violation every
/// `S_j·T` is at most `τ + t_j − t_1 < 2^76`, and a cost times `T` is below `2^117`,
/// so i128 holds every value the pass forms; the checked operations only guard that.
fn breach(g: &Gcra, sorted: &[Admission]) -> Option<Breach> {
    let t = i128::from(g.emission_interval_ns());
    let tau = i128::from(g.tolerance_ns());
    let ns = |at_us: u64| i128::from(at_us) * i128::from(NS_PER_US);
    let times_t = |sum: u128| i128::try_from(sum).ok()?.checked_mul(t);
    let mut sum: u128 = 0;
    let mut best: Option<GcraStart> = None;
    for (j, a) in sorted.iter().enumerate() {
        let now = ns(a.at_us);
        // A product beyond i128 is no smallest start: skipping it changes nothing.
        if let Some(key) = times_t(sum).map(|x| x - now) {
            // `<=`: on a tie the later start, the shorter stretch.
            if best.is_none_or(|b| key <= b.key) {
                best = Some(GcraStart {
                    key,
                    index: j,
                    at_us: a.at_us,
                    sum_before: sum,
                });
            }
        }
        sum = sum.saturating_add(u128::from(a.cost));
        // Set at the first admission (`S_0·T − t_1` always fits), so never `None` here.
        let start = best?;
        let excess = times_t(sum).and_then(|x| x.checked_sub(now)?.checked_sub(start.key));
        // Beyond i128 the excess is beyond τ too (`m ≤ −t_1`, and `S_j·T > 2^127`).
        if excess.is_some_and(|e| e <= tau) {
            continue;
        }
        let span_ns = now - ns(start.at_us);
        let allowed = (tau + span_ns) / t;
        return Some(Breach {
            first: start.index,
            last: j,
            admitted: sum - start.sum_before,
            allowed: u128::try_from(allowed).unwrap_or(0),
            why: format!(
                "{} × T ({t}ns) is more than τ ({tau}ns) + {span_ns}ns",
                sum - start.sum_before,
            ),
        });
    }
    None
}
