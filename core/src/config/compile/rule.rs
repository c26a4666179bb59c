//! A rule: its name, where it is decided (scope and global settings) and how many keys
//! it tracks; the other fields are compiled by their own modules.

use super::{cost, error, key, limit, matcher, Interner, Result, DEFAULT_MAX_KEYS, MAX_MAX_KEYS};
use crate::algorithms::GlobalLimit;
use crate::bounds::{check_name, MAX_WANT};
use crate::config::raw::{RawFailureMode, RawGlobal, RawRule, RawScope};
use crate::field_error::quoted;
use crate::rules::{FailureMode, GlobalRule, RequestMatch, Rule, RuleId, Scope};

pub const DEFAULT_LEASE_TTL_US: u64 = 1_000_000;
pub const MAX_LEASE_TTL_US: u64 = 3_600_000_000;
pub const MAX_EXPECTED_INSTANCES: u64 = 10_000;

/// A name that goes into stat names and keys (see [`crate::bounds::check_name`]).
pub(super) fn name(name: &str, at: &str) -> Result<String> {
    check_name("rule name", name).map_err(|message| error(at, message))?;
    Ok(name.to_string())
}

pub(super) fn compile(
    id: RuleId,
    name: String,
    raw: RawRule,
    at: &str,
    has_bridge: bool,
    facts: &mut Interner,
) -> Result<Rule> {
    let matcher = match raw.matcher {
        Some(m) => matcher::compile(m, &format!("{at}.match"), facts)?,
        None => RequestMatch::default(),
    };
    let key = key::compile(raw.key.unwrap_or_default(), &format!("{at}.key"), facts)?;
    let limit = limit::compile(&raw.limit, &format!("{at}.limit"))?;
    let scope = scope(
        limit,
        raw.scope.unwrap_or(RawScope::Local),
        raw.global,
        has_bridge,
        at,
    )?;
    let max_cost = match &scope {
        Scope::Local(limit) => limit.max_cost(),
        // A global request asks the bridge for at least its cost, and the wire caps that.
        Scope::Global(global) => global.limit.max_cost().min(MAX_WANT),
    };
    let cost = cost::compile(raw.cost, max_cost, &format!("{at}.cost"), facts)?;
    let max_keys = match raw.max_keys {
        None => DEFAULT_MAX_KEYS,
        Some(n) => u32::try_from(n)
            .ok()
            .filter(|n| (1..=MAX_MAX_KEYS).contains(n))
            .ok_or_else(|| {
                error(
                    format!("{at}.max_keys"),
                    format!("{n} is out of range: expected 1 to {MAX_MAX_KEYS}"),
                )
            })?,
    };
    Ok(Rule {
        id,
        name,
        matcher,
        key,
        cost,
        scope,
        shadow: raw.shadow.unwrap_or(false),
        max_keys,
    })
}

fn scope(
    limit: GlobalLimit,
    scope: RawScope,
    global: Option<RawGlobal>,
    has_bridge: bool,
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
            if !has_bridge {
                return Err(error(
                    format!("{at}.scope"),
                    "global rules need the top-level \"bridge\" settings (the Envoy cluster \
                     of weir-bridge)",
                ));
            }
            limit::check_script_exact(&limit, &format!("{at}.limit"))?;
            global_rule(limit, global, &format!("{at}.global")).map(Scope::Global)
        }
    }
}

fn global_rule(limit: GlobalLimit, raw: Option<RawGlobal>, at: &str) -> Result<GlobalRule> {
    let (lease, failure_mode, instances) = match raw {
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
    let (lease_max, lease_ttl_us) = match lease {
        None => (1, DEFAULT_LEASE_TTL_US),
        Some(lease) => {
            let max = lease.max.unwrap_or(1);
            let most = limit.max_cost().min(MAX_WANT);
            if max == 0 || max > most {
                return Err(error(
                    format!("{at}.lease.max"),
                    format!(
                        "{max} is out of range: expected 1 to {most} (what the limit admits at once)"
                    ),
                ));
            }
            let ttl = match lease.ttl {
                None => DEFAULT_LEASE_TTL_US,
                Some(ttl) if ttl.us <= MAX_LEASE_TTL_US => ttl.us,
                Some(ttl) => {
                    return Err(error(
                        format!("{at}.lease.ttl"),
                        format!("{} is longer than 1h", quoted(&ttl.text)),
                    ))
                }
            };
            (max, ttl)
        }
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
        lease_max,
        lease_ttl_us,
        failure_mode,
        expected_instances,
    })
}
