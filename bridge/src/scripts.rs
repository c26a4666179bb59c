//! The Lua scripts, what they are called with, and what they answer.
//!
//! One script per algorithm (`bridge/lua/*.lua`, each with a header giving KEYS, ARGV,
//! the reply and why it must be atomic). They all take the same ARGV shape:
//!
//! | ARGV | meaning |
//! |---|---|
//! | 1 | `now_us` override: 0 = Redis `TIME` (what the HTTP API always sends); tests pin time |
//! | 2 | `cost` |
//! | 3 | `want` (≥ cost): units to take now |
//! | 4 | `reserve`: units of the future schedule to reserve when cost does not fit (GCRA) |
//! | 5 | `ttl_us`: the lease's ttl, how long a unit may be spent after it is due (`hold_us` on the wire) |
//! | 6 | `horizon_us`: how far ahead reserved units may be due |
//! | 7.. | the algorithm's script arguments (`Algorithm::script_args` in the core) |
//!
//! (a [`weir_protocol::algorithms::Ask`]) and all reply `{allowed 0/1, granted, limit,
//! remaining, retry_after_ns, reset_after_ns, now_us, due_ns, spacing_ns, valid_ns}` (a
//! [`Grant`] and Redis's clock), the durations as decimal strings (`"-1"`: no retry
//! time) because a ns duration may pass 2^53, where Lua's doubles stop being exact.
//!
//! Everything here is pure: building an invocation and decoding a reply need no Redis.

use redis::Value;
use weir_protocol::algorithms::{AlgorithmKind, Ask, Decision, GlobalLimit, Grant};
use weir_protocol::key::{redis_key_tag, redis_share_key, redis_share_key_id, redis_state_key};
use weir_protocol::wire::v2::WireShare;

include!(concat!(env!("OUT_DIR"), "/lua_scripts.rs"));

/// What a script does: decide an ask (`lua/<spec.script>.lua`), or settle a cost after
/// the response (`lua/<spec.settle_script>.lua`, `/v3/commit`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    Acquire,
    Settle,
    /// Decide a request of a key within a shared limit's parent (`lua/share.lua`, for
    /// the algorithms whose limit comes back whole each window).
    Share,
    /// Settle a shared limit's cost after the response (`lua/share_settle.lua`).
    ShareSettle,
}

/// A Lua script with its SHA-1 (what `EVALSHA` names it by).
#[derive(Debug)]
pub struct LuaScript {
    pub kind: AlgorithmKind,
    pub purpose: Purpose,
    pub source: &'static str,
    pub sha1: String,
}

/// Every algorithm's scripts: the file `lua/<spec.script>.lua` (and its settle script,
/// if the spec names one) after the shared prelude (`lua/common.lua`), as one chunk,
/// loaded at compile time.
#[derive(Debug)]
pub struct Scripts {
    scripts: Vec<LuaScript>,
}

impl Scripts {
    /// The scripts of every algorithm that has its files (a test checks that all do).
    pub fn load() -> Scripts {
        let named = |kind: AlgorithmKind, purpose: Purpose, name: &str| {
            let (_, source) = LUA_SCRIPTS.iter().find(|(file, _)| *file == name)?;
            Some(LuaScript {
                kind,
                purpose,
                source,
                sha1: redis::Script::new(source).get_hash().to_string(),
            })
        };
        let scripts = AlgorithmKind::ALL
            .into_iter()
            .flat_map(|kind| {
                let spec = kind.spec();
                [
                    named(kind, Purpose::Acquire, spec.script),
                    spec.settle_script
                        .and_then(|name| named(kind, Purpose::Settle, name)),
                    spec.resets_each_window
                        .then(|| named(kind, Purpose::Share, "share"))
                        .flatten(),
                    spec.resets_each_window
                        .then(|| named(kind, Purpose::ShareSettle, "share_settle"))
                        .flatten(),
                ]
            })
            .flatten()
            .collect();
        Scripts { scripts }
    }

    /// The script of `kind` for `purpose`; `None` if the algorithm has none (or it was
    /// not shipped).
    pub fn get(&self, kind: AlgorithmKind, purpose: Purpose) -> Option<&LuaScript> {
        self.scripts
            .iter()
            .find(|s| s.kind == kind && s.purpose == purpose)
    }

    pub fn all(&self) -> &[LuaScript] {
        &self.scripts
    }
}

