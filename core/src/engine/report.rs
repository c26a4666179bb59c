//! What the engine says of one rule on one request: its outcome, where the decision came
//! from, the report for metrics and logs, and an enforcing rule's verdict.

use crate::algorithms::Decision;
use crate::rules::RuleId;
use crate::store::{Placement, UpdateError, Updated};

/// What happened to one rule on one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RuleOutcome {
    /// The rule's match did not hold.
    NotMatched,
    /// A key source had no value and no default: the rule did not apply.
    KeyMissing,
    Allowed,
    Limited,
    /// A shadow rule that would have denied.
    ShadowLimited,
    /// The store failed; the local rule let the request through.
    StoreFailed(UpdateError),
    /// The bridge could not answer; the rule's failure mode decided.
    BridgeFailed(FailureOutcome),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureOutcome {
    Allowed,
    /// `failure_mode: deny` (or a shadow rule that would have).
    Denied,
    /// `failure_mode: local`: decided by the local share; `true` if allowed.
    Local {
        allowed: bool,
    },
}

/// Where a decision came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// A local rule's slot.
    Slot,
    /// Units this worker took ahead for a local rule (no shared-data call).
    Reservoir,
    /// Units this Envoy held for a global rule (a lease or a reservation).
    Lease,
    /// A cached denial (of a global rule in shared data, of a local rule in the worker).
    DenialCache,
    /// The bridge, i.e. Redis.
    Bridge,
    /// A global rule's local fallback.
    Fallback,
    /// A global rule whose bridge call Envoy refused for its circuit breaker: denied
    /// until the calls in flight are answered (see `Engine::complete`).
    Refused,
}

/// A rule's report for metrics and logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RuleReport {
    pub rule: RuleId,
    pub outcome: RuleOutcome,
    pub source: Option<Source>,
    /// When the decision was made, µs since the epoch: this Envoy's clock, or Redis's
    /// for a decision of the bridge.
    pub decided_at_us: u64,
    /// What the request costs under this rule (0 when it did not apply).
    pub cost: u64,
    /// The rule reads its limit from the request, and this request's value was there but
    /// not a whole number: the `default` decided it.
    pub limit_invalid: bool,
    pub placement: Option<Placement>,
    /// CAS attempts lost, over every table update the rule made.
    pub cas_retries: u32,
    /// A global rule's lease table failed (the bridge or the failure mode decided).
    pub lease_store_error: Option<UpdateError>,
    /// Reservoirs: units this request's take put in the worker's reservoir, units that
    /// expired unspent in it, and the units lost with another key's entry when the
    /// worker's table was full (`Some`: an entry was taken).
    pub reservoir_taken: u64,
    pub reservoir_expired: u64,
    pub reservoir_lost: Option<u64>,
    /// Global rules with leases: units a reply granted beyond its request's own (a
    /// lease's leftover or a reservation); of them, units that came back with no time
    /// left to spend (the call was slower than the hold it asked for); and units this
    /// request's write of the key's slot dropped unspent (past their time, or a grant
    /// the slot could not keep beside the units it held).
    pub lease_units_granted: u64,
    pub lease_units_late: u64,
    pub lease_units_expired: u64,
    /// A delaying rule denied a request that would have fitted within its `max`,
    /// because the worker already held `queue` requests for it.
    pub delay_queue_full: bool,
    /// A delaying rule denied a request that would have fitted within its `max`,
    /// because the request's own deadline came before its slot (or its release came
    /// after that deadline).
    pub delay_past_deadline: bool,
    /// A `per_key` adaptive rule decided this request's key without a controller of its
    /// own (every record it may use belongs to an active key, or the worker's table of
    /// keys was full of keys with samples waiting): against `max_in_flight`.
    pub key_without_controller: bool,
    /// A concurrency rule's write dropped this many units of the key's places that no
    /// live worker had re-counted for a whole epoch (see [`crate::concurrency`]).
    pub in_flight_reclaimed: u64,
    /// A shared limit's decision: the keys its parent tracks, the key's share, and
    /// whether the key was entitled to nothing (past `share.max_keys`, or naming none).
    pub share: Option<ShareReport>,
    /// The change this request made to the rule's units outstanding: units counted in
    /// the store but not admitted yet, which the rule may still admit beyond what the
    /// store shows — held in this Envoy's lease slots (global rules) or in this worker's
    /// reservoirs (local rules). Units taken or granted add; units spent, dropped unspent
    /// or lost with an evicted slot or entry subtract; a held request's units add when
    /// it is held and subtract when it is released or denied. See
    /// [`Evaluation::drain_outstanding`](super::Evaluation::drain_outstanding).
    pub outstanding_units: i64,
}

impl RuleReport {
    /// A rule looked at `now_us`, not matched until said otherwise.
    pub fn new(rule: RuleId, now_us: u64) -> Self {
        RuleReport {
            rule,
            outcome: RuleOutcome::NotMatched,
            source: None,
            decided_at_us: now_us,
            cost: 0,
            limit_invalid: false,
            placement: None,
            cas_retries: 0,
            lease_store_error: None,
            reservoir_taken: 0,
            reservoir_expired: 0,
            reservoir_lost: None,
            lease_units_granted: 0,
            lease_units_late: 0,
            lease_units_expired: 0,
            delay_queue_full: false,
            delay_past_deadline: false,
            key_without_controller: false,
            in_flight_reclaimed: 0,
            share: None,
            outstanding_units: 0,
        }
    }

    /// Adds what one table update did (or how it failed) to the report.
    pub(super) fn add_update<R>(&mut self, update: &Result<Updated<R>, UpdateError>) {
        match update {
            Ok(u) => {
                self.placement = self.placement.or(u.placement);
                self.cas_retries = self.cas_retries.saturating_add(u.cas_retries);
            }
            Err(e) => self.cas_retries = self.cas_retries.saturating_add(e.lost_attempts()),
        }
    }
}

/// What a shared limit's decision says of its parent and key (for the rule's gauges).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShareReport {
    pub keys: u32,
    pub share: u64,
    pub untracked: bool,
}

/// Units as a signed change (saturating: no count of units comes near `i64::MAX`).
pub(super) fn signed(units: u64) -> i64 {
    i64::try_from(units).unwrap_or(i64::MAX)
}

/// An enforcing rule's decision, for the RateLimit headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    pub rule: RuleId,
    pub decision: Decision,
}
