//! `commit.clamp`: a request whose estimate is more than its key has left goes on with its
//! body's max-token fields lowered to what is left, over HTTP/1.1 and HTTP/2, as the docs say.

use super::*;

/// The usage a stand-in's JSON answer reports (`usage.total_tokens`).
fn reported_usage(body: &[u8]) -> u64 {
    let value: serde_json::Value = serde_json::from_slice(body).expect("a JSON answer");
    value["usage"]["total_tokens"].as_u64().expect("a usage")
}

/// A chat whose body asks for `max_tokens` (none: `None`) from a model that would write
/// `output` tokens; the stand-in reports the prompt as `prompt` tokens.
fn clamped_chat(tenant: &str, max_tokens: Option<u64>, output: u64, prompt: u64) -> Request {
    let body = match max_tokens {
        Some(n) => format!(r#"{{"max_tokens":{n}}}"#),
        None => "{}".to_string(),
    };
    Request::post("/v1/chat/completions", body)
        .header("content-type", "application/json")
        .header("x-tenant", tenant)
        .header("x-llm-output", output.to_string())
        .header("x-llm-usage", prompt.to_string())
}

/// `commit.clamp`, one request at a time: a request over what is left reaches the
/// upstream with its `max_tokens` lowered to it; one whose prompt does not fit gets 429;
/// a body without a bound gets one. Local, and global through Redis.
#[test]
fn a_clamped_request_reaches_the_upstream_with_what_is_left() {
    let redis = RedisCluster::start(3, 1);
    let bridge = Bridge::start(&redis, &[]);
    for global in [false, true] {
        let upstream = LlmUpstream::start();
        let (bridge_json, scope) = if global {
            (
                r#""bridge":{"cluster":"weir_bridge","timeout":"500ms"},"#,
                r#""scope":"global","#,
            )
        } else {
            ("", "")
        };
        let config = format!(
            r#"{{{bridge_json}"rules":[{{"name":"tokens",{scope}"key":[{{"header":"x-tenant"}}],
            "limit":{{"algorithm":"token_bucket","capacity":1000,"refill":1000,"period":"1h"}},
            "cost":{{"body":{{}},"default":300,"max":1000}},
            "commit":{{"body":{{}},"clamp":{{}}}}}}]}}"#
        );
        let bootstrap = upstream.bootstrap(
            wasm_filter_yaml(&with_stats(&config, "detailed"), &weir_wasm()),
            global.then_some(bridge.port),
        );
        let envoy = Envoy::shared(&bootstrap, 2);
        let mut client = Client::connect(envoy.http_port).unwrap();
        let mut send = |request: Request| {
            let r = client.request(request).unwrap();
            let used = (r.status == 200).then(|| reported_usage(&r.body));
            (r.status, used)
        };
        // `{"max_tokens":600}`: 18 bytes, a prompt of 5; 605 reserved and used.
        assert_eq!(
            send(clamped_chat("acme", Some(600), 600, 5)),
            (200, Some(605))
        );
        // 395 left: reserved whole, sent with 390, and the model stops there.
        assert_eq!(
            send(clamped_chat("acme", Some(600), 600, 5)),
            (200, Some(395))
        );
        // Nothing left for the prompt: 429.
        assert_eq!(send(clamped_chat("acme", Some(600), 600, 5)).0, 429);
        // No bound in the body: the default estimate's output (300 less a prompt of 1)
        // is written in, and a model that would write 5,000 writes that.
        assert_eq!(send(clamped_chat("bo", None, 5_000, 1)), (200, Some(300)));
        wait_until(Duration::from_secs(2), Duration::from_millis(5), || {
            upstream.answered() >= 3
        });
        assert_eq!(
            upstream.bounds_received(),
            vec![Some(600), Some(390), Some(299)],
            "global: {global}"
        );
        assert_eq!(envoy.weir_stat("rule.tokens.commit_clamped"), 1);
        envoy.assert_no_panic();
    }
}

/// Many clients against one budget, with and without `commit.clamp`: the clamps spend
/// what the reservations alone leave at the end, and the budget is never overrun — the
/// conformance checker judges what each request that reached the upstream really used.
#[test]
fn clamping_spends_the_budget_that_reservations_leave() {
    let upstream = LlmUpstream::start();
    let mut used_by = Vec::new();
    for clamp in [false, true] {
        let config = format!(
            r#"{{"rules":[{{"name":"tokens","key":[{{"header":"x-tenant"}}],
            "limit":{{"algorithm":"token_bucket","capacity":20000,"refill":20000,"period":"1h"}},
            "cost":{{"body":{{}},"default":1000,"max":4000}},
            "commit":{{"body":{{}}{}}}}}]}}"#,
            if clamp { r#","clamp":{}"# } else { "" }
        );
        // Each line keyed by what the model really used, within the body it received.
        let config = with_decisions(&config);
        let dir = TestDir::new("clamp-budget");
        let logs = Logs::by_response_header(dir.path(), 1, USED_HEADER);
        let filter = wasm_filter_yaml(&with_stats(&config, "detailed"), &weir_wasm());
        let envoy = Envoy::shared(&logs.add_to(0, upstream.bootstrap(filter, None)), 2);
        let used = AtomicU64::new(0);
        let limited = AtomicU64::new(0);
        thread::scope(|s| {
            for t in 0..8u64 {
                let (used, limited) = (&used, &limited);
                let port = envoy.http_port;
                s.spawn(move || {
                    let mut client = Client::connect(port).unwrap();
                    for i in 0..30u64 {
                        let max_tokens = 200 + (t * 131 + i * 277) % 801;
                        let output = max_tokens * (20 + (t * 7 + i * 13) % 81) / 100;
                        let r = client
                            .request(clamped_chat("acme", Some(max_tokens), output, 4))
                            .unwrap();
                        match r.status {
                            200 => {
                                used.fetch_add(reported_usage(&r.body), Ordering::Relaxed);
                            }
                            429 => {
                                limited.fetch_add(1, Ordering::Relaxed);
                                thread::sleep(Duration::from_millis(5));
                            }
                            s => panic!("status {s}"),
                        }
                    }
                });
            }
        });
        let used = used.load(Ordering::Relaxed);
        eprintln!(
            "clamp {clamp}: {used} of 20,000 tokens used, {} limited, {} clamped",
            limited.load(Ordering::Relaxed),
            envoy.weir_stat("rule.tokens.commit_clamped")
        );
        assert!(used <= 20_000, "the budget was overrun: {used}");
        // Every request that reached the upstream, at what it used, keeps the bound.
        assert_eq!(assert_conformant_at_actual_cost(&config, &logs, 240), used);
        assert!(limited.load(Ordering::Relaxed) > 0, "the budget ran out");
        envoy.assert_no_panic();
        used_by.push(used);
    }
    // Without clamps a request is denied while less than its estimate is left; with
    // them it takes what is left, down to its prompt and one token.
    assert!(
        used_by[1] > used_by[0] && used_by[1] >= 19_900,
        "used without / with clamps: {used_by:?}"
    );
}

