//! A fixed-size, set-associative table of per-key state in shared data.
//!
//! Layout: a rule's table is `sets` shared-data keys named
//! `weir/v1/<plugin>/<rule>/<label>/<set index>` (the plugin is Envoy's plugin name; the
//! label is the algorithm, `lease-<algorithm>` for the leases of a global rule, or
//! `fallback-<algorithm>` for its local share), each holding [`WAYS`] slots of
//! [`SLOT_BYTES`] bytes: an 8-byte key fingerprint (0 = empty) and the algorithm's
//! 16-byte [`SlotState`]. `sets = ceil(max_keys / WAYS)`, so the table holds
//! `max_keys` rounded up to a multiple of [`WAYS`] keys and its memory never grows.
//!
//! A key is hashed with SipHash-1-3 under a secret 128-bit seed that every worker
//! shares ([`crate::key::KeyHasher`], [`super::seed`]): 64 bits pick the set, 64 others
//! are the fingerprint. Without the seed a client cannot aim its keys at a victim's
//! set, and two keys share state only if they land in the same set and agree on the
//! 64-bit fingerprint.
//!
//! Finding a slot for a key: its own slot (same fingerprint); else an empty one; else
//! one whose state carries no information any more (*takeover*: e.g. a bucket that is
//! full again); else, when every slot of the set is live, the one closest to idle is
//! *evicted* — its key restarts fresh later, which can only give that key more
//! quota, never charge another key's. Evictions mean `max_keys` is too small; they
//! are counted.
//!
//! Updates are get → decide → CAS-set, re-run on contention ([`MAX_CAS_ATTEMPTS`]).
//! The algorithm is decided again on every attempt, so N workers racing admit exactly
//! what one would. Every set is created when the table is ([`SlotTable::create_missing`],
//! at configure time), so an update only ever writes with a version; a set found missing
//! is an error, never overwritten.
//!
//! [`MAX_CAS_ATTEMPTS`]: super::MAX_CAS_ATTEMPTS

use super::{SharedStore, StoreError, UpdateError};
use crate::algorithms::SlotState;
use crate::key::KeyHash;

/// Slots per set.
pub const WAYS: usize = 4;
/// Bytes per slot: fingerprint, then the two state words, little-endian.
pub const SLOT_BYTES: usize = 24;
/// Bytes of one set's value.
pub const SET_BYTES: usize = WAYS * SLOT_BYTES;

/// How the key's slot was found in its set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// The key already had a slot.
    Existing,
    /// The key took an empty slot (the table has one more key in use).
    Empty,
    /// The key reused a slot whose state carried no information.
    Takeover,
    /// Every slot was live; the one closest to idle was given to this key.
    Eviction,
}

/// The result of a successful update.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Updated<R> {
    pub result: R,
    /// `None` when nothing was written (a denial or a peek).
    pub placement: Option<Placement>,
    /// CAS attempts lost before this one succeeded.
    pub cas_retries: u32,
}

/// One rule's table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotTable {
    prefix: String,
    sets: u32,
}

impl SlotTable {
    /// The table of `rule` for what `label` names (an algorithm, `lease`, …): tables with
    /// other labels never share state, so changing a rule's algorithm starts afresh.
    pub fn new(rule: &str, label: &str, max_keys: u32) -> Self {
        let sets = max_keys.div_ceil(WAYS as u32).max(1);
        SlotTable {
            prefix: format!("weir/v1/{rule}/{label}/"),
            sets,
        }
    }

    pub fn sets(&self) -> u32 {
        self.sets
    }

    /// Keys the table can hold at once.
    pub fn capacity(&self) -> u64 {
        u64::from(self.sets) * WAYS as u64
    }

    pub fn set_key(&self, index: u32) -> String {
        format!("{}{index}", self.prefix)
    }

    pub fn set_index(&self, hash: &KeyHash) -> u32 {
        // `sets` ≥ 1, and the remainder is below it, so it fits in u32.
        (hash.set_hash % u64::from(self.sets)) as u32
    }

