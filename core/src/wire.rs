//! The wire format between the filter and weir-bridge, version 1.
//!
//! `POST /v1/acquire` carries every global rule of one request that needs Redis:
//!
//! ```json
//! {"domain":"weir","items":[{"rule":"per-tenant","descriptor":["=acme"],
//!   "limit":{"algorithm":"gcra","rate":100,"period_us":1000000,"burst":99},
//!   "cost":1,"want":16}]}
//! ```
//!
//! and the bridge answers, in order, for the items it evaluated (it stops after the
//! first denial, like local rules: items after it are not charged):
//!
//! ```json
//! {"now_us":1700000000000000,"items":[{"allowed":true,"granted":16,"limit":100,
//!   "remaining":84,"retry_after_ns":null,"reset_after_ns":160000000,"lease_ttl_ns":null}]}
//! ```
//!
//! `want > cost` asks for a lease (`want` is never below `cost`): Redis consumes
//! `granted` (between `cost` and `want`) units at once and the filter spends the rest
//! locally. `lease_ttl_ns`, when set, is how long those units stay valid (window
//! algorithms: until the window ends).
//!
//! A `limit` is an algorithm's name and every one of its parameters, under their wire
//! names: durations in whole µs with a `_us` suffix (see
//! [`crate::algorithms::Parameter::wire_name`]); which parameters an algorithm takes is
//! its [`crate::algorithms::AlgorithmSpec`].
//!
//! **Descriptor parts** are strings with a one-character origin prefix
//! ([`crate::key::encode_part`]). The bridge never puts them in a Redis key: it hashes
//! `(domain, rule, algorithm, parts)` into the key's hash tag
//! ([`crate::key::redis_key_tag`]). Sizes are bounded by [`crate::bounds`].

use crate::algorithms::{AlgorithmKind, GlobalLimit, ParamError};
use crate::bounds::{
    check_name, MAX_BODY_BYTES, MAX_ITEMS, MAX_KEY_PARTS, MAX_PART_BYTES, MAX_WANT,
};
use crate::field_error::{strip_position, FieldError};
use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::ser::{SerializeMap, Serializer};
use serde::{Deserialize, Serialize};
use std::fmt;

pub const ACQUIRE_PATH: &str = "/v1/acquire";
/// The header carrying the shared secret, when the bridge requires one.
pub const SECRET_HEADER: &str = "x-weir-secret";

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

/// An algorithm and all its parameter values, in the order of its parameter table.
/// Serialized as one flat object: `{"algorithm":"gcra","rate":100,"period_us":…}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WireLimit {
    pub kind: AlgorithmKind,
    pub values: Vec<u64>,
}

impl WireLimit {
    /// Validates the parameters and builds the limit; the error names the parameter.
    pub fn compile(&self) -> Result<GlobalLimit, ParamError> {
        GlobalLimit::build(self.kind, &self.values)
    }
}

impl From<&GlobalLimit> for WireLimit {
    fn from(limit: &GlobalLimit) -> Self {
        WireLimit {
            kind: limit.kind(),
            values: limit.algorithm().parameters(),
        }
    }
}

impl Serialize for WireLimit {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let parameters = self.kind.spec().parameters;
        let mut map = serializer.serialize_map(Some(1 + parameters.len()))?;
        map.serialize_entry("algorithm", self.kind.name())?;
        for (p, value) in parameters.iter().zip(&self.values) {
            map.serialize_entry(&p.wire_name(), value)?;
        }
        map.end()
    }
}

impl<'de> Deserialize<'de> for WireLimit {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(WireLimitVisitor)
    }
}

struct WireLimitVisitor;

