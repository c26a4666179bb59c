//! The Istio examples under `envoy/istio/` are real: every document parses, every plugin
//! configuration passes the filter's own checker, and every EnvoyFilter patch and WasmPlugin
//! is rendered into an Envoy bootstrap the way istiod would and loaded by a real Envoy
//! (`envoy --mode validate` loads `weir.wasm` and runs `on_configure`, so a bad plugin
//! config fails there too). Three examples also serve traffic: the gateway's per-IP limit,
//! the sidecar's per-user limit from a JWT claim, and the global per-tenant quota through a
//! real weir-bridge behind a stand-in of the bridge's sidecar.
//!
//! What "the way istiod would" means here (no Kubernetes on this machine):
//! - **Listener.** One HTTP connection manager, as Istio builds for the context: `GATEWAY`
//!   with `use_remote_address: true`, `SIDECAR_INBOUND` without (Istio's inbound listeners
//!   trust the calling proxy's `X-Forwarded-For`). The backend is a `direct_response`.
//! - **Filter chain.** Istio's filters that upstream Envoy has, in Istio's order:
//!   `jwt_authn` (from the RequestAuthentications selecting the workload, with
//!   `payload_in_metadata: payload` as Istio 1.21+ writes it), `rbac`, `cors`, `fault`,
//!   then the router. Istio's own filters (`istio.metadata_exchange`, `istio.stats`) are not
//!   in upstream Envoy and are left out. An EnvoyFilter `INSERT_BEFORE` the router puts its
//!   value right before the router; a WasmPlugin goes where its `phase` says (AUTHN before
//!   jwt_authn, AUTHZ before rbac, STATS after the other filters, unspecified last).
//! - **WasmPlugin → filter** (istiod's `convertToWasmPluginWrapper`): name
//!   `<namespace>.<name>`, `root_id` = `pluginName`, `pluginConfig` → JSON in a
//!   `google.protobuf.StringValue` (numbers pass through a protobuf `Struct`, i.e. doubles,
//!   printed without a fraction when whole), `failStrategy` → `failure_policy`
//!   (FAIL_CLOSE → FAIL_CLOSED), V8, no `vm_id`, `vmConfig.env` → environment variables.
//! - **Code.** istio-agent downloads `oci://` and `http(s)://` modules and hands Envoy a
//!   local file; here every `url`, `local.filename` or `remote` becomes the locally built
//!   [`weir_wasm`]. Pulls, digests and ECDS delivery are not exercised.
//! - **Clusters.** A global rule's `bridge.cluster` must be the Istio outbound cluster
//!   `outbound|PORT||NAME.NAMESPACE.svc.cluster.local` of a Service shipped in
//!   `envoy/istio/`; the bootstrap gets a cluster of exactly that name.
//! - **JWKS.** A RequestAuthentication's `jwksUri` is replaced by a local HS256 key, so
//!   the tests can sign tokens.
//!
//! `docs_examples.rs` includes this file for the same rendering of the docs' YAML examples;
//! the tests below run only in this target (see [`own_target`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{json, Map, Value};
use weir_e2e::jwt::{hs256, hs256_jwks};
use weir_e2e::{
    free_port, prometheus_sum, repo_root, send, weir_wasm, Bridge, Client, Envoy, RedisCluster,
    Request, TestDir,
};

/// The Istio outbound cluster of weir-bridge as shipped in `envoy/istio/bridge.yaml`.
pub const BRIDGE_CLUSTER: &str = "outbound|8081||weir-bridge.weir-system.svc.cluster.local";
/// The issuer of the shipped RequestAuthentication.
pub const ISSUER: &str = "https://auth.example.com/";
/// Where Istio 1.21+ has jwt_authn write verified payloads.
pub const ISTIO_JWT_METADATA_KEY: &str = "payload";
/// The HS256 key that replaces every `jwksUri` in rendered bootstraps.
pub const TEST_JWT_SECRET: &[u8] = b"weir-istio-test-secret-32-bytes!";

