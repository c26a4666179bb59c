//! The wire format between the filter and weir-bridge, version 1.
//!
//! `POST /v1/acquire` carries every global rule of one request that needs Redis:
//!
//! ```json
//! {"domain":"weir","items":[{"rule":"per-tenant","descriptor":["=acme"],
//!   "limit":{"algorithm":"gcra","burst":99,"rate":100,"period_us":1000000},
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
//! `want > cost` asks for a lease (`want` is never below `cost`): Redis consumes `granted` (between `cost` and `want`)
//! units at once and the filter spends the rest locally. `lease_ttl_ns`, when set, is
//! how long those units stay valid (window algorithms: until the window ends).
//!
//! **Descriptor parts** are strings with a one-character origin prefix, so that no
//! value can pass for another kind: `=` a request value (UTF-8, at most
//! [`MAX_PLAIN_PART_BYTES`] bytes), `!` the SHA-256 (hex) of a longer or non-UTF-8
//! request value, `~` a configured default, `#` a static value. The bridge never puts
//! them in a Redis key: it hashes `(domain, rule, algorithm, parts)` into the key's
//! hash tag ([`redis_key_tag`]).

use crate::algorithms::{
    fixed_window::FixedWindow, gcra::Gcra, sliding_log::SlidingLog, sliding_window::SlidingWindow,
    token_bucket::TokenBucket, AlgorithmKind, Limit, ParamError, NS_PER_US,
};
use crate::rules::PartOrigin;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::fmt::{self, Write as _};

pub const ACQUIRE_PATH: &str = "/v1/acquire";
/// The header carrying the shared secret, when the bridge requires one.
pub const SECRET_HEADER: &str = "x-weir-secret";

pub const MAX_BODY_BYTES: usize = 64 * 1024;
pub const MAX_ITEMS: usize = 16;
/// Rule and domain names, here and in the config: 1 to 64 bytes of [`is_name_byte`].
pub const MAX_NAME_BYTES: usize = 64;
pub const MAX_PARTS: usize = 16;
pub const MAX_PART_BYTES: usize = 256;
/// Request values up to this size travel as they are; longer ones as their SHA-256.
pub const MAX_PLAIN_PART_BYTES: usize = 128;
pub const MAX_WANT: u64 = 1_000_000;

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

/// An algorithm and its parameters, durations in µs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "algorithm", rename_all = "snake_case", deny_unknown_fields)]
pub enum WireLimit {
    TokenBucket {
        capacity: u64,
        refill: u64,
        period_us: u64,
    },
    Gcra {
        burst: u64,
        rate: u64,
        period_us: u64,
    },
    FixedWindow {
        limit: u64,
        window_us: u64,
    },
    SlidingWindow {
        limit: u64,
        window_us: u64,
    },
    SlidingLog {
        limit: u64,
        window_us: u64,
    },
}

/// A validated global limit: one of the slot algorithms, or the sliding log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GlobalLimit {
    Slot(Limit),
    Log(SlidingLog),
}

impl GlobalLimit {
    pub fn kind(&self) -> AlgorithmKind {
        match self {
            GlobalLimit::Slot(limit) => limit.kind(),
            GlobalLimit::Log(_) => AlgorithmKind::SlidingLog,
        }
    }

    pub fn max_cost(&self) -> u64 {
        match self {
            GlobalLimit::Slot(limit) => limit.max_cost(),
            GlobalLimit::Log(log) => log.limit(),
        }
    }

    pub fn policy(&self) -> crate::algorithms::Policy {
        match self {
            GlobalLimit::Slot(limit) => limit.policy(),
            GlobalLimit::Log(log) => log.policy(),
        }
    }

