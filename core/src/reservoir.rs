//! One worker's reservoirs: per key of a local rule, units taken ahead from the key's
//! bucket in shared data and a cached denial, kept in the worker's own VM memory.
//!
//! Every worker of an Envoy runs its own VM; shared data is the only memory they share,
//! and every read or write of it is a host call. A request served from the worker's
//! reservoir makes none: it spends a unit the worker took earlier, with one CAS, for
//! itself and for the requests that follow ([`crate::algorithms::Limit::take_ahead`]).
//! A key that shared data denied until `T` is denied from here until `T` too.
//!
//! Each key's entry is a [`LeaseSlot`], the same bookkeeping as a global rule's lease:
//! units with a validity (a unit is never spent outside the time it counts for in the
//! shared bucket), a denial for a cost and above, and the worker's demand for the key,
//! which sizes the next take. The table is set-associative like the shared slot tables
//! (4 ways, sets from `reservoir.max_keys`), allocated on first use and never larger; a
//! key that finds its set full takes the least recently used entry that holds nothing,
//! else the least recently used one, whose held units are lost — counted in the shared
//! bucket, never admitted — and counted here.

use crate::key::KeyHash;
use crate::lease::LeaseSlot;
use crate::rules::{Rule, RuleId};

/// Entries per set.
const WAYS: usize = 4;

#[derive(Debug, Clone, Copy, Default)]
struct Entry {
    /// 0: empty.
    fingerprint: u64,
    /// The table's use counter when the entry was last used.
    last_used: u64,
    slot: LeaseSlot,
}

/// How a key's entry was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Found {
    Existing,
    Empty,
    /// The set was full: the least recently used key's entry was taken, and the units it
    /// still held (possibly 0) are lost.
    Evicted {
        lost_units: u64,
    },
}

/// One rule's reservoirs in one worker.
#[derive(Debug, Clone)]
pub struct WorkerTable {
    /// `set_count × WAYS` entries once the first key arrived, set after set.
    entries: Vec<Entry>,
    set_count: u32,
    uses: u64,
    /// Where a key would go if its set could not be found (it always can: a set index is
    /// below `set_count`); keeps [`WorkerTable::entry`] free of a panic path.
    spare: Entry,
}

impl WorkerTable {
    /// A table for up to `max_keys` keys (rounded up to whole sets); nothing is
    /// allocated until the first key arrives.
    pub fn new(max_keys: u32) -> WorkerTable {
        WorkerTable {
            entries: Vec::new(),
            set_count: max_keys.div_ceil(WAYS as u32).max(1),
            uses: 0,
            spare: Entry::default(),
        }
    }

    /// Keys the table holds at most.
    pub fn capacity(&self) -> u64 {
        u64::from(self.set_count) * WAYS as u64
    }

    /// The key's entry at `now_us`, created (or taken from another key of its set, see
    /// below) when it has none.
    pub fn entry(&mut self, hash: &KeyHash, now_us: u64) -> (&mut LeaseSlot, Found) {
        if self.entries.is_empty() {
            self.entries = vec![Entry::default(); self.set_count as usize * WAYS];
        }
        self.uses += 1;
        let uses = self.uses;
        let index = usize::try_from(hash.set_hash % u64::from(self.set_count)).unwrap_or(0);
        let fingerprint = hash.fingerprint;
        // The set always exists (`index` < `set_count`); the spare keeps this panic-free.
        let Some(set) = self.entries.chunks_exact_mut(WAYS).nth(index) else {
            self.spare = Entry::default();
            return (&mut self.spare.slot, Found::Empty);
        };
        // The key's own entry, else an empty one, else the least recently used of those
        // that hold nothing (no units, no denial in force), else the least recently used:
        // a flood of keys seen once evicts its own kind before a cached denial.
        let rank = |e: &Entry| match e.fingerprint {
            f if f == fingerprint => (0, 0),
            0 => (1, 0),
            _ if e.slot.idle_at_us() <= now_us => (2, e.last_used),
            _ => (3, e.last_used),
        };
        let Some(entry) = set.iter_mut().min_by_key(|e| rank(e)) else {
            self.spare = Entry::default();
            return (&mut self.spare.slot, Found::Empty);
        };
        let found = match rank(entry).0 {
            0 => Found::Existing,
            1 => Found::Empty,
            _ => Found::Evicted {
                lost_units: entry.slot.held.count,
            },
        };
        if found != Found::Existing {
            *entry = Entry {
                fingerprint: hash.fingerprint,
                last_used: uses,
                slot: LeaseSlot::default(),
            };
        }
        entry.last_used = uses;
        (&mut entry.slot, found)
    }

    /// Drops the units whose time ended before `now_us`, in every key's entry; returns
    /// how many. Memory only: no host call.
    pub fn expire(&mut self, now_us: u64) -> u64 {
        let mut dropped = 0u64;
        for e in self.entries.iter_mut().filter(|e| e.fingerprint != 0) {
            let (slot, expired) = e.slot.expire(now_us);
            e.slot = slot;
            dropped = dropped.saturating_add(expired);
        }
        dropped
    }

    /// Units held over every key (for tests and the gauge of what a worker holds).
    pub fn units_held(&self) -> u64 {
        self.entries
            .iter()
            .filter(|e| e.fingerprint != 0)
            .map(|e| e.slot.held.count)
            .sum()
    }
}