/// True in the `istio` test target; false when `docs_examples.rs` includes this file (its
/// tests must not run twice).
pub fn own_target() -> bool {
    env!("CARGO_CRATE_NAME") == "istio"
}

// ---------------------------------------------------------------------------------------
// Loading

/// One YAML document and where it came from (`envoy/istio/x.yaml#2`).
#[derive(Clone, Debug)]
pub struct Resource {
    pub source: String,
    pub value: Value,
}

impl Resource {
    pub fn kind(&self) -> &str {
        self.value["kind"].as_str().unwrap_or("")
    }

    pub fn api_version(&self) -> &str {
        self.value["apiVersion"].as_str().unwrap_or("")
    }

    pub fn name(&self) -> &str {
        self.value["metadata"]["name"].as_str().unwrap_or("")
    }

    /// `metadata.namespace`, `default` when absent (as `kubectl apply` would).
    pub fn namespace(&self) -> &str {
        self.value["metadata"]["namespace"]
            .as_str()
            .unwrap_or("default")
    }

    pub fn spec(&self) -> &Value {
        &self.value["spec"]
    }

    /// The labels a workload selector asks for (`selector.matchLabels`, or an EnvoyFilter's
    /// `workloadSelector.labels`).
    pub fn selector(&self) -> BTreeMap<String, String> {
        let spec = self.spec();
        let labels = if self.kind() == "EnvoyFilter" {
            &spec["workloadSelector"]["labels"]
        } else {
            &spec["selector"]["matchLabels"]
        };
        labels
            .as_object()
            .map(|m| {
                m.iter()
                    .map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_string()))
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// Every document of a (multi-document) YAML text, empty documents skipped. Panics with
/// the source and the parser's message on invalid YAML.
pub fn parse_yaml_docs(text: &str, source: &str) -> Vec<Resource> {
    let mut out = Vec::new();
    for (i, doc) in serde_yaml::Deserializer::from_str(text).enumerate() {
        let value: Value = serde::Deserialize::deserialize(doc)
            .unwrap_or_else(|e| panic!("{source}: document {i} is not valid YAML: {e}"));
        if !value.is_null() {
            out.push(Resource {
                source: format!("{source}#{i}"),
                value,
            });
        }
    }
    out
}

/// The YAML files under `envoy/istio/`, sorted.
pub fn shipped_files() -> Vec<PathBuf> {
    let dir = repo_root().join("envoy/istio");
    let mut files = Vec::new();
    let mut stack = vec![dir.clone()];
    while let Some(d) = stack.pop() {
        for entry in
            std::fs::read_dir(&d).unwrap_or_else(|e| panic!("cannot list {}: {e}", d.display()))
        {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if path
                .extension()
                .is_some_and(|ext| ext == "yaml" || ext == "yml")
            {
                files.push(path);
            }
        }
    }
    files.sort();
    assert!(!files.is_empty(), "no YAML under {}", dir.display());
    files
}

/// A path relative to the repository, for messages.
pub fn relative(path: &Path) -> String {
    path.strip_prefix(repo_root())
        .unwrap_or(path)
        .display()
        .to_string()
}

/// Every document of every shipped file.
pub fn shipped() -> Vec<Resource> {
    shipped_files()
        .iter()
        .flat_map(|path| {
            let text = std::fs::read_to_string(path)
                .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
            parse_yaml_docs(&text, &relative(path))
        })
        .collect()
}

// ---------------------------------------------------------------------------------------
// From Istio resources to plugins

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Context {
    Gateway,
    SidecarInbound,
}

/// Where a plugin sits in Istio's chain (EnvoyFilters before the router: `Last`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Phase {
    Authn,
    Authz,
    Stats,
    Last,
}

/// A weir filter as one Istio resource asks for it.
#[derive(Clone, Debug)]
pub struct Plugin {
    /// `envoy/istio/x.yaml#2 EnvoyFilter shop/weir-api patch 0`.
    pub label: String,
    pub context: Context,
    pub phase: Phase,
    pub namespace: String,
    pub selector: BTreeMap<String, String>,
    /// The plugin configuration exactly as the filter receives it.
    pub json: String,
    /// The HTTP filter list item (`name`, `typed_config`) with the code still as written.
    pub filter: Value,
}

impl Plugin {
    /// The compiled configuration; panics with the filter's own message.
    pub fn config(&self) -> weir_core::config::Config {
        weir_core::config::parse(self.json.as_bytes()).unwrap_or_else(|e| {
            panic!(
                "{}: the plugin config is refused by weir_core::config::parse: {e}\n{}",
                self.label, self.json
            )
        })
    }