    pub fn to_wire(&self) -> WireLimit {
        match self {
            GlobalLimit::Slot(Limit::TokenBucket(p)) => WireLimit::TokenBucket {
                capacity: p.capacity(),
                refill: p.refill(),
                period_us: p.period_us(),
            },
            GlobalLimit::Slot(Limit::Gcra(p)) => WireLimit::Gcra {
                burst: p.burst(),
                rate: p.rate(),
                period_us: p.period_us(),
            },
            GlobalLimit::Slot(Limit::FixedWindow(p)) => WireLimit::FixedWindow {
                limit: p.limit(),
                window_us: p.window_us(),
            },
            GlobalLimit::Slot(Limit::SlidingWindow(p)) => WireLimit::SlidingWindow {
                limit: p.limit(),
                window_us: p.window_us(),
            },
            GlobalLimit::Log(p) => WireLimit::SlidingLog {
                limit: p.limit(),
                window_us: p.window_us(),
            },
        }
    }

    /// The share of this limit that one of `instances` Envoys enforces on its own when
    /// the bridge cannot answer (`failure_mode: local`): the quota divided evenly (at
    /// least 1), at the same pace. A sliding log becomes a sliding-window counter,
    /// which needs no log.
    pub fn local_share(&self, instances: u64) -> Result<Limit, ParamError> {
        let n = instances.max(1);
        let share = |quota: u64| (quota / n).max(1);
        match self {
            GlobalLimit::Slot(Limit::TokenBucket(p)) => TokenBucket::new(
                share(p.capacity()),
                p.refill(),
                p.period_us().saturating_mul(n),
            )
            .map(Limit::TokenBucket),
            GlobalLimit::Slot(Limit::Gcra(p)) => Gcra::new(
                share(p.burst().saturating_add(1)) - 1,
                p.rate(),
                p.period_us().saturating_mul(n),
            )
            .map(Limit::Gcra),
            GlobalLimit::Slot(Limit::FixedWindow(p)) => {
                FixedWindow::new(share(p.limit()), p.window_us()).map(Limit::FixedWindow)
            }
            GlobalLimit::Slot(Limit::SlidingWindow(p)) => {
                SlidingWindow::new(share(p.limit()), p.window_us()).map(Limit::SlidingWindow)
            }
            GlobalLimit::Log(p) => {
                SlidingWindow::new(share(p.limit()), p.window_us()).map(Limit::SlidingWindow)
            }
        }
    }

    /// How long units leased at `now_us` may be spent: window algorithms until the
    /// window ends (spent later they would count against the next window), the log for
    /// one window (its events leave then). Token bucket and GCRA: no bound of their own.
    pub fn lease_ttl_ns(&self, now_us: u64) -> Option<u64> {
        let until_window_end = |window_us: u64| {
            let w = window_us.max(1);
            (w - now_us % w).saturating_mul(NS_PER_US)
        };
        match self {
            GlobalLimit::Slot(Limit::FixedWindow(p)) => Some(until_window_end(p.window_us())),
            GlobalLimit::Slot(Limit::SlidingWindow(p)) => Some(until_window_end(p.window_us())),
            GlobalLimit::Log(p) => Some(p.window_us().saturating_mul(NS_PER_US)),
            GlobalLimit::Slot(Limit::TokenBucket(_) | Limit::Gcra(_)) => None,
        }
    }
}

impl WireLimit {
    pub fn kind(&self) -> AlgorithmKind {
        match self {
            WireLimit::TokenBucket { .. } => AlgorithmKind::TokenBucket,
            WireLimit::Gcra { .. } => AlgorithmKind::Gcra,
            WireLimit::FixedWindow { .. } => AlgorithmKind::FixedWindow,
            WireLimit::SlidingWindow { .. } => AlgorithmKind::SlidingWindow,
            WireLimit::SlidingLog { .. } => AlgorithmKind::SlidingLog,
        }
    }

