//! From the raw document to the runtime types: every value checked, every default
//! applied, every request fact interned.
//!
//! Checks run in document order (rule by rule, field by field) and the first failure
//! is the error, so fixing errors one at a time converges. Each error names the JSON
//! path of the field and quotes the value.

use super::error::{quoted, ConfigError};
use super::raw::{
    RawBody, RawBridge, RawConfig, RawCost, RawFailureMode, RawGlobal, RawHeaderMatch,
    RawHeaderStyle, RawLimit, RawMatch, RawPart, RawResponse, RawRule, RawScope, RawStringMatch,
};
use super::{BridgeSettings, Config};
use crate::algorithms::fixed_window::FixedWindow;
use crate::algorithms::gcra::Gcra;
use crate::algorithms::sliding_log::SlidingLog;
use crate::algorithms::sliding_window::SlidingWindow;
use crate::algorithms::token_bucket::TokenBucket;
use crate::algorithms::{AlgorithmKind, Limit, ParamError};
use crate::response::{CustomBody, HeaderStyle, ResponseSettings};
use crate::rules::{
    Cost, Fact, FactId, FactTable, FailureMode, GlobalRule, HeaderMatch, HeaderTest, KeyPart,
    KeySource, RequestMatch, Rule, Scope, StringMatch,
};
use crate::wire::{GlobalLimit, MAX_WANT};

/// Rules in one config: each costs a match and possibly a slot table per request.
pub const MAX_RULES: usize = 64;
pub const MAX_RULE_NAME_CHARS: usize = crate::wire::MAX_NAME_BYTES;
pub const MAX_KEY_PARTS: usize = 16;
pub const MAX_HEADER_MATCHES: usize = 16;
/// For `default` and `static` key values.
pub const MAX_KEY_VALUE_BYTES: usize = 256;
/// Segments of an `attribute` path, and of a `jwt_claim` path.
pub const MAX_ATTRIBUTE_SEGMENTS: usize = 10;
pub const MAX_BODY_BYTES: usize = 4096;
pub const DEFAULT_MAX_KEYS: u32 = 10_000;
pub const MAX_MAX_KEYS: u32 = 1_000_000;
pub const DEFAULT_STATUS: u16 = 429;
/// Where Envoy's `jwt_authn` filter puts verified payloads (`payload_in_metadata`).
pub const JWT_AUTHN_FILTER: &str = "envoy.filters.http.jwt_authn";
pub const DEFAULT_JWT_METADATA_KEY: &str = "jwt_payload";
pub const DEFAULT_BRIDGE_TIMEOUT_US: u64 = 50_000;
pub const MAX_BRIDGE_TIMEOUT_US: u64 = 10_000_000;
pub const DEFAULT_DOMAIN: &str = "weir";
pub const DEFAULT_LEASE_TTL_US: u64 = 1_000_000;
pub const MAX_LEASE_TTL_US: u64 = 3_600_000_000;
pub const MAX_EXPECTED_INSTANCES: u64 = 10_000;
/// For the bridge's cluster name, authority and secret.
pub const MAX_BRIDGE_TEXT_BYTES: usize = 256;

const NAME_RULE: &str = "use A-Z, a-z, 0-9, \"_\" and \"-\"";
const KEY_SOURCES: [&str; 8] = [
    "header",
    "client_ip",
    "path",
    "method",
    "query_param",
    "jwt_claim",
    "attribute",
    "static",
];

type Result<T> = std::result::Result<T, ConfigError>;

