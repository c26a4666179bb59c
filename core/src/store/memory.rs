//! An in-memory [`SharedStore`] with Envoy's semantics, for tests and tools.
//!
//! Like Envoy: a missing key has no version, `set(.., None)` always writes, every
//! write bumps the key's version, and a stale `cas` fails with `CasMismatch`.

use super::{SharedStore, StoreError};
use std::collections::HashMap;
use std::sync::Mutex;

#[derive(Debug, Default)]
pub struct MemoryStore {
    entries: Mutex<HashMap<String, (Vec<u8>, u32)>>,
}

impl MemoryStore {
    pub fn new() -> Self {
        Self::default()
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
            Some((value, cas)) => (Some(value.clone()), Some(*cas)),
            None => (None, None),
        })
    }

    fn set(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), StoreError> {
        let mut entries = self.entries.lock().map_err(|_| StoreError::Host(0))?;
        match entries.get_mut(key) {
            Some((stored, version)) => {
                if cas.is_some_and(|c| c != *version) {
                    return Err(StoreError::CasMismatch);
                }
                *stored = value.to_vec();
                *version = version.wrapping_add(1).max(1);
            }
            None => {
                entries.insert(key.to_string(), (value.to_vec(), 1));
            }
        }
        Ok(())
    }
}