    /// Validates the parameters with the same constructors as the config.
    pub fn compile(&self) -> Result<GlobalLimit, ParamError> {
        Ok(match *self {
            WireLimit::TokenBucket {
                capacity,
                refill,
                period_us,
            } => GlobalLimit::Slot(Limit::TokenBucket(TokenBucket::new(
                capacity, refill, period_us,
            )?)),
            WireLimit::Gcra {
                burst,
                rate,
                period_us,
            } => GlobalLimit::Slot(Limit::Gcra(Gcra::new(burst, rate, period_us)?)),
            WireLimit::FixedWindow { limit, window_us } => {
                GlobalLimit::Slot(Limit::FixedWindow(FixedWindow::new(limit, window_us)?))
            }
            WireLimit::SlidingWindow { limit, window_us } => {
                GlobalLimit::Slot(Limit::SlidingWindow(SlidingWindow::new(limit, window_us)?))
            }
            WireLimit::SlidingLog { limit, window_us } => {
                GlobalLimit::Log(SlidingLog::new(limit, window_us)?)
            }
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

/// A request the bridge must refuse, naming the field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WireError {
    pub path: String,
    pub message: String,
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            f.write_str(&self.message)
        } else {
            write!(f, "{}: {}", self.path, self.message)
        }
    }
}

fn wire_error(path: impl Into<String>, message: impl Into<String>) -> WireError {
    WireError {
        path: path.into(),
        message: message.into(),
    }
}

/// The bytes a rule name may use: `A-Z a-z 0-9 _ -` (they also go into shared-data keys,
/// metric names and Redis hash tags' inputs).
pub fn is_name_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b'-'
}

fn check_name(path: &str, name: &str) -> Result<(), WireError> {
    if name.is_empty() || name.len() > MAX_NAME_BYTES {
        return Err(wire_error(
            path,
            format!("must be 1 to {MAX_NAME_BYTES} bytes"),
        ));
    }
    if !name.bytes().all(is_name_byte) {
        return Err(wire_error(
            path,
            format!("{name:?} may only use A-Z, a-z, 0-9, _ and -"),
        ));
    }
    Ok(())
}

impl AcquireRequest {
    /// Parses and validates a request body; every error names the field.
    pub fn parse(body: &[u8]) -> Result<(AcquireRequest, Vec<GlobalLimit>), WireError> {
        if body.len() > MAX_BODY_BYTES {
            return Err(wire_error(
                "",
                format!("body larger than {MAX_BODY_BYTES} bytes"),
            ));
        }
        let de = &mut serde_json::Deserializer::from_slice(body);
        let request: AcquireRequest = serde_path_to_error::deserialize(de).map_err(|e| {
            wire_error(
                crate::config::json_path(e.path()),
                crate::config::strip_position(e.inner()),
            )
        })?;
        let limits = request.validate()?;
        Ok((request, limits))
    }

    /// Checks sizes and parameters; returns each item's compiled limit.
    pub fn validate(&self) -> Result<Vec<GlobalLimit>, WireError> {
        check_name("domain", &self.domain)?;
        if self.items.is_empty() || self.items.len() > MAX_ITEMS {
            return Err(wire_error(
                "items",
                format!("must hold 1 to {MAX_ITEMS} items"),
            ));
        }
        let mut limits = Vec::with_capacity(self.items.len());
        for (i, item) in self.items.iter().enumerate() {
            check_name(&format!("items[{i}].rule"), &item.rule)?;
            if item.descriptor.len() > MAX_PARTS {
                return Err(wire_error(
                    format!("items[{i}].descriptor"),
                    format!("has more than {MAX_PARTS} parts"),
                ));
            }
            for (j, part) in item.descriptor.iter().enumerate() {
                let ok_prefix = matches!(part.as_bytes().first(), Some(b'=' | b'!' | b'~' | b'#'));
                if !ok_prefix || part.len() > MAX_PART_BYTES {
                    return Err(wire_error(
                        format!("items[{i}].descriptor[{j}]"),
                        format!(
                            "must start with one of = ! ~ # and be at most {MAX_PART_BYTES} bytes"
                        ),
                    ));
                }
            }
            let limit = item.limit.compile().map_err(|e| {
                wire_error(format!("items[{i}].limit.{}", e.field), e.reason.clone())
            })?;
            if item.cost > limit.max_cost() {
                return Err(wire_error(
                    format!("items[{i}].cost"),
                    format!(
                        "{} is above what the limit can ever admit ({})",
                        item.cost,
                        limit.max_cost()
                    ),
                ));
            }
            if item.want < item.cost || item.want > MAX_WANT {
                return Err(wire_error(
                    format!("items[{i}].want"),
                    format!(
                        "{} must be between cost ({}) and {MAX_WANT}",
                        item.want, item.cost
                    ),
                ));
            }
            limits.push(limit);
        }
        Ok(limits)
    }
}

