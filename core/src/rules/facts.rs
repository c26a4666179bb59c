//! What a rule reads of a request: the distinct [`Fact`]s of a config, numbered by the
//! compiler, and one request's [`Facts`], fetched from the host lazily and at most once.

use crate::usage::clamp::BodyClamp;
use crate::usage::BodyEstimate;

/// Index of a fact in the [`FactTable`] of a compiled config.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FactId(pub u16);

/// Something the host can tell about a request.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Fact {
    /// A request header by lowercase name; pseudo-headers (`:path`, `:method`,
    /// `:authority`) included.
    Header(String),
    /// An Envoy attribute by path, e.g. `["source", "address"]`.
    Property(Vec<String>),
    /// A cost estimated from the request's JSON body, as a decimal integer (see
    /// [`BodyEstimate::estimate`]; `u64::MAX` for a body too large to read). The filter
    /// reads the body only for requests a rule with this fact matches.
    RequestBodyEstimate(BodyEstimate),
    /// The prompt's share of a body estimate, as a decimal integer, when the body can be
    /// clamped (see [`BodyClamp::prompt`]); absent otherwise. Read by rules with
    /// `commit.clamp`.
    RequestBodyPrompt(BodyClamp),
}

/// Every distinct fact the rules of one config can ask for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FactTable {
    facts: Vec<Fact>,
}

impl FactTable {
    /// Returns the id of `fact`, adding it if new. Fails past `u16::MAX` facts.
    pub fn intern(&mut self, fact: Fact) -> Option<FactId> {
        if let Some(at) = self.facts.iter().position(|f| *f == fact) {
            return u16::try_from(at).ok().map(FactId);
        }
        let id = u16::try_from(self.facts.len()).ok()?;
        self.facts.push(fact);
        Some(FactId(id))
    }

    pub fn get(&self, id: FactId) -> Option<&Fact> {
        self.facts.get(usize::from(id.0))
    }

    pub fn iter(&self) -> impl Iterator<Item = &Fact> {
        self.facts.iter()
    }

    pub fn len(&self) -> usize {
        self.facts.len()
    }

    pub fn is_empty(&self) -> bool {
        self.facts.is_empty()
    }
}

/// Where request facts come from: the proxy-wasm host in the filter, a map in tests.
pub trait FactSource {
    /// The raw bytes of `fact`, or `None` when the request does not have it.
    fn fetch(&mut self, fact: &Fact) -> Option<Vec<u8>>;
}

/// One request's facts, fetched lazily and at most once each.
pub struct Facts<'t, S> {
    source: S,
    table: &'t FactTable,
    cache: Vec<Option<Option<Vec<u8>>>>,
}

impl<'t, S: FactSource> Facts<'t, S> {
    pub fn new(table: &'t FactTable, source: S) -> Self {
        Facts {
            source,
            table,
            cache: Vec::new(),
        }
    }

    pub fn get(&mut self, id: FactId) -> Option<&[u8]> {
        let at = usize::from(id.0);
        if self.cache.len() <= at {
            self.cache.resize(self.table.len().max(at + 1), None);
        }
        let slot = self.cache.get_mut(at)?;
        if slot.is_none() {
            let fetched = self.table.get(id).and_then(|fact| self.source.fetch(fact));
            *slot = Some(fetched);
        }
        slot.as_ref().and_then(|v| v.as_deref())
    }
}

/// Where a delaying rule reads its requests' own deadlines: the facts of the two headers
/// [`crate::deadline`] reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeadlineFacts {
    pub grpc_timeout: FactId,
    pub expected_rq_timeout: FactId,
}

impl DeadlineFacts {
    /// The request's deadline, µs since the epoch, for a request that arrived at
    /// `arrived_us`; `None` when no header states one.
    pub fn deadline_us<F: FactSource>(
        &self,
        facts: &mut Facts<'_, F>,
        arrived_us: u64,
    ) -> Option<u64> {
        let grpc = facts.get(self.grpc_timeout).map(<[u8]>::to_vec);
        let expected = facts.get(self.expected_rq_timeout);
        let timeout_us = crate::deadline::stated_timeout_us(grpc.as_deref(), expected)?;
        Some(arrived_us.saturating_add(timeout_us))
    }
}
