//! The wire format between the filter and weir-bridge.
//!
//! Two versions are served side by side, so that filters and bridges can be upgraded
//! one at a time (bridge first; docs/compatibility.md):
//!
//! - [`v2`] (`POST /v2/acquire`), what this filter sends: each item carries an id the
//!   reply echoes, whether it is a shadow rule (the bridge goes on past a shadow item's
//!   denial), how long granted units may wait (`hold_us`, the lease's ttl) and how far ahead a saturated
//!   key may be reserved; each result says when its units are due and how long each
//!   stays valid.
//! - [`v1`] (`POST /v1/acquire`), what filters before it send: results in order,
//!   evaluation stops at the first denial, leases expire by `lease_ttl_ns`.
//! - [`v3`] (`POST /v3/commit`), beside v2: the costs of global rules with `commit`,
//!   settled when the responses ended; each item carries an id its result echoes, and
//!   results are matched to commits by id, in any order.
//!
//! What both share is here: a limit's form ([`WireLimit`]), the secret header, the
//! checks every item gets, and what can go wrong with a reply. Sizes are bounded by
//! [`crate::bounds`].
//!
//! **Descriptor parts** are strings with a one-character origin prefix
//! ([`crate::key::encode_part`]). The bridge never puts them in a Redis key: it hashes
//! `(domain, rule, algorithm, parts)` into the key's hash tag
//! ([`crate::key::redis_key_tag`]).

pub mod v1;
pub mod v2;
pub mod v3;

use crate::algorithms::{AlgorithmKind, GlobalLimit, ParamError};
use crate::bounds::{
    check_name, MAX_BODY_BYTES, MAX_ITEMS, MAX_KEY_PARTS, MAX_PART_BYTES, MAX_WANT,
};
use crate::field_error::FieldError;
use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::ser::{SerializeMap, Serializer};
use serde::{Deserialize, Serialize};
use std::fmt;

/// The header carrying the shared secret, when the bridge requires one.
pub const SECRET_HEADER: &str = "x-weir-secret";

/// The method of every call the filter makes to the bridge.
pub const FILTER_METHOD: &str = "POST";

/// Every path this filter calls on the bridge, always with [`FILTER_METHOD`]: what an
/// authorization policy in front of the bridge must allow (`envoy/istio/bridge.yaml`).
/// [`v1::ACQUIRE_PATH`] is not here: the bridge still serves it for older filters, but
/// this one never calls it. `core/tests/filter_paths.rs` checks that the filter calls
/// these and no other; the Istio tests check the shipped policy against them.
pub const FILTER_PATHS: &[&str] = &[v2::ACQUIRE_PATH, v3::COMMIT_PATH];

/// An algorithm and all its parameter values, in the order of its parameter table.
/// Serialized as one flat object: `{"algorithm":"gcra","rate":100,"period_us":…}`, a
/// duration under its wire name ([`crate::algorithms::Parameter::wire_name`]).
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

/// A request body that passed every check: what each version's `parse` returns. Each
/// item is kept with the limit it compiled to, so that no caller pairs items with limits
/// by position.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checked<T> {
    pub domain: String,
    pub items: Vec<CheckedItem<T>>,
}

/// One item as the request carried it, and its compiled limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckedItem<T> {
    pub item: T,
    pub limit: GlobalLimit,
}

/// What every wire version checks first: the domain's name, and 1 to [`MAX_ITEMS`] items.
pub(crate) fn check_envelope(domain: &str, items: usize) -> Result<(), FieldError> {
    check_name("domain", domain).map_err(|e| FieldError::new("domain", e))?;
    if items == 0 || items > MAX_ITEMS {
        return Err(FieldError::new(
            "items",
            format!("must hold 1 to {MAX_ITEMS} items"),
        ));
    }
    Ok(())
}

