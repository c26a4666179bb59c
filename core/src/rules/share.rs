//! A rule whose limit its keys share (`share`): the rule's key names the parent (the
//! organisation), `share.by` the key within it (the user), and each key active in the
//! last window is entitled to its weighted share of the parent's limit
//! ([`crate::share`]).

use super::request_limit::LimitFrom;
use super::{FactSource, Facts, KeyPart, Rule};
use crate::key::{KeyHasher, PartOrigin, Seed};
use crate::share::{ShareLimit, MAX_WEIGHT};

/// `share`: how a rule's limit is split among the keys under its key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Share {
    /// The key within the parent: trusted facts only (a claim, metadata, a header
    /// listed in `trusted_headers`), so a client cannot mint keys of its own.
    pub by: Vec<KeyPart>,
    /// The parent's limit and window, and the keys it tracks.
    pub limit: ShareLimit,
    /// Where a key's weight comes from (`None`: every key weighs 1).
    pub weight: Option<LimitFrom>,
}

/// What a request is under a shared rule: its key within the parent and its weight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShareOf {
    /// The key's fingerprint (never 0); `None` when a `share.by` part has no value and
    /// no default: the request is entitled to nothing and gets only what is free.
    pub key: Option<u64>,
    pub weight: u64,
    /// The weight was there but not a number: its `default` stood in.
    pub weight_invalid: bool,
}

impl Rule {
    /// Feeds the parts of the request's key within its parent (`share.by`) to `sink`, as
    /// [`Rule::visit_key`] does; false when a part has no value and no default (the
    /// request then names no key), and when the rule has no `share`.
    pub fn visit_share_key<S: FactSource>(
        &self,
        facts: &mut Facts<'_, S>,
        sink: impl FnMut(PartOrigin, &[u8]),
    ) -> bool {
        self.share
            .as_ref()
            .is_some_and(|share| super::keys::visit_parts(&share.by, facts, sink))
    }

    /// The request's key within its parent and its weight, for a rule with `share`.
    pub fn share_of<S: FactSource>(
        &self,
        facts: &mut Facts<'_, S>,
        seed: &Seed,
    ) -> Option<ShareOf> {
        let share = self.share.as_ref()?;
        let mut hasher = KeyHasher::new(seed);
        let named = self.visit_share_key(facts, |origin, bytes| hasher.part(origin, bytes));
        let key = named.then(|| hasher.finish().fingerprint.max(1));
        let (weight, weight_invalid) = match &share.weight {
            None => (1, false),
            Some(from) => match from.value(facts) {
                Some(weight) => (weight, false),
                None => (from.default, true),
            },
        };
        Some(ShareOf {
            key,
            weight: weight.clamp(1, MAX_WEIGHT),
            weight_invalid,
        })
    }
}
