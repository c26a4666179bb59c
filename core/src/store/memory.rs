//! An in-memory [`SharedStore`] with Envoy's semantics, for tests and tools.
//!
//! Like Envoy: a missing key has no version, `create` always writes, every write bumps
//! the key's version, and a stale version fails with `CasMismatch`.
//!
//! Tests can make the next writes fail ([`MemoryStore::fail_next_writes`]): as if other
//! workers won every race, or as if the host refused.

use super::{SharedStore, StoreError};
use std::collections::HashMap;
use std::sync::Mutex;

#[derive(Debug, Default)]
pub struct MemoryStore {
    entries: Mutex<HashMap<String, (Vec<u8>, u32)>>,
    /// Compare-and-set calls still to fail, and how.
    faults: Mutex<(u32, Option<StoreError>)>,
}

impl MemoryStore {
    pub fn new() -> Self {
        Self::default()
    }

    /// The next `count` compare-and-set calls fail with `error` and write nothing
    /// (`StoreError::CasMismatch`: as if another worker had written first each time).
    pub fn fail_next_writes(&self, count: u32, error: StoreError) {
        if let Ok(mut faults) = self.faults.lock() {
            *faults = (count, Some(error));
        }
    }

    /// Compare-and-set calls still to fail.
    pub fn failures_left(&self) -> u32 {
        self.faults.lock().map_or(0, |f| f.0)
    }

    fn injected_fault(&self) -> Option<StoreError> {
        let mut faults = self.faults.lock().ok()?;
        if faults.0 == 0 {
            return None;
        }
        faults.0 -= 1;
        faults.1
    }

    /// Number of keys ever written (shared data never forgets one).
    pub fn key_count(&self) -> usize {
        self.entries.lock().map_or(0, |e| e.len())
    }

    /// Total bytes of keys and values.
    pub fn byte_count(&self) -> usize {
        self.entries
            .lock()
            .map_or(0, |e| e.iter().map(|(k, (v, _))| k.len() + v.len()).sum())
    }
}

impl SharedStore for MemoryStore {
    fn get(&self, key: &str) -> Result<(Option<Vec<u8>>, Option<u32>), StoreError> {
        let entries = self.entries.lock().map_err(|_| StoreError::Host(0))?;
        Ok(match entries.get(key) {
            Some((value, version)) => (Some(value.clone()), Some(*version)),
            None => (None, None),
        })
    }

    fn compare_and_set(&self, key: &str, value: &[u8], version: u32) -> Result<(), StoreError> {
        if let Some(fault) = self.injected_fault() {
            return Err(fault);
        }
        let mut entries = self.entries.lock().map_err(|_| StoreError::Host(0))?;
        // Envoy would create a missing key here; weir only ever passes a version that a
        // `get` returned, and keys are never deleted, so a missing key is a bug to see.
        let (stored, current) = entries.get_mut(key).ok_or(StoreError::Missing)?;
        if *current != version {
            return Err(StoreError::CasMismatch);
        }
        *stored = value.to_vec();
        *current = current.wrapping_add(1).max(1);
        Ok(())
    }

    fn create(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        let mut entries = self.entries.lock().map_err(|_| StoreError::Host(0))?;
        let entry = entries.entry(key.to_string()).or_insert((Vec::new(), 0));
        entry.0 = value.to_vec();
        entry.1 = entry.1.wrapping_add(1).max(1);
        Ok(())
    }
}
