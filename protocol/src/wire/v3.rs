//! `POST /v3/commit`: settling, in Redis, the costs a global rule with `commit` reserved
//! as estimates, once the responses said what the requests really cost.
//!
//! ```json
//! {"domain":"weir","items":[{"id":0,"rule":"tokens","descriptor":["=acme"],
//!   "limit":{"algorithm":"token_bucket","capacity":10000,"refill":10000,"period_us":3600000000},
//!   "counted_at_us":1700000000000000,"reserved":500,"actual":120}]}
//! ```
//!
//! Each item is one request's reservation: `reserved` units counted at `counted_at_us`
//! (Redis's clock when `/v2/acquire` granted them, its `now_us`) really cost `actual`.
//! The bridge settles every item on its own, as [`crate::algorithms::SlotAlgorithm::settle`]
//! does: a refund only while it is exact (the same window, no refill since), an excess
//! charged now. It answers whether each key's state changed, one result per item with the
//! item's `id` (unique within the request):
//!
//! ```json
//! {"items":[{"id":0,"settled":true}]}
//! ```
//!
//! The filter matches results to its commits by id, never by position ([`decode_reply`]):
//! a result in another order is fine, a result with an id it did not send, an id answered
//! twice or an item left unanswered makes the whole reply bad (the call failed, every
//! estimate stands).
//!
//! A commit that never comes leaves the estimate counted: the reservation ends with the
//! window or the refill period it was counted in, never later. Acquiring stays on
//! [`super::v2`]: a filter that never commits needs nothing new, and a bridge that
//! predates this path answers it 404 (the filter counts a failed commit).

use super::{
    check_envelope, check_id, check_item, parse_body, status_error, Checked, CheckedItem,
    ReplyError, WireLimit,
};
use crate::algorithms::AlgorithmKind;
use crate::bounds::{MAX_BODY_BYTES, MAX_WANT};
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
    /// Echoed in the reply; unique within the request.
    pub id: u16,
    pub rule: String,
    pub descriptor: Vec<String>,
    pub limit: WireLimit,
    /// Redis's clock when the units were counted, µs since the epoch.
    pub counted_at_us: u64,
    /// Units counted then (the request's estimate).
    pub reserved: u64,
    /// What the request really cost.
    pub actual: u64,
    /// A shared limit's commit: the key within the descriptor's parent it was counted
    /// for (its descriptor parts; none: the request named no key), settled in the
    /// parent's shares. Absent for every other rule, as before shares.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub share_key: Option<Vec<String>>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CommitReply {
    pub items: Vec<Committed>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Committed {
    /// The id of the item this answers.
    pub id: u16,
    /// Whether the key's state changed (a refund no longer exact, or a key gone, does
    /// not change it).
    pub settled: bool,
}

impl CommitRequest {
    /// Parses and checks a request body; every error names the field.
    pub fn parse(body: &[u8]) -> Result<Checked<CommitItem>, FieldError> {
        parse_body::<CommitRequest>(body)?.check()
    }

    /// Checks sizes, ids and parameters, and that each algorithm can settle; keeps each
    /// item with its compiled limit.
    pub fn check(self) -> Result<Checked<CommitItem>, FieldError> {
        check_envelope(&self.domain, self.items.len())?;
        let mut items: Vec<CheckedItem<CommitItem>> = Vec::with_capacity(self.items.len());
        for (i, item) in self.items.into_iter().enumerate() {
            let at = format!("items[{i}]");
            check_id(&at, item.id, &items, |other| other.id)?;
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
                        "{} cannot settle a cost after the response ({} can)",
                        limit.kind(),
                        settling_names()
                    ),
                ));
            }
            if let Some(key) = &item.share_key {
                super::check_parts(&format!("{at}.share_key"), key, 0)?;
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

/// The bridge's answer to a commit call that carried `sent` (status 0: no response),
/// each commit paired with its result by id (`id` says a commit's id): in the order of
/// `sent`, whatever the order of the results. Every id sent must be answered exactly once
/// and no other id; anything else is a bad reply, for the whole call.
pub fn decode_reply<'a, T>(
    status: u16,
    body: &[u8],
    sent: &'a [T],
    id: impl Fn(&T) -> u16,
) -> Result<Vec<(&'a T, Committed)>, ReplyError> {
    if status != 200 {
        return Err(status_error(status, body));
    }
    if body.len() > MAX_BODY_BYTES {
        return Err(ReplyError::BadBody(format!("{} bytes", body.len())));
    }
    let reply: CommitReply =
        serde_json::from_slice(body).map_err(|e| ReplyError::BadBody(strip_position(&e)))?;
    let mut answers: Vec<(&T, Option<Committed>)> = sent.iter().map(|item| (item, None)).collect();
    for result in reply.items {
        let Some((_, answer)) = answers.iter_mut().find(|(item, _)| id(item) == result.id) else {
            return Err(ReplyError::BadBody(format!(
                "a result for id {}, which was not sent",
                result.id
            )));
        };
        if answer.replace(result).is_some() {
            return Err(ReplyError::BadBody(format!(
                "two results for id {}",
                result.id
            )));
        }
    }
    answers
        .into_iter()
        .map(|(item, answer)| {
            answer
                .map(|result| (item, result))
                .ok_or_else(|| ReplyError::BadBody(format!("no result for id {}", id(item))))
        })
        .collect()
}

/// The algorithms that settle costs, as a message lists them: `a, b and c`.
fn settling_names() -> String {
    let names = AlgorithmKind::names_where(|spec| spec.settle_script.is_some());
    match names.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} and {last}", rest.join(", ")),
        _ => names.join(""),
    }
}

