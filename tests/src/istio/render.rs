//! Rendering a bootstrap: the listener, filter chain and clusters istiod would give a
//! workload, for Envoy to validate or serve.

use std::path::Path;

use serde_json::{json, Map, Value};

use crate::envoy::Envoy;
use crate::jwt::{hs256, hs256_jwks};
use crate::ports::free_port;
use crate::prereq::weir_wasm;
use crate::process::TestDir;

use super::{
    check_istio_conventions, plugins, Context, Mesh, Phase, Plugin, Resource,
    ISTIO_JWT_METADATA_KEY, TEST_JWT_SECRET,
};

/// An HS256 JWT signed with [`TEST_JWT_SECRET`].
pub fn test_token(payload: &Value) -> String {
    hs256(TEST_JWT_SECRET, &payload.to_string())
}

/// Istio's jwt_authn filter for these RequestAuthentications (`convertToEnvoyJwtConfig`):
/// providers `origins-N`, payload under "payload", a missing token allowed.
fn jwt_authn(auths: &[&Resource]) -> Option<Value> {
    let rules: Vec<&Value> = auths
        .iter()
        .flat_map(|r| r.spec()["jwtRules"].as_array().into_iter().flatten())
        .collect();
    if rules.is_empty() {
        return None;
    }
    let jwks = hs256_jwks(TEST_JWT_SECRET);
    let mut providers = Map::new();
    let mut requirements = Vec::new();
    for (i, rule) in rules.iter().enumerate() {
        let name = format!("origins-{i}");
        providers.insert(
            name.clone(),
            json!({
                "issuer": rule["issuer"],
                "audiences": rule["audiences"].as_array().cloned().unwrap_or_default(),
                "forward": rule["forwardOriginalToken"].as_bool().unwrap_or(false),
                "payload_in_metadata": ISTIO_JWT_METADATA_KEY,
                "normalize_payload_in_metadata": { "space_delimited_claims": ["permission", "scope"] },
                "local_jwks": { "inline_string": jwks },
            }),
        );
        requirements.push(json!({ "requires_any": { "requirements": [
            { "provider_name": name }, { "allow_missing": {} } ] } }));
    }
    let requires = if let [only] = requirements.as_slice() {
        only.clone()
    } else {
        json!({ "requires_all": { "requirements": requirements } })
    };
    Some(json!({
        "name": "envoy.filters.http.jwt_authn",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.jwt_authn.v3.JwtAuthentication",
            "providers": providers,
            "rules": [ { "match": { "prefix": "/" }, "requires": requires } ],
            "bypass_cors_preflight": true,
        },
    }))
}

fn stand_in(name: &str, type_url: &str) -> Value {
    json!({ "name": name, "typed_config": { "@type": type_url } })
}

fn router() -> Value {
    stand_in(
        "envoy.filters.http.router",
        "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router",
    )
}

/// The filter with its code replaced by the local `weir.wasm`, as istio-agent would.
pub fn with_local_code(filter: &Value, wasm: &Path) -> Value {
    let mut filter = filter.clone();
    let code = &mut filter["typed_config"]["config"]["vm_config"]["code"];
    assert!(
        code.get("local").is_some() || code.get("remote").is_some(),
        "vm_config.code is neither local nor remote: {code}"
    );
    *code = json!({ "local": { "filename": wasm.to_string_lossy() } });
    filter
}

/// A STATIC cluster of HTTP/1.1 endpoints on 127.0.0.1.
pub fn static_cluster(name: &str, port: u16) -> Value {
    json!({
        "name": name,
        "type": "STATIC",
        "connect_timeout": "0.25s",
        "load_assignment": {
            "cluster_name": name,
            "endpoints": [ { "lb_endpoints": [ { "endpoint": { "address": {
                "socket_address": { "address": "127.0.0.1", "port_value": port } } } } ] } ],
        },
    })
}

