//! A fixed-size, set-associative table of per-key state in shared data.
//!
//! Layout: a rule's table is `sets` shared-data keys named
//! `weir/v1/<plugin>/<rule>/<label>/<set index>` (the plugin is Envoy's plugin name; the
//! label is the algorithm, `lease-<algorithm>-<parameters>` for the leases of a global
//! rule, or `fallback-<algorithm>` for its local share), each holding [`WAYS`] slots: an
//! 8-byte key fingerprint (0 = empty) and a fixed number of 8-byte words of state, the
//! table's [`SlotValue`] (an algorithm's 16-byte [`SlotState`], or a lease's wider
//! state). `sets = ceil(max_keys / WAYS)`, so the table holds `max_keys` rounded up to a
//! multiple of [`WAYS`] keys and its memory never grows.
//!
//! A key is hashed with SipHash-1-3 under a secret 128-bit seed that every worker
//! shares ([`crate::key::KeyHasher`], [`super::seed`]): 64 bits pick the set, 64 others
//! are the fingerprint. Without the seed a client cannot aim its keys at a victim's
//! set, and two keys share state only if they land in the same set and agree on the
//! 64-bit fingerprint.
//!
//! Finding a slot for a key: its own slot (same fingerprint); else an empty one; else
//! one whose state carries no information any more (*takeover*: e.g. a bucket that is
//! full again); else, when every slot of the set is live, the one holding the fewest
//! units (then the one closest to idle) is *evicted* — its key restarts fresh later,
//! which can only give that key more quota, never charge another key's, and a key at
//! its limit is the last one a flood of new keys evicts. Evictions mean `max_keys` is
//! too small; they are counted.
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
use std::marker::PhantomData;

/// Slots per set.
pub const WAYS: usize = 4;
/// The most state words a slot value may have.
pub const MAX_VALUE_WORDS: usize = 8;
/// The most bytes one set's value can take: every slot's fingerprint and state words.
const MAX_SET_BYTES: usize = WAYS * 8 * (1 + MAX_VALUE_WORDS);

/// What a slot holds besides its key's fingerprint: a fixed number of 64-bit words,
/// stored little-endian. Any words decode (garbage reads as some state the owner's logic
/// must handle), and the all-zero value is "nothing stored".
pub trait SlotValue: Copy + Default + PartialEq + std::fmt::Debug {
    /// 1 to [`MAX_VALUE_WORDS`].
    const WORDS: usize;
    fn to_words(&self, words: &mut [u64]);
    fn from_words(words: &[u64]) -> Self;
}

impl SlotValue for SlotState {
    const WORDS: usize = 2;

    fn to_words(&self, words: &mut [u64]) {
        for (dst, word) in words.iter_mut().zip([self.a, self.b]) {
            *dst = word;
        }
    }

    fn from_words(words: &[u64]) -> Self {
        let word = |i: usize| words.get(i).copied().unwrap_or(0);
        SlotState {
            a: word(0),
            b: word(1),
        }
    }
}

/// Bytes of one slot of a table holding `V`.
pub const fn slot_bytes<V: SlotValue>() -> usize {
    8 * (1 + V::WORDS)
}

/// Bytes of one set's value for a table holding `V`.
pub const fn set_bytes<V: SlotValue>() -> usize {
    WAYS * slot_bytes::<V>()
}

/// What a slot's state is worth keeping, to pick the slot a new key takes when its set
/// is full.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Vacancy {
    /// From then on the state carries no information (a fresh key would be decided the
    /// same): the slot may be taken over.
    pub idle_at_us: u64,
    /// Units the state holds against its key (used in its window, spent from its bucket,
    /// held by a lease): what evicting it would hand back to the key.
    pub in_use: u64,
}

/// How the key's slot was found in its set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// The key already had a slot.
    Existing,
    /// The key took an empty slot (the table has one more key in use).
    Empty,
    /// The key reused a slot whose state carried no information.
    Takeover,
    /// Every slot was live; the one holding the fewest units (then the one closest to
    /// idle) was given to this key.
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
    /// What the state this key's slot replaced held (its [`Vacancy::in_use`]), by a
    /// takeover or an eviction; 0 otherwise. A lease's units held, lost with it.
    pub replaced_in_use: u64,
}

impl<R> Updated<R> {
    /// An update that wrote nothing (a denial or a peek).
    pub fn nothing(result: R) -> Updated<R> {
        Updated {
            result,
            placement: None,
            cas_retries: 0,
            replaced_in_use: 0,
        }
    }
}

/// One rule's table of `V`s (an algorithm's [`SlotState`] unless said otherwise).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotTable<V: SlotValue = SlotState> {
    prefix: String,
    sets: u32,
    value: PhantomData<V>,
}