/// One script call: which script, its KEYS and its ARGV.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invocation {
    pub kind: AlgorithmKind,
    pub purpose: Purpose,
    pub keys: Vec<String>,
    pub args: Vec<u64>,
}

/// The sequence key of a sliding log: `<state key>:seq`, in the same hash slot.
pub fn log_seq_key(state_key: &str) -> String {
    format!(
        "{state_key}{}",
        weir_protocol::algorithms::sliding_log::SEQ_KEY_SUFFIX
    )
}

impl Invocation {
    /// The call deciding `ask` against `limit` for one descriptor. `now_us` 0 lets the
    /// script read Redis `TIME`. KEYS are the state key, then the algorithm's extra keys
    /// in the same hash slot; ARGV is `now_us`, the ask, then the algorithm's script
    /// arguments.
    pub fn for_limit(
        limit: &GlobalLimit,
        domain: &str,
        rule: &str,
        descriptor: &[String],
        now_us: u64,
        ask: Ask,
    ) -> Invocation {
        let kind = limit.kind();
        let tag = redis_key_tag(domain, rule, kind, descriptor);
        let state_key = redis_state_key(&tag, kind);
        let keys = std::iter::once(state_key.clone())
            .chain(
                kind.spec()
                    .extra_script_keys
                    .iter()
                    .map(|suffix| format!("{state_key}{suffix}")),
            )
            .collect();
        let mut args = vec![
            now_us,
            ask.cost,
            ask.want,
            ask.reserve,
            ask.ttl_us,
            ask.horizon_us,
        ];
        args.extend(limit.algorithm().script_args());
        Invocation {
            kind,
            purpose: Purpose::Acquire,
            keys,
            args,
        }
    }

    /// This call's key keeps the emission interval it is counted in beside its TAT, and
    /// reads a TAT counted in another in its own (a `gcra` rule whose limit each request
    /// gives: `v2::Item::limit_from_request`). Other algorithms' calls are unchanged.
    pub fn keeping_interval(mut self, keep: bool) -> Invocation {
        if keep && self.kind.spec().has_schedule && self.purpose == Purpose::Acquire {
            self.args.push(1);
        }
        self
    }

    /// The call deciding a request of the key `share` names within the descriptor's
    /// parent, asking `ask` (its cost, and a lease's `want`): KEYS the parent's shares;
    /// ARGV `now_us` (0: Redis `TIME`), `cost`, the limit per window, the window,
    /// `max_keys`, the weight, the key's id and `want` (`lua/share.lua`).
    pub fn for_share(
        limit: &GlobalLimit,
        domain: &str,
        rule: &str,
        descriptor: &[String],
        now_us: u64,
        (share, ask): (&WireShare, Ask),
    ) -> Invocation {
        let kind = limit.kind();
        let tag = redis_key_tag(domain, rule, kind, descriptor);
        let policy = limit.policy();
        let key = if share.key.is_empty() {
            0
        } else {
            redis_share_key_id(&share.key)
        };
        Invocation {
            kind,
            purpose: Purpose::Share,
            keys: vec![redis_share_key(&tag, kind)],
            args: vec![
                now_us,
                ask.cost,
                policy.quota,
                policy.window_ns / 1000,
                u64::from(share.max_keys),
                share.weight,
                key,
                ask.want,
            ],
        }
    }

    /// The call settling a shared limit's commit for the key `share_key` within the
    /// descriptor's parent: KEYS the parent's shares; ARGV `now_us` (0: Redis `TIME`),
    /// `counted_at_us`, `reserved`, `actual`, the window and the key's id
    /// (`lua/share_settle.lua`).
    pub fn settle_share(
        limit: &GlobalLimit,
        (domain, rule, descriptor): (&str, &str, &[String]),
        share_key: &[String],
        now_us: u64,
        commit: Settle,
    ) -> Invocation {
        let kind = limit.kind();
        let tag = redis_key_tag(domain, rule, kind, descriptor);
        let key = if share_key.is_empty() {
            0
        } else {
            redis_share_key_id(share_key)
        };
        Invocation {
            kind,
            purpose: Purpose::ShareSettle,
            keys: vec![redis_share_key(&tag, kind)],
            args: vec![
                now_us,
                commit.counted_at_us,
                commit.reserved,
                commit.actual,
                limit.policy().window_ns / 1000,
                key,
            ],
        }
    }