fn error(path: impl Into<String>, message: impl Into<String>) -> ConfigError {
    ConfigError::new(path, message)
}

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
    };
    let has_bridge = raw.bridge.is_some();
    let mut rules: Vec<Rule> = Vec::with_capacity(raw.rules.len());
    for (i, raw_rule) in raw.rules.into_iter().enumerate() {
        let at = format!("rules[{i}]");
        let name = rule_name(&raw_rule.name, &format!("{at}.name"))?;
        if let Some(first) = rules.iter().position(|rule| rule.name == name) {
            return Err(error(
                format!("{at}.name"),
                format!(
                    "duplicate rule name {}: rules[{first}] has the same name",
                    quoted(&name)
                ),
            ));
        }
        rules.push(compile_rule(name, raw_rule, &at, has_bridge, &mut facts)?);
    }
    let response = compile_response(raw.response)?;
    let bridge = raw.bridge.map(compile_bridge).transpose()?;
    Ok(Config {
        rules,
        facts: facts.table,
        response,
        bridge,
    })
}

/// Assigns fact ids, turning the (theoretical) table overflow into an error.
struct Interner {
    table: FactTable,
}

impl Interner {
    fn intern(&mut self, fact: Fact, at: &str) -> Result<FactId> {
        self.table
            .intern(fact)
            .ok_or_else(|| error(at, "too many distinct request facts in one configuration"))
    }
}

fn rule_name(name: &str, at: &str) -> Result<String> {
    checked_name(name, at, "rule name")
}

/// A name that goes into stat names and keys: `[A-Za-z0-9_-]{1,64}`.
fn checked_name(name: &str, at: &str, what: &str) -> Result<String> {
    if name.is_empty() {
        return Err(error(at, format!("the {what} is empty; {NAME_RULE}")));
    }
    if let Some(bad) = name
        .chars()
        .find(|&c| !u8::try_from(c).is_ok_and(crate::wire::is_name_byte))
    {
        return Err(error(
            at,
            format!(
                "invalid {what} {}: {} is not allowed; {NAME_RULE}",
                quoted(name),
                quoted(&bad.to_string())
            ),
        ));
    }
    if name.len() > MAX_RULE_NAME_CHARS {
        return Err(error(
            at,
            format!(
                "{what} {} is {} characters long; at most {MAX_RULE_NAME_CHARS} are allowed",
                quoted(name),
                name.len()
            ),
        ));
    }
    Ok(name.to_string())
}

fn compile_rule(
    name: String,
    raw: RawRule,
    at: &str,
    has_bridge: bool,
    facts: &mut Interner,
) -> Result<Rule> {
    let matcher = match raw.matcher {
        Some(m) => compile_match(m, &format!("{at}.match"), facts)?,
        None => RequestMatch::default(),
    };
    let key = compile_key(raw.key.unwrap_or_default(), &format!("{at}.key"), facts)?;
    let spec = compile_limit(&raw.limit, &format!("{at}.limit"))?;
    let scope = compile_scope(
        spec,
        raw.scope.unwrap_or(RawScope::Local),
        raw.global,
        has_bridge,
        at,
    )?;
    let max_cost = match &scope {
        Scope::Local(limit) => limit.max_cost(),
        Scope::Global(global) => global.limit.max_cost(),
    };
    let cost = compile_cost(raw.cost, max_cost, &format!("{at}.cost"), facts)?;
    let max_keys = match raw.max_keys {
        None => DEFAULT_MAX_KEYS,
        Some(n) => u32::try_from(n)
            .ok()
            .filter(|n| (1..=MAX_MAX_KEYS).contains(n))
            .ok_or_else(|| {
                error(
                    format!("{at}.max_keys"),
                    format!("{n} is out of range: expected 1 to {MAX_MAX_KEYS}"),
                )
            })?,
    };
    Ok(Rule {
        name,
        matcher,
        key,
        cost,
        scope,
        shadow: raw.shadow.unwrap_or(false),
        max_keys,
    })
}

/// What a rule counts with, before the scope decides where it can run.
enum LimitSpec {
    /// Fixed-size state: runs in shared data, and in Redis for global rules.
    Slot(Limit),
    /// One entry per event: Redis only.
    SlidingLog(SlidingLog),
}

