//! Costs known only after the response (`commit`) in a real Envoy, against a stand-in
//! LLM API ([`LlmUpstream`]) that reports the token usage each test asks for: a request
//! is admitted with its estimate (`x-estimate`), and when its response ends the rule is
//! settled with what the JSON body, the event stream or a header says it really cost.
//! Every Envoy here runs its config at `"stats": "detailed"`: the tests read the
//! `commit_*` counters.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};
use weir_core::conformance::{self, Admission};
use weir_e2e::decisions::{with_decisions, Judge, Logs};
use weir_e2e::llm_upstream::{USAGE_HEADER, USED_HEADER};
use weir_e2e::{
    wait_until, wasm_filter_yaml, weir_wasm, with_stats, Bridge, Client, Envoy, LlmUpstream,
    RedisCluster, Request, TestDir,
};

mod clamp;

fn start(config: &str, upstream: &LlmUpstream, workers: u32) -> Envoy {
    let bootstrap = upstream.bootstrap(
        wasm_filter_yaml(&with_stats(config, "detailed"), &weir_wasm()),
        None,
    );
    Envoy::shared(&bootstrap, workers)
}

/// A tenant's token budget: `limit` (a JSON limit), estimates from `x-estimate` up to
/// `max_estimate`, the actual cost from `commit`.
fn token_rule(limit: &str, max_estimate: u64, commit: &str) -> String {
    format!(
        r#"{{"rules":[{{"name":"tokens","key":[{{"header":"x-tenant"}}],"limit":{limit},
            "cost":{{"header":"x-estimate","max":{max_estimate}}},"commit":{commit}}}]}}"#
    )
}

fn chat(tenant: &str, estimate: u64, usage: u64) -> Request {
    Request::post(
        "/v1/chat/completions",
        r#"{"model":"test","messages":[{"role":"user","content":"hi"}]}"#,
    )
    .header("content-type", "application/json")
    .header("x-tenant", tenant)
    .header("x-estimate", estimate.to_string())
    .header("x-llm-usage", usage.to_string())
}

/// What a run of [`concurrent_chats`] saw: statuses, and the usage of admitted requests.
struct Chats {
    statuses: BTreeMap<u16, u64>,
    used: u64,
}

impl Chats {
    fn count(&self, status: u16) -> u64 {
        self.statuses.get(&status).copied().unwrap_or(0)
    }
}

/// 12 clients (spread over `ports`) sending 10 requests each for tenant `acme`, each
/// estimated at 500 tokens and really using 100 to 500: half the answers stream for up to
/// 300 ms, half are JSON; with `errors`, one request in 7 is answered 503.
fn concurrent_chats(ports: &[u16], errors: bool) -> Chats {
    let used = AtomicU64::new(0);
    let statuses = thread::scope(|s| {
        let handles: Vec<_> = (0..12u64)
            .map(|t| {
                let used = &used;
                let port = ports[t as usize % ports.len()];
                s.spawn(move || {
                    let mut client = Client::connect(port).unwrap();
                    let mut statuses = BTreeMap::new();
                    for i in 0..10u64 {
                        let usage = 100 + (t * 37 + i * 91) % 401;
                        let mut request = chat("acme", 500, usage)
                            .header("x-llm-stream", if (t + i) % 2 == 0 { "1" } else { "0" })
                            .header("x-llm-duration-ms", ((t * 13 + i * 29) % 300).to_string());
                        if errors && (t + i) % 7 == 0 {
                            request = request.header("x-llm-status", "503");
                        }
                        let r = client.request(request).unwrap();
                        if r.status == 200 {
                            used.fetch_add(usage, Ordering::Relaxed);
                        }
                        *statuses.entry(r.status).or_insert(0u64) += 1;
                    }
                    statuses
                })
            })
            .collect();
        let mut all = BTreeMap::new();
        for h in handles {
            for (status, n) in h.join().unwrap() {
                *all.entry(status).or_insert(0) += n;
            }
        }
        all
    });
    Chats {
        statuses,
        used: used.load(Ordering::Relaxed),
    }
}

/// The access logs of `n` Envoys, each line keyed by the usage its request asked the
/// stand-in for (`x-llm-usage`; the tests that judge them have one tenant).
fn usage_logs(dir: &TestDir, n: usize) -> Logs {
    Logs::new(dir.path(), n, "x-llm-usage")
}