/// Encodes one key part for the wire (see the module docs).
pub fn encode_part(origin: PartOrigin, bytes: &[u8]) -> String {
    match origin {
        PartOrigin::Default => format!("~{}", String::from_utf8_lossy(bytes)),
        PartOrigin::Static => format!("#{}", String::from_utf8_lossy(bytes)),
        PartOrigin::Request => match std::str::from_utf8(bytes) {
            Ok(text) if bytes.len() <= MAX_PLAIN_PART_BYTES => format!("={text}"),
            _ => format!("!{}", hex(&Sha256::digest(bytes))),
        },
    }
}

fn hex(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(out, "{b:02x}");
    }
    out
}

/// The hash tag of a descriptor's Redis keys: 32 hex digits of
/// SHA-256(domain, rule, algorithm, parts), each framed by its length. Nothing a client
/// sends appears in a key, and every key of one descriptor lands in one hash slot.
pub fn redis_key_tag(
    domain: &str,
    rule: &str,
    algorithm: AlgorithmKind,
    descriptor: &[String],
) -> String {
    let mut hasher = Sha256::new();
    let mut frame = |bytes: &[u8]| {
        hasher.update((bytes.len() as u64).to_le_bytes());
        hasher.update(bytes);
    };
    frame(domain.as_bytes());
    frame(rule.as_bytes());
    frame(algorithm.name().as_bytes());
    for part in descriptor {
        frame(part.as_bytes());
    }
    let digest = hasher.finalize();
    hex(digest.get(..16).unwrap_or(&[]))
}

