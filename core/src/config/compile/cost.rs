//! A rule's `cost`: a fixed number, or a request header's value within `min..=max`.
//!
//! A cost is never 0: a request of cost 0 only peeks at its key and always passes, so a
//! client that controls the cost header could never be limited.

use super::{error, header_name, Interner, Result};
use crate::config::raw::{RawCommit, RawCost};
use crate::rules::{Commit, CommitSource, Cost, Fact};
use crate::usage::{UsageField, DEFAULT_FIELDS};

/// A response body kept to read its usage: 1 MiB by default, 1 KiB to 16 MiB.
pub const DEFAULT_COMMIT_BODY_BYTES: usize = 1 << 20;
pub const MAX_COMMIT_BODY_BYTES: u64 = 16 << 20;
pub const MAX_COMMIT_FIELDS: usize = 16;

/// `commit`: where the response says what the request cost. `max_cost` bounds
/// `on_error` like the cost itself.
pub(super) fn commit(raw: RawCommit, max_cost: u64, at: &str) -> Result<Commit> {
    let on_error = match raw.on_error {
        None => 0,
        Some(n) if n <= max_cost => n,
        Some(n) => {
            return Err(error(
                format!("{at}.on_error"),
                format!("{n} is more than the limit holds: at most {max_cost}"),
            ))
        }
    };
    let source = match (raw.header, raw.body) {
        (Some(header), None) => CommitSource::Header(header_name(
            &header,
            &format!("{at}.header"),
            "the cost comes from a regular response header",
        )?),
        (None, Some(body)) => {
            let at = format!("{at}.body");
            let texts: Vec<String> = match body.fields {
                None => DEFAULT_FIELDS.iter().map(|f| f.to_string()).collect(),
                Some(fields) if fields.is_empty() || fields.len() > MAX_COMMIT_FIELDS => {
                    return Err(error(
                        format!("{at}.fields"),
                        format!("{} fields; expected 1 to {MAX_COMMIT_FIELDS}", fields.len()),
                    ))
                }
                Some(fields) => fields,
            };
            let fields = texts
                .iter()
                .enumerate()
                .map(|(i, text)| {
                    UsageField::parse(text).map_err(|e| error(format!("{at}.fields[{i}]"), e))
                })
                .collect::<Result<Vec<_>>>()?;
            let max_bytes = match body.max_bytes {
                None => DEFAULT_COMMIT_BODY_BYTES,
                Some(n) if (1_024..=MAX_COMMIT_BODY_BYTES).contains(&n) => {
                    usize::try_from(n).unwrap_or(DEFAULT_COMMIT_BODY_BYTES)
                }
                Some(n) => {
                    return Err(error(
                        format!("{at}.max_bytes"),
                        format!("{n} is out of range: expected 1024 to {MAX_COMMIT_BODY_BYTES}"),
                    ))
                }
            };
            CommitSource::Body { fields, max_bytes }
        }
        _ => {
            return Err(error(
                at,
                "a commit reads the cost from exactly one of \"header\" (a response header) \
                 or \"body\" (the usage in a JSON body or event stream)",
            ))
        }
    };
    Ok(Commit { source, on_error })
}

/// `max_cost` is the most the rule's limit can admit at once (for a global rule, also
/// what one bridge item may ask for).
pub(super) fn compile(
    raw: Option<RawCost>,
    max_cost: u64,
    at: &str,
    facts: &mut Interner,
) -> Result<Cost> {
    let never = |cost: u64| {
        format!("{cost} can never be admitted: the limit allows at most {max_cost} at once")
    };
    let header = match raw {
        None => return Ok(Cost::Fixed(1)),
        Some(RawCost::Fixed(0)) => {
            return Err(error(
                at,
                "invalid value 0: a cost must be at least 1 (a rule with cost 0 never limits; \
                 to count without limiting, use \"shadow\": true)",
            ))
        }
        Some(RawCost::Fixed(cost)) if cost > max_cost => return Err(error(at, never(cost))),
        Some(RawCost::Fixed(cost)) => return Ok(Cost::Fixed(cost)),
        Some(RawCost::Header(header)) => header,
    };
    let at_header = format!("{at}.header");
    let name = header_name(
        &header.header,
        &at_header,
        "the cost comes from a regular header",
    )?;
    let max = match header.max {
        Some(0) => {
            return Err(error(
                format!("{at}.max"),
                "invalid value 0: must be at least 1",
            ))
        }
        Some(max) if max > max_cost => return Err(error(format!("{at}.max"), never(max))),
        Some(max) => max,
        None => max_cost,
    };
    let min = match header.min {
        None => 1,
        Some(0) => {
            return Err(error(
                format!("{at}.min"),
                "invalid value 0: must be at least 1 (a cost of 0 would let the request \
                 through without counting it)",
            ))
        }
        Some(min) if min > max => {
            return Err(error(
                format!("{at}.min"),
                format!("{min} is above `max` ({max})"),
            ))
        }
        Some(min) => min,
    };
    let default = header.default.unwrap_or(min);
    if default > max {
        let message = match header.max {
            Some(_) => format!("{default} is above `max` ({max})"),
            None => never(default),
        };
        return Err(error(format!("{at}.default"), message));
    }
    if default < min {
        return Err(error(
            format!("{at}.default"),
            format!("{default} is below `min` ({min})"),
        ));
    }
    let fact = facts.intern(Fact::Header(name), &at_header)?;
    Ok(Cost::Header {
        fact,
        default,
        min,
        max,
    })
}
