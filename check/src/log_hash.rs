//! Hashed logs: a replay log whose request values are replaced by a keyed hash, so it
//! can be kept and shared without the user ids, addresses and API keys it recorded.
//!
//! Envoy's access log cannot hash a value itself, so `weir-check log-hash` rewrites a
//! log recorded with [`crate::replay::log_format`]: every value under `headers` and
//! `attributes` becomes `hmac-<form>-<hex>`, the HMAC-SHA256 of the value keyed with a
//! salt only the operator holds, **except the facts a rule matches on, costs or reads a
//! deadline from** (a match on a hashed value cannot be evaluated): those stay in clear.
//! Equal values hash equal, so a rule keyed on a hashed fact counts the same keys and
//! decides as it did on the raw log.
//!
//! **Forms.** A key does not always read a value whole: `client_ip` strips the port of
//! `source.address`, `path` strips the query of `:path`. The hash is taken of what the
//! key reads ([`Form::prepare`]), and the form is written in the value (`v`, `ip`,
//! `path`), so a replay can tell whether a candidate reads a hashed fact the way it was
//! hashed ([`KeyRead::form`]) and refuse when not: a `client_ip` key over an address
//! hashed with its port would count every connection as its own client. A
//! `query_param` key reads a part of `:path` no hash keeps: a fact that one reads is
//! kept in clear, and a candidate's `query_param` over a hashed path is refused.
//! Hashed values contain no `:`, `[` or `?`, so stripping a port or a query leaves
//! them as they are. Empty values stay empty (a key's `default` applies to them).
//!
//! ```
//! use weir_check::log_hash::{hmac_sha256, Form, Salt};
//!
//! let salt = Salt::new(b"0123456789abcdef".to_vec()).unwrap();
//! let a = Form::ClientIp.hash(&salt, b"10.0.0.1:51000");
//! assert_eq!(a, Form::ClientIp.hash(&salt, b"10.0.0.1:51001"), "the port is not hashed");
//! assert!(a.starts_with("hmac-ip-"));
//! assert_eq!(Form::of(&a), Some(Form::ClientIp));
//! assert_eq!(hmac_sha256(b"k", b"m").len(), 32);
//! ```

use serde_json::Value;
use sha2::{Digest, Sha256};

use weir_core::config::Config;
use weir_core::key::hex;
use weir_core::rules::{path_only, strip_port, Cost, Fact, FactId, KeySource};

/// What every hashed value starts with.
pub const PREFIX: &str = "hmac-";

/// The fewest bytes of salt accepted.
pub const MIN_SALT_BYTES: usize = 16;

/// The key of the hash. Keep it secret: with it, anyone can test a guessed value.
pub struct Salt(Vec<u8>);

impl Salt {
    /// A salt file's bytes, one trailing newline removed; at least [`MIN_SALT_BYTES`].
    pub fn new(mut bytes: Vec<u8>) -> Result<Salt, String> {
        if bytes.last() == Some(&b'\n') {
            bytes.pop();
            if bytes.last() == Some(&b'\r') {
                bytes.pop();
            }
        }
        if bytes.len() < MIN_SALT_BYTES {
            return Err(format!(
                "{} bytes of salt: at least {MIN_SALT_BYTES} are needed (e.g. `head -c 32 \
                 /dev/urandom | base64 > salt`)",
                bytes.len()
            ));
        }
        Ok(Salt(bytes))
    }
}

/// HMAC-SHA256 (RFC 2104) of `message` keyed with `key`.
pub fn hmac_sha256(key: &[u8], message: &[u8]) -> [u8; 32] {
    const BLOCK: usize = 64;
    // A key longer than the block is hashed first; the rest of the block is zeros.
    let digest;
    let key = if key.len() > BLOCK {
        digest = Sha256::digest(key);
        digest.as_slice()
    } else {
        key
    };
    let mut block = [0u8; BLOCK];
    for (b, k) in block.iter_mut().zip(key) {
        *b = *k;
    }
    let pad = |byte: u8| block.map(|b| b ^ byte);
    let inner = Sha256::new()
        .chain_update(pad(0x36))
        .chain_update(message)
        .finalize();
    Sha256::new()
        .chain_update(pad(0x5c))
        .chain_update(inner)
        .finalize()
        .into()
}

