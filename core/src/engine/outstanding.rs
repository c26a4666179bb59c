//! Units outstanding: counted in the store but not admitted yet — the most a rule could
//! admit beyond what its store shows.
//!
//! - **Lease slots** (global rules with `global.lease`): units Redis granted ahead and this
//!   Envoy holds in the key's slot in shared data. A reply's grant adds, a request served
//!   from them subtracts its cost, units dropped past their time (or lost with a slot
//!   another key took) subtract.
//! - **Reservoirs** (local rules with `reservoir`): units a worker took ahead from the
//!   key's slot, in its own memory. A take adds; a request served, units expired, units
//!   lost with an entry another key took or with a new hashing seed subtract.
//! - **Held requests** (`on_limit.delay`): a held request's units are in the key's
//!   schedule; they count from the hold to the release, the denial of a request that
//!   could not wait, or the client leaving ([`HeldRequest::units`]: the filter subtracts
//!   them itself then, the evaluation being dropped).
//!
//! Not outstanding: a rule's `commit` reservation. The store counted its estimate and
//! the request was admitted; settling it can only give units back to the store (or
//! charge more), after which the store shows them. Nothing of it can be admitted beyond
//! what the store shows.
//!
//! Every change is signed and kept where it happened: in a request's
//! [`RuleReport::outstanding_units`](super::RuleReport::outstanding_units), drained with
//! [`Evaluation::drain_outstanding`] after each step of the request; and in what
//! [`Engine::expire_outstanding`] returns for units that expire with nobody looking.
//! Summed from zero, they equal what the lease slots, reservoirs and held requests hold
//! (`core/tests/outstanding.rs` drives random traffic and compares the sum with a count
//! of the tables at every step).
//!
//! Units expire lazily where they are kept: a slot drops its expired units when a request
//! next reads it. The sweep drops them when their time ends instead: a worker's
//! reservoirs at each tick (memory only), and [`LEASE_SETS_PER_SWEEP`] sets of each lease
//! table per tick, round the table from the worker's cursor — so one worker reads a
//! table of `S` sets through in `S / LEASE_SETS_PER_SWEEP` sweeps.
//!
//! ```
//! use weir_core::engine::LEASE_SETS_PER_SWEEP;
//! assert!(LEASE_SETS_PER_SWEEP >= 1);
//! ```

use crate::rules::RuleId;
use crate::store::SharedStore;
use crate::time::Micros;
use crate::worker::Worker;

#[cfg(doc)]
use super::evaluation::{Evaluation, HeldRequest};
use super::runtime::{Engine, RuleRuntime};

/// Sets of each lease table a worker's sweep reads per call: one host call each, plus a
/// CAS for a set that held expired units.
pub const LEASE_SETS_PER_SWEEP: u32 = 16;

/// Units a sweep dropped unspent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Expired {
    pub rule: RuleId,
    /// A lease slot's (`true`) or a reservoir's (`false`).
    pub lease: bool,
    pub units: u64,
}

impl Engine {
    /// A rule's limit in units, as its policy states it (a GCRA's burst + 1, a bucket's
    /// capacity, a window's limit): what one key may admit at once. The configured
    /// limit of a global rule (the whole fleet's); 0 for a concurrency rule.
    pub fn limit_units(&self, rule: RuleId) -> u64 {
        match self.rule(rule) {
            Some((_, RuleRuntime::Local(local))) => local.slots.limit.policy().quota,
            Some((_, RuleRuntime::Global(global))) => global.global.limit.policy().quota,
            Some((_, RuleRuntime::Share(share))) => share.limit().limit,
            Some((_, RuleRuntime::Concurrency(_))) | None => 0,
        }
    }

    /// Units held over every key of a global rule's lease table, read set by set (one
    /// host call per set): for tests and tools. `None` for any other rule, or when the
    /// store fails.
    pub fn lease_units_held<S: SharedStore>(&self, store: &S, rule: RuleId) -> Option<u64> {
        let (_, RuleRuntime::Global(global)) = self.rule(rule)? else {
            return None;
        };
        let slots = global.leases().states(store).ok()?;
        Some(slots.iter().map(|slot| slot.held.count).sum())
    }

    /// Drops the units that expired unspent before `now`: in every reservoir of
    /// `worker`, and in the next [`LEASE_SETS_PER_SWEEP`] sets of each leased global
    /// rule's lease table (from the worker's cursor). Each is a negative change to its
    /// rule's units outstanding, and under-admission: counted in the store, never
    /// admitted.
    pub fn expire_outstanding<S: SharedStore>(
        &self,
        store: &S,
        worker: &mut Worker,
        now: Micros,
    ) -> Vec<Expired> {
        let now_us = now.us();
        let mut expired: Vec<Expired> = worker
            .reservoirs
            .expire(now_us)
            .into_iter()
            .map(|(rule, units)| Expired {
                rule,
                lease: false,
                units,
            })
            .collect();
        let start = worker.lease_sweep_next;
        let mut furthest = 0;
        for (rule, runtime) in self.rules() {
            let RuleRuntime::Global(global) = runtime else {
                continue;
            };
            if global.global.lease.is_none() {
                continue;
            }
            let sets = global.leases().sets();
            let mut units = 0u64;
            for step in 0..LEASE_SETS_PER_SWEEP.min(sets) {
                let index = (start.wrapping_add(step)) % sets;
                units = units.saturating_add(global.expire_set(store, index, now_us));
            }
            furthest = furthest.max(sets);
            if units > 0 {
                expired.push(Expired {
                    rule: rule.id,
                    lease: true,
                    units,
                });
            }
        }
        // One cursor for every table: a table smaller than it wraps around.
        worker.lease_sweep_next = if furthest == 0 {
            0
        } else {
            start.wrapping_add(LEASE_SETS_PER_SWEEP) % furthest
        };
        expired
    }
}
