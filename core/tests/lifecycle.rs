//! A request's whole lifecycle through the filter, with a scripted host playing Envoy
//! (`weir_scripted::scripted_host`) and weir-bridge's model answering calls: pausing for
//! a call, the answer arriving after its request is gone, requests joined on one call,
//! held requests released or abandoned, costs settled after a denial or the response,
//! a reload while a call is out, and the tick's work. No Envoy: what these check is the
//! order of callbacks and host calls, which the end-to-end suite can only see from
//! outside. The configs ask for `"stats": "detailed"`: the tests read why requests went
//! as they did (delays, commits, resent calls).

use weir_core::adaptive::LEARNING_TICK_MS;
use weir_core::engine::{BRIDGE_BACKOFF_US, BRIDGE_FAILING_FOR_US, BRIDGE_FAILURES_TO_SKIP};
use weir_core::filter::host::LogLevel;
use weir_core::filter::{Action, BodyAction, DELAY_HEADER};
use weir_core::wire::{v2, v3};
use weir_scripted::scripted_envoy::Envoy;
use weir_scripted::scripted_host::LocalReply;
use weir_testkit::simulation::ModelBridge;

#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test as test;

mod bridge_answers;
mod bridge_failures;
mod held;
mod learning;

const T0: u64 = 1_750_000_000_000_000;
const MS: u64 = 1_000;

/// A global token bucket of 6,000 a minute per `x-user`, leasing up to 10 units for 1 s.
const LEASED: &str = r#"{"stats":"detailed","bridge":{"cluster":"weir_bridge"},"rules":[
    {"name":"tenant","scope":"global","key":[{"header":"x-user"}],
     "limit":{"algorithm":"token_bucket","capacity":6000,"refill":6000,"period":"1m"},
     "global":{"lease":{"max":10,"ttl":"1s"}}}]}"#;

fn envoy(config: &str) -> Envoy {
    let mut envoy = Envoy::new(config).unwrap_or_else(|e| panic!("config refused: {e}"));
    envoy.set_now_us(T0);
    envoy
}

fn user(name: &str) -> [(&str, &str); 2] {
    [(":path", "/"), ("x-user", name)]
}

/// Answers every open call as weir-bridge would, from `bridge`'s model of Redis.
fn answer_calls(envoy: &mut Envoy, bridge: &mut ModelBridge) {
    for call in envoy.open_calls() {
        assert_eq!(call.path(), v2::ACQUIRE_PATH);
        assert_eq!(call.cluster, "weir_bridge");
        match bridge.acquire(&call.body, envoy.now_us()) {
            Ok(reply) => envoy.answer(call.token, 200, &serde_json::to_vec(&reply).unwrap()),
            Err((status, body)) => envoy.answer(call.token, status, body.as_bytes()),
        }
    }
}

/// One request of `name` through the bridge and to its response's end: the key's demand
/// is known after it, so the next call asks for a lease.
fn warm_up(envoy: &mut Envoy, bridge: &mut ModelBridge, name: &str) {
    let (context, action) = envoy.request(&user(name));
    assert_eq!(action, Action::Pause);
    answer_calls(envoy, bridge);
    assert_eq!(resumed(envoy, context), 1);
    envoy.respond(context, 200, &[], b"");
    envoy.close(context);
    envoy.advance_us(MS);
}

/// Sends the VM's pending stats: a tick after a flush interval.
fn flush_stats(envoy: &mut Envoy) {
    envoy.advance_us(200 * MS);
    let root = envoy.root;
    envoy.tick(root);
}

/// A stat of the plugin `weir`, as the VM last sent it.
fn stat_of(envoy: &Envoy, name: &str) -> i64 {
    envoy
        .host
        .state()
        .metric(&format!("weir.weir.{name}"))
        .unwrap_or_else(|| panic!("no stat {name}"))
}