/// Which part of a value a hash was taken of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Form {
    /// The whole value (a header, a JWT claim, the method).
    Value,
    /// An address without its port, as a `client_ip` key reads it.
    ClientIp,
    /// A path without its query, as a `path` key reads it.
    Path,
}

impl Form {
    const ALL: [Form; 3] = [Form::Value, Form::ClientIp, Form::Path];

    fn tag(self) -> &'static str {
        match self {
            Form::Value => "v",
            Form::ClientIp => "ip",
            Form::Path => "path",
        }
    }

    /// The part of `raw` that is hashed.
    pub fn prepare(self, raw: &[u8]) -> &[u8] {
        match self {
            Form::Value => raw,
            Form::ClientIp => strip_port(raw),
            Form::Path => path_only(raw),
        }
    }

    /// `hmac-<form>-<hex>` of what this form keeps of `raw`; empty stays empty.
    pub fn hash(self, salt: &Salt, raw: &[u8]) -> String {
        let kept = self.prepare(raw);
        if kept.is_empty() {
            return String::new();
        }
        format!(
            "{PREFIX}{}-{}",
            self.tag(),
            hex(&hmac_sha256(&salt.0, kept))
        )
    }

    /// The form of a hashed value; `None` for a value in clear.
    pub fn of(value: &str) -> Option<Form> {
        let rest = value.strip_prefix(PREFIX)?;
        Form::ALL.into_iter().find(|form| {
            rest.strip_prefix(form.tag())
                .and_then(|r| r.strip_prefix('-'))
                .is_some_and(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
        })
    }

    /// As the docs and messages say it.
    pub fn describe(self) -> &'static str {
        match self {
            Form::Value => "whole",
            Form::ClientIp => "without its port",
            Form::Path => "without its query",
        }
    }
}

/// How a key part reads its fact.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyRead {
    Whole,
    ClientIp,
    Path,
    QueryParam,
}

impl KeyRead {
    /// The form a hash must have for this read to see the same keys; `None`: no hash
    /// keeps what it reads.
    pub fn form(self) -> Option<Form> {
        match self {
            KeyRead::Whole => Some(Form::Value),
            KeyRead::ClientIp => Some(Form::ClientIp),
            KeyRead::Path => Some(Form::Path),
            KeyRead::QueryParam => None,
        }
    }
}

/// How a rule reads a fact.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Read {
    /// In its `match`.
    Match,
    /// As its cost.
    Cost,
    /// As a parameter of its limit (a tenant's own).
    Limit,
    /// As a key's weight in a shared limit (`share.weight`).
    Weight,
    /// As a request's deadline (a delaying rule).
    Deadline,
    Key(KeyRead),
}

impl Read {
    pub fn describe(self) -> &'static str {
        match self {
            Read::Match => "matches on it",
            Read::Cost => "reads its cost from it",
            Read::Limit => "reads its limit from it",
            Read::Weight => "reads a key's share weight from it",
            Read::Deadline => "reads a deadline from it",
            Read::Key(KeyRead::Whole) => "keys on it",
            Read::Key(KeyRead::ClientIp) => "keys on it as client_ip (without its port)",
            Read::Key(KeyRead::Path) => "keys on it as path (without its query)",
            Read::Key(KeyRead::QueryParam) => "keys on a query parameter of it",
        }
    }
}

/// Every read of `fact` by `config`'s rules: (rule name, read).
pub fn reads(config: &Config, fact: FactId) -> Vec<(String, Read)> {
    let mut out = Vec::new();
    for rule in &config.rules {
        let mut add = |read: Read| out.push((rule.name.clone(), read));
        let m = &rule.matcher;
        let matched = m.path.as_ref().map(|p| p.0) == Some(fact)
            || m.method_fact == Some(fact)
            || m.authority.as_ref().map(|a| a.0) == Some(fact)
            || m.headers.iter().any(|h| h.fact == fact);
        if matched {
            add(Read::Match);
        }
        if matches!(rule.cost, Cost::FromRequest { fact: f, .. } if f == fact) {
            add(Read::Cost);
        }
        if rule.limit_from.iter().any(|from| from.fact == fact) {
            add(Read::Limit);
        }
        let share = rule.share.as_ref();
        if share
            .and_then(|s| s.weight.as_ref())
            .is_some_and(|w| w.fact == fact)
        {
            add(Read::Weight);
        }
        if let Some(delay) = &rule.delay {
            if delay.deadline.grpc_timeout == fact || delay.deadline.expected_rq_timeout == fact {
                add(Read::Deadline);
            }
        }
        // A shared limit's key within its parent is a key like the rule's own.
        for part in rule.key.iter().chain(share.iter().flat_map(|s| &s.by)) {
            let read = match &part.source {
                KeySource::Header { fact: f }
                | KeySource::Method { fact: f }
                | KeySource::Attribute { fact: f }
                    if *f == fact =>
                {
                    KeyRead::Whole
                }
                KeySource::ClientIp { fact: f } if *f == fact => KeyRead::ClientIp,
                KeySource::Path { fact: f } if *f == fact => KeyRead::Path,
                KeySource::QueryParam { fact: f, .. } if *f == fact => KeyRead::QueryParam,
                _ => continue,
            };
            add(Read::Key(read));
        }
    }
    out
}

