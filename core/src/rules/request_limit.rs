//! A rule's limit read from the request: each tenant's own contract, from a fact that
//! something Envoy trusts wrote (a JWT claim `jwt_authn` verified, metadata an
//! `ext_authz` server returned, a header only an earlier filter sets).
//!
//! A value is a whole number: decimal text (a header, a string claim), or a number
//! Envoy hands over as its 8-byte encoding (a JSON number in dynamic metadata is a
//! double; its whole part counts). Absent, the parameter's `default`; present but not a
//! number, the `default` too, and the request says so (counted as `limit_invalid`);
//! outside `min..=max`, clamped.

use super::{parse_decimal, FactId, FactSource, Facts, Rule, Scope};
use crate::algorithms::{GlobalLimit, Limit};

/// One limit parameter read from the request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimitFrom {
    /// Its index in the algorithm's parameter table.
    pub parameter: usize,
    pub fact: FactId,
    /// Whether the fact is an Envoy attribute, whose numbers come encoded (a header's
    /// value is text only).
    pub attribute: bool,
    pub default: u64,
    pub min: u64,
    pub max: u64,
}

impl LimitFrom {
    /// The value this request gives, clamped; `None` when it has one that is not a
    /// number.
    fn value<S: FactSource>(&self, facts: &mut Facts<'_, S>) -> Option<u64> {
        let Some(bytes) = facts.get(self.fact) else {
            return Some(self.default);
        };
        let value = parse_decimal(bytes).or_else(|| {
            let encoded: [u8; 8] = bytes.try_into().ok().filter(|_| self.attribute)?;
            whole_number(f64::from_le_bytes(encoded))
        })?;
        Some(value.clamp(self.min, self.max))
    }
}

/// The whole part of a finite, non-negative double (saturating at `u64::MAX`).
fn whole_number(value: f64) -> Option<u64> {
    // `as` saturates: 1e30 is u64::MAX, which the clamp then brings to `max`.
    (value.is_finite() && value >= 0.0).then(|| value.trunc() as u64)
}

/// The limit one request carries under a rule whose limit it gives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestLimit {
    pub limit: GlobalLimit,
    /// Some value was there but not a number: its `default` stood in.
    pub invalid: bool,
}

impl Rule {
    /// The limit this request carries, for a rule that reads its limit from the request;
    /// `None` for a rule whose limit is fixed. Values that build no limit (the config
    /// checks each parameter's range alone) fall back to the defaults, as invalid.
    pub fn request_limit<S: FactSource>(&self, facts: &mut Facts<'_, S>) -> Option<RequestLimit> {
        if self.limit_from.is_empty() {
            return None;
        }
        let configured = match &self.scope {
            Scope::Local(limit) => GlobalLimit::Slot(limit.clone()),
            Scope::Global(global) => global.limit.clone(),
            Scope::Concurrency(_) => return None,
        };
        let mut values = configured.algorithm().parameters();
        let mut invalid = false;
        for from in &self.limit_from {
            let value = from.value(facts).unwrap_or_else(|| {
                invalid = true;
                from.default
            });
            if let Some(slot) = values.get_mut(from.parameter) {
                *slot = value;
            }
        }
        Some(match GlobalLimit::build(configured.kind(), &values) {
            Ok(limit) => RequestLimit { limit, invalid },
            Err(_) => RequestLimit {
                limit: configured,
                invalid: true,
            },
        })
    }
}

impl Rule {
    /// The limits at the corners of the ranges a request's values may take (each
    /// parameter read from the request at its `min` or its `max`): what a key's state
    /// must be read under, besides the configured limit, to tell when it says nothing.
    /// Empty for a rule whose limit is fixed.
    pub fn request_limit_corners(&self) -> Vec<Limit> {
        let Scope::Local(configured) = &self.scope else {
            return Vec::new();
        };
        let mut corners = Vec::new();
        let count = self.limit_from.len().min(8);
        for corner in 0..(1u32 << count) {
            let mut values = configured.algorithm().parameters();
            for (bit, from) in self.limit_from.iter().take(count).enumerate() {
                let value = if corner & (1 << bit) == 0 {
                    from.min
                } else {
                    from.max
                };
                if let Some(slot) = values.get_mut(from.parameter) {
                    *slot = value;
                }
            }
            if let Ok(GlobalLimit::Slot(limit)) = GlobalLimit::build(configured.kind(), &values) {
                corners.push(limit);
            }
        }
        corners
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn whole_numbers_of_doubles() {
        assert_eq!(whole_number(600.0), Some(600));
        assert_eq!(whole_number(2.9), Some(2));
        assert_eq!(whole_number(-1.0), None);
        assert_eq!(whole_number(f64::NAN), None);
        assert_eq!(whole_number(f64::INFINITY), None);
        assert_eq!(whole_number(1e30), Some(u64::MAX));
    }
}