    /// The parsed JSON of the plugin config.
    pub fn json_value(&self) -> Value {
        serde_json::from_str(&self.json).unwrap()
    }
}

fn label(resource: &Resource) -> String {
    format!(
        "{} {} {}/{}",
        resource.source,
        resource.kind(),
        resource.namespace(),
        resource.name()
    )
}

/// The weir filters a resource adds: one per EnvoyFilter patch, one per WasmPlugin, none
/// for other kinds. Panics when a patch is not the shape the rendering assumes.
pub fn plugins(resource: &Resource) -> Vec<Plugin> {
    match resource.kind() {
        "EnvoyFilter" => envoy_filter_plugins(resource),
        "WasmPlugin" => vec![wasm_plugin(resource)],
        _ => Vec::new(),
    }
}

fn envoy_filter_plugins(resource: &Resource) -> Vec<Plugin> {
    let at = label(resource);
    assert_eq!(
        resource.api_version(),
        "networking.istio.io/v1alpha3",
        "{at}"
    );
    let patches = resource.spec()["configPatches"]
        .as_array()
        .unwrap_or_else(|| panic!("{at}: spec.configPatches is not a list"));
    let mut out = Vec::new();
    for (i, patch) in patches.iter().enumerate() {
        let at = format!("{at} patch {i}");
        assert_eq!(patch["applyTo"], "HTTP_FILTER", "{at}: applyTo");
        let m = &patch["match"];
        let context = match m["context"].as_str() {
            Some("GATEWAY") => Context::Gateway,
            Some("SIDECAR_INBOUND") => Context::SidecarInbound,
            other => panic!("{at}: match.context {other:?}: expected GATEWAY or SIDECAR_INBOUND"),
        };
        let filter = &m["listener"]["filterChain"]["filter"];
        assert_eq!(
            filter["name"], "envoy.filters.network.http_connection_manager",
            "{at}: match.listener.filterChain.filter.name"
        );
        assert_eq!(
            filter["subFilter"]["name"], "envoy.filters.http.router",
            "{at}: match ...subFilter.name"
        );
        assert_eq!(
            patch["patch"]["operation"], "INSERT_BEFORE",
            "{at}: patch.operation"
        );
        let value = patch["patch"]["value"].clone();
        let typed = &value["typed_config"];
        assert_eq!(
            typed["@type"], "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm",
            "{at}: patch.value.typed_config"
        );
        let configuration = &typed["config"]["configuration"];
        assert_eq!(
            configuration["@type"], "type.googleapis.com/google.protobuf.StringValue",
            "{at}: the configuration must be a StringValue"
        );
        let json = configuration["value"]
            .as_str()
            .unwrap_or_else(|| panic!("{at}: configuration.value is not a string"))
            .to_string();
        out.push(Plugin {
            label: at,
            context,
            phase: Phase::Last,
            namespace: resource.namespace().to_string(),
            selector: resource.selector(),
            json,
            filter: value,
        });
    }
    out
}

/// Does this WasmPlugin target a gateway? (a selector on an `istio` label naming a gateway,
/// or a Gateway in `targetRefs`)
fn targets_gateway(resource: &Resource) -> bool {
    let by_label = resource
        .selector()
        .get("istio")
        .is_some_and(|v| v.contains("gateway"));
    let by_ref = resource.spec()["targetRefs"]
        .as_array()
        .is_some_and(|refs| refs.iter().any(|r| r["kind"] == "Gateway"));
    by_label || by_ref
}

/// A `google.protobuf.Struct` as istiod prints it with protojson: every number is a
/// double, printed without a fraction when it is whole.
pub fn through_struct(value: &Value) -> Value {
    match value {
        Value::Number(n) => {
            let f = n.as_f64().unwrap();
            if f.fract() == 0.0 && f.abs() < 1e21 {
                if f >= 0.0 {
                    json!(f as u64)
                } else {
                    json!(f as i64)
                }
            } else {
                json!(f)
            }
        }
        Value::Array(items) => Value::Array(items.iter().map(through_struct).collect()),
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| (k.clone(), through_struct(v)))
                .collect(),
        ),
        other => other.clone(),
    }
}

