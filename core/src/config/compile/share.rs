//! A rule's `share`: the key within the parent (trusted facts only), how many keys a
//! parent tracks, and where a key's weight comes from.

use super::rule::one_of;
use super::{error, header_name, key, Interner, Result};
use crate::algorithms::{AlgorithmKind, GlobalLimit};
use crate::config::raw::{RawFailureMode, RawRule, RawScope, RawShare};
use crate::field_error::quoted;
use crate::rules::{LimitFrom, Share};
use crate::share::{ShareLimit, MAX_GLOBAL_SHARE_LIMIT, MAX_SHARE_KEYS, MAX_WEIGHT};

/// Keys a parent tracks when `share.max_keys` is not set.
pub const DEFAULT_SHARE_KEYS: u32 = 100;

#[inline(never)] // a wasm function of its own: see `compile::compile`
pub(super) fn compile(
    share: RawShare,
    rule: &RawRule,
    limit: Option<&GlobalLimit>,
    reads_limit: bool,
    at: &str,
    facts: &mut Interner,
) -> Result<Share> {
    let at = format!("{at}.share");
    let Some(shared) = limit.and_then(|l| ShareLimit::of(l, DEFAULT_SHARE_KEYS)) else {
        let algorithm = limit.map_or("concurrency", |l| l.kind().name());
        return Err(error(
            at,
            format!(
                "a shared limit needs a limit that comes back whole at each window (algorithm \
                 {}; entitlements are counted per window), not {}",
                one_of(AlgorithmKind::names_where(|spec| spec.resets_each_window)),
                quoted(algorithm)
            ),
        ));
    };
    let global = matches!(rule.scope, Some(RawScope::Global));
    let settings = rule.global.as_ref();
    let conflict = [
        (
            settings.is_some_and(|g| g.failure_mode == Some(RawFailureMode::Local)),
            "\"failure_mode\": \"local\"",
        ),
        (rule.reservoir.is_some(), "\"reservoir\""),
        (
            rule.commit.as_ref().is_some_and(|c| c.clamp.is_some()),
            "\"commit.clamp\"",
        ),
        (reads_limit, "a limit read from the request"),
    ];
    if let Some((_, what)) = conflict.iter().find(|(set, _)| *set) {
        return Err(error(
            at,
            format!(
                "a shared limit decides every request where its keys are counted (shared data, \
                 or Redis through the bridge) and has a fixed limit in this version: remove \
                 {what}"
            ),
        ));
    }
    if global && shared.limit > MAX_GLOBAL_SHARE_LIMIT {
        return Err(error(
            at,
            format!(
                "a global shared limit counts in Redis's Lua, exactly up to a limit of \
                 {MAX_GLOBAL_SHARE_LIMIT}; found {}",
                shared.limit
            ),
        ));
    }
    if share.by.is_empty() {
        return Err(error(
            format!("{at}.by"),
            "the list is empty: name the key within the rule's key (e.g. a user's claim)",
        ));
    }
    for (j, part) in share.by.iter().enumerate() {
        let at = format!("{at}.by[{j}]");
        let found: Vec<&str> = part
            .sources()
            .iter()
            .filter(|(_, set)| *set)
            .map(|(name, _)| *name)
            .collect();
        match found.as_slice() {
            ["jwt_claim"] | ["attribute"] => {}
            ["header"] => {
                let name = part.header.as_deref().unwrap_or_default();
                let name = header_name(name, &format!("{at}.header"), "use a regular header")?;
                if !facts.trusts(&name) {
                    return Err(error(
                        format!("{at}.header"),
                        format!(
                            "{} is not in `trusted_headers`: a client could mint keys of its own \
                             and take the whole limit. List it there only once Envoy removes it \
                             from requests and a filter before weir writes it",
                            quoted(&name)
                        ),
                    ));
                }
            }
            [source] => {
                return Err(error(
                    at,
                    format!(
                        "a key within a shared limit comes from a fact clients cannot choose \
                         (a `jwt_claim`, an `attribute`, or a `header` in `trusted_headers`), \
                         not `{source}`"
                    ),
                ))
            }
            // None or several: the key compiler says which.
            _ => {}
        }
    }
    let by = key::compile(share.by, &format!("{at}.by"), facts)?;
    let max_keys = match share.max_keys {
        None => DEFAULT_SHARE_KEYS,
        Some(n) if (1..=u64::from(MAX_SHARE_KEYS)).contains(&n) => n as u32,
        Some(n) => {
            return Err(error(
                format!("{at}.max_keys"),
                format!("{n} is out of range: expected 1 to {MAX_SHARE_KEYS}"),
            ))
        }
    };
    let weight = match share.weight {
        None => None,
        Some(from) => {
            let at = format!("{at}.weight");
            let (fact, attribute) = key::value_source(&from, &at, facts)?;
            let max = from.max.ok_or_else(|| {
                error(
                    &at,
                    "missing field `max`: the most a request's weight may be",
                )
            })?;
            let min = from.min.unwrap_or(1);
            let default = from.default.unwrap_or(1);
            if min == 0 || max > MAX_WEIGHT || !(min <= default && default <= max) {
                return Err(error(
                    &at,
                    format!(
                        "expected 1 ≤ min ≤ default ≤ max ≤ {MAX_WEIGHT}; found min {min}, \
                         default {default}, max {max}"
                    ),
                ));
            }
            Some(LimitFrom {
                parameter: 0,
                fact,
                attribute,
                default,
                min,
                max,
            })
        }
    };
    Ok(Share {
        by,
        limit: ShareLimit { max_keys, ..shared },
        weight,
    })
}
