//! An Envoy bootstrap rendered by plain Rust string building: one listener with an HTTP
//! connection manager, caller-supplied HTTP filters (raw YAML) before the router, a catch-all
//! `direct_response` route unless the caller supplies routes, and optional extra clusters (the
//! bridge, later). Raw snippets are written at column 0 and indented here. Also the weir
//! filter's YAML and what the shipped `envoy/envoy.yaml` holds.

use std::path::Path;

use crate::ports::free_port;

/// Body of the default catch-all route.
pub const DEFAULT_BODY: &str = "weir-e2e ok\n";

/// A bootstrap to render. Ports default to fresh free ports.
#[derive(Clone, Debug)]
pub struct Bootstrap {
    pub admin_port: u16,
    pub http_port: u16,
    /// HTTP filter list items (each starting with `- name: ...` at column 0), before the router.
    pub http_filters: Vec<String>,
    /// Route list items for the single virtual host (`domains: ["*"]`); `None` = catch-all
    /// `direct_response` 200 with [`DEFAULT_BODY`].
    pub routes: Option<String>,
    /// Cluster list items (`- name: ...` at column 0) for `static_resources.clusters`.
    pub clusters: Vec<String>,
    /// More listener list items (`- name: ...` at column 0) after the ingress listener: an
    /// upstream served by the same Envoy, say.
    pub listeners: Vec<String>,
    /// HCM `max_request_headers_kb`. Envoy's default is 60 (KiB for the whole header block), so a
    /// single 60 KB value gets 431; we default to 96 so tests can send 60 KB values.
    pub max_request_headers_kb: u32,
    /// An access log (file path, format): one line per request, written by
    /// Envoy when the request ends.
    pub access_log: Option<(std::path::PathBuf, AccessLogFormat)>,
    /// Top-level blocks before `static_resources` (raw YAML at column 0): `stats_config:`
    /// (e.g. the tags of [`shipped_stats_config`]), `cluster_manager:`…
    pub top_level: Vec<String>,
    /// Clients whose requests Envoy counts as internal (`internal_address_config`), as
    /// `(prefix, length)`: Envoy keeps their `x-envoy-*` headers and strips them from
    /// every other request. None by default, as in Envoy.
    pub internal_cidrs: Vec<(String, u32)>,
    /// More fields of the HTTP connection manager (YAML at its indentation, column 0
    /// here): `early_header_mutation_extensions:`, say.
    pub connection_manager: Vec<String>,
}

/// How an access log writes its lines.
#[derive(Debug, Clone)]
pub enum AccessLogFormat {
    /// Envoy's `text_format`, a newline appended.
    Text(String),
    /// Envoy's `json_format`: this object, one per line.
    Json(serde_json::Value),
}

impl Default for Bootstrap {
    fn default() -> Self {
        Bootstrap::new()
    }
}

impl Bootstrap {
    pub fn new() -> Bootstrap {
        Bootstrap {
            admin_port: free_port(),
            http_port: free_port(),
            http_filters: Vec::new(),
            routes: None,
            clusters: Vec::new(),
            listeners: Vec::new(),
            max_request_headers_kb: 96,
            access_log: None,
            top_level: Vec::new(),
            internal_cidrs: Vec::new(),
            connection_manager: Vec::new(),
        }
    }

    /// Adds fields to the HTTP connection manager (YAML at column 0).
    pub fn connection_manager(mut self, yaml: impl Into<String>) -> Bootstrap {
        self.connection_manager.push(yaml.into());
        self
    }

    /// Counts requests from `prefix/len` as internal: an Envoy in front of this one.
    pub fn internal_cidr(mut self, prefix: &str, len: u32) -> Bootstrap {
        self.internal_cidrs.push((prefix.to_string(), len));
        self
    }

    /// Adds an HTTP filter (raw YAML list item) before the router.
    pub fn http_filter(mut self, yaml: impl Into<String>) -> Bootstrap {
        self.http_filters.push(yaml.into());
        self
    }

    /// Adds a cluster (raw YAML list item).
    pub fn cluster(mut self, yaml: impl Into<String>) -> Bootstrap {
        self.clusters.push(yaml.into());
        self
    }

