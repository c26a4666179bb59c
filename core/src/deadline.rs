//! A request's own deadline, as its headers state it: how long its client (or the Envoy
//! in front) waits for an answer. A rule with `on_limit.delay` holds a request only when
//! its slot comes before this deadline (see [`crate::engine`]): a request released after
//! its client gave up would cost the upstream for nothing.
//!
//! Two headers carry one, and the earlier wins:
//! - `grpc-timeout` (gRPC over HTTP/2): up to 8 digits and a unit, `H` `M` `S` `m` `u` `n`
//!   (hours, minutes, seconds, milliseconds, microseconds, nanoseconds);
//! - `x-envoy-expected-rq-timeout-ms`: the whole milliseconds an Envoy in front set on the
//!   request (its route's timeout, or what is left of it).
//!
//! A header that does not parse states no deadline: the request is held by its rule's
//! `max` alone, as it was before deadlines were read. The route's own timeout on this
//! Envoy is not one of the attributes a Wasm filter can read. Which facts hold the two
//! headers is the rule's business ([`crate::rules::DeadlineFacts`]); this module only
//! reads their values, and uses nothing else of the crate.

/// The header gRPC clients state their deadline in.
pub const GRPC_TIMEOUT: &str = "grpc-timeout";
/// The header an Envoy in front states the time it will wait in.
pub const EXPECTED_RQ_TIMEOUT: &str = "x-envoy-expected-rq-timeout-ms";

/// A stated timeout in µs: the earlier of a `grpc-timeout` and an
/// `x-envoy-expected-rq-timeout-ms` value (either absent or malformed: the other).
pub fn stated_timeout_us(
    grpc_timeout: Option<&[u8]>,
    expected_rq_timeout: Option<&[u8]>,
) -> Option<u64> {
    let grpc = grpc_timeout.and_then(grpc_timeout_us);
    let expected = expected_rq_timeout.and_then(expected_rq_timeout_us);
    match (grpc, expected) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// A `grpc-timeout` value in µs (rounded up: a deadline of 1 ns is 1 µs away, not 0).
pub fn grpc_timeout_us(value: &[u8]) -> Option<u64> {
    let (unit, digits) = value.split_last()?;
    if digits.is_empty() || digits.len() > 8 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let n: u64 = std::str::from_utf8(digits).ok()?.parse().ok()?;
    Some(match unit {
        b'H' => n * 3_600_000_000,
        b'M' => n * 60_000_000,
        b'S' => n * 1_000_000,
        b'm' => n * 1_000,
        b'u' => n,
        b'n' => n.div_ceil(1_000),
        _ => return None,
    })
}

/// An `x-envoy-expected-rq-timeout-ms` value in µs: whole milliseconds, at most 10 digits.
pub fn expected_rq_timeout_us(value: &[u8]) -> Option<u64> {
    if value.is_empty() || value.len() > 10 || !value.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let ms: u64 = std::str::from_utf8(value).ok()?.parse().ok()?;
    Some(ms * 1_000)
}

#[cfg(test)]
mod tests {
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    use super::*;

    #[test]
    fn grpc_timeouts_in_every_unit() {
        assert_eq!(grpc_timeout_us(b"2H"), Some(7_200_000_000));
        assert_eq!(grpc_timeout_us(b"3M"), Some(180_000_000));
        assert_eq!(grpc_timeout_us(b"1S"), Some(1_000_000));
        assert_eq!(grpc_timeout_us(b"250m"), Some(250_000));
        assert_eq!(grpc_timeout_us(b"99999999u"), Some(99_999_999));
        assert_eq!(grpc_timeout_us(b"1n"), Some(1), "rounded up");
        assert_eq!(grpc_timeout_us(b"0m"), Some(0));
        // The largest a header may say: 8 digits of hours.
        assert_eq!(
            grpc_timeout_us(b"99999999H"),
            Some(99_999_999 * 3_600_000_000)
        );
    }

    #[test]
    fn malformed_grpc_timeouts_state_no_deadline() {
        for bad in [
            &b""[..],
            b"m",
            b"100",
            b"100ms",
            b"100x",
            b"-1m",
            b" 1m",
            b"123456789m",
            b"1.5S",
            "１m".as_bytes(),
        ] {
            assert_eq!(
                grpc_timeout_us(bad),
                None,
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn the_earlier_of_the_two_headers_wins() {
        assert_eq!(stated_timeout_us(Some(b"1S"), Some(b"9")), Some(9_000));
        assert_eq!(stated_timeout_us(Some(b"5m"), Some(b"9")), Some(5_000));
        assert_eq!(stated_timeout_us(Some(b"bad"), Some(b"9")), Some(9_000));
        assert_eq!(stated_timeout_us(None, None), None);
    }

    #[test]
    fn expected_request_timeouts_are_whole_milliseconds() {
        assert_eq!(expected_rq_timeout_us(b"15000"), Some(15_000_000));
        assert_eq!(expected_rq_timeout_us(b"0"), Some(0));
        assert_eq!(
            expected_rq_timeout_us(b"9999999999"),
            Some(9_999_999_999_000)
        );
        for bad in [&b""[..], b"1.5", b"-3", b"12345678901", b"10ms", b" 10"] {
            assert_eq!(expected_rq_timeout_us(bad), None);
        }
    }
}
