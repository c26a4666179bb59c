//! A rule's `cost`: a fixed number, or a request header's value within `min..=max`.
//!
//! A cost is never 0: a request of cost 0 only peeks at its key and always passes, so a
//! client that controls the cost header could never be limited.

use super::{error, header_name, Interner, Result};
use crate::config::raw::RawCost;
use crate::rules::{Cost, Fact};

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