fn compile_scope(
    spec: LimitSpec,
    scope: RawScope,
    global: Option<RawGlobal>,
    has_bridge: bool,
    at: &str,
) -> Result<Scope> {
    match scope {
        RawScope::Local => {
            if global.is_some() {
                return Err(error(
                    format!("{at}.global"),
                    "only rules with \"scope\": \"global\" take global settings",
                ));
            }
            match spec {
                LimitSpec::Slot(limit) => Ok(Scope::Local(limit)),
                LimitSpec::SlidingLog(_) => Err(error(
                    format!("{at}.limit.algorithm"),
                    "sliding_log keeps one entry per event and runs only in Redis; use it with \
                     \"scope\": \"global\", or use sliding_window locally",
                )),
            }
        }
        RawScope::Global => {
            if !has_bridge {
                return Err(error(
                    format!("{at}.scope"),
                    "global rules need the top-level \"bridge\" settings (the Envoy cluster \
                     of weir-bridge)",
                ));
            }
            let limit = match spec {
                LimitSpec::Slot(limit) => GlobalLimit::Slot(limit),
                LimitSpec::SlidingLog(log) => GlobalLimit::Log(log),
            };
            compile_global(limit, global, &format!("{at}.global")).map(Scope::Global)
        }
    }
}

fn compile_global(limit: GlobalLimit, raw: Option<RawGlobal>, at: &str) -> Result<GlobalRule> {
    let (lease, failure_mode, instances) = match raw {
        Some(g) => (g.lease, g.failure_mode, g.expected_instances),
        None => (None, None, None),
    };
    let expected_instances = match instances {
        None => 1,
        Some(n) if (1..=MAX_EXPECTED_INSTANCES).contains(&n) => n,
        Some(n) => {
            return Err(error(
                format!("{at}.expected_instances"),
                format!("{n} is out of range: expected 1 to {MAX_EXPECTED_INSTANCES}"),
            ))
        }
    };
    let (lease_max, lease_ttl_us) = match lease {
        None => (1, DEFAULT_LEASE_TTL_US),
        Some(lease) => {
            let max = lease.max.unwrap_or(1);
            let most = limit.max_cost().min(MAX_WANT);
            if max == 0 || max > most {
                return Err(error(
                    format!("{at}.lease.max"),
                    format!("{max} is out of range: expected 1 to {most} (what the limit admits at once)"),
                ));
            }
            let ttl = match lease.ttl {
                None => DEFAULT_LEASE_TTL_US,
                Some(ttl) if ttl.us <= MAX_LEASE_TTL_US => ttl.us,
                Some(ttl) => {
                    return Err(error(
                        format!("{at}.lease.ttl"),
                        format!("{} is longer than 1h", quoted(&ttl.text)),
                    ))
                }
            };
            (max, ttl)
        }
    };
    let failure_mode = match failure_mode.unwrap_or(RawFailureMode::Allow) {
        RawFailureMode::Allow => FailureMode::Allow,
        RawFailureMode::Deny => FailureMode::Deny,
        RawFailureMode::Local => {
            let share = limit.local_share(expected_instances).map_err(|e| {
                error(
                    format!("{at}.expected_instances"),
                    format!("the limit cannot be divided by {expected_instances}: {e}"),
                )
            })?;
            FailureMode::Local(share)
        }
    };
    Ok(GlobalRule {
        limit,
        lease_max,
        lease_ttl_us,
        failure_mode,
        expected_instances,
    })
}

