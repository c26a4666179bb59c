//! What an algorithm's bound is checked on, and what a breach of it reports: the
//! vocabulary of [`super::Algorithm::check_bound`], which each algorithm answers in its
//! own module. [`crate::conformance`] sorts the admissions and puts a breach in words.

/// One admission of one key: when it was decided (µs since the Unix epoch, one clock)
/// and its cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Admission {
    pub at_us: u64,
    pub cost: u64,
}

/// Where admissions break an algorithm's bound, before it is put in words: the
/// admissions `first..=last` (indices into them sorted stably by time), their exact sum,
/// what the bound allows them, and how the algorithm got there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Breach {
    pub first: usize,
    pub last: usize,
    pub admitted: u128,
    pub allowed: u128,
    pub why: String,
}

impl Breach {
    /// `first..=last`, all in `interval`, add up to `sum`, above `limit`.
    pub(super) fn over_limit(
        first: usize,
        last: usize,
        sum: u128,
        limit: u64,
        interval: String,
    ) -> Breach {
        Breach {
            first,
            last,
            admitted: sum,
            allowed: u128::from(limit),
            why: format!("they are all in {interval}, which holds at most {limit}"),
        }
    }
}
