//! A rule: its name, where it is decided (scope and global settings) and how many keys
//! it tracks; the other fields are compiled by their own modules.

use super::bridge_settings::MAX_BRIDGE_TIMEOUT_US;
use super::{
    cost, delay, error, key, limit, matcher, share, Interner, Result, DEFAULT_MAX_KEYS,
    MAX_MAX_KEYS,
};
use crate::algorithms::{AlgorithmKind, AlgorithmSpec, GlobalLimit, LeaseCost, Limit};
use crate::bounds::{check_name, MAX_LEASE_HORIZON_US, MAX_LEASE_TTL_US, MAX_WANT};
use crate::config::raw::{RawFailureMode, RawGlobal, RawLease, RawReservoir, RawRule, RawScope};
use crate::field_error::{quoted, FieldError};
use crate::rules::{
    FailureMode, GlobalRule, Lease, LimitFrom, RequestMatch, Reservoir, Rule, RuleId, Scope,
};

pub const DEFAULT_LEASE_TTL_US: u64 = 1_000_000;
pub const MAX_EXPECTED_INSTANCES: u64 = 10_000;
/// How far ahead a saturated GCRA key's schedule is reserved by default.
pub const DEFAULT_HORIZON_US: u64 = 100_000;
/// A local rule's reservoirs by default: units per take, hold, keys per worker.
pub const DEFAULT_RESERVOIR_MAX: u64 = 32;
pub const DEFAULT_RESERVOIR_HOLD_US: u64 = 1_000_000;
pub const DEFAULT_RESERVOIR_KEYS: u32 = 1_024;
pub const MAX_RESERVOIR_MAX: u64 = 1_000_000;
pub const MAX_RESERVOIR_HOLD_US: u64 = 60_000_000;
pub const MAX_RESERVOIR_KEYS: u32 = 65_536;

/// A name that goes into stat names and keys (see [`crate::bounds::check_name`]).
pub(super) fn name(name: &str, at: &str) -> Result<String> {
    check_name("rule name", name).map_err(|message| error(at, message))?;
    Ok(name.to_string())
}

