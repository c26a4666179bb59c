//! The bridge's AuthorizationPolicy, rendered into its sidecar's RBAC filter behind mTLS:
//! the filter's calls (the paths and method the wire names) pass, and other paths and
//! other namespaces' workloads are refused.

use super::*;

/// Every exact `url_path` and `:method` an RBAC filter names, wherever in its rules.
fn rbac_paths_and_methods(filter: &Value) -> (BTreeSet<String>, BTreeSet<String>) {
    fn walk(v: &Value, paths: &mut BTreeSet<String>, methods: &mut BTreeSet<String>) {
        match v {
            Value::Object(m) => {
                if let Some(exact) = m.get("url_path").and_then(|u| u["path"]["exact"].as_str()) {
                    paths.insert(exact.to_string());
                }
                if let Some(h) = m.get("header").filter(|h| h["name"] == ":method") {
                    methods.insert(h["string_match"]["exact"].as_str().unwrap().to_string());
                }
                m.values().for_each(|x| walk(x, paths, methods));
            }
            Value::Array(a) => a.iter().for_each(|x| walk(x, paths, methods)),
            _ => {}
        }
    }
    let (mut paths, mut methods) = (BTreeSet::new(), BTreeSet::new());
    walk(filter, &mut paths, &mut methods);
    (paths, methods)
}

/// YAML list items for [`weir_e2e::Bootstrap`] from JSON values.
fn yaml_items(values: &[Value]) -> String {
    serde_yaml::to_string(&Value::Array(values.to_vec())).unwrap()
}

/// A global rule decided when the request comes (5 at once for each user, then one an
/// hour) and one whose cost is committed after the response. Both fail closed, so a
/// refused bridge call shows as a 503.
const THROUGH_RBAC: &str = r#"{"bridge":{"cluster":"weir_bridge","timeout":"500ms"},"rules":[
    {"name":"per-user","match":{"path":{"exact":"/limited"}},"scope":"global",
     "key":[{"header":"x-user"}],"limit":{"algorithm":"gcra","rate":1,"period":"1h","burst":4},
     "global":{"failure_mode":"deny"}},
    {"name":"llm","stats":"detailed","match":{"path":{"exact":"/llm"}},"scope":"global","key":[{"header":"x-user"}],
     "limit":{"algorithm":"token_bucket","capacity":10000,"refill":10000,"period":"1m"},
     "cost":{"header":"x-estimate","max":500},"commit":{"header":"x-tokens"},
     "global":{"failure_mode":"deny"}}]}"#;

