//! Every size and count limit that more than one part of weir must agree on, defined
//! once: the config compiler refuses what the wire format or the bridge would refuse,
//! because both read the same numbers (and the wire's are derived from the config's).
//!
//! | limit | value | who checks it |
//! |---|---|---|
//! | [`MAX_CONFIG_BYTES`] | 1 MiB | the filter (reading the host's buffer) and the config parser |
//! | [`MAX_RULES`] | 64 | config |
//! | [`MAX_NAME_BYTES`] | 64, `A-Z a-z 0-9 _ -` | config (rule names, domain) and wire |
//! | [`MAX_KEY_PARTS`] | 16 | config (key parts) and wire (descriptor parts) |
//! | [`MAX_KEY_VALUE_BYTES`] | 256 | config (`static` / `default` values) |
//! | [`MAX_PART_BYTES`] | 257 | wire: one descriptor part, its origin prefix included |
//! | [`MAX_ITEMS`] | 64 | wire: every global rule of a config can match one request |
//! | [`MAX_WANT`] | 1,000,000 | config (a global rule's cost and lease) and wire (`cost`, `want`) |
//! | [`MAX_BODY_BYTES`] | 1 MiB | wire (request and reply bodies): larger than any request a valid config produces |
//! | [`MAX_LEASE_TTL_US`] | 1 h | config (`lease.ttl`) and wire (`hold_us`) |
//! | [`MAX_LEASE_HORIZON_US`] | 10 s | config (`lease.horizon`) and wire (`horizon_us`) |
//! | [`BRIDGE_REDIS_TIMEOUT_MS`] | 40 ms | the bridge's default `--redis-timeout` |
//! | [`MIN_BRIDGE_TIMEOUT_MS`] | 50 ms | config (default `bridge.timeout`; `weir-check` warns below it) |
//!
//! Algorithm parameters carry their own limits, next to the algorithm (e.g. GCRA's
//! tolerance, the log's length, [`crate::algorithms::MAX_SCRIPT_EXACT`] for Redis).

/// The largest plugin configuration, in bytes. A rate-limit config is a few kilobytes,
/// and the parser runs inside every worker's VM.
pub const MAX_CONFIG_BYTES: usize = 1 << 20;

/// Rules in one config: each costs a match and possibly a table lookup per request.
pub const MAX_RULES: usize = 64;

/// Rule and domain names, in the config and on the wire: 1 to 64 bytes of
/// [`is_name_byte`]. They go into shared-data keys, metric names, Redis key hashes and
/// JSON bodies, which is why the alphabet is small.
pub const MAX_NAME_BYTES: usize = 64;

/// Parts of a rule's key (config) and of a descriptor (wire).
pub const MAX_KEY_PARTS: usize = 16;

/// A `static` or `default` key value, in bytes.
pub const MAX_KEY_VALUE_BYTES: usize = 256;

/// Request values up to this many bytes travel to the bridge as they are; longer ones
/// (and values that would need escaping in JSON) as their SHA-256.
pub const MAX_PLAIN_PART_BYTES: usize = 128;

/// One descriptor part on the wire: a one-byte origin prefix and the value (a plain
/// request value, a 64-digit hash, or a configured `static`/`default` value).
pub const MAX_PART_BYTES: usize = 1 + max(max(MAX_KEY_VALUE_BYTES, MAX_PLAIN_PART_BYTES), 64);

/// Items in one bridge call: one per global rule that needs Redis for a request, and
/// every global rule of a config may match the same request.
pub const MAX_ITEMS: usize = MAX_RULES;

/// The most units one bridge item may ask for (`want`, so also `cost`): bounds what a
/// lease or a global request can consume in Redis at once.
pub const MAX_WANT: u64 = 1_000_000;

/// The longest a leased or reserved unit may wait to be spent: a global rule's
/// `lease.ttl` (config) and an item's `hold_us` (wire): an hour.
pub const MAX_LEASE_TTL_US: u64 = 3_600_000_000;

