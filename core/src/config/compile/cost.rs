//! A rule's `cost`: a fixed number, or read from the request (a header, or an estimate
//! from its JSON body) within `min..=max`; and `commit`, where the response says what the
//! request really cost.
//!
//! A cost is never 0: a request of cost 0 only peeks at its key and always passes, so a
//! client that controls the cost header could never be limited.

use super::{error, header_name, Interner, Result};
use crate::config::raw::{RawBodyCost, RawClamp, RawCommit, RawCost};
use crate::rules::{Clamp, Commit, CommitSource, Cost, Fact};
use crate::usage::clamp::BodyClamp;
use crate::usage::{BodyEstimate, UsageField, DEFAULT_FIELDS, DEFAULT_MAX_TOKENS_FIELDS};

/// A response body kept to read its usage: 1 MiB by default, 1 KiB to 16 MiB.
pub const DEFAULT_COMMIT_BODY_BYTES: usize = 1 << 20;
pub const MAX_COMMIT_BODY_BYTES: u64 = 16 << 20;
pub const MAX_COMMIT_FIELDS: usize = 16;

/// A request body read for its estimate: 512 KiB by default (below Envoy's default
/// buffer limit of 1 MiB, past which Envoy answers 413), 1 KiB to 16 MiB.
pub const DEFAULT_ESTIMATE_BODY_BYTES: usize = 512 << 10;
pub const DEFAULT_BYTES_PER_PROMPT_TOKEN: u64 = 4;
pub const MAX_BYTES_PER_PROMPT_TOKEN: u64 = 1_000;

/// `cost.body`: the request's most output tokens and its prompt, from its JSON body.
fn body_estimate(raw: RawBodyCost, at: &str) -> Result<BodyEstimate> {
    let fields = usage_fields(
        raw.fields,
        DEFAULT_MAX_TOKENS_FIELDS,
        &format!("{at}.fields"),
    )?;
    let bytes_per_prompt_token = match raw.bytes_per_prompt_token {
        None => DEFAULT_BYTES_PER_PROMPT_TOKEN,
        Some(n) if n <= MAX_BYTES_PER_PROMPT_TOKEN => n,
        Some(n) => {
            return Err(error(
                format!("{at}.bytes_per_prompt_token"),
                format!(
                    "{n} is out of range: expected 0 (the prompt is not counted) to \
                     {MAX_BYTES_PER_PROMPT_TOKEN}"
                ),
            ))
        }
    };
    let max_bytes = body_bytes(
        raw.max_bytes,
        DEFAULT_ESTIMATE_BODY_BYTES,
        &format!("{at}.max_bytes"),
    )?;
    Ok(BodyEstimate {
        fields,
        bytes_per_prompt_token,
        max_bytes,
    })
}

/// Usage fields as configured (1 to [`MAX_COMMIT_FIELDS`]), or `defaults`.
fn usage_fields(raw: Option<Vec<String>>, defaults: &[&str], at: &str) -> Result<Vec<UsageField>> {
    let texts: Vec<String> = match raw {
        None => defaults.iter().map(|f| f.to_string()).collect(),
        Some(fields) if fields.is_empty() || fields.len() > MAX_COMMIT_FIELDS => {
            return Err(error(
                at,
                format!("{} fields; expected 1 to {MAX_COMMIT_FIELDS}", fields.len()),
            ))
        }
        Some(fields) => fields,
    };
    texts
        .iter()
        .enumerate()
        .map(|(i, text)| UsageField::parse(text).map_err(|e| error(format!("{at}[{i}]"), e)))
        .collect()
}

/// A body size cap: `default`, or 1,024 to [`MAX_COMMIT_BODY_BYTES`].
fn body_bytes(raw: Option<u64>, default: usize, at: &str) -> Result<usize> {
    match raw {
        None => Ok(default),
        Some(n) if (1_024..=MAX_COMMIT_BODY_BYTES).contains(&n) => {
            Ok(usize::try_from(n).unwrap_or(default))
        }
        Some(n) => Err(error(
            at,
            format!("{n} is out of range: expected 1024 to {MAX_COMMIT_BODY_BYTES}"),
        )),
    }
}

