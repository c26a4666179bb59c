//! The wire format the filter speaks: `POST /v2/acquire`.
//!
//! ```json
//! {"domain":"weir","items":[{"id":2,"rule":"per-tenant","descriptor":["=acme"],
//!   "limit":{"algorithm":"gcra","rate":100,"period_us":1000000,"burst":74},
//!   "cost":1,"want":8,"reserve":12,"hold_us":250000,"horizon_us":100000,"shadow":false}]}
//! ```
//!
//! Every item is a global rule of one request that needs Redis, with the id the reply
//! echoes (the rule's position in the config). The bridge decides the items in order and
//! stops after the first denied item that is not `shadow` (the items after it are not
//! charged); a shadow item's denial does not stop it, since the filter will let the
//! request through. For each decided item it answers:
//!
//! ```json
//! {"items":[{"id":2,"allowed":true,"granted":8,"limit":75,"remaining":67,
//!   "retry_after_ns":null,"reset_after_ns":106666666,"now_us":1700000000000000,
//!   "due_ns":0,"spacing_ns":0,"valid_ns":250000000}]}
//! ```
//!
//! What an item asks is a [`crate::algorithms::Ask`]: `cost` units now, up to `want`
//! when they are free (a lease), else up to `reserve` units of the key's future schedule
//! due within `horizon_us` (GCRA); every unit may be spent up to the lease's ttl (`hold_us`) after it is
//! due. What it gets is a [`crate::algorithms::Grant`]: `granted` units consumed in Redis
//! (the request's own included when `allowed`), unit `i` due at `due_ns + i × spacing_ns`
//! after `now_us` (Redis's clock when it decided), each spendable for `valid_ns` after
//! its due time. `limit` and `remaining` are those of the limit Redis enforces, which for
//! a GCRA rule with leases has the burst the hold costs taken off.

use super::{
    check_envelope, check_id, check_item, check_parts, parse_body, status_error, Checked,
    CheckedItem, ReplyError, WireLimit,
};
use crate::algorithms::{Ask, Decision, GlobalLimit, Grant};
use crate::bounds::{MAX_BODY_BYTES, MAX_LEASE_HORIZON_US, MAX_LEASE_TTL_US, MAX_WANT};
use crate::field_error::{strip_position, FieldError};
use crate::share::{MAX_GLOBAL_SHARE_LIMIT, MAX_SHARE_KEYS, MAX_WEIGHT};
use serde::{Deserialize, Serialize};

pub const ACQUIRE_PATH: &str = "/v2/acquire";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Request {
    pub domain: String,
    pub items: Vec<Item>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Item {
    /// Echoed in the reply; unique within the request.
    pub id: u16,
    pub rule: String,
    pub descriptor: Vec<String>,
    pub limit: WireLimit,
    pub cost: u64,
    pub want: u64,
    #[serde(default)]
    pub reserve: u64,
    /// The lease's ttl, µs (`hold_us` on the wire since v2).
    #[serde(default, rename = "hold_us")]
    pub ttl_us: u64,
    #[serde(default)]
    pub horizon_us: u64,
    /// A shadow rule's item: its denial does not stop the evaluation.
    #[serde(default)]
    pub shadow: bool,
    /// A shared limit's item (`share`): the key within the descriptor's parent, its
    /// weight and how many keys the parent tracks. Absent for every other rule, so an
    /// item without it is what filters before shares sent; a bridge before shares
    /// refuses one with it (400, an unknown field).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub share: Option<WireShare>,
    /// A `gcra` rule whose limit each request gives (`rate` or `burst` from a fact): its
    /// key's state keeps the emission interval it was counted in, so that a request
    /// carrying another rate reads what the key owes in its own (see
    /// `Gcra::tat_in_own_interval`). Absent (false) for every other rule, so an item
    /// without it is what filters before it sent; a bridge before it refuses one with it
    /// (400, an unknown field).
    #[serde(default, skip_serializing_if = "is_false")]
    pub limit_from_request: bool,
}

fn is_false(value: &bool) -> bool {
    !*value
}

/// What a shared limit's item adds: `{"key":["=alice"],"weight":1,"max_keys":100}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WireShare {
    /// The key within the parent, as descriptor parts (`share.by`).
    pub key: Vec<String>,
    pub weight: u64,
    pub max_keys: u32,
}

