//! The current request's facts for the rules ([`FactSource`]): read from the host on
//! demand — or from what was read of them before the request's headers went on (Envoy's
//! Wasm host forgets them then) — with its body when a rule estimates its cost from it.
//! A fact the host cannot read is treated as absent: the rule's documented missing-key
//! behaviour applies.

use super::host::Host;
use crate::rules::{Fact, FactSource, FactTable};
use crate::usage::RequestBody;

pub struct RequestFacts<'a, H> {
    pub host: &'a H,
    pub body: RequestBody<'a>,
    pub read: Option<&'a ReadFacts>,
}

/// Every header and attribute a config can ask for, read while the host still has them.
pub struct ReadFacts(Vec<(Fact, Option<Vec<u8>>)>);

impl ReadFacts {
    pub fn now<H: Host>(host: &H, table: &FactTable) -> ReadFacts {
        let mut facts = RequestFacts {
            host,
            body: RequestBody::Absent,
            read: None,
        };
        ReadFacts(
            table
                .iter()
                .filter(|fact| {
                    !matches!(
                        fact,
                        Fact::RequestBodyEstimate(_) | Fact::RequestBodyPrompt(_)
                    )
                })
                .map(|fact| (fact.clone(), facts.fetch(fact)))
                .collect(),
        )
    }
}

impl<H: Host> FactSource for RequestFacts<'_, H> {
    fn fetch(&mut self, fact: &Fact) -> Option<Vec<u8>> {
        match fact {
            Fact::RequestBodyEstimate(estimate) => {
                return estimate
                    .estimate(self.body)
                    .map(|n| n.to_string().into_bytes())
            }
            Fact::RequestBodyPrompt(clamp) => {
                return clamp.prompt(self.body).map(|n| n.to_string().into_bytes())
            }
            Fact::Header(_) | Fact::Property(_) => {}
        }
        if let Some(read) = self.read {
            return read.0.iter().find(|(f, _)| f == fact)?.1.clone();
        }
        let found = match fact {
            Fact::Header(name) => self.host.request_header(name),
            Fact::Property(path) => self.host.property(path),
            Fact::RequestBodyEstimate(_) | Fact::RequestBodyPrompt(_) => return None,
        };
        found.ok().flatten()
    }
}
