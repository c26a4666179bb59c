//! Limits read from the request (a tenant's own, issue 36): each request is judged by
//! the limit it carries, a key keeps its state when that limit changes, and what a worker
//! keeps for a key (units taken ahead, a cached denial) serves only requests carrying
//! the same limit.

use crate::support;

use support::{engine, evaluate, evaluate_on, FakeRequest, T0};
use weir_core::engine::{RuleOutcome, Source};
use weir_core::store::memory::MemoryStore;

#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test as test;

/// A fixed window of a tenant's own size, from a header an earlier filter writes.
const PER_TENANT: &str = r#"{"trusted_headers":["x-tenant-limit"],"rules":[{"name":"per-tenant",
    "key":[{"header":"x-tenant"}],"reservoir":{"max":1},
    "limit":{"algorithm":"fixed_window","window":"1h",
             "limit":{"header":"x-tenant-limit","default":2,"min":1,"max":100}}}]}"#;

fn tenant(name: &str, limit: Option<&str>) -> FakeRequest {
    let request = FakeRequest::default().header("x-tenant", name);
    match limit {
        Some(limit) => request.header("x-tenant-limit", limit),
        None => request,
    }
}

/// How many of `n` requests at `T0` the engine admits.
fn admitted(e: &weir_core::engine::Engine, store: &MemoryStore, req: &FakeRequest, n: u64) -> u64 {
    (0..n)
        .filter(|_| !evaluate(e, store, req, T0).denied())
        .count() as u64
}

#[test]
fn each_tenant_is_limited_by_its_own_limit() {
    let e = engine(PER_TENANT);
    let store = MemoryStore::new();
    e.prepare(&store).unwrap();
    assert_eq!(admitted(&e, &store, &tenant("a", Some("5")), 10), 5);
    assert_eq!(
        admitted(&e, &store, &tenant("b", None), 10),
        2,
        "no value: the default"
    );
    assert_eq!(
        admitted(&e, &store, &tenant("c", Some("1000")), 200),
        100,
        "clamped to max"
    );
    assert_eq!(
        admitted(&e, &store, &tenant("d", Some(" 7 ")), 10),
        7,
        "decimal text, spaces around it"
    );
    let eval = evaluate(&e, &store, &tenant("e", Some("lots")), T0);
    assert!(!eval.denied());
    assert!(eval.reports[0].limit_invalid, "not a number: counted");
    assert_eq!(
        admitted(&e, &store, &tenant("e", Some("-3")), 10),
        1,
        "the default, 2"
    );
    let eval = evaluate(&e, &store, &tenant("f", Some("3")), T0);
    assert!(!eval.reports[0].limit_invalid);
    // The RateLimit numbers and policy are the request's own limit's.
    assert_eq!(eval.verdicts[0].decision.limit, 3);
    assert_eq!(e.rule_verdicts(&eval)[0].policy.quota, 3);
}

#[test]
fn a_claim_in_metadata_is_read_as_the_number_envoy_encodes() {
    let e = engine(
        r#"{"rules":[{"name":"per-sub","key":[{"jwt_claim":"sub"}],"reservoir":{"max":1},
            "limit":{"algorithm":"fixed_window","window":"1h",
                     "limit":{"jwt_claim":"quota","default":1,"max":50}}}]}"#,
    );
    let store = MemoryStore::new();
    e.prepare(&store).unwrap();
    let claims = |sub: &str, quota: &[u8]| {
        let at = |claim: &'static str| {
            [
                "metadata",
                "filter_metadata",
                "envoy.filters.http.jwt_authn",
                "jwt_payload",
                claim,
            ]
        };
        FakeRequest::default()
            .attribute(&at("sub"), sub)
            .attribute(&at("quota"), quota)
    };
    // A JSON number in dynamic metadata reaches the filter as a little-endian double.
    assert_eq!(
        admitted(&e, &store, &claims("a", &4.0f64.to_le_bytes()), 10),
        4
    );
    assert_eq!(
        admitted(&e, &store, &claims("b", &6.9f64.to_le_bytes()), 10),
        6
    );
    assert_eq!(
        admitted(&e, &store, &claims("c", b"3"), 10),
        3,
        "a string claim"
    );
    let eval = evaluate(&e, &store, &claims("d", &(-2.0f64).to_le_bytes()), T0);
    assert!(eval.reports[0].limit_invalid);
    let eval = evaluate(&e, &store, &claims("e", &f64::NAN.to_le_bytes()), T0);
    assert!(eval.reports[0].limit_invalid);
}

