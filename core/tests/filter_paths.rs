//! The calls the filter makes to the bridge are the ones [`FILTER_PATHS`] lists, with
//! [`FILTER_METHOD`]: an authorization policy built from that list (envoy/istio/bridge.yaml,
//! checked by tests/tests/istio.rs) lets every call through. A scripted host plays Envoy
//! and weir-bridge's model answers, through both kinds of call: an acquire for a global
//! rule, and a commit of a cost known after the response.

use std::collections::BTreeSet;

use weir_core::filter::Action;
use weir_core::wire::{v3, FILTER_METHOD, FILTER_PATHS};
use weir_scripted::scripted_envoy::Envoy;
use weir_testkit::simulation::ModelBridge;

#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test as test;

const T0: u64 = 1_750_000_000_000_000;
const MS: u64 = 1_000;

/// One global rule decided when the request arrives, one whose cost is committed after
/// the response.
const CONFIG: &str = r#"{"bridge":{"cluster":"weir_bridge"},"rules":[
    {"name":"per-user","scope":"global","key":[{"header":"x-user"}],
     "limit":{"algorithm":"gcra","rate":100,"period":"1s","burst":10}},
    {"name":"llm","scope":"global","key":[{"header":"x-user"}],
     "limit":{"algorithm":"token_bucket","capacity":10000,"refill":10000,"period":"1m"},
     "cost":{"header":"x-estimate","max":500},"commit":{"header":"x-tokens"}}]}"#;

/// The (method, path) of every call dispatched so far.
fn calls(envoy: &Envoy) -> Vec<(String, String)> {
    envoy
        .host
        .state()
        .dispatched
        .iter()
        .map(|call| {
            let method = call
                .headers
                .iter()
                .find(|(n, _)| n == ":method")
                .map_or("", |(_, v)| v.as_str());
            (method.to_string(), call.path().to_string())
        })
        .collect()
}

#[test]
fn the_filter_calls_exactly_the_listed_paths_with_post() {
    let mut envoy = Envoy::new(CONFIG).unwrap_or_else(|e| panic!("config refused: {e}"));
    envoy.set_now_us(T0);
    let mut bridge = ModelBridge::default();
    let root = envoy.root;

    let (request, action) =
        envoy.request(&[(":path", "/"), ("x-user", "alice"), ("x-estimate", "500")]);
    assert_eq!(action, Action::Pause, "global rules ask the bridge");
    for call in envoy.open_calls() {
        let reply = bridge.acquire(&call.body, envoy.now_us()).unwrap();
        envoy.answer(call.token, 200, &serde_json::to_vec(&reply).unwrap());
    }
    envoy.respond(request, 200, &[("x-tokens", "120")], b"");
    envoy.close(request);
    envoy.advance_us(10 * MS);
    envoy.tick(root);
    for call in envoy.open_calls() {
        assert_eq!(call.path(), v3::COMMIT_PATH);
        let checked = v3::CommitRequest::parse(&call.body).unwrap();
        let reply = v3::CommitReply {
            items: checked
                .items
                .iter()
                .map(|i| v3::Committed {
                    id: i.item.id,
                    settled: true,
                })
                .collect(),
        };
        envoy.answer(call.token, 200, &serde_json::to_vec(&reply).unwrap());
    }

    let calls = calls(&envoy);
    for (method, path) in &calls {
        assert_eq!(method, FILTER_METHOD, "{path}");
        assert!(
            FILTER_PATHS.contains(&path.as_str()),
            "the filter called {path}, which FILTER_PATHS {FILTER_PATHS:?} does not list: \
             a policy built from it would refuse the call"
        );
    }
    let called: BTreeSet<&str> = calls.iter().map(|(_, p)| p.as_str()).collect();
    let listed: BTreeSet<&str> = FILTER_PATHS.iter().copied().collect();
    assert_eq!(
        called, listed,
        "every listed path is one the filter calls (a path it never calls need not be allowed)"
    );
}