/// The state key of a descriptor: `weir:{<tag>}:<algorithm>`.
pub fn redis_state_key(tag: &str, algorithm: AlgorithmKind) -> String {
    format!("weir:{{{tag}}}:{algorithm}")
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
    let reply: AcquireResponse = serde_json::from_slice(body)
        .map_err(|e| ReplyError::BadBody(crate::config::strip_position(&e)))?;
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

    #[test]
    fn key_format_is_pinned() {
        let tag = redis_key_tag(
            "weir",
            "per-tenant",
            AlgorithmKind::Gcra,
            &["=acme".to_string()],
        );
        assert_eq!(tag.len(), 32);
        assert_eq!(
            redis_state_key(&tag, AlgorithmKind::Gcra),
            format!("weir:{{{tag}}}:gcra")
        );
        assert_eq!(
            tag,
            redis_key_tag(
                "weir",
                "per-tenant",
                AlgorithmKind::Gcra,
                &["=acme".to_string()]
            )
        );
        let spliced = |parts: &[&str]| {
            let parts: Vec<String> = parts.iter().map(|p| p.to_string()).collect();
            redis_key_tag("weir", "r", AlgorithmKind::Gcra, &parts)
        };
        assert_ne!(spliced(&["=a:b", "=c"]), spliced(&["=a", "=b:c"]));
        assert_ne!(spliced(&["=ab"]), spliced(&["=a", "=b"]));
        // A golden value (also computed with Python's hashlib): changing the derivation
        // strands every key in Redis.
        assert_eq!(spliced(&["=alice"]), "97faf72bcf3817fffd093677ded2178f");
    }

    #[test]
    fn local_shares_divide_the_quota() {
        let tb = GlobalLimit::Slot(Limit::TokenBucket(
            TokenBucket::new(100, 10, 1_000_000).unwrap(),
        ));
        assert_eq!(
            tb.local_share(4).unwrap(),
            Limit::TokenBucket(TokenBucket::new(25, 10, 4_000_000).unwrap())
        );
        let gcra = GlobalLimit::Slot(Limit::Gcra(Gcra::new(99, 100, 1_000_000).unwrap()));
        assert_eq!(
            gcra.local_share(3).unwrap(),
            Limit::Gcra(Gcra::new(32, 100, 3_000_000).unwrap())
        );
        let log = GlobalLimit::Log(SlidingLog::new(10, 1_000_000).unwrap());
        assert_eq!(
            log.local_share(20).unwrap(),
            Limit::SlidingWindow(SlidingWindow::new(1, 1_000_000).unwrap())
        );
    }

    #[test]
    fn parts_say_where_they_come_from() {
        assert_eq!(encode_part(PartOrigin::Request, b"alice"), "=alice");
        assert_eq!(encode_part(PartOrigin::Default, b"anonymous"), "~anonymous");
        assert_eq!(encode_part(PartOrigin::Static, b"v1"), "#v1");
        let binary = encode_part(PartOrigin::Request, b"\xff\xfe");
        assert!(binary.starts_with('!') && binary.len() == 65);
        let long = encode_part(PartOrigin::Request, "x".repeat(200).as_bytes());
        assert!(long.starts_with('!') && long.len() == 65);
        assert_ne!(
            encode_part(PartOrigin::Request, b"~anonymous"),
            encode_part(PartOrigin::Default, b"anonymous")
        );
    }

    #[test]
    fn requests_are_validated_with_paths() {
        let ok = br#"{"domain":"weir","items":[{"rule":"r","descriptor":["=a"],
            "limit":{"algorithm":"fixed_window","limit":10,"window_us":1000000},"cost":1,"want":5}]}"#;
        assert!(AcquireRequest::parse(ok).is_ok());
        let bad = |body: &str| {
            AcquireRequest::parse(body.as_bytes())
                .unwrap_err()
                .to_string()
        };
        assert_eq!(
            bad(
                r#"{"domain":"weir","items":[{"rule":"r","descriptor":["a"],"limit":{"algorithm":"fixed_window","limit":10,"window_us":1},"cost":1,"want":1}]}"#
            ),
            "items[0].descriptor[0]: must start with one of = ! ~ # and be at most 256 bytes"
        );
        assert_eq!(
            bad(r#"{"domain":"weir","items":[{"rule":"r","descriptor":[],"limit":{"algorithm":"leaky","limit":10},"cost":1,"want":1}]}"#),
            "items[0].limit.algorithm: unknown variant `leaky`, expected one of `token_bucket`, `gcra`, `fixed_window`, `sliding_window`, `sliding_log`"
        );
        assert_eq!(
            bad(
                r#"{"domain":"weir","items":[{"rule":"r","descriptor":[],"limit":{"algorithm":"gcra","burst":0,"rate":0,"period_us":1},"cost":1,"want":1}]}"#
            ),
            "items[0].limit.rate: must be at least 1"
        );
        assert_eq!(
            bad(
                r#"{"domain":"weir","items":[{"rule":"r","descriptor":[],"limit":{"algorithm":"fixed_window","limit":10,"window_us":1},"cost":11,"want":11}]}"#
            ),
            "items[0].cost: 11 is above what the limit can ever admit (10)"
        );
        assert_eq!(bad(r#"{"domain":"weir"}"#), "missing field `items`");
        assert_eq!(
            bad(r#"{"domain":"we ir","items":[]}"#),
            "domain: \"we ir\" may only use A-Z, a-z, 0-9, _ and -"
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
