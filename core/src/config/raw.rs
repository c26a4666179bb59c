//! The JSON document exactly as written: serde structs, `deny_unknown_fields` on every
//! one, `snake_case` names, optional fields as `Option` (defaults are applied by
//! `compile`, which knows the context a default depends on).
//!
//! Only what serde can say well is checked here: shapes and types. A duration is
//! parsed here (its error then carries its path for free); every other value check
//! lives in `compile`.

use super::duration::parse_duration;
use super::error::ConfigError;
use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use std::fmt;

/// Configurations past this size are refused before parsing: a rate-limit config is a
/// few kilobytes, and the parser runs inside every worker's VM.
pub const MAX_CONFIG_BYTES: usize = 1 << 20;

pub(crate) fn parse(json: &[u8]) -> Result<RawConfig, ConfigError> {
    if json.len() > MAX_CONFIG_BYTES {
        return Err(ConfigError::new(
            "",
            format!(
                "the configuration is {} bytes; at most {MAX_CONFIG_BYTES} (1 MiB) are allowed",
                json.len()
            ),
        ));
    }
    if json.iter().all(u8::is_ascii_whitespace) {
        return Err(ConfigError::new(
            "",
            "the configuration is empty: expected a JSON object with \"rules\"",
        ));
    }
    let mut de = serde_json::Deserializer::from_slice(json);
    let raw: RawConfig =
        serde_path_to_error::deserialize(&mut de).map_err(ConfigError::from_serde)?;
    // Trailing characters after the object.
    de.end()
        .map_err(|err| ConfigError::from_json(String::new(), &err))?;
    Ok(raw)
}

/// Implements `Deserialize` for a struct whose derived deserializer is the inherent
/// `deserialize` of `#[serde(remote = "Self")]`, accepting only a JSON object: serde's
/// derive would also take an array of the field values in declaration order, which no
/// one means to write and which would make a malformed config compile.
macro_rules! object_only {
    ($ty:ident, $expecting:expr) => {
        impl<'de> Deserialize<'de> for $ty {
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
object_only!(RawLimit, "a limit object");
object_only!(RawHeaderCost, "a header cost object");
object_only!(RawResponse, "a response object");
object_only!(RawBody, "a body object");
object_only!(RawBridge, "a bridge object");
object_only!(RawGlobal, "a global settings object");
object_only!(RawLease, "a lease object");

#[derive(Debug, Deserialize)]
#[serde(remote = "Self", deny_unknown_fields)]
pub(crate) struct RawConfig {
    pub rules: Vec<RawRule>,
    pub response: Option<RawResponse>,
    pub bridge: Option<RawBridge>,
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

/// `{}` and nothing else: the value of a source that takes no parameters.
#[derive(Debug)]
pub(crate) struct Empty;

impl<'de> Deserialize<'de> for Empty {
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

/// Every parameter of every algorithm; which ones belong to the named algorithm is
/// checked by `compile`, so that a misplaced one gets a message naming the right ones.
#[derive(Debug, Deserialize)]
#[serde(remote = "Self", deny_unknown_fields)]
pub(crate) struct RawLimit {
    pub algorithm: String,
    pub rate: Option<u64>,
    pub period: Option<RawDuration>,
    pub burst: Option<u64>,
    pub capacity: Option<u64>,
    pub refill: Option<u64>,
    pub limit: Option<u64>,
    pub window: Option<RawDuration>,
}

/// A duration string, parsed; `text` is kept for messages.
#[derive(Debug, Clone)]
pub(crate) struct RawDuration {
    pub text: String,
    pub us: u64,
}

impl<'de> Deserialize<'de> for RawDuration {
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

/// `5` or `{"header": "x-cost", "default": 1, "max": 10}`.
#[derive(Debug)]
pub(crate) enum RawCost {
    Fixed(u64),
    Header(RawHeaderCost),
}

#[derive(Debug, Deserialize)]
#[serde(remote = "Self", deny_unknown_fields)]
pub(crate) struct RawHeaderCost {
    pub header: String,
    pub default: Option<u64>,
    pub max: Option<u64>,
}

impl<'de> Deserialize<'de> for RawCost {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct CostVisitor;
        impl<'de> Visitor<'de> for CostVisitor {
            type Value = RawCost;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(
                    "a whole number ≥ 0 or {\"header\": ..., \"default\": ..., \"max\": ...}",
                )
            }
            fn visit_u64<E: de::Error>(self, cost: u64) -> Result<RawCost, E> {
                Ok(RawCost::Fixed(cost))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<RawCost, A::Error> {
                // The inherent (derived) function, through the tracked `MapAccess`.
                RawHeaderCost::deserialize(de::value::MapAccessDeserializer::new(map))
                    .map(RawCost::Header)
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
