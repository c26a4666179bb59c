//! Conformance: whether the admissions of one key keep their algorithm's own bound.
//!
//! weir's promise (`CONFORMANCE.md` in the shared docs) is not "the same decisions as one
//! central limiter" but the bound a client of one central limiter is guaranteed: the
//! admissions of one key, from every worker and every Envoy together, with their costs
//! and the times at which they were decided, satisfy the algorithm's bound. [`check`]
//! decides that for a list of [`Admission`]s, exactly, in integers, in O(n log n).
//!
//! ## Notation
//!
//! The admissions sorted by time (stably: equal times keep their order), `(t_1, c_1) …
//! (t_n, c_n)`, `t` in µs, `c` the cost; prefix sums `S_0 = 0`, `S_j = c_1 + … + c_j`.
//! Zero-cost admissions are allowed and count 0.
//!
//! ## The bounds
//!
//! Each algorithm states its bound, and checks it, in its own module:
//! [`Algorithm::check_bound`] (GCRA: over any stretch, `b + 1` units plus one per `T`
//! elapsed; the windows: what each window, or each sliding window, holds). [`check`]
//! sorts the admissions and asks the limit's algorithm; nothing here names one.
//!
//! ## Reading a [`Violation`]
//!
//! [`check`] reports the violation that ends first: the smallest `last`. `first..=last`
//! are indices into the admissions sorted stably by time (sort a copy with
//! `sort_by_key(|a| a.at_us)` to look them up), `admitted` is the sum of their costs
//! (saturated at `u64::MAX`; the message has it exactly), and `allowed` the most units
//! the bound lets those admissions add up to, a decimal integer (it may not fit a `u64`);
//! each algorithm's [`Algorithm::check_bound`] says how it picks them.
//!
//! The message says the same in words: the algorithm and its parameters, the
//! admissions, their times and what they add up to against what is allowed.
//!
//! `core/tests/conformance.rs` holds the checker to these definitions: on random
//! admissions it agrees with a brute-force reading of them; what one central limiter of
//! each algorithm admits (requests and leases, spent where granted) always passes; and
//! deliberate mutants (one unit more of burst, units spent after their lease, a refill
//! counted twice, a window boundary off by one) always fail, where the recomputed sum
//! really exceeds the bound.
//!
//! ## Clocks
//!
//! Every time must come from one clock, and be the time at which the admission was
//! decided: the Envoy's clock for local decisions and for units spent from a lease or a
//! reservation, the `now` Redis used (returned by the bridge) for units Redis admitted
//! itself. A unit granted at one time and spent at another is recorded when it is spent:
//! that displacement is exactly what the bound must survive.
//!
//! ```
//! use weir_protocol::algorithms::{fixed_window::FixedWindow, GlobalLimit, Limit};
//! use weir_protocol::conformance::{check, Admission};
//!
//! // 3 per second, windows aligned to whole seconds.
//! let limit = GlobalLimit::Slot(Limit::FixedWindow(FixedWindow::new(3, 1_000_000).unwrap()));
//! let second = 1_700_000_000_000_000;
//! let at = |at_us, cost| Admission { at_us, cost };
//! // 3 at the end of one window and 3 at the start of the next: the fixed window's price.
//! let ok = [at(second - 1, 3), at(second, 3)];
//! assert_eq!(check(&limit, &ok), Ok(()));
//!
//! // One more unit in the second window.
//! let violation = check(&limit, &[at(second - 1, 3), at(second, 3), at(second + 5, 1)]).unwrap_err();
//! assert_eq!((violation.first, violation.last, violation.admitted), (1, 2, 4));
//! assert_eq!(violation.allowed, "3");
//! ```

use std::fmt;

pub use crate::algorithms::Admission;
use crate::algorithms::{Algorithm, Breach, GlobalLimit, Unit};

/// Where the admissions break the algorithm's bound: the admissions `first..=last`
/// (indices into the admissions sorted by time, stable), what they add up to, what the
/// bound allows there, and a message that says it in words (algorithm, interval, times,
/// admitted vs allowed). See the module docs for how each algorithm fills it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub first: usize,
    pub last: usize,
    pub admitted: u64,
    pub allowed: String,
    pub message: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Violation {}

