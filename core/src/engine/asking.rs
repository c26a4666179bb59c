//! How much a global rule's call asks the bridge for: an exact rule its request's cost;
//! with leases, what this Envoy's demand would spend within the call's hold and, for a
//! key whose schedule can be reserved, over the reservation horizon (see [`ask_for`]).

use crate::lease::LeaseSlot;
use crate::rules::GlobalRule;

use super::report::RuleReport;

/// What a global rule that must ask the bridge asks for.
pub(super) struct Asked {
    pub(super) want: u64,
    pub(super) reserve: u64,
    pub(super) last_known: Option<(u64, u64)>,
    pub(super) lookup: RuleReport,
}

/// What an ask is sized by besides the key's demand rate.
#[derive(Debug, Clone, Copy)]
pub(super) struct AskingFor {
    /// When the ask is made, µs.
    pub(super) now_us: u64,
    /// The bridge's round trip as this plugin measured it, µs.
    pub(super) round_trip_us: u64,
    /// Units of the requests queued on the key now, which the call must serve: those
    /// that waited on a call that came back without enough (see
    /// [`super::Engine::revisit`]).
    pub(super) waiting: u64,
}

/// How much a global rule asks for: exact rules their cost. With leases, what this
/// Envoy's demand would spend within the hold the call asks for (from when it leaves:
/// requests arriving while it is in flight wait for it and spend on its arrival) — but no
/// more than an even share of what Redis had left last time — and, for a saturated GCRA
/// key, what it would spend over the reservation horizon; either at least the units of
/// the requests queued on the key now. A rate measures arrivals, and while requests wait
/// on a slow call, arrivals are only what was answered: in a closed loop (each client
/// sends again once answered) behind a bridge slower than `ttl`, asking for the rate over
/// `ttl` alone shrank each call to one request.
pub(super) fn ask_for(
    global: &GlobalRule,
    slot: &LeaseSlot,
    cost: u64,
    demand_per_s: u64,
    asking: AskingFor,
) -> (u64, u64) {
    let Some(lease) = global.lease else {
        return (cost, 0);
    };
    if slot.held.count > 0 {
        // Units held (too few for this request, or a reservation it cannot use): ask
        // for this request alone, so a grant never replaces units Redis has counted.
        return (cost, 0);
    }
    let over = |span_us: u64| {
        let units = u128::from(demand_per_s) * u128::from(span_us);
        u64::try_from(units.div_ceil(1_000_000)).unwrap_or(u64::MAX)
    };
    // Requests arriving while the call is in flight wait for it, and spend on its arrival:
    // its demand is over the whole hold. Not a saturated key's: they are denied meanwhile
    // (`GlobalRuntime::asking`), and its units get what is left of the hold after the
    // round trip (`ttl`, or less when the bridge is slower than `round_trip`): units asked
    // for beyond what arrives then would expire unspent.
    let hold_us = lease.hold_for(asking.round_trip_us);
    let saturated = lease.saturated(slot.remote_remaining, slot.remote_at_us, asking.now_us);
    let span_us = if saturated {
        hold_us.saturating_sub(asking.round_trip_us)
    } else {
        hold_us
    };
    let mut want = over(span_us).max(asking.waiting);
    let reserves = has_schedule(global) && lease.horizon_us > 0;
    // An even share of what Redis had left. But for a key whose schedule can be reserved,
    // only while that covers this Envoy's demand: when its demand alone is more than the
    // key has left, the key runs out either way, and taking only a share each call would
    // leave a trickle that every call takes again — a call per round trip, with requests
    // queueing on it — never empty enough to reserve the schedule instead.
    if slot.remote_at_us > 0 && !(reserves && want > slot.remote_remaining) {
        let share = (slot.remote_remaining / global.expected_instances.max(1)).max(1);
        want = want.min(share);
    }
    let want = want.clamp(cost, lease.max.max(cost));
    let reserve = if reserves {
        over(lease.horizon_us)
            .min(spendable_slots(global, demand_per_s, lease.ttl_us))
            .max(asking.waiting)
            .clamp(cost, lease.max.max(cost))
    } else {
        0
    };
    (want, reserve)
}

/// The most slots of a key's schedule (GCRA's) this Envoy can spend when it reserves them
/// (`u64::MAX`: no bound below the horizon's). `n` reserved slots fall due one emission
/// interval `T` apart and each may wait `ttl` after it: an Envoy whose demand `d` is below
/// the key's rate spends `d · (n·T + ttl)` of them, which covers `n` only while
/// `n ≤ d · ttl / (1 − d·T)`. Asking for its demand over the whole horizon instead let a
/// light Envoy beside a heavy one reserve slots it could not spend, which the heavy one
/// was then denied (issue 35: 15.6 % under the bound with 90 % of twice the rate on one
/// of two Envoys).
fn spendable_slots(global: &GlobalRule, demand_per_s: u64, ttl_us: u64) -> u64 {
    if !has_schedule(global) {
        return u64::MAX;
    }
    // A schedule's slots are its window over its quota apart (GCRA: the tolerance over
    // `burst + 1`, the emission interval).
    let policy = global.redis_limit.policy();
    let spacing_ns = policy.window_ns / policy.quota.max(1);
    // d·T and d·ttl in units of 10⁻⁹ (demand per s × ns).
    let d = u128::from(demand_per_s);
    let spent_per_slot = d * u128::from(spacing_ns);
    let Some(slack) = 1_000_000_000u128
        .checked_sub(spent_per_slot)
        .filter(|&s| s > 0)
    else {
        return u64::MAX;
    };
    let over_ttl = d * u128::from(ttl_us) * 1_000;
    u64::try_from(over_ttl / slack).unwrap_or(u64::MAX)
}

/// Whether the rule's Redis limit has a schedule whose slots can be reserved.
pub(super) fn has_schedule(global: &GlobalRule) -> bool {
    global.redis_limit.kind().spec().has_schedule
}
