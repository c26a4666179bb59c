//! A rule's `key`: its parts, each with exactly one source and an optional default.

use super::{and_list, error, header_name, Interner, Result};
use crate::bounds::{MAX_KEY_PARTS, MAX_KEY_VALUE_BYTES};
use crate::config::raw::{ClaimPath, RawLimitFrom, RawPart};
use crate::field_error::quoted;
use crate::rules::{Fact, FactId, KeyPart, KeySource};

/// Segments of an `attribute` path, and of a `jwt_claim` path.
pub const MAX_ATTRIBUTE_SEGMENTS: usize = 10;
/// Where Envoy's `jwt_authn` filter puts verified payloads (`payload_in_metadata`).
pub const JWT_AUTHN_FILTER: &str = "envoy.filters.http.jwt_authn";
pub const DEFAULT_JWT_METADATA_KEY: &str = "jwt_payload";

/// Where `jwt_authn` put a verified claim (`payload_in_metadata` under `metadata_key`,
/// by default [`DEFAULT_JWT_METADATA_KEY`]), as an attribute path.
fn jwt_claim_path(claim: &ClaimPath, metadata_key: Option<&str>, at: &str) -> Result<Vec<String>> {
    let metadata_key = match metadata_key {
        Some("") => return Err(error(format!("{at}.jwt_metadata_key"), "must not be empty")),
        Some(key) => key,
        None => DEFAULT_JWT_METADATA_KEY,
    };
    let claim = segments(claim.0.clone(), &format!("{at}.jwt_claim"), "claim path")?;
    let mut path = vec![
        "metadata".to_string(),
        "filter_metadata".into(),
        JWT_AUTHN_FILTER.into(),
        metadata_key.to_string(),
    ];
    path.extend(claim);
    Ok(path)
}

/// The one source of a value read from the request for a limit: a header listed in
/// `trusted_headers` (clients cannot set it: Envoy removes it and an earlier filter
/// writes it), a verified JWT claim, or an attribute (dynamic metadata). Returns the fact
/// and whether it is an attribute (whose numbers Envoy hands over encoded).
pub(super) fn value_source(
    from: &RawLimitFrom,
    at: &str,
    facts: &mut Interner,
) -> Result<(FactId, bool)> {
    let (header, claim) = (from.header.as_deref(), from.jwt_claim.as_ref());
    let (metadata_key, attribute) = (from.jwt_metadata_key.as_deref(), from.attribute.as_deref());
    if metadata_key.is_some() && claim.is_none() {
        return Err(error(
            format!("{at}.jwt_metadata_key"),
            "only goes with `jwt_claim`",
        ));
    }
    let found: Vec<&str> = [
        ("header", header.is_some()),
        ("jwt_claim", claim.is_some()),
        ("attribute", attribute.is_some()),
    ]
    .into_iter()
    .filter(|(_, set)| *set)
    .map(|(name, _)| name)
    .collect();
    if found.len() != 1 {
        return Err(error(
            at,
            format!(
                "a value read from the request needs exactly one source out of header, \
                 jwt_claim, attribute; found {}",
                if found.is_empty() {
                    "none".to_string()
                } else {
                    and_list(&found)
                }
            ),
        ));
    }
    if let Some(header) = header {
        let at = format!("{at}.header");
        let name = header_name(header, &at, "a limit is read from a regular header")?;
        if !facts.trusts(&name) {
            return Err(error(
                at,
                format!(
                    "{} is not in `trusted_headers`: a client could set it and raise its own \
                     limit. List it there only once Envoy removes it from requests and a filter \
                     before weir writes it (docs/configuration.md, \"Limits from the request\")",
                    quoted(&name)
                ),
            ));
        }
        return Ok((facts.intern(Fact::Header(name), &at)?, false));
    }
    let path = match (claim, attribute) {
        (Some(claim), _) => jwt_claim_path(claim, metadata_key, at)?,
        (None, Some(path)) => {
            segments(path.to_vec(), &format!("{at}.attribute"), "attribute path")?
        }
        (None, None) => return Err(error(at, "internal error: no source")),
    };
    Ok((facts.intern(Fact::Property(path), at)?, true))
}

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
        let path = jwt_claim_path(&claim, raw.jwt_metadata_key.as_deref(), at)?;
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
