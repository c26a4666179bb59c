//! What one worker (one Wasm VM serving requests) keeps for a plugin beside shared
//! data: its reservoirs of local rules, its held requests, and the latencies and
//! limits of its adaptive concurrency rules, the places it holds of concurrency
//! rules, the demand of global keys it has not written yet, and what Redis last said
//! of exact global keys.

use crate::adaptive::{KeyedLatencies, WorkerLatency};
use crate::concurrency::Places;
use crate::delay::Waiting;
use crate::key::KeyHash;
use crate::reservoir::Reservoirs;
use crate::rules::{Rule, RuleId};

#[derive(Debug)]
pub struct Worker {
    pub reservoirs: Reservoirs,
    pub waiting: Waiting,
    /// One per rule, at its id's index: `Some` for adaptive concurrency rules with one
    /// controller.
    pub latencies: Vec<Option<WorkerLatency>>,
    /// One per rule, at its id's index: `Some` for adaptive concurrency rules with a
    /// controller per key (`per_key`).
    pub keyed: Vec<Option<KeyedLatencies>>,
    /// The places this worker holds of concurrency rules' keys, re-counted every epoch
    /// and given back when their streams end (see [`crate::concurrency`]).
    pub places: Places,
    /// Demand of global keys' requests denied from their lease slot, not yet written
    /// to it.
    pub unwritten_demand: UnwrittenDemand,
    /// The next set of each lease table this worker's sweep of expired units reads
    /// (see `Engine::expire_outstanding`).
    pub lease_sweep_next: u32,
    /// What Redis last had left of the exact global keys this worker asked about.
    pub last_answers: LastAnswers,
}

/// A count per key of a few keys, by the key's hash: `N` slots, one key each (its rule
/// and fingerprint), allocated at the first write; a key that takes another's slot drops
/// that key's count.
#[derive(Debug, Clone, Default)]
struct KeyCounts<const N: usize> {
    slots: Vec<(RuleId, u64, u64)>,
}

impl<const N: usize> KeyCounts<N> {
    fn at(hash: &KeyHash) -> usize {
        (hash.fingerprint % N as u64) as usize
    }

    /// The key's count, if its slot holds it.
    fn get_mut(&mut self, rule: RuleId, hash: &KeyHash) -> Option<&mut u64> {
        self.slots
            .get_mut(Self::at(hash))
            .filter(|slot| slot.0 == rule && slot.1 == hash.fingerprint)
            .map(|slot| &mut slot.2)
    }

    fn get(&self, rule: RuleId, hash: &KeyHash) -> Option<u64> {
        self.slots
            .get(Self::at(hash))
            .filter(|slot| slot.0 == rule && slot.1 == hash.fingerprint)
            .map(|slot| slot.2)
    }

    /// Puts the key's count in its slot, dropping the key that held it.
    fn set(&mut self, rule: RuleId, hash: &KeyHash, count: u64) {
        if self.slots.is_empty() {
            self.slots = vec![(RuleId(0), 0, 0); N];
        }
        if let Some(slot) = self.slots.get_mut(Self::at(hash)) {
            *slot = (rule, hash.fingerprint, count);
        }
    }
}

/// Slots of [`LastAnswers`].
const ANSWER_SLOTS: usize = 128;
/// Slots of [`UnwrittenDemand`].
const UNWRITTEN_SLOTS: usize = 64;

/// What Redis last said to this worker of the keys of exact global rules (no lease, no
/// local fallback, no commit, no delay): the units it had left after answering. A key
/// that had enough left for a request is asked about again without a look at the
/// Envoy's cached denials first (a shared-data read per request): only another
/// worker's denial could be there, and then Redis denies this worker's call too, and its
/// answer (nothing left) sends this worker's next requests to the cache. Skipping the
/// look costs at most one call per worker as a key becomes saturated, never an
/// admission: Redis decides every unit. 128 slots, one key each by its hash: a key that
/// takes another's slot drops it (that key's requests look at the cache again).
#[derive(Debug, Clone, Default)]
pub struct LastAnswers(KeyCounts<ANSWER_SLOTS>);

impl LastAnswers {
    /// Redis had `remaining` units of the key left after its last answer to this worker.
    pub fn note(&mut self, rule: RuleId, hash: &KeyHash, remaining: u64) {
        self.0.set(rule, hash, remaining);
    }

    /// Whether Redis last had at least `cost` units of the key left.
    pub fn had_left(&self, rule: RuleId, hash: &KeyHash, cost: u64) -> bool {
        self.0.get(rule, hash).is_some_and(|left| left >= cost)
    }
}