impl<V: SlotValue> SlotTable<V> {
    /// The table of `rule` for what `label` names (an algorithm, `lease`, …): tables with
    /// other labels never share state, so changing a rule's algorithm starts afresh.
    pub fn new(rule: &str, label: &str, max_keys: u32) -> Self {
        let sets = max_keys.div_ceil(WAYS as u32).max(1);
        SlotTable {
            prefix: format!("weir/v1/{rule}/{label}/"),
            sets,
            value: PhantomData,
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

    /// Creates every set that does not exist yet, so that every later write is a CAS
    /// (see [`super::create_sets`]). Returns how many were created.
    pub fn create_missing<S: SharedStore>(&self, store: &S) -> Result<u32, StoreError> {
        let empty = SlotSet::<V>::default().encode();
        super::create_sets(store, &self.prefix, self.sets, empty.as_slice())
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

    /// Every key's state in the whole table, read set by set: one host call per set, so
    /// for tests and offline tools.
    pub fn states<S: SharedStore>(&self, store: &S) -> Result<Vec<V>, StoreError> {
        let mut states = Vec::new();
        for index in 0..self.sets {
            let (value, _) = store.get(&self.set_key(index))?;
            let set = SlotSet::<V>::decode(value.as_deref());
            states.extend(
                set.slots
                    .iter()
                    .filter(|s| s.fingerprint != 0)
                    .map(|s| s.state),
            );
        }
        Ok(states)
    }

    /// Runs `tidy` on every key's state in set `index`, with CAS: `tidy` returns the
    /// state to keep and what it counted of it (units dropped); the set is written only
    /// when some count is above 0. Returns the sum of the counts written (0 when nothing
    /// was, or the set is not there).
    pub fn tidy_set<S: SharedStore>(
        &self,
        store: &S,
        index: u32,
        tidy: impl Fn(V) -> (V, u64),
    ) -> Result<Updated<u64>, UpdateError> {
        let key = self.set_key(index);
        for attempt in 0..super::MAX_CAS_ATTEMPTS {
            let (value, version) = store.get(&key)?;
            let mut set = SlotSet::<V>::decode(value.as_deref());
            let mut counted = 0u64;
            for slot in set.slots.iter_mut().filter(|s| s.fingerprint != 0) {
                let (state, count) = tidy(slot.state);
                slot.state = state;
                counted = counted.saturating_add(count);
            }
            let nothing = Updated {
                result: 0,
                placement: None,
                cas_retries: attempt,
                replaced_in_use: 0,
            };
            let Some(version) = version.filter(|_| counted > 0) else {
                return Ok(nothing);
            };
            match store.compare_and_set(&key, set.encode().as_slice(), version) {
                Ok(()) => {
                    return Ok(Updated {
                        result: counted,
                        ..nothing
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

    fn count_in_use<S: SharedStore>(
        &self,
        store: &S,
        sets: impl Iterator<Item = u32>,
    ) -> Result<u64, StoreError> {
        let mut used = 0;
        for index in sets {
            let (value, _) = store.get(&self.set_key(index))?;
            let set = SlotSet::<V>::decode(value.as_deref());
            used += set.slots.iter().filter(|s| s.fingerprint != 0).count() as u64;
        }
        Ok(used)
    }

    /// Runs `decide` on the key's state and stores what it returns, with CAS.
    ///
    /// `decide` gets the key's state (`None` for a key without one) and returns its
    /// result and the state to store (`None`: write nothing). `vacancy` tells what a
    /// slot's state is worth, for takeover and eviction.
    pub fn update<S, R>(
        &self,
        store: &S,
        hash: &KeyHash,
        now_us: u64,
        vacancy: impl Fn(V) -> Vacancy,
        mut decide: impl FnMut(Option<V>) -> (R, Option<V>),
    ) -> Result<Updated<R>, UpdateError>
    where
        S: SharedStore,
    {
        let key = self.set_key(self.set_index(hash));
        super::update_with_cas(store, &key, |value| {
            let mut set = SlotSet::<V>::decode(value);
            let (way, placement) = set.locate(hash.fingerprint, now_us, &vacancy);
            let current = match placement {
                Placement::Existing => set.slots.get(way).map(|s| s.state),
                _ => None,
            };
            let replaced_in_use = match placement {
                Placement::Takeover | Placement::Eviction => {
                    set.slots.get(way).map_or(0, |s| vacancy(s.state).in_use)
                }
                Placement::Existing | Placement::Empty => 0,
            };
            let (result, next) = decide(current);
            let Some(next) = next else {
                return (None, Updated::nothing(result));
            };
            if let Some(slot) = set.slots.get_mut(way) {
                *slot = Slot {
                    fingerprint: hash.fingerprint,
                    state: next,
                };
            }
            let written = Updated {
                result,
                placement: Some(placement),
                cas_retries: 0,
                replaced_in_use,
            };
            (Some(set.encode()), written)
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct Slot<V> {
    fingerprint: u64,
    state: V,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
struct SlotSet<V> {
    slots: [Slot<V>; WAYS],
}

/// One set's bytes, on the stack.
struct SetBytes {
    bytes: [u8; MAX_SET_BYTES],
    len: usize,
}

impl AsRef<[u8]> for SetBytes {
    fn as_ref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl SetBytes {
    fn as_slice(&self) -> &[u8] {
        self.bytes.get(..self.len).unwrap_or(&self.bytes)
    }
}

impl<V: SlotValue> SlotSet<V> {
    /// Anything that is not exactly one set's bytes (never written, truncated, from a
    /// future layout) reads as empty: state is lost, nothing is misattributed.
    fn decode(bytes: Option<&[u8]>) -> SlotSet<V> {
        let mut set = SlotSet::default();
        let Some(bytes) = bytes.filter(|b| b.len() == set_bytes::<V>()) else {
            return set;
        };
        let mut words = [0u64; 1 + MAX_VALUE_WORDS];
        for (slot, chunk) in set
            .slots
            .iter_mut()
            .zip(bytes.chunks_exact(slot_bytes::<V>()))
        {
            for (word, b) in words.iter_mut().zip(chunk.chunks_exact(8)) {
                *word = <[u8; 8]>::try_from(b).map_or(0, u64::from_le_bytes);
            }
            *slot = Slot {
                fingerprint: words[0],
                state: V::from_words(words.get(1..=V::WORDS).unwrap_or(&[])),
            };
        }
        set
    }

    fn encode(&self) -> SetBytes {
        let mut out = SetBytes {
            bytes: [0u8; MAX_SET_BYTES],
            len: set_bytes::<V>(),
        };
        let mut words = [0u64; 1 + MAX_VALUE_WORDS];
        for (slot, chunk) in self
            .slots
            .iter()
            .zip(out.bytes.chunks_exact_mut(slot_bytes::<V>()))
        {
            words[0] = slot.fingerprint;
            if let Some(state_words) = words.get_mut(1..=V::WORDS) {
                slot.state.to_words(state_words);
            }
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
        vacancy: &impl Fn(V) -> Vacancy,
    ) -> (usize, Placement) {
        if let Some(way) = self.slots.iter().position(|s| s.fingerprint == fingerprint) {
            return (way, Placement::Existing);
        }
        if let Some(way) = self.slots.iter().position(|s| s.fingerprint == 0) {
            return (way, Placement::Empty);
        }
        let vacancies = self.slots.map(|s| vacancy(s.state));
        let idlest = vacancies
            .iter()
            .enumerate()
            .min_by_key(|(_, v)| v.idle_at_us);
        if let Some((way, _)) = idlest.filter(|(_, v)| v.idle_at_us <= now_us) {
            return (way, Placement::Takeover);
        }
        // A key at its limit holds the most: it is the last to go, so a flood of new
        // keys cannot hand it a fresh start.
        let way = vacancies
            .iter()
            .enumerate()
            .min_by_key(|(_, v)| (v.in_use, v.idle_at_us))
            .map_or(0, |(way, _)| way);
        (way, Placement::Eviction)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn set_bytes_round_trip() {
        let mut set = SlotSet::<SlotState>::default();
        set.slots[2] = Slot {
            fingerprint: 7,
            state: SlotState { a: u64::MAX, b: 3 },
        };
        let bytes = set.encode();
        assert_eq!(bytes.as_slice().len(), 96);
        assert_eq!(SlotSet::decode(Some(bytes.as_slice())), set);
        assert_eq!(
            SlotSet::<SlotState>::decode(Some(&[1, 2, 3])),
            SlotSet::default()
        );
        assert_eq!(SlotSet::<SlotState>::decode(None), SlotSet::default());
    }

    /// A value of the widest layout, to check the codec at its limit.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
    struct Wide([u64; MAX_VALUE_WORDS]);

    impl SlotValue for Wide {
        const WORDS: usize = MAX_VALUE_WORDS;
        fn to_words(&self, words: &mut [u64]) {
            words.copy_from_slice(&self.0);
        }
        fn from_words(words: &[u64]) -> Self {
            let mut w = [0; MAX_VALUE_WORDS];
            w.copy_from_slice(words);
            Wide(w)
        }
    }

    #[test]
    fn wide_values_round_trip() {
        let mut set = SlotSet::<Wide>::default();
        set.slots[3] = Slot {
            fingerprint: 9,
            state: Wide([1, 2, 3, u64::MAX, 5, 6, 7, 8]),
        };
        let bytes = set.encode();
        assert_eq!(bytes.as_slice().len(), set_bytes::<Wide>());
        assert_eq!(SlotSet::decode(Some(bytes.as_slice())), set);
        // A set written with another width is not this table's: it reads as empty.
        let narrow = SlotSet::<SlotState>::default().encode();
        assert_eq!(
            SlotSet::<Wide>::decode(Some(narrow.as_slice())),
            SlotSet::default()
        );
    }

    #[test]
    fn tables_round_max_keys_up_to_whole_sets() {
        let t = SlotTable::<SlotState>::new("r", "gcra", 1000);
        assert_eq!((t.sets(), t.capacity()), (250, 1000));
        let t = SlotTable::<SlotState>::new("r", "gcra", 1001);
        assert_eq!((t.sets(), t.capacity()), (251, 1004));
        assert_eq!(t.set_key(3), "weir/v1/r/gcra/3");
    }
}