impl<'de> Visitor<'de> for WireLimitVisitor {
    type Value = WireLimit;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a limit object with \"algorithm\" and its parameters")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<WireLimit, A::Error> {
        let all = AlgorithmKind::all_parameters();
        let mut kind = None;
        let mut found: Vec<(&'static str, u64)> = Vec::new();
        while let Some(key) = map.next_key::<String>()? {
            if key == "algorithm" {
                if kind.is_some() {
                    return Err(de::Error::duplicate_field("algorithm"));
                }
                kind = Some(map.next_value::<AlgorithmName>()?.0);
                continue;
            }
            let Some(p) = all.iter().find(|p| p.wire_name() == key) else {
                let names: Vec<String> =
                    all.iter().map(|p| format!("`{}`", p.wire_name())).collect();
                return Err(de::Error::custom(format!(
                    "unknown field `{key}`, expected `algorithm` or one of {}",
                    names.join(", ")
                )));
            };
            if found.iter().any(|(name, _)| *name == p.name) {
                return Err(de::Error::custom(format!("duplicate field `{key}`")));
            }
            found.push((p.name, map.next_value::<u64>()?));
        }
        let kind = kind.ok_or_else(|| de::Error::missing_field("algorithm"))?;
        let spec = kind.spec();
        if let Some((name, _)) = found
            .iter()
            .find(|(name, _)| spec.parameter(name).is_none())
        {
            return Err(de::Error::custom(format!(
                "`{}` is not a parameter of {kind}",
                all.iter()
                    .find(|p| p.name == *name)
                    .map_or_else(|| name.to_string(), |p| p.wire_name())
            )));
        }
        let mut values = Vec::with_capacity(spec.parameters.len());
        for p in spec.parameters {
            match found.iter().find(|(name, _)| *name == p.name) {
                Some((_, value)) => values.push(*value),
                None => {
                    return Err(de::Error::custom(format!(
                        "missing field `{}` of {kind}",
                        p.wire_name()
                    )))
                }
            }
        }
        Ok(WireLimit { kind, values })
    }
}

/// An algorithm's name on the wire.
struct AlgorithmName(AlgorithmKind);

impl<'de> Deserialize<'de> for AlgorithmName {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let name = String::deserialize(deserializer)?;
        AlgorithmKind::from_name(&name)
            .map(AlgorithmName)
            .ok_or_else(|| {
                let names: Vec<String> = AlgorithmKind::ALL
                    .iter()
                    .map(|k| format!("`{}`", k.name()))
                    .collect();
                de::Error::custom(format!(
                    "unknown variant `{name}`, expected one of {}",
                    names.join(", ")
                ))
            })
    }
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
    /// Parses and validates a request body; every error names the field.
    pub fn parse(body: &[u8]) -> Result<(AcquireRequest, Vec<GlobalLimit>), FieldError> {
        if body.len() > MAX_BODY_BYTES {
            return Err(FieldError::new(
                "",
                format!("body larger than {MAX_BODY_BYTES} bytes"),
            ));
        }
        let de = &mut serde_json::Deserializer::from_slice(body);
        let request: AcquireRequest =
            serde_path_to_error::deserialize(de).map_err(FieldError::from_serde)?;
        let limits = request.validate()?;
        Ok((request, limits))
    }

    /// Checks sizes and parameters (including what Lua cannot compute exactly); returns
    /// each item's compiled limit.
    pub fn validate(&self) -> Result<Vec<GlobalLimit>, FieldError> {
        check_name("domain", &self.domain).map_err(|e| FieldError::new("domain", e))?;
        if self.items.is_empty() || self.items.len() > MAX_ITEMS {
            return Err(FieldError::new(
                "items",
                format!("must hold 1 to {MAX_ITEMS} items"),
            ));
        }
        self.items
            .iter()
            .enumerate()
            .map(|(i, item)| item.validate(&format!("items[{i}]")))
            .collect()
    }
}

impl AcquireItem {
    fn validate(&self, at: &str) -> Result<GlobalLimit, FieldError> {
        check_name("rule name", &self.rule)
            .map_err(|e| FieldError::new(format!("{at}.rule"), e))?;
        if self.descriptor.len() > MAX_KEY_PARTS {
            return Err(FieldError::new(
                format!("{at}.descriptor"),
                format!("has more than {MAX_KEY_PARTS} parts"),
            ));
        }
        for (j, part) in self.descriptor.iter().enumerate() {
            let ok_prefix = matches!(part.as_bytes().first(), Some(b'=' | b'!' | b'~' | b'#'));
            if !ok_prefix || part.len() > MAX_PART_BYTES {
                return Err(FieldError::new(
                    format!("{at}.descriptor[{j}]"),
                    format!("must start with one of = ! ~ # and be at most {MAX_PART_BYTES} bytes"),
                ));
            }
        }
        let param_error = |e: ParamError| {
            let field = self
                .limit
                .kind
                .spec()
                .parameter(e.field)
                .map_or_else(|| e.field.to_string(), |p| p.wire_name());
            FieldError::new(format!("{at}.limit.{field}"), e.reason)
        };
        let limit = self.limit.compile().map_err(param_error)?;
        limit
            .algorithm()
            .check_script_exact()
            .map_err(param_error)?;
        if self.cost == 0 || self.cost > limit.max_cost() {
            return Err(FieldError::new(
                format!("{at}.cost"),
                format!(
                    "{} is out of range: expected 1 to what the limit can ever admit ({})",
                    self.cost,
                    limit.max_cost()
                ),
            ));
        }
        if self.want < self.cost || self.want > MAX_WANT {
            return Err(FieldError::new(
                format!("{at}.want"),
                format!(
                    "{} must be between cost ({}) and {MAX_WANT}",
                    self.want, self.cost
                ),
            ));
        }
        Ok(limit)
    }
}