#[test]
fn eight_bytes_of_a_header_are_text_not_a_double() {
    let e = engine(PER_TENANT);
    let store = MemoryStore::new();
    e.prepare(&store).unwrap();
    // 8 bytes that would read as 50.0 from metadata: from a header, not a number.
    let eval = evaluate(&e, &store, &tenant("a", Some("\0\0\0\0\0\0I@")), T0);
    assert!(eval.reports[0].limit_invalid);
}

#[test]
fn a_key_keeps_its_state_when_its_limit_changes() {
    let e = engine(PER_TENANT);
    let store = MemoryStore::new();
    e.prepare(&store).unwrap();
    assert_eq!(admitted(&e, &store, &tenant("a", Some("10")), 6), 6);
    // Lowered to 4: the window already counted 6, nothing more.
    assert_eq!(admitted(&e, &store, &tenant("a", Some("4")), 5), 0);
    // Raised to 8: two more.
    assert_eq!(admitted(&e, &store, &tenant("a", Some("8")), 5), 2);
}

/// A denial a worker cached for a key under one limit does not deny a request carrying
/// another: units and denials are kept per key and limit (envoyproxy/ratelimit#1077 is
/// this bug: a descriptor's cached over-limit answer denied requests with a higher limit).
#[test]
fn a_denial_cached_under_a_lower_limit_never_denies_a_higher_one() {
    let e = engine(
        r#"{"trusted_headers":["x-tenant-limit"],"rules":[{"name":"per-tenant",
            "key":[{"header":"x-tenant"}],"reservoir":{"max":8},
            "limit":{"algorithm":"fixed_window","window":"1h",
                     "limit":{"header":"x-tenant-limit","default":2,"max":100}}}]}"#,
    );
    let store = MemoryStore::new();
    e.prepare(&store).unwrap();
    let mut worker = e.worker();
    let low = tenant("a", Some("2"));
    let mut sources = Vec::new();
    for i in 0..20 {
        let eval = evaluate_on(&e, &store, &mut worker, &low, T0 + i);
        sources.push(eval.reports[0].source);
    }
    assert!(
        sources.contains(&Some(Source::DenialCache)),
        "the worker cached the low limit's denial: {sources:?}"
    );
    let high = tenant("a", Some("50"));
    let eval = evaluate_on(&e, &store, &mut worker, &high, T0 + 20);
    assert!(!eval.denied(), "{:?}", eval.reports[0]);
    assert_eq!(eval.reports[0].outcome, RuleOutcome::Allowed);
    assert_ne!(eval.reports[0].source, Some(Source::DenialCache));
}

/// Units a worker took ahead under one limit are spent only by requests carrying it:
/// a request carrying another decides in shared data.
#[test]
fn units_taken_ahead_serve_only_requests_carrying_their_limit() {
    let e = engine(
        r#"{"trusted_headers":["x-tenant-limit"],"rules":[{"name":"per-tenant",
            "key":[{"header":"x-tenant"}],"reservoir":{"max":8},
            "limit":{"algorithm":"token_bucket","refill":1000,"period":"1s",
                     "capacity":{"header":"x-tenant-limit","default":100,"max":1000}}}]}"#,
    );
    let store = MemoryStore::new();
    e.prepare(&store).unwrap();
    let mut worker = e.worker();
    let first = tenant("a", Some("500"));
    let mut from_reservoir = 0;
    for i in 0..200 {
        let eval = evaluate_on(&e, &store, &mut worker, &first, T0 + i * 100);
        from_reservoir += u32::from(eval.reports[0].source == Some(Source::Reservoir));
    }
    assert!(from_reservoir > 0, "the worker took units ahead");
    let other = tenant("a", Some("400"));
    let eval = evaluate_on(&e, &store, &mut worker, &other, T0 + 20_000);
    assert_eq!(eval.reports[0].source, Some(Source::Slot));
}

/// A global rule whose limit each request gives: the request asks Redis with its own,
/// and what this Envoy keeps for the key (leased units, a cached denial) serves only
/// requests carrying the same limit.
mod global {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;
    use weir_core::algorithms::GlobalLimit;
    use weir_core::engine::Engine;
    use weir_core::time::Micros;
    use weir_core::wire::v2::{self, Granted};