#[cfg(test)]
mod tests {
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    use super::*;
    use crate::algorithms::AlgorithmKind;

    fn item(kind: AlgorithmKind, values: &[u64]) -> CommitItem {
        CommitItem {
            id: 0,
            rule: "tokens".into(),
            descriptor: vec!["=acme".into()],
            limit: WireLimit {
                kind,
                values: values.to_vec(),
            },
            counted_at_us: 1_700_000_000_000_000,
            reserved: 500,
            actual: 120,
            share_key: None,
        }
    }

    fn bucket(id: u16, actual: u64) -> CommitItem {
        CommitItem {
            id,
            actual,
            ..item(AlgorithmKind::TokenBucket, &[10_000, 10_000, 3_600_000_000])
        }
    }

    fn body(items: Vec<CommitItem>) -> Vec<u8> {
        serde_json::to_vec(&CommitRequest {
            domain: "weir".into(),
            items,
        })
        .unwrap()
    }

    fn reply(results: &[(u16, bool)]) -> Vec<u8> {
        let items = results
            .iter()
            .map(|&(id, settled)| Committed { id, settled })
            .collect();
        serde_json::to_vec(&CommitReply { items }).unwrap()
    }

    /// What the filter does with a reply: each commit's `actual` with its result.
    fn decode(
        status: u16,
        body: &[u8],
        sent: &[CommitItem],
    ) -> Result<Vec<(u64, bool)>, ReplyError> {
        decode_reply(status, body, sent, |c| c.id)
            .map(|pairs| pairs.iter().map(|(c, r)| (c.actual, r.settled)).collect())
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

    #[test]
    fn ids_round_trip_and_are_unique_within_a_request() {
        let items = vec![bucket(7, 1), bucket(3, 2)];
        let text = String::from_utf8(body(items.clone())).unwrap();
        assert!(
            text.starts_with(r#"{"domain":"weir","items":[{"id":7,"rule":"tokens""#),
            "{text}"
        );
        let parsed = CommitRequest::parse(text.as_bytes()).unwrap();
        let ids: Vec<u16> = parsed.items.iter().map(|c| c.item.id).collect();
        assert_eq!(ids, [7, 3]);
        assert_eq!(
            CommitRequest::parse(&body(vec![bucket(4, 1), bucket(5, 1), bucket(4, 2)]))
                .unwrap_err()
                .to_string(),
            "items[2].id: 4 is also the id of items[0]"
        );
        // A body of the v3 before ids (never released): refused, not answered by position.
        let without_id = text.replacen(r#""id":7,"#, "", 1);
        assert_eq!(
            CommitRequest::parse(without_id.as_bytes())
                .unwrap_err()
                .to_string(),
            "items[0]: missing field `id`"
        );
        // The bridge echoes them: what it writes is what the filter reads.
        let answer = reply(&[(3, false), (7, true)]);
        assert_eq!(
            String::from_utf8(answer.clone()).unwrap(),
            r#"{"items":[{"id":3,"settled":false},{"id":7,"settled":true}]}"#
        );
        assert_eq!(
            decode(200, &answer, &items),
            Ok(vec![(1, true), (2, false)])
        );
    }

    /// Regression: results are paired with commits by id. Paired by position (the filter
    /// before ids zipped commits with results), the first commit would take the third
    /// commit's `settled: true` and the third the first's `false`.
    #[test]
    fn results_in_another_order_are_matched_to_their_commits() {
        let sent = [bucket(0, 10), bucket(1, 20), bucket(2, 30)];
        let answer = reply(&[(2, true), (0, false), (1, true)]);
        assert_eq!(
            decode(200, &answer, &sent),
            Ok(vec![(10, false), (20, true), (30, true)])
        );
        let answer = reply(&[(1, false), (2, false), (0, true)]);
        assert_eq!(
            decode(200, &answer, &sent),
            Ok(vec![(10, true), (20, false), (30, false)])
        );
    }

    #[test]
    fn a_result_with_an_unknown_duplicated_or_missing_id_is_a_bad_reply() {
        let sent = [bucket(0, 10), bucket(1, 20)];
        let bad = |body: &[u8]| match decode(200, body, &sent) {
            Err(ReplyError::BadBody(why)) => why,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            bad(&reply(&[(0, true), (5, true)])),
            "a result for id 5, which was not sent"
        );
        assert_eq!(
            bad(&reply(&[(1, true), (1, false)])),
            "two results for id 1"
        );
        assert_eq!(
            bad(&reply(&[(0, true), (1, true), (0, true)])),
            "two results for id 0"
        );
        assert_eq!(bad(&reply(&[(1, true)])), "no result for id 0");
        assert_eq!(bad(&reply(&[])), "no result for id 0");
        assert_eq!(
            bad(br#"{"items":[{"id":0,"settled":true},{"settled":true}]}"#),
            "missing field `id`"
        );
        assert_eq!(
            bad(br#"{"items":[{"id":0,"settled":true},{"id":1,"settled":true,"x":1}]}"#),
            "unknown field `x`, expected `id` or `settled`"
        );
        assert!(bad(b"not json").starts_with("expected"));
        assert_eq!(
            decode(0, b"", &sent),
            Err(ReplyError::NoResponse),
            "no response at all"
        );
        assert_eq!(decode(503, b"", &sent), Err(ReplyError::Unreachable));
        assert!(matches!(
            decode(404, b"", &sent),
            Err(ReplyError::Status(404, _))
        ));
    }
}
