//! What a client of a local rule sees: the IETF RateLimit headers and the legacy ones, a
//! custom status and body, shadow rules that never deny, and gRPC's RESOURCE_EXHAUSTED.

use super::*;

#[test]
fn ietf_headers_on_denials_and_allowed_responses() {
    // GCRA 2 per 10 s, burst 2: limit 3, T = 5 s, τ = 15 s.
    let config = r#"{
      "response": {"headers_on_allowed": true},
      "rules": [{"name":"per-user","key":[{"header":"x-user"}],
                 "limit":{"algorithm":"gcra","rate":2,"period":"10s","burst":2}}]}"#;
    let envoy = Envoy::shared(&weir(config), 2);
    let mut client = Client::connect(envoy.http_port).unwrap();
    let mut remaining_seen = Vec::new();
    for _ in 0..3 {
        let r = client
            .request(Request::get("/").header("x-user", "alice"))
            .unwrap();
        assert_eq!(r.status, 200);
        let policy = parse_sf_list(
            r.header("ratelimit-policy")
                .expect("RateLimit-Policy on allowed"),
        );
        assert_eq!(
            policy,
            vec![(
                "per-user".into(),
                [("q".into(), 3), ("w".into(), 15)].into()
            )]
        );
        let state = parse_sf_list(r.header("ratelimit").expect("RateLimit on allowed"));
        assert_eq!(state.len(), 1);
        let (name, params) = &state[0];
        assert_eq!(name, "per-user");
        remaining_seen.push(params["r"]);
        // After n requests the TAT is n × 5 s ahead: reset within (5n − 1, 5n] s.
        let n = remaining_seen.len() as u64;
        assert!(
            (5 * n - 1..=5 * n).contains(&params["t"]),
            "t={} after {n}",
            params["t"]
        );
        assert!(r.header("retry-after").is_none());
    }
    assert_eq!(remaining_seen, vec![2, 1, 0]);

    let denied = client
        .request(Request::get("/").header("x-user", "alice"))
        .unwrap();
    assert_eq!(denied.status, 429);
    // The next conforming instant is 5 s after the first request: 4 < retry ≤ 5.
    let retry: u64 = denied.header("retry-after").unwrap().parse().unwrap();
    assert!((4..=5).contains(&retry), "Retry-After {retry}");
    let state = parse_sf_list(denied.header("ratelimit").unwrap());
    assert_eq!(state[0].1["r"], 0);
    assert!((14..=15).contains(&state[0].1["t"]));
    assert_eq!(
        parse_sf_list(denied.header("ratelimit-policy").unwrap())[0].1["q"],
        3
    );
    assert_eq!(denied.header("content-type"), Some("application/json"));
    assert_eq!(
        denied.text(),
        format!(r#"{{"error":"rate_limited","rule":"per-user","retry_after":{retry}}}"#)
    );
    envoy.assert_no_panic();
}

#[test]
fn legacy_headers_and_custom_status_and_body() {
    let config = r#"{
      "response": {"status": 503, "header_style": "legacy", "headers_on_allowed": true,
                   "body": {"content_type": "text/plain", "text": "slow down"}},
      "rules": [{"name":"per-ip","key":[{"client_ip":{}}],
                 "limit":{"algorithm":"fixed_window","limit":2,"window":"1h"}}]}"#;
    let envoy = Envoy::shared(&weir(config), 1);
    let first = get(envoy.http_port, "/", &[]).unwrap();
    assert_eq!(first.header("x-ratelimit-limit"), Some("2"));
    assert_eq!(first.header("x-ratelimit-remaining"), Some("1"));
    let reset: u64 = first.header("x-ratelimit-reset").unwrap().parse().unwrap();
    assert!((1..=3600).contains(&reset));
    assert!(first.header("ratelimit").is_none());
    get(envoy.http_port, "/", &[]).unwrap();
    let denied = get(envoy.http_port, "/", &[]).unwrap();
    assert_eq!(denied.status, 503);
    assert_eq!(denied.text(), "slow down");
    assert_eq!(denied.header("x-ratelimit-remaining"), Some("0"));
    // A fixed window is retried at its end, which is also its reset.
    assert_eq!(
        denied.header("retry-after"),
        denied.header("x-ratelimit-reset")
    );
}

#[test]
fn shadow_rules_count_and_log_but_never_deny() {
    let config = r#"{
      "response": {"shadow_header": "x-weir-shadow"},
      "rules": [{"name":"trial","shadow":true,"key":[{"header":"x-user"}],
                 "limit":{"algorithm":"fixed_window","limit":2,"window":"1h"}}]}"#;
    let envoy = Envoy::shared(&weir(config), 2);
    let mut client = Client::connect(envoy.http_port).unwrap();
    let mut flagged = 0;
    for _ in 0..10 {
        let r = client
            .request(Request::get("/").header("x-user", "carol"))
            .unwrap();
        assert_eq!(r.status, 200, "a shadow rule denied");
        assert!(
            r.header("ratelimit").is_none(),
            "shadow rules stay out of RateLimit headers"
        );
        if r.header("x-weir-shadow") == Some("trial") {
            flagged += 1;
        }
    }
    assert_eq!(flagged, 8);
    assert_eq!(envoy.weir_stat("rule.trial.allowed"), 2);
    assert_eq!(envoy.weir_stat("rule.trial.shadow_limited"), 8);
    assert_eq!(envoy.weir_stat("rule.trial.limited"), 0);
    let log = envoy.log();
    assert_eq!(
        log.matches("shadow rule(s) trial would have limited this request")
            .count(),
        8
    );
}

#[test]
fn grpc_requests_get_resource_exhausted() {
    let config = r#"{"rules":[{"name":"calls","limit":{"algorithm":"token_bucket","capacity":1,"refill":1,"period":"1h"}}]}"#;
    let envoy = Envoy::shared(&weir(config), 1);
    let grpc = || {
        Request::post("/pkg.Service/Method", b"\0\0\0\0\0".to_vec())
            .header("content-type", "application/grpc")
            .header("te", "trailers")
    };
    assert_eq!(send(envoy.http_port, grpc()).unwrap().status, 200);
    let denied = send(envoy.http_port, grpc()).unwrap();
    assert_eq!(denied.status, 200, "gRPC denials are HTTP 200");
    assert_eq!(
        denied.header("grpc-status"),
        Some("8"),
        "{:?}",
        denied.headers
    );
    assert_eq!(
        denied.header("grpc-message"),
        Some("rate limited by rule calls")
    );
    assert_eq!(denied.header("content-type"), Some("application/grpc"));
    assert!(denied.header("retry-after").is_some());
    // A plain HTTP request under the same rule gets the 429.
    assert_eq!(get(envoy.http_port, "/", &[]).unwrap().status, 429);
}
