//! An oracle per algorithm: what the tests know of it without asking its code. Each
//! algorithm's file here holds
//! - its scenario rows (`SCENARIOS`): one key, requests at explicit instants, and the
//!   decision each must get, which every backend runs (the pure function, a slot table in
//!   shared data, the Lua script on a real Redis Cluster);
//! - its bound read straight from ../shared/CONFORMANCE.md's definition, by brute force
//!   ([`Oracle::breaks_at`]), and what a violation the checker reports must say
//!   ([`Oracle::check_violation`]): the checker's own reading (`Algorithm::check_bound`)
//!   is judged against these, never against itself;
//! - when units granted and saved past their lease break the bound
//!   ([`Oracle::spent_after_lease`]), for the mutant the conformance properties plant;
//! - for an algorithm with slot state, how its Redis value reads back as slot words
//!   (`redis_slot_state`), for the bridge's Lua-against-Rust walk.
//!
//! The files are found through the one list of algorithms (`with_every_algorithm!` in
//! weir-protocol's `kind.rs`): a new algorithm adds its file here and no other line, and
//! one without a file, or without one of these items, does not compile.

// An oracle reads admissions by the indices a report names, and a failed check panics:
// both are a failed test, which is what the oracles are for.
#![allow(clippy::indexing_slicing, clippy::panic)]

use weir_core::algorithms::{AlgorithmKind, GlobalLimit, Limit, SlotState};
use weir_core::conformance::{Admission, Violation};

use crate::scenarios::Scenario;

/// What the tests know of one algorithm's bound, implemented on its limit type.
pub trait Oracle {
    /// Whether the admissions `s[..=j]` (sorted by time) break the bound at `j`, read from
    /// the definition in O(n) per `j`: by default, some stretch ending at `j` goes beyond
    /// its allowance ([`Oracle::stretch_excess`]); the windows read theirs.
    fn breaks_at(&self, s: &[Admission], j: usize) -> bool {
        (0..=j).any(|i| {
            self.stretch_excess(s, i, j)
                .is_some_and(|excess| excess > 0)
        })
    }

    /// For an algorithm whose violations are stretches (GCRA, the token bucket): how far
    /// the stretch `s[i..=j]` goes beyond its allowance, in the bound's own measure (GCRA
    /// in ns, the bucket in units); `None` for the windows.
    fn stretch_excess(&self, _s: &[Admission], _i: usize, _j: usize) -> Option<i128> {
        None
    }

    /// Checks what is particular to the algorithm in a reported violation over
    /// `s[v.first..=v.last]` (sorted), which admitted `admitted` units where the report
    /// allows `allowed`: its span is the one the bound names, its first admission the one
    /// the checker's docs promise, and `allowed` the bound's figure there. Panics when not.
    fn check_violation(&self, s: &[Admission], v: &Violation, admitted: u128, allowed: u128);

    /// Units of a full grant taken at `t0` and not spent, then spent beside a fresh grant
    /// of the whole limit: the instant the fresh grant is taken and the instant the saved
    /// units are spent, such that the two together always break the bound. `idle_at` is
    /// when the key is fresh again after the first grant, `scale` the limit's time scale
    /// (µs), `extra` and `late` two draws in 0..=64 placing them within what breaks it.
    fn spent_after_lease(
        &self,
        t0: u64,
        idle_at: u64,
        scale: u64,
        extra: u64,
        late: u64,
    ) -> (u64, u64);
}

/// The units of `admissions`, summed without overflow.
pub fn sum(admissions: &[Admission]) -> u128 {
    admissions.iter().map(|a| u128::from(a.cost)).sum()
}

/// The slot words of a value stored as the slot's two words, `a b`.
pub fn two_words(words: &[u64]) -> Option<SlotState> {
    match *words {
        [a, b] => Some(SlotState { a, b }),
        _ => None,
    }
}

/// [`Oracle::spent_after_lease`] for a window algorithm whose units count until
/// `windows_on` windows after the one they were granted in: the fresh grant somewhere in
/// that window (`extra`), the saved units after it within the same window (`late`).
pub fn in_a_later_window(
    t0: u64,
    width: u64,
    windows_on: u64,
    extra: u64,
    late: u64,
) -> (u64, u64) {
    let start = (t0 / width + windows_on) * width;
    let fresh_at = start + (width - 1) * extra / 64;
    (
        fresh_at,
        fresh_at + (start + width - 1 - fresh_at) * late / 64,
    )
}

/// Declares each algorithm's oracle module and the dispatch over them, from the one list.
macro_rules! oracles {
    (
        slot: $($slot:ident($slot_module:ident::$slot_type:ident)),+ ;
        global_only: $($global:ident($global_module:ident::$global_type:ident)),+ $(;)?
    ) => {
        $(pub mod $slot_module;)+
        $(pub mod $global_module;)+

        /// The oracle of `limit`'s algorithm.
        pub fn oracle(limit: &GlobalLimit) -> &dyn Oracle {
            match limit {
                $(GlobalLimit::Slot(Limit::$slot(l)) => l,)+
                $(GlobalLimit::$global(l) => l,)+
            }
        }

        /// The scenario rows of `kind`.
        pub fn scenarios(kind: AlgorithmKind) -> &'static [Scenario] {
            match kind {
                $(AlgorithmKind::$slot => $slot_module::SCENARIOS,)+
                $(AlgorithmKind::$global => $global_module::SCENARIOS,)+
            }
        }

        /// The slot words of a slot algorithm's value as its Lua script stores it in
        /// Redis (the words of the value, space-separated numbers); `None` for a value of
        /// another shape, or for an algorithm without slot state.
        pub fn redis_slot_state(kind: AlgorithmKind, words: &[u64]) -> Option<SlotState> {
            match kind {
                $(AlgorithmKind::$slot => $slot_module::redis_slot_state(words),)+
                $(AlgorithmKind::$global => None,)+
            }
        }
    };
}

weir_core::with_every_algorithm!(oracles);

/// The rows of the algorithms with slot state (every algorithm but the sliding log), in
/// the order of [`AlgorithmKind::ALL`].
pub fn slot_tables() -> impl Iterator<Item = &'static Scenario> {
    AlgorithmKind::ALL
        .into_iter()
        .filter(|kind| kind.spec().global_only.is_none())
        .flat_map(scenarios)
}
