//! The store contract and the bounded slot table that keeps per-key state in it.
//!
//! Envoy's shared data is a process-wide map of byte strings with a version per key:
//! `get` returns `(value, cas)` and `set(key, value, Some(cas))` fails with a CAS
//! mismatch when another worker wrote first. [`SharedStore`] is that contract; the
//! filter implements it over proxy-wasm shared data and tests use [`memory::MemoryStore`].
//!
//! Shared-data keys can never be deleted (proxy-wasm/spec#32), so per-client state never
//! gets a key of its own: each rule owns a fixed [`SlotTable`] whose size comes from
//! `max_keys`, whatever clients send. See [`slot_table`] for the layout.

pub mod memory;
pub mod slot_table;

pub use slot_table::{KeyHash, KeyHasher, Placement, Seed, SlotTable, Updated};

use std::fmt;

/// Why a store operation failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreError {
    /// Another writer changed the key since it was read.
    CasMismatch,
    /// The host refused the operation; the number is its status code.
    Host(u32),
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreError::CasMismatch => f.write_str("compare-and-swap mismatch"),
            StoreError::Host(status) => write!(f, "host status {status}"),
        }
    }
}

/// A versioned byte-string map shared by every worker of one Envoy process.
pub trait SharedStore {
    /// The value of `key` (`None` if never written) and its version (`None` if the key
    /// does not exist).
    fn get(&self, key: &str) -> Result<(Option<Vec<u8>>, Option<u32>), StoreError>;

    /// Writes `value` if the version of `key` is still `cas`. `cas: None` writes
    /// unconditionally: there is no atomic create-if-absent, which is why slot tables
    /// are created before they serve.
    fn set(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), StoreError>;
}

/// How many times a contended update re-reads and re-decides before giving up.
/// Each attempt loses only to a writer that succeeded, so giving up needs dozens of
/// other workers to win in a row: it is counted, and the caller decides what to do.
pub const MAX_CAS_ATTEMPTS: u32 = 32;

/// Why an update of a slot did not happen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpdateError {
    /// Every attempt lost a CAS race.
    GaveUp {
        attempts: u32,
    },
    Store(StoreError),
}

impl fmt::Display for UpdateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UpdateError::GaveUp { attempts } => {
                write!(
                    f,
                    "gave up after {attempts} contended compare-and-swap attempts"
                )
            }
            UpdateError::Store(e) => write!(f, "shared data: {e}"),
        }
    }
}

impl From<StoreError> for UpdateError {
    fn from(e: StoreError) -> Self {
        UpdateError::Store(e)
    }
}
