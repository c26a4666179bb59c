//! A shared rule's parents in shared data: each parent key's window and the keys that
//! share its limit ([`crate::share::ShareState`]), updated with CAS.
//!
//! Layout: `sets = ceil(max_keys / WAYS)` shared-data keys named
//! `weir/v1/<plugin>/<rule>/share-fixed_window/<set index>`, each holding up to [`WAYS`]
//! parents, every one its fingerprint, window, units counted and keys (at most the
//! rule's `share.max_keys`, 40 bytes each). A parent's keys are in one value, so one CAS
//! decides a request against all of them: N workers racing admit exactly what one would.
//! The value's size follows the parents present and their keys, and never grows past
//! `WAYS × (32 + 40 × share.max_keys)` bytes.
//!
//! A parent is found as a key is in a [`super::SlotTable`]: its own place, else an empty
//! one, else one whose state says nothing any more (no key asked in its window or the one
//! before), else the parent with the fewest units counted is evicted (counted): it
//! restarts with a fresh window.

use super::slot_table::WAYS;
use super::{Placement, SharedStore, StoreError, UpdateError, Updated};
use crate::key::KeyHash;
use crate::share::{ShareEntry, ShareState, MAX_SHARE_KEYS};

/// Bytes of a parent's header: fingerprint, window start, units counted, key count.
const PARENT_BYTES: usize = 32;
/// Bytes of one key of a parent.
const ENTRY_BYTES: usize = 40;

/// One shared rule's table of parents.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShareTable {
    prefix: String,
    sets: u32,
    /// The rule's window (µs): when a parent's state says nothing any more.
    window_us: u64,
}

impl ShareTable {
    /// The table of `rule` (its plugin-qualified name), for `max_keys` parents.
    pub fn new(rule: &str, max_keys: u32, window_us: u64) -> Self {
        ShareTable {
            prefix: format!("weir/v1/{rule}/share-fixed_window/"),
            sets: max_keys.div_ceil(WAYS as u32).max(1),
            window_us: window_us.max(1),
        }
    }

    /// Parents the table can hold at once.
    pub fn capacity(&self) -> u64 {
        u64::from(self.sets) * WAYS as u64
    }

    fn set_key(&self, index: u32) -> String {
        format!("{}{index}", self.prefix)
    }

    fn set_index(&self, hash: &KeyHash) -> u32 {
        (hash.set_hash % u64::from(self.sets)) as u32
    }

    /// Creates every set that does not exist yet (see [`super::create_sets`]); returns
    /// how many.
    pub fn create_missing<S: SharedStore>(&self, store: &S) -> Result<u32, StoreError> {
        super::create_sets(store, &self.prefix, self.sets, &[])
    }

    /// Parents with a state in the whole table: one host call per set, for tests and the
    /// gauges' starting value of a small table.
    pub fn parents_in_use<S: SharedStore>(&self, store: &S) -> Result<u64, StoreError> {
        let mut used = 0;
        for index in 0..self.sets {
            let (value, _) = store.get(&self.set_key(index))?;
            used += decode(value.as_deref()).len() as u64;
        }
        Ok(used)
    }

    /// Runs `decide` on the parent's state (`None` for a parent without one) and stores
    /// the state it returns (`None`: write nothing), with CAS; `decide` runs again on
    /// every attempt.
    pub fn update<S: SharedStore, R>(
        &self,
        store: &S,
        hash: &KeyHash,
        now_us: u64,
        mut decide: impl FnMut(Option<ShareState>) -> (R, Option<ShareState>),
    ) -> Result<Updated<R>, UpdateError> {
        let key = self.set_key(self.set_index(hash));
        super::update_with_cas(store, &key, |value| {
            let mut parents = decode(value);
            let (way, placement) = self.locate(&parents, hash.fingerprint, now_us);
            let current = match placement {
                Placement::Existing => parents.get(way).map(|(_, state)| state.clone()),
                _ => None,
            };
            let replaced_in_use = match placement {
                Placement::Eviction => parents.get(way).map_or(0, |(_, s)| s.used),
                _ => 0,
            };
            let (result, next) = decide(current);
            let Some(next) = next else {
                return (None, Updated::nothing(result));
            };
            match parents.get_mut(way) {
                Some(place) if placement != Placement::Empty => *place = (hash.fingerprint, next),
                _ => parents.push((hash.fingerprint, next)),
            }
            let written = Updated {
                result,
                placement: Some(placement),
                cas_retries: 0,
                replaced_in_use,
            };
            (Some(encode(&parents)), written)
        })
    }

    /// The parent's place in its set, and how it was found.
    fn locate(
        &self,
        parents: &[(u64, ShareState)],
        fingerprint: u64,
        now_us: u64,
    ) -> (usize, Placement) {
        if let Some(way) = parents.iter().position(|(f, _)| *f == fingerprint) {
            return (way, Placement::Existing);
        }
        if parents.len() < WAYS {
            return (parents.len(), Placement::Empty);
        }
        let idle = parents
            .iter()
            .position(|(_, s)| s.idle_at_us(self.window_us) <= now_us);
        if let Some(way) = idle {
            return (way, Placement::Takeover);
        }
        let way = parents
            .iter()
            .enumerate()
            .min_by_key(|(_, (_, s))| s.used)
            .map_or(0, |(way, _)| way);
        (way, Placement::Eviction)
    }
}