/// Judges rule `tokens`' admissions in `logs` with the core's conformance checker at
/// their actual cost, at the instant each estimate was admitted: every request Envoy's
/// router had (an admission, whatever the rule labelled it), costing the usage it asked
/// the stand-in for when answered 200, nothing when the upstream itself answered an
/// error (settled at `on_error`, 0), and its estimate when Envoy answered for the
/// upstream (a local reply keeps it). Returns the tokens judged.
fn assert_conformant_at_actual_cost(config: &str, logs: &Logs, requests: usize) -> u64 {
    let judge = Judge::configured(config, "tokens");
    // One tenant: every admission is of the same key (the lines are keyed by usage).
    let mut admissions: Vec<Admission> = logs
        .read(requests)
        .iter()
        .flatten()
        .filter_map(|line| {
            let d = judge.admission(line)?;
            let cost = match (line.status, line.details.as_str()) {
                (200, _) => line.key.parse().expect("the usage header"),
                (_, "via_upstream") => 0,
                _ => d.cost,
            };
            Some(Admission {
                at_us: d.at_us,
                cost,
            })
        })
        .collect();
    admissions.sort_by_key(|a| a.at_us);
    conformance::check(&judge.limit, &admissions).unwrap_or_else(|v| panic!("{v:?}"));
    admissions.iter().map(|a| a.cost).sum()
}

/// The issue's test: concurrent requests never overrun the token budget when the
/// estimates are upper bounds, and the refunds let the budget be spent on real usage.
#[test]
fn concurrent_requests_never_overrun_the_token_budget() {
    let upstream = LlmUpstream::start();
    // 10,000 tokens for the test (the bucket refills once an hour).
    let config = token_rule(
        r#"{"algorithm":"token_bucket","capacity":10000,"refill":10000,"period":"1h"}"#,
        1000,
        r#"{"body":{}}"#,
    );
    let config = with_decisions(&config);
    let dir = TestDir::new("token-budget");
    let logs = usage_logs(&dir, 1);
    let filter = wasm_filter_yaml(&with_stats(&config, "detailed"), &weir_wasm());
    let envoy = Envoy::shared(&logs.add_to(0, upstream.bootstrap(filter, None)), 2);
    let chats = concurrent_chats(&[envoy.http_port], false);
    let (used, admitted) = (chats.used, chats.count(200));
    assert_eq!(assert_conformant_at_actual_cost(&config, &logs, 120), used);
    eprintln!(
        "statuses {:?}: {admitted} admitted with {used} tokens of 10,000",
        chats.statuses
    );
    assert!(used <= 10_000, "the budget was overrun: {used} tokens");
    // Without the refunds 20 requests of 500 would exhaust it: more were admitted, and
    // at most what 12 requests in flight could reserve was left unspent.
    assert!(
        admitted > 20,
        "{admitted} admitted: the refunds did not come back"
    );
    assert!(
        used >= 10_000 - 12 * 500,
        "{used} tokens: too much left unspent"
    );
    assert!(chats.count(429) > 0);
    // Every admitted request was settled from its body, none at `on_error`.
    wait_until(Duration::from_secs(2), Duration::ZERO, || {
        envoy.weir_stat("rule.tokens.committed") == admitted
    });
    assert_eq!(envoy.weir_stat("rule.tokens.committed"), admitted);
    assert_eq!(envoy.weir_stat("rule.tokens.commit_on_error"), 0);
    assert_eq!(
        envoy.weir_stat("rule.tokens.commit_units_refunded"),
        admitted * 500 - used
    );
    envoy.assert_no_panic();
}

/// Requests that cost everything: each estimate is the whole budget, so a request is
/// admitted only if the one before gave its reservation back.
fn whole_budget(commit: &str) -> String {
    token_rule(
        r#"{"algorithm":"token_bucket","capacity":1000,"refill":1000,"period":"1h"}"#,
        1000,
        commit,
    )
}

