//! The Istio examples under `envoy/istio/` are real: every document parses, every plugin
//! configuration passes the filter's own checker, and every EnvoyFilter patch and WasmPlugin
//! is rendered into an Envoy bootstrap the way istiod would and loaded by a real Envoy
//! (`envoy --mode validate` loads `weir.wasm` and runs `on_configure`, so a bad plugin
//! config fails there too). Three examples also serve traffic: the gateway's per-IP limit,
//! the sidecar's per-user limit from a JWT claim, and the global per-tenant quota through a
//! real weir-bridge behind a stand-in of the bridge's sidecar. The bridge's
//! AuthorizationPolicy, rendered into that sidecar's RBAC filter behind mTLS, lets the
//! filter's calls through and refuses other paths and other namespaces.
//!
//! The rendering itself is the harness's [`weir_e2e::istio`] and
//! [`weir_e2e::istio_authz`]; the mesh's certificates are [`weir_e2e::mesh_tls`].

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use weir_core::wire::{v1, v2, FILTER_METHOD, FILTER_PATHS};
use weir_e2e::istio::{
    check_and_validate, check_istio_conventions, http_listener, parse_yaml_docs, plugins, render,
    shipped, static_cluster, stats_tags_override, test_token, wasm_plugin, Context, Extras, Mesh,
    Phase, Plugin, Resource,
};
use weir_e2e::istio_authz::{pod_labels, policies_for, rbac_filters, Peers};
use weir_e2e::mesh_tls::{Identity, MeshCa};
use weir_e2e::{
    free_port, prometheus_sum, send, wait_until, wasm_filter_yaml, weir_wasm, Bootstrap, Bridge,
    Client, Envoy, RedisCluster, Request,
};

/// The Istio outbound cluster of weir-bridge as shipped in `envoy/istio/bridge.yaml`.
const BRIDGE_CLUSTER: &str = "outbound|8081||weir-bridge.weir-system.svc.cluster.local";
/// The issuer of the shipped RequestAuthentication.
const ISSUER: &str = "https://auth.example.com/";

/// Kubernetes kinds the examples may contain, with the apiVersion to use.
const KINDS: &[(&str, &str)] = &[
    ("EnvoyFilter", "networking.istio.io/v1alpha3"),
    ("DestinationRule", "networking.istio.io/v1"),
    ("WasmPlugin", "extensions.istio.io/v1alpha1"),
    ("RequestAuthentication", "security.istio.io/v1"),
    ("AuthorizationPolicy", "security.istio.io/v1"),
    ("PeerAuthentication", "security.istio.io/v1"),
    ("Namespace", "v1"),
    ("Secret", "v1"),
    ("Service", "v1"),
    ("ConfigMap", "v1"),
    ("Deployment", "apps/v1"),
    ("PodDisruptionBudget", "policy/v1"),
];

fn shipped_plugin(file: &str, kind: &str) -> (Plugin, Mesh) {
    let resources = shipped();
    let resource = resources
        .iter()
        .find(|r| r.source.starts_with(file) && r.kind() == kind)
        .unwrap_or_else(|| panic!("no {kind} in {file}"))
        .clone();
    let mut found = plugins(&resource);
    assert_eq!(found.len(), 1, "{file}: one weir filter expected");
    (found.remove(0), Mesh { resources })
}

#[test]
fn every_document_parses_and_is_a_known_kind() {
    let resources = shipped();
    for r in &resources {
        let expected = KINDS
            .iter()
            .find(|(kind, _)| *kind == r.kind())
            .unwrap_or_else(|| panic!("{}: unexpected kind {:?}", r.source, r.kind()));
        assert_eq!(r.api_version(), expected.1, "{}: apiVersion", r.source);
        let dns1123 = |s: &str| {
            !s.is_empty()
                && s.len() <= 63
                && s.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        };
        assert!(
            dns1123(r.name()),
            "{}: metadata.name {:?}",
            r.source,
            r.name()
        );
        assert!(
            dns1123(r.namespace()),
            "{}: metadata.namespace {:?}",
            r.source,
            r.namespace()
        );
    }
    let kinds: Vec<&str> = resources.iter().map(Resource::kind).collect();
    for kind in ["EnvoyFilter", "WasmPlugin", "Deployment", "Service"] {
        assert!(kinds.contains(&kind), "no {kind} shipped");
    }
    // Both EnvoyFilter contexts and every WasmPlugin url form are shown.
    let all: Vec<Plugin> = resources.iter().flat_map(plugins).collect();
    assert!(all
        .iter()
        .any(|p| p.context == Context::Gateway && p.phase == Phase::Last));
    assert!(all
        .iter()
        .any(|p| p.context == Context::SidecarInbound && p.phase == Phase::Last));
    let urls: Vec<&str> = resources
        .iter()
        .filter(|r| r.kind() == "WasmPlugin")
        .filter_map(|r| r.spec()["url"].as_str())
        .collect();
    for scheme in ["oci://", "file://", "https://"] {
        assert!(
            urls.iter().any(|u| u.starts_with(scheme)),
            "no WasmPlugin with a {scheme} url: {urls:?}"
        );
    }
}