fn resumed(envoy: &Envoy, context: u32) -> u32 {
    envoy.stream(context).map_or(0, |s| s.resumed)
}

fn reply_of(envoy: &Envoy, context: u32) -> Option<LocalReply> {
    envoy.stream(context).and_then(|s| s.local_reply)
}

#[test]
fn a_bridge_answer_after_its_request_is_gone_is_counted_leased_and_settled() {
    // A concurrency rule counts the request before the global rule pauses it: its
    // place must come back when the answer finds the request gone.
    let mut envoy = envoy(
        r#"{"stats":"detailed","bridge":{"cluster":"weir_bridge"},"rules":[
        {"name":"inflight","key":[{"header":"x-user"}],
         "limit":{"algorithm":"concurrency","max_in_flight":1}},
        {"name":"tenant","scope":"global","key":[{"header":"x-user"}],
         "limit":{"algorithm":"token_bucket","capacity":6000,"refill":6000,"period":"1m"},
         "global":{"lease":{"max":10,"ttl":"1s"}}}]}"#,
    );
    let mut bridge = ModelBridge::default();
    warm_up(&mut envoy, &mut bridge, "acme");
    let (gone, action) = envoy.request(&user("acme"));
    assert_eq!(action, Action::Pause, "no units held: the key asks Redis");
    assert_eq!(envoy.open_calls().len(), 1);
    envoy.close(gone);

    envoy.advance_us(2 * MS);
    answer_calls(&mut envoy, &mut bridge);
    assert_eq!(
        envoy.host.state().misdirected,
        0,
        "nothing was resumed or answered on the gone request's context"
    );

    // What Redis leased is in the lease table, and the gone request's place is back:
    // the next request of the key is decided at once, with no call.
    let (next, action) = envoy.request(&user("acme"));
    assert_eq!(action, Action::Continue);
    assert!(reply_of(&envoy, next).is_none());
    assert!(envoy.open_calls().is_empty(), "served from the lease");
    assert_eq!(bridge.calls, 2);

    flush_stats(&mut envoy);
    let stat = |name: &str| stat_of(&envoy, name);
    assert_eq!(
        stat("rule.tenant.bridge_decisions"),
        2,
        "the gone request's decision counts"
    );
    assert_eq!(stat("rule.tenant.lease_hits"), 1);
    assert_eq!(stat("rule.inflight.in_flight_released"), 2);
    assert_eq!(stat("bridge.calls"), 2);
}

#[test]
fn two_requests_joined_on_one_call_are_both_resumed_by_its_answer() {
    let mut envoy = envoy(LEASED);
    let mut bridge = ModelBridge::default();
    warm_up(&mut envoy, &mut bridge, "acme");
    let (owner, first) = envoy.request(&user("acme"));
    let (waiter, second) = envoy.request(&user("acme"));
    let (left, third) = envoy.request(&user("acme"));
    assert_eq!(
        (first, second, third),
        (Action::Pause, Action::Pause, Action::Pause)
    );
    assert_eq!(
        envoy.open_calls().len(),
        1,
        "one call for the key: the others wait on it"
    );
    envoy.close(left);

    envoy.advance_us(MS);
    answer_calls(&mut envoy, &mut bridge);
    assert_eq!(resumed(&envoy, owner), 1);
    assert_eq!(
        resumed(&envoy, waiter),
        1,
        "the waiter looked again and found the lease"
    );
    assert!(reply_of(&envoy, owner).is_none() && reply_of(&envoy, waiter).is_none());
    assert!(
        envoy.open_calls().is_empty(),
        "the lease served the waiter: no second call"
    );
    assert_eq!(
        envoy.host.state().misdirected,
        0,
        "the waiter that left was not woken"
    );

    flush_stats(&mut envoy);
    let stat = |name: &str| stat_of(&envoy, name);
    assert_eq!(stat("bridge.calls"), 2);
    assert_eq!(stat("bridge.joined"), 2);
    assert_eq!(stat("rule.tenant.allowed"), 3);
}