/// An item's `id` (under `at`), refused when one of the `earlier` items has it already:
/// results are matched to items by id, so ids are unique within a request.
pub(crate) fn check_id<T>(
    at: &str,
    id: u16,
    earlier: &[CheckedItem<T>],
    id_of: impl Fn(&T) -> u16,
) -> Result<(), FieldError> {
    match earlier.iter().position(|other| id_of(&other.item) == id) {
        Some(first) => Err(FieldError::new(
            format!("{at}.id"),
            format!("{id} is also the id of items[{first}]"),
        )),
        None => Ok(()),
    }
}

/// The fields every item of every version has, checked the same way: the rule's name,
/// the descriptor, the limit (including what Lua cannot compute exactly), the cost and
/// what the item wants. Returns the compiled limit; errors name the field under `at`.
pub(crate) fn check_item(
    at: &str,
    rule: &str,
    descriptor: &[String],
    limit: &WireLimit,
    cost: u64,
    want: u64,
) -> Result<GlobalLimit, FieldError> {
    check_name("rule name", rule).map_err(|e| FieldError::new(format!("{at}.rule"), e))?;
    check_parts(&format!("{at}.descriptor"), descriptor, 0)?;
    let param_error = |e: ParamError| {
        let field = limit
            .kind
            .spec()
            .parameter(e.field)
            .map_or_else(|| e.field.to_string(), |p| p.wire_name());
        FieldError::new(format!("{at}.limit.{field}"), e.reason)
    };
    let compiled = limit.compile().map_err(param_error)?;
    compiled
        .algorithm()
        .check_script_exact()
        .map_err(param_error)?;
    if cost == 0 || cost > compiled.max_cost() {
        return Err(FieldError::new(
            format!("{at}.cost"),
            format!(
                "{cost} is out of range: expected 1 to what the limit can ever admit ({})",
                compiled.max_cost()
            ),
        ));
    }
    if want < cost || want > MAX_WANT {
        return Err(FieldError::new(
            format!("{at}.want"),
            format!("{want} must be between cost ({cost}) and {MAX_WANT}"),
        ));
    }
    Ok(compiled)
}

/// Descriptor parts at `at`: `min` to [`MAX_KEY_PARTS`] of them, each with its origin
/// prefix and at most [`MAX_PART_BYTES`] bytes.
pub(crate) fn check_parts(at: &str, parts: &[String], min: usize) -> Result<(), FieldError> {
    if parts.len() < min || parts.len() > MAX_KEY_PARTS {
        return Err(FieldError::new(
            at,
            format!("must have {min} to {MAX_KEY_PARTS} parts"),
        ));
    }
    for (j, part) in parts.iter().enumerate() {
        let ok_prefix = matches!(part.as_bytes().first(), Some(b'=' | b'!' | b'~' | b'#'));
        if !ok_prefix || part.len() > MAX_PART_BYTES {
            return Err(FieldError::new(
                format!("{at}[{j}]"),
                format!("must start with one of = ! ~ # and be at most {MAX_PART_BYTES} bytes"),
            ));
        }
    }
    Ok(())
}

/// A request body, size-checked and deserialized; errors name the field.
pub(crate) fn parse_body<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, FieldError> {
    if body.len() > MAX_BODY_BYTES {
        return Err(FieldError::new(
            "",
            format!("body larger than {MAX_BODY_BYTES} bytes"),
        ));
    }
    let de = &mut serde_json::Deserializer::from_slice(body);
    serde_path_to_error::deserialize(de).map_err(FieldError::from_serde)
}

/// Why a bridge reply could not be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplyError {
    /// Envoy gave up waiting (it answers a timed-out call with 504).
    Timeout,
    /// The bridge's own 503 (Redis failing behind it), or no call could be made.
    Unavailable,
    /// Envoy answered for the bridge: a 503 without the bridge's body, for no healthy
    /// host, or a connection refused or reset before a response. Another host of the
    /// cluster may answer (see [`ReplyError::worth_resending`]).
    Unreachable,
    /// The connection failed before any status: reset, refused, closed.
    NoResponse,
    /// The bridge answered with another non-2xx status, and the reason it gave (its
    /// JSON body's `error`, cut short).
    Status(u16, String),
    /// A 200 whose body is not a valid reply for the request.
    BadBody(String),
    /// Envoy refused the call at once (`proxy_http_call` failed): the bridge cluster's
    /// circuit breaker was full (`max_requests`, `max_pending_requests`), or it has no
    /// host at all. Envoy says neither which nor anything else: the filter tells them
    /// apart by whether calls of its Envoy are still ending (see
    /// `Engine::complete`). Never sent again.
    Refused,
}

