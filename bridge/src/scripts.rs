//! The Lua scripts, what they are called with, and what they answer.
//!
//! One script per algorithm (`bridge/lua/*.lua`, each with a header giving KEYS, ARGV,
//! the reply and why it must be atomic). They all take the same ARGV shape:
//!
//! | ARGV | meaning |
//! |---|---|
//! | 1 | `now_us` override: 0 = Redis `TIME` (what the HTTP API always sends); tests pin time |
//! | 2 | `cost` |
//! | 3 | `want` (≥ cost) |
//! | 4.. | the algorithm's parameters ([`Invocation::for_limit`]) |
//!
//! and all reply `{allowed 0/1, granted, limit, remaining, retry_after_ns, reset_after_ns,
//! now_us}`, the durations as decimal strings (`"-1"`: no retry time) because a ns
//! duration may pass 2^53, where Lua's doubles stop being exact.
//!
//! Everything here is pure: building an invocation and decoding a reply need no Redis.

use redis::Value;
use weir_core::algorithms::token_bucket::TokenBucket;
use weir_core::algorithms::{AlgorithmKind, Limit};
use weir_core::wire::{redis_key_tag, redis_state_key, GlobalLimit};

/// A Lua script with its SHA-1 (what `EVALSHA` names it by).
#[derive(Debug)]
pub struct LuaScript {
    pub kind: AlgorithmKind,
    pub source: &'static str,
    pub sha1: String,
}

impl LuaScript {
    fn new(kind: AlgorithmKind, source: &'static str) -> Self {
        LuaScript {
            kind,
            source,
            sha1: redis::Script::new(source).get_hash().to_string(),
        }
    }
}

/// An algorithm's script as Redis runs it: the shared prelude (`lua/common.lua`), then
/// the algorithm's own file, as one chunk.
macro_rules! script {
    ($name:literal) => {
        concat!(
            include_str!("../lua/common.lua"),
            "\n",
            include_str!(concat!("../lua/", $name, ".lua"))
        )
    };
}

/// The five scripts, loaded at compile time.
#[derive(Debug)]
pub struct Scripts {
    token_bucket: LuaScript,
    gcra: LuaScript,
    fixed_window: LuaScript,
    sliding_window: LuaScript,
    sliding_log: LuaScript,
}

impl Default for Scripts {
    fn default() -> Self {
        Scripts {
            token_bucket: LuaScript::new(AlgorithmKind::TokenBucket, script!("token_bucket")),
            gcra: LuaScript::new(AlgorithmKind::Gcra, script!("gcra")),
            fixed_window: LuaScript::new(AlgorithmKind::FixedWindow, script!("fixed_window")),
            sliding_window: LuaScript::new(AlgorithmKind::SlidingWindow, script!("sliding_window")),
            sliding_log: LuaScript::new(AlgorithmKind::SlidingLog, script!("sliding_log")),
        }
    }
}

impl Scripts {
    pub fn get(&self, kind: AlgorithmKind) -> &LuaScript {
        match kind {
            AlgorithmKind::TokenBucket => &self.token_bucket,
            AlgorithmKind::Gcra => &self.gcra,
            AlgorithmKind::FixedWindow => &self.fixed_window,
            AlgorithmKind::SlidingWindow => &self.sliding_window,
            AlgorithmKind::SlidingLog => &self.sliding_log,
        }
    }

    pub fn all(&self) -> [&LuaScript; 5] {
        AlgorithmKind::ALL.map(|kind| self.get(kind))
    }
}

/// One script call: which script, its KEYS and its ARGV.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invocation {
    pub kind: AlgorithmKind,
    pub keys: Vec<String>,
    pub args: Vec<u64>,
}

/// The sequence key of a sliding log: `<state key>:seq`, in the same hash slot.
pub fn log_seq_key(state_key: &str) -> String {
    format!("{state_key}:seq")
}

impl Invocation {
    /// The call deciding `cost` (up to `want`) units of `limit` for one descriptor.
    /// `now_us` 0 lets the script read Redis `TIME`.
    pub fn for_limit(
        limit: &GlobalLimit,
        domain: &str,
        rule: &str,
        descriptor: &[String],
        now_us: u64,
        cost: u64,
        want: u64,
    ) -> Invocation {
        let kind = limit.kind();
        let tag = redis_key_tag(domain, rule, kind, descriptor);
        let state_key = redis_state_key(&tag, kind);
        let params: Vec<u64> = match limit {
            GlobalLimit::Slot(Limit::TokenBucket(p)) => {
                vec![p.capacity(), capped_refill(p), p.period_us()]
            }
            GlobalLimit::Slot(Limit::Gcra(p)) => {
                vec![p.limit(), p.emission_interval_ns(), p.tolerance_ns()]
            }
            GlobalLimit::Slot(Limit::FixedWindow(p)) => vec![p.limit(), p.window_us()],
            GlobalLimit::Slot(Limit::SlidingWindow(p)) => vec![p.limit(), p.window_us()],
            GlobalLimit::Log(p) => vec![p.limit(), p.window_us()],
        };
        let keys = if kind == AlgorithmKind::SlidingLog {
            let seq = log_seq_key(&state_key);
            vec![state_key, seq]
        } else {
            vec![state_key]
        };
        let mut args = vec![now_us, cost, want];
        args.extend(params);
        Invocation { kind, keys, args }
    }
}

