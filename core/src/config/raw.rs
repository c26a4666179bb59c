//! The JSON document exactly as written: serde structs, `deny_unknown_fields` on every
//! one, `snake_case` names, optional fields as `Option` (defaults are applied by
//! `compile`, which knows the context a default depends on).
//!
//! Only what serde can say well is checked here: shapes and types. A duration is
//! parsed here (its error then carries its path for free); every other value check
//! lives in `compile`.

use super::duration::parse_duration;
use crate::algorithms::{AlgorithmKind, Parameter, Unit};
use crate::bounds::MAX_CONFIG_BYTES;
use crate::field_error::FieldError;
use crate::stats::StatsLevel;
use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use std::fmt;

pub(crate) fn parse(json: &[u8]) -> Result<RawConfig, FieldError> {
    if json.len() > MAX_CONFIG_BYTES {
        return Err(FieldError::new(
            "",
            format!(
                "the configuration is {} bytes; at most {MAX_CONFIG_BYTES} (1 MiB) are allowed",
                json.len()
            ),
        ));
    }
    if json.iter().all(u8::is_ascii_whitespace) {
        return Err(FieldError::new(
            "",
            "the configuration is empty: expected a JSON object with \"rules\"",
        ));
    }
    let mut de = serde_json::Deserializer::from_slice(json);
    let raw: RawConfig =
        serde_path_to_error::deserialize(&mut de).map_err(FieldError::from_serde)?;
    // Trailing characters after the object.
    de.end()
        .map_err(|err| FieldError::from_json(String::new(), &err))?;
    Ok(raw)
}

/// Implements `Deserialize` for a struct whose derived deserializer is the inherent
/// `deserialize` of `#[serde(remote = "Self")]`, accepting only a JSON object: serde's
/// derive would also take an array of the field values in declaration order, which no
/// one means to write and which would make a malformed config compile.
///
/// Every hand-written `deserialize` in this file is `#[inline(never)]`. Inlined into their
/// parents' derived visitors, they made the rule's visitor one 65 KB function of
/// weir.wasm, and V8's optimizing compiler, whose time grows faster than a function's
/// size, spent 294 ms of the module's 921 on it (`node --no-liftoff
/// --no-wasm-lazy-compilation --trace-wasm-compilation-times`, measured 2026-11-29):
/// Envoy compiles the whole module so at every start and at every new VM.
macro_rules! object_only {
    ($ty:ident, $expecting:expr) => {
        impl<'de> Deserialize<'de> for $ty {
            #[inline(never)] // see `object_only!`
            fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                struct ObjectVisitor;
                impl<'de> Visitor<'de> for ObjectVisitor {
                    type Value = $ty;
                    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                        f.write_str($expecting)
                    }
                    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<$ty, A::Error> {
                        // The inherent (derived) function, fed through the tracked
                        // `MapAccess` so that errors inside keep their path.
                        $ty::deserialize(de::value::MapAccessDeserializer::new(map))
                    }
                }
                deserializer.deserialize_map(ObjectVisitor)
            }
        }
    };
}

object_only!(RawConfig, "a JSON object");
object_only!(RawRule, "a rule object");
object_only!(RawMatch, "a match object");
object_only!(
    RawStringMatch,
    "an object with one of \"exact\", \"prefix\", \"suffix\""
);
object_only!(RawHeaderMatch, "a header match object");
object_only!(RawPart, "a key part object");
object_only!(RawRequestCost, "a cost object");
object_only!(RawResponse, "a response object");
object_only!(RawBody, "a body object");
object_only!(RawBridge, "a bridge object");
object_only!(RawGlobal, "a global settings object");
object_only!(RawLease, "a lease object");
object_only!(RawReservoir, "a reservoir object");
object_only!(RawOnLimit, "an on_limit object");
object_only!(RawDelay, "a delay object");
object_only!(RawAdaptive, "an adaptive object");
object_only!(RawCommit, "a commit object");
object_only!(RawBodyCost, "a body cost object");
object_only!(RawCommitBody, "a commit body object");
object_only!(RawClamp, "a clamp object");
object_only!(RawShare, "a share object");
object_only!(
    RawLimitFrom,
    "an object with one of \"jwt_claim\", \"attribute\", \"header\""
);

#[derive(Debug, Deserialize)]
#[serde(remote = "Self", deny_unknown_fields)]
pub(crate) struct RawConfig {
    pub rules: Vec<RawRule>,
    pub trusted_headers: Option<Vec<String>>,
    pub response: Option<RawResponse>,
    pub bridge: Option<RawBridge>,
    pub max_buffered_bytes: Option<u64>,
    pub stats: Option<StatsLevel>,
}

