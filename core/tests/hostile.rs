//! Hostile clients against the filter's whole lifecycle (the scripted host playing
//! Envoy, weir-bridge's model answering calls): each trick a client can play on its own
//! requests, and what it must not win. Every test here failed on 20691aa, before the
//! fixes of issue 32; the search (`search_hostile.rs`) plays the same tricks at random.

use weir_core::filter::{Action, BodyAction};
use weir_scripted::scripted_envoy::Envoy;
use weir_testkit::simulation::ModelBridge;

#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test as test;

const T0: u64 = 1_750_000_000_000_000;
const MS: u64 = 1_000;

fn envoy(config: &str) -> Envoy {
    let mut envoy = Envoy::new(config).unwrap_or_else(|e| panic!("config refused: {e}"));
    envoy.set_now_us(T0);
    envoy
}

/// Answers every open call as weir-bridge would, from `bridge`'s model of Redis.
fn answer_calls(envoy: &mut Envoy, bridge: &mut ModelBridge) -> usize {
    let calls = envoy.open_calls();
    for call in &calls {
        match bridge.acquire(&call.body, envoy.now_us()) {
            Ok(reply) => envoy.answer(call.token, 200, &serde_json::to_vec(&reply).unwrap()),
            Err((status, body)) => envoy.answer(call.token, status, body.as_bytes()),
        }
    }
    calls.len()
}

/// Whether the request went on to the upstream: let through at once, or resumed, and
/// not answered by the filter.
fn reached_upstream(envoy: &Envoy, context: u32, first: Action) -> bool {
    let Some(stream) = envoy.stream(context) else {
        return false;
    };
    stream.local_reply.is_none() && (first == Action::Continue || stream.resumed > 0)
}

/// A token bucket of 5 an hour, leased up to 5 units, under each failure mode: a crowd
/// of 300 requests on one key, all at once on one worker, with a healthy bridge. On
/// 20691aa the 66th request on (a call holds its caller and 64 waiters) went to the
/// failure mode: 240 admitted with `allow`, 10 with `local`.
#[test]
fn a_crowd_on_one_key_gets_no_more_than_the_limit_from_a_healthy_bridge() {
    for failure_mode in ["allow", "local", "deny"] {
        let config = format!(
            r#"{{"bridge":{{"cluster":"weir_bridge"}},"rules":[
            {{"name":"tenant","scope":"global","key":[{{"header":"x-user"}}],
             "limit":{{"algorithm":"token_bucket","capacity":5,"refill":5,"period":"1h"}},
             "global":{{"lease":{{"max":5,"ttl":"1s"}},"failure_mode":"{failure_mode}"}}}}]}}"#
        );
        let mut envoy = envoy(&config);
        let mut bridge = ModelBridge::default();
        let crowd: Vec<(u32, Action)> = (0..300)
            .map(|_| envoy.request(&[(":path", "/"), ("x-user", "acme")]))
            .collect();
        // The bridge answers every call, as often as the filter makes new ones.
        for _ in 0..1_000 {
            envoy.advance_us(MS);
            if answer_calls(&mut envoy, &mut bridge) == 0 {
                break;
            }
        }
        assert!(envoy.open_calls().is_empty(), "{failure_mode}: calls left");
        let admitted = crowd
            .iter()
            .filter(|(context, first)| reached_upstream(&envoy, *context, *first))
            .count();
        assert_eq!(
            admitted, 5,
            "failure_mode {failure_mode}: a crowd of 300 against a limit of 5"
        );
        let answered = crowd
            .iter()
            .filter(|(context, _)| {
                envoy
                    .stream(*context)
                    .is_some_and(|s| s.local_reply.is_some())
            })
            .count();
        assert_eq!(
            answered, 295,
            "failure_mode {failure_mode}: every other request answered 429"
        );
    }
}

/// An exact global rule of 5 an hour per key, `failure_mode: allow`.
const EXACT_ALLOW: &str = r#"{"bridge":{"cluster":"weir_bridge","timeout":"40ms"},"rules":[
    {"name":"tenant","scope":"global","key":[{"header":"x-user"}],
     "limit":{"algorithm":"token_bucket","capacity":5,"refill":5,"period":"1h"},
     "global":{"failure_mode":"allow"}}]}"#;

