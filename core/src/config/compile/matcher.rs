//! A rule's `match`: path, methods, headers and authority.

use super::{error, exactly_one_message, header_name, Interner, Result};
use crate::config::raw::{RawHeaderMatch, RawMatch, RawStringMatch};
use crate::field_error::quoted;
use crate::rules::{Fact, HeaderMatch, HeaderTest, RequestMatch, StringMatch};

/// Header conditions in one `match`.
pub const MAX_HEADER_MATCHES: usize = 16;

#[inline(never)] // a wasm function of its own: see `compile::compile`
pub(super) fn compile(raw: RawMatch, at: &str, facts: &mut Interner) -> Result<RequestMatch> {
    let mut matcher = RequestMatch::default();
    if let Some(path) = raw.path {
        let at = format!("{at}.path");
        let (kind, value) = exactly_one(path, &at)?;
        let at = format!("{at}.{}", kind.name());
        if value.is_empty() {
            return Err(error(at, "must not be empty"));
        }
        if kind != MatchKind::Suffix && !value.starts_with('/') {
            return Err(error(
                at,
                format!("{} does not start with \"/\"", quoted(&value)),
            ));
        }
        if value.contains('?') {
            return Err(error(
                at,
                format!(
                    "{} contains \"?\": paths are matched without their query string",
                    quoted(&value)
                ),
            ));
        }
        let fact = facts.intern(Fact::Header(":path".into()), &at)?;
        matcher.path = Some((fact, kind.with(value.into_bytes())));
    }
    if let Some(methods) = raw.methods {
        let at = format!("{at}.methods");
        if methods.is_empty() {
            return Err(error(
                at,
                "the list is empty; name at least one method or leave out `methods`",
            ));
        }
        for (j, method) in methods.into_iter().enumerate() {
            let bytes = method_name(&method, &format!("{at}[{j}]"))?;
            if !matcher.methods.contains(&bytes) {
                matcher.methods.push(bytes);
            }
        }
        matcher.method_fact = Some(facts.intern(Fact::Header(":method".into()), &at)?);
    }
    if let Some(headers) = raw.headers {
        let at = format!("{at}.headers");
        if headers.len() > MAX_HEADER_MATCHES {
            return Err(error(
                at,
                format!(
                    "{} entries; at most {MAX_HEADER_MATCHES} are allowed",
                    headers.len()
                ),
            ));
        }
        for (j, header) in headers.into_iter().enumerate() {
            matcher
                .headers
                .push(header_match(header, &format!("{at}[{j}]"), facts)?);
        }
    }
    if let Some(authority) = raw.authority {
        let at = format!("{at}.authority");
        let (kind, value) = exactly_one(authority, &at)?;
        let at = format!("{at}.{}", kind.name());
        if value.is_empty() {
            return Err(error(at, "must not be empty"));
        }
        if value.contains(':') && !value.contains(']') {
            return Err(error(
                at,
                format!(
                    "{} has a port: the authority is matched without its port",
                    quoted(&value)
                ),
            ));
        }
        let fact = facts.intern(Fact::Header(":authority".into()), &at)?;
        matcher.authority = Some((fact, kind.with(value.to_ascii_lowercase().into_bytes())));
    }
    Ok(matcher)
}

fn method_name(method: &str, at: &str) -> Result<Vec<u8>> {
    if method.is_empty() {
        return Err(error(at, "must not be empty"));
    }
    if method.bytes().all(|b| b.is_ascii_uppercase()) {
        return Ok(method.as_bytes().to_vec());
    }
    if method.bytes().all(|b| b.is_ascii_alphabetic()) {
        return Err(error(
            at,
            format!(
                "{} is not uppercase: methods are case-sensitive; write {}",
                quoted(method),
                quoted(&method.to_ascii_uppercase())
            ),
        ));
    }
    Err(error(
        at,
        format!(
            "{} is not a method name: expected uppercase letters A-Z",
            quoted(method)
        ),
    ))
}

/// How a configured string is compared: the three ways `path`, `authority` and header
/// matches share.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum MatchKind {
    Exact,
    Prefix,
    Suffix,
}

impl MatchKind {
    /// The config's field name.
    fn name(self) -> &'static str {
        match self {
            MatchKind::Exact => "exact",
            MatchKind::Prefix => "prefix",
            MatchKind::Suffix => "suffix",
        }
    }

    fn with(self, value: Vec<u8>) -> StringMatch {
        match self {
            MatchKind::Exact => StringMatch::Exact(value),
            MatchKind::Prefix => StringMatch::Prefix(value),
            MatchKind::Suffix => StringMatch::Suffix(value),
        }
    }
}

/// The one field set among `exact`, `prefix`, `suffix`.
fn exactly_one(raw: RawStringMatch, at: &str) -> Result<(MatchKind, String)> {
    let mut set: Vec<(MatchKind, String)> = [
        (MatchKind::Exact, raw.exact),
        (MatchKind::Prefix, raw.prefix),
        (MatchKind::Suffix, raw.suffix),
    ]
    .into_iter()
    .filter_map(|(kind, value)| value.map(|v| (kind, v)))
    .collect();
    if set.len() == 1 {
        if let Some(one) = set.pop() {
            return Ok(one);
        }
    }
    let kinds: Vec<&str> = set.iter().map(|(kind, _)| kind.name()).collect();
    Err(error(
        at,
        exactly_one_message("`exact`, `prefix`, `suffix`", &kinds),
    ))
}

fn header_match(raw: RawHeaderMatch, at: &str, facts: &mut Interner) -> Result<HeaderMatch> {
    let name = header_name(
        &raw.name,
        &format!("{at}.name"),
        "match it with \"path\", \"methods\" or \"authority\"",
    )?;
    let mut tests: Vec<(&'static str, HeaderTest)> = Vec::new();
    if let Some(value) = raw.exact {
        tests.push((
            "exact",
            HeaderTest::Is(MatchKind::Exact.with(value.into_bytes())),
        ));
    }
    for (kind, value) in [
        (MatchKind::Prefix, raw.prefix),
        (MatchKind::Suffix, raw.suffix),
    ] {
        if let Some(value) = value {
            if value.is_empty() {
                return Err(error(
                    format!("{at}.{}", kind.name()),
                    "an empty value matches every value; use \"present\": true",
                ));
            }
            tests.push((kind.name(), HeaderTest::Is(kind.with(value.into_bytes()))));
        }
    }
    if let Some(present) = raw.present {
        let test = if present {
            HeaderTest::Present
        } else {
            HeaderTest::Absent
        };
        tests.push(("present", test));
    }
    let test = match tests.len() {
        1 => tests.pop().map(|(_, test)| test),
        _ => None,
    };
    let Some(test) = test else {
        let kinds: Vec<&str> = tests.iter().map(|(kind, _)| *kind).collect();
        return Err(error(
            at,
            exactly_one_message("`exact`, `prefix`, `suffix`, `present`", &kinds),
        ));
    };
    let fact = facts.intern(Fact::Header(name.clone()), at)?;
    Ok(HeaderMatch { name, fact, test })
}