    fn engine_with(lease: &str) -> Engine {
        engine(&format!(
            r#"{{"bridge":{{"cluster":"weir_bridge"}},"trusted_headers":["x-tenant-limit"],
                "rules":[{{"name":"per-tenant","scope":"global","key":[{{"header":"x-tenant"}}],
                "global":{{{lease}}},
                "limit":{{"algorithm":"fixed_window","window":"1h",
                         "limit":{{"header":"x-tenant-limit","default":2,"max":100}}}}}}]}}"#
        ))
    }

    fn denial(remaining: u64) -> Granted {
        Granted {
            id: 0,
            allowed: false,
            granted: 0,
            limit: 2,
            remaining,
            retry_after_ns: Some(60_000_000_000),
            reset_after_ns: 60_000_000_000,
            now_us: T0,
            due_ns: 0,
            spacing_ns: 0,
            valid_ns: 0,
        }
    }

    #[test]
    fn a_request_asks_redis_with_its_own_limit() {
        let e = engine_with("");
        let store = MemoryStore::new();
        e.prepare(&store).unwrap();
        let eval = evaluate(&e, &store, &tenant("a", Some("7")), T0);
        let limit = eval.pending[0]
            .limit
            .as_ref()
            .map(|l| l.algorithm().parameters());
        assert_eq!(limit, Some(vec![7, 3_600_000_000]));
        let eval = evaluate(&e, &store, &tenant("a", None), T0);
        let limit: Option<&GlobalLimit> = eval.pending[0].limit.as_ref();
        assert_eq!(
            limit.map(|l| l.algorithm().parameters()),
            Some(vec![2, 3_600_000_000])
        );
    }

    #[test]
    fn a_denial_cached_under_a_lower_limit_never_denies_a_higher_one() {
        let e = engine_with(r#""lease":{"max":10}"#);
        let store = MemoryStore::new();
        e.prepare(&store).unwrap();
        let low = tenant("a", Some("2"));
        let mut eval = evaluate(&e, &store, &low, T0);
        assert_eq!(eval.pending.len(), 1);
        let answer = Ok(v2::Reply {
            items: vec![denial(0)],
        });
        e.complete(&mut eval, &store, Micros(T0), Micros(T0), answer);
        assert!(eval.denied());
        let eval = evaluate(&e, &store, &low, T0 + 10);
        assert_eq!(eval.reports[0].source, Some(Source::DenialCache));
        let eval = evaluate(&e, &store, &tenant("a", Some("50")), T0 + 20);
        assert_eq!(eval.pending.len(), 1, "the higher limit asks Redis");
    }
}

/// Whatever bytes a trusted header holds, the limit a request is decided by stays within
/// `min..=max`, and the request says it got the default exactly when the value was there
/// (not empty) but not a whole decimal number.
#[cfg(not(target_arch = "wasm32"))]
mod values {
    use super::*;
    use proptest::prelude::*;
    use weir_core::rules::parse_decimal;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

        #[test]
        fn any_value_decides_within_min_and_max(
            value in prop_oneof![
                prop::collection::vec(any::<u8>(), 0..40),
                "[0-9 ]{1,30}".prop_map(String::into_bytes),
                any::<u64>().prop_map(|n| n.to_string().into_bytes()),
            ],
        ) {
            let e = engine(
                r#"{"trusted_headers":["x-tenant-limit"],"rules":[{"name":"per-tenant",
                    "key":[{"header":"x-tenant"}],"reservoir":{"max":1},
                    "limit":{"algorithm":"fixed_window","window":"1h",
                             "limit":{"header":"x-tenant-limit","default":7,"min":3,"max":50}}}]}"#,
            );
            let store = MemoryStore::new();
            e.prepare(&store).unwrap();
            let request = FakeRequest::default()
                .header("x-tenant", "t")
                .header("x-tenant-limit", &value);
            let eval = evaluate(&e, &store, &request, T0);
            let limit = eval.verdicts[0].decision.limit;
            prop_assert!((3..=50).contains(&limit), "limit {limit}");
            // An empty value is no value, as for a key part.
            let whole = value.is_empty() || parse_decimal(&value).is_some();
            prop_assert_eq!(eval.reports[0].limit_invalid, !whole);
            if !whole || value.is_empty() {
                prop_assert_eq!(limit, 7);
            }
        }
    }
}