    /// The call settling one commit: KEYS the state key; ARGV `now_us` (0: Redis
    /// `TIME`), `counted_at_us`, `reserved`, `actual`, then the algorithm's script
    /// arguments (as for acquiring).
    pub fn settle(
        limit: &GlobalLimit,
        domain: &str,
        rule: &str,
        descriptor: &[String],
        now_us: u64,
        commit: Settle,
    ) -> Invocation {
        let kind = limit.kind();
        let tag = redis_key_tag(domain, rule, kind, descriptor);
        let mut args = vec![now_us, commit.counted_at_us, commit.reserved, commit.actual];
        args.extend(limit.algorithm().script_args());
        Invocation {
            kind,
            purpose: Purpose::Settle,
            keys: vec![redis_state_key(&tag, kind)],
            args,
        }
    }
}

/// What a settle call settles: `reserved` units counted at `counted_at_us` (Redis's
/// clock) that really cost `actual`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settle {
    pub counted_at_us: u64,
    pub reserved: u64,
    pub actual: u64,
}

/// Decodes a settle script's `{changed 0/1, now_us}`.
pub fn decode_settled(value: &Value) -> Result<(bool, u64), String> {
    let Value::Array(items) = value else {
        return Err(format!("expected an array, got {}", value_kind(value)));
    };
    let [changed, now] = items.as_slice() else {
        return Err(format!("expected 2 fields, got {}", items.len()));
    };
    let changed = match integer(changed) {
        Some(0) => false,
        Some(1) => true,
        _ => return Err(format!("changed: not 0 or 1 ({})", value_kind(changed))),
    };
    let now =
        integer(now).ok_or_else(|| format!("now_us: not an integer ({})", value_kind(now)))?;
    Ok((changed, saturate(now)))
}

/// A script's reply, decoded: what the key granted, and the Redis time the script
/// decided at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScriptReply {
    pub grant: Grant,
    pub now_us: u64,
}

