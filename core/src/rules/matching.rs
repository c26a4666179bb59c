//! Which requests a rule applies to: its path, methods, headers and authority.

use super::request_text::{host_only, path_only};
use super::{FactId, FactSource, Facts};

/// All conditions must hold; an absent condition always holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestMatch {
    /// Against `:path` without its query string.
    pub path: Option<(FactId, StringMatch)>,
    /// Uppercase method names; empty means any method.
    pub methods: Vec<Vec<u8>>,
    pub method_fact: Option<FactId>,
    pub headers: Vec<HeaderMatch>,
    /// Against `:authority` without its port, lowercased.
    pub authority: Option<(FactId, StringMatch)>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StringMatch {
    Exact(Vec<u8>),
    Prefix(Vec<u8>),
    Suffix(Vec<u8>),
}

impl StringMatch {
    pub fn matches(&self, value: &[u8]) -> bool {
        match self {
            StringMatch::Exact(want) => value == want.as_slice(),
            StringMatch::Prefix(want) => value.starts_with(want),
            StringMatch::Suffix(want) => value.ends_with(want),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeaderMatch {
    /// Lowercase header name (for messages; the lookup goes through `fact`).
    pub name: String,
    pub fact: FactId,
    pub test: HeaderTest,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeaderTest {
    Present,
    Absent,
    Is(StringMatch),
}

impl RequestMatch {
    pub fn matches<S: FactSource>(&self, facts: &mut Facts<'_, S>) -> bool {
        if let Some((fact, want)) = &self.path {
            match facts.get(*fact) {
                Some(path) if want.matches(path_only(path)) => {}
                _ => return false,
            }
        }
        if !self.methods.is_empty() {
            let Some(fact) = self.method_fact else {
                return false;
            };
            match facts.get(fact) {
                Some(method) if self.methods.iter().any(|m| m.as_slice() == method) => {}
                _ => return false,
            }
        }
        for header in &self.headers {
            let value = facts.get(header.fact);
            let ok = match (&header.test, value) {
                (HeaderTest::Present, found) => found.is_some(),
                (HeaderTest::Absent, found) => found.is_none(),
                (HeaderTest::Is(want), Some(found)) => want.matches(found),
                (HeaderTest::Is(_), None) => false,
            };
            if !ok {
                return false;
            }
        }
        if let Some((fact, want)) = &self.authority {
            match facts.get(*fact) {
                Some(authority) => {
                    let host = host_only(authority);
                    if !want.matches(&host.to_ascii_lowercase()) {
                        return false;
                    }
                }
                None => return false,
            }
        }
        true
    }
}
