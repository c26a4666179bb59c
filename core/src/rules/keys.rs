//! The key a rule counts a request under: its parts, each from a request fact, a default
//! or a static value, fed in order to what frames them ([`crate::key`]).

use super::request_text::{path_only, query_param, strip_port};
use super::{FactId, FactSource, Facts, Rule};
use crate::key::PartOrigin;

/// One element of a rule's key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyPart {
    pub source: KeySource,
    /// Used when the source has no value or an empty one.
    pub default: Option<Vec<u8>>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeySource {
    /// A request header's value, as raw bytes.
    Header {
        fact: FactId,
    },
    /// The downstream address without its port (`source.address`; trust it only with
    /// `use_remote_address: true` or trusted hops in the connection manager).
    ClientIp {
        fact: FactId,
    },
    /// `:path` without its query string.
    Path {
        fact: FactId,
    },
    Method {
        fact: FactId,
    },
    /// The first value of a query parameter, percent-decoded.
    QueryParam {
        fact: FactId,
        name: Vec<u8>,
    },
    /// A JWT claim that Envoy's jwt_authn filter placed in dynamic metadata, or any
    /// other Envoy attribute: the attribute's bytes as the host returns them.
    Attribute {
        fact: FactId,
    },
    /// A fixed value (e.g. to name a bucket shared by every request of the rule).
    Static {
        value: Vec<u8>,
    },
}

impl Rule {
    /// Feeds the rule's key parts, in order, to `sink`. Returns false (and stops) when a
    /// part has no value and no default: the rule does not apply to this request.
    pub fn visit_key<S: FactSource>(
        &self,
        facts: &mut Facts<'_, S>,
        sink: impl FnMut(PartOrigin, &[u8]),
    ) -> bool {
        visit_parts(&self.key, facts, sink)
    }
}

/// Feeds `parts`, in order, to `sink`; false (and stops) at a part without a value and
/// without a default.
pub(super) fn visit_parts<S: FactSource>(
    parts: &[KeyPart],
    facts: &mut Facts<'_, S>,
    mut sink: impl FnMut(PartOrigin, &[u8]),
) -> bool {
    for part in parts {
        let found = part_value(&part.source, facts);
        match found {
            Some(PartValue::Borrowed(origin, bytes)) if !bytes.is_empty() => sink(origin, bytes),
            Some(PartValue::Owned(bytes)) if !bytes.is_empty() => sink(PartOrigin::Request, &bytes),
            _ => match &part.default {
                Some(default) => sink(PartOrigin::Default, default),
                None => return false,
            },
        }
    }
    true
}

enum PartValue<'a> {
    Borrowed(PartOrigin, &'a [u8]),
    Owned(Vec<u8>),
}

fn part_value<'a, S: FactSource>(
    source: &'a KeySource,
    facts: &'a mut Facts<'_, S>,
) -> Option<PartValue<'a>> {
    let request = |bytes| PartValue::Borrowed(PartOrigin::Request, bytes);
    match source {
        KeySource::Header { fact } | KeySource::Method { fact } | KeySource::Attribute { fact } => {
            facts.get(*fact).map(request)
        }
        KeySource::ClientIp { fact } => facts.get(*fact).map(strip_port).map(request),
        KeySource::Path { fact } => facts.get(*fact).map(path_only).map(request),
        KeySource::QueryParam { fact, name } => facts
            .get(*fact)
            .and_then(|path| query_param(path, name))
            .map(PartValue::Owned),
        KeySource::Static { value } => Some(PartValue::Borrowed(PartOrigin::Static, value)),
    }
}