/// A crowd over many keys fills the bridge cluster's circuit breaker: Envoy refuses
/// the calls beyond it at once. On 20691aa those requests took their rule's failure
/// mode (here: allowed); a full circuit breaker is not an outage, so they are denied,
/// to retry when the calls in flight have been answered. The first crowd an Envoy
/// sees too (the search found that case: seeds 103 and 144 of `search_hostile.rs`,
/// when a refusal with no call ever answered counted as "no host").
#[test]
fn a_crowd_that_fills_the_circuit_breaker_is_denied_not_let_through() {
    let mut envoy = envoy(EXACT_ALLOW);
    let mut bridge = ModelBridge::default();
    envoy.host.state().refuse.calls_in_flight = Some(4);
    let crowd: Vec<(u32, Action)> = (0..20)
        .map(|i| {
            let user = format!("u{i}");
            envoy.request(&[(":path", "/"), ("x-user", user.as_str())])
        })
        .collect();
    assert_eq!(envoy.open_calls().len(), 4, "four calls in flight");
    envoy.advance_us(MS);
    answer_calls(&mut envoy, &mut bridge);
    let admitted = crowd
        .iter()
        .filter(|(c, a)| reached_upstream(&envoy, *c, *a))
        .count();
    assert_eq!(admitted, 4, "only the requests whose calls Redis decided");
    for (context, _) in &crowd[4..] {
        let reply = envoy.stream(*context).and_then(|s| s.local_reply).unwrap();
        assert_eq!(reply.status, 429);
        let retry = reply.headers.iter().find(|(n, _)| n == "retry-after");
        assert_eq!(
            retry.map(|(_, v)| v.as_str()),
            Some("1"),
            "retry when the calls in flight are answered (40 ms, in whole seconds)"
        );
    }
    // Stats are sent at most every 100 ms.
    envoy.advance_us(200 * MS);
    let root = envoy.root;
    envoy.tick(root);
    let refused = envoy.host.state().metric("weir.weir.bridge.refused");
    assert_eq!(refused, Some(16));
}

/// A bridge cluster with no host refuses every call at once too, and Envoy takes no
/// call at all: that is an outage, and the failure mode applies.
#[test]
fn a_bridge_cluster_without_hosts_takes_the_failure_mode() {
    let mut envoy = envoy(EXACT_ALLOW);
    envoy.host.state().refuse.dispatch = true;
    let (context, action) = envoy.request(&[(":path", "/"), ("x-user", "acme")]);
    assert_eq!(action, Action::Continue, "failure_mode allow");
    assert!(reached_upstream(&envoy, context, action));

    // After calls were taken, a cluster whose calls are all refused for longer than
    // the timeout (and 100 ms) has no host: the failure mode again.
    let mut envoy = self::envoy(EXACT_ALLOW);
    let mut bridge = ModelBridge::default();
    let (warm, first) = envoy.request(&[(":path", "/"), ("x-user", "warm")]);
    answer_calls(&mut envoy, &mut bridge);
    assert!(reached_upstream(&envoy, warm, first));
    envoy.host.state().refuse.dispatch = true;
    let (soon, action) = envoy.request(&[(":path", "/"), ("x-user", "acme")]);
    assert_eq!(
        action,
        Action::Pause,
        "denied: Envoy took a call a moment ago"
    );
    assert_eq!(envoy.stream(soon).unwrap().local_reply.unwrap().status, 429);
    envoy.advance_us(200 * MS);
    let (later, action) = envoy.request(&[(":path", "/"), ("x-user", "acme")]);
    assert_eq!(
        action,
        Action::Continue,
        "no call taken for 200 ms: an outage"
    );
    assert!(reached_upstream(&envoy, later, action));
}

/// A local token budget of 100 per key; each request reserves the estimate of its
/// `x-estimate` header and settles the usage header of its response, `on_error` 0.
const BUDGET: &str = r#"{"rules":[
    {"name":"tokens","key":[{"header":"x-user"}],
     "limit":{"algorithm":"token_bucket","capacity":100,"refill":100,"period":"1h"},
     "cost":{"header":"x-estimate","max":100},
     "commit":{"header":"x-usage","on_error":0}}]}"#;