/// 10 a second, one at a time, delayed up to 1 s: a second request right after the
/// first is held, its slot 100 ms after the first.
fn one_held() -> (Envoy, u32) {
    let mut envoy = envoy(
        r#"{"stats":"detailed","rules":[{"name":"api","key":[{"header":"x-user"}],
        "limit":{"algorithm":"gcra","rate":10,"period":"1s","burst":0},
        "on_limit":{"delay":{"max":"1s"}}}]}"#,
    );
    let (_, first) = envoy.request(&user("acme"));
    let (held, second) = envoy.request(&user("acme"));
    assert_eq!((first, second), (Action::Continue, Action::Pause));
    (envoy, held)
}

#[test]
fn a_denial_names_its_rule_in_filter_state_and_its_decisions_when_asked() {
    let denied_state = |response: &str| {
        let mut envoy = envoy(&format!(
            r#"{{"stats":"detailed","rules":[{{"name":"api","key":[{{"header":"x-user"}}],
            "limit":{{"algorithm":"gcra","rate":1,"period":"1h","burst":0}}}}]{response}}}"#
        ));
        let (allowed, _) = envoy.request(&user("acme"));
        let (denied, _) = envoy.request(&user("acme"));
        assert_eq!(reply_of(&envoy, denied).map(|r| r.status), Some(429));
        let state = |context| {
            let mut keys: Vec<String> = envoy
                .stream(context)
                .unwrap()
                .filter_state
                .keys()
                .cloned()
                .collect();
            keys.sort();
            keys
        };
        (state(allowed), state(denied))
    };
    // By default (`rule`): the denying rule only, one host call on the denial path.
    let (allowed, denied) = denied_state("");
    assert!(allowed.is_empty());
    assert_eq!(denied, ["weir.rule"]);
    let (allowed, denied) = denied_state(r#","response":{"filter_state":"denied"}"#);
    assert!(allowed.is_empty());
    assert_eq!(denied, ["weir.decisions", "weir.rule"]);
    let (allowed, _) = denied_state(r#","response":{"filter_state":"all"}"#);
    assert_eq!(allowed, ["weir.decisions", "weir.rule"]);
    let (allowed, denied) = denied_state(r#","response":{"filter_state":"none"}"#);
    assert!(allowed.is_empty() && denied.is_empty());
}

/// A token budget per user (settled with the response's `x-tokens`), and one request a
/// minute per session.
const BUDGET_AND_SESSIONS: &str = r#"{"stats":"detailed","rules":[
    {"name":"llm","key":[{"header":"x-user"}],
     "limit":{"algorithm":"fixed_window","limit":1000,"window":"1m"},
     "cost":{"header":"x-estimate","max":500},"commit":{"header":"x-tokens"}},
    {"name":"sessions","key":[{"header":"x-session"}],
     "limit":{"algorithm":"fixed_window","limit":1,"window":"1m"}}]}"#;

fn ask(session: &str) -> [(&str, &str); 4] {
    [
        (":path", "/v1/chat"),
        ("x-user", "acme"),
        ("x-session", session),
        ("x-estimate", "500"),
    ]
}

#[test]
fn a_request_denied_after_another_rule_counted_it_gives_its_estimate_back() {
    let mut envoy = envoy(BUDGET_AND_SESSIONS);
    let (_, first) = envoy.request(&ask("s1"));
    assert_eq!(first, Action::Continue);
    let (denied, second) = envoy.request(&ask("s1"));
    assert_eq!(second, Action::Pause, "answered here");
    assert_eq!(reply_of(&envoy, denied).unwrap().status, 429);
    // The budget's 500 reserved for the denied request came back: another session
    // still has 500 of the 1,000.
    let (_, third) = envoy.request(&ask("s2"));
    assert_eq!(third, Action::Continue);
    flush_stats(&mut envoy);
    let stat = |name: &str| stat_of(&envoy, name);
    assert_eq!(stat("rule.llm.commit_not_forwarded"), 1);
    assert_eq!(stat("rule.sessions.limited"), 1);
}

