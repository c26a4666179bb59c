//! A rule's limit read from the request: each tenant's own contract, from a fact that
//! something Envoy trusts wrote (a JWT claim `jwt_authn` verified, metadata an
//! `ext_authz` server returned, a header only an earlier filter sets).
//!
//! A value is a whole number: decimal text (a header, a string claim), or, from an
//! attribute, a number: the 8 bytes of the double Envoy hands over for a JSON number in
//! dynamic metadata, or decimal text with a fraction (as an access log prints one, so a
//! replay reads the same); its whole part counts. Absent or empty, the parameter's
//! `default`; present but not a number, the `default` too, and the request says so
//! (counted as `limit_invalid`); outside `min..=max`, clamped.

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
    pub(super) fn value<S: FactSource>(&self, facts: &mut Facts<'_, S>) -> Option<u64> {
        // Absent or empty, as a key part's source: the default, not an invalid value.
        let Some(bytes) = facts.get(self.fact).filter(|bytes| !bytes.is_empty()) else {
            return Some(self.default);
        };
        let value = match parse_decimal(bytes) {
            Some(value) => value,
            None if self.attribute => attribute_number(bytes)?,
            None => return None,
        };
        Some(value.clamp(self.min, self.max))
    }
}

/// A number from an attribute that is not a whole decimal: its whole part, from decimal
/// text with a fraction (`4.5`, as an access log prints a metadata number, so that a
/// replay reads what Envoy handed over), else from the 8 bytes of a double (what Envoy
/// hands the filter for a JSON number in metadata).
fn attribute_number(bytes: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(bytes)
        .ok()
        .map(str::trim)
        .filter(|t| !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit() || b == b'.'));
    if let Some(text) = text {
        return whole_number(text.parse().ok()?);
    }
    let encoded: [u8; 8] = bytes.try_into().ok()?;
    whole_number(f64::from_le_bytes(encoded))
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
    /// The limit's parameters hashed: what sets apart the units a worker or an Envoy keeps
    /// for the key under this limit (see the engine's `Applied::units_hash`).
    pub fingerprint: u64,
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
            Scope::Local(limit) => limit.algorithm(),
            Scope::Global(global) => global.limit.algorithm(),
            Scope::Concurrency(_) => return None,
        };
        let mut values = configured.parameters();
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
        let kind = configured.spec().kind;
        let (limit, values) = match GlobalLimit::build(kind, &values) {
            Ok(limit) => (limit, values),
            Err(_) => {
                invalid = true;
                let values = configured.parameters();
                (GlobalLimit::build(kind, &values).ok()?, values)
            }
        };
        Some(RequestLimit {
            limit,
            invalid,
            fingerprint: fingerprint(&values),
        })
    }
}

/// A limit's parameters hashed (FNV-1a over their bytes): once per request, to tell the
/// limits a key's requests carry apart where units are kept per key and limit.
fn fingerprint(values: &[u64]) -> u64 {
    values
        .iter()
        .flat_map(|value| value.to_le_bytes())
        .fold(0xcbf2_9ce4_8422_2325, |hash: u64, byte| {
            (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
        })
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
    fn numbers_of_attributes() {
        assert_eq!(attribute_number(b"4.5"), Some(4));
        assert_eq!(attribute_number(b" 7.0 "), Some(7));
        assert_eq!(attribute_number(&6.9f64.to_le_bytes()), Some(6));
        assert_eq!(attribute_number(b"1e3"), None);
        assert_eq!(attribute_number(b"-2.5"), None);
        assert_eq!(attribute_number(b"."), None);
        assert_eq!(attribute_number(b"lots"), None);
    }

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