    /// Adds a top-level block (raw YAML at column 0), e.g. `cluster_manager:`.
    pub fn top_level(mut self, yaml: impl Into<String>) -> Bootstrap {
        self.top_level.push(yaml.into());
        self
    }

    /// Adds a listener (raw YAML list item) after the ingress listener.
    pub fn listener(mut self, yaml: impl Into<String>) -> Bootstrap {
        self.listeners.push(yaml.into());
        self
    }

    /// Replaces the catch-all route with these route list items (raw YAML).
    pub fn routes(mut self, yaml: impl Into<String>) -> Bootstrap {
        self.routes = Some(yaml.into());
        self
    }

    pub fn max_request_headers_kb(mut self, kb: u32) -> Bootstrap {
        self.max_request_headers_kb = kb;
        self
    }

    /// Writes one access-log line per request to `path` (Envoy's `text_format`, `\n`
    /// appended).
    pub fn access_log(mut self, path: &Path, format: &str) -> Bootstrap {
        let format = AccessLogFormat::Text(format.to_string());
        self.access_log = Some((path.to_path_buf(), format));
        self
    }

    /// Writes one JSON object per request to `path`: Envoy's `json_format`, the object
    /// `format` (e.g. what `weir-check log-format` prints).
    pub fn access_log_json(mut self, path: &Path, format: &serde_json::Value) -> Bootstrap {
        let format = AccessLogFormat::Json(format.clone());
        self.access_log = Some((path.to_path_buf(), format));
        self
    }

    /// Adds a top-level `stats_config:` block (raw YAML at column 0).
    pub fn stats_config(self, yaml: impl Into<String>) -> Bootstrap {
        self.top_level(yaml)
    }

    /// The bootstrap YAML.
    pub fn render(&self) -> String {
        let default_routes = format!(
            "- match: {{ prefix: \"/\" }}\n  direct_response:\n    status: 200\n    body: {{ inline_string: {} }}\n",
            yaml_quote(DEFAULT_BODY)
        );
        let routes = indent(self.routes.as_deref().unwrap_or(&default_routes), 14);
        let mut filters = String::new();
        for f in &self.http_filters {
            filters.push_str(&indent(f, 10));
        }
        let access_log = match &self.access_log {
            None => String::new(),
            Some((path, format)) => format!(
                "          access_log:\n          - name: envoy.access_loggers.file\n            typed_config:\n              \"@type\": type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog\n              path: {}\n              log_format:\n{}",
                yaml_quote(&path.to_string_lossy()),
                match format {
                    AccessLogFormat::Text(line) => format!(
                        "                text_format_source:\n                  inline_string: {}\n",
                        yaml_quote(&format!("{line}\n"))
                    ),
                    // JSON is YAML: the object goes in as it is.
                    AccessLogFormat::Json(object) => {
                        format!("                json_format: {object}\n")
                    }
                },
            ),
        };
        let internal = if self.internal_cidrs.is_empty() {
            String::new()
        } else {
            let mut c =
                "          internal_address_config:\n            cidr_ranges:\n".to_string();
            for (prefix, len) in &self.internal_cidrs {
                c.push_str(&format!(
                    "            - {{ address_prefix: {prefix}, prefix_len: {len} }}\n"
                ));
            }
            c
        };
        let listeners: String = self.listeners.iter().map(|l| indent(l, 2)).collect();
        let connection_manager: String = self
            .connection_manager
            .iter()
            .map(|yaml| indent(yaml, 10))
            .collect();
        let clusters = if self.clusters.is_empty() {
            "  clusters: []\n".to_string()
        } else {
            let mut c = "  clusters:\n".to_string();
            for cl in &self.clusters {
                c.push_str(&indent(cl, 2));
            }
            c
        };
        format!(
            r#"# Rendered by weir-e2e (tests/src/envoy.rs).
admin:
  address:
    socket_address: {{ address: 127.0.0.1, port_value: {admin} }}
{top_level}static_resources:
  listeners:
  - name: ingress
    address:
      socket_address: {{ address: 127.0.0.1, port_value: {http} }}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: ingress
          # The client address is the TCP peer, never X-Forwarded-For.
          use_remote_address: true
{internal}{connection_manager}          max_request_headers_kb: {kb}
{access_log}          route_config:
            name: local
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
{routes}          http_filters:
{filters}          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
{listeners}{clusters}"#,
            admin = self.admin_port,
            http = self.http_port,
            top_level = self.top_level.concat(),
            kb = self.max_request_headers_kb,
        )
    }
}