/// What `log-hash` does with one field of the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    Hash(Form),
    /// Kept in clear, with why (a rule and what it does with the fact).
    Clear(String),
}

/// The plan for one fact of the config: hashed in the one form its keys read it, or
/// kept in clear when a rule matches on it, reads its cost, its limit or a deadline from
/// it, a `query_param` key reads it, or keys read it in two forms.
pub fn plan(config: &Config, fact: FactId) -> Plan {
    let reads = reads(config, fact);
    let mut form = None;
    for (rule, read) in &reads {
        let clear = || Plan::Clear(format!("rule {rule} {}", read.describe()));
        let Read::Key(key) = read else {
            return clear();
        };
        let Some(wanted) = key.form() else {
            return clear();
        };
        match form {
            Some(f) if f != wanted => {
                return Plan::Clear(format!(
                    "rules key on it both {} and {}",
                    Form::describe(f),
                    wanted.describe()
                ))
            }
            _ => form = Some(wanted),
        }
    }
    Plan::Hash(form.unwrap_or(Form::Value))
}

/// Where a fact is in a log record: `("headers", name)` or `("attributes", path)`.
pub fn log_field(fact: &Fact) -> Option<(&'static str, String)> {
    match fact {
        Fact::Header(name) => Some(("headers", name.clone())),
        Fact::Property(path) => Some(("attributes", path.join("."))),
        Fact::RequestBodyEstimate(_) | Fact::RequestBodyPrompt(_) => None,
    }
}

/// The plan of every field of the log: the config's facts by [`plan`]; a field the
/// config does not read is hashed whole.
pub struct LogPlan {
    /// (section, field, plan), in the config's fact order.
    pub fields: Vec<(&'static str, String, Plan)>,
}

impl LogPlan {
    pub fn new(config: &Config) -> LogPlan {
        let fields = (0..config.facts.len())
            .filter_map(|at| {
                let id = FactId(u16::try_from(at).ok()?);
                let (section, name) = log_field(config.facts.get(id)?)?;
                Some((section, name, plan(config, id)))
            })
            .collect();
        LogPlan { fields }
    }

    fn plan(&self, section: &str, field: &str) -> &Plan {
        const WHOLE: Plan = Plan::Hash(Form::Value);
        self.fields
            .iter()
            .find(|(s, f, _)| *s == section && f == field)
            .map_or(&WHOLE, |(_, _, plan)| plan)
    }

    /// One line of the log, hashed: the same JSON object with the values of `headers`
    /// and `attributes` hashed as planned (`null`s and hashed values left as they are).
    pub fn hash_line(&self, salt: &Salt, line: &str) -> Result<String, String> {
        let mut value: Value = serde_json::from_str(line).map_err(|e| format!("not JSON: {e}"))?;
        let object = value.as_object_mut().ok_or("not a JSON object")?;
        for section in ["headers", "attributes"] {
            let Some(fields) = object.get_mut(section) else {
                continue;
            };
            let Some(fields) = fields.as_object_mut() else {
                // Not a record's section: nothing in clear may pass.
                return Err(format!("{section}: not an object"));
            };
            for (name, field) in fields.iter_mut() {
                let Plan::Hash(form) = self.plan(section, name) else {
                    continue;
                };
                let raw = match &*field {
                    Value::Null => continue,
                    Value::String(s) if Form::of(s).is_some() => continue,
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                *field = Value::String(form.hash(salt, raw.as_bytes()));
            }
        }
        serde_json::to_string(&value).map_err(|e| e.to_string())
    }
}