/// A client makes Envoy answer for the upstream — a generation longer than the route's
/// timeout gets Envoy's 504 — while the upstream goes on generating. On 20691aa any 5xx
/// settled at `on_error` (0 here): the key got its 60 tokens back, as often as the
/// client liked. Only the upstream's own 5xx may.
#[test]
fn envoys_own_504_keeps_the_estimate_and_only_the_upstreams_5xx_settles_at_on_error() {
    let ask = [(":path", "/"), ("x-user", "acme"), ("x-estimate", "60")];
    let mut envoy = envoy(BUDGET);
    let (timed_out, action) = envoy.request(&ask);
    assert_eq!(action, Action::Continue);
    envoy.local_reply(timed_out, 504, "upstream_response_timeout");
    envoy.close(timed_out);
    let (again, action) = envoy.request(&ask);
    assert_eq!(
        action,
        Action::Pause,
        "40 left: the 504 kept the 60 reserved"
    );
    assert_eq!(
        envoy.stream(again).unwrap().local_reply.unwrap().status,
        429
    );

    // The upstream's own 503 is a response that happened: `on_error`.
    let mut envoy = self::envoy(BUDGET);
    let (failed, action) = envoy.request(&ask);
    assert_eq!(action, Action::Continue);
    envoy.respond(failed, 503, &[], b"overloaded");
    envoy.close(failed);
    let (again, action) = envoy.request(&ask);
    assert_eq!(
        action,
        Action::Continue,
        "the upstream's 503 gave the 60 back"
    );
    assert!(envoy.stream(again).unwrap().local_reply.is_none());
}

/// A global token budget of 100 an hour per key, each request estimated from its body
/// (read up to 1 KiB; a longer one costs the `max`, 100).
const GLOBAL_BODY: &str = r#"{"bridge":{"cluster":"weir_bridge"},"rules":[
    {"name":"tokens","scope":"global","key":[{"header":"x-user"}],
     "limit":{"algorithm":"token_bucket","capacity":100,"refill":100,"period":"1h"},
     "cost":{"body":{"max_bytes":1024},"default":10,"max":100}}]}"#;

/// A body over `max_bytes` is decided at `max` at once, but a global rule then waits
/// for the bridge. On 20691aa the rest of the body went on to the upstream meanwhile:
/// a request the bridge then denied reached the upstream with its whole body (an LLM
/// upstream generates for it), and nothing was charged. No byte of a body may go on
/// before every rule has admitted the request.
#[test]
fn no_byte_of_a_body_goes_on_before_the_bridge_admits_the_request() {
    let mut envoy = envoy(GLOBAL_BODY);
    let mut bridge = ModelBridge::default();
    let piece = vec![b'x'; 1_000];
    let headers = [(":path", "/v1/chat"), ("x-user", "acme")];
    let mut requests = Vec::new();
    for _ in 0..3 {
        let (context, on_headers) = envoy.request_headers(&headers);
        assert_eq!(on_headers, Action::Continue, "the headers go on");
        assert_eq!(envoy.body(context, &piece, false), Some(BodyAction::Read));
        // Past 1 KiB: decided at the max, and asking the bridge.
        assert_eq!(envoy.body(context, &piece, false), Some(BodyAction::Hold));
        assert_eq!(envoy.body(context, &piece, true), Some(BodyAction::Hold));
        let upstream = envoy.stream(context).unwrap().upstream;
        assert!(upstream.headers && upstream.body.is_empty(), "{upstream:?}");
        requests.push(context);
    }
    envoy.advance_us(MS);
    answer_calls(&mut envoy, &mut bridge);
    let first = envoy.stream(requests[0]).unwrap();
    assert!(first.local_reply.is_none());
    assert_eq!(
        first.upstream.body.len(),
        3_000,
        "admitted: the whole body went on"
    );
    assert!(first.upstream.ended);
    for &denied in &requests[1..] {
        let stream = envoy.stream(denied).unwrap();
        assert_eq!(stream.local_reply.unwrap().status, 429);
        assert!(
            stream.upstream.body.is_empty() && stream.upstream.reset,
            "denied: the upstream saw its headers at most, then a reset"
        );
    }
}