/// How the filter reaches weir-bridge (needed by global rules).
#[derive(Debug, Deserialize)]
#[serde(remote = "Self", deny_unknown_fields)]
pub(crate) struct RawBridge {
    pub cluster: String,
    pub authority: Option<String>,
    pub timeout: Option<RawDuration>,
    pub secret: Option<String>,
    pub secret_env: Option<String>,
    pub domain: Option<String>,
}

/// A global rule's settings.
#[derive(Debug, Deserialize)]
#[serde(remote = "Self", deny_unknown_fields)]
pub(crate) struct RawGlobal {
    pub lease: Option<RawLease>,
    pub failure_mode: Option<RawFailureMode>,
    pub expected_instances: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(remote = "Self", deny_unknown_fields)]
pub(crate) struct RawLease {
    pub max: Option<u64>,
    pub ttl: Option<RawDuration>,
    pub horizon: Option<RawDuration>,
    pub round_trip: Option<RawDuration>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum RawFailureMode {
    Allow,
    Deny,
    Local,
}

#[derive(Debug, Deserialize)]
#[serde(remote = "Self", deny_unknown_fields)]
pub(crate) struct RawRule {
    pub name: String,
    #[serde(rename = "match")]
    pub matcher: Option<RawMatch>,
    pub key: Option<Vec<RawPart>>,
    pub limit: RawLimit,
    pub cost: Option<RawCost>,
    pub scope: Option<RawScope>,
    pub global: Option<RawGlobal>,
    pub shadow: Option<bool>,
    pub max_keys: Option<u64>,
    pub reservoir: Option<RawReservoir>,
    pub on_limit: Option<RawOnLimit>,
    pub commit: Option<RawCommit>,
    pub share: Option<RawShare>,
    pub stats: Option<StatsLevel>,
}

/// `share`: the rule's limit split among the keys under its key.
#[derive(Debug, Deserialize)]
#[serde(remote = "Self", deny_unknown_fields)]
pub(crate) struct RawShare {
    pub by: Vec<RawPart>,
    pub max_keys: Option<u64>,
    pub weight: Option<RawLimitFrom>,
}

/// A cost estimated from the request's JSON body.
#[derive(Debug, Deserialize)]
#[serde(remote = "Self", deny_unknown_fields)]
pub(crate) struct RawBodyCost {
    pub fields: Option<Vec<String>>,
    pub bytes_per_prompt_token: Option<u64>,
    pub max_bytes: Option<u64>,
}

/// A cost known when the response ends: where to read it.
#[derive(Debug, Deserialize)]
#[serde(remote = "Self", deny_unknown_fields)]
pub(crate) struct RawCommit {
    pub header: Option<String>,
    pub body: Option<RawCommitBody>,
    pub on_error: Option<u64>,
    pub clamp: Option<RawClamp>,
}

/// `commit.clamp`: lower the body's max-token fields to what the key has left.
#[derive(Debug, Deserialize)]
#[serde(remote = "Self", deny_unknown_fields)]
pub(crate) struct RawClamp {
    pub field: Option<String>,
    pub min_output: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(remote = "Self", deny_unknown_fields)]
pub(crate) struct RawCommitBody {
    pub fields: Option<Vec<String>>,
    pub max_bytes: Option<u64>,
}

/// What a rule does with a request it would limit, instead of denying it.
#[derive(Debug, Deserialize)]
#[serde(remote = "Self", deny_unknown_fields)]
pub(crate) struct RawOnLimit {
    pub delay: Option<RawDelay>,
}

#[derive(Debug, Deserialize)]
#[serde(remote = "Self", deny_unknown_fields)]
pub(crate) struct RawDelay {
    pub max: Option<RawDuration>,
    pub queue: Option<u64>,
}

/// `limit.adaptive` of a concurrency limit: the controller's settings.
#[derive(Debug, Deserialize)]
#[serde(remote = "Self", deny_unknown_fields)]
pub(crate) struct RawAdaptive {
    /// `"p50"`, `"p90"`, `"p99.9"`…
    pub latency: Option<String>,
    pub min: Option<u64>,
    pub initial: Option<u64>,
    pub interval: Option<RawDuration>,
    pub smoothing: Option<f64>,
    pub tolerance: Option<f64>,
    /// A controller for each key (`true`) instead of one for the rule.
    pub per_key: Option<bool>,
    /// With `per_key`: how many keys may have a controller at once.
    pub keys: Option<u64>,
}

/// A local rule's per-worker reservoirs.
#[derive(Debug, Deserialize)]
#[serde(remote = "Self", deny_unknown_fields)]
pub(crate) struct RawReservoir {
    pub max: Option<u64>,
    pub hold: Option<RawDuration>,
    pub max_keys: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum RawScope {
    Local,
    Global,
}

#[derive(Debug, Deserialize)]
#[serde(remote = "Self", deny_unknown_fields)]
pub(crate) struct RawMatch {
    pub path: Option<RawStringMatch>,
    pub methods: Option<Vec<String>>,
    pub headers: Option<Vec<RawHeaderMatch>>,
    pub authority: Option<RawStringMatch>,
}

/// Exactly one of the three must be set (checked by `compile`).
#[derive(Debug, Deserialize)]
#[serde(remote = "Self", deny_unknown_fields)]
pub(crate) struct RawStringMatch {
    pub exact: Option<String>,
    pub prefix: Option<String>,
    pub suffix: Option<String>,
}

/// `name` and exactly one test (checked by `compile`).
#[derive(Debug, Deserialize)]
#[serde(remote = "Self", deny_unknown_fields)]
pub(crate) struct RawHeaderMatch {
    pub name: String,
    pub exact: Option<String>,
    pub prefix: Option<String>,
    pub suffix: Option<String>,
    pub present: Option<bool>,
}

/// Exactly one source field (checked by `compile`), plus an optional `default`.
#[derive(Debug, Deserialize)]
#[serde(remote = "Self", deny_unknown_fields)]
pub(crate) struct RawPart {
    pub header: Option<String>,
    pub client_ip: Option<Empty>,
    pub path: Option<Empty>,
    pub method: Option<Empty>,
    pub query_param: Option<String>,
    pub jwt_claim: Option<ClaimPath>,
    pub jwt_metadata_key: Option<String>,
    pub attribute: Option<Vec<String>>,
    #[serde(rename = "static")]
    pub static_value: Option<String>,
    pub default: Option<String>,
}

impl RawPart {
    /// Each key source by its config name, and whether this part sets it: the one list
    /// of sources, which the compiler checks "exactly one" against.
    pub fn sources(&self) -> [(&'static str, bool); 8] {
        [
            ("header", self.header.is_some()),
            ("client_ip", self.client_ip.is_some()),
            ("path", self.path.is_some()),
            ("method", self.method.is_some()),
            ("query_param", self.query_param.is_some()),
            ("jwt_claim", self.jwt_claim.is_some()),
            ("attribute", self.attribute.is_some()),
            ("static", self.static_value.is_some()),
        ]
    }
}

/// `{}` and nothing else: the value of a source that takes no parameters.
#[derive(Debug)]
pub(crate) struct Empty;

impl<'de> Deserialize<'de> for Empty {
    #[inline(never)] // see `object_only!`
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct EmptyVisitor;
        impl<'de> Visitor<'de> for EmptyVisitor {
            type Value = Empty;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an empty object {}")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Empty, A::Error> {
                match map.next_key::<String>()? {
                    None => Ok(Empty),
                    Some(key) => Err(de::Error::custom(format!(
                        "unknown field `{key}`: expected an empty object {{}}"
                    ))),
                }
            }
        }
        deserializer.deserialize_map(EmptyVisitor)
    }
}

/// `"sub"` or `["org", "id"]`: a claim, or the path to a nested one.
#[derive(Debug)]
pub(crate) struct ClaimPath(pub Vec<String>);

impl<'de> Deserialize<'de> for ClaimPath {
    #[inline(never)] // see `object_only!`
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ClaimVisitor;
        impl<'de> Visitor<'de> for ClaimVisitor {
            type Value = ClaimPath;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a claim name or a list of claim names")
            }
            fn visit_str<E: de::Error>(self, claim: &str) -> Result<ClaimPath, E> {
                Ok(ClaimPath(vec![claim.to_string()]))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<ClaimPath, A::Error> {
                let mut path = Vec::new();
                while let Some(segment) = seq.next_element::<String>()? {
                    path.push(segment);
                }
                Ok(ClaimPath(path))
            }
        }
        deserializer.deserialize_any(ClaimVisitor)
    }
}