    /// Creates every set that does not exist yet, so that every later write is a CAS.
    /// Sets that exist (from an earlier config, another worker or a reload) keep their
    /// state. Returns how many were created.
    ///
    /// A set is created only after a `get` found it missing, but two VMs creating the
    /// same table at once can still both find it missing, and the later creation then
    /// empties a set the other may already have written to: those keys restart fresh,
    /// once. A `ready` marker, written last, lets every later configure skip the scan.
    pub fn create_missing<S: SharedStore>(&self, store: &S) -> Result<u32, StoreError> {
        let ready_key = format!("{}ready", self.prefix);
        let (ready, ready_version) = store.get(&ready_key)?;
        if ready.as_deref() == Some(self.sets.to_le_bytes().as_slice()) {
            return Ok(0);
        }
        let empty = [0u8; SET_BYTES];
        let mut created = 0;
        for index in 0..self.sets {
            let key = self.set_key(index);
            if let (_, None) = store.get(&key)? {
                store.create(&key, &empty)?;
                created += 1;
            }
        }
        let marker = self.sets.to_le_bytes();
        match ready_version {
            // Another VM may mark it first; either way the sets exist.
            Some(version) => match store.compare_and_set(&ready_key, &marker, version) {
                Ok(()) | Err(StoreError::CasMismatch) => {}
                Err(e) => return Err(e),
            },
            None => store.create(&ready_key, &marker)?,
        }
        Ok(created)
    }

    /// Counts the slots in use (non-empty) in the whole table by reading every set: one
    /// host call per set, so for tests and offline tools, never for a configure of a
    /// large table (see [`SlotTable::estimate_slots_in_use`]).
    pub fn slots_in_use<S: SharedStore>(&self, store: &S) -> Result<u64, StoreError> {
        self.count_in_use(store, 0..self.sets)
    }

    /// The slots in use, read from at most `max_sets_read` sets spread evenly over the
    /// table and scaled to its size: exact when the table has that few sets. This is what
    /// `on_configure` reports as the starting value of the `slots_in_use` gauge, so that
    /// configuring a table of a million keys costs a bounded number of host calls.
    pub fn estimate_slots_in_use<S: SharedStore>(
        &self,
        store: &S,
        max_sets_read: u32,
    ) -> Result<u64, StoreError> {
        let read = self.sets.min(max_sets_read.max(1));
        let stride = self.sets / read;
        let sample = (0..read).map(|i| i * stride);
        let used = self.count_in_use(store, sample)?;
        Ok(used * u64::from(self.sets) / u64::from(read))
    }

    fn count_in_use<S: SharedStore>(
        &self,
        store: &S,
        sets: impl Iterator<Item = u32>,
    ) -> Result<u64, StoreError> {
        let mut used = 0;
        for index in sets {
            let (value, _) = store.get(&self.set_key(index))?;
            let set = SlotSet::decode(value.as_deref());
            used += set.slots.iter().filter(|s| s.fingerprint != 0).count() as u64;
        }
        Ok(used)
    }