/// A 5xx is the upstream's failure: its estimate comes back (`on_error`). A stream the
/// client leaves before its usage came is the client's choice: it keeps its estimate.
#[test]
fn upstream_errors_give_the_reservation_back_and_aborted_streams_keep_it() {
    let upstream = LlmUpstream::start();
    let envoy = start(&whole_budget(r#"{"body":{}}"#), &upstream, 1);
    let mut client = Client::connect(envoy.http_port).unwrap();
    // A 503 from the upstream: settled at on_error (0), the estimate comes back.
    let r = client
        .request(chat("acme", 1000, 0).header("x-llm-status", "503"))
        .unwrap();
    assert_eq!(r.status, 503);
    assert_eq!(client.request(chat("acme", 1000, 10)).unwrap().status, 200);
    // That one cost 10 of the 1,000: a whole-budget estimate no longer fits.
    assert_eq!(client.request(chat("acme", 1000, 10)).unwrap().status, 429);
    assert_eq!(client.request(chat("acme", 990, 990)).unwrap().status, 200);
    assert_eq!(client.request(chat("acme", 1, 1)).unwrap().status, 429);

    // Another tenant: a stream the client leaves after its first bytes.
    let request = chat("globex", 1000, 1000)
        .header("x-llm-stream", "1")
        .header("x-llm-duration-ms", "3000");
    let mut stream = TcpStream::connect(("127.0.0.1", envoy.http_port)).unwrap();
    stream.write_all(&request.encode(envoy.http_port)).unwrap();
    let mut first = [0u8; 64];
    stream.read_exact(&mut first).unwrap();
    assert!(first.starts_with(b"HTTP/1.1 200"));
    // While it streams, its reservation holds the whole budget.
    assert_eq!(client.request(chat("globex", 1, 1)).unwrap().status, 429);
    drop(stream);
    let left = Instant::now();
    // Three requests of acme and the aborted one settled.
    wait_until(Duration::from_secs(3), Duration::ZERO, || {
        envoy.weir_stat("rule.tokens.committed") == 4
    });
    eprintln!("the aborted stream was settled within {:?}", left.elapsed());
    // Settled at its estimate: the budget stays spent.
    assert_eq!(client.request(chat("globex", 1, 1)).unwrap().status, 429);
    assert_eq!(envoy.weir_stat("rule.tokens.commit_aborted"), 1);
    assert_eq!(envoy.weir_stat("rule.tokens.commit_on_error"), 1);
    // Refunded: the 503's 1,000, and 990 of a 1,000 estimate that used 10.
    assert_eq!(
        envoy.weir_stat("rule.tokens.commit_units_refunded"),
        1000 + 990
    );
    envoy.assert_no_panic();
}

/// docs/algorithms.md's example against OpenAI streams sent without
/// `stream_options.include_usage` (no usage event): each is charged its estimate, 4,000
/// (no `max_tokens`), so five spend the key's 20,000 and the sixth is limited. The
/// upstream was asked for uncompressed bodies.
#[test]
fn a_stream_without_usage_is_charged_its_estimate() {
    let upstream = LlmUpstream::start();
    let envoy = start(
        &weir_e2e::documented_json("docs/algorithms.md", "llm-token-example"),
        &upstream,
        2,
    );
    let mut client = Client::connect(envoy.http_port).unwrap();
    let stream = || {
        Request::post("/v1/chat/completions", r#"{"model":"m","stream":true}"#)
            .header("x-api-key", "key-1")
            .header("accept-encoding", "gzip, br")
            .header("x-llm-usage", "10")
            .header("x-llm-stream", "1")
            .header("x-llm-usage-event", "0")
    };
    let mut asked = Vec::new();
    for i in 0..5 {
        let r = client.request(stream()).unwrap();
        assert_eq!(r.status, 200, "request {i}");
        asked.push(r.header("x-llm-accept-encoding").unwrap_or("").to_string());
    }
    let sixth = client.request(stream()).unwrap();
    assert_eq!(sixth.status, 429, "the estimates spent the budget");
    assert_eq!(
        asked,
        vec!["identity"; 5],
        "what the upstream was asked for"
    );
    assert_eq!(envoy.weir_stat("rule.llm-tokens.commit_no_usage"), 5);
    assert_eq!(envoy.weir_stat("rule.llm-tokens.commit_on_error"), 0);
    assert_eq!(envoy.weir_stat("rule.llm-tokens.commit_units_refunded"), 0);
    envoy.assert_no_panic();
}

/// OpenAI's Responses API stream (the usage in `response.completed`'s
/// `response.usage`), streams with bare-CR or CRLF line ends, and events whose JSON
/// spans two `data:` lines: each is read, and charged its usage.
#[test]
fn responses_api_streams_and_other_event_shapes_are_read() {
    let upstream = LlmUpstream::start();
    let envoy = start(&whole_budget(r#"{"body":{}}"#), &upstream, 1);
    let mut client = Client::connect(envoy.http_port).unwrap();
    let shapes = [
        ("responses", "lf", "0"),
        ("responses", "cr", "1"),
        ("openai", "cr", "0"),
        ("openai", "crlf", "1"),
    ];
    for (i, (format, line_end, split)) in shapes.iter().enumerate() {
        let tenant = format!("t{i}");
        let r = client
            .request(
                chat(&tenant, 1000, 600)
                    .header("x-llm-format", format)
                    .header("x-llm-stream", "1")
                    .header("x-llm-line-end", line_end)
                    .header("x-llm-split-data", split),
            )
            .unwrap();
        assert_eq!(r.status, 200);
        // 600 spent of 1,000: 400 fit, 401 do not.
        let shape = format!("{format} {line_end} split {split}");
        assert_eq!(
            client.request(chat(&tenant, 401, 0)).unwrap().status,
            429,
            "{shape}"
        );
        assert_eq!(
            client.request(chat(&tenant, 400, 0)).unwrap().status,
            200,
            "{shape}"
        );
    }
    assert_eq!(envoy.weir_stat("rule.tokens.commit_usage_read"), 8);
    envoy.assert_no_panic();
}

/// A response that comes back compressed although weir asked for `identity` cannot be
/// read: it keeps its estimate.
#[test]
fn a_compressed_response_keeps_its_estimate() {
    let upstream = LlmUpstream::start();
    let envoy = start(&whole_budget(r#"{"body":{}}"#), &upstream, 1);
    let mut client = Client::connect(envoy.http_port).unwrap();
    for stream in ["0", "1"] {
        let tenant = format!("t{stream}");
        let r = client
            .request(
                chat(&tenant, 1000, 10)
                    .header("x-llm-stream", stream)
                    .header("x-llm-content-encoding", "gzip"),
            )
            .unwrap();
        assert_eq!(r.status, 200);
        assert_eq!(client.request(chat(&tenant, 1, 0)).unwrap().status, 429);
    }
    assert_eq!(envoy.weir_stat("rule.tokens.commit_compressed"), 2);
    envoy.assert_no_panic();
}

/// A cost above the estimate is debt: later requests wait until it is repaid, and the
/// `Retry-After` of their 429 says when that is.
#[test]
fn debt_is_repaid_over_time_with_an_honest_retry_after() {
    let upstream = LlmUpstream::start();
    // 100 tokens a second, a bucket of 100; the usage from a response header.
    let config = token_rule(
        r#"{"algorithm":"token_bucket","capacity":100,"refill":100,"period":"1s"}"#,
        100,
        &format!(r#"{{"header":"{USAGE_HEADER}"}}"#),
    );
    let envoy = start(&config, &upstream, 1);
    let mut client = Client::connect(envoy.http_port).unwrap();
    let header_usage =
        |estimate: u64, usage: u64| chat("acme", estimate, usage).header("x-llm-format", "header");
    // Estimated 10, really 290: 90 tokens left, 190 more owed → the next two refills
    // are the debt's, the third (≈ 3 s from now) the first a request can spend.
    assert_eq!(client.request(header_usage(10, 290)).unwrap().status, 200);
    let settled = Instant::now();
    let r = client.request(header_usage(50, 50)).unwrap();
    assert_eq!(r.status, 429);
    let retry_after: u64 = r.header("retry-after").unwrap().parse().unwrap();
    assert_eq!(retry_after, 3, "the third refill: {:?}", r.headers);
    // Just before it, still denied; at it, admitted.
    thread::sleep(Duration::from_millis(2_700).saturating_sub(settled.elapsed()));
    assert_eq!(client.request(header_usage(50, 50)).unwrap().status, 429);
    thread::sleep(Duration::from_millis(3_150).saturating_sub(settled.elapsed()));
    assert_eq!(client.request(header_usage(50, 50)).unwrap().status, 200);
    assert_eq!(envoy.weir_stat("rule.tokens.commit_units_charged"), 280);
    envoy.assert_no_panic();
}

/// The Anthropic shape (input + output tokens) in a JSON body and a stream.
#[test]
fn anthropic_usage_is_read_from_bodies_and_streams() {
    let upstream = LlmUpstream::start();
    let envoy = start(&whole_budget(r#"{"body":{}}"#), &upstream, 1);
    let mut client = Client::connect(envoy.http_port).unwrap();
    for stream in ["0", "1"] {
        let r = client
            .request(
                chat(&format!("t{stream}"), 1000, 600)
                    .header("x-llm-format", "anthropic")
                    .header("x-llm-stream", stream),
            )
            .unwrap();
        assert_eq!(r.status, 200);
        // 600 spent of 1,000: 400 fit, 401 do not.
        assert_eq!(
            client
                .request(chat(&format!("t{stream}"), 401, 0))
                .unwrap()
                .status,
            429
        );
        assert_eq!(
            client
                .request(chat(&format!("t{stream}"), 400, 0))
                .unwrap()
                .status,
            200
        );
    }
    envoy.assert_no_panic();
}

/// docs/algorithms.md "LLM token limits", as written there: 20,000 tokens a minute per
/// API key, 4,000 reserved per request without an estimate.
#[test]
fn the_documented_llm_token_limit_works_as_the_docs_say() {
    let upstream = LlmUpstream::start();
    let envoy = start(
        &weir_e2e::documented_json("docs/algorithms.md", "llm-token-example"),
        &upstream,
        2,
    );
    let call = |usage: u64| {
        Request::post("/v1/chat/completions", "{}")
            .header("x-api-key", "key-1")
            .header("x-llm-usage", usage.to_string())
    };
    // Five requests at once, each streaming for a second: 5 × 4,000 reserved.
    let statuses: Vec<u16> = thread::scope(|s| {
        let handles: Vec<_> = (0..5)
            .map(|_| {
                s.spawn(|| {
                    let mut client = Client::connect(envoy.http_port).unwrap();
                    let request = call(1000)
                        .header("x-llm-stream", "1")
                        .header("x-llm-duration-ms", "1000");
                    client.request(request).unwrap().status
                })
            })
            .collect();
        thread::sleep(Duration::from_millis(400));
        // A sixth while they run: the budget is reserved.
        let mut client = Client::connect(envoy.http_port).unwrap();
        let sixth = client.request(call(1000)).unwrap();
        assert_eq!(sixth.status, 429, "{:?}", sixth.headers);
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(statuses, vec![200; 5]);
    // Each used 1,000: 15,000 came back; the next request fits, and another key is
    // untouched by all of it.
    let mut client = Client::connect(envoy.http_port).unwrap();
    assert_eq!(client.request(call(1000)).unwrap().status, 200);
    let other = call(1000).header("x-api-key", "key-2");
    assert_eq!(client.request(other).unwrap().status, 200);
    // A body's max_tokens: 7,900 + ⌈18 / 4⌉ = 7,905 of the 14,000 left fit; used in
    // full (8,000 with the prompt) they leave 6,000, and the same request no longer fits.
    let big = |usage: u64| call(usage).body(r#"{"max_tokens":7900}"#);
    assert_eq!(client.request(big(8000)).unwrap().status, 200);
    assert_eq!(client.request(big(0)).unwrap().status, 429);
    envoy.assert_no_panic();
}

/// The estimate from the request body: its `max_tokens` plus its size / 4 for the
/// prompt; `default` without `max_tokens` (or without a body), `max` past `max_bytes`.
#[test]
fn the_estimate_is_read_from_the_request_body() {
    let upstream = LlmUpstream::start();
    let config = r#"{"rules":[{"name":"tokens","key":[{"header":"x-tenant"}],
        "limit":{"algorithm":"token_bucket","capacity":1000,"refill":1000,"period":"1h"},
        "cost":{"body":{"max_bytes":1024},"default":300,"max":800},
        "commit":{"body":{}}}]}"#;
    let envoy = start(config, &upstream, 1);
    let mut client = Client::connect(envoy.http_port).unwrap();
    let post = |body: &str, usage: u64| {
        Request::post("/v1/chat/completions", body.to_string())
            .header("x-tenant", "acme")
            .header("x-llm-usage", usage.to_string())
    };
    // 18 bytes: 600 + 5 reserved, 600 used → 400 left.
    assert_eq!(
        client
            .request(post(r#"{"max_tokens":600}"#, 600))
            .unwrap()
            .status,
        200
    );
    // 505 do not fit (a header-less default of 300 would).
    assert_eq!(
        client
            .request(post(r#"{"max_tokens":500}"#, 0))
            .unwrap()
            .status,
        429
    );
    // No max_tokens: the default, 300, used in full → 100 left.
    assert_eq!(client.request(post("{}", 300)).unwrap().status, 200);
    // Over max_bytes: the rule's max (800) whatever the body says.
    let big = format!(r#"{{"max_tokens":1,"pad":"{}"}}"#, "x".repeat(2000));
    assert_eq!(client.request(post(&big, 1)).unwrap().status, 429);
    // 17 bytes: 90 + 5 = 95 fit in 100.
    assert_eq!(
        client
            .request(post(r#"{"max_tokens":90}"#, 95))
            .unwrap()
            .status,
        200
    );
    // No body at all: the default.
    let get = Request::get("/v1/models").header("x-tenant", "acme");
    assert_eq!(client.request(get).unwrap().status, 429);
    // The upstream got every admitted request's body whole (it counts an answer once
    // written, which may be just after the client read it).
    wait_until(Duration::from_secs(2), Duration::from_millis(5), || {
        upstream.answered() >= 3
    });
    assert_eq!(upstream.answered(), 3);
    envoy.assert_no_panic();
}

/// Global: one token budget in Redis for two Envoys (2 workers each). Each request
/// reserves its estimate through the bridge; when its response ends its worker sends
/// the actual usage to `/v3/commit`. Concurrent requests never overrun the budget, 5xx
/// responses give their estimate back, and once every commit is in, Redis holds exactly
/// the budget less what the responses used.
#[test]
fn a_global_token_budget_holds_across_two_envoys_and_settles_exactly_in_redis() {
    let redis = RedisCluster::start(3, 1);
    let bridge = Bridge::start(&redis, &[]);
    let upstream = LlmUpstream::start();
    let config = r#"{"bridge":{"cluster":"weir_bridge","timeout":"500ms"},
        "rules":[{"name":"tokens","scope":"global","key":[{"header":"x-tenant"}],
        "limit":{"algorithm":"token_bucket","capacity":10000,"refill":10000,"period":"1h"},
        "cost":{"header":"x-estimate","max":10000},"commit":{"body":{}}}]}"#;
    let config = &with_decisions(config);
    let dir = TestDir::new("global-token-budget");
    let logs = usage_logs(&dir, 2);
    let envoys: Vec<Envoy> = (0..2)
        .map(|i| {
            let filter = wasm_filter_yaml(&with_stats(config, "detailed"), &weir_wasm());
            Envoy::shared(
                &logs.add_to(i, upstream.bootstrap(filter, Some(bridge.port))),
                2,
            )
        })
        .collect();
    let ports: Vec<u16> = envoys.iter().map(|e| e.http_port).collect();
    let chats = concurrent_chats(&ports, true);
    let (used, admitted) = (chats.used, chats.count(200));
    assert_eq!(assert_conformant_at_actual_cost(config, &logs, 120), used);
    eprintln!(
        "statuses {:?}: {admitted} admitted with {used} tokens of 10,000",
        chats.statuses
    );
    assert!(used <= 10_000, "the budget was overrun: {used} tokens");
    assert!(
        admitted > 20,
        "{admitted} admitted: the refunds did not come back"
    );
    assert!(chats.count(503) > 0, "some upstream errors");
    assert!(chats.count(429) > 0, "the budget ran out");
    // Every commit reaches Redis (sent from the workers' 10 ms ticks)…
    let settled = || {
        weir_e2e::prometheus_sum(
            &bridge.metrics(),
            "weir_bridge_commits_total",
            &[("result", "settled")],
        )
    };
    wait_until(Duration::from_secs(3), Duration::from_millis(50), || {
        envoys
            .iter()
            .map(|e| e.weir_stat("rule.tokens.committed"))
            .sum::<u64>()
            == admitted + chats.count(503)
            && settled() >= 1.0
    });
    thread::sleep(Duration::from_millis(300));
    let errors: u64 = envoys
        .iter()
        .map(|e| e.weir_stat("rule.tokens.commit_errors"))
        .sum();
    assert_eq!(errors, 0);
    // …so Redis holds exactly what the responses left: the rest of the budget fits in
    // one request, one more token does not.
    let left = 10_000 - used;
    let mut client = Client::connect(envoys[0].http_port).unwrap();
    assert_eq!(
        client.request(chat("acme", left + 1, 0)).unwrap().status,
        429
    );
    assert_eq!(
        client.request(chat("acme", left, left)).unwrap().status,
        200
    );
    for envoy in &envoys {
        envoy.assert_no_panic();
    }
}