impl Item {
    pub fn ask(&self) -> Ask {
        Ask {
            cost: self.cost,
            want: self.want,
            reserve: self.reserve,
            ttl_us: self.ttl_us,
            horizon_us: self.horizon_us,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Reply {
    pub items: Vec<Granted>,
}

/// One item's result: a [`Grant`] with the item's id and Redis's clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Granted {
    pub id: u16,
    pub allowed: bool,
    pub granted: u64,
    pub limit: u64,
    pub remaining: u64,
    pub retry_after_ns: Option<u64>,
    pub reset_after_ns: u64,
    /// Redis's clock when it decided this item, µs since the epoch.
    pub now_us: u64,
    pub due_ns: i64,
    pub spacing_ns: u64,
    pub valid_ns: u64,
}

impl Granted {
    pub fn new(id: u16, grant: &Grant, now_us: u64) -> Granted {
        let d = grant.decision;
        Granted {
            id,
            allowed: d.allowed,
            granted: grant.granted,
            limit: d.limit,
            remaining: d.remaining,
            retry_after_ns: d.retry_after_ns,
            reset_after_ns: d.reset_after_ns,
            now_us,
            due_ns: grant.due_ns,
            spacing_ns: grant.spacing_ns,
            valid_ns: grant.valid_ns,
        }
    }

    pub fn decision(&self) -> Decision {
        Decision {
            allowed: self.allowed,
            limit: self.limit,
            remaining: self.remaining,
            retry_after_ns: self.retry_after_ns,
            reset_after_ns: self.reset_after_ns,
        }
    }

    pub fn grant(&self) -> Grant {
        Grant {
            decision: self.decision(),
            granted: self.granted,
            due_ns: self.due_ns,
            spacing_ns: self.spacing_ns,
            valid_ns: self.valid_ns,
        }
    }
}

impl Request {
    /// Parses and checks a request body; every error names the field.
    pub fn parse(body: &[u8]) -> Result<Checked<Item>, FieldError> {
        parse_body::<Request>(body)?.check()
    }

    /// Checks sizes, ids and parameters (including what Lua cannot compute exactly);
    /// keeps each item with its compiled limit.
    pub fn check(self) -> Result<Checked<Item>, FieldError> {
        check_envelope(&self.domain, self.items.len())?;
        let mut items: Vec<CheckedItem<Item>> = Vec::with_capacity(self.items.len());
        for (i, item) in self.items.into_iter().enumerate() {
            let at = format!("items[{i}]");
            check_id(&at, item.id, &items, |other| other.id)?;
            let limit = check_item(
                &at,
                &item.rule,
                &item.descriptor,
                &item.limit,
                item.cost,
                item.want,
            )?;
            let bounded = |field: &str, value: u64, max: u64| {
                if value > max {
                    Err(FieldError::new(
                        format!("{at}.{field}"),
                        format!("{value} is above the most allowed, {max}"),
                    ))
                } else {
                    Ok(())
                }
            };
            bounded("reserve", item.reserve, MAX_WANT)?;
            bounded("hold_us", item.ttl_us, MAX_LEASE_TTL_US)?;
            bounded("horizon_us", item.horizon_us, MAX_LEASE_HORIZON_US)?;
            if let Some(share) = &item.share {
                check_share(&at, share, &limit, &item)?;
            }
            items.push(CheckedItem { item, limit });
        }
        Ok(Checked {
            domain: self.domain,
            items,
        })
    }
}

/// A shared limit's item: its key as a descriptor's parts, its weight and key count in
/// range, a limit that comes back whole each window and that Lua counts exactly, and no
/// schedule reserved (a lease's `want` is taken from the key's own entitlement).
fn check_share(
    at: &str,
    share: &WireShare,
    limit: &GlobalLimit,
    item: &Item,
) -> Result<(), FieldError> {
    let at = format!("{at}.share");
    // No part: the request names no key within the parent (entitled to nothing).
    check_parts(&format!("{at}.key"), &share.key, 0)?;
    let out_of_range = |field: &str, value: u64, max: u64| {
        FieldError::new(
            format!("{at}.{field}"),
            format!("{value} is out of range: expected 1 to {max}"),
        )
    };
    if !(1..=MAX_WEIGHT).contains(&share.weight) {
        return Err(out_of_range("weight", share.weight, MAX_WEIGHT));
    }
    if !(1..=MAX_SHARE_KEYS).contains(&share.max_keys) {
        let max_keys = u64::from(share.max_keys);
        return Err(out_of_range(
            "max_keys",
            max_keys,
            u64::from(MAX_SHARE_KEYS),
        ));
    }
    if !limit.kind().spec().resets_each_window {
        return Err(FieldError::new(
            format!("{}.limit", at.trim_end_matches(".share")),
            format!(
                "a shared limit needs a limit that comes back whole each window, not {}",
                limit.kind()
            ),
        ));
    }
    let quota = limit.policy().quota;
    if quota > MAX_GLOBAL_SHARE_LIMIT {
        return Err(FieldError::new(
            format!("{}.limit", at.trim_end_matches(".share")),
            format!("a shared limit of {quota} is above {MAX_GLOBAL_SHARE_LIMIT}, the most Lua counts exactly"),
        ));
    }
    if item.reserve != 0 {
        return Err(FieldError::new(
            at,
            "a shared limit's item reserves no schedule (reserve 0)",
        ));
    }
    Ok(())
}

/// What the filter sent for one item, to check a reply against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sent {
    pub id: u16,
    pub shadow: bool,
}

/// Decodes the bridge's answer to a request whose items were `sent`, in order: a status
/// of 0 is a call that got no response at all. The results must answer the items in
/// order, each by its id, up to the last item or the first denied item that is not
/// shadow, and no further.
pub fn decode_reply(status: u16, body: &[u8], sent: &[Sent]) -> Result<Reply, ReplyError> {
    if status != 200 {
        return Err(status_error(status, body));
    }
    if body.len() > MAX_BODY_BYTES {
        return Err(ReplyError::BadBody(format!("{} bytes", body.len())));
    }
    let reply: Reply =
        serde_json::from_slice(body).map_err(|e| ReplyError::BadBody(strip_position(&e)))?;
    if reply.items.is_empty() || reply.items.len() > sent.len() {
        return Err(ReplyError::BadBody(format!(
            "{} results for {} items",
            reply.items.len(),
            sent.len()
        )));
    }
    for (i, (result, item)) in reply.items.iter().zip(sent).enumerate() {
        if result.id != item.id {
            return Err(ReplyError::BadBody(format!(
                "result {i} answers id {}, the item sent there has id {}",
                result.id, item.id
            )));
        }
        let stops = !result.allowed && !item.shadow;
        let last = i + 1 == reply.items.len();
        let cut_short = reply.items.len() < sent.len();
        if (stops && !last) || (last && cut_short && !stops) {
            return Err(ReplyError::BadBody(
                "results do not stop at the first denial of an enforcing item".into(),
            ));
        }
    }
    Ok(reply)
}

#[cfg(test)]
mod tests {
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    use super::*;