/// An HTTP listener on 127.0.0.1:`port` with these HTTP filters (router appended) and one
/// virtual host of `routes`.
pub fn http_listener(
    name: &str,
    port: u16,
    context: Context,
    filters: Vec<Value>,
    routes: Value,
) -> Value {
    let mut http_filters = filters;
    http_filters.push(router());
    let stat_prefix = match context {
        Context::Gateway => "outbound_0.0.0.0_8080",
        Context::SidecarInbound => "inbound_0.0.0.0_8080",
    };
    json!({
        "name": name,
        "address": { "socket_address": { "address": "127.0.0.1", "port_value": port } },
        "filter_chains": [ { "filters": [ {
            "name": "envoy.filters.network.http_connection_manager",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                "stat_prefix": stat_prefix,
                "use_remote_address": context == Context::Gateway,
                "normalize_path": true,
                "route_config": {
                    "name": name,
                    "virtual_hosts": [ { "name": "backend", "domains": ["*"], "routes": routes } ],
                },
                "http_filters": http_filters,
            },
        } ] } ],
    })
}

/// The backend stand-in: every request answered 200 by the proxy itself.
pub fn backend_routes() -> Value {
    json!([ { "match": { "prefix": "/" },
              "direct_response": { "status": 200, "body": { "inline_string": "backend\n" } } } ])
}

/// Istio's default stats inclusion list (istio-agent's bootstrap): only matching stats
/// exist. weir's `wasmcustom.weir.*` stats pass through the `wasm` prefix.
fn istio_stats_matcher() -> Value {
    let prefixes = [
        "reporter=",
        "cluster_manager",
        "listener_manager",
        "server",
        "cluster.xds-grpc",
        "wasm",
    ];
    let suffixes = [
        "rbac.allowed",
        "rbac.denied",
        "shadow_allowed",
        "shadow_denied",
        "downstream_cx_active",
        "component",
    ];
    let mut patterns: Vec<Value> = prefixes.iter().map(|p| json!({ "prefix": p })).collect();
    patterns.extend(suffixes.iter().map(|s| json!({ "suffix": s })));
    patterns.push(json!({ "safe_regex": { "regex": "vhost\\..*\\.route\\..*" } }));
    json!({ "stats_matcher": { "inclusion_list": { "patterns": patterns } } })
}

/// A bootstrap rendered for one plugin.
pub struct Rendered {
    pub label: String,
    pub yaml: String,
    pub admin_port: u16,
    pub http_port: u16,
}

impl Rendered {
    /// `envoy --mode validate`; panics with Envoy's output and the bootstrap.
    pub fn validate(&self) {
        let dir = TestDir::new("istio-validate");
        let path = dir.write("envoy.yaml", &self.yaml);
        if let Err(out) = Envoy::validate(&path) {
            panic!(
                "{}: envoy --mode validate refused the rendered bootstrap:\n{out}\n--- bootstrap ---\n{}",
                self.label, self.yaml
            );
        }
    }

    pub fn start(&self, concurrency: u32) -> Envoy {
        Envoy::start_yaml(&self.yaml, self.admin_port, self.http_port, concurrency)
    }
}

/// Extra pieces for a rendered bootstrap.
#[derive(Default)]
pub struct Extras {
    /// Where the bridge cluster points (default: a port nobody listens on).
    pub bridge_port: Option<u16>,
    pub listeners: Vec<Value>,
    pub clusters: Vec<Value>,
    /// A bootstrap override (`sidecar.istio.io/bootstrapOverride`: a ConfigMap's
    /// `custom_bootstrap.json`), merged as Envoy merges `--config-yaml` into the
    /// bootstrap: repeated fields are appended.
    pub bootstrap_override: Option<Value>,
}