/// A global token budget whose rule clamps: the body is read whole, the rule waits for
/// the bridge, and the answer's clamp rewrites the body. Envoy's Wasm host lets the
/// answer's callback reach the body only if the last body callback buffered it
/// (`StopIterationAndBuffer`): after `StopIterationAndWatermark` it points at a piece
/// that is gone, and Envoy 1.40 crashed (a segmentation fault, in the e2e test
/// `a_clamped_request_reaches_the_upstream_with_what_is_left`) when an earlier version
/// of this issue's fix held such a body that way.
#[test]
fn a_global_clamp_rewrites_a_body_envoy_still_buffers() {
    let mut envoy = envoy(
        r#"{"bridge":{"cluster":"weir_bridge"},"rules":[
        {"name":"tokens","scope":"global","key":[{"header":"x-user"}],
         "limit":{"algorithm":"token_bucket","capacity":1000,"refill":1000,"period":"1h"},
         "cost":{"body":{},"default":300,"max":1000},"commit":{"body":{},"clamp":{}}}]}"#,
    );
    let mut bridge = ModelBridge::default();
    let headers = [(":path", "/v1/chat"), ("x-user", "acme")];
    let body = br#"{"max_tokens":600}"#;
    let mut sent = Vec::new();
    for _ in 0..2 {
        let (context, on_headers, on_body) = envoy.request_with_body(&headers, body);
        assert_eq!(on_headers, Action::Continue);
        assert_eq!(
            on_body,
            Some(BodyAction::Read),
            "buffered while the bridge decides"
        );
        envoy.advance_us(MS);
        answer_calls(&mut envoy, &mut bridge);
        sent.push(envoy.stream(context).unwrap().upstream.body);
    }
    assert_eq!(envoy.host.state().dangling_body, 0);
    assert_eq!(sent[0], body, "605 of 1,000: unchanged");
    assert_eq!(sent[1], br#"{"max_tokens":390}"#, "395 left: clamped");
}

/// Envoy may turn a call away after taking it: a stream over `max_pending_requests`
/// while the bridge's connection opens gets Envoy's own 503 with `x-envoy-overloaded`;
/// and a call sent once more (after Envoy's 503 for a connection that failed) may be
/// refused at once. Both are a full circuit breaker, not a bridge that is down: the e2e
/// crowd on a cold Envoy let two such requests through under `allow` on an earlier
/// version of this fix.
#[test]
fn a_call_envoy_turns_away_for_its_circuit_breaker_after_taking_it_is_denied() {
    // Envoy's 503 for an overflow.
    let mut envoy = envoy(EXACT_ALLOW);
    let (context, action) = envoy.request(&[(":path", "/"), ("x-user", "acme")]);
    assert_eq!(action, Action::Pause);
    let call = envoy.open_calls()[0].token;
    envoy.advance_us(MS);
    envoy.answer_with_headers(
        call,
        503,
        &[("x-envoy-overloaded", "true")],
        b"upstream connect error or disconnect/reset before headers. reset reason: overflow",
    );
    assert_eq!(
        envoy.stream(context).unwrap().local_reply.unwrap().status,
        429
    );
    assert!(!reached_upstream(&envoy, context, action));

    // Envoy's 503 for a connection that failed, then the second send refused.
    let mut envoy = self::envoy(EXACT_ALLOW);
    let (context, action) = envoy.request(&[(":path", "/"), ("x-user", "acme")]);
    let call = envoy.open_calls()[0].token;
    envoy.host.state().refuse.calls_in_flight = Some(0);
    envoy.advance_us(MS);
    envoy.answer(
        call,
        503,
        b"upstream connect error or disconnect/reset before headers",
    );
    assert_eq!(
        envoy.stream(context).unwrap().local_reply.unwrap().status,
        429
    );
    assert!(!reached_upstream(&envoy, context, action));
}