    fn result(id: u16, allowed: bool) -> String {
        format!(
            r#"{{"id":{id},"allowed":{allowed},"granted":{},"limit":5,"remaining":0,"retry_after_ns":null,"reset_after_ns":9,"now_us":1,"due_ns":0,"spacing_ns":0,"valid_ns":0}}"#,
            u64::from(allowed)
        )
    }

    fn reply(results: &[String]) -> Vec<u8> {
        format!(r#"{{"items":[{}]}}"#, results.join(",")).into_bytes()
    }

    #[test]
    fn replies_answer_items_by_id_up_to_the_first_enforcing_denial() {
        let enforcing = |id| Sent { id, shadow: false };
        let shadow = |id| Sent { id, shadow: true };
        let sent = [shadow(0), enforcing(3), enforcing(5)];
        // A shadow denial does not stop; the enforcing denial does.
        let body = reply(&[result(0, false), result(3, false)]);
        assert_eq!(decode_reply(200, &body, &sent).unwrap().items.len(), 2);
        let body = reply(&[result(0, false), result(3, true), result(5, true)]);
        assert!(decode_reply(200, &body, &sent).is_ok());
        // Stopping at a shadow denial is a bridge that does not know v2.
        let body = reply(&[result(0, false)]);
        assert!(matches!(
            decode_reply(200, &body, &sent),
            Err(ReplyError::BadBody(_))
        ));
        // Going on after an enforcing denial.
        let body = reply(&[result(0, true), result(3, false), result(5, true)]);
        assert!(decode_reply(200, &body, &sent).is_err());
        // Ids in another order.
        let body = reply(&[result(3, true), result(0, true), result(5, true)]);
        assert!(decode_reply(200, &body, &sent).is_err());
        // Stopping early without a denial.
        let body = reply(&[result(0, true)]);
        assert!(decode_reply(200, &body, &sent).is_err());
        assert_eq!(decode_reply(0, b"", &sent), Err(ReplyError::NoResponse));
        assert!(decode_reply(200, br#"{"items":[]}"#, &sent).is_err());
    }

    #[test]
    fn requests_check_ids_and_bounds() {
        let item = |id: u16, extra: &str| {
            format!(
                r#"{{"id":{id},"rule":"r","descriptor":[],"limit":{{"algorithm":"fixed_window","limit":10,"window_us":1000000}},"cost":1,"want":2{extra}}}"#
            )
        };
        let parse = |items: &[String]| {
            let body = format!(r#"{{"domain":"weir","items":[{}]}}"#, items.join(","));
            Request::parse(body.as_bytes())
        };
        let ok = parse(&[item(0, ""), item(7, r#","hold_us":5000,"shadow":true"#)]).unwrap();
        assert_eq!(ok.items[1].item.ask().ttl_us, 5_000);
        assert!(ok.items[1].item.shadow && !ok.items[0].item.shadow);
        assert_eq!(ok.items[1].item.id, 7);
        assert_eq!(ok.items[1].limit, ok.items[1].item.limit.compile().unwrap());
        assert_eq!(
            parse(&[item(4, ""), item(4, "")]).unwrap_err().to_string(),
            "items[1].id: 4 is also the id of items[0]"
        );
        assert_eq!(
            parse(&[item(0, r#","horizon_us":10000001"#)])
                .unwrap_err()
                .to_string(),
            "items[0].horizon_us: 10000001 is above the most allowed, 10000000"
        );
    }

    #[test]
    fn an_item_says_its_limit_comes_from_the_request_only_when_it_does() {
        let body = |extra: &str| {
            format!(
                r#"{{"domain":"weir","items":[{{"id":0,"rule":"r","descriptor":[],"limit":{{"algorithm":"gcra","rate":10,"period_us":1000000,"burst":2}},"cost":1,"want":1{extra}}}]}}"#
            )
        };
        let plain = Request::parse(body("").as_bytes()).unwrap();
        let rated = Request::parse(body(r#","limit_from_request":true"#).as_bytes()).unwrap();
        assert!(!plain.items[0].item.limit_from_request);
        assert!(rated.items[0].item.limit_from_request);
        // Serialized, an item without it is byte for byte what filters before it sent.
        let json = serde_json::to_string(&plain.items[0].item).unwrap();
        assert!(!json.contains("limit_from_request"), "{json}");
        let json = serde_json::to_string(&rated.items[0].item).unwrap();
        assert!(json.ends_with(r#","limit_from_request":true}"#), "{json}");
    }
}