#[inline(never)] // a wasm function of its own: see `compile::compile`
pub(super) fn compile(
    id: RuleId,
    name: String,
    mut raw: RawRule,
    at: &str,
    bridge_timeout_us: Option<u64>,
    facts: &mut Interner,
) -> Result<Rule> {
    let matcher = match raw.matcher.take() {
        Some(m) => matcher::compile(m, &format!("{at}.match"), facts)?,
        None => RequestMatch::default(),
    };
    let key = key::compile(
        raw.key.take().unwrap_or_default(),
        &format!("{at}.key"),
        facts,
    )?;
    if raw.limit.algorithm == limit::CONCURRENCY {
        if let Some(share) = raw.share.take() {
            share::compile(share, &raw, None, false, at, facts)?;
        }
        return concurrency_rule(id, name, raw, matcher, key, at, facts);
    }
    let limit = limit::compile(&raw.limit, &format!("{at}.limit"))?;
    let limit_from = limit::from_request(&raw.limit, &limit, &format!("{at}.limit"), facts)?;
    let limit_from_global = limit_from
        .first()
        .filter(|_| matches!(raw.scope, Some(RawScope::Global)));
    if let Some(from) = limit_from_global {
        let parameter = limit
            .kind()
            .spec()
            .parameters
            .get(from.parameter)
            .map_or("", |p| p.name);
        let at = format!("{at}.limit.{parameter}");
        let local_fallback = matches!(
            raw.global.as_ref().and_then(|g| g.failure_mode.as_ref()),
            Some(RawFailureMode::Local)
        );
        if local_fallback {
            return Err(error(
                at,
                "a limit read from the request goes with `failure_mode` \"allow\" or \"deny\": \
                 the local share is sized from the configured limit",
            ));
        }
    }
    let share = match raw.share.take() {
        Some(share) => Some(share::compile(
            share,
            &raw,
            Some(&limit),
            !limit_from.is_empty(),
            at,
            facts,
        )?),
        None => None,
    };
    let scope = scope(
        limit,
        raw.scope.unwrap_or(RawScope::Local),
        raw.global,
        bridge_timeout_us,
        at,
    )?;
    let max_cost = match &scope {
        // A request may carry a larger limit than the configured one: up to every `max`.
        Scope::Local(limit) => widest(limit, &limit_from).max_cost(),
        // A global request asks the bridge for at least its cost, and the wire caps that.
        // Redis decides with its own limit: a GCRA lease pays for its hold with burst, so
        // a cost the configured burst admits may never fit the one Redis runs (the bridge
        // refused such a request with 400, and every global rule of the plugin went to
        // its failure mode for a second: a client could choose it).
        Scope::Global(global) => global.redis_limit.max_cost().min(MAX_WANT),
        Scope::Concurrency(c) => c.max_in_flight,
    };
    let cost =
        cost::compile(raw.cost, max_cost, &format!("{at}.cost"), facts).map_err(
            |e| match &scope {
                Scope::Global(g) if g.redis_limit.max_cost() < g.limit.max_cost() => FieldError {
                    message: format!(
                        "{} in Redis, where the lease pays for its hold (`ttl` and the bridge's \
                         round trip) with {} of the burst",
                        e.message,
                        g.limit.max_cost() - g.redis_limit.max_cost()
                    ),
                    ..e
                },
                _ => e,
            },
        )?;
    let max_keys = max_keys(raw.max_keys, at)?;
    let commit = match raw.commit {
        None => None,
        Some(commit) => {
            let at = format!("{at}.commit");
            let (kind, settles) = match &scope {
                Scope::Local(limit) => (limit.kind().name(), limit.kind().spec().settles()),
                Scope::Concurrency(_) => (limit::CONCURRENCY, false),
                Scope::Global(global) => (
                    global.limit.kind().name(),
                    global.redis_limit.kind().spec().settles(),
                ),
            };
            if !settles {
                return Err(error(
                    at,
                    format!(
                        "a cost known after the response needs a limit that can take back \
                         or add units: algorithm {}, not {}",
                        one_of(AlgorithmKind::names_where(AlgorithmSpec::settles)),
                        quoted(kind)
                    ),
                ));
            }
            if matches!(&scope, Scope::Global(g) if g.lease.is_some()) {
                return Err(error(
                    at,
                    "a global rule with a commit asks Redis for every request (its estimate is \
                     settled there): remove \"global.lease\"",
                ));
            }
            if raw.reservoir.is_some() {
                return Err(error(
                    at,
                    "a rule with a commit decides every request in shared data: remove \
                     \"reservoir\"",
                ));
            }
            if raw.on_limit.is_some() {
                return Err(error(
                    at,
                    "a rule with a commit cannot delay requests (\"on_limit\") in this version",
                ));
            }
            Some(cost::commit(commit, max_cost, &cost, facts, &at)?)
        }
    };
    let reservoir = match (&scope, raw.reservoir) {
        (_, None) if commit.is_some() || share.is_some() => None,
        (_, None) if matches!(scope, Scope::Local(_)) => Some(Reservoir {
            max: DEFAULT_RESERVOIR_MAX,
            hold_us: DEFAULT_RESERVOIR_HOLD_US,
            max_keys: DEFAULT_RESERVOIR_KEYS.min(max_keys),
        }),
        (_, None) => None,
        (Scope::Local(_), Some(raw)) => reservoir(raw, max_keys, &format!("{at}.reservoir"))?,
        (Scope::Concurrency(_), Some(_)) => None,
        (Scope::Global(_), Some(_)) => {
            return Err(error(
                format!("{at}.reservoir"),
                "reservoirs are for local rules; a global rule takes units ahead with \
                 \"global\": {\"lease\": ...}",
            ))
        }
    };
    let shadow = raw.shadow.unwrap_or(false);
    let delay = match raw.on_limit {
        Some(on_limit) => {
            let holder = delay::Holder {
                scope: &scope,
                shared: share.is_some(),
                shadow,
            };
            delay::compile(on_limit, holder, facts, &format!("{at}.on_limit"))?
        }
        None => None,
    };
    Ok(Rule {
        id,
        name,
        matcher,
        key,
        cost,
        scope,
        limit_from,
        share,
        shadow,
        max_keys,
        reservoir,
        delay,
        commit,
        stats: raw.stats,
    })
}