#[test]
fn a_denial_the_host_refuses_to_send_keeps_the_estimate_until_the_response_ends() {
    let mut envoy = envoy(BUDGET_AND_SESSIONS);
    let (_, first) = envoy.request(&ask("s1"));
    assert_eq!(first, Action::Continue);
    envoy.host.state().refuse.local_response = true;
    let (forwarded, second) = envoy.request(&ask("s1"));
    assert_eq!(
        second,
        Action::Continue,
        "a reply that cannot be sent must not hang it"
    );
    envoy.host.state().refuse.local_response = false;
    // It goes on to the upstream: its 500 stays counted, so the budget is spent.
    let (spent, third) = envoy.request(&ask("s2"));
    assert_eq!(third, Action::Pause);
    assert_eq!(reply_of(&envoy, spent).unwrap().status, 429);
    // Its response says it cost 100: 400 come back, and a fourth session fits 400.
    envoy.respond(forwarded, 200, &[("x-tokens", "100")], b"");
    let (_, fourth) = envoy.request(&[
        (":path", "/v1/chat"),
        ("x-user", "acme"),
        ("x-session", "s4"),
        ("x-estimate", "400"),
    ]);
    assert_eq!(fourth, Action::Continue);
    flush_stats(&mut envoy);
    let stat = |name: &str| stat_of(&envoy, name);
    // The budget itself denied the one answered with 429: it counted nothing to give
    // back. The one that went on was not settled as never forwarded either.
    assert_eq!(stat("rule.llm.commit_not_forwarded"), 0);
    assert_eq!(stat("rule.llm.commit_units_refunded"), 400);
}

#[test]
fn a_reload_while_a_call_is_out_answers_the_call_on_the_old_plugin() {
    let mut envoy = envoy(LEASED);
    let mut bridge = ModelBridge::default();
    let old_root = envoy.root;
    let (before, action) = envoy.request(&user("acme"));
    assert_eq!(action, Action::Pause);

    // The new config: one request a minute per user, decided locally.
    let new_root = envoy
        .configure(
            r#"{"stats":"detailed","rules":[{"name":"per_user","key":[{"header":"x-user"}],
            "limit":{"algorithm":"fixed_window","limit":1,"window":"1m"}}]}"#,
        )
        .unwrap();
    assert_ne!(new_root, old_root);
    let (_, first) = envoy.request(&user("acme"));
    let (limited, second) = envoy.request(&user("acme"));
    assert_eq!((first, second), (Action::Continue, Action::Pause));
    assert_eq!(reply_of(&envoy, limited).unwrap().status, 429);
    assert_eq!(
        envoy.open_calls().len(),
        1,
        "the new plugin has no global rule"
    );

    envoy.advance_us(MS);
    answer_calls(&mut envoy, &mut bridge);
    assert_eq!(
        resumed(&envoy, before),
        1,
        "the old plugin's request goes on"
    );
    assert!(reply_of(&envoy, before).is_none());
    assert_eq!(envoy.host.state().misdirected, 0);
    // Both plugins keep ticking, each with its own work.
    envoy.tick(old_root);
    envoy.tick(new_root);
}

