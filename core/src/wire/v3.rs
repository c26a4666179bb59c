//! `POST /v3/commit`: settling, in Redis, the costs a global rule with `commit` reserved
//! as estimates, once the responses said what the requests really cost.
//!
//! ```json
//! {"domain":"weir","items":[{"rule":"tokens","descriptor":["=acme"],
//!   "limit":{"algorithm":"token_bucket","capacity":10000,"refill":10000,"period_us":3600000000},
//!   "counted_at_us":1700000000000000,"reserved":500,"actual":120}]}
//! ```
//!
//! Each item is one request's reservation: `reserved` units counted at `counted_at_us`
//! (Redis's clock when `/v2/acquire` granted them, its `now_us`) really cost `actual`.
//! The bridge settles every item on its own, as [`crate::algorithms::SlotAlgorithm::settle`]
//! does: a refund only while it is exact (the same window, no refill since), an excess
//! charged now. It answers whether each key's state changed:
//!
//! ```json
//! {"items":[{"settled":true}]}
//! ```
//!
//! A commit that never comes leaves the estimate counted: the reservation ends with the
//! window or the refill period it was counted in, never later. Acquiring stays on
//! [`super::v2`]: a filter that never commits needs nothing new, and a bridge that
//! predates this path answers it 404 (the filter counts a failed commit).

use super::{
    check_envelope, check_item, parse_body, status_error, Checked, CheckedItem, ReplyError,
    WireLimit,
};
use crate::bounds::MAX_WANT;
use crate::field_error::strip_position;
use crate::field_error::FieldError;
use serde::{Deserialize, Serialize};

pub const COMMIT_PATH: &str = "/v3/commit";

/// Instants Lua computes with exactly: below 2^53 µs (year 2255).
pub const MAX_INSTANT_US: u64 = (1 << 53) - 1;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CommitRequest {
    pub domain: String,
    pub items: Vec<CommitItem>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CommitItem {
    pub rule: String,
    pub descriptor: Vec<String>,
    pub limit: WireLimit,
    /// Redis's clock when the units were counted, µs since the epoch.
    pub counted_at_us: u64,
    /// Units counted then (the request's estimate).
    pub reserved: u64,
    /// What the request really cost.
    pub actual: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CommitReply {
    pub items: Vec<Committed>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Committed {
    /// Whether the key's state changed (a refund no longer exact, or a key gone, does
    /// not change it).
    pub settled: bool,
}

impl CommitRequest {
    /// Parses and checks a request body; every error names the field.
    pub fn parse(body: &[u8]) -> Result<Checked<CommitItem>, FieldError> {
        parse_body::<CommitRequest>(body)?.check()
    }

    /// Checks sizes and parameters, and that each algorithm can settle; keeps each item
    /// with its compiled limit.
    pub fn check(self) -> Result<Checked<CommitItem>, FieldError> {
        check_envelope(&self.domain, self.items.len())?;
        let mut items: Vec<CheckedItem<CommitItem>> = Vec::with_capacity(self.items.len());
        for (i, item) in self.items.into_iter().enumerate() {
            let at = format!("items[{i}]");
            let limit = check_item(
                &at,
                &item.rule,
                &item.descriptor,
                &item.limit,
                item.reserved,
                item.reserved,
            )
            .map_err(|e| {
                // `cost` is called `reserved` here.
                if e.path.ends_with(".cost") {
                    FieldError::new(format!("{at}.reserved"), e.message)
                } else {
                    e
                }
            })?;
            if limit.kind().spec().settle_script.is_none() {
                return Err(FieldError::new(
                    format!("{at}.limit.algorithm"),
                    format!(
                        "{} cannot settle a cost after the response (fixed_window and \
                         token_bucket can)",
                        limit.kind()
                    ),
                ));
            }
            if item.actual > MAX_WANT {
                return Err(FieldError::new(
                    format!("{at}.actual"),
                    format!("{} is above the most allowed, {MAX_WANT}", item.actual),
                ));
            }
            if item.counted_at_us > MAX_INSTANT_US {
                return Err(FieldError::new(
                    format!("{at}.counted_at_us"),
                    format!(
                        "{} is after the last instant Lua counts exactly",
                        item.counted_at_us
                    ),
                ));
            }
            items.push(CheckedItem { item, limit });
        }
        Ok(Checked {
            domain: self.domain,
            items,
        })
    }
}

/// The bridge's answer to a commit call of `items` items: its status (0: no response)
/// and body, checked to hold one result per item.
pub fn decode_reply(status: u16, body: &[u8], items: usize) -> Result<CommitReply, ReplyError> {
    if status != 200 {
        return Err(status_error(status, body));
    }
    let reply: CommitReply =
        serde_json::from_slice(body).map_err(|e| ReplyError::BadBody(strip_position(&e)))?;
    if reply.items.len() != items {
        return Err(ReplyError::BadBody(format!(
            "{} results for {items} items",
            reply.items.len()
        )));
    }
    Ok(reply)
}

#[cfg(test)]
mod tests {
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    use super::*;
    use crate::algorithms::AlgorithmKind;

    fn item(kind: AlgorithmKind, values: &[u64]) -> CommitItem {
        CommitItem {
            rule: "tokens".into(),
            descriptor: vec!["=acme".into()],
            limit: WireLimit {
                kind,
                values: values.to_vec(),
            },
            counted_at_us: 1_700_000_000_000_000,
            reserved: 500,
            actual: 120,
        }
    }

    fn body(items: Vec<CommitItem>) -> Vec<u8> {
        serde_json::to_vec(&CommitRequest {
            domain: "weir".into(),
            items,
        })
        .unwrap()
    }

    #[test]
    fn a_commit_round_trips_and_is_validated_field_by_field() {
        let good = item(AlgorithmKind::TokenBucket, &[10_000, 10_000, 3_600_000_000]);
        let parsed = CommitRequest::parse(&body(vec![good.clone()])).unwrap();
        assert_eq!(parsed.domain, "weir");
        assert_eq!(parsed.items[0].item, good);
        assert_eq!(parsed.items[0].limit.kind(), AlgorithmKind::TokenBucket);
        let text = String::from_utf8(body(vec![good.clone()])).unwrap();
        assert!(text.contains(r#""period_us":3600000000"#), "{text}");

        let gcra = item(AlgorithmKind::Gcra, &[100, 1_000_000, 500]);
        assert_eq!(
            CommitRequest::parse(&body(vec![gcra]))
                .unwrap_err()
                .to_string(),
            "items[0].limit.algorithm: gcra cannot settle a cost after the response \
             (fixed_window and token_bucket can)"
        );
        let mut too_much = good.clone();
        too_much.actual = MAX_WANT + 1;
        assert_eq!(
            CommitRequest::parse(&body(vec![too_much]))
                .unwrap_err()
                .to_string(),
            "items[0].actual: 1000001 is above the most allowed, 1000000"
        );
        let mut zero = good.clone();
        zero.reserved = 0;
        assert!(CommitRequest::parse(&body(vec![zero]))
            .unwrap_err()
            .to_string()
            .starts_with("items[0].reserved: 0 is out of range"));
        let mut late = good;
        late.counted_at_us = u64::MAX;
        assert!(CommitRequest::parse(&body(vec![late]))
            .unwrap_err()
            .to_string()
            .starts_with("items[0].counted_at_us:"));
        assert!(CommitRequest::parse(br#"{"domain":"weir","items":[],"x":1}"#).is_err());
    }
}
