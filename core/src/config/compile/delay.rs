//! A rule's `on_limit.delay`: the longest a request is held and how many a worker holds,
//! for the rules that can hold one (a schedule to place it in, or a shared limit's next
//! window), and the request facts that state its own deadline.

use super::rule::one_of;
use super::{error, Interner, Result};
use crate::algorithms::AlgorithmKind;
use crate::config::raw::RawOnLimit;
use crate::deadline;
use crate::field_error::quoted;
use crate::rules::{DeadlineFacts, Delay, Fact, Scope};

/// `on_limit.delay`: the longest hold allowed, and requests held per rule and worker.
pub const MAX_DELAY_US: u64 = 60_000_000;
pub const DEFAULT_DELAY_QUEUE: u32 = 100;
pub const MAX_DELAY_QUEUE: u32 = 10_000;

/// What a rule that would hold requests is.
pub(super) struct Holder<'a> {
    pub(super) scope: &'a Scope,
    /// Its limit is shared among keys (`share`).
    pub(super) shared: bool,
    pub(super) shadow: bool,
}

/// `on_limit.delay`: for local rules whose algorithm has a schedule to hold requests on,
/// and shared ones (a held request waits for the next window, and its key's turn).
#[inline(never)] // a wasm function of its own: see `compile::compile`
pub(super) fn compile(
    raw: RawOnLimit,
    holder: Holder<'_>,
    facts: &mut Interner,
    at: &str,
) -> Result<Option<Delay>> {
    let Some(raw) = raw.delay else {
        return Ok(None);
    };
    let at = format!("{at}.delay");
    let shadow = holder.shadow;
    let limit = match holder.scope {
        Scope::Local(limit) => limit,
        Scope::Global(_) | Scope::Concurrency(_) => {
            return Err(error(
                at,
                "delay is for local rules: a global rule answers at once",
            ))
        }
    };
    if !limit.kind().spec().can_hold && !holder.shared {
        return Err(error(
            at,
            format!(
                "delay needs a schedule to hold requests on: algorithm {}, not {} (or a \
                 `share`, whose held requests wait for the next window)",
                one_of(AlgorithmKind::names_where(|spec| spec.can_hold)),
                quoted(limit.kind().name())
            ),
        ));
    }
    if shadow {
        return Err(error(
            at,
            "a shadow rule never limits, so it has nothing to delay",
        ));
    }
    let max_us = match raw.max {
        None => return Err(error(format!("{at}.max"), "is required (e.g. \"500ms\")")),
        Some(max) if (1_000..=MAX_DELAY_US).contains(&max.us) => max.us,
        Some(max) => {
            return Err(error(
                format!("{at}.max"),
                format!("{} is out of range: expected 1ms to 60s", quoted(&max.text)),
            ))
        }
    };
    let queue = match raw.queue {
        None => DEFAULT_DELAY_QUEUE,
        Some(n) => u32::try_from(n)
            .ok()
            .filter(|n| (1..=MAX_DELAY_QUEUE).contains(n))
            .ok_or_else(|| {
                error(
                    format!("{at}.queue"),
                    format!("{n} is out of range: expected 1 to {MAX_DELAY_QUEUE}"),
                )
            })?,
    };
    let mut header = |name: &str| facts.intern(Fact::Header(name.to_string()), &at);
    let deadline = DeadlineFacts {
        grpc_timeout: header(deadline::GRPC_TIMEOUT)?,
        expected_rq_timeout: header(deadline::EXPECTED_RQ_TIMEOUT)?,
    };
    Ok(Some(Delay {
        max_us,
        queue,
        deadline,
    }))
}