/// Why a bridge reply could not be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplyError {
    /// Envoy gave up waiting (it answers a timed-out call with 504).
    Timeout,
    /// No healthy bridge host (Envoy answers 503 itself).
    Unavailable,
    /// The bridge answered with another non-2xx status.
    Status(u16),
    /// A 200 whose body is not a valid reply for the request.
    BadBody(String),
}

impl fmt::Display for ReplyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReplyError::Timeout => f.write_str("bridge call timed out"),
            ReplyError::Unavailable => f.write_str("bridge unavailable (503)"),
            ReplyError::Status(s) => write!(f, "bridge answered HTTP {s}"),
            ReplyError::BadBody(why) => write!(f, "bad bridge reply: {why}"),
        }
    }
}

/// Decodes the bridge's answer to a request of `items` items.
pub fn decode_reply(status: u16, body: &[u8], items: usize) -> Result<AcquireResponse, ReplyError> {
    match status {
        200 => {}
        504 => return Err(ReplyError::Timeout),
        503 => return Err(ReplyError::Unavailable),
        other => return Err(ReplyError::Status(other)),
    }
    if body.len() > MAX_BODY_BYTES {
        return Err(ReplyError::BadBody(format!("{} bytes", body.len())));
    }
    let reply: AcquireResponse =
        serde_json::from_slice(body).map_err(|e| ReplyError::BadBody(strip_position(&e)))?;
    if reply.items.is_empty() || reply.items.len() > items {
        return Err(ReplyError::BadBody(format!(
            "{} results for {items} items",
            reply.items.len()
        )));
    }
    // Only the last evaluated item may be a denial: the bridge stops there.
    let early_denial = reply.items.iter().rev().skip(1).any(|r| !r.allowed);
    let short_without_denial =
        reply.items.len() < items && reply.items.last().is_some_and(|r| r.allowed);
    if early_denial || short_without_denial {
        return Err(ReplyError::BadBody(
            "results do not stop at the first denial".into(),
        ));
    }
    Ok(reply)
}

#[cfg(test)]
mod tests {
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    use super::*;
    use crate::algorithms::gcra::Gcra;
    use crate::algorithms::Limit;

    #[test]
    fn limits_travel_as_flat_objects_with_us_durations() {
        let limit = GlobalLimit::Slot(Limit::Gcra(Gcra::new(99, 100, 1_000_000).unwrap()));
        let wire = WireLimit::from(&limit);
        let json = serde_json::to_string(&wire).unwrap();
        assert_eq!(
            json,
            r#"{"algorithm":"gcra","rate":100,"period_us":1000000,"burst":99}"#
        );
        let back: WireLimit = serde_json::from_str(
            r#"{"burst":99,"period_us":1000000,"algorithm":"gcra","rate":100}"#,
        )
        .unwrap();
        assert_eq!(back, wire);
        assert_eq!(back.compile().unwrap(), limit);
    }

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

    #[test]
    fn replies_are_checked() {
        let one = br#"{"now_us":1,"items":[{"allowed":false,"granted":0,"limit":5,"remaining":0,"retry_after_ns":7,"reset_after_ns":9,"lease_ttl_ns":null}]}"#;
        assert!(decode_reply(200, one, 2).is_ok());
        assert_eq!(decode_reply(504, b"", 1), Err(ReplyError::Timeout));
        assert_eq!(decode_reply(503, b"", 1), Err(ReplyError::Unavailable));
        assert_eq!(decode_reply(401, b"", 1), Err(ReplyError::Status(401)));
        assert!(matches!(
            decode_reply(200, b"{", 1),
            Err(ReplyError::BadBody(_))
        ));
        assert!(matches!(
            decode_reply(200, br#"{"now_us":1,"items":[]}"#, 1),
            Err(ReplyError::BadBody(_))
        ));
        let allowed_short = br#"{"now_us":1,"items":[{"allowed":true,"granted":1,"limit":5,"remaining":0,"retry_after_ns":null,"reset_after_ns":9,"lease_ttl_ns":null}]}"#;
        assert!(matches!(
            decode_reply(200, allowed_short, 2),
            Err(ReplyError::BadBody(_))
        ));
    }
}