/// The refill the token-bucket script gets. A refill above the capacity only ever fills
/// the bucket: capping it changes no decision and keeps the script's products small.
fn capped_refill(p: &TokenBucket) -> u64 {
    p.refill().min(p.capacity())
}

/// The largest count or duration (µs) the scripts accept: 2^48, about 8.9 years in µs.
/// With instants below 2^52 µs (year 2112), every sum the scripts form stays below 2^53,
/// where doubles are exact.
pub const MAX_EXACT: u64 = 1 << 48;

/// Parameters the scripts cannot decide exactly with Lua's doubles, as `(field, reason)`
/// (`field` as in the wire's `limit` object). The core accepts any u64; the config never
/// produces such values (durations ≤ 30 days), so only a hand-made request is refused.
pub fn check_exact(limit: &GlobalLimit) -> Result<(), (&'static str, String)> {
    // `what` is the quantity that must fit, reported under the wire field `field`.
    let at_most_max = |field: &'static str, what: &str, value: u128| {
        if value > u128::from(MAX_EXACT) {
            Err((
                field,
                format!("{what} must be at most 2^48 for exact arithmetic in Redis"),
            ))
        } else {
            Ok(())
        }
    };
    match limit {
        GlobalLimit::Slot(Limit::TokenBucket(p)) => {
            at_most_max("capacity", "capacity", p.capacity().into())?;
            at_most_max("period_us", "period_us", p.period_us().into())?;
            // The time to refill an empty bucket bounds every instant the script forms.
            let fill_us =
                u128::from(p.capacity().div_ceil(capped_refill(p))) * u128::from(p.period_us());
            at_most_max("period_us", "period_us × ceil(capacity / refill)", fill_us)
        }
        // The core bounds τ by 2^52 ns already.
        GlobalLimit::Slot(Limit::Gcra(_)) => Ok(()),
        GlobalLimit::Slot(Limit::FixedWindow(p)) => {
            at_most_max("limit", "limit", p.limit().into())?;
            at_most_max("window_us", "window_us", p.window_us().into())
        }
        // Their limits are below 2^32 already (core).
        GlobalLimit::Slot(Limit::SlidingWindow(p)) => {
            at_most_max("window_us", "window_us", p.window_us().into())
        }
        GlobalLimit::Log(p) => at_most_max("window_us", "window_us", p.window_us().into()),
    }
}

/// A script's reply, decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScriptReply {
    pub allowed: bool,
    pub granted: u64,
    pub limit: u64,
    pub remaining: u64,
    pub retry_after_ns: Option<u64>,
    pub reset_after_ns: u64,
    pub now_us: u64,
}

/// Decodes `{allowed, granted, limit, remaining, retry_after_ns, reset_after_ns, now_us}`.
/// Each field may be an integer or a decimal string; a value past u64 saturates, as the
/// core's durations do. The error says what was wrong, for logs.
pub fn decode_reply(value: &Value) -> Result<ScriptReply, String> {
    let Value::Array(items) = value else {
        return Err(format!("expected an array, got {}", value_kind(value)));
    };
    let [allowed, granted, limit, remaining, retry, reset, now] = items.as_slice() else {
        return Err(format!("expected 7 fields, got {}", items.len()));
    };
    let field = |name: &str, v: &Value| {
        integer(v).ok_or_else(|| format!("{name}: not an integer ({})", value_kind(v)))
    };
    let count = |name: &str, v: &Value| {
        let n = field(name, v)?;
        if n < 0 {
            return Err(format!("{name}: negative ({n})"));
        }
        Ok(saturate(n))
    };
    let allowed = match field("allowed", allowed)? {
        0 => false,
        1 => true,
        other => return Err(format!("allowed: {other} is not 0 or 1")),
    };
    let retry_after_ns = match field("retry_after_ns", retry)? {
        -1 => None,
        n if n >= 0 => Some(saturate(n)),
        n => return Err(format!("retry_after_ns: negative ({n})")),
    };
    Ok(ScriptReply {
        allowed,
        granted: count("granted", granted)?,
        limit: count("limit", limit)?,
        remaining: count("remaining", remaining)?,
        retry_after_ns,
        reset_after_ns: count("reset_after_ns", reset)?,
        now_us: count("now_us", now)?,
    })
}

fn integer(v: &Value) -> Option<i128> {
    match v {
        Value::Int(n) => Some(i128::from(*n)),
        Value::BulkString(bytes) => parse_decimal(bytes),
        Value::SimpleString(s) => parse_decimal(s.as_bytes()),
        _ => None,
    }
}

/// A decimal integer, saturated to the i128 range; `None` if it is not one.
fn parse_decimal(bytes: &[u8]) -> Option<i128> {
    let (negative, digits) = match bytes.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, bytes),
    };
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let magnitude = digits.iter().fold(0i128, |acc, d| {
        acc.saturating_mul(10).saturating_add(i128::from(d - b'0'))
    });
    Some(if negative { -magnitude } else { magnitude })
}

