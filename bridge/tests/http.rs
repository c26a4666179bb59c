//! The HTTP surface without Redis: authentication, body limits, validation messages, and
//! what a request gets when no Redis node answers. The cluster client connects lazily, so
//! the app starts with its seed pointing at a closed port.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use std::time::{Duration, Instant};
use tower::ServiceExt;
use weir_bridge::{app, state_from_client, AppState, Secret};
use weir_protocol::bounds::MAX_BODY_BYTES;
use weir_protocol::wire::v1::ACQUIRE_PATH;
use weir_protocol::wire::SECRET_HEADER;

const SECRET: &str = "s3cret-for-tests";
const TIMEOUT: Duration = Duration::from_millis(100);

fn state(secret: Option<&str>) -> AppState {
    // Nothing listens there: every Redis call fails (connection refused).
    let port = weir_e2e::free_port();
    let client = redis::cluster::ClusterClient::builder(vec![format!("redis://127.0.0.1:{port}")])
        .build()
        .unwrap();
    state_from_client(&client, TIMEOUT, TIMEOUT, secret.map(Secret::new))
}

async fn call(state: &AppState, request: Request<Body>) -> (StatusCode, String) {
    let response = app(state.clone()).oneshot(request).await.unwrap();
    let status = response.status();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8(body.to_vec()).unwrap())
}

fn acquire(body: impl Into<Body>, secret: Option<&str>) -> Request<Body> {
    let mut r = Request::post(ACQUIRE_PATH).header("content-type", "application/json");
    if let Some(s) = secret {
        r = r.header(SECRET_HEADER, s);
    }
    r.body(body.into()).unwrap()
}

fn error_of(body: &str) -> String {
    let v: serde_json::Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{body}: {e}"));
    v["error"].as_str().unwrap().to_string()
}

const GOOD: &str = r#"{"domain":"weir","items":[{"rule":"r","descriptor":["=alice"],
    "limit":{"algorithm":"fixed_window","limit":10,"window_us":1000000},"cost":1,"want":1}]}"#;

#[tokio::test]
async fn a_missing_or_wrong_secret_is_401() {
    let s = state(Some(SECRET));
    for secret in [
        None,
        Some("wrong"),
        Some(""),
        Some("s3cret-for-tests-and-more"),
    ] {
        let (status, body) = call(&s, acquire(GOOD, secret)).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{secret:?}");
        assert_eq!(error_of(&body), "missing or wrong x-weir-secret");
    }
    // Authentication comes first: an unauthenticated client learns nothing about the body.
    let (status, _) = call(&s, acquire("{", None)).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
}