/// A limit as written: the algorithm's name and parameter values by name, in document
/// order. Which parameters belong to the named algorithm is checked by `compile`, so
/// that a misplaced one gets a message naming the right ones; here a value is only
/// parsed, by the unit its name has in every algorithm (durations as strings).
#[derive(Debug)]
pub(crate) struct RawLimit {
    pub algorithm: String,
    pub values: Vec<(&'static Parameter, RawValue)>,
    /// The fields of `algorithm: "concurrency"`, which is not a rate algorithm.
    pub concurrency: RawConcurrency,
}

/// `max_in_flight`, `retry_after` and `adaptive`, as written.
#[derive(Debug, Default)]
pub(crate) struct RawConcurrency {
    pub max_in_flight: Option<u64>,
    pub retry_after: Option<RawDuration>,
    pub adaptive: Option<RawAdaptive>,
}

impl RawConcurrency {
    /// The first field set, to name in an error when the algorithm is another.
    pub fn first_set(&self) -> Option<&'static str> {
        if self.max_in_flight.is_some() {
            Some("max_in_flight")
        } else if self.retry_after.is_some() {
            Some("retry_after")
        } else if self.adaptive.is_some() {
            Some("adaptive")
        } else {
            None
        }
    }
}

/// The fields of a concurrency limit, beside `algorithm`.
pub(crate) const CONCURRENCY_FIELDS: [&str; 3] = ["max_in_flight", "retry_after", "adaptive"];