/// A concurrency rule: local, decided in shared data for every request (no reservoir:
/// units in flight are given back, not spent), never delayed, with no commit.
#[inline(never)] // a wasm function of its own: see `compile::compile`
fn concurrency_rule(
    id: RuleId,
    name: String,
    raw: RawRule,
    matcher: RequestMatch,
    key: Vec<crate::rules::KeyPart>,
    at: &str,
    facts: &mut Interner,
) -> Result<Rule> {
    let concurrency = limit::concurrency(&raw.limit, &format!("{at}.limit"))?;
    let refuse = |field: &str, why: &str| Err(error(format!("{at}.{field}"), why.to_string()));
    let per_key = concurrency
        .adaptive
        .is_some_and(|a| a.key_controllers.is_some());
    if per_key && key.is_empty() {
        return refuse(
            "limit.adaptive.per_key",
            "the rule has no key, so it has one controller anyway: add a \"key\" or remove \"per_key\"",
        );
    }
    if raw.scope == Some(RawScope::Global) || raw.global.is_some() {
        let field = if raw.global.is_some() {
            "global"
        } else {
            "scope"
        };
        return refuse(
            field,
            "a concurrency limit counts the requests in flight in this Envoy; it is local only",
        );
    }
    if raw.reservoir.is_some() {
        return refuse(
            "reservoir",
            "a concurrency limit decides every request in shared data: remove \"reservoir\"",
        );
    }
    if raw.on_limit.is_some() {
        return refuse(
            "on_limit",
            "a concurrency limit cannot delay requests: a slot frees when another request \
             ends, not at a time known in advance",
        );
    }
    if raw.commit.is_some() {
        return refuse(
            "commit",
            "a concurrency limit gives its units back when the stream ends; it has no cost \
             to commit",
        );
    }
    let cost = cost::compile(
        raw.cost,
        concurrency.max_in_flight,
        &format!("{at}.cost"),
        facts,
    )?;
    let max_keys = max_keys(raw.max_keys, at)?;
    Ok(Rule {
        id,
        name,
        matcher,
        key,
        cost,
        scope: Scope::Concurrency(concurrency),
        limit_from: Vec::new(),
        share: None,
        shadow: raw.shadow.unwrap_or(false),
        max_keys,
        reservoir: None,
        delay: None,
        commit: None,
        stats: raw.stats,
    })
}

/// `limit` with every parameter read from the request at its `max`.
fn widest(limit: &Limit, limit_from: &[LimitFrom]) -> Limit {
    let mut values = limit.algorithm().parameters();
    for from in limit_from {
        if let Some(value) = values.get_mut(from.parameter) {
            *value = from.max;
        }
    }
    match GlobalLimit::build(limit.kind(), &values) {
        Ok(GlobalLimit::Slot(widest)) => widest,
        _ => limit.clone(),
    }
}

fn max_keys(raw: Option<u64>, at: &str) -> Result<u32> {
    match raw {
        None => Ok(DEFAULT_MAX_KEYS),
        Some(n) => u32::try_from(n)
            .ok()
            .filter(|n| (1..=MAX_MAX_KEYS).contains(n))
            .ok_or_else(|| {
                error(
                    format!("{at}.max_keys"),
                    format!("{n} is out of range: expected 1 to {MAX_MAX_KEYS}"),
                )
            }),
    }
}

/// A local rule's reservoir settings; `max` 1 turns them off (exact).
#[inline(never)] // a wasm function of its own: see `compile::compile`
fn reservoir(raw: RawReservoir, rule_max_keys: u32, at: &str) -> Result<Option<Reservoir>> {
    let max = raw.max.unwrap_or(DEFAULT_RESERVOIR_MAX);
    if max == 0 || max > MAX_RESERVOIR_MAX {
        return Err(error(
            format!("{at}.max"),
            format!("{max} is out of range: expected 1 (exact) to {MAX_RESERVOIR_MAX}"),
        ));
    }
    let hold_us = match raw.hold {
        None => DEFAULT_RESERVOIR_HOLD_US,
        Some(hold) if (1_000..=MAX_RESERVOIR_HOLD_US).contains(&hold.us) => hold.us,
        Some(hold) => {
            return Err(error(
                format!("{at}.hold"),
                format!(
                    "{} is out of range: expected 1ms to 60s",
                    quoted(&hold.text)
                ),
            ))
        }
    };
    let max_keys = match raw.max_keys {
        None => DEFAULT_RESERVOIR_KEYS.min(rule_max_keys),
        Some(n) => u32::try_from(n)
            .ok()
            .filter(|n| (1..=MAX_RESERVOIR_KEYS).contains(n))
            .ok_or_else(|| {
                error(
                    format!("{at}.max_keys"),
                    format!("{n} is out of range: expected 1 to {MAX_RESERVOIR_KEYS}"),
                )
            })?,
    };
    Ok((max > 1).then_some(Reservoir {
        max,
        hold_us,
        max_keys,
    }))
}

