//! Token bucket with discrete refills, the model of Envoy's `local_ratelimit` filter.
//!
//! Vocabulary:
//!
//! - **capacity**: the most tokens the bucket holds; a request of `cost` takes `cost`
//!   tokens, and is allowed only if they are all there. The **limit** users see.
//! - **refill**: tokens added at the end of every full **period** since the last refill,
//!   never beyond the capacity.
//! - **last refill**: the instant of the last refill; refills happen at `last refill +
//!   k × period`, so their phase is set by the key's first request.
//!
//! There is no timer: refills owed since the last refill are applied when the next
//! request arrives. A key never seen starts with a full bucket.
//!
//! ```
//! use weir_protocol::algorithms::token_bucket::TokenBucket;
//!
//! // 10 tokens, 2 more every second.
//! let bucket = TokenBucket::new(10, 2, 1_000_000).unwrap();
//! let now = 1_700_000_000_000_000;
//! let (d, state) = bucket.decide(None, now, 10);
//! assert!(d.allowed);
//! assert_eq!(d.remaining, 0);
//! assert_eq!(d.reset_after_ns, 5_000_000_000); // 5 refills to be full again
//!
//! // 3 tokens need 2 refills: retry at the second one.
//! let (d, _) = bucket.decide(state, now + 400_000, 3);
//! assert!(!d.allowed);
//! assert_eq!(d.retry_after_ns, Some(1_600_000_000));
//! ```

use super::saturating::{sat_u64, until_ns};
use super::{
    values_of, Admission, Algorithm, AlgorithmKind, AlgorithmSpec, Breach, Decision, GlobalLimit,
    Limit, LimitParameter, ParamError, Parameter, Policy, SlotAlgorithm, SlotState, Unit,
    MAX_SCRIPT_EXACT, NS_PER_US,
};

const PARAMETERS: &[Parameter] = &[
    Parameter::required("capacity", Unit::Count),
    Parameter::required("refill", Unit::Count),
    Parameter::required("period", Unit::Duration),
];

pub const SPEC: AlgorithmSpec = AlgorithmSpec {
    kind: AlgorithmKind::TokenBucket,
    name: "token_bucket",
    parameters: PARAMETERS,
    global_only: None,
    script: "token_bucket",
    settle_script: Some("token_bucket_settle"),
    extra_script_keys: &[],
    build: |values| {
        let [capacity, refill, period_us] = values_of(values, PARAMETERS)?;
        TokenBucket::new(capacity, refill, period_us)
            .map(|b| GlobalLimit::Slot(Limit::TokenBucket(b)))
    },
    limit_parameter: LimitParameter {
        name: "capacity",
        plus: 0,
    },
    can_hold: true,
    has_schedule: false,
    frees_gradually: true,
    resets_each_window: false,
};

/// Token-bucket parameters, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenBucket {
    capacity: u64,
    refill: u64,
    period_us: u64,
}

/// The per-key state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct State {
    /// Tokens in the bucket at `last_refill_us` (slot word `a`).
    pub tokens: u64,
    /// The instant of the last refill, µs since the Unix epoch (slot word `b`). Ahead of
    /// now it is a refill still to come (a held request counted at it, a debt paid by
    /// it): the bucket holds `tokens` from then on, none before.
    pub last_refill_us: u64,
}

impl State {
    /// Any slot decodes: tokens beyond the capacity are capped when used, and a last
    /// refill in the future holds its tokens until then (none are available before).
    pub fn from_slot(s: SlotState) -> Self {
        State {
            tokens: s.a,
            last_refill_us: s.b,
        }
    }

    pub fn to_slot(self) -> SlotState {
        SlotState {
            a: self.tokens,
            b: self.last_refill_us,
        }
    }
}

impl TokenBucket {
    /// `capacity` (≥ 1) tokens, `refill` (≥ 1) more every `period_us` (≥ 1 µs). A refill
    /// above the capacity is allowed: it just fills the bucket.
    pub fn new(capacity: u64, refill: u64, period_us: u64) -> Result<Self, ParamError> {
        if capacity == 0 {
            return Err(ParamError::new("capacity", "must be at least 1"));
        }
        if refill == 0 {
            return Err(ParamError::new("refill", "must be at least 1"));
        }
        if period_us == 0 {
            return Err(ParamError::new("period", "must be at least 1us"));
        }
        Ok(TokenBucket {
            capacity,
            refill,
            period_us,
        })
    }

    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    pub fn refill(&self) -> u64 {
        self.refill
    }

    pub fn period_us(&self) -> u64 {
        self.period_us
    }