/// A workload running weir as `who`: its rules on `/limited` and `/llm` (the backend says
/// each request used 120 units, what `commit` reads), any other path forwarded to the
/// bridge as a direct call of this workload; its bridge cluster goes to `sidecar_port`
/// with mTLS.
fn weir_workload(ca: &MeshCa, who: &Identity, bridge_id: &Identity, sidecar_port: u16) -> Envoy {
    let mut cluster = static_cluster("weir_bridge", sidecar_port);
    cluster["transport_socket"] = ca.upstream(who, bridge_id);
    let routes = "\
- match: { prefix: \"/limited\" }
  direct_response: { status: 200, body: { inline_string: \"ok\" } }
- match: { prefix: \"/llm\" }
  direct_response: { status: 200, body: { inline_string: \"ok\" } }
  response_headers_to_add: [ { header: { key: x-tokens, value: \"120\" } } ]
- match: { prefix: \"/\" }
  route: { cluster: weir_bridge }
";
    Envoy::start(
        &Bootstrap::new()
            .http_filter(wasm_filter_yaml(THROUGH_RBAC, &weir_wasm()))
            .routes(routes)
            .cluster(yaml_items(&[cluster])),
        2,
    )
}

/// The shipped bridge AuthorizationPolicy, rendered into the RBAC filter istiod puts in
/// the bridge pod's inbound listener (STRICT mTLS, certificates of a test mesh CA), in
/// front of a real weir-bridge and Redis Cluster. The rendered paths are first checked
/// to be `FILTER_PATHS` with `FILTER_METHOD`.
/// - A workload of namespace `shop` (which the policy names) running weir: its global
///   rule limits (5 pass, then 429: decided by the bridge, as a refused call would be a
///   503), its commits are settled, and no call fails.
/// - The same workload calling the bridge directly on any other path — `POST
///   /v1/acquire`, `GET /v2/acquire`, `/metrics`, `/healthz` — gets 403, though the
///   bridge itself serves each one.
/// - A workload of namespace `other` gets 403 on the filter's own paths: its rules run
///   in their failure mode.
#[test]
fn the_bridge_policy_admits_the_filters_calls_and_refuses_the_rest() {
    let mesh = Mesh {
        resources: shipped(),
    };
    let rbac = bridge_rbac(&mesh, Peers::Authenticated);
    let [allow] = &rbac[..] else {
        panic!("one ALLOW filter expected: {rbac:?}")
    };
    let (paths, methods) = rbac_paths_and_methods(allow);
    assert_eq!(
        paths,
        FILTER_PATHS.iter().map(|p| p.to_string()).collect(),
        "the rendered RBAC permits exactly the filter's paths"
    );
    assert_eq!(methods, BTreeSet::from([FILTER_METHOD.to_string()]));

    let ca = MeshCa::new();
    let bridge_id = ca.identity(&bridge_pod(&mesh).0, "weir-bridge");
    let shop = ca.identity("shop", "api");
    let other = ca.identity("other", "api");

    let redis = RedisCluster::start(3, 0);
    let bridge = Bridge::start(&redis, &[]);
    // The bridge pod's sidecar: mTLS, RBAC, then the bridge (Istio's inbound|8081||).
    let sidecar_port = free_port();
    let admin_port = free_port();
    let mut listener = http_listener(
        "bridge-sidecar-inbound",
        sidecar_port,
        Context::SidecarInbound,
        rbac.clone(),
        json!([ { "match": { "prefix": "/" }, "route": { "cluster": "inbound|8081||" } } ]),
    );
    listener["filter_chains"][0]["transport_socket"] = ca.downstream(&bridge_id);
    let bootstrap = json!({
        "admin": { "address": { "socket_address": { "address": "127.0.0.1", "port_value": admin_port } } },
        "static_resources": {
            "listeners": [listener],
            "clusters": [static_cluster("inbound|8081||", bridge.port)],
        },
    });
    let sidecar = Envoy::start_yaml(
        &serde_yaml::to_string(&bootstrap).unwrap(),
        admin_port,
        sidecar_port,
        1,
    );
    let rbac_stat = |name: &str| {
        sidecar
            .stat(&format!("http.inbound_0.0.0.0_8080.rbac.{name}"))
            .unwrap_or(0)
    };
    let envoy = weir_workload(&ca, &shop, &bridge_id, sidecar_port);

    let get = |envoy: &Envoy, path: &str, estimate: &str| {
        send(
            envoy.http_port,
            Request::get(path)
                .header("x-user", "alice")
                .header("x-estimate", estimate),
        )
        .unwrap()
        .status
    };
    let limited: Vec<u16> = (0..8).map(|_| get(&envoy, "/limited", "1")).collect();
    assert_eq!(limited, [200, 200, 200, 200, 200, 429, 429, 429]);
    let llm: Vec<u16> = (0..3).map(|_| get(&envoy, "/llm", "500")).collect();
    assert_eq!(llm, [200, 200, 200]);
    let settled = || bridge.metric_sum("weir_bridge_commits_total", &[("rule", "llm")]);
    assert!(
        wait_until(Duration::from_secs(5), Duration::from_millis(50), || {
            settled() >= 3.0
        }),
        "commits settled by the bridge: {}",
        settled()
    );

    let stat = |name: &str| envoy.weir_stat(name);
    let decided = stat("rule.per-user.bridge_decisions");
    let cached = stat("rule.per-user.denial_cache_hits");
    assert_eq!(
        decided + cached,
        8,
        "{decided} decided by the bridge, {cached} cached denials"
    );
    assert_eq!(stat("rule.llm.bridge_decisions"), 3);
    assert_eq!(stat("rule.llm.committed"), 3);
    assert_eq!(stat("rule.llm.commit_units_refunded"), 3 * 380);
    assert_eq!(stat("rule.llm.commit_errors"), 0);
    for failure in ["failure_denied", "failure_allowed", "failure_local"] {
        assert_eq!(stat(&format!("rule.per-user.{failure}")), 0, "{failure}");
        assert_eq!(stat(&format!("rule.llm.{failure}")), 0, "{failure}");
    }
    for error in [
        "errors_status",
        "errors_unavailable",
        "errors_timeout",
        "errors_bad_body",
    ] {
        assert_eq!(stat(&format!("bridge.{error}")), 0, "bridge.{error}");
    }
    assert_eq!(
        bridge.metric_sum(
            "weir_bridge_decisions_total",
            &[("rule", "per-user"), ("result", "allowed")]
        ),
        5.0
    );
    let calls = stat("bridge.calls");
    let allowed = rbac_stat("allowed");
    assert!(
        allowed > calls,
        "the sidecar's RBAC admitted {allowed} calls: {calls} acquires and the commits"
    );
    assert_eq!(rbac_stat("denied"), 0);
    eprintln!(
        "shop: /limited {limited:?}, /llm {llm:?}; per-user: {decided} bridge decisions, \
         {cached} cached denials; {calls} acquire calls, {} commits settled; RBAC allowed \
         {allowed}",
        settled()
    );

    // The same workload on any other path: 403, though the bridge serves each one.
    let v1_body = r#"{"domain":"weir","items":[{"rule":"r","descriptor":["=alice"],
        "limit":{"algorithm":"gcra","burst":9,"rate":10,"period_us":1000000},"cost":1,"want":1}]}"#;
    let others = [
        Request::post(v1::ACQUIRE_PATH, v1_body),
        Request::get(v2::ACQUIRE_PATH),
        Request::get("/metrics"),
        Request::get("/healthz"),
    ];
    for request in &others {
        let label = format!("{} {}", request.method, request.path);
        let direct = send(bridge.port, request.clone()).unwrap().status;
        let through = send(envoy.http_port, request.clone()).unwrap().status;
        eprintln!("{label}: bridge {direct}, from shop through the sidecar {through}");
        assert_eq!(through, 403, "{label} through the sidecar");
        assert_ne!(direct, 403, "{label}: the bridge itself answers");
    }
    assert_eq!(rbac_stat("denied"), 4);
    // A filter path passes with any body: the bridge is the one refusing this.
    let bad = send(envoy.http_port, Request::post(v2::ACQUIRE_PATH, "{}")).unwrap();
    assert_eq!(bad.status, 400, "{}", bad.text());
    envoy.assert_no_panic();

    // A workload the policy does not name: refused on the filter's own paths.
    let stranger = weir_workload(&ca, &other, &bridge_id, sidecar_port);
    let refused: Vec<u16> = (0..3).map(|_| get(&stranger, "/limited", "1")).collect();
    assert_eq!(refused, [503, 503, 503], "failure mode deny");
    assert!(stranger.weir_stat("bridge.errors_status") >= 1);
    assert!(
        stranger.log().contains("bridge answered HTTP 403"),
        "the failure is the policy's 403:\n{}",
        stranger.log_tail(20)
    );
    assert_eq!(stranger.weir_stat("rule.per-user.bridge_decisions"), 0);
    let direct = send(stranger.http_port, Request::post(v2::ACQUIRE_PATH, "{}")).unwrap();
    assert_eq!(direct.status, 403, "{}", direct.text());
    eprintln!(
        "other: /limited {refused:?}, bridge.errors_status {}; RBAC denied {} in all",
        stranger.weir_stat("bridge.errors_status"),
        rbac_stat("denied")
    );
    stranger.assert_no_panic();
}