/// The `stats_config:` block of the shipped `envoy/envoy.yaml` (from its line to the next
/// top-level key), so tests run with exactly the tags users get.
pub fn shipped_stats_config() -> String {
    let path = crate::prereq::repo_root().join("envoy/envoy.yaml");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut block = String::new();
    let mut inside = false;
    for line in text.lines() {
        if line.starts_with("stats_config:") {
            inside = true;
        } else if inside && !line.is_empty() && !line.starts_with([' ', '#']) {
            break;
        }
        if inside {
            block.push_str(line);
            block.push('\n');
        }
    }
    assert!(!block.is_empty(), "{} has no stats_config", path.display());
    block
}

/// The plugin configuration (JSON) of the weir filter in the shipped `envoy/envoy.yaml`:
/// the README's config.
pub fn shipped_plugin_config() -> String {
    let path = crate::prereq::repo_root().join("envoy/envoy.yaml");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let bootstrap: serde_yaml::Value = serde_yaml::from_str(&text)
        .unwrap_or_else(|e| panic!("{} is not YAML: {e}", path.display()));
    let filters = &bootstrap["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
        ["typed_config"]["http_filters"];
    filters
        .as_sequence()
        .and_then(|f| f.iter().find(|f| f["name"] == "envoy.filters.http.wasm"))
        .and_then(|f| f["typed_config"]["config"]["configuration"]["value"].as_str())
        .unwrap_or_else(|| panic!("no weir filter configuration in {}", path.display()))
        .to_string()
}

/// The weir filter as an HTTP filter list item, per docs ENVOY_NOTES: name/root_id/vm_id `weir`,
/// V8, `FAIL_RELOAD`, the plugin JSON as a `google.protobuf.StringValue`.
pub fn wasm_filter_yaml(plugin_config_json: &str, wasm_path: &Path) -> String {
    format!(
        r#"- name: envoy.filters.http.wasm
  typed_config:
    "@type": type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm
    config:
      name: weir
      root_id: weir
      failure_policy: FAIL_RELOAD
      configuration:
        "@type": type.googleapis.com/google.protobuf.StringValue
        value: {json}
      vm_config:
        vm_id: weir
        runtime: envoy.wasm.runtime.v8
        code:
          local:
            filename: {path}
"#,
        json = yaml_quote(plugin_config_json),
        path = yaml_quote(&wasm_path.to_string_lossy()),
    )
}

/// The plugin configuration `json` with its `stats` level set to `level` (a test that reads
/// detailed stats asks for them: the default level does not define them).
pub fn with_stats(json: &str, level: &str) -> String {
    let mut config: serde_json::Value = serde_json::from_str(json)
        .unwrap_or_else(|e| panic!("not a JSON plugin configuration ({e}): {json}"));
    let object = config
        .as_object_mut()
        .unwrap_or_else(|| panic!("not a JSON object: {json}"));
    object.insert("stats".to_string(), level.into());
    config.to_string()
}

/// A YAML double-quoted scalar holding exactly `s` (JSON string escaping, which YAML accepts).
pub fn yaml_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if u32::from(c) < 0x20 || c == '\u{7f}' => {
                out.push_str(&format!("\\u{:04x}", u32::from(c)))
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Indents every non-empty line of `yaml` by `n` spaces; ensures a trailing newline.
pub fn indent(yaml: &str, n: usize) -> String {
    let pad = " ".repeat(n);
    let mut out = String::with_capacity(yaml.len() + 16);
    for line in yaml.lines() {
        if !line.trim().is_empty() {
            out.push_str(&pad);
            out.push_str(line);
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn yaml_quote_round_trips_through_json_escapes() {
        assert_eq!(yaml_quote("it's \"x\"\n\\"), r#""it's \"x\"\n\\""#);
    }
}