fn wasm_plugin(resource: &Resource) -> Plugin {
    let at = label(resource);
    assert_eq!(
        resource.api_version(),
        "extensions.istio.io/v1alpha1",
        "{at}"
    );
    let spec = resource.spec();
    let url = spec["url"]
        .as_str()
        .unwrap_or_else(|| panic!("{at}: spec.url is required"));
    let scheme = url.split_once("://").map_or("oci", |(s, _)| s);
    assert!(
        ["oci", "file", "http", "https"].contains(&scheme),
        "{at}: url scheme {scheme:?}: Istio takes oci, file, http, https"
    );
    if let Some(sha) = spec["sha256"].as_str() {
        assert!(
            sha.len() == 64
                && sha
                    .bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)),
            "{at}: sha256 must be 64 lowercase hex digits (the CRD's pattern)"
        );
    }
    let plugin_type = spec["type"].as_str().unwrap_or("HTTP");
    assert!(
        plugin_type == "HTTP" || plugin_type == "UNSPECIFIED_PLUGIN_TYPE",
        "{at}: weir is an HTTP filter, type {plugin_type}"
    );
    let phase = match spec["phase"].as_str().unwrap_or("UNSPECIFIED_PHASE") {
        "AUTHN" => Phase::Authn,
        "AUTHZ" => Phase::Authz,
        "STATS" => Phase::Stats,
        "UNSPECIFIED_PHASE" => Phase::Last,
        other => panic!("{at}: unknown phase {other}"),
    };
    let modes: Vec<&str> = spec["match"]
        .as_array()
        .map(|m| {
            m.iter()
                .map(|s| s["mode"].as_str().unwrap_or("CLIENT_AND_SERVER"))
                .collect()
        })
        .unwrap_or_default();
    let context = if targets_gateway(resource) {
        Context::Gateway
    } else {
        assert_eq!(
            modes,
            ["SERVER"],
            "{at}: a rate limiter in a sidecar belongs on inbound traffic: `match: [{{mode: SERVER}}]` \
             (without it the plugin also runs on the pod's outbound calls)"
        );
        Context::SidecarInbound
    };
    let plugin_config = &spec["pluginConfig"];
    assert!(
        plugin_config.as_object().is_some_and(|m| !m.is_empty()),
        "{at}: pluginConfig is empty; weir refuses an empty configuration"
    );
    let json = serde_json::to_string(&through_struct(plugin_config)).unwrap();
    let failure_policy = match spec["failStrategy"].as_str().unwrap_or("FAIL_CLOSE") {
        "FAIL_CLOSE" => "FAIL_CLOSED",
        "FAIL_OPEN" => "FAIL_OPEN",
        "FAIL_RELOAD" => "FAIL_RELOAD",
        other => panic!("{at}: unknown failStrategy {other}"),
    };
    let mut env = Map::new();
    env.insert("ISTIO_META_WASM_PLUGIN_RESOURCE_VERSION".into(), json!("1"));
    let mut host_env = Vec::new();
    for var in spec["vmConfig"]["env"].as_array().into_iter().flatten() {
        let name = var["name"].as_str().unwrap().to_string();
        match var["valueFrom"].as_str().unwrap_or("INLINE") {
            "INLINE" => {
                env.insert(name, var["value"].clone());
            }
            "HOST" => host_env.push(json!(name)),
            other => panic!("{at}: unknown valueFrom {other}"),
        }
    }
    let resource_name = format!("{}.{}", resource.namespace(), resource.name());
    let mut config = json!({
        "name": resource_name,
        "configuration": {
            "@type": "type.googleapis.com/google.protobuf.StringValue",
            "value": json,
        },
        "failure_policy": failure_policy,
        "vm_config": {
            "runtime": "envoy.wasm.runtime.v8",
            "code": code_as_written(url, spec["sha256"].as_str()),
            "environment_variables": { "key_values": env, "host_env_keys": host_env },
        },
    });
    if let Some(root_id) = spec["pluginName"].as_str() {
        config["root_id"] = json!(root_id);
    }
    Plugin {
        label: at,
        context,
        phase,
        namespace: resource.namespace().to_string(),
        selector: resource.selector(),
        json,
        filter: json!({
            "name": resource_name,
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm",
                "config": config,
            },
        }),
    }
}