/// During a rotation both secrets pass; anything else is still 401.
#[tokio::test]
async fn the_current_and_the_next_secret_are_both_accepted() {
    let mut s = state(None);
    s.secret = Some(Secret::new(SECRET).with_next("the-next-one"));
    // Past authentication, the body is read: "{" is a 400.
    for secret in [SECRET, "the-next-one"] {
        let (status, body) = call(&s, acquire("{", Some(secret))).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{secret}: {body}");
    }
    for secret in [
        None,
        Some(""),
        Some("the-next"),
        Some("s3cret-for-teststhe-next-one"),
    ] {
        let (status, body) = call(&s, acquire("{", secret)).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{secret:?}");
        assert_eq!(error_of(&body), "missing or wrong x-weir-secret");
    }
    // Once the rotation ends, the old secret is refused.
    s.secret = Some(Secret::new("the-next-one"));
    let (status, _) = call(&s, acquire("{", Some(SECRET))).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn an_oversized_body_is_413() {
    let s = state(Some(SECRET));
    let big = format!("{GOOD}{}", " ".repeat(MAX_BODY_BYTES + 1 - GOOD.len()));
    let (status, body) = call(&s, acquire(big, Some(SECRET))).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(
        error_of(&body),
        format!("body larger than {MAX_BODY_BYTES} bytes")
    );
    // Exactly the limit is read (and then parsed).
    let fits = format!("{GOOD}{}", " ".repeat(MAX_BODY_BYTES - GOOD.len()));
    let (status, _) = call(&s, acquire(fits, Some(SECRET))).await;
    assert_ne!(status, StatusCode::PAYLOAD_TOO_LARGE);
}

#[tokio::test]
async fn bad_requests_are_400_naming_the_field() {
    let s = state(None);
    let cases = [
        ("{", "EOF while parsing an object"),
        ("[]", "invalid length 0, expected struct AcquireRequest"),
        (r#"{"domain":"weir"}"#, "missing field `items`"),
        (
            r#"{"domain":"weir","items":[{"rule":"r","descriptor":[],"limit":{"algorithm":"leaky","limit":1},"cost":1,"want":1}]}"#,
            "items[0].limit.algorithm: unknown variant `leaky`, expected one of `token_bucket`, `gcra`, `fixed_window`, `sliding_window`, `sliding_log`",
        ),
        (
            r#"{"domain":"weir","items":[{"rule":"r","descriptor":[],"limit":{"algorithm":"gcra","burst":1,"period_us":1000},"cost":1,"want":1}]}"#,
            "items[0].limit: missing field `rate` of gcra",
        ),
        (
            r#"{"domain":"weir","items":[{"rule":"r","descriptor":[],"limit":{"algorithm":"fixed_window","limit":10,"window_us":1},"cost":1}]}"#,
            "items[0]: missing field `want`",
        ),
        (
            r#"{"domain":"weir","items":[{"rule":"r","descriptor":[],"limit":{"algorithm":"fixed_window","limit":10,"window_us":1},"cost":1,"want":0}]}"#,
            "items[0].want: 0 must be between cost (1) and 1000000",
        ),
        (
            r#"{"domain":"weir","items":[{"rule":"r","descriptor":[],"limit":{"algorithm":"fixed_window","limit":10,"window_us":1},"cost":0,"want":1}]}"#,
            "items[0].cost: 0 is out of range: expected 1 to what the limit can ever admit (10)",
        ),
        (
            r#"{"domain":"weir","items":[]}"#,
            "items: must hold 1 to 64 items",
        ),
        (
            r#"{"domain":"weir","items":[{"rule":"r","descriptor":[],"limit":{"algorithm":"fixed_window","limit":10,"window_us":1000000000000000},"cost":1,"want":1}]}"#,
            "items[0].limit.window_us: must be at most 2^48 us for exact arithmetic in Redis",
        ),
    ];
    for (body, message) in cases {
        let (status, reply) = call(&s, acquire(body, None)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
        let got = error_of(&reply);
        assert!(
            got.contains(message),
            "{body}: got {got:?}, want {message:?}"
        );
    }
}

#[tokio::test]
async fn without_redis_requests_fail_fast_with_503() {
    let s = state(Some(SECRET));
    let started = Instant::now();
    let (status, body) = call(&s, acquire(GOOD, Some(SECRET))).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert!(error_of(&body).starts_with("redis unavailable ("), "{body}");
    assert!(
        started.elapsed() < TIMEOUT * 5,
        "answered in {:?}",
        started.elapsed()
    );

    let (status, body) = call(&s, Request::get("/healthz").body(Body::empty()).unwrap()).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(body.starts_with("redis unavailable"), "{body}");

    let (status, text) = call(&s, Request::get("/metrics").body(Body::empty()).unwrap()).await;
    assert_eq!(status, StatusCode::OK);
    // The acquire and the health check.
    assert!(
        text.contains(r#"weir_bridge_requests_total{code="503"} 2"#),
        "{text}"
    );
    assert!(text.contains("weir_bridge_errors_total{class="), "{text}");
}

#[tokio::test]
async fn metrics_count_statuses_and_error_classes() {
    let s = state(Some(SECRET));
    call(&s, acquire(GOOD, None)).await;
    call(&s, acquire("{", Some(SECRET))).await;
    call(&s, acquire("{", Some(SECRET))).await;
    let (status, _) = call(&s, Request::get("/nope").body(Body::empty()).unwrap()).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (_, text) = call(&s, Request::get("/metrics").body(Body::empty()).unwrap()).await;
    for line in [
        r#"weir_bridge_requests_total{code="401"} 1"#,
        r#"weir_bridge_requests_total{code="400"} 2"#,
        r#"weir_bridge_requests_total{code="404"} 1"#,
        r#"weir_bridge_errors_total{class="unauthorized"} 1"#,
        r#"weir_bridge_errors_total{class="bad_request"} 2"#,
        "weir_bridge_items_evaluated_total 0",
    ] {
        assert!(text.contains(line), "{line} missing from\n{text}");
    }
}
