//! From Istio resources to plugins: the filter an EnvoyFilter or a WasmPlugin asks for, as
//! istiod translates it.

use std::collections::BTreeMap;

use serde_json::{json, Map, Value};

use super::Resource;

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