/// The reservoirs of one worker, one table per local rule that has them.
#[derive(Debug, Clone, Default)]
pub struct Reservoirs {
    /// At each rule id's index: `None` for rules without reservoirs.
    tables: Vec<Option<WorkerTable>>,
}

impl Reservoirs {
    /// Empty tables for the rules that have reservoirs.
    pub fn for_rules(rules: &[Rule]) -> Reservoirs {
        Reservoirs {
            tables: rules
                .iter()
                .map(|rule| rule.reservoir.map(|r| WorkerTable::new(r.max_keys)))
                .collect(),
        }
    }

    pub fn table(&mut self, rule: RuleId) -> Option<&mut WorkerTable> {
        self.tables.get_mut(rule.index()).and_then(Option::as_mut)
    }

    /// Forgets every key: what a new hashing seed needs (the keys' fingerprints change).
    /// Returns, per rule, the units its entries held: lost, counted in shared data and
    /// never admitted.
    pub fn clear(&mut self) -> Vec<(RuleId, u64)> {
        let mut lost = Vec::new();
        for (index, slot) in self.tables.iter_mut().enumerate() {
            let Some(table) = slot else {
                continue;
            };
            lost.push((rule_id(index), table.units_held()));
            *table = WorkerTable::new(u32::try_from(table.capacity()).unwrap_or(u32::MAX));
        }
        lost
    }

    /// Per rule with reservoirs, the units its entries hold now.
    pub fn units_held(&self) -> Vec<(RuleId, u64)> {
        self.tables
            .iter()
            .enumerate()
            .filter_map(|(index, table)| Some((rule_id(index), table.as_ref()?.units_held())))
            .collect()
    }

    /// Drops the units whose time ended before `now_us` in every table; returns, per
    /// rule, how many (rules that dropped none left out).
    pub fn expire(&mut self, now_us: u64) -> Vec<(RuleId, u64)> {
        self.tables
            .iter_mut()
            .enumerate()
            .filter_map(|(index, table)| Some((rule_id(index), table.as_mut()?.expire(now_us))))
            .filter(|&(_, units)| units > 0)
            .collect()
    }
}

/// The id of the rule at `index` (tables are one per rule, so an index fits).
fn rule_id(index: usize) -> RuleId {
    RuleId(u16::try_from(index).unwrap_or(u16::MAX))
}

#[cfg(test)]
mod tests {
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    use super::*;
    use crate::lease::Held;

    fn hash(set_hash: u64, fingerprint: u64) -> KeyHash {
        KeyHash {
            set_hash,
            fingerprint,
        }
    }

    #[test]
    fn a_full_set_gives_its_least_recently_used_entry_and_counts_its_units() {
        let mut table = WorkerTable::new(4);
        assert_eq!(table.capacity(), 4);
        for fp in 1..=4 {
            let (slot, found) = table.entry(&hash(0, fp), 0);
            assert_eq!(found, Found::Empty);
            slot.held = Held {
                count: fp,
                next_due_ns: 0,
                spacing_ns: 0,
                window_us: 1,
            };
        }
        // Key 1 is used again: key 2 is now the least recently used.
        assert_eq!(table.entry(&hash(0, 1), 0).1, Found::Existing);
        let (slot, found) = table.entry(&hash(0, 5), 0);
        assert_eq!(found, Found::Evicted { lost_units: 2 });
        assert_eq!(*slot, LeaseSlot::default());
        assert_eq!(table.units_held(), 1 + 3 + 4);
        // Key 5 holds nothing: it goes before key 3 and its units.
        let (slot, found) = table.entry(&hash(0, 2), 0);
        assert_eq!(found, Found::Evicted { lost_units: 0 });
        slot.held = Held {
            count: 2,
            next_due_ns: 0,
            spacing_ns: 0,
            window_us: 1,
        };
        assert_eq!(
            table.entry(&hash(0, 6), 0).1,
            Found::Evicted { lost_units: 3 }
        );
    }

    #[test]
    fn keys_seen_once_evict_each_other_before_a_cached_denial() {
        let mut table = WorkerTable::new(4);
        let (slot, _) = table.entry(&hash(0, 1), 0);
        slot.denied_until_us = 1_000;
        slot.denied_cost = 1;
        for fp in 2..100 {
            table.entry(&hash(0, fp), 10);
        }
        assert_eq!(table.entry(&hash(0, 1), 10).1, Found::Existing);
        // Once the denial is over, the entry is worth no more than the others.
        for fp in 100..200 {
            table.entry(&hash(0, fp), 2_000);
        }
        assert!(matches!(
            table.entry(&hash(0, 1), 2_000).1,
            Found::Evicted { .. }
        ));
    }

    #[test]
    fn memory_is_taken_on_first_use_and_never_grows() {
        let mut table = WorkerTable::new(1000);
        assert!(table.entries.is_empty());
        for fp in 1..=100_000u64 {
            table.entry(&hash(fp.wrapping_mul(0x9e37_79b9_7f4a_7c15), fp), 0);
        }
        assert_eq!(table.entries.len(), 1000);
        assert_eq!(table.entries.capacity(), 1000);
    }
}