    /// Decides `cost` tokens at `now_us`. A clock earlier than the last refill finds no
    /// tokens: the state was counted for that instant (a held request, a debt paying
    /// off), and spending them earlier would spend a refill before it comes.
    pub fn decide(
        &self,
        state: Option<State>,
        now_us: u64,
        cost: u64,
    ) -> (Decision, Option<State>) {
        let s = self.refilled(
            state.unwrap_or(State {
                tokens: self.capacity,
                last_refill_us: now_us,
            }),
            now_us,
        );
        // A last refill ahead of now is a state counted at a future instant (a held
        // request counted at its refill, a debt paying off): its tokens exist from then
        // on, and a request before it finds none. Read as if the refill had come, they
        // would be spent before it, by as many requests as the refill is large.
        let available = if now_us < s.last_refill_us {
            0
        } else {
            s.tokens
        };
        let allowed = cost <= available;
        let after = if allowed {
            State {
                tokens: s.tokens - cost,
                last_refill_us: s.last_refill_us,
            }
        } else {
            s
        };
        let retry_after_ns = if allowed || cost > self.capacity {
            None
        } else {
            Some(until_ns(self.refilled_at_us(&s, cost), now_us))
        };
        let decision = Decision {
            allowed,
            limit: self.capacity,
            remaining: if allowed { available - cost } else { available },
            retry_after_ns,
            reset_after_ns: until_ns(self.refilled_at_us(&after, self.capacity), now_us),
        };
        let new_state = (allowed && cost > 0).then_some(after);
        (decision, new_state)
    }

    /// The refill at which the bucket is full again.
    pub fn idle_at_us(&self, state: &State) -> u64 {
        self.refilled_at_us(state, self.capacity)
    }

    /// `capacity` tokens per the time it takes to refill them all from empty.
    pub fn policy(&self) -> Policy {
        Policy {
            quota: self.capacity,
            window_ns: sat_u64(self.fill_us().saturating_mul(u128::from(NS_PER_US))),
        }
    }

    /// µs to refill an empty bucket: `period × ⌈capacity / refill⌉`.
    fn fill_us(&self) -> u128 {
        u128::from(self.period_us) * u128::from(self.capacity.div_ceil(self.refill))
    }

    /// The refill the Lua script gets. A refill above the capacity only ever fills the
    /// bucket: capping it changes no decision and keeps the script's products small.
    fn script_refill(&self) -> u64 {
        self.refill.min(self.capacity)
    }

    /// `state` with the refills owed at `now_us` applied.
    fn refilled(&self, state: State, now_us: u64) -> State {
        let periods = now_us.saturating_sub(state.last_refill_us) / self.period_us;
        let tokens = u128::from(state.tokens) + u128::from(periods) * u128::from(self.refill);
        State {
            tokens: sat_u64(tokens).min(self.capacity),
            // periods × period ≤ now − last refill: no overflow.
            last_refill_us: state.last_refill_us + periods * self.period_us,
        }
    }

    /// The first refill instant (µs) at which `state` holds at least `want` tokens
    /// (`last_refill_us` itself if it already does).
    fn refilled_at_us(&self, state: &State, want: u64) -> u64 {
        let missing = want.saturating_sub(state.tokens);
        let refills = missing.div_ceil(self.refill);
        let at =
            u128::from(state.last_refill_us) + u128::from(refills) * u128::from(self.period_us);
        sat_u64(at)
    }
}

impl Algorithm for TokenBucket {
    fn spec(&self) -> &'static AlgorithmSpec {
        &SPEC
    }

    fn parameters(&self) -> Vec<u64> {
        vec![self.capacity, self.refill, self.period_us]
    }

    fn policy(&self) -> Policy {
        TokenBucket::policy(self)
    }

    /// An even share of the capacity, refilled at an even share of the pace (the same
    /// refill every `instances` periods).
    fn local_share(&self, instances: u64) -> Result<Limit, ParamError> {
        let n = instances.max(1);
        TokenBucket::new(
            (self.capacity / n).max(1),
            self.refill,
            self.period_us.saturating_mul(n),
        )
        .map(Limit::TokenBucket)
    }

    fn lease_ttl_ns(&self, _now_us: u64) -> Option<u64> {
        None
    }

    /// `[capacity, min(refill, capacity), period_us]`.
    fn script_args(&self) -> Vec<u64> {
        vec![self.capacity, self.script_refill(), self.period_us]
    }

    fn check_script_exact(&self) -> Result<(), ParamError> {
        if self.capacity > MAX_SCRIPT_EXACT {
            return Err(ParamError::new(
                "capacity",
                "must be at most 2^48 for exact arithmetic in Redis",
            ));
        }
        // The time to refill an empty bucket bounds every instant the script forms.
        let fill_us =
            u128::from(self.period_us) * u128::from(self.capacity.div_ceil(self.script_refill()));
        if fill_us > u128::from(MAX_SCRIPT_EXACT) {
            return Err(ParamError::new(
                "period",
                "period × ⌈capacity / refill⌉ must be at most 2^48 us (about 8.9 years) for \
                 exact arithmetic in Redis",
            ));
        }
        Ok(())
    }

    /// The bound, with discrete refills (capacity `C`, refill `R` every period `P`):
    /// refills happen every `P` from the key's first request, a phase the checker cannot
    /// know, so the bound is the one every phase keeps: for all `i ≤ j`,
    /// `S_j − S_(i−1) ≤ C + R·⌈(t_j − t_i) / P⌉`, the most refill instants any phase puts
    /// in `(t_i, t_j]`. Not the continuous `C + R·(t_j − t_i)/P`: a central bucket takes
    /// `C` just before a refill and `R` just after, `C + R` within a microsecond.
    /// With `k = ⌊t/P⌋` and `r = t mod P`, `⌈(t_j − t_i)/P⌉ = k_j − k_i + [r_j > r_i]`,
    /// so for each `j` the worst `i` is the one with the largest `R·k_i − S_(i−1)` among
    /// the earlier admissions whose remainder is below `r_j` (one more refill instant) and
    /// among those at or above it: two prefix-maximum Fenwick trees over the remainders.
    ///
    /// A breach reports as `allowed` `C + R·⌈(t_last − t_first) / P⌉`, chosen the same
    /// way.
    fn check_bound(&self, sorted: &[Admission]) -> Option<Breach> {
        breach(self, sorted)
    }
}