/// istiod's data source for a WasmPlugin `url` (before istio-agent fetches it).
fn code_as_written(url: &str, sha256: Option<&str>) -> Value {
    match url.strip_prefix("file://") {
        Some(path) => json!({ "local": { "filename": path } }),
        None => json!({ "remote": {
            "http_uri": { "uri": url, "cluster": "_", "timeout": "30s" },
            "sha256": sha256.unwrap_or(""),
        }}),
    }
}

// ---------------------------------------------------------------------------------------
// What istiod knows about the mesh

/// The resources istiod would see: the shipped ones, plus those of the text under test.
pub struct Mesh {
    pub resources: Vec<Resource>,
}

impl Mesh {
    /// The Istio outbound cluster names of every shipped Service port.
    pub fn outbound_clusters(&self) -> Vec<String> {
        let mut out = Vec::new();
        for r in self.resources.iter().filter(|r| r.kind() == "Service") {
            for port in r.spec()["ports"].as_array().into_iter().flatten() {
                out.push(format!(
                    "outbound|{}||{}.{}.svc.cluster.local",
                    port["port"],
                    r.name(),
                    r.namespace()
                ));
            }
        }
        out
    }

    /// The RequestAuthentications that select the plugin's workload (same namespace, or
    /// mesh-wide in istio-system without a selector; selector labels all present).
    pub fn request_authentications(&self, plugin: &Plugin) -> Vec<&Resource> {
        self.resources
            .iter()
            .filter(|r| r.kind() == "RequestAuthentication")
            .filter(|r| {
                let selector = r.selector();
                let same_ns = r.namespace() == plugin.namespace;
                let mesh_wide = r.namespace() == "istio-system" && selector.is_empty();
                (same_ns || mesh_wide)
                    && selector
                        .iter()
                        .all(|(k, v)| plugin.selector.get(k) == Some(v))
            })
            .collect()
    }
}

/// The Istio conventions a shipped plugin must follow beyond the filter's own checks.
pub fn check_istio_conventions(plugin: &Plugin, mesh: &Mesh) {
    let at = &plugin.label;
    let config = plugin.json_value();
    if let Some(bridge) = config.get("bridge") {
        let cluster = bridge["cluster"].as_str().unwrap_or("");
        let known = mesh.outbound_clusters();
        assert!(
            known.iter().any(|c| c == cluster),
            "{at}: bridge.cluster {cluster:?} is not the outbound cluster of a shipped Service \
             (Istio names them outbound|PORT||NAME.NAMESPACE.svc.cluster.local): {known:?}"
        );
        // Without `authority` the filter uses HOST:PORT of the outbound cluster.
        if let Some(authority) = bridge["authority"].as_str() {
            let host = cluster.rsplit("||").next().unwrap_or("");
            assert_eq!(authority, host, "{at}: bridge.authority");
        }
    }
    let uses_jwt = config["rules"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|rule| rule["key"].as_array().into_iter().flatten())
        .filter(|part| part.get("jwt_claim").is_some())
        .inspect(|part| {
            assert_eq!(
                part["jwt_metadata_key"], ISTIO_JWT_METADATA_KEY,
                "{at}: Istio 1.21+ writes verified JWT payloads under \"payload\""
            )
        })
        .count()
        > 0;
    if uses_jwt {
        assert!(
            !mesh.request_authentications(plugin).is_empty(),
            "{at}: keys on a JWT claim but no shipped RequestAuthentication selects {:?} in {}",
            plugin.selector,
            plugin.namespace
        );
        assert_ne!(
            plugin.phase,
            Phase::Authn,
            "{at}: phase AUTHN runs before jwt_authn: the claims are not there yet"
        );
    }
}