/// The demand of requests a global key's lease slot denied (a cached denial, or a
/// reservation not yet due), kept by the worker instead of written: a denial then reads
/// shared data and writes nothing, so a key under attack costs no CAS per request and
/// no contention between workers. The next write of the key by this worker (a unit
/// spent, a miss) adds it, so the demand that sizes reservations still counts every
/// request. 64 slots, one key each by its hash: a key that takes another's slot drops
/// that key's count (its demand then reads lower until its next requests).
#[derive(Debug, Clone, Default)]
pub struct UnwrittenDemand(KeyCounts<UNWRITTEN_SLOTS>);

impl UnwrittenDemand {
    /// Adds `cost` to the key's count.
    pub fn add(&mut self, rule: RuleId, hash: &KeyHash, cost: u64) {
        match self.0.get_mut(rule, hash) {
            Some(count) => *count = count.saturating_add(cost),
            None => self.0.set(rule, hash, cost),
        }
    }

    /// The key's count, taken (0 when it has none).
    pub fn take(&mut self, rule: RuleId, hash: &KeyHash) -> u64 {
        self.0.get_mut(rule, hash).map_or(0, std::mem::take)
    }
}

impl Worker {
    /// Empty reservoirs and no held request, for `rules`.
    pub fn for_rules(rules: &[Rule]) -> Worker {
        Worker {
            reservoirs: Reservoirs::for_rules(rules),
            waiting: Waiting::for_rules(rules),
            latencies: rules
                .iter()
                .map(|rule| {
                    rule.adaptive()
                        .filter(|a| a.key_controllers.is_none())
                        .map(WorkerLatency::new)
                })
                .collect(),
            keyed: rules
                .iter()
                .map(|rule| {
                    rule.adaptive()
                        .and_then(|a| a.key_controllers)
                        .map(KeyedLatencies::new)
                })
                .collect(),
            places: Places::default(),
            unwritten_demand: UnwrittenDemand::default(),
            lease_sweep_next: 0,
            last_answers: LastAnswers::default(),
        }
    }

    /// The keys of an adaptive concurrency rule with `per_key`.
    pub fn keyed(&mut self, rule: RuleId) -> Option<&mut KeyedLatencies> {
        self.keyed.get_mut(rule.index()).and_then(Option::as_mut)
    }

    /// The latencies and limit of an adaptive concurrency rule.
    pub fn latency(&mut self, rule: RuleId) -> Option<&mut WorkerLatency> {
        self.latencies
            .get_mut(rule.index())
            .and_then(Option::as_mut)
    }
}

#[cfg(test)]
mod tests {
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    use super::*;

    fn key(fingerprint: u64) -> KeyHash {
        KeyHash {
            set_hash: 0,
            fingerprint,
        }
    }

    #[test]
    fn last_answers_say_whether_a_key_had_enough_left() {
        let mut a = LastAnswers::default();
        assert!(!a.had_left(RuleId(1), &key(7), 1), "never answered");
        a.note(RuleId(1), &key(7), 3);
        assert!(a.had_left(RuleId(1), &key(7), 3));
        assert!(!a.had_left(RuleId(1), &key(7), 4));
        assert!(!a.had_left(RuleId(2), &key(7), 1), "another rule's key");
        a.note(RuleId(1), &key(7 + ANSWER_SLOTS as u64), 9);
        assert!(
            !a.had_left(RuleId(1), &key(7), 1),
            "its slot taken by another key"
        );
        a.note(RuleId(1), &key(7), 0);
        assert!(!a.had_left(RuleId(1), &key(7), 1), "nothing left");
    }

    #[test]
    fn unwritten_demand_is_kept_per_key_and_taken_once() {
        let mut d = UnwrittenDemand::default();
        assert_eq!(d.take(RuleId(1), &key(7)), 0);
        d.add(RuleId(1), &key(7), 3);
        d.add(RuleId(1), &key(7), 2);
        assert_eq!(d.take(RuleId(2), &key(7)), 0, "another rule's key");
        assert_eq!(d.take(RuleId(1), &key(7)), 5);
        assert_eq!(d.take(RuleId(1), &key(7)), 0, "taken");
        // A key landing on a taken slot replaces it: the other key's count is dropped.
        d.add(RuleId(1), &key(7), 4);
        d.add(RuleId(1), &key(7 + UNWRITTEN_SLOTS as u64), 1);
        assert_eq!(d.take(RuleId(1), &key(7)), 0);
        assert_eq!(d.take(RuleId(1), &key(7 + UNWRITTEN_SLOTS as u64)), 1);
    }
}
