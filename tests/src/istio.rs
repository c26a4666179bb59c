//! Istio's resources as istiod would render them: the `envoy/istio/*.yaml` EnvoyFilters and
//! WasmPlugins (and any others, e.g. the docs' examples) become weir filters ([`Plugin`]) and
//! Envoy bootstraps ([`render`]) that a real Envoy validates or serves.
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
//! ```no_run
//! use weir_e2e::istio::{plugins, render, shipped, Extras, Mesh};
//! use weir_e2e::weir_wasm;
//!
//! let mesh = Mesh { resources: shipped() };
//! for resource in &mesh.resources {
//!     for plugin in plugins(resource) {
//!         render(&plugin, &mesh, &weir_wasm(), Extras::default()).validate();
//!     }
//! }
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::{json, Map, Value};

use crate::envoy::Envoy;
use crate::jwt::{hs256, hs256_jwks};
use crate::ports::free_port;
use crate::prereq::{repo_relative, repo_root, weir_wasm};
use crate::process::TestDir;

/// Where Istio 1.21+ has jwt_authn write verified payloads.
pub const ISTIO_JWT_METADATA_KEY: &str = "payload";
/// The HS256 key that replaces every `jwksUri` in rendered bootstraps.
pub const TEST_JWT_SECRET: &[u8] = b"weir-istio-test-secret-32-bytes!";

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
        if self.kind() == "EnvoyFilter" {
            labels(&spec["workloadSelector"]["labels"])
        } else {
            labels(&spec["selector"]["matchLabels"])
        }
    }
}

/// A map of string labels (`matchLabels`, `metadata.labels`); empty when absent.
pub fn labels(value: &Value) -> BTreeMap<String, String> {
    value
        .as_object()
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_string()))
                .collect()
        })
        .unwrap_or_default()
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
            let path = entry
                .unwrap_or_else(|e| panic!("cannot list {}: {e}", d.display()))
                .path();
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

/// Every document of every shipped file.
pub fn shipped() -> Vec<Resource> {
    shipped_files()
        .iter()
        .flat_map(|path| {
            let text = std::fs::read_to_string(path)
                .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
            parse_yaml_docs(&text, &repo_relative(path))
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
        serde_json::from_str(&self.json).unwrap_or_else(|e| {
            panic!(
                "{}: the plugin config is not JSON: {e}\n{}",
                self.label, self.json
            )
        })
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
            let f = n
                .as_f64()
                .unwrap_or_else(|| panic!("{n} is not representable as a double"));
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

/// The weir filter istiod builds for a WasmPlugin. Panics when the resource is not one
/// Istio would accept or weir could serve (see the module doc).
pub fn wasm_plugin(resource: &Resource) -> Plugin {
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
    // Unquoted, an all-digit value is a number to YAML (and zeros an octal 0 to YAML 1.1).
    assert!(
        spec["sha256"].is_null() || spec["sha256"].is_string(),
        "{at}: sha256 must be a string: quote it"
    );
    if let Some(sha) = spec["sha256"].as_str() {
        assert!(
            sha.len() == 64
                && sha
                    .bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)),
            "{at}: sha256 must be 64 lowercase hex digits (the CRD's pattern)"
        );
        // For an image istio-agent compares `sha256` with the image's manifest digest, not
        // the module's (pkg/wasm/cache.go): both pins must name the same image.
        if let Some((_, pinned)) = url.split_once("@sha256:") {
            assert_eq!(
                sha, pinned,
                "{at}: sha256 of an oci:// url is the image (manifest) digest, as in the url"
            );
        }
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
    let json = serde_json::to_string(&through_struct(plugin_config))
        .unwrap_or_else(|e| panic!("{at}: cannot print pluginConfig as JSON: {e}"));
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
        let name = var["name"]
            .as_str()
            .unwrap_or_else(|| panic!("{at}: a vmConfig.env entry without a name: {var}"))
            .to_string();
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

    /// The `trafficPolicy.outlierDetection` of the DestinationRule for an outbound
    /// cluster's host, set on `cluster` as istiod translates it (pilot's
    /// `applyOutlierDetection`): success-rate ejection off, a count of 0 turns its
    /// ejection off, local-origin failures counted apart when split, and the panic
    /// threshold at `minHealthPercent` (0 unless set). Other traffic policies are not
    /// rendered.
    pub fn apply_destination_rule(&self, cluster: &mut Value) {
        let host = cluster["name"]
            .as_str()
            .and_then(|name| name.rsplit("||").next())
            .unwrap_or("")
            .to_string();
        let Some(rule) = self
            .resources
            .iter()
            .find(|r| r.kind() == "DestinationRule" && r.spec()["host"] == host.as_str())
        else {
            return;
        };
        let outlier = &rule.spec()["trafficPolicy"]["outlierDetection"];
        if outlier.is_null() {
            return;
        }
        let mut out = serde_json::json!({ "enforcing_success_rate": 0 });
        let count = |name: &str, count_field: &str, enforcing_field: &str, out: &mut Value| {
            if let Some(n) = outlier[name].as_u64() {
                out[count_field] = n.into();
                out[enforcing_field] = (if n > 0 { 100 } else { 0 }).into();
            }
        };
        count(
            "consecutive5xxErrors",
            "consecutive_5xx",
            "enforcing_consecutive_5xx",
            &mut out,
        );
        count(
            "consecutiveGatewayErrors",
            "consecutive_gateway_failure",
            "enforcing_consecutive_gateway_failure",
            &mut out,
        );
        for (from, to) in [
            ("interval", "interval"),
            ("baseEjectionTime", "base_ejection_time"),
            ("maxEjectionPercent", "max_ejection_percent"),
        ] {
            if !outlier[from].is_null() {
                out[to] = outlier[from].clone();
            }
        }
        if outlier["splitExternalLocalOriginErrors"] == true {
            out["split_external_local_origin_errors"] = true.into();
            if let Some(n) = outlier["consecutiveLocalOriginFailures"]
                .as_u64()
                .filter(|&n| n > 0)
            {
                out["consecutive_local_origin_failure"] = n.into();
                out["enforcing_consecutive_local_origin_failure"] = 100.into();
            }
            out["enforcing_local_origin_success_rate"] = 0.into();
        }
        cluster["outlier_detection"] = out;
        let min_health = outlier["minHealthPercent"].as_u64().unwrap_or(0);
        cluster["common_lb_config"] =
            serde_json::json!({ "healthy_panic_threshold": { "value": min_health } });
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
            "# Rendered by tests/src/istio.rs from {}\n{}",
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