/// Checks that `admissions` (any order; sorted stably by time inside) satisfy `limit`'s
/// own bound. On failure, reports the violation that ends first.
pub fn check(limit: &GlobalLimit, admissions: &[Admission]) -> Result<(), Violation> {
    let mut sorted = admissions.to_vec();
    sorted.sort_by_key(|a| a.at_us);
    match limit.algorithm().check_bound(&sorted) {
        None => Ok(()),
        Some(breach) => Err(violation(breach, limit.algorithm(), &sorted)),
    }
}

/// Checks the admissions of one key whose requests carried limits of their own (a
/// tenant's limit read from the request; a reload between them), each with the limit its
/// request carried: over every stretch in which the key's admissions (sorted stably by
/// time) all carried one limit, that limit's bound; and over all of them, the bound of
/// the largest, every count parameter at the most any of them had (the durations are
/// the same in every limit a key carries). On failure, the first stretch's violation,
/// its indices into the whole sorted list; `Err(None)` when the limits are not of one
/// algorithm and durations (no larger limit to judge them by).
pub fn check_each_limit(admissions: &[(GlobalLimit, Admission)]) -> Result<(), Option<Violation>> {
    let mut sorted = admissions.to_vec();
    sorted.sort_by_key(|(_, a)| a.at_us);
    let mut start = 0;
    while let Some((limit, _)) = sorted.get(start) {
        let end = sorted
            .iter()
            .skip(start)
            .position(|(other, _)| other != limit)
            .map_or(sorted.len(), |len| start + len);
        let stretch: Vec<Admission> = sorted
            .get(start..end)
            .unwrap_or_default()
            .iter()
            .map(|(_, a)| *a)
            .collect();
        check(limit, &stretch).map_err(|v| {
            Some(Violation {
                first: v.first + start,
                last: v.last + start,
                message: format!("in a stretch under one limit: {}", v.message),
                ..v
            })
        })?;
        start = end;
    }
    let Some((first, _)) = sorted.first() else {
        return Ok(());
    };
    let mut largest = first.algorithm().parameters();
    for (limit, _) in &sorted {
        if limit.kind() != first.kind() {
            return Err(None);
        }
        for ((most, value), parameter) in largest
            .iter_mut()
            .zip(limit.algorithm().parameters())
            .zip(first.kind().spec().parameters)
        {
            match parameter.unit {
                Unit::Count => *most = (*most).max(value),
                Unit::Duration if *most != value => return Err(None),
                Unit::Duration => {}
            }
        }
    }
    let largest = GlobalLimit::build(first.kind(), &largest).map_err(|_| None)?;
    let all: Vec<Admission> = sorted.iter().map(|(_, a)| *a).collect();
    check(&largest, &all).map_err(Some)
}

/// A breach put in words: the algorithm and its parameters, the admissions, their times
/// and what they add up to against what is allowed.
fn violation(breach: Breach, algorithm: &dyn Algorithm, sorted: &[Admission]) -> Violation {
    let spec = algorithm.spec();
    let parameters: Vec<String> = spec
        .parameters
        .iter()
        .zip(algorithm.parameters())
        .map(|(p, v)| match p.unit {
            Unit::Count => format!("{} {v}", p.name),
            Unit::Duration => format!("{} {v}us", p.name),
        })
        .collect();
    let at = |i: usize| sorted.get(i).map_or(0, |a| a.at_us);
    let (from, to) = (at(breach.first), at(breach.last));
    let message = format!(
        "{} ({}): admissions {}..={} (of {}, sorted by time), decided from {from}us to \
             {to}us ({}us), add up to {} units where the bound allows {}: {}",
        spec.name,
        parameters.join(", "),
        breach.first,
        breach.last,
        sorted.len(),
        to.saturating_sub(from),
        breach.admitted,
        breach.allowed,
        breach.why,
    );
    Violation {
        first: breach.first,
        last: breach.last,
        admitted: u64::try_from(breach.admitted).unwrap_or(u64::MAX),
        allowed: breach.allowed.to_string(),
        message,
    }
}