/// The Istio stats tags are the plain Envoy ones (envoy/envoy.yaml), so dashboards work
/// the same on both.
#[test]
fn the_istio_stats_tags_are_the_ones_envoy_yaml_ships() {
    let mesh = Mesh {
        resources: shipped(),
    };
    let envoy_yaml =
        std::fs::read_to_string(weir_e2e::repo_root().join("envoy/envoy.yaml")).unwrap();
    let envoy: Value = serde_yaml::from_str(&envoy_yaml).unwrap();
    assert_eq!(
        stats_tags_override(&mesh)["stats_config"],
        envoy["stats_config"]
    );
}

#[test]
fn every_plugin_config_passes_the_filters_checker_and_istios_conventions() {
    let mesh = Mesh {
        resources: shipped(),
    };
    let mut n = 0;
    for resource in &mesh.resources {
        for plugin in plugins(resource) {
            let config = plugin.config();
            check_istio_conventions(&plugin, &mesh);
            eprintln!("{}: {} rules", plugin.label, config.rules.len());
            n += 1;
        }
    }
    assert!(n >= 5, "only {n} plugins found");
}

/// The bridge Service in bridge.yaml is the one the plugin configs call, on the port the
/// bridge listens on.
#[test]
fn the_bridge_deployment_matches_its_service_and_cluster() {
    let mesh = Mesh {
        resources: shipped(),
    };
    assert!(mesh
        .outbound_clusters()
        .contains(&BRIDGE_CLUSTER.to_string()));
    let deployment = mesh
        .resources
        .iter()
        .find(|r| r.kind() == "Deployment" && r.name() == "weir-bridge")
        .expect("the weir-bridge Deployment");
    let container = &deployment.spec()["template"]["spec"]["containers"][0];
    let env: BTreeMap<&str, &Value> = container["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["name"].as_str().unwrap(), e))
        .collect();
    assert_eq!(
        env["WEIR_BRIDGE_LISTEN"]["value"], "0.0.0.0:8081",
        "Istio forwards inbound traffic to the pod IP: the bridge must not listen on 127.0.0.1 only"
    );
    assert!(env.contains_key("WEIR_BRIDGE_REDIS_NODES"));
    assert_eq!(
        env["WEIR_BRIDGE_REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"]["name"],
        "weir-bridge-redis"
    );
    assert_eq!(container["ports"][0]["containerPort"], 8081);
    let service = mesh
        .resources
        .iter()
        .find(|r| r.kind() == "Service" && r.name() == "weir-bridge")
        .unwrap();
    assert_eq!(service.spec()["ports"][0]["targetPort"], 8081);
    assert_eq!(
        service.spec()["ports"][0]["appProtocol"],
        "http",
        "an HTTP port, so sidecars balance requests rather than connections"
    );
    let labels = &deployment.spec()["template"]["metadata"]["labels"];
    for (k, v) in service.spec()["selector"].as_object().unwrap() {
        assert_eq!(&labels[k], v, "the Service selects the bridge pods");
    }
    let secret = mesh
        .resources
        .iter()
        .find(|r| r.kind() == "Secret" && r.name() == "weir-bridge-redis")
        .unwrap();
    assert!(secret.value["stringData"]["password"].is_string());
}

#[test]
fn every_plugin_loads_in_envoy_as_istio_would_render_it() {
    let mesh = Mesh {
        resources: shipped(),
    };
    let n = check_and_validate(&mesh.resources, &mesh);
    assert!(n >= 5, "only {n} plugins validated");
}

/// The translation itself: a WasmPlugin's fields land where istiod puts them.
#[test]
fn a_wasm_plugin_becomes_the_filter_istiod_builds() {
    let text = r#"
apiVersion: extensions.istio.io/v1alpha1
kind: WasmPlugin
metadata: { name: w, namespace: shop }
spec:
  selector: { matchLabels: { app: api } }
  url: oci://registry.example.com/weir:1
  pluginName: weir
  phase: AUTHZ
  failStrategy: FAIL_CLOSE
  match: [ { mode: SERVER } ]
  vmConfig:
    env:
    - { name: A, value: "1" }
    - { name: POD_NAME, valueFrom: HOST }
  pluginConfig:
    rules:
    - { name: r, limit: { algorithm: gcra, rate: 10.0, period: 1s } }
"#;
    let resources = parse_yaml_docs(text, "inline");
    let plugin = wasm_plugin(&resources[0]);
    assert_eq!(plugin.phase, Phase::Authz);
    assert_eq!(plugin.context, Context::SidecarInbound);
    // 10.0 went through a Struct: printed as 10, which the filter's u64 accepts.
    assert_eq!(
        plugin.json_value(),
        json!({ "rules": [ { "name": "r", "limit": { "algorithm": "gcra", "rate": 10, "period": "1s" } } ] })
    );
    assert!(plugin.json.contains(r#""rate":10"#), "{}", plugin.json);
    let config = &plugin.filter["typed_config"]["config"];
    assert_eq!(config["name"], "shop.w");
    assert_eq!(config["root_id"], "weir");
    assert_eq!(config["failure_policy"], "FAIL_CLOSED");
    assert!(
        config["vm_config"].get("vm_id").is_none(),
        "istiod sets no vm_id"
    );
    assert_eq!(
        config["vm_config"]["code"]["remote"]["http_uri"]["uri"],
        "oci://registry.example.com/weir:1"
    );
    assert_eq!(
        config["vm_config"]["environment_variables"]["key_values"]["A"],
        "1"
    );
    assert_eq!(
        config["vm_config"]["environment_variables"]["host_env_keys"],
        json!(["POD_NAME"])
    );
    let mesh = Mesh {
        resources: Vec::new(),
    };
    render(&plugin, &mesh, &weir_wasm(), Extras::default()).validate();
}

/// The gateway example serves: 51 requests from one address pass (burst 50), then 429s;
/// X-Forwarded-For does not buy a new bucket (use_remote_address); the login rule allows
/// 5 POSTs a minute. weir's stats survive Istio's stats inclusion list, and with the
/// shipped stats tags (envoy/istio/stats-tags.yaml) carry the plugin and rule as labels.
#[test]
fn the_gateway_per_ip_example_limits_in_a_real_envoy() {
    let (plugin, mesh) =
        shipped_plugin("envoy/istio/envoyfilter-gateway-per-ip.yaml", "EnvoyFilter");
    let extras = Extras {
        bootstrap_override: Some(stats_tags_override(&mesh)),
        ..Extras::default()
    };
    let rendered = render(&plugin, &mesh, &weir_wasm(), extras);
    let envoy = rendered.start(2);
    let mut client = Client::connect(envoy.http_port).unwrap();

    let started = Instant::now();
    let mut statuses = Vec::new();
    let mut denial = None;
    for _ in 0..1000 {
        let r = client.request(Request::get("/products")).unwrap();
        statuses.push(r.status);
        if r.status == 429 {
            denial = Some(r);
            break;
        }
    }
    let elapsed = started.elapsed();
    let passed = statuses.iter().filter(|&&s| s == 200).count();
    let denial = denial.unwrap_or_else(|| panic!("no 429 in 1000 requests: {statuses:?}"));
    // burst 50 → 51 at once, then one every 10 ms. The worker's reservoir may have
    // charged the schedule up to τ / 16 ahead when it took units from the full bucket
    // (docs/algorithms.md, "Reservoirs"): up to ⌈51 / 16⌉ fewer once.
    let most = 51 + (elapsed.as_secs_f64() * 100.0).ceil() as usize;
    let least = 51 - 51usize.div_ceil(16);
    assert!(
        (least..=most).contains(&passed),
        "{passed} passed in {elapsed:?} before the first 429 (expected {least}..={most})"
    );
    assert_eq!(denial.header("retry-after"), Some("1"));
    assert!(
        denial.text().contains(r#""rule":"gw-per-ip""#),
        "{}",
        denial.text()
    );
    assert!(denial
        .header("ratelimit-policy")
        .is_some_and(|p| p.contains(r#""gw-per-ip";q=51"#)));

    // Ten requests claiming ten other addresses: were X-Forwarded-For the key, each
    // would get a fresh bucket and pass. Keyed on the TCP peer, they pass only as the
    // bucket drips (one every 10 ms: a single request right after the 429 passed once
    // in a CI run and once in three local runs when this asked for exactly one 429).
    let spoofing = Instant::now();
    let spoofed_passed = (0..10)
        .filter(|i| {
            let xff = format!("203.0.113.{}", 10 + i);
            let r = client
                .request(Request::get("/products").header("x-forwarded-for", &xff))
                .unwrap();
            r.status == 200
        })
        .count();
    let dripped = 1 + (spoofing.elapsed().as_secs_f64() * 100.0).ceil() as usize;
    assert!(
        spoofed_passed <= dripped.min(9),
        "the gateway keys on the TCP peer, not on X-Forwarded-For: {spoofed_passed} of 10 \
         spoofed requests passed, at most {dripped} could drip in"
    );

    // The bucket is full again 510 ms after the burst: the login rule alone decides.
    std::thread::sleep(Duration::from_millis(600));
    let logins: Vec<u16> = (0..6)
        .map(|_| {
            client
                .request(Request::post("/login", "{}"))
                .unwrap()
                .status
        })
        .collect();
    assert_eq!(logins, [200, 200, 200, 200, 200, 429]);

    assert!(envoy.weir_stat("rule.gw-per-ip.limited") >= 2);
    assert_eq!(envoy.weir_stat("rule.gw-login.limited"), 1);
    let prometheus = envoy.admin("GET", "/stats/prometheus").text();
    assert!(
        prometheus_sum(
            &prometheus,
            "weir_rule_limited",
            &[("weir_plugin", "weir"), ("weir_rule", "gw-per-ip")]
        ) >= 2.0,
        "weir's counters in Prometheus form:\n{}",
        prometheus
            .lines()
            .filter(|l| l.contains("weir"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    envoy.assert_no_panic();
}

/// The sidecar example serves: the key is the verified token's issuer and subject, read
/// from the metadata key Istio 1.21+ uses.
#[test]
fn the_sidecar_jwt_example_limits_per_user_in_a_real_envoy() {
    let (plugin, mesh) = shipped_plugin(
        "envoy/istio/envoyfilter-sidecar-jwt-user.yaml",
        "EnvoyFilter",
    );
    let rendered = render(&plugin, &mesh, &weir_wasm(), Extras::default());
    let envoy = rendered.start(1);
    let token = |sub: &str| {
        format!(
            "Bearer {}",
            test_token(&json!({ "iss": ISSUER, "sub": sub, "exp": 4102444800u64 }))
        )
    };
    let (alice, bob) = (token("alice"), token("bob"));
    let post = |auth: &str| {
        send(
            envoy.http_port,
            Request::post("/api/orders", "{}").header("authorization", auth),
        )
        .unwrap()
    };
    for i in 0..20 {
        assert_eq!(post(&alice).status, 200, "write {i} of alice");
    }
    let denied = post(&alice);
    assert_eq!(denied.status, 429);
    assert!(denied.text().contains(r#""rule":"api-user-writes""#));
    assert_eq!(post(&bob).status, 200, "bob has buckets of his own");

    let read = send(
        envoy.http_port,
        Request::get("/api/orders").header("authorization", &alice),
    )
    .unwrap();
    assert_eq!(read.status, 200, "reads have their own, larger limit");
    assert!(
        read.header("ratelimit")
            .is_some_and(|v| v.contains(r#""api-user";r="#)),
        "headers_on_allowed: {:?}",
        read.headers
    );
    assert!(envoy.weir_stat("rule.api-user.allowed") >= 22);

    // Without a token the claim is missing: the rule does not apply (Istio's DENY policy,
    // not rendered here, refuses these requests in the mesh).
    let anonymous = send(envoy.http_port, Request::post("/api/orders", "{}")).unwrap();
    assert_eq!(anonymous.status, 200);
    assert_eq!(envoy.weir_stat("rule.api-user-writes.key_missing"), 1);
    let forged = format!("{}x", alice);
    assert_eq!(
        post(&forged).status,
        401,
        "jwt_authn refuses a bad signature"
    );
    envoy.assert_no_panic();
}

/// The global example serves through a real weir-bridge and Redis Cluster. The outbound
/// cluster, named as Istio names it, points at a stand-in of the bridge's sidecar (an
/// inbound HTTP connection manager with the shipped policy's RBAC in front of the
/// bridge), which refuses an `:authority` containing "|": the example's
/// `bridge.authority` is what makes the call succeed.
#[test]
fn the_global_tenant_example_reaches_the_bridge_through_istio_names() {
    let (plugin, mesh) = shipped_plugin("envoy/istio/wasmplugin-global-tenant.yaml", "WasmPlugin");
    let redis = RedisCluster::start(3, 0);
    let bridge = Bridge::start(&redis, &[]);
    let sidecar_port = free_port();
    // The bridge pod's sidecar: inbound listener with the shipped policy's RBAC (no mTLS
    // here: any peer), route to inbound|8081|| (the bridge).
    let sidecar = http_listener(
        "bridge-sidecar-inbound",
        sidecar_port,
        Context::SidecarInbound,
        bridge_rbac(&mesh, Peers::Any),
        json!([ { "match": { "prefix": "/" }, "route": { "cluster": "inbound|8081||" } } ]),
    );
    let start = |plugin: &Plugin| {
        render(
            plugin,
            &mesh,
            &weir_wasm(),
            Extras {
                bridge_port: Some(sidecar_port),
                listeners: vec![sidecar.clone()],
                clusters: vec![static_cluster("inbound|8081||", bridge.port)],
                ..Extras::default()
            },
        )
        .start(1)
    };
    let token = |tenant: &str| {
        format!(
            "Bearer {}",
            test_token(
                &json!({ "iss": ISSUER, "sub": "alice", "tenant": tenant, "exp": 4102444800u64 })
            )
        )
    };
    let request = |envoy: &Envoy| {
        send(
            envoy.http_port,
            Request::get("/api/reports").header("authorization", token("acme")),
        )
        .unwrap()
        .status
    };

    let envoy = start(&plugin);
    for _ in 0..5 {
        assert_eq!(request(&envoy), 200);
    }
    assert!(envoy.weir_stat("rule.tenant-daily.bridge_decisions") >= 1);
    assert_eq!(envoy.weir_stat("bridge.errors_status"), 0);
    assert_eq!(envoy.weir_stat("rule.tenant-daily.failure_local"), 0);
    assert!(
        bridge.metric_sum(
            "weir_bridge_decisions_total",
            &[("rule", "tenant-daily"), ("result", "allowed")]
        ) >= 1.0
    );
    // The bridge's DestinationRule, rendered as istiod would, is what Envoy runs: outlier
    // detection on connection failures only, the bridge's own 503s ejecting none.
    let dump = envoy
        .admin("GET", "/config_dump?resource=static_clusters")
        .text();
    let dump: Value = serde_json::from_str(&dump).unwrap();
    let outlier = dump["configs"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| &c["cluster"])
        .find(|c| c["name"] == BRIDGE_CLUSTER)
        .map(|c| c["outlier_detection"].clone())
        .unwrap_or_else(|| panic!("no {BRIDGE_CLUSTER} in the config dump"));
    assert_eq!(outlier["consecutive_local_origin_failure"], 2, "{outlier}");
    assert_eq!(
        outlier["enforcing_consecutive_local_origin_failure"], 100,
        "{outlier}"
    );
    assert_eq!(outlier["enforcing_consecutive_5xx"], 0, "{outlier}");
    assert_eq!(outlier["max_ejection_percent"], 50, "{outlier}");
    envoy.assert_no_panic();
    drop(envoy);

    // The same config without `authority`: the filter derives HOST:PORT from the outbound
    // cluster name (the name itself, with its "|", would get a 400 from the sidecar).
    let mut json = plugin.json_value();
    json["bridge"].as_object_mut().unwrap().remove("authority");
    let mut without = plugin.clone();
    without.json = json.to_string();
    without.filter["typed_config"]["config"]["configuration"]["value"] = json!(without.json);
    let envoy = start(&without);
    assert_eq!(request(&envoy), 200);
    assert_eq!(envoy.weir_stat("bridge.errors_status"), 0);
    assert_eq!(envoy.weir_stat("rule.tenant-daily.failure_local"), 0);
    assert!(envoy.weir_stat("rule.tenant-daily.bridge_decisions") >= 1);
}

/// The bridge pod's namespace and labels, as the shipped Deployment has them.
fn bridge_pod(mesh: &Mesh) -> (String, BTreeMap<String, String>) {
    let deployment = mesh
        .resources
        .iter()
        .find(|r| r.kind() == "Deployment" && r.name() == "weir-bridge")
        .expect("the weir-bridge Deployment");
    (deployment.namespace().to_string(), pod_labels(deployment))
}

/// The RBAC filters istiod renders from the shipped policies into the bridge pod's
/// inbound listener.
fn bridge_rbac(mesh: &Mesh, peers: Peers) -> Vec<Value> {
    let (namespace, labels) = bridge_pod(mesh);
    rbac_filters(&policies_for(mesh, &namespace, &labels), peers)
}

mod bridge_policy;
