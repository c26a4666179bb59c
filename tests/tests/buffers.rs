//! A VM's budget of buffered bytes (`max_buffered_bytes`) in a real Envoy: many large
//! request bodies held at once keep no more than the budget in the VM, and a body that
//! does not fit is estimated at the cost's `max` (issue 19, defect 10: a delay queue of
//! 10,000 held requests with 512 KiB bodies was 5 GiB in a wasm32 VM).

use std::collections::BTreeMap;
use std::thread;
use weir_e2e::{send, wasm_filter_yaml, weir_wasm, Envoy, LlmUpstream, Request};

/// A body of about `bytes` bytes asking for one token.
fn big_body(bytes: usize) -> String {
    format!(r#"{{"max_tokens":1,"pad":"{}"}}"#, "x".repeat(bytes))
}

#[test]
fn held_requests_keep_at_most_the_budget_and_a_body_that_does_not_fit_costs_max() {
    // 1 MiB per VM; bodies of 300 KiB: three fit. The rule holds requests up to 5 s for
    // a bucket of 10 refilled every 2 s; a request costs its max_tokens (1), or 10 when
    // its body cannot be read.
    let config = r#"{"max_buffered_bytes":1048576,"stats":"detailed","rules":[{"name":"tokens",
        "key":[{"header":"x-tenant"}],
        "limit":{"algorithm":"token_bucket","capacity":10,"refill":10,"period":"2s"},
        "cost":{"body":{"bytes_per_prompt_token":0,"max_bytes":524288},"default":1,"max":10},
        "on_limit":{"delay":{"max":"5s","queue":100}}}]}"#;
    let upstream = LlmUpstream::start();
    let bootstrap = upstream.bootstrap(wasm_filter_yaml(config, &weir_wasm()), None);
    // One worker: one VM, one budget.
    let envoy = Envoy::shared(&bootstrap, 1);
    let chat = |body: String| {
        Request::post("/v1/chat/completions", body)
            .header("content-type", "application/json")
            .header("x-tenant", "acme")
    };
    // Empty the bucket with small bodies.
    for _ in 0..10 {
        let r = send(envoy.http_port, chat(big_body(10))).unwrap();
        assert_eq!(r.status, 200);
    }
    // Six large bodies at once: all wait for the refill in 2 s, bodies in the VM.
    let statuses: Vec<u16> = thread::scope(|s| {
        let handles: Vec<_> = (0..6)
            .map(|_| {
                let port = envoy.http_port;
                s.spawn(move || send(port, chat(big_body(300 << 10))).unwrap().status)
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut by_status = BTreeMap::new();
    for status in &statuses {
        *by_status.entry(*status).or_insert(0u32) += 1;
    }
    // Three bodies fit and cost 1 each; the other three cost 10: one fits the refill
    // after (4 s), two would wait past 5 s and are denied.
    assert_eq!(envoy.weir_stat("vm.buffer_full"), 3, "{by_status:?}");
    assert_eq!(by_status.get(&200), Some(&4), "{by_status:?}");
    assert_eq!(by_status.get(&429), Some(&2), "{by_status:?}");
    envoy.assert_no_panic();
}

/// A token budget read from JSON responses, with `max_buffered_bytes` of 1 MiB.
const RESPONSE_RULE: &str = r#"{"max_buffered_bytes":1048576,"stats":"detailed","rules":[{"name":"tokens",
    "key":[{"header":"x-tenant"}],
    "limit":{"algorithm":"token_bucket","capacity":100000,"refill":100000,"period":"1h"},
    "cost":{"header":"x-estimate","max":50000},
    "commit":{"body":{"max_bytes":4194304}}}]}"#;

fn padded_chat(pad: usize, duration_ms: u64) -> Request {
    Request::post("/v1/chat/completions", r#"{"model":"m","messages":[]}"#)
        .header("content-type", "application/json")
        .header("x-tenant", "acme")
        .header("x-estimate", "1000")
        .header("x-llm-usage", "10")
        .header("x-llm-pad", pad.to_string())
        .header("x-llm-duration-ms", duration_ms.to_string())
}

/// What the key has left, read from the RateLimit headers of a 1-token request.
fn remaining(envoy: &Envoy) -> u64 {
    let r = send(
        envoy.http_port,
        Request::post("/v1/chat/completions", "{}")
            .header("x-tenant", "acme")
            .header("x-estimate", "1")
            .header("x-llm-usage", "1"),
    )
    .unwrap();
    assert_eq!(r.status, 200);
    let header = r.header("ratelimit").expect("RateLimit header").to_string();
    let r_value = header
        .split(';')
        .find_map(|p| p.trim().strip_prefix("r="))
        .unwrap_or_else(|| panic!("no r= in {header}"));
    r_value.parse::<u64>().unwrap() + 1
}

#[test]
fn a_response_body_over_the_budget_is_not_read_and_keeps_its_estimate() {
    let upstream = LlmUpstream::start();
    let config = RESPONSE_RULE.replace(
        r#""rules""#,
        r#""response":{"header_style":"ietf","headers_on_allowed":true},"rules""#,
    );
    let bootstrap = upstream.bootstrap(wasm_filter_yaml(&config, &weir_wasm()), None);
    let envoy = Envoy::shared(&bootstrap, 1);
    // Under max_bytes (4 MiB) but over the VM's budget (1 MiB): not read, the estimate
    // of 1,000 stays charged.
    let r = send(envoy.http_port, padded_chat(2 << 20, 0)).unwrap();
    assert_eq!(r.status, 200);
    assert!(r.body.len() > 2 << 20);
    assert_eq!(envoy.weir_stat("vm.buffer_full"), 1);
    assert_eq!(envoy.weir_stat("rule.tokens.commit_over_max_bytes"), 1);
    assert_eq!(remaining(&envoy), 100_000 - 1_000);
    // A body that fits is read: 10 tokens charged, 990 given back.
    let r = send(envoy.http_port, padded_chat(100 << 10, 0)).unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(
        envoy.weir_stat("rule.tokens.commit_usage_read"),
        2,
        "this and the probe"
    );
    assert_eq!(remaining(&envoy), 100_000 - 1_000 - 1 - 10);
    envoy.assert_no_panic();
}

#[test]
fn concurrent_large_responses_share_the_budget() {
    let upstream = LlmUpstream::start();
    let bootstrap = upstream.bootstrap(wasm_filter_yaml(RESPONSE_RULE, &weir_wasm()), None);
    let envoy = Envoy::shared(&bootstrap, 1);
    // Eight responses of 400 KiB, each half-sent and then paused for 500 ms: eight
    // halves (1.6 MiB) do not fit in 1 MiB at once.
    let statuses: Vec<u16> = thread::scope(|s| {
        let handles: Vec<_> = (0..8)
            .map(|_| {
                let port = envoy.http_port;
                s.spawn(move || send(port, padded_chat(400 << 10, 500)).unwrap().status)
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(statuses.iter().all(|&s| s == 200), "{statuses:?}");
    let read = envoy.weir_stat("rule.tokens.commit_usage_read");
    let unread = envoy.weir_stat("rule.tokens.commit_over_max_bytes");
    println!("8 responses of 400 KiB at once: {read} read, {unread} not (budget full)");
    assert_eq!(read + unread, 8);
    assert!(
        unread >= 3,
        "at most 5 halves fit at once: {read} read, {unread} not"
    );
    assert!(read >= 1, "{read} read, {unread} not");
    assert!(envoy.weir_stat("vm.buffer_full") >= unread);
    envoy.assert_no_panic();
}