    /// Runs `decide` on the key's state and stores what it returns, with CAS.
    ///
    /// `decide` gets the key's state (`None` for a key without one) and returns its
    /// result and the state to store (`None`: write nothing). `idle_at_us` tells from
    /// when a slot's state carries no information, for takeover and eviction.
    pub fn update<S, R>(
        &self,
        store: &S,
        hash: &KeyHash,
        now_us: u64,
        idle_at_us: impl Fn(SlotState) -> u64,
        mut decide: impl FnMut(Option<SlotState>) -> (R, Option<SlotState>),
    ) -> Result<Updated<R>, UpdateError>
    where
        S: SharedStore,
    {
        let key = self.set_key(self.set_index(hash));
        for attempt in 0..super::MAX_CAS_ATTEMPTS {
            let (value, version) = store.get(&key)?;
            // Created at configure time and never deleted: a missing set is not ours to
            // create here (a blind write could empty a set another worker just filled).
            let version = version.ok_or(StoreError::Missing)?;
            let mut set = SlotSet::decode(value.as_deref());
            let (way, placement) = set.locate(hash.fingerprint, now_us, &idle_at_us);
            let current = match placement {
                Placement::Existing => set.slots.get(way).map(|s| s.state),
                _ => None,
            };
            let (result, next) = decide(current);
            let Some(next) = next else {
                return Ok(Updated {
                    result,
                    placement: None,
                    cas_retries: attempt,
                });
            };
            if let Some(slot) = set.slots.get_mut(way) {
                *slot = Slot {
                    fingerprint: hash.fingerprint,
                    state: next,
                };
            }
            match store.compare_and_set(&key, &set.encode(), version) {
                Ok(()) => {
                    return Ok(Updated {
                        result,
                        placement: Some(placement),
                        cas_retries: attempt,
                    })
                }
                Err(StoreError::CasMismatch) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Err(UpdateError::GaveUp {
            attempts: super::MAX_CAS_ATTEMPTS,
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct Slot {
    fingerprint: u64,
    state: SlotState,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
struct SlotSet {
    slots: [Slot; WAYS],
}

impl SlotSet {
    /// Anything that is not exactly one set's bytes (never written, truncated, from a
    /// future layout) reads as empty: state is lost, nothing is misattributed.
    fn decode(bytes: Option<&[u8]>) -> SlotSet {
        let mut set = SlotSet::default();
        let Some(bytes) = bytes.filter(|b| b.len() == SET_BYTES) else {
            return set;
        };
        for (slot, chunk) in set.slots.iter_mut().zip(bytes.chunks_exact(SLOT_BYTES)) {
            let word = |i: usize| {
                chunk
                    .get(i * 8..i * 8 + 8)
                    .and_then(|b| <[u8; 8]>::try_from(b).ok())
                    .map_or(0, u64::from_le_bytes)
            };
            *slot = Slot {
                fingerprint: word(0),
                state: SlotState {
                    a: word(1),
                    b: word(2),
                },
            };
        }
        set
    }

    fn encode(&self) -> [u8; SET_BYTES] {
        let mut out = [0u8; SET_BYTES];
        for (slot, chunk) in self.slots.iter().zip(out.chunks_exact_mut(SLOT_BYTES)) {
            let words = [slot.fingerprint, slot.state.a, slot.state.b];
            for (word, dst) in words.iter().zip(chunk.chunks_exact_mut(8)) {
                dst.copy_from_slice(&word.to_le_bytes());
            }
        }
        out
    }

    fn locate(
        &self,
        fingerprint: u64,
        now_us: u64,
        idle_at_us: &impl Fn(SlotState) -> u64,
    ) -> (usize, Placement) {
        if let Some(way) = self.slots.iter().position(|s| s.fingerprint == fingerprint) {
            return (way, Placement::Existing);
        }
        if let Some(way) = self.slots.iter().position(|s| s.fingerprint == 0) {
            return (way, Placement::Empty);
        }
        let (way, idle_at) = self
            .slots
            .iter()
            .enumerate()
            .map(|(way, s)| (way, idle_at_us(s.state)))
            .min_by_key(|&(_, idle_at)| idle_at)
            .unwrap_or((0, 0));
        if idle_at <= now_us {
            (way, Placement::Takeover)
        } else {
            (way, Placement::Eviction)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn set_bytes_round_trip() {
        let mut set = SlotSet::default();
        set.slots[2] = Slot {
            fingerprint: 7,
            state: SlotState { a: u64::MAX, b: 3 },
        };
        assert_eq!(SlotSet::decode(Some(&set.encode())), set);
        assert_eq!(SlotSet::decode(Some(&[1, 2, 3])), SlotSet::default());
        assert_eq!(SlotSet::decode(None), SlotSet::default());
    }

    #[test]
    fn tables_round_max_keys_up_to_whole_sets() {
        let t = SlotTable::new("r", "gcra", 1000);
        assert_eq!((t.sets(), t.capacity()), (250, 1000));
        let t = SlotTable::new("r", "gcra", 1001);
        assert_eq!((t.sets(), t.capacity()), (251, 1004));
        assert_eq!(t.set_key(3), "weir/v1/r/gcra/3");
    }
}