#[inline(never)] // a wasm function of its own: see `compile::compile`
fn scope(
    limit: GlobalLimit,
    scope: RawScope,
    global: Option<RawGlobal>,
    bridge_timeout_us: Option<u64>,
    at: &str,
) -> Result<Scope> {
    match scope {
        RawScope::Local => {
            if global.is_some() {
                return Err(error(
                    format!("{at}.global"),
                    "only rules with \"scope\": \"global\" take global settings",
                ));
            }
            match (limit.as_slot(), limit.kind().spec().global_only) {
                (Some(slot), _) => Ok(Scope::Local(slot.clone())),
                (None, why) => Err(error(
                    format!("{at}.limit.algorithm"),
                    why.unwrap_or("this algorithm runs only in Redis"),
                )),
            }
        }
        RawScope::Global => {
            let Some(bridge_timeout_us) = bridge_timeout_us else {
                return Err(error(
                    format!("{at}.scope"),
                    "global rules need the top-level \"bridge\" settings (the Envoy cluster \
                     of weir-bridge)",
                ));
            };
            limit::check_script_exact(&limit, &format!("{at}.limit"))?;
            global_rule(limit, global, bridge_timeout_us, &format!("{at}.global"))
                .map(Scope::Global)
        }
    }
}

#[inline(never)] // a wasm function of its own: see `compile::compile`
fn global_rule(
    limit: GlobalLimit,
    raw: Option<RawGlobal>,
    bridge_timeout_us: u64,
    at: &str,
) -> Result<GlobalRule> {
    let (raw_lease, failure_mode, instances) = match raw {
        Some(g) => (g.lease, g.failure_mode, g.expected_instances),
        None => (None, None, None),
    };
    let expected_instances = match instances {
        None => 1,
        Some(n) if (1..=MAX_EXPECTED_INSTANCES).contains(&n) => n,
        Some(n) => {
            return Err(error(
                format!("{at}.expected_instances"),
                format!("{n} is out of range: expected 1 to {MAX_EXPECTED_INSTANCES}"),
            ))
        }
    };
    let (lease, redis_limit) = match raw_lease {
        Some(raw) => lease(&limit, raw, bridge_timeout_us, &format!("{at}.lease"))?,
        None => (None, limit.clone()),
    };
    let failure_mode = match failure_mode.unwrap_or(RawFailureMode::Allow) {
        RawFailureMode::Allow => FailureMode::Allow,
        RawFailureMode::Deny => FailureMode::Deny,
        RawFailureMode::Local => {
            let share = limit.local_share(expected_instances).map_err(|e| {
                error(
                    format!("{at}.expected_instances"),
                    format!("the limit cannot be divided by {expected_instances}: {e}"),
                )
            })?;
            FailureMode::Local(share)
        }
    };
    Ok(GlobalRule {
        limit,
        redis_limit,
        lease,
        failure_mode,
        expected_instances,
    })
}