/// The bootstrap istiod and istio-agent would give the proxy that `plugin` selects,
/// reduced to one listener (see the module doc).
pub fn render(plugin: &Plugin, mesh: &Mesh, wasm: &Path, extras: Extras) -> Rendered {
    let admin_port = free_port();
    let http_port = free_port();
    let weir = with_local_code(&plugin.filter, wasm);
    let auths = mesh.request_authentications(plugin);
    let mut filters = Vec::new();
    if plugin.phase == Phase::Authn {
        filters.push(weir.clone());
    }
    filters.extend(jwt_authn(&auths));
    if plugin.phase == Phase::Authz {
        filters.push(weir.clone());
    }
    filters.push(stand_in(
        "envoy.filters.http.rbac",
        "type.googleapis.com/envoy.extensions.filters.http.rbac.v3.RBAC",
    ));
    filters.push(stand_in(
        "envoy.filters.http.cors",
        "type.googleapis.com/envoy.extensions.filters.http.cors.v3.Cors",
    ));
    filters.push(stand_in(
        "envoy.filters.http.fault",
        "type.googleapis.com/envoy.extensions.filters.http.fault.v3.HTTPFault",
    ));
    if plugin.phase >= Phase::Stats {
        filters.push(weir);
    }
    let mut listeners = vec![http_listener(
        "weir",
        http_port,
        plugin.context,
        filters,
        backend_routes(),
    )];
    listeners.extend(extras.listeners);
    let mut clusters = extras.clusters;
    if let Some(cluster) = plugin.json_value()["bridge"]["cluster"].as_str() {
        let port = extras.bridge_port.unwrap_or_else(free_port);
        let mut bridge = static_cluster(cluster, port);
        mesh.apply_destination_rule(&mut bridge);
        clusters.push(bridge);
    }
    let mut bootstrap = json!({
        "admin": { "address": { "socket_address": { "address": "127.0.0.1", "port_value": admin_port } } },
        "stats_config": istio_stats_matcher(),
        "static_resources": { "listeners": listeners, "clusters": clusters },
    });
    if let Some(over) = &extras.bootstrap_override {
        merge_proto_json(&mut bootstrap, over);
    }
    Rendered {
        label: plugin.label.clone(),
        yaml: format!(
            "# Rendered by tests/src/istio/render.rs from {}\n{}",
            plugin.label,
            serde_yaml::to_string(&bootstrap)
                .unwrap_or_else(|e| panic!("{}: cannot print the bootstrap: {e}", plugin.label))
        ),
        admin_port,
        http_port,
    }
}

/// Merges `from` into `into` the way protobuf merges messages (what Envoy does with
/// `--config-yaml`): objects field by field, arrays appended, anything else replaced.
fn merge_proto_json(into: &mut Value, from: &Value) {
    match (into, from) {
        (Value::Object(into), Value::Object(from)) => {
            for (key, value) in from {
                match into.get_mut(key) {
                    Some(existing) => merge_proto_json(existing, value),
                    None => {
                        into.insert(key.clone(), value.clone());
                    }
                }
            }
        }
        (Value::Array(into), Value::Array(from)) => into.extend(from.iter().cloned()),
        (into, from) => *into = from.clone(),
    }
}

/// The shipped `weir-stats-tags` ConfigMap's `custom_bootstrap.json` (envoy/istio/stats-tags.yaml),
/// what istio-agent passes to Envoy for a pod annotated with
/// `sidecar.istio.io/bootstrapOverride: weir-stats-tags`.
pub fn stats_tags_override(mesh: &Mesh) -> Value {
    let config_map = mesh
        .resources
        .iter()
        .find(|r| r.kind() == "ConfigMap" && r.name() == "weir-stats-tags")
        .unwrap_or_else(|| panic!("no ConfigMap weir-stats-tags in envoy/istio/"));
    let text = config_map.value["data"]["custom_bootstrap.json"]
        .as_str()
        .unwrap_or_else(|| panic!("{}: no data.custom_bootstrap.json", config_map.source));
    serde_json::from_str(text)
        .unwrap_or_else(|e| panic!("{}: custom_bootstrap.json: {e}", config_map.source))
}

/// Every plugin of `resources`: the filter's checker, the Istio conventions, then a
/// rendered bootstrap through `envoy --mode validate`. Returns how many were validated.
pub fn check_and_validate(resources: &[Resource], mesh: &Mesh) -> usize {
    let wasm = weir_wasm();
    let mut n = 0;
    for resource in resources {
        for plugin in plugins(resource) {
            plugin.config();
            check_istio_conventions(&plugin, mesh);
            render(&plugin, mesh, &wasm, Extras::default()).validate();
            n += 1;
        }
    }
    n
}