#[test]
fn the_tick_sends_global_commits_and_counts_their_answer() {
    let mut envoy = envoy(
        r#"{"stats":"detailed","bridge":{"cluster":"weir_bridge"},"rules":[
        {"name":"llm","scope":"global","key":[{"header":"x-user"}],
         "limit":{"algorithm":"token_bucket","capacity":10000,"refill":10000,"period":"1m"},
         "cost":{"header":"x-estimate","max":500},"commit":{"header":"x-tokens"}}]}"#,
    );
    let mut bridge = ModelBridge::default();
    let root = envoy.root;
    let (request, action) = envoy.request(&[("x-user", "acme"), ("x-estimate", "500")]);
    assert_eq!(action, Action::Pause);
    answer_calls(&mut envoy, &mut bridge);
    assert_eq!(resumed(&envoy, request), 1);

    envoy.respond(request, 200, &[("x-tokens", "120")], b"");
    assert_eq!(
        envoy.host.state().tick_ms[&root],
        10,
        "a commit waits: the tick speeds up"
    );
    assert!(
        envoy.open_calls().is_empty(),
        "commits go out on the tick, not in the request"
    );
    envoy.advance_us(10 * MS);
    envoy.tick(root);
    let calls = envoy.open_calls();
    let [commit] = &calls[..] else {
        panic!("one commit call: {calls:?}")
    };
    assert_eq!(commit.path(), v3::COMMIT_PATH);
    let checked = v3::CommitRequest::parse(&commit.body).unwrap();
    let [item] = &checked.items[..] else {
        panic!("one item: {:?}", checked.items)
    };
    assert_eq!((item.item.reserved, item.item.actual), (500, 120));
    let reply = v3::CommitReply {
        items: vec![v3::Committed {
            id: item.item.id,
            settled: true,
        }],
    };
    envoy.answer(commit.token, 200, &serde_json::to_vec(&reply).unwrap());
    flush_stats(&mut envoy);
    let stat = |name: &str| stat_of(&envoy, name);
    assert_eq!(stat("rule.llm.committed"), 1);
    assert_eq!(stat("rule.llm.commit_units_refunded"), 380);
    assert_eq!(stat("rule.llm.commit_errors"), 0);
    assert_eq!(
        envoy.host.state().tick_ms[&root],
        100,
        "nothing waits: the slow tick"
    );
}

#[test]
fn a_cost_estimated_from_the_body_is_decided_when_the_body_is_in() {
    // 1,500 tokens an hour; a request asking for 1,000 costs 1,009 (its size counted too).
    let mut envoy = envoy(
        r#"{"stats":"detailed","rules":[{"name":"llm","key":[{"header":"x-user"}],
        "limit":{"algorithm":"token_bucket","capacity":1500,"refill":1500,"period":"1h"},
        "cost":{"body":{"max_bytes":4096},"default":300,"max":1500}}]}"#,
    );
    let body = br#"{"max_tokens":1000,"messages":[]}"#;
    let headers = [(":path", "/v1/chat"), ("x-user", "acme")];
    let (first, on_headers, on_body) = envoy.request_with_body(&headers, body);
    assert_eq!(
        (on_headers, on_body),
        (Action::Continue, Some(BodyAction::Continue)),
        "the headers go on, the body decides"
    );
    assert!(reply_of(&envoy, first).is_none());
    // 491 tokens are left: the second is denied on its body, with what it read of its
    // headers before they went on.
    let (second, on_headers, on_body) = envoy.request_with_body(&headers, body);
    assert_eq!(
        (on_headers, on_body),
        (Action::Continue, Some(BodyAction::Hold))
    );
    assert_eq!(reply_of(&envoy, second).unwrap().status, 429);
    flush_stats(&mut envoy);
    assert_eq!(stat_of(&envoy, "rule.llm.allowed"), 1);
    assert_eq!(stat_of(&envoy, "rule.llm.limited"), 1);
}

