//! A rule's `key`: its parts, each with exactly one source and an optional default.

use super::{and_list, error, header_name, Interner, Result};
use crate::bounds::{MAX_KEY_PARTS, MAX_KEY_VALUE_BYTES};
use crate::config::raw::RawPart;
use crate::field_error::quoted;
use crate::rules::{Fact, KeyPart, KeySource};

/// Segments of an `attribute` path, and of a `jwt_claim` path.
pub const MAX_ATTRIBUTE_SEGMENTS: usize = 10;
/// Where Envoy's `jwt_authn` filter puts verified payloads (`payload_in_metadata`).
pub const JWT_AUTHN_FILTER: &str = "envoy.filters.http.jwt_authn";
pub const DEFAULT_JWT_METADATA_KEY: &str = "jwt_payload";

#[inline(never)] // a wasm function of its own: see `compile::compile`
pub(super) fn compile(parts: Vec<RawPart>, at: &str, facts: &mut Interner) -> Result<Vec<KeyPart>> {
    if parts.len() > MAX_KEY_PARTS {
        return Err(error(
            at,
            format!("{} parts; at most {MAX_KEY_PARTS} are allowed", parts.len()),
        ));
    }
    parts
        .into_iter()
        .enumerate()
        .map(|(j, raw)| one_part(raw, &format!("{at}[{j}]"), facts))
        .collect()
}

fn one_part(mut raw: RawPart, at: &str, facts: &mut Interner) -> Result<KeyPart> {
    if raw.jwt_metadata_key.is_some() && raw.jwt_claim.is_none() {
        return Err(error(
            format!("{at}.jwt_metadata_key"),
            "only goes with `jwt_claim`",
        ));
    }
    let sources = raw.sources();
    let found: Vec<&str> = sources
        .iter()
        .filter(|(_, set)| *set)
        .map(|(name, _)| *name)
        .collect();
    if found.len() != 1 {
        let names: Vec<&str> = sources.iter().map(|(name, _)| *name).collect();
        return Err(error(
            at,
            format!(
                "a key part needs exactly one source out of {}; found {}",
                names.join(", "),
                if found.is_empty() {
                    "none".to_string()
                } else {
                    and_list(&found)
                }
            ),
        ));
    }
    let is_static = raw.static_value.is_some();
    let raw_default = raw.default.take();
    let source = key_source(raw, at, facts)?;
    let default = match raw_default {
        Some(_) if is_static => {
            return Err(error(
                format!("{at}.default"),
                "a static part always has a value, so it takes no `default`",
            ));
        }
        Some(value) => Some(key_value(value, &format!("{at}.default"))?),
        None => None,
    };
    Ok(KeyPart { source, default })
}

/// The source of a part known to have exactly one.
fn key_source(raw: RawPart, at: &str, facts: &mut Interner) -> Result<KeySource> {
    let source = if let Some(header) = raw.header {
        let at = format!("{at}.header");
        let name = header_name(
            &header,
            &at,
            "use the \"path\" or \"method\" source, or {\"attribute\": [\"request\", \"host\"]} for the authority",
        )?;
        KeySource::Header {
            fact: facts.intern(Fact::Header(name), &at)?,
        }
    } else if raw.client_ip.is_some() {
        let fact = Fact::Property(vec!["source".into(), "address".into()]);
        KeySource::ClientIp {
            fact: facts.intern(fact, at)?,
        }
    } else if raw.path.is_some() {
        KeySource::Path {
            fact: facts.intern(Fact::Header(":path".into()), at)?,
        }
    } else if raw.method.is_some() {
        KeySource::Method {
            fact: facts.intern(Fact::Header(":method".into()), at)?,
        }
    } else if let Some(name) = raw.query_param {
        if name.is_empty() {
            return Err(error(
                format!("{at}.query_param"),
                "the parameter name is empty",
            ));
        }
        let fact = facts.intern(Fact::Header(":path".into()), at)?;
        KeySource::QueryParam {
            fact,
            name: name.into_bytes(),
        }
    } else if let Some(claim) = raw.jwt_claim {
        let metadata_key = match raw.jwt_metadata_key {
            Some(key) if key.is_empty() => {
                return Err(error(format!("{at}.jwt_metadata_key"), "must not be empty"));
            }
            Some(key) => key,
            None => DEFAULT_JWT_METADATA_KEY.to_string(),
        };
        let claim = segments(claim.0, &format!("{at}.jwt_claim"), "claim path")?;
        let mut path = vec![
            "metadata".to_string(),
            "filter_metadata".into(),
            JWT_AUTHN_FILTER.into(),
            metadata_key,
        ];
        path.extend(claim);
        KeySource::Attribute {
            fact: facts.intern(Fact::Property(path), at)?,
        }
    } else if let Some(path) = raw.attribute {
        let path = segments(path, &format!("{at}.attribute"), "attribute path")?;
        KeySource::Attribute {
            fact: facts.intern(Fact::Property(path), at)?,
        }
    } else if let Some(value) = raw.static_value {
        KeySource::Static {
            value: key_value(value, &format!("{at}.static"))?,
        }
    } else {
        return Err(error(at, "internal error: no key source"));
    };
    Ok(source)
}

/// A `static` or `default` value: non-empty (an empty value is what falls back to the
/// default) and short enough to hash and send cheaply.
fn key_value(value: String, at: &str) -> Result<Vec<u8>> {
    if value.is_empty() {
        return Err(error(at, "must not be empty"));
    }
    if value.len() > MAX_KEY_VALUE_BYTES {
        return Err(error(
            at,
            format!(
                "{} bytes; at most {MAX_KEY_VALUE_BYTES} are allowed",
                value.len()
            ),
        ));
    }
    // Control characters cannot come from a header either, and keep the value's JSON
    // form on the wire within twice its size (see `crate::bounds::MAX_BODY_BYTES`).
    if value.chars().any(char::is_control) {
        return Err(error(
            at,
            format!("{} contains a control character", quoted(&value)),
        ));
    }
    Ok(value.into_bytes())
}

fn segments(path: Vec<String>, at: &str, what: &str) -> Result<Vec<String>> {
    if path.is_empty() || path.len() > MAX_ATTRIBUTE_SEGMENTS {
        return Err(error(
            at,
            format!(
                "the {what} has {} segments; expected 1 to {MAX_ATTRIBUTE_SEGMENTS}",
                path.len()
            ),
        ));
    }
    if let Some(empty) = path.iter().position(String::is_empty) {
        return Err(error(format!("{at}[{empty}]"), "must not be empty"));
    }
    Ok(path)
}
