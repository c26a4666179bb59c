//! The store contract, the hashing seed every worker shares, and the bounded slot table
//! that keeps per-key state in the store.
//!
//! Envoy's shared data is a process-wide map of byte strings with a version per key:
//! `get` returns `(value, version)`, and a write with a version fails with a CAS mismatch
//! when another worker wrote first. A write *without* a version always succeeds, and it
//! is also the only way to create a key: the host has no atomic create-if-absent
//! (proxy-wasm's `set_shared_data` ignores the version of a key that does not exist yet).
//! [`SharedStore`] names the two writes apart — [`SharedStore::compare_and_set`] and
//! [`SharedStore::create`] — so that an unconditional write can only be a creation
//! after a `get` found the key missing; weir makes one for the seed ([`seed`]) and for
//! each set of a table when it is created ([`SlotTable::create_missing`]), and nowhere
//! else. The filter implements the contract over proxy-wasm shared data and tests use
//! [`memory::MemoryStore`].
//!
//! Shared-data keys can never be deleted (proxy-wasm/spec#32), so per-client state never
//! gets a key of its own: each rule owns a fixed [`SlotTable`] whose size comes from
//! `max_keys`, whatever clients send. See [`slot_table`] for the layout.

pub mod memory;
pub mod seed;
pub mod share_table;
pub mod slot_table;

pub use share_table::ShareTable;
pub use slot_table::{Placement, SlotTable, Updated, Vacancy};

use std::fmt;

/// Why a store operation failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreError {
    /// Another writer changed the key since it was read.
    CasMismatch,
    /// A key that should exist (a set of a table created at configure time) does not.
    Missing,
    /// The host refused the operation; the number is its status code.
    Host(u32),
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreError::CasMismatch => f.write_str("compare-and-swap mismatch"),
            StoreError::Missing => f.write_str("a key that should exist is missing"),
            StoreError::Host(status) => write!(f, "host status {status}"),
        }
    }
}

/// A versioned byte-string map shared by every worker of one Envoy process.
pub trait SharedStore {
    /// The value of `key` (`None` if never written) and its version (`None` if the key
    /// does not exist).
    fn get(&self, key: &str) -> Result<(Option<Vec<u8>>, Option<u32>), StoreError>;

    /// Writes `value` if the version of `key` is still `version` (as `get` returned it);
    /// [`StoreError::CasMismatch`] if another writer came first.
    fn compare_and_set(&self, key: &str, value: &[u8], version: u32) -> Result<(), StoreError>;

    /// Writes `value` unconditionally: the only way to create a key. Call it only after
    /// `get` found `key` missing, knowing that a racing creator may overwrite (or be
    /// overwritten by) this write.
    fn create(&self, key: &str, value: &[u8]) -> Result<(), StoreError>;
}

/// Creates each of the `sets` keys `<prefix><index>` that does not exist yet, holding
/// `empty`, and marks the table ready (`<prefix>ready`, the set count) so that a later
/// configure skips the scan; returns how many it created. Keys that exist (from an
/// earlier config, another worker or a reload) keep their state.
///
/// A key is created only after a `get` found it missing, but two VMs creating the same
/// table at once can still both find it missing, and the later creation then empties a
/// set the other may already have written to: those keys restart fresh, once.
pub(crate) fn create_sets<S: SharedStore>(
    store: &S,
    prefix: &str,
    sets: u32,
    empty: &[u8],
) -> Result<u32, StoreError> {
    let ready_key = format!("{prefix}ready");
    let (ready, ready_version) = store.get(&ready_key)?;
    if ready.as_deref() == Some(sets.to_le_bytes().as_slice()) {
        return Ok(0);
    }
    let mut created = 0;
    for index in 0..sets {
        let key = format!("{prefix}{index}");
        if let (_, None) = store.get(&key)? {
            store.create(&key, empty)?;
            created += 1;
        }
    }
    let marker = sets.to_le_bytes();
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

/// How many times a contended update re-reads and re-decides before giving up.
/// Each attempt loses only to a writer that succeeded, so giving up needs dozens of
/// other workers to win in a row: it is counted, and the caller decides what to do.
pub const MAX_CAS_ATTEMPTS: u32 = 32;

/// Get → decide → CAS-set on `key`, re-run on contention: `attempt` reads the value
/// (`None` if never written) and returns the bytes to write (`None`: write nothing) with
/// the update's outcome, whose `cas_retries` this fills in. The key must exist: created
/// at configure time and never deleted, a missing one is not ours to create here (a
/// blind write could empty a set another worker just filled).
pub(crate) fn update_with_cas<S: SharedStore, B: AsRef<[u8]>, R>(
    store: &S,
    key: &str,
    mut attempt: impl FnMut(Option<&[u8]>) -> (Option<B>, Updated<R>),
) -> Result<Updated<R>, UpdateError> {
    for retries in 0..MAX_CAS_ATTEMPTS {
        let (value, version) = store.get(key)?;
        let version = version.ok_or(StoreError::Missing)?;
        let (bytes, updated) = attempt(value.as_deref());
        let done = Updated {
            cas_retries: retries,
            ..updated
        };
        let Some(bytes) = bytes else {
            return Ok(done);
        };
        match store.compare_and_set(key, bytes.as_ref(), version) {
            Ok(()) => return Ok(done),
            Err(StoreError::CasMismatch) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(UpdateError::GaveUp {
        attempts: MAX_CAS_ATTEMPTS,
    })
}

/// Why an update of a slot did not happen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpdateError {
    /// Every attempt lost a CAS race.
    GaveUp {
        attempts: u32,
    },
    Store(StoreError),
}

impl UpdateError {
    /// CAS attempts this failure lost (0 for a store error).
    pub fn lost_attempts(self) -> u32 {
        match self {
            UpdateError::GaveUp { attempts } => attempts,
            UpdateError::Store(_) => 0,
        }
    }
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