/// The clamp example of docs/configuration.md, as written there.
#[test]
fn the_documented_clamp_works_as_the_docs_say() {
    let upstream = LlmUpstream::start();
    let envoy = start(
        &weir_e2e::documented_json("docs/configuration.md", "llm-clamp-example"),
        &upstream,
        2,
    );
    let mut client = Client::connect(envoy.http_port).unwrap();
    // A request asking for 16,000 tokens of output and a prompt of ⌈31 / 4⌉ = 8 is
    // reserved the cost's `max`, 16,000, and sent with 16,000 − 8 of output: all of it
    // used by a model that writes as much as it may.
    let body = r#"{"max_completion_tokens":16000}"#;
    let prompt = (body.len() as u64).div_ceil(4);
    assert_eq!(prompt, 8);
    let call = |key: &str, body: &str, prompt: u64| {
        Request::post("/v1/chat/completions", body.to_string())
            .header("x-api-key", key)
            .header("x-llm-output", "100000")
            .header("x-llm-usage", prompt.to_string())
    };
    for _ in 0..6 {
        let r = client.request(call("key-1", body, prompt)).unwrap();
        assert_eq!((r.status, reported_usage(&r.body)), (200, 16_000));
    }
    // The seventh: the 4,000 left, its output lowered to 4,000 − 8.
    let r = client.request(call("key-1", body, prompt)).unwrap();
    assert_eq!((r.status, reported_usage(&r.body)), (200, 4_000));
    // The eighth: nothing left.
    assert_eq!(
        client.request(call("key-1", body, prompt)).unwrap().status,
        429
    );
    // Another key, a body without a bound: 4,000 less its prompt (⌈2 / 4⌉) written in.
    let r = client.request(call("key-2", "{}", 1)).unwrap();
    assert_eq!((r.status, reported_usage(&r.body)), (200, 4_000));
    wait_until(Duration::from_secs(2), Duration::from_millis(5), || {
        upstream.bounds_received().len() >= 8
    });
    let mut expected = vec![Some(16_000 - prompt); 6];
    expected.extend([Some(4_000 - prompt), Some(3_999)]);
    assert_eq!(upstream.bounds_received(), expected);
    assert_eq!(envoy.weir_stat("rule.tokens-per-key.commit_clamped"), 1);
    envoy.assert_no_panic();
}

/// `commit.clamp` for a client speaking HTTP/2 (curl, prior knowledge), whose request
/// carries a `content-length`: the clamped body reaches the HTTP/1.1 upstream whole.
#[test]
fn a_clamped_http2_request_reaches_the_upstream_lowered() {
    let upstream = LlmUpstream::start();
    let config = r#"{"rules":[{"name":"tokens","key":[{"header":"x-tenant"}],
        "limit":{"algorithm":"token_bucket","capacity":1000,"refill":1000,"period":"1h"},
        "cost":{"body":{},"default":300,"max":1000},
        "commit":{"body":{},"clamp":{}}}]}"#;
    let envoy = start(config, &upstream, 2);
    let post = |body: &str| {
        let out = std::process::Command::new("curl")
            .args([
                "-s",
                "--http2-prior-knowledge",
                "-o",
                "-",
                "-w",
                "\n%{http_code}",
            ])
            .args(["-X", "POST", "--data-binary", body])
            .args([
                "-H",
                "content-type: application/json",
                "-H",
                "x-tenant: acme",
            ])
            .args(["-H", "x-llm-output: 600", "-H", "x-llm-usage: 5"])
            .arg(format!(
                "http://127.0.0.1:{}/v1/chat/completions",
                envoy.http_port
            ))
            .output()
            .expect("curl");
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        let (body, status) = text.rsplit_once('\n').expect("curl's status");
        let used = (status == "200").then(|| reported_usage(body.as_bytes()));
        (status.to_string(), used)
    };
    let body = r#"{"max_tokens":600}"#;
    assert_eq!(post(body), ("200".to_string(), Some(605)));
    assert_eq!(post(body), ("200".to_string(), Some(395)));
    assert_eq!(post(body).0, "429");
    wait_until(Duration::from_secs(2), Duration::from_millis(5), || {
        upstream.answered() >= 2
    });
    assert_eq!(upstream.bounds_received(), vec![Some(600), Some(390)]);
    envoy.assert_no_panic();
}