fn saturate(n: i128) -> u64 {
    u64::try_from(n.max(0)).unwrap_or(u64::MAX)
}

fn value_kind(v: &Value) -> &'static str {
    match v {
        Value::Nil => "nil",
        Value::Int(_) => "integer",
        Value::BulkString(_) => "string",
        Value::Array(_) => "array",
        Value::SimpleString(_) => "status",
        Value::Okay => "OK",
        Value::ServerError(_) => "error",
        _ => "other",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use weir_core::wire::WireLimit;

    fn compile(w: WireLimit) -> GlobalLimit {
        w.compile().unwrap()
    }

    #[test]
    fn invocations_carry_keys_in_one_slot_and_the_documented_argv() {
        let gcra = compile(WireLimit::Gcra {
            burst: 2,
            rate: 3,
            period_us: 1_000_000,
        });
        let inv = Invocation::for_limit(&gcra, "weir", "r", &["=alice".into()], 0, 1, 4);
        let tag = redis_key_tag("weir", "r", AlgorithmKind::Gcra, &["=alice".into()]);
        assert_eq!(inv.keys, vec![format!("weir:{{{tag}}}:gcra")]);
        assert_eq!(inv.args, vec![0, 1, 4, 3, 333_333_333, 999_999_999]);

        let log = compile(WireLimit::SlidingLog {
            limit: 5,
            window_us: 10,
        });
        let inv = Invocation::for_limit(&log, "weir", "r", &[], 7, 0, 0);
        let tag = redis_key_tag("weir", "r", AlgorithmKind::SlidingLog, &[]);
        assert_eq!(
            inv.keys,
            vec![
                format!("weir:{{{tag}}}:sliding_log"),
                format!("weir:{{{tag}}}:sliding_log:seq")
            ]
        );
        assert_eq!(inv.args, vec![7, 0, 0, 5, 10]);

        let bucket = compile(WireLimit::TokenBucket {
            capacity: 5,
            refill: 100,
            period_us: 9,
        });
        let inv = Invocation::for_limit(&bucket, "weir", "r", &[], 0, 1, 1);
        assert_eq!(
            inv.args,
            vec![0, 1, 1, 5, 5, 9],
            "refill capped at capacity"
        );
    }

    #[test]
    fn scripts_are_distinct_and_named_by_sha1() {
        let scripts = Scripts::default();
        let shas: std::collections::HashSet<_> =
            scripts.all().iter().map(|s| s.sha1.clone()).collect();
        assert_eq!(shas.len(), 5);
        for s in scripts.all() {
            assert_eq!(s.sha1.len(), 40);
            assert!(s.source.contains("KEYS[1]") && s.source.contains("ARGV[1]"));
            assert!(s.source.contains("Why atomic"), "{} header", s.kind);
        }
    }

    #[test]
    fn inexact_parameters_are_refused() {
        let err = |w: WireLimit| check_exact(&compile(w)).unwrap_err().0;
        assert_eq!(
            err(WireLimit::FixedWindow {
                limit: 1,
                window_us: MAX_EXACT + 1
            }),
            "window_us"
        );
        assert_eq!(
            err(WireLimit::TokenBucket {
                capacity: 1 << 40,
                refill: 1,
                period_us: 1 << 10
            }),
            "period_us"
        );
        assert_eq!(
            err(WireLimit::TokenBucket {
                capacity: MAX_EXACT + 1,
                refill: 1,
                period_us: 1
            }),
            "capacity"
        );
        // A day-long sliding window with a large limit is fine: the script multiplies
        // exactly.
        assert!(check_exact(&compile(WireLimit::SlidingWindow {
            limit: u64::from(u32::MAX),
            window_us: 86_400_000_000
        }))
        .is_ok());
    }

    #[test]
    fn replies_decode_integers_and_strings() {
        let reply = Value::Array(vec![
            Value::Int(0),
            Value::Int(0),
            Value::Int(5),
            Value::Int(2),
            Value::BulkString(b"1000".to_vec()),
            Value::BulkString(b"99999999999999999999999".to_vec()),
            Value::Int(1_700_000_000_000_000),
        ]);
        assert_eq!(
            decode_reply(&reply),
            Ok(ScriptReply {
                allowed: false,
                granted: 0,
                limit: 5,
                remaining: 2,
                retry_after_ns: Some(1000),
                reset_after_ns: u64::MAX,
                now_us: 1_700_000_000_000_000,
            })
        );
        let mut none = reply.clone();
        if let Value::Array(items) = &mut none {
            items[4] = Value::BulkString(b"-1".to_vec());
        }
        assert_eq!(decode_reply(&none).unwrap().retry_after_ns, None);
        assert!(decode_reply(&Value::Int(1)).is_err());
        assert!(decode_reply(&Value::Array(vec![Value::Int(1)])).is_err());
        let mut bad = reply;
        if let Value::Array(items) = &mut bad {
            items[0] = Value::Int(2);
        }
        assert_eq!(decode_reply(&bad).unwrap_err(), "allowed: 2 is not 0 or 1");
    }
}