#[derive(Debug)]
pub(crate) enum RawValue {
    Count(u64),
    Duration(RawDuration),
    /// A count read from the request (a tenant's own limit).
    FromRequest(RawLimitFrom),
}

/// `{"jwt_claim": "rate", "default": 100, "min": 1, "max": 10000}`: a limit parameter
/// read from the request, with exactly one source.
#[derive(Debug, Deserialize)]
#[serde(remote = "Self", deny_unknown_fields)]
pub(crate) struct RawLimitFrom {
    pub header: Option<String>,
    pub jwt_claim: Option<ClaimPath>,
    pub jwt_metadata_key: Option<String>,
    pub attribute: Option<Vec<String>>,
    pub default: Option<u64>,
    pub min: Option<u64>,
    pub max: Option<u64>,
}

/// A count parameter: a whole number, or where the request gives it.
struct RawCount;

impl<'de> DeserializeSeed<'de> for RawCount {
    type Value = RawValue;

    #[inline(never)] // see `object_only!`
    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<RawValue, D::Error> {
        struct CountVisitor;
        impl<'de> Visitor<'de> for CountVisitor {
            type Value = RawValue;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(
                    "a whole number or {\"jwt_claim\" | \"attribute\" | \"header\": ..., \"default\": ..., \"max\": ...}",
                )
            }
            fn visit_u64<E: de::Error>(self, n: u64) -> Result<RawValue, E> {
                Ok(RawValue::Count(n))
            }
            fn visit_i64<E: de::Error>(self, n: i64) -> Result<RawValue, E> {
                match u64::try_from(n) {
                    Ok(n) => Ok(RawValue::Count(n)),
                    Err(_) => Err(E::invalid_value(de::Unexpected::Signed(n), &self)),
                }
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<RawValue, A::Error> {
                // The inherent (derived) function, through the tracked `MapAccess`.
                RawLimitFrom::deserialize(de::value::MapAccessDeserializer::new(map))
                    .map(RawValue::FromRequest)
            }
        }
        deserializer.deserialize_any(CountVisitor)
    }
}

impl RawLimit {
    pub fn value(&self, name: &str) -> Option<&RawValue> {
        self.values
            .iter()
            .find(|(p, _)| p.name == name)
            .map(|(_, value)| value)
    }
}

impl<'de> Deserialize<'de> for RawLimit {
    #[inline(never)] // see `object_only!`
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(RawLimitVisitor)
    }
}

struct RawLimitVisitor;

impl<'de> Visitor<'de> for RawLimitVisitor {
    type Value = RawLimit;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a limit object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RawLimit, A::Error> {
        let parameters = AlgorithmKind::all_parameters();
        let mut algorithm = None;
        let mut values: Vec<(&'static Parameter, RawValue)> = Vec::new();
        let mut concurrency = RawConcurrency::default();
        while let Some(key) = map.next_key::<String>()? {
            if key == "algorithm" {
                if algorithm.is_some() {
                    return Err(de::Error::duplicate_field("algorithm"));
                }
                algorithm = Some(map.next_value::<String>()?);
                continue;
            }
            let twice = |set: bool, name: &'static str| {
                if set {
                    Err(de::Error::duplicate_field(name))
                } else {
                    Ok(())
                }
            };
            match key.as_str() {
                "max_in_flight" => {
                    twice(concurrency.max_in_flight.is_some(), "max_in_flight")?;
                    concurrency.max_in_flight = Some(map.next_value()?);
                    continue;
                }
                "retry_after" => {
                    twice(concurrency.retry_after.is_some(), "retry_after")?;
                    concurrency.retry_after = Some(map.next_value()?);
                    continue;
                }
                "adaptive" => {
                    twice(concurrency.adaptive.is_some(), "adaptive")?;
                    concurrency.adaptive = Some(map.next_value()?);
                    continue;
                }
                _ => {}
            }
            let Some(&parameter) = parameters.iter().find(|p| p.name == key) else {
                let names: Vec<String> = std::iter::once("algorithm")
                    .chain(parameters.iter().map(|p| p.name))
                    .chain(CONCURRENCY_FIELDS)
                    .map(|name| format!("`{name}`"))
                    .collect();
                // Through the value, so that the error's path ends with the field.
                return map.next_value_seed(Refuse(format!(
                    "unknown field `{key}`, expected one of {}",
                    names.join(", ")
                )));
            };
            if values.iter().any(|(p, _)| p.name == parameter.name) {
                return Err(de::Error::duplicate_field(parameter.name));
            }
            let value = match parameter.unit {
                Unit::Count => map.next_value_seed(RawCount)?,
                Unit::Duration => RawValue::Duration(map.next_value()?),
            };
            values.push((parameter, value));
        }
        let algorithm = algorithm.ok_or_else(|| de::Error::missing_field("algorithm"))?;
        Ok(RawLimit {
            algorithm,
            values,
            concurrency,
        })
    }
}