fn compile_bridge(raw: RawBridge) -> Result<BridgeSettings> {
    let text = |value: String, at: &str, what: &str| -> Result<String> {
        let printable = value.bytes().all(|b| (0x21..0x7f).contains(&b));
        if value.is_empty() || value.len() > MAX_BRIDGE_TEXT_BYTES || !printable {
            return Err(error(
                at,
                format!(
                    "invalid {what} {}: expected 1 to {MAX_BRIDGE_TEXT_BYTES} printable ASCII characters without spaces",
                    quoted(&value)
                ),
            ));
        }
        Ok(value)
    };
    let cluster = text(raw.cluster, "bridge.cluster", "cluster name")?;
    let authority = match raw.authority {
        Some(authority) => {
            let authority = text(authority, "bridge.authority", "authority")?;
            let host_chars = |c: char| {
                c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | ':' | '[' | ']')
            };
            if !authority.chars().all(host_chars) {
                return Err(error(
                    "bridge.authority",
                    format!(
                        "invalid authority {}: expected a host name, with an optional :port",
                        quoted(&authority)
                    ),
                ));
            }
            authority
        }
        None => default_authority(&cluster),
    };
    let secret = raw
        .secret
        .map(|s| text(s, "bridge.secret", "secret"))
        .transpose()?;
    let secret_env = raw
        .secret_env
        .map(|s| text(s, "bridge.secret_env", "environment variable name"))
        .transpose()?;
    if secret.is_some() && secret_env.is_some() {
        return Err(error(
            "bridge.secret_env",
            "give the secret either inline (`secret`) or from the environment (`secret_env`), not both",
        ));
    }
    let timeout_us = match raw.timeout {
        None => DEFAULT_BRIDGE_TIMEOUT_US,
        Some(t) if t.us >= 1_000 && t.us <= MAX_BRIDGE_TIMEOUT_US => t.us,
        Some(t) => {
            return Err(error(
                "bridge.timeout",
                format!("{} is out of range: expected 1ms to 10s", quoted(&t.text)),
            ))
        }
    };
    let domain = match raw.domain {
        None => DEFAULT_DOMAIN.to_string(),
        Some(domain) => checked_name(&domain, "bridge.domain", "domain")?,
    };
    Ok(BridgeSettings {
        cluster,
        authority,
        timeout_ms: timeout_us / 1_000,
        secret,
        secret_env,
        domain,
    })
}

/// The `:authority` of bridge calls when none is configured: the host of an Istio
/// outbound cluster name (`outbound|8081||weir-bridge.weir.svc.cluster.local`), else the
/// cluster name itself. (`|` is not valid in an authority: Envoy would answer 400.)
fn default_authority(cluster: &str) -> String {
    let parts: Vec<&str> = cluster.split('|').collect();
    match parts.as_slice() {
        ["outbound" | "inbound", port, _subset, host] if !host.is_empty() => {
            format!("{host}:{port}")
        }
        _ => cluster.to_string(),
    }
}

/// The parameters each algorithm takes: required ones, then optional ones.
fn parameters(kind: AlgorithmKind) -> (&'static [&'static str], &'static [&'static str]) {
    match kind {
        AlgorithmKind::Gcra => (&["rate", "period"], &["burst"]),
        AlgorithmKind::TokenBucket => (&["capacity", "refill", "period"], &[]),
        AlgorithmKind::FixedWindow | AlgorithmKind::SlidingWindow | AlgorithmKind::SlidingLog => {
            (&["limit", "window"], &[])
        }
    }
}

fn describe_parameters(kind: AlgorithmKind) -> String {
    let (required, optional) = parameters(kind);
    let mut text = format!("{kind} takes {}", and_list(required));
    if !optional.is_empty() {
        text.push_str(" and optionally ");
        text.push_str(&and_list(optional));
    }
    text
}