impl SlotAlgorithm for TokenBucket {
    /// A refund while no refill came since the request was counted: the bucket then
    /// holds exactly what it would have after the actual cost (refills are where the
    /// capacity cuts, and none happened). An excess takes tokens now; what the bucket
    /// lacks is a debt paid by the next refills, exactly: the bucket is stored at the
    /// refill that pays the last of it, holding what that refill leaves over (tokens a
    /// reader before that instant does not see, [`TokenBucket::decide`]) — as a bucket
    /// allowed to go below zero would hold them. A debt reaching further than
    /// [`MAX_SCRIPT_EXACT`] µs past now is paid by the refills until then and the rest
    /// forgiven.
    fn settle(
        &self,
        state: SlotState,
        counted_at_us: u64,
        reserved: u64,
        actual: u64,
        now_us: u64,
    ) -> Option<SlotState> {
        let now = self.refilled(State::from_slot(state), now_us);
        if actual < reserved {
            if now.last_refill_us > counted_at_us {
                return None;
            }
            let tokens = now
                .tokens
                .saturating_add(reserved - actual)
                .min(self.capacity);
            return Some(State { tokens, ..now }.to_slot());
        }
        let excess = actual - reserved;
        if excess <= now.tokens {
            return Some(
                State {
                    tokens: now.tokens - excess,
                    ..now
                }
                .to_slot(),
            );
        }
        // A refill above the capacity only fills the bucket: the debt is paid at most a
        // bucketful per period (as the Redis script, which gets the capped refill).
        let refill = u128::from(self.script_refill());
        let period = u128::from(self.period_us);
        let last = u128::from(now.last_refill_us);
        let debt = u128::from(excess - now.tokens);
        let periods = debt.div_ceil(refill);
        let horizon = u128::from(now_us) + u128::from(MAX_SCRIPT_EXACT);
        let most = horizon.saturating_sub(last) / period;
        let (periods, tokens) = if periods > most {
            (most, 0)
        } else {
            (periods, periods * refill - debt)
        };
        Some(
            State {
                tokens: sat_u64(tokens),
                last_refill_us: sat_u64(last + periods * period),
            }
            .to_slot(),
        )
    }

    /// Counted at its refill, `due`: released before the next refill it spends that
    /// refill's tokens, as a request decided then would. (A refill period shorter than
    /// the slack leaves the timer less room: a later release is decided again.)
    fn delay_window(&self, due_us: u64, _cost: u64, _slack_us: u64) -> Option<(u64, u64)> {
        Some((
            due_us,
            due_us.saturating_add(self.period_us.saturating_sub(1)),
        ))
    }

    /// Until the next refill: a unit counted in one refill period and spent in the
    /// next would let both periods' refills be spent together.
    fn lease_cap_ns(&self, state: SlotState, now_us: u64) -> Option<u64> {
        let next_refill = State::from_slot(state)
            .last_refill_us
            .saturating_add(self.period_us);
        Some(until_ns(next_refill, now_us))
    }

    /// `remaining` tokens, the refill period starting at `at_us`.
    fn state_with_remaining(&self, remaining: u64, at_us: u64) -> SlotState {
        State {
            tokens: remaining.min(self.capacity),
            last_refill_us: at_us,
        }
        .to_slot()
    }
}

