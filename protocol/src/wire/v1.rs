//! The wire format of filters before v2: `POST /v1/acquire`, still served by the bridge
//! for them (docs/compatibility.md).
//!
//! ```json
//! {"domain":"weir","items":[{"rule":"per-tenant","descriptor":["=acme"],
//!   "limit":{"algorithm":"gcra","rate":100,"period_us":1000000,"burst":99},
//!   "cost":1,"want":16}]}
//! ```
//!
//! The bridge answers, in order, for the items it evaluated; it stops after the first
//! denial (the items after it are not charged):
//!
//! ```json
//! {"now_us":1700000000000000,"items":[{"allowed":true,"granted":16,"limit":100,
//!   "remaining":84,"retry_after_ns":null,"reset_after_ns":160000000,"lease_ttl_ns":null}]}
//! ```
//!
//! `want > cost` asks for a lease: Redis consumes `granted` (between `cost` and `want`)
//! units at once and the filter spends the rest locally. `lease_ttl_ns`, when set, is how
//! long those units stay valid (window algorithms: until the window ends; the sliding log:
//! one window). v1 filters count a lease from its grant with no other bound, which can
//! exceed a GCRA or token-bucket bound in a short interval (docs/global.md): v2 fixes
//! that.

use super::{check_envelope, check_item, parse_body, Checked, CheckedItem, WireLimit};
use crate::field_error::FieldError;
use serde::{Deserialize, Serialize};

pub const ACQUIRE_PATH: &str = "/v1/acquire";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AcquireRequest {
    pub domain: String,
    pub items: Vec<AcquireItem>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AcquireItem {
    pub rule: String,
    pub descriptor: Vec<String>,
    pub limit: WireLimit,
    pub cost: u64,
    pub want: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AcquireResponse {
    /// The Redis time the decisions were made at (µs since the epoch).
    pub now_us: u64,
    pub items: Vec<ItemResult>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ItemResult {
    pub allowed: bool,
    /// Units consumed in Redis for this request and its lease (0 when denied).
    pub granted: u64,
    pub limit: u64,
    pub remaining: u64,
    pub retry_after_ns: Option<u64>,
    pub reset_after_ns: u64,
    pub lease_ttl_ns: Option<u64>,
}

impl AcquireRequest {
    /// Parses and checks a request body; every error names the field.
    pub fn parse(body: &[u8]) -> Result<Checked<AcquireItem>, FieldError> {
        parse_body::<AcquireRequest>(body)?.check()
    }

    /// Checks sizes and parameters (including what Lua cannot compute exactly); keeps
    /// each item with its compiled limit.
    pub fn check(self) -> Result<Checked<AcquireItem>, FieldError> {
        check_envelope(&self.domain, self.items.len())?;
        let items = self
            .items
            .into_iter()
            .enumerate()
            .map(|(i, item)| {
                let limit = check_item(
                    &format!("items[{i}]"),
                    &item.rule,
                    &item.descriptor,
                    &item.limit,
                    item.cost,
                    item.want,
                )?;
                Ok(CheckedItem { item, limit })
            })
            .collect::<Result<_, FieldError>>()?;
        Ok(Checked {
            domain: self.domain,
            items,
        })
    }
}

#[cfg(test)]
mod tests {
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    use super::*;

    #[test]
    fn requests_are_validated_with_paths() {
        let ok = br#"{"domain":"weir","items":[{"rule":"r","descriptor":["=a"],
            "limit":{"algorithm":"fixed_window","limit":10,"window_us":1000000},"cost":1,"want":5}]}"#;
        assert!(AcquireRequest::parse(ok).is_ok());
        let bad = |items: &str| {
            let body = format!(r#"{{"domain":"weir","items":[{items}]}}"#);
            AcquireRequest::parse(body.as_bytes())
                .unwrap_err()
                .to_string()
        };
        let fw = r#""limit":{"algorithm":"fixed_window","limit":10,"window_us":1}"#;
        assert_eq!(
            bad(&format!(
                r#"{{"rule":"r","descriptor":["a"],{fw},"cost":1,"want":1}}"#
            )),
            "items[0].descriptor[0]: must start with one of = ! ~ # and be at most 257 bytes"
        );
        assert_eq!(
            bad(r#"{"rule":"r","descriptor":[],"limit":{"algorithm":"leaky","limit":10},"cost":1,"want":1}"#),
            "items[0].limit.algorithm: unknown variant `leaky`, expected one of `token_bucket`, `gcra`, `fixed_window`, `sliding_window`, `sliding_log`"
        );
        assert_eq!(
            bad(
                r#"{"rule":"r","descriptor":[],"limit":{"algorithm":"gcra","burst":0,"rate":0,"period_us":1},"cost":1,"want":1}"#
            ),
            "items[0].limit.rate: must be at least 1"
        );
        assert_eq!(
            bad(
                r#"{"rule":"r","descriptor":[],"limit":{"algorithm":"gcra","rate":1,"period_us":1},"cost":1,"want":1}"#
            ),
            "items[0].limit: missing field `burst` of gcra"
        );
        assert_eq!(
            bad(
                r#"{"rule":"r","descriptor":[],"limit":{"algorithm":"gcra","rate":1,"period_us":1,"burst":0,"window_us":5},"cost":1,"want":1}"#
            ),
            "items[0].limit: `window_us` is not a parameter of gcra"
        );
        assert_eq!(
            bad(&format!(
                r#"{{"rule":"r","descriptor":[],{fw},"cost":11,"want":11}}"#
            )),
            "items[0].cost: 11 is out of range: expected 1 to what the limit can ever admit (10)"
        );
        assert_eq!(
            bad(&format!(
                r#"{{"rule":"r","descriptor":[],{fw},"cost":0,"want":1}}"#
            )),
            "items[0].cost: 0 is out of range: expected 1 to what the limit can ever admit (10)"
        );
        // What Lua cannot compute exactly is refused here, so the config checker can too.
        assert_eq!(
            bad(
                r#"{"rule":"r","descriptor":[],"limit":{"algorithm":"fixed_window","limit":281474976710657,"window_us":1},"cost":1,"want":1}"#
            ),
            "items[0].limit.limit: must be at most 2^48 for exact arithmetic in Redis"
        );
        assert_eq!(
            AcquireRequest::parse(br#"{"domain":"weir"}"#)
                .unwrap_err()
                .to_string(),
            "missing field `items`"
        );
        assert_eq!(
            AcquireRequest::parse(br#"{"domain":"we ir","items":[]}"#)
                .unwrap_err()
                .to_string(),
            "domain: invalid domain \"we ir\": \" \" is not allowed; use A-Z, a-z, 0-9, \"_\" and \"-\""
        );
    }
}
