//! From the raw document to the runtime types: every value checked, every default
//! applied, every request fact interned.
//!
//! Checks run in document order (rule by rule, field by field) and the first failure
//! is the error, so fixing errors one at a time converges. Each error names the JSON
//! path of the field and quotes the value. One module per concern: [`rule`] (names,
//! scope, global settings, `max_keys`), [`limit`] (an algorithm and its parameters),
//! [`matcher`] (`match`), [`key`] (key parts), [`cost`], [`delay`] (`on_limit.delay`),
//! [`share`], [`bridge`], [`response`].

mod bridge_settings;
mod cost;
mod delay;
mod key;
mod limit;
mod matcher;
mod response;
mod rule;
mod share;

use super::raw::RawConfig;
use super::Config;
use crate::bounds::MAX_RULES;
use crate::buffers::{DEFAULT_MAX_BUFFERED_BYTES, MAX_MAX_BUFFERED_BYTES, MIN_MAX_BUFFERED_BYTES};
use crate::field_error::{quoted, FieldError};
use crate::rules::{Fact, FactId, FactTable, Rule, RuleId};

pub const DEFAULT_MAX_KEYS: u32 = 10_000;
pub const MAX_MAX_KEYS: u32 = 1_000_000;

type Result<T> = std::result::Result<T, FieldError>;

fn error(path: impl Into<String>, message: impl Into<String>) -> FieldError {
    FieldError::new(path, message)
}

/// The config as the engine runs it, or the first field that is wrong.
///
/// Runs once per configure, and its parts are `#[inline(never)]`: inlined into one another
/// they made `rule::compile` a 38 KB wasm function that took V8's optimizing compiler 108 ms
/// of weir.wasm's 689 (measured 2026-11-29 as `config::raw::object_only!` says), and Envoy
/// compiles every function at every start and every new VM.
pub(super) fn compile(raw: RawConfig) -> Result<Config> {
    if raw.rules.is_empty() {
        return Err(error(
            "rules",
            "the list is empty; at least one rule is required",
        ));
    }
    if raw.rules.len() > MAX_RULES {
        return Err(error(
            "rules",
            format!("{} rules; at most {MAX_RULES} are allowed", raw.rules.len()),
        ));
    }
    let mut facts = Interner {
        table: FactTable::default(),
        trusted_headers: trusted_headers(raw.trusted_headers)?,
    };
    // The bridge first: a leased global rule's hold pays for the bridge's timeout.
    let bridge = raw.bridge.map(bridge_settings::compile).transpose()?;
    let bridge_timeout_us = bridge.as_ref().map(|b| b.timeout_ms.saturating_mul(1_000));
    let mut rules: Vec<Rule> = Vec::with_capacity(raw.rules.len());
    for (i, raw_rule) in raw.rules.into_iter().enumerate() {
        let at = format!("rules[{i}]");
        let id = RuleId(u16::try_from(i).map_err(|_| error("rules", "too many rules"))?);
        let name = rule::name(&raw_rule.name, &format!("{at}.name"))?;
        if let Some(first) = rules.iter().find(|rule| rule.name == name) {
            return Err(error(
                format!("{at}.name"),
                format!(
                    "duplicate rule name {}: rules[{}] has the same name",
                    quoted(&name),
                    first.id.index()
                ),
            ));
        }
        rules.push(rule::compile(
            id,
            name,
            raw_rule,
            &at,
            bridge_timeout_us,
            &mut facts,
        )?);
    }
    let response = response::compile(raw.response)?;
    let max_buffered_bytes = match raw.max_buffered_bytes {
        None => DEFAULT_MAX_BUFFERED_BYTES,
        Some(n) if (MIN_MAX_BUFFERED_BYTES..=MAX_MAX_BUFFERED_BYTES).contains(&n) => n,
        Some(n) => {
            return Err(error(
                "max_buffered_bytes",
                format!(
                    "{n} is out of range: expected {MIN_MAX_BUFFERED_BYTES} (1 MiB) to \
                     {MAX_MAX_BUFFERED_BYTES} (1 GiB)"
                ),
            ))
        }
    };
    Ok(Config {
        rules,
        facts: facts.table,
        response,
        bridge,
        max_buffered_bytes,
        stats: raw.stats.unwrap_or_default(),
    })
}

/// Assigns fact ids, turning the (theoretical) table overflow into an error; and knows
/// which headers a rule may read a limit from.
struct Interner {
    table: FactTable,
    /// `trusted_headers`, lowercased.
    trusted_headers: Vec<String>,
}

/// Most headers `trusted_headers` lists.
pub const MAX_TRUSTED_HEADERS: usize = 16;

/// `trusted_headers`: regular header names, at most [`MAX_TRUSTED_HEADERS`].
fn trusted_headers(raw: Option<Vec<String>>) -> Result<Vec<String>> {
    let raw = raw.unwrap_or_default();
    if raw.len() > MAX_TRUSTED_HEADERS {
        return Err(error(
            "trusted_headers",
            format!(
                "{} headers; at most {MAX_TRUSTED_HEADERS} are allowed",
                raw.len()
            ),
        ));
    }
    raw.iter()
        .enumerate()
        .map(|(i, name)| {
            header_name(
                name,
                &format!("trusted_headers[{i}]"),
                "a limit is read from a regular header",
            )
        })
        .collect()
}

impl Interner {
    fn trusts(&self, header: &str) -> bool {
        self.trusted_headers.iter().any(|h| h == header)
    }

    fn intern(&mut self, fact: Fact, at: &str) -> Result<FactId> {
        self.table
            .intern(fact)
            .ok_or_else(|| error(at, "too many distinct request facts in one configuration"))
    }
}

/// A header name as a token (RFC 9110 §5.6.2), lowercased. Pseudo-headers are refused
/// with `pseudo_hint`, which says what to use instead.
fn header_name(name: &str, at: &str, pseudo_hint: &str) -> Result<String> {
    if name.is_empty() {
        return Err(error(at, "the header name is empty"));
    }
    if name.starts_with(':') {
        return Err(error(
            at,
            format!("{} is a pseudo-header; {pseudo_hint}", quoted(name)),
        ));
    }
    if let Some(bad) = name.chars().find(|&c| !is_token_char(c)) {
        return Err(error(
            at,
            format!(
                "invalid header name {}: {} is not allowed in a header name",
                quoted(name),
                quoted(&bad.to_string())
            ),
        ));
    }
    Ok(name.to_ascii_lowercase())
}

fn is_token_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c)
}

/// `` `a` ``, `` `a` and `b` ``, `` `a`, `b` and `c` ``.
fn and_list(names: &[&str]) -> String {
    let quoted: Vec<String> = names.iter().map(|name| format!("`{name}`")).collect();
    match quoted.split_last() {
        None => String::new(),
        Some((last, [])) => last.clone(),
        Some((last, rest)) => format!("{} and {last}", rest.join(", ")),
    }
}

/// "expected exactly one of `a`, `b`; found none" / "… found `a` and `b`".
fn exactly_one_message(allowed: &str, found: &[&str]) -> String {
    format!(
        "expected exactly one of {allowed}; found {}",
        if found.is_empty() {
            "none".to_string()
        } else {
            and_list(found)
        }
    )
}
