//! The core's contracts implemented over the host: shared data as a [`SharedStore`],
//! request headers and attributes as a [`FactSource`].

use crate::host::{self, HostError};
use weir_core::rules::{Fact, FactSource, FactTable};
use weir_core::store::{SharedStore, StoreError};
use weir_core::usage::RequestBody;

/// Envoy shared data (per process and `vm_id`, seen by every worker).
pub struct SharedData;

fn store_error(e: HostError) -> StoreError {
    if e.0 == host::CAS_MISMATCH {
        StoreError::CasMismatch
    } else {
        StoreError::Host(e.0)
    }
}

impl SharedStore for SharedData {
    fn get(&self, key: &str) -> Result<(Option<Vec<u8>>, Option<u32>), StoreError> {
        host::shared_get(key).map_err(store_error)
    }

    fn compare_and_set(&self, key: &str, value: &[u8], version: u32) -> Result<(), StoreError> {
        // A version of 0 would be an unconditional write: never pass one (a `get` never
        // returns it).
        if version == 0 {
            return Err(StoreError::CasMismatch);
        }
        host::shared_set(key, value, Some(version)).map_err(store_error)
    }

    fn create(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        host::shared_set(key, value, None).map_err(store_error)
    }
}

/// The current request, read from the host on demand — or from what was read of it
/// before its headers went on (Envoy's Wasm host forgets them then) — with its body when
/// a rule's cost is estimated from it. A fact the host cannot read is treated as absent:
/// the rule's documented missing-key behaviour applies.
pub struct RequestFacts<'a> {
    pub body: RequestBody<'a>,
    pub read: Option<&'a ReadFacts>,
}

/// Every header and attribute a config can ask for, read while the host still has them.
pub struct ReadFacts(Vec<(Fact, Option<Vec<u8>>)>);

impl ReadFacts {
    pub fn now(table: &FactTable) -> ReadFacts {
        let mut facts = RequestFacts {
            body: RequestBody::Absent,
            read: None,
        };
        ReadFacts(
            table
                .iter()
                .filter(|fact| !matches!(fact, Fact::RequestBodyEstimate(_)))
                .map(|fact| (fact.clone(), facts.fetch(fact)))
                .collect(),
        )
    }
}

impl FactSource for RequestFacts<'_> {
    fn fetch(&mut self, fact: &Fact) -> Option<Vec<u8>> {
        if let Fact::RequestBodyEstimate(estimate) = fact {
            return estimate
                .estimate(self.body)
                .map(|n| n.to_string().into_bytes());
        }
        if let Some(read) = self.read {
            return read.0.iter().find(|(f, _)| f == fact)?.1.clone();
        }
        let found = match fact {
            Fact::Header(name) => host::request_header(name),
            Fact::Property(path) => host::property(path),
            Fact::RequestBodyEstimate(_) => return None,
        };
        found.ok().flatten()
    }
}