/// Decodes `{allowed, granted, limit, remaining, retry_after_ns, reset_after_ns, now_us,
/// due_ns, spacing_ns, valid_ns}`. Each field may be an integer or a decimal string; a
/// value past u64 saturates, as the core's durations do. The error says what was wrong,
/// for logs.
pub fn decode_reply(value: &Value) -> Result<ScriptReply, String> {
    let Value::Array(items) = value else {
        return Err(format!("expected an array, got {}", value_kind(value)));
    };
    let [allowed, granted, limit, remaining, retry, reset, now, due, spacing, valid] =
        items.as_slice()
    else {
        return Err(format!("expected 10 fields, got {}", items.len()));
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
    let due_ns = field("due_ns", due)?;
    Ok(ScriptReply {
        grant: Grant {
            decision: Decision {
                allowed,
                limit: count("limit", limit)?,
                remaining: count("remaining", remaining)?,
                retry_after_ns,
                reset_after_ns: count("reset_after_ns", reset)?,
            },
            granted: count("granted", granted)?,
            due_ns: i64::try_from(due_ns).unwrap_or(if due_ns < 0 { i64::MIN } else { i64::MAX }),
            spacing_ns: count("spacing_ns", spacing)?,
            valid_ns: count("valid_ns", valid)?,
        },
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
    use weir_protocol::wire::WireLimit;

    fn compile(kind: AlgorithmKind, values: &[u64]) -> GlobalLimit {
        WireLimit {
            kind,
            values: values.to_vec(),
        }
        .compile()
        .unwrap()
    }

    #[test]
    fn invocations_carry_keys_in_one_slot_and_the_documented_argv() {
        // GCRA: rate 3 per second, burst 2.
        let gcra = compile(AlgorithmKind::Gcra, &[3, 1_000_000, 2]);
        let ask = Ask {
            cost: 1,
            want: 4,
            reserve: 9,
            ttl_us: 250,
            horizon_us: 1_000,
        };
        let inv = Invocation::for_limit(&gcra, "weir", "r", &["=alice".into()], 0, ask);
        let tag = redis_key_tag("weir", "r", AlgorithmKind::Gcra, &["=alice".into()]);
        assert_eq!(inv.keys, vec![format!("weir:{{{tag}}}:gcra")]);
        assert_eq!(
            inv.args,
            vec![0, 1, 4, 9, 250, 1_000, 3, 333_333_333, 999_999_999]
        );

        let log = compile(AlgorithmKind::SlidingLog, &[5, 10]);
        let inv = Invocation::for_limit(&log, "weir", "r", &[], 7, Ask::exact(0));
        let tag = redis_key_tag("weir", "r", AlgorithmKind::SlidingLog, &[]);
        assert_eq!(
            inv.keys,
            vec![
                format!("weir:{{{tag}}}:sliding_log"),
                log_seq_key(&format!("weir:{{{tag}}}:sliding_log"))
            ]
        );
        assert_eq!(inv.args, vec![7, 0, 0, 0, 0, 0, 5, 10]);

        // Token bucket: capacity 5, refill 100 every 9 µs.
        let bucket = compile(AlgorithmKind::TokenBucket, &[5, 100, 9]);
        let inv = Invocation::for_limit(&bucket, "weir", "r", &[], 0, Ask::exact(1));
        assert_eq!(
            inv.args,
            vec![0, 1, 1, 0, 0, 0, 5, 5, 9],
            "refill capped at capacity"
        );
    }

    #[test]
    fn every_algorithm_has_its_script_distinct_and_named_by_sha1() {
        let scripts = Scripts::load();
        let settling = AlgorithmKind::ALL
            .iter()
            .filter(|k| k.spec().settle_script.is_some())
            .count();
        assert!(settling > 0, "some algorithm settles");
        let shared = AlgorithmKind::ALL
            .iter()
            .filter(|k| k.spec().resets_each_window)
            .count();
        assert!(shared > 0, "some algorithm is shared");
        assert_eq!(
            scripts.all().len(),
            AlgorithmKind::ALL.len() + settling + 2 * shared
        );
        // One share script serves every algorithm it is shipped for.
        let shas: std::collections::HashSet<_> = scripts
            .all()
            .iter()
            .map(|s| (s.kind, s.sha1.clone()))
            .collect();
        assert_eq!(shas.len(), scripts.all().len());
        for s in scripts.all() {
            assert!(s.source.contains("KEYS[1]") && s.source.contains("ARGV[1]"));
            assert!(
                s.source.contains("Why atomic"),
                "{} {:?} header",
                s.kind,
                s.purpose
            );
        }
        for kind in AlgorithmKind::ALL {
            assert_eq!(
                scripts.get(kind, Purpose::Settle).is_some(),
                kind.spec().settle_script.is_some()
            );
            assert_eq!(
                scripts.get(kind, Purpose::Share).is_some(),
                kind.spec().resets_each_window
            );
            assert_eq!(
                scripts.get(kind, Purpose::ShareSettle).is_some(),
                kind.spec().resets_each_window
            );
            let s = scripts.get(kind, Purpose::Acquire).unwrap();
            assert_eq!(s.sha1.len(), 40);
            assert!(s.source.contains("KEYS[1]") && s.source.contains("ARGV[1]"));
            assert!(s.source.contains("Why atomic"), "{} header", s.kind);
        }
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
            Value::BulkString(b"-250".to_vec()),
            Value::BulkString(b"1000".to_vec()),
            Value::BulkString(b"5000".to_vec()),
        ]);
        assert_eq!(
            decode_reply(&reply),
            Ok(ScriptReply {
                grant: Grant {
                    decision: Decision {
                        allowed: false,
                        limit: 5,
                        remaining: 2,
                        retry_after_ns: Some(1000),
                        reset_after_ns: u64::MAX,
                    },
                    granted: 0,
                    due_ns: -250,
                    spacing_ns: 1000,
                    valid_ns: 5000,
                },
                now_us: 1_700_000_000_000_000,
            })
        );
        let mut none = reply.clone();
        if let Value::Array(items) = &mut none {
            items[4] = Value::BulkString(b"-1".to_vec());
        }
        assert_eq!(
            decode_reply(&none).unwrap().grant.decision.retry_after_ns,
            None
        );
        assert!(decode_reply(&Value::Int(1)).is_err());
        assert!(decode_reply(&Value::Array(vec![Value::Int(1)])).is_err());
        let mut bad = reply;
        if let Value::Array(items) = &mut bad {
            items[0] = Value::Int(2);
        }
        assert_eq!(decode_reply(&bad).unwrap_err(), "allowed: 2 is not 0 or 1");
    }
}