#[test]
fn a_clamped_request_goes_on_without_content_length_and_with_its_body_lowered() {
    // 1,500 tokens an hour; a request asking for 1,000 costs 1,009.
    let mut envoy = envoy(
        r#"{"stats":"detailed","rules":[{"name":"llm","key":[{"header":"x-user"}],
        "limit":{"algorithm":"token_bucket","capacity":1500,"refill":1500,"period":"1h"},
        "cost":{"body":{}},"commit":{"body":{},"clamp":{}}}]}"#,
    );
    let body = br#"{"max_tokens":1000,"messages":[]}"#;
    let headers = [
        (":path", "/v1/chat"),
        ("x-user", "acme"),
        ("content-length", "33"),
    ];
    let stream = |envoy: &Envoy, context: u32| envoy.stream(context).unwrap();
    let content_length = |envoy: &Envoy, context: u32| {
        stream(envoy, context)
            .request_headers
            .iter()
            .any(|(n, _)| n == "content-length")
    };
    let (first, _, on_body) = envoy.request_with_body(&headers, body);
    assert_eq!(on_body, Some(BodyAction::Continue));
    assert!(
        !content_length(&envoy, first),
        "a clamp may rewrite the body"
    );
    assert_eq!(
        stream(&envoy, first).upstream.body,
        body,
        "it fits: unchanged"
    );
    // 491 left: admitted with them, its output lowered to 491 − 9.
    let (second, _, on_body) = envoy.request_with_body(&headers, body);
    assert_eq!(on_body, Some(BodyAction::Continue));
    assert!(reply_of(&envoy, second).is_none());
    assert_eq!(
        stream(&envoy, second).upstream.body,
        br#"{"max_tokens":482,"messages":[]}"#
    );
    // Nothing left for the prompt: 429, the body untouched.
    let (third, _, _) = envoy.request_with_body(&headers, body);
    assert_eq!(reply_of(&envoy, third).unwrap().status, 429);
    assert_eq!(stream(&envoy, third).request_body, body, "kept in Envoy");
    assert!(stream(&envoy, third).upstream.body.is_empty());
    flush_stats(&mut envoy);
    assert_eq!(stat_of(&envoy, "rule.llm.commit_clamped"), 1);
    assert_eq!(stat_of(&envoy, "rule.llm.allowed"), 2);
}

#[test]
fn callbacks_for_contexts_that_do_not_exist_do_nothing() {
    let mut envoy = envoy(LEASED);
    let host = &envoy.host;
    let vm = &mut envoy.vm;
    assert_eq!(vm.on_request_headers(host, 99, true), Action::Continue);
    assert_eq!(vm.on_request_body(host, 99, 10, true), BodyAction::Continue);
    assert_eq!(vm.on_request_trailers(host, 99), Action::Continue);
    assert_eq!(vm.on_response_headers(host, 99, true), Action::Continue);
    assert_eq!(vm.on_response_body(host, 99, 10, true), Action::Continue);
    assert_eq!(vm.on_response_trailers(host, 99), Action::Continue);
    vm.on_tick(host, 99);
    vm.on_http_call_response(host, 99, 1, 0);
    vm.on_http_call_response(host, envoy.root, 12345, 0);
    vm.on_delete(host, 99);
    assert!(!vm.on_configure(host, 99));
    vm.on_context_create(100, 99);
    assert_eq!(host.state().misdirected, 0);
}

#[test]
fn a_configuration_envoy_must_refuse_names_the_field() {
    let error = Envoy::new(
        r#"{"stats":"detailed","rules":[{"name":"a","limit":{"algorithm":"gcra","rate":0,"period":"1s"}}]}"#,
    )
    .err()
    .expect("refused");
    assert!(error.contains("rate"), "{error}");
}

#[test]
fn a_bridge_timeout_too_short_for_the_bridge_is_logged_as_weir_check_prints_it() {
    let warned = |config: &str| {
        let envoy = envoy(config);
        let logs = envoy.host.state().logs.clone();
        logs.iter().any(|(level, line)| {
            *level == LogLevel::Warn && line.contains("bridge.timeout: \"20ms\"")
        })
    };
    let short = LEASED.replace(
        r#""cluster":"weir_bridge""#,
        r#""cluster":"weir_bridge","timeout":"20ms""#,
    );
    assert!(warned(&short));
    assert!(!warned(LEASED), "the default timeout is long enough");
}