fn compile_limit(raw: &RawLimit, at: &str) -> Result<LimitSpec> {
    let Some(kind) = AlgorithmKind::from_name(&raw.algorithm) else {
        let names: Vec<&str> = AlgorithmKind::ALL.iter().map(|k| k.name()).collect();
        return Err(error(
            format!("{at}.algorithm"),
            format!(
                "unknown algorithm {}: expected one of {}",
                quoted(&raw.algorithm),
                names.join(", ")
            ),
        ));
    };
    let present = [
        ("rate", raw.rate.is_some()),
        ("period", raw.period.is_some()),
        ("burst", raw.burst.is_some()),
        ("capacity", raw.capacity.is_some()),
        ("refill", raw.refill.is_some()),
        ("limit", raw.limit.is_some()),
        ("window", raw.window.is_some()),
    ];
    let (required, optional) = parameters(kind);
    for (field, is_present) in present {
        if is_present && !required.contains(&field) && !optional.contains(&field) {
            return Err(error(
                format!("{at}.{field}"),
                format!(
                    "`{field}` is not a parameter of {kind}; {}",
                    describe_parameters(kind)
                ),
            ));
        }
    }
    let need = |value: Option<u64>, field: &str| {
        value.ok_or_else(|| {
            error(
                at,
                format!("missing field `{field}`; {}", describe_parameters(kind)),
            )
        })
    };
    let need_us = |value: &Option<super::raw::RawDuration>, field: &str| {
        need(value.as_ref().map(|d| d.us), field)
    };
    let param = |e: ParamError| param_error(e, raw, at);
    let limit = match kind {
        AlgorithmKind::Gcra => {
            let rate = need(raw.rate, "rate")?;
            let period_us = need_us(&raw.period, "period")?;
            Limit::Gcra(Gcra::new(raw.burst.unwrap_or(0), rate, period_us).map_err(param)?)
        }
        AlgorithmKind::TokenBucket => {
            let capacity = need(raw.capacity, "capacity")?;
            let refill = need(raw.refill, "refill")?;
            let period_us = need_us(&raw.period, "period")?;
            Limit::TokenBucket(TokenBucket::new(capacity, refill, period_us).map_err(param)?)
        }
        AlgorithmKind::FixedWindow => {
            let limit = need(raw.limit, "limit")?;
            let window_us = need_us(&raw.window, "window")?;
            Limit::FixedWindow(FixedWindow::new(limit, window_us).map_err(param)?)
        }
        AlgorithmKind::SlidingWindow => {
            let limit = need(raw.limit, "limit")?;
            let window_us = need_us(&raw.window, "window")?;
            Limit::SlidingWindow(SlidingWindow::new(limit, window_us).map_err(param)?)
        }
        AlgorithmKind::SlidingLog => {
            let limit = need(raw.limit, "limit")?;
            let window_us = need_us(&raw.window, "window")?;
            return Ok(LimitSpec::SlidingLog(
                SlidingLog::new(limit, window_us).map_err(param)?,
            ));
        }
    };
    Ok(LimitSpec::Slot(limit))
}

/// `rules[i].limit.<field>: invalid value <value>: <reason>`.
fn param_error(e: ParamError, raw: &RawLimit, at: &str) -> ConfigError {
    let number = |v: Option<u64>| v.map(|n| n.to_string());
    let duration = |d: &Option<super::raw::RawDuration>| d.as_ref().map(|d| quoted(&d.text));
    let value = match e.field {
        "rate" => number(raw.rate),
        "burst" => number(raw.burst.or(Some(0))),
        "capacity" => number(raw.capacity),
        "refill" => number(raw.refill),
        "limit" => number(raw.limit),
        "period" => duration(&raw.period),
        "window" => duration(&raw.window),
        _ => None,
    };
    let message = match value {
        Some(value) => format!("invalid value {value}: {}", e.reason),
        None => e.reason,
    };
    error(format!("{at}.{}", e.field), message)
}