super::slot_algorithm!(TokenBucket);

/// An earlier admission `i` as a start for the token bucket: `R·k_i` and `S_(i−1)`,
/// whose difference ranks it (see [`TbStart::beats`]).
#[derive(Debug, Clone, Copy)]
struct TbStart {
    /// `R·⌊t_i / P⌋`: below `2^128` since both factors are below `2^64`.
    refills: u128,
    sum_before: u128,
    index: usize,
    at_us: u64,
}

impl TbStart {
    /// A larger `R·k − S` (a worse stretch for every later end), or the same and later.
    /// The difference may need 129 bits, so the sides are compared as
    /// `R·k_a + S_b` against `R·k_b + S_a`, each summed with its carry.
    fn beats(&self, other: &TbStart) -> bool {
        let wide = |x: u128, y: u128| {
            let (sum, carry) = x.overflowing_add(y);
            (carry, sum)
        };
        let mine = wide(self.refills, other.sum_before);
        let theirs = wide(other.refills, self.sum_before);
        mine > theirs || (mine == theirs && self.index > other.index)
    }
}

/// A Fenwick tree answering "the best start among positions below `len`".
struct PrefixBest {
    nodes: Vec<Option<TbStart>>,
}

impl PrefixBest {
    fn new(len: usize) -> Self {
        PrefixBest {
            nodes: vec![None; len],
        }
    }

    fn insert(&mut self, position: usize, start: TbStart) {
        let mut i = position + 1;
        while let Some(node) = self.nodes.get_mut(i - 1) {
            if node.is_none_or(|n| start.beats(&n)) {
                *node = Some(start);
            }
            i += i & i.wrapping_neg();
        }
    }

    fn best_below(&self, len: usize) -> Option<TbStart> {
        let mut best: Option<TbStart> = None;
        let mut i = len;
        while i > 0 {
            if let Some(Some(node)) = self.nodes.get(i - 1) {
                if best.is_none_or(|b| node.beats(&b)) {
                    best = Some(*node);
                }
            }
            i &= i - 1;
        }
        best
    }
}

/// `S_j − S_(i−1) ≤ C + R·⌈(t_j − t_i)/P⌉`, the bound of every refill phase.
fn breach(b: &TokenBucket, sorted: &[Admission]) -> Option<Breach> {
    let (capacity, refill, period) = (b.capacity(), b.refill(), b.period_us());
    let mut remainders: Vec<u64> = sorted.iter().map(|a| a.at_us % period).collect();
    remainders.sort_unstable();
    remainders.dedup();
    let ranks = remainders.len();
    // `below` by rank: the starts with a smaller remainder. `at_or_above` by rank
    // reversed: the starts with the same or a larger one.
    let mut below = PrefixBest::new(ranks);
    let mut at_or_above = PrefixBest::new(ranks);
    let mut sum: u128 = 0;
    for (j, a) in sorted.iter().enumerate() {
        let k = a.at_us / period;
        let rank = remainders.partition_point(|&r| r < a.at_us % period);
        let start = TbStart {
            refills: u128::from(refill) * u128::from(k),
            sum_before: sum,
            index: j,
            at_us: a.at_us,
        };
        below.insert(rank, start);
        at_or_above.insert(ranks - 1 - rank, start);
        sum = sum.saturating_add(u128::from(a.cost));

        // Refill instants any phase can put in (t_i, t_j]: k_j − k_i, plus one when
        // r_i < r_j. The worst start of each kind, then the worse of the two.
        let candidates = [
            (below.best_below(rank), 1),
            (at_or_above.best_below(ranks - rank), 0),
        ];
        let mut worst: Option<(u128, TbStart, u128)> = None;
        for (start, extra) in candidates {
            let Some(start) = start else { continue };
            let instants = u128::from(k - start.at_us / period) + extra;
            let admitted = sum - start.sum_before;
            let allowed = u128::from(refill)
                .checked_mul(instants)
                .and_then(|x| x.checked_add(u128::from(capacity)));
            let Some(allowed) = allowed.filter(|&x| admitted > x) else {
                continue;
            };
            let excess = admitted - allowed;
            if worst.is_none_or(|(e, s, _)| excess > e || (excess == e && start.index > s.index)) {
                worst = Some((excess, start, instants));
            }
        }
        if let Some((excess, start, instants)) = worst {
            let admitted = sum - start.sum_before;
            return Some(Breach {
                first: start.index,
                last: j,
                admitted,
                allowed: admitted - excess,
                why: format!(
                    "capacity {capacity} + {refill} × {instants} refill instant(s), the most \
                     that any phase of refills every {period}us puts in ({}us, {}us]",
                    start.at_us, a.at_us,
                ),
            });
        }
    }
    None
}