/// `commit`: where the response says what the request cost. `max_cost` bounds
/// `on_error` like the cost itself; a clamp needs the rule's `cost` to be estimated from
/// the body.
#[inline(never)] // a wasm function of its own: see `compile::compile`
pub(super) fn commit(
    raw: RawCommit,
    max_cost: u64,
    cost: &Cost,
    facts: &mut Interner,
    at: &str,
) -> Result<Commit> {
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
            let fields = usage_fields(body.fields, DEFAULT_FIELDS, &format!("{at}.fields"))?;
            let max_bytes = body_bytes(
                body.max_bytes,
                DEFAULT_COMMIT_BODY_BYTES,
                &format!("{at}.max_bytes"),
            )?;
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
    let clamp = match raw.clamp {
        None => None,
        Some(raw) => Some(clamp(raw, cost, facts, &format!("{at}.clamp"))?),
    };
    Ok(Commit {
        source,
        on_error,
        clamp,
    })
}

/// `commit.clamp`: the body's max-token fields (`cost.body.fields`, each one path) are
/// lowered to what the key has left; a body without one gets `field` (by default the
/// first of them).
fn clamp(raw: RawClamp, cost: &Cost, facts: &mut Interner, at: &str) -> Result<Clamp> {
    let (estimate, max) = match cost {
        Cost::FromRequest { fact, max, .. } => match facts.table.get(*fact) {
            Some(Fact::RequestBodyEstimate(estimate)) => (estimate.clone(), *max),
            _ => return Err(not_from_body(at)),
        },
        Cost::Fixed(_) => return Err(not_from_body(at)),
    };
    let insert = match raw.field {
        None => estimate
            .fields
            .first()
            .and_then(|f| f.plain_path().ok())
            .map(|path| path.join("."))
            .unwrap_or_default(),
        Some(field) => {
            let parsed = UsageField::parse(&field).map_err(|e| error(format!("{at}.field"), e))?;
            if let Err(why) = parsed.plain_path() {
                return Err(error(
                    format!("{at}.field"),
                    format!("{field:?} {why}; a clamp sets one field"),
                ));
            }
            field
        }
    };
    let body = BodyClamp::new(&estimate, &insert).map_err(|(i, message)| {
        let field = estimate
            .fields
            .get(i)
            .map(|f| format!("{:?}", f.text()))
            .unwrap_or_default();
        error(at, format!("cost.body.fields[{i}] {field} {message}"))
    })?;
    let min_output = match raw.min_output {
        None => 1,
        Some(n) if (1..=max).contains(&n) => n,
        Some(n) => {
            return Err(error(
                format!("{at}.min_output"),
                format!("{n} is out of range: expected 1 to {max} (the cost's `max`)"),
            ))
        }
    };
    let prompt = facts.intern(Fact::RequestBodyPrompt(body.clone()), at)?;
    Ok(Clamp {
        prompt,
        min_output,
        body,
    })
}

fn not_from_body(at: &str) -> super::FieldError {
    error(
        at,
        "a clamp lowers the request body's max-token fields: the cost must be estimated \
         from the body (\"cost\": {\"body\": {}})",
    )
}

/// `max_cost` is the most the rule's limit can admit at once (for a global rule, also
/// what one bridge item may ask for).
#[inline(never)] // a wasm function of its own: see `compile::compile`
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
        Some(RawCost::FromRequest(header)) => header,
    };
    let fact = match (&header.header, header.body) {
        (Some(name), None) => {
            let at_header = format!("{at}.header");
            let name = header_name(name, &at_header, "the cost comes from a regular header")?;
            (Fact::Header(name), at_header)
        }
        (None, Some(body)) => {
            let at_body = format!("{at}.body");
            (
                Fact::RequestBodyEstimate(body_estimate(body, &at_body)?),
                at_body,
            )
        }
        _ => {
            return Err(error(
                at,
                "a cost object reads the cost from exactly one of \"header\" (a request \
                 header) or \"body\" (an estimate from the request's JSON body)",
            ))
        }
    };
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
    let fact = facts.intern(fact.0, &fact.1)?;
    Ok(Cost::FromRequest {
        fact,
        default,
        min,
        max,
    })
}