impl ReplyError {
    /// Whether the call never reached a bridge: sent again, Envoy picks a host again,
    /// and with a replica restarting another one answers. Not after a timeout (its time
    /// is spent) nor any answer a bridge gave (another replica shares its Redis).
    pub fn worth_resending(&self) -> bool {
        matches!(self, ReplyError::Unreachable | ReplyError::NoResponse)
    }
}

impl fmt::Display for ReplyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReplyError::Timeout => f.write_str("bridge call timed out"),
            ReplyError::Unavailable => f.write_str("bridge unavailable (503)"),
            ReplyError::Unreachable => {
                f.write_str("bridge unreachable (503 from Envoy: no healthy host, or refused)")
            }
            ReplyError::NoResponse => {
                f.write_str("bridge connection failed before a response (reset or refused)")
            }
            ReplyError::Status(s, reason) if reason.is_empty() => {
                write!(f, "bridge answered HTTP {s}")
            }
            ReplyError::Status(s, reason) => write!(f, "bridge answered HTTP {s}: {reason}"),
            ReplyError::BadBody(why) => write!(f, "bad bridge reply: {why}"),
            ReplyError::Refused => f.write_str(
                "Envoy refused the bridge call (the cluster's circuit breaker is full, or it has no host)",
            ),
        }
    }
}

/// The longest reason from a bridge's error body kept for a log line.
const MAX_REASON_CHARS: usize = 200;

/// Maps a non-200 status (0: no status at all) and its body to the error. The bridge
/// words every error as JSON with an `error`; a 503 without one is Envoy's own.
pub(crate) fn status_error(status: u16, body: &[u8]) -> ReplyError {
    match status {
        0 => ReplyError::NoResponse,
        504 => ReplyError::Timeout,
        503 if error_reason(body).is_empty() => ReplyError::Unreachable,
        503 => ReplyError::Unavailable,
        other => ReplyError::Status(other, error_reason(body)),
    }
}

/// The `error` of a bridge's JSON error body, cut short, printable only.
fn error_reason(body: &[u8]) -> String {
    #[derive(Deserialize)]
    struct ErrorBody {
        error: String,
    }
    let Ok(parsed) = serde_json::from_slice::<ErrorBody>(body) else {
        return String::new();
    };
    parsed
        .error
        .chars()
        .filter(|c| !c.is_control())
        .take(MAX_REASON_CHARS)
        .collect()
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
    fn failed_calls_say_why() {
        assert_eq!(status_error(0, b""), ReplyError::NoResponse);
        assert_eq!(status_error(504, b""), ReplyError::Timeout);
        let redis_down = br#"{"error":"redis unavailable (timeout)"}"#;
        assert_eq!(status_error(503, redis_down), ReplyError::Unavailable);
        let no_host = b"upstream connect error or disconnect/reset before headers. reset reason: connection failure";
        assert_eq!(status_error(503, no_host), ReplyError::Unreachable);
        assert_eq!(
            status_error(503, b"no healthy upstream"),
            ReplyError::Unreachable
        );
        assert!(ReplyError::Unreachable.worth_resending());
        assert!(ReplyError::NoResponse.worth_resending());
        assert!(!ReplyError::Unavailable.worth_resending());
        assert!(!ReplyError::Timeout.worth_resending());
        let bad = status_error(400, br#"{"error":"items[0].cost: 0 is out of range\n"}"#);
        assert_eq!(
            bad.to_string(),
            "bridge answered HTTP 400: items[0].cost: 0 is out of range"
        );
        assert_eq!(
            status_error(401, b"not json").to_string(),
            "bridge answered HTTP 401"
        );
    }
}
