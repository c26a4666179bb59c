//! What a [`Limit`] does with its algorithm: decisions, grants for the bridge, units
//! taken ahead for reservoirs, held requests and settled costs — the same for every
//! slot algorithm, through [`SlotAlgorithm`].

use super::{
    Ahead, Ask, Decision, Grant, Hold, Limit, Policy, SlotState, TakenAhead, NS_PER_US,
    RESERVOIR_SHARE,
};

impl Limit {
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
    /// wants it. Units granted now may be spent until `ttl_us` or the algorithm's own
    /// cap ([`SlotAlgorithm::lease_cap_ns`]), reserved ones `ttl_us` after each is due.
    ///
    /// This is the reference weir-bridge's Lua scripts are checked against, field for
    /// field, for the slot algorithms.
    pub fn grant(
        &self,
        state: Option<SlotState>,
        now_us: u64,
        ask: Ask,
    ) -> (Grant, Option<SlotState>) {
        let ttl_ns = ask.ttl_us.saturating_mul(NS_PER_US);
        let (decision, granted, next) = self.acquire(state, now_us, ask.cost, ask.want);
        if decision.allowed {
            // Units granted (a peek grants none, and none has a validity).
            let valid_ns = match next {
                Some(after) if granted > 0 => self
                    .algorithm()
                    .lease_cap_ns(after, now_us)
                    .map_or(ttl_ns, |cap| cap.min(ttl_ns)),
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
                    valid_ns: ttl_ns,
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