fn compile_match(raw: RawMatch, at: &str, facts: &mut Interner) -> Result<RequestMatch> {
    let mut matcher = RequestMatch::default();
    if let Some(path) = raw.path {
        let at = format!("{at}.path");
        let (kind, value) = exactly_one(path, &at)?;
        let at = format!("{at}.{kind}");
        if value.is_empty() {
            return Err(error(at, "must not be empty"));
        }
        if kind != "suffix" && !value.starts_with('/') {
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
        matcher.path = Some((fact, string_match(kind, value)));
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
        let at = format!("{at}.{kind}");
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
        matcher.authority = Some((fact, string_match(kind, value.to_ascii_lowercase())));
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

/// The one field set among `exact`, `prefix`, `suffix`.
fn exactly_one(raw: RawStringMatch, at: &str) -> Result<(&'static str, String)> {
    let mut set: Vec<(&'static str, String)> = [
        ("exact", raw.exact),
        ("prefix", raw.prefix),
        ("suffix", raw.suffix),
    ]
    .into_iter()
    .filter_map(|(kind, value)| value.map(|v| (kind, v)))
    .collect();
    match set.len() {
        1 => set.pop().ok_or_else(|| error(at, "internal error")),
        n => {
            let kinds: Vec<&str> = set.iter().map(|(kind, _)| *kind).collect();
            Err(error(
                at,
                format!(
                    "expected exactly one of `exact`, `prefix`, `suffix`; found {}",
                    if n == 0 {
                        "none".to_string()
                    } else {
                        and_list(&kinds)
                    }
                ),
            ))
        }
    }
}

fn string_match(kind: &str, value: String) -> StringMatch {
    match kind {
        "exact" => StringMatch::Exact(value.into_bytes()),
        "prefix" => StringMatch::Prefix(value.into_bytes()),
        _ => StringMatch::Suffix(value.into_bytes()),
    }
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
            HeaderTest::Is(StringMatch::Exact(value.into_bytes())),
        ));
    }
    for (kind, value) in [("prefix", raw.prefix), ("suffix", raw.suffix)] {
        if let Some(value) = value {
            if value.is_empty() {
                return Err(error(
                    format!("{at}.{kind}"),
                    "an empty value matches every value; use \"present\": true",
                ));
            }
            tests.push((kind, HeaderTest::Is(string_match(kind, value))));
        }
    }
    if let Some(present) = raw.present {
        tests.push((
            "present",
            if present {
                HeaderTest::Present
            } else {
                HeaderTest::Absent
            },
        ));
    }
    if tests.len() != 1 {
        let kinds: Vec<&str> = tests.iter().map(|(kind, _)| *kind).collect();
        return Err(error(
            at,
            format!(
                "expected exactly one of `exact`, `prefix`, `suffix`, `present`; found {}",
                if kinds.is_empty() {
                    "none".to_string()
                } else {
                    and_list(&kinds)
                }
            ),
        ));
    }
    let Some((_, test)) = tests.pop() else {
        return Err(error(at, "internal error"));
    };
    let fact = facts.intern(Fact::Header(name.clone()), at)?;
    Ok(HeaderMatch { name, fact, test })
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

fn compile_key(parts: Vec<RawPart>, at: &str, facts: &mut Interner) -> Result<Vec<KeyPart>> {
    if parts.len() > MAX_KEY_PARTS {
        return Err(error(
            at,
            format!("{} parts; at most {MAX_KEY_PARTS} are allowed", parts.len()),
        ));
    }
    parts
        .into_iter()
        .enumerate()
        .map(|(j, part)| compile_part(part, &format!("{at}[{j}]"), facts))
        .collect()
}

fn compile_part(mut raw: RawPart, at: &str, facts: &mut Interner) -> Result<KeyPart> {
    if raw.jwt_metadata_key.is_some() && raw.jwt_claim.is_none() {
        return Err(error(
            format!("{at}.jwt_metadata_key"),
            "only goes with `jwt_claim`",
        ));
    }
    let present = [
        raw.header.is_some(),
        raw.client_ip.is_some(),
        raw.path.is_some(),
        raw.method.is_some(),
        raw.query_param.is_some(),
        raw.jwt_claim.is_some(),
        raw.attribute.is_some(),
        raw.static_value.is_some(),
    ];
    let found: Vec<&str> = KEY_SOURCES
        .iter()
        .zip(present)
        .filter(|(_, is)| *is)
        .map(|(name, _)| *name)
        .collect();
    if found.len() != 1 {
        return Err(error(
            at,
            format!(
                "a key part needs exactly one source out of {}; found {}",
                KEY_SOURCES.join(", "),
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

fn compile_cost(
    raw: Option<RawCost>,
    max_cost: u64,
    at: &str,
    facts: &mut Interner,
) -> Result<Cost> {
    let never = |cost: u64| {
        format!("{cost} can never be admitted: the limit allows at most {max_cost} at once")
    };
    match raw {
        None => Ok(Cost::Fixed(1)),
        Some(RawCost::Fixed(cost)) if cost > max_cost => Err(error(at, never(cost))),
        Some(RawCost::Fixed(cost)) => Ok(Cost::Fixed(cost)),
        Some(RawCost::Header(header)) => {
            let at_header = format!("{at}.header");
            let name = header_name(
                &header.header,
                &at_header,
                "the cost comes from a regular header",
            )?;
            let max = match header.max {
                Some(0) => {
                    return Err(error(
                        format!("{at}.max"),
                        "invalid value 0: must be at least 1",
                    ))
                }
                Some(max) if max > max_cost => return Err(error(format!("{at}.max"), never(max))),
                Some(max) => max,
                None => max_cost,
            };
            let default = header.default.unwrap_or(1);
            if default > max {
                let message = match header.max {
                    Some(_) => format!("{default} is above `max` ({max})"),
                    None => never(default),
                };
                return Err(error(format!("{at}.default"), message));
            }
            let fact = facts.intern(Fact::Header(name), &at_header)?;
            Ok(Cost::Header { fact, default, max })
        }
    }
}

fn compile_response(raw: Option<RawResponse>) -> Result<ResponseSettings> {
    let defaults = ResponseSettings::default();
    let Some(raw) = raw else {
        return Ok(defaults);
    };
    let status = match raw.status {
        None => DEFAULT_STATUS,
        Some(status) => u16::try_from(status)
            .ok()
            .filter(|s| (400..=599).contains(s))
            .ok_or_else(|| {
                error(
                    "response.status",
                    format!("{status} is out of range: expected an error status from 400 to 599"),
                )
            })?,
    };
    let header_style = match raw.header_style {
        None => defaults.header_style,
        Some(RawHeaderStyle::Ietf) => HeaderStyle::Ietf,
        Some(RawHeaderStyle::Legacy) => HeaderStyle::Legacy,
        Some(RawHeaderStyle::None) => HeaderStyle::None,
    };
    let body = raw.body.map(compile_body).transpose()?;
    let shadow_header = raw
        .shadow_header
        .map(|name| {
            header_name(
                &name,
                "response.shadow_header",
                "a response header cannot be a pseudo-header",
            )
        })
        .transpose()?;
    Ok(ResponseSettings {
        status,
        header_style,
        headers_on_allowed: raw
            .headers_on_allowed
            .unwrap_or(defaults.headers_on_allowed),
        body,
        shadow_header,
    })
}

fn compile_body(raw: RawBody) -> Result<CustomBody> {
    let at = "response.body.content_type";
    if raw.content_type.is_empty() {
        return Err(error(at, "must not be empty"));
    }
    if raw
        .content_type
        .chars()
        .any(|c| c.is_control() || !c.is_ascii())
    {
        return Err(error(
            at,
            format!(
                "{} is not a valid header value: use printable ASCII",
                quoted(&raw.content_type)
            ),
        ));
    }
    let at = "response.body.text";
    if raw.text.is_empty() {
        return Err(error(at, "must not be empty"));
    }
    if raw.text.len() > MAX_BODY_BYTES {
        return Err(error(
            at,
            format!(
                "{} bytes; at most {MAX_BODY_BYTES} are allowed",
                raw.text.len()
            ),
        ));
    }
    Ok(CustomBody {
        content_type: raw.content_type,
        text: raw.text,
    })
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