// ---------------------------------------------------------------------------------------
// Rendering a bootstrap

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
    let requires = if requirements.len() == 1 {
        requirements.pop().unwrap()
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
        clusters.push(static_cluster(cluster, port));
    }
    let bootstrap = json!({
        "admin": { "address": { "socket_address": { "address": "127.0.0.1", "port_value": admin_port } } },
        "stats_config": istio_stats_matcher(),
        "static_resources": { "listeners": listeners, "clusters": clusters },
    });
    Rendered {
        label: plugin.label.clone(),
        yaml: format!(
            "# Rendered by tests/tests/istio.rs from {}\n{}",
            plugin.label,
            serde_yaml::to_string(&bootstrap).unwrap()
        ),
        admin_port,
        http_port,
    }
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

// ---------------------------------------------------------------------------------------
// Tests

/// Kubernetes kinds the examples may contain, with the apiVersion to use.
const KINDS: &[(&str, &str)] = &[
    ("EnvoyFilter", "networking.istio.io/v1alpha3"),
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
    if !own_target() {
        return;
    }
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

#[test]
fn every_plugin_config_passes_the_filters_checker_and_istios_conventions() {
    if !own_target() {
        return;
    }
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
    if !own_target() {
        return;
    }
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
    if !own_target() {
        return;
    }
    let mesh = Mesh {
        resources: shipped(),
    };
    let n = check_and_validate(&mesh.resources, &mesh);
    assert!(n >= 5, "only {n} plugins validated");
}

/// The translation itself: a WasmPlugin's fields land where istiod puts them.
#[test]
fn a_wasm_plugin_becomes_the_filter_istiod_builds() {
    if !own_target() {
        return;
    }
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
/// 5 POSTs a minute. weir's stats survive Istio's stats inclusion list.
#[test]
fn the_gateway_per_ip_example_limits_in_a_real_envoy() {
    if !own_target() {
        return;
    }
    let (plugin, mesh) =
        shipped_plugin("envoy/istio/envoyfilter-gateway-per-ip.yaml", "EnvoyFilter");
    let rendered = render(&plugin, &mesh, &weir_wasm(), Extras::default());
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
    // burst 50 → 51 at once, then one every 10 ms.
    let most = 51 + (elapsed.as_secs_f64() * 100.0).ceil() as usize;
    assert!(
        (51..=most).contains(&passed),
        "{passed} passed in {elapsed:?} before the first 429 (expected 51..={most})"
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

    let spoofed = client
        .request(Request::get("/products").header("x-forwarded-for", "203.0.113.7"))
        .unwrap();
    assert_eq!(
        spoofed.status, 429,
        "the gateway keys on the TCP peer, not on X-Forwarded-For"
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
        prometheus_sum(&prometheus, "weir_rule_gw_per_ip_limited", &[]) >= 2.0,
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
    if !own_target() {
        return;
    }
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
/// inbound HTTP connection manager in front of the bridge), which refuses an `:authority`
/// containing "|": the example's `bridge.authority` is what makes the call succeed.
#[test]
fn the_global_tenant_example_reaches_the_bridge_through_istio_names() {
    if !own_target() {
        return;
    }
    let (plugin, mesh) = shipped_plugin("envoy/istio/wasmplugin-global-tenant.yaml", "WasmPlugin");
    let redis = RedisCluster::start(3, 0);
    let bridge = Bridge::start(&redis, &[]);
    let sidecar_port = free_port();
    // The bridge pod's sidecar: inbound listener, route to inbound|8081|| (the bridge).
    let sidecar = http_listener(
        "bridge-sidecar-inbound",
        sidecar_port,
        Context::SidecarInbound,
        Vec::new(),
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