/// A rule's lease settings, and the limit Redis enforces with them: what the algorithm
/// says the lease costs ([`crate::algorithms::Algorithm::lease_cost`]; a GCRA key pays
/// for the hold with burst, the others bound it by their own windows or refills).
///
/// A unit's hold counts from when the call left, so the bridge's round trip comes out of
/// it: a call asks for `ttl` plus the round trip the plugin measured
/// ([`crate::rules::Lease::hold_for`]), up to `ttl` plus `round_trip`. A GCRA key pays
/// for that longest hold with burst; `ttl` must be affordable, and so must an explicit
/// `round_trip` beside it.
#[inline(never)] // a wasm function of its own: see `compile::compile`
fn lease(
    limit: &GlobalLimit,
    raw: RawLease,
    bridge_timeout_us: u64,
    at: &str,
) -> Result<(Option<Lease>, GlobalLimit)> {
    // Units a call may take or reserve; a lease now never gets more than the limit
    // admits at once, a reservation may span more of the schedule.
    let max = raw.max.unwrap_or(1);
    if max == 0 || max > MAX_WANT {
        return Err(error(
            format!("{at}.max"),
            format!("{max} is out of range: expected 1 to {MAX_WANT}"),
        ));
    }
    if let Some(ttl) = raw.ttl.as_ref().filter(|ttl| ttl.us > MAX_LEASE_TTL_US) {
        return Err(error(
            format!("{at}.ttl"),
            format!("{} is longer than 1h", quoted(&ttl.text)),
        ));
    }
    if let Some(horizon) = raw.horizon.as_ref().filter(|h| h.us > MAX_LEASE_HORIZON_US) {
        return Err(error(
            format!("{at}.horizon"),
            format!(
                "{} is longer than 10s, the furthest ahead the bridge reserves",
                quoted(&horizon.text)
            ),
        ));
    }
    if max == 1 {
        // Exact: every request asks Redis; nothing waits, nothing to pay for.
        return Ok((None, limit.clone()));
    }
    let algorithm = limit.algorithm();
    let ttl_us = raw.ttl.as_ref().map_or_else(
        || algorithm.default_lease_ttl_us(DEFAULT_LEASE_TTL_US),
        |ttl| ttl.us,
    );
    let paid_by = |hold_us: u64| match algorithm.lease_cost(hold_us) {
        LeaseCost::Free => Some((hold_us, limit.clone())),
        LeaseCost::Burst { limit, .. } => Some((hold_us, limit)),
        LeaseCost::Unaffordable { .. } => None,
    };
    let at_ttl = match algorithm.lease_cost(ttl_us) {
        LeaseCost::Unaffordable {
            units,
            burst,
            per_unit_us,
            affordable_us,
        } => {
            return Err(error(
                at,
                format!(
                    "a {} lease holds each unit for up to `ttl` and pays for it with burst, \
                     one unit per {per_unit_us}us; with a burst of {burst}{}: use exact calls \
                     (`max`: 1), raise the burst, or set `ttl` to at most {affordable_us}us",
                    algorithm.spec().name,
                    match &raw.ttl {
                        Some(ttl) => format!(" a `ttl` of {} costs {units}", quoted(&ttl.text)),
                        None => " the default `ttl` (a quarter of the burst) is 0".to_string(),
                    },
                ),
            ));
        }
        LeaseCost::Free => (ttl_us, limit.clone()),
        LeaseCost::Burst { limit, .. } => (ttl_us, limit),
    };
    // The longest hold a call asks for: `ttl` and the round trip it may lose, which a
    // key that pays with burst pays for. By default the slowest answer (`bridge.timeout`);
    // for a key paying with burst at most its default `ttl` (a quarter of the burst's
    // time), and never so much that less of the burst than that is left for requests
    // (a `ttl` already leaving less gets no round trip by default).
    let pays_with_burst = at_ttl.1 != *limit;
    let round_trip_us = match &raw.round_trip {
        Some(rt) if rt.us > MAX_BRIDGE_TIMEOUT_US => {
            return Err(error(
                format!("{at}.round_trip"),
                format!(
                    "{} is longer than 10s, the longest `bridge.timeout`",
                    quoted(&rt.text)
                ),
            ))
        }
        Some(rt) => rt.us,
        None if pays_with_burst => {
            let quarter_us = algorithm.default_lease_ttl_us(MAX_LEASE_TTL_US);
            let affordable_us = match algorithm.lease_cost(MAX_LEASE_TTL_US) {
                LeaseCost::Unaffordable { affordable_us, .. } => affordable_us,
                LeaseCost::Free | LeaseCost::Burst { .. } => MAX_LEASE_TTL_US,
            };
            let left_us = affordable_us
                .saturating_sub(quarter_us)
                .saturating_sub(ttl_us);
            bridge_timeout_us.min(quarter_us).min(left_us)
        }
        None => bridge_timeout_us,
    };
    let longest_us = ttl_us.saturating_add(round_trip_us).min(MAX_LEASE_TTL_US);
    let (hold_max_us, redis_limit) = match paid_by(longest_us) {
        Some(paid) => paid,
        None => match (&raw.round_trip, algorithm.lease_cost(longest_us)) {
            (
                Some(rt),
                LeaseCost::Unaffordable {
                    units,
                    burst,
                    affordable_us,
                    ..
                },
            ) => {
                return Err(error(
                    format!("{at}.round_trip"),
                    format!(
                        "{} and `ttl` together cost {units} units of a burst of {burst}: \
                         at most {}us of round trip fit",
                        quoted(&rt.text),
                        affordable_us.saturating_sub(ttl_us)
                    ),
                ))
            }
            (None, LeaseCost::Unaffordable { affordable_us, .. }) if affordable_us > ttl_us => {
                paid_by(affordable_us).unwrap_or(at_ttl)
            }
            _ => at_ttl,
        },
    };
    let lease = Lease {
        max,
        ttl_us,
        hold_max_us,
        horizon_us: raw.horizon.map_or(DEFAULT_HORIZON_US, |h| h.us),
    };
    Ok((Some(lease), redis_limit))
}

/// `"a" or "b"`, `"a", "b" or "c"`: the names a message offers.
pub(super) fn one_of(names: Vec<&str>) -> String {
    let quoted: Vec<String> = names.into_iter().map(quoted).collect();
    match quoted.split_last() {
        Some((last, [])) => last.clone(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
        None => "none".to_string(),
    }
}