/// A value that is refused whatever it is, with `self.0` as the message.
struct Refuse(String);

impl<'de> DeserializeSeed<'de> for Refuse {
    type Value = RawLimit;

    #[inline(never)] // see `object_only!`
    fn deserialize<D: Deserializer<'de>>(self, _deserializer: D) -> Result<RawLimit, D::Error> {
        Err(de::Error::custom(self.0))
    }
}

/// A duration string, parsed; `text` is kept for messages.
#[derive(Debug, Clone)]
pub(crate) struct RawDuration {
    pub text: String,
    pub us: u64,
}

impl<'de> Deserialize<'de> for RawDuration {
    #[inline(never)] // see `object_only!`
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct DurationVisitor;
        impl<'de> Visitor<'de> for DurationVisitor {
            type Value = RawDuration;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a duration string such as \"500ms\" or \"1m\"")
            }
            fn visit_str<E: de::Error>(self, text: &str) -> Result<RawDuration, E> {
                let us = parse_duration(text).map_err(E::custom)?;
                Ok(RawDuration {
                    text: text.to_string(),
                    us,
                })
            }
        }
        deserializer.deserialize_str(DurationVisitor)
    }
}

/// `5`, `{"header": "x-cost", "default": 1, "min": 1, "max": 10}` or
/// `{"body": {...}, "default": 4000, "max": 16000}`.
#[derive(Debug)]
pub(crate) enum RawCost {
    Fixed(u64),
    FromRequest(RawRequestCost),
}

#[derive(Debug, Deserialize)]
#[serde(remote = "Self", deny_unknown_fields)]
pub(crate) struct RawRequestCost {
    pub header: Option<String>,
    pub body: Option<RawBodyCost>,
    pub default: Option<u64>,
    pub min: Option<u64>,
    pub max: Option<u64>,
}

impl<'de> Deserialize<'de> for RawCost {
    #[inline(never)] // see `object_only!`
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct CostVisitor;
        impl<'de> Visitor<'de> for CostVisitor {
            type Value = RawCost;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(
                    "a whole number ≥ 1 or {\"header\" or \"body\": ..., \"default\": ..., \"min\": ..., \"max\": ...}",
                )
            }
            fn visit_u64<E: de::Error>(self, cost: u64) -> Result<RawCost, E> {
                Ok(RawCost::Fixed(cost))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<RawCost, A::Error> {
                // The inherent (derived) function, through the tracked `MapAccess`.
                RawRequestCost::deserialize(de::value::MapAccessDeserializer::new(map))
                    .map(RawCost::FromRequest)
            }
        }
        deserializer.deserialize_any(CostVisitor)
    }
}

#[derive(Debug, Deserialize)]
#[serde(remote = "Self", deny_unknown_fields)]
pub(crate) struct RawResponse {
    pub status: Option<u64>,
    pub header_style: Option<RawHeaderStyle>,
    pub headers_on_allowed: Option<bool>,
    pub body: Option<RawBody>,
    pub shadow_header: Option<String>,
    pub filter_state: Option<RawFilterState>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum RawFilterState {
    Rule,
    Denied,
    All,
    None,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum RawHeaderStyle {
    Ietf,
    Legacy,
    None,
}

#[derive(Debug, Deserialize)]
#[serde(remote = "Self", deny_unknown_fields)]
pub(crate) struct RawBody {
    pub content_type: String,
    pub text: String,
}