/// The furthest ahead a reservation may reach: a global rule's `lease.horizon` (config)
/// and an item's `horizon_us` (wire): ten seconds. A config above it once passed the
/// check and then had every bridge call refused (400).
pub const MAX_LEASE_HORIZON_US: u64 = 10_000_000;

/// The largest bridge request or reply body. A request carries at most [`MAX_ITEMS`]
/// items of at most [`MAX_KEY_PARTS`] parts of [`MAX_PART_BYTES`] (a request value that
/// would need escaping in JSON travels as its hash, a configured value at most doubles:
/// see [`crate::key::encode_part`]); a test builds the largest request a valid config can
/// produce and checks that it fits.
pub const MAX_BODY_BYTES: usize = 1 << 20;

/// The bridge's default Redis timeout (`--redis-timeout`): the longest one script call
/// may take, retries and redirects included, before the bridge answers 503.
pub const BRIDGE_REDIS_TIMEOUT_MS: u64 = 40;

/// What a bridge call takes beyond the Redis call it waits on: Envoy to the bridge and
/// back, the JSON both ways, the scripts of the items before it (each a fraction of a
/// millisecond on a healthy cluster).
pub const BRIDGE_CALL_MARGIN_MS: u64 = 10;

/// The shortest `bridge.timeout` that outlasts a bridge running with the default Redis
/// timeout, and the filter's default. A shorter one gives up on calls the bridge is still
/// waiting on: units Redis grants after that are charged and never spent, and the filter
/// applies the failure mode where the bridge would have answered in time.
pub const MIN_BRIDGE_TIMEOUT_MS: u64 = BRIDGE_REDIS_TIMEOUT_MS + BRIDGE_CALL_MARGIN_MS;

const fn max(a: usize, b: usize) -> usize {
    if a > b {
        a
    } else {
        b
    }
}

/// The bytes a name may use: `A-Z a-z 0-9 _ -`.
pub fn is_name_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b'-'
}

/// Checks a rule or domain name (`what` says which, for the message): the one
/// validator, with the one message, for the config and the wire.
pub fn check_name(what: &str, name: &str) -> Result<(), String> {
    const ALPHABET: &str = "use A-Z, a-z, 0-9, \"_\" and \"-\"";
    if name.is_empty() {
        return Err(format!("the {what} is empty; {ALPHABET}"));
    }
    if let Some(bad) = name
        .chars()
        .find(|&c| !u8::try_from(c).is_ok_and(is_name_byte))
    {
        return Err(format!(
            "invalid {what} {}: {} is not allowed; {ALPHABET}",
            crate::field_error::quoted(name),
            crate::field_error::quoted(&bad.to_string())
        ));
    }
    if name.len() > MAX_NAME_BYTES {
        return Err(format!(
            "{what} {} is {} bytes long; at most {MAX_NAME_BYTES} are allowed",
            crate::field_error::quoted(name),
            name.len()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    use super::*;

    #[test]
    fn names() {
        assert_eq!(check_name("rule name", "per-user_2"), Ok(()));
        assert_eq!(
            check_name("rule name", ""),
            Err("the rule name is empty; use A-Z, a-z, 0-9, \"_\" and \"-\"".into())
        );
        assert_eq!(
            check_name("domain", "a b"),
            Err(
                "invalid domain \"a b\": \" \" is not allowed; use A-Z, a-z, 0-9, \"_\" and \"-\""
                    .into()
            )
        );
        let long = "x".repeat(MAX_NAME_BYTES + 1);
        assert!(check_name("rule name", &long)
            .unwrap_err()
            .ends_with("is 65 bytes long; at most 64 are allowed"));
    }

    #[test]
    fn a_part_holds_the_longest_value_and_its_prefix() {
        assert_eq!(MAX_PART_BYTES, 1 + MAX_KEY_VALUE_BYTES);
    }
}
