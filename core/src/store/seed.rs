//! The hashing seed every worker of one Envoy process must share.
//!
//! Slot tables place a key by a SipHash of it under a secret [`Seed`], so that clients
//! cannot aim their keys at a victim's set. Every VM of the process must use the same
//! seed, or workers would look for one key in different slots and each admit the full
//! limit.
//!
//! The seed is written once, by whichever VM first finds it missing, and never written
//! again: [`load_or_create`] creates it only after a `get` found no seed, and every VM
//! then uses what is stored. Creating is the one write the host cannot make conditional
//! (see [`super`]): two VMs that both find no seed both create one, and the later write
//! wins. The earlier writer then holds a seed that is no longer stored, until it calls
//! [`reload`] — the filter does so on every tick of every VM (about every 100 ms), so the
//! VMs agree again within a tick. In Envoy the race needs two VMs configuring at the same
//! time on an Envoy whose shared data has no seed yet; the base VM configures on the main
//! thread before any worker does, so it is not seen in practice, and if it ever happens
//! its cost is bounded: keys decided under the lost seed in that tick restart fresh in
//! their right slot (more quota for those keys once, never another key's quota).

use super::{SharedStore, StoreError};
use crate::key::Seed;

/// The shared-data key holding the hashing seed.
pub const SEED_KEY: &str = "weir/v1/seed";

/// The stored seed, or `None` if no VM has stored one yet (or what is stored is not a
/// seed: it is then replaced by the next [`load_or_create`]).
pub fn load<S: SharedStore>(store: &S) -> Result<Option<Seed>, StoreError> {
    let (value, _) = store.get(SEED_KEY)?;
    Ok(value
        .as_deref()
        .and_then(|v| <[u8; 16]>::try_from(v).ok())
        .map(Seed))
}

/// Returns the stored seed, storing `fresh` first if there is none.
pub fn load_or_create<S: SharedStore>(store: &S, fresh: [u8; 16]) -> Result<Seed, StoreError> {
    if let Some(seed) = load(store)? {
        return Ok(seed);
    }
    store.create(SEED_KEY, &fresh)?;
    load(store)?.ok_or(StoreError::Missing)
}

/// The stored seed if it differs from `current` (a racing creator replaced the one this
/// VM stored): the caller adopts it.
pub fn reload<S: SharedStore>(store: &S, current: Seed) -> Result<Option<Seed>, StoreError> {
    Ok(load(store)?.filter(|stored| *stored != current))
}

#[cfg(test)]
mod tests {
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    use super::*;
    use crate::store::memory::MemoryStore;
    use std::cell::Cell;

    #[test]
    fn the_first_seed_stays() {
        let store = MemoryStore::new();
        let a = load_or_create(&store, [1; 16]).unwrap();
        let b = load_or_create(&store, [2; 16]).unwrap();
        assert_eq!((a, b), (Seed([1; 16]), Seed([1; 16])));
        assert_eq!(reload(&store, a), Ok(None));
    }

    /// A store that runs `before_create` once, just before the first create: where a
    /// second VM's whole initialisation can slip in.
    struct Interleaved<'a, F: Fn()> {
        store: &'a MemoryStore,
        before_create: Cell<Option<F>>,
    }

    impl<F: Fn()> SharedStore for Interleaved<'_, F> {
        fn get(&self, key: &str) -> Result<(Option<Vec<u8>>, Option<u32>), StoreError> {
            self.store.get(key)
        }
        fn compare_and_set(&self, key: &str, value: &[u8], version: u32) -> Result<(), StoreError> {
            self.store.compare_and_set(key, value, version)
        }
        fn create(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
            if let Some(other) = self.before_create.take() {
                other();
            }
            self.store.create(key, value)
        }
    }

    #[test]
    fn racing_initialisations_agree_after_a_reload() {
        let store = MemoryStore::new();
        let first = Cell::new(None);
        // VM A finds no seed; before its create lands, VM B initialises completely.
        let vm_a = Interleaved {
            store: &store,
            before_create: Cell::new(Some(|| first.set(load_or_create(&store, [2; 16]).ok()))),
        };
        let a = load_or_create(&vm_a, [1; 16]).unwrap();
        let b = first.get().unwrap();
        // The race the host cannot prevent: A's create overwrote B's seed.
        assert_eq!((a, b), (Seed([1; 16]), Seed([2; 16])));
        // On its next tick B sees the stored seed and adopts it; A keeps it.
        assert_eq!(reload(&store, b), Ok(Some(a)));
        assert_eq!(reload(&store, a), Ok(None));
        // And nothing ever overwrites a stored seed.
        assert_eq!(load_or_create(&store, [3; 16]), Ok(a));
    }

    #[test]
    fn garbage_is_not_a_seed() {
        let store = MemoryStore::new();
        store.create(SEED_KEY, b"short").unwrap();
        assert_eq!(load(&store), Ok(None));
        assert_eq!(load_or_create(&store, [4; 16]), Ok(Seed([4; 16])));
    }
}