/// A set's parents. Anything that does not decode exactly (never written, truncated, a
/// count past the bounds) reads as no parent: state is lost, nothing is misattributed.
fn decode(bytes: Option<&[u8]>) -> Vec<(u64, ShareState)> {
    let mut reader = Reader(bytes.unwrap_or_default());
    let mut parents = Vec::new();
    while !reader.0.is_empty() {
        let parent = (|| {
            let fingerprint = reader.word()?;
            let window_start_us = reader.word()?;
            let used = reader.word()?;
            let count = reader.word()?;
            if count > u64::from(MAX_SHARE_KEYS) || parents.len() >= WAYS {
                return None;
            }
            let mut entries = Vec::with_capacity(count as usize);
            for _ in 0..count {
                entries.push(ShareEntry {
                    fingerprint: reader.word()?,
                    weight: reader.word()?,
                    entitled: reader.word()?,
                    used: reader.word()?,
                    asked: reader.word()?,
                });
            }
            let state = ShareState {
                window_start_us,
                used,
                entries,
            };
            Some((fingerprint, state))
        })();
        match parent {
            Some(parent) => parents.push(parent),
            None => return Vec::new(),
        }
    }
    parents
}

fn encode(parents: &[(u64, ShareState)]) -> Vec<u8> {
    let keys: usize = parents.iter().map(|(_, s)| s.entries.len()).sum();
    let mut out = Vec::with_capacity(parents.len() * PARENT_BYTES + keys * ENTRY_BYTES);
    for (fingerprint, state) in parents {
        let count = state.entries.len() as u64;
        for word in [*fingerprint, state.window_start_us, state.used, count] {
            out.extend_from_slice(&word.to_le_bytes());
        }
        for e in &state.entries {
            for word in [e.fingerprint, e.weight, e.entitled, e.used, e.asked] {
                out.extend_from_slice(&word.to_le_bytes());
            }
        }
    }
    out
}

struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn word(&mut self) -> Option<u64> {
        let (head, rest) = self.0.split_first_chunk::<8>()?;
        self.0 = rest;
        Some(u64::from_le_bytes(*head))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::share::{ShareAsk, ShareLimit};
    use crate::store::memory::MemoryStore;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    const SECOND: u64 = 1_000_000;
    const T0: u64 = 1_700_000_000 * SECOND;

    fn parent(n: u64) -> KeyHash {
        KeyHash {
            set_hash: 7,
            fingerprint: n,
        }
    }

    #[test]
    fn a_parent_keeps_its_keys_across_requests_and_garbage_reads_as_none() {
        let store = MemoryStore::new();
        let table = ShareTable::new("r", 4, SECOND);
        assert_eq!(table.create_missing(&store).unwrap(), 1);
        let limit = ShareLimit {
            limit: 3,
            window_us: SECOND,
            max_keys: 8,
        };
        let decide = |key: u64| {
            move |state: Option<ShareState>| {
                let (d, next) = limit.decide(state, T0, ShareAsk::exact(Some(key), 1, 1));
                (d.decision.allowed, Some(next))
            }
        };
        let allowed: Vec<bool> = (1..=4)
            .map(|key| {
                table
                    .update(&store, &parent(1), T0, decide(key))
                    .unwrap()
                    .result
            })
            .collect();
        assert_eq!(allowed, [true, true, true, false]);
        // Another parent in the same set has its own window.
        assert!(
            table
                .update(&store, &parent(2), T0, decide(1))
                .unwrap()
                .result
        );
        assert_eq!(table.parents_in_use(&store).unwrap(), 2);
        for bytes in [&[1u8, 2, 3][..], &[0xff; 40][..]] {
            assert!(decode(Some(bytes)).is_empty());
        }
        let (value, _) = store.get("weir/v1/r/share-fixed_window/0").unwrap();
        let parents = decode(value.as_deref());
        assert_eq!(encode(&parents), value.unwrap());
        assert_eq!(parents[0].1.entries.len(), 4);
    }

    #[test]
    fn a_fifth_live_parent_evicts_the_one_counting_least() {
        let store = MemoryStore::new();
        let table = ShareTable::new("r", 4, SECOND);
        table.create_missing(&store).unwrap();
        let limit = ShareLimit {
            limit: 100,
            window_us: SECOND,
            max_keys: 8,
        };
        let take = |cost: u64| {
            move |state: Option<ShareState>| {
                let ask = ShareAsk::exact(Some(1), 1, cost);
                let (d, next) = limit.decide(state, T0, ask);
                (d.decision.allowed, Some(next))
            }
        };
        for n in 1..=4 {
            table.update(&store, &parent(n), T0, take(10 + n)).unwrap();
        }
        let updated = table.update(&store, &parent(5), T0, take(1)).unwrap();
        assert_eq!(updated.placement, Some(Placement::Eviction));
        assert_eq!(updated.replaced_in_use, 11);
        // Two windows on, every parent is idle: taken over, not evicted.
        let later = T0 + 2 * SECOND;
        let updated = table.update(&store, &parent(6), later, take(1)).unwrap();
        assert_eq!(updated.placement, Some(Placement::Takeover));
    }
}
