//! Every example in `README.md`, `bridge/README.md` and `docs/*.md` works: what a reader
//! copies is what runs, and every benchmark figure the prose quotes is in the committed
//! data (`docs/bench/*.json`, see `docs_examples/figures.rs`).
//!
//! Each fenced block is checked by its language. An HTML comment on the line right before
//! the opening fence (invisible in rendered Markdown) changes what is expected:
//!
//! | block | default check | marker before the fence |
//! |---|---|---|
//! | ` ```json ` | a weir plugin configuration: `weir_core::config::parse` accepts it | `<!-- not-a-config -->`: other JSON (wire format, replies): valid JSON only. `<!-- bad-config -->`: the parser refuses it, and the ` ```text ` block that follows holds the exact error |
//! | ` ```text ` | not checked | `<!-- config-errors -->`: every line is exactly the message of one `core/tests/config/bad/*.expected` fixture, i.e. an error the filter really gives (the fixtures' own test pins each message to its input) |
//! | ` ```yaml ` | parsed (every document); then, by content: an EnvoyFilter or WasmPlugin is rendered as Istio would and loaded by `envoy --mode validate` (see `weir_e2e::istio`); an Envoy bootstrap (`static_resources`), a list of HTTP filters, of clusters or of routes, or an HTTP connection manager fragment (`http_filters:`, `route_config:`, and the `clusters:` they call) or a `stats_config:` is placed into a bootstrap and validated; anything else (Kubernetes objects, envoyproxy/ratelimit configs, Helm values) is parsed only | `<!-- not-envoy -->`: parsed only |
//!
//! In bootstraps and fragments every wasm filter's code becomes the locally built
//! `weir.wasm` (so `on_configure` runs on its configuration), and every cluster a fragment
//! names but does not define gets a stub, so fragments validate on their own. Other
//! languages (`sh`, `text`, …) are not checked. Fix the docs, not this test, when an
//! example fails.

use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::path::PathBuf;
use weir_e2e::istio::{
    backend_routes, check_and_validate, http_listener, parse_yaml_docs, shipped, static_cluster,
    with_local_code, Context, Mesh, Resource,
};
use weir_e2e::{doc_files, free_port, repo_relative, repo_root, weir_wasm, Envoy, TestDir};

/// A fenced block of a Markdown file.
#[derive(Debug)]
struct Block {
    /// `docs/istio.md:120`
    at: String,
    lang: String,
    /// The HTML comment right before the fence, if any (`not-a-config`).
    marker: Option<String>,
    text: String,
}

/// A block being read: where it opened, the fence's indentation, its language and marker.
struct Open<'a> {
    start: usize,
    indent: usize,
    lang: String,
    marker: Option<String>,
    lines: Vec<&'a str>,
}

/// The fenced blocks of a Markdown text (``` fences, indented ones included).
fn blocks(text: &str, file: &str) -> Vec<Block> {
    let mut out = Vec::new();
    let mut previous = "";
    let mut open: Option<Open> = None;
    for (i, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        let is_fence = trimmed.starts_with("```");
        match open.take() {
            Some(block) if is_fence && trimmed.trim_end() == "```" => {
                out.push(Block {
                    at: format!("{file}:{}", block.start + 1),
                    lang: block.lang,
                    marker: block.marker,
                    text: block.lines.join("\n"),
                });
                previous = "";
            }
            Some(mut block) => {
                // Strip the fence's own indentation (a block inside a list item).
                let body = match line.get(..block.indent) {
                    Some(pad) if pad.trim().is_empty() => &line[block.indent..],
                    _ => line.trim_start(),
                };
                block.lines.push(body);
                open = Some(block);
            }
            None if is_fence => {
                let info = &trimmed[3..];
                let marker = previous
                    .trim()
                    .strip_prefix("<!--")
                    .and_then(|m| m.strip_suffix("-->"))
                    .map(|m| m.trim().to_string());
                open = Some(Open {
                    start: i,
                    indent: line.len() - trimmed.len(),
                    lang: info.split_whitespace().next().unwrap_or("").to_string(),
                    marker,
                    lines: Vec::new(),
                });
            }
            None => {
                if !line.trim().is_empty() {
                    previous = line;
                }
            }
        }
    }
    assert!(open.is_none(), "{file}: a code fence is never closed");
    out
}

fn all_blocks() -> Vec<Block> {
    doc_files()
        .iter()
        .flat_map(|path| {
            let text = std::fs::read_to_string(path).unwrap();
            blocks(&text, &repo_relative(path))
        })
        .collect()
}

const MARKERS: &[&str] = &["not-a-config", "bad-config", "not-envoy", "config-errors"];

fn marker(block: &Block) -> Option<&str> {
    block.marker.as_deref().filter(|m| MARKERS.contains(m))
}

// ---------------------------------------------------------------------------------------
// JSON

#[test]
fn every_json_example_is_a_config_the_filter_accepts_or_is_marked() {
    let all = all_blocks();
    let mut configs = 0;
    let mut bad = 0;
    for (i, block) in all.iter().enumerate() {
        if block.lang != "json" {
            continue;
        }
        match marker(block) {
            Some("not-a-config") => {
                serde_json::from_str::<Value>(&block.text).unwrap_or_else(|e| {
                    panic!("{}: not valid JSON: {e}\n{}", block.at, block.text)
                });
            }
            Some("bad-config") => {
                let err = weir_core::config::parse(block.text.as_bytes())
                    .err()
                    .unwrap_or_else(|| {
                        panic!("{}: marked bad-config but the filter accepts it", block.at)
                    });
                let expected = all
                    .get(i + 1)
                    .filter(|next| next.lang == "text")
                    .unwrap_or_else(|| {
                        panic!(
                            "{}: a bad-config block must be followed by a ```text block with the error",
                            block.at
                        )
                    });
                assert_eq!(
                    err.to_string(),
                    expected.text.trim(),
                    "{}: the error shown at {} is not the one the filter gives",
                    block.at,
                    expected.at
                );
                bad += 1;
            }
            _ => {
                weir_core::config::parse(block.text.as_bytes()).unwrap_or_else(|e| {
                    panic!(
                        "{}: the filter refuses this config: {e}\n(mark other JSON with \
                         <!-- not-a-config --> on the line before the fence)\n{}",
                        block.at, block.text
                    )
                });
                configs += 1;
            }
        }
    }
    eprintln!("{configs} configs accepted, {bad} bad configs refused as documented");
    assert!(
        configs >= 10,
        "only {configs} JSON configs found in the docs"
    );
}

#[test]
fn every_marker_is_known_and_placed_on_the_right_block() {
    for block in all_blocks() {
        if let Some(m) = block.marker.as_deref() {
            if m.starts_with("not-") || m.ends_with("-config") {
                assert!(
                    MARKERS.contains(&m),
                    "{}: unknown marker <!-- {m} -->",
                    block.at
                );
            }
        }
        match marker(&block) {
            Some("not-a-config" | "bad-config") => {
                assert_eq!(
                    block.lang, "json",
                    "{}: JSON markers go on ```json",
                    block.at
                )
            }
            Some("not-envoy") => {
                assert_eq!(
                    block.lang, "yaml",
                    "{}: not-envoy goes on ```yaml",
                    block.at
                )
            }
            Some("config-errors") => {
                assert_eq!(
                    block.lang, "text",
                    "{}: config-errors goes on ```text",
                    block.at
                )
            }
            _ => {}
        }
    }
}

/// The messages of `core/tests/config/bad/*.expected`.
fn fixture_errors() -> Vec<String> {
    let dir = repo_root().join("core/tests/config/bad");
    std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "expected"))
        .map(|p| std::fs::read_to_string(p).unwrap().trim().to_string())
        .collect()
}

#[test]
fn every_quoted_config_error_is_one_the_filter_gives() {
    let known = fixture_errors();
    let mut quoted = 0;
    for block in all_blocks() {
        if marker(&block) != Some("config-errors") {
            continue;
        }
        for line in block.text.lines().map(str::trim).filter(|l| !l.is_empty()) {
            assert!(
                known.iter().any(|k| k == line),
                "{}: {line:?} is not the message of any core/tests/config/bad/*.expected fixture",
                block.at
            );
            quoted += 1;
        }
    }
    eprintln!("{quoted} quoted errors match fixtures");
    assert!(quoted >= 40, "only {quoted} errors quoted");
}

// ---------------------------------------------------------------------------------------
// YAML

/// What a YAML document is, for checking.
enum Shape {
    Istio,
    Bootstrap,
    Fragment(Fragment),
    Other,
}

#[derive(Default)]
struct Fragment {
    filters: Vec<Value>,
    routes: Vec<Value>,
    clusters: Vec<Value>,
    /// A whole `route_config` from an HCM fragment.
    route_config: Option<Value>,
    /// A bootstrap's `stats_config`.
    stats_config: Option<Value>,
}

fn is_http_filter(item: &Value) -> bool {
    item["name"]
        .as_str()
        .is_some_and(|n| n.starts_with("envoy.filters.http."))
        && item.get("typed_config").is_some()
}

fn is_cluster(item: &Value) -> bool {
    item.get("load_assignment").is_some() || item.get("connect_timeout").is_some()
}

fn is_route(item: &Value) -> bool {
    item.get("match").is_some()
        && (item.get("route").is_some() || item.get("direct_response").is_some())
}

fn shape(doc: &Value) -> Shape {
    if matches!(doc["kind"].as_str(), Some("EnvoyFilter" | "WasmPlugin")) {
        return Shape::Istio;
    }
    if doc.get("static_resources").is_some() {
        return Shape::Bootstrap;
    }
    if doc.get("stats_config").is_some() {
        return Shape::Fragment(Fragment {
            stats_config: doc.get("stats_config").cloned(),
            ..Fragment::default()
        });
    }
    if doc.get("http_filters").is_some() {
        let filters = doc["http_filters"].as_array().cloned().unwrap_or_default();
        return Shape::Fragment(Fragment {
            filters: filters
                .into_iter()
                .filter(|f| f["name"] != "envoy.filters.http.router")
                .collect(),
            route_config: doc.get("route_config").cloned(),
            // README's "Add weir to your Envoy": the filters and the clusters they call.
            clusters: doc["clusters"].as_array().cloned().unwrap_or_default(),
            ..Fragment::default()
        });
    }
    if let Some(items) = doc.as_array() {
        if !items.is_empty() {
            if items.iter().all(is_http_filter) {
                return Shape::Fragment(Fragment {
                    filters: items.clone(),
                    ..Fragment::default()
                });
            }
            if items.iter().all(is_cluster) {
                return Shape::Fragment(Fragment {
                    clusters: items.clone(),
                    ..Fragment::default()
                });
            }
            if items.iter().all(is_route) {
                return Shape::Fragment(Fragment {
                    routes: items.clone(),
                    ..Fragment::default()
                });
            }
        }
    }
    Shape::Other
}

/// Replaces the code of every wasm filter under `value` by the local `weir.wasm`, and
/// checks its plugin configuration with the filter's parser on the way.
fn localize_wasm(value: &mut Value, at: &str) {
    match value {
        Value::Object(map) => {
            let is_wasm = map.get("typed_config").is_some_and(|t| {
                t["@type"] == "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm"
            });
            if is_wasm {
                let filter = Value::Object(map.clone());
                if let Some(json) =
                    filter["typed_config"]["config"]["configuration"]["value"].as_str()
                {
                    weir_core::config::parse(json.as_bytes())
                        .unwrap_or_else(|e| panic!("{at}: the wasm filter's config: {e}"));
                }
                *value = with_local_code(&filter, &weir_wasm());
                return;
            }
            for v in map.values_mut() {
                localize_wasm(v, at);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|v| localize_wasm(v, at)),
        _ => {}
    }
}

/// Cluster names a fragment refers to: routes' `cluster`, gRPC services' `cluster_name`,
/// and the `bridge.cluster` of weir configurations.
fn referenced_clusters(value: &Value, out: &mut BTreeSet<String>) {
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                match (k.as_str(), v) {
                    ("cluster", Value::String(name)) => {
                        out.insert(name.clone());
                    }
                    ("envoy_grpc", Value::Object(g)) => {
                        if let Some(name) = g.get("cluster_name").and_then(Value::as_str) {
                            out.insert(name.to_string());
                        }
                    }
                    ("configuration", Value::Object(c)) => {
                        let bridge = c
                            .get("value")
                            .and_then(Value::as_str)
                            .and_then(|s| serde_json::from_str::<Value>(s).ok())
                            .and_then(|j| j["bridge"]["cluster"].as_str().map(str::to_string));
                        out.extend(bridge);
                    }
                    ("load_assignment", _) => {}
                    _ => referenced_clusters(v, out),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|v| referenced_clusters(v, out)),
        _ => {}
    }
}

/// A stub for a cluster the fragment names: HTTP/2 (it may be a gRPC service), on a port
/// nobody listens on.
fn stub_cluster(name: &str) -> Value {
    let mut cluster = static_cluster(name, free_port());
    cluster["typed_extension_protocol_options"] = json!({
        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
            "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
            "explicit_http_config": { "http2_protocol_options": {} },
        }
    });
    cluster
}

fn bootstrap_from_fragment(fragment: Fragment, at: &str) -> Value {
    let mut listener = http_listener(
        "docs",
        free_port(),
        Context::Gateway,
        fragment.filters,
        if fragment.routes.is_empty() {
            backend_routes()
        } else {
            Value::Array(fragment.routes)
        },
    );
    if let Some(route_config) = fragment.route_config {
        let hcm = &mut listener["filter_chains"][0]["filters"][0]["typed_config"];
        hcm["route_config"] = route_config;
    }
    let mut clusters = fragment.clusters;
    let mut bootstrap = json!({
        "admin": { "address": { "socket_address": { "address": "127.0.0.1", "port_value": free_port() } } },
        "static_resources": { "listeners": [listener], "clusters": [] },
    });
    if let Some(stats_config) = fragment.stats_config {
        bootstrap["stats_config"] = stats_config;
    }
    localize_wasm(&mut bootstrap, at);
    let mut referenced = BTreeSet::new();
    referenced_clusters(&bootstrap, &mut referenced);
    let defined: BTreeSet<String> = clusters
        .iter()
        .filter_map(|c| c["name"].as_str().map(str::to_string))
        .collect();
    clusters.extend(
        referenced
            .difference(&defined)
            .map(|name| stub_cluster(name)),
    );
    bootstrap["static_resources"]["clusters"] = Value::Array(clusters);
    bootstrap
}

fn validate(bootstrap: &Value, at: &str) {
    let dir = TestDir::new("docs-validate");
    let yaml = serde_yaml::to_string(bootstrap).unwrap();
    let path = dir.write("envoy.yaml", &yaml);
    if let Err(out) = Envoy::validate(&path) {
        panic!(
            "{at}: envoy --mode validate refused the example:\n{out}\n--- bootstrap ---\n{yaml}"
        );
    }
}

#[test]
fn every_yaml_example_parses_and_envoy_accepts_what_it_configures() {
    let shipped_mesh = shipped();
    let blocks: Vec<Block> = all_blocks()
        .into_iter()
        .filter(|b| b.lang == "yaml")
        .collect();
    let (mut istio, mut envoy, mut other) = (0, 0, 0);
    for block in &blocks {
        let docs: Vec<Resource> = parse_yaml_docs(&block.text, &block.at);
        assert!(!docs.is_empty(), "{}: an empty YAML block", block.at);
        if marker(block) == Some("not-envoy") {
            other += docs.len();
            continue;
        }
        // istiod sees the shipped resources and this block's.
        let mesh = Mesh {
            resources: shipped_mesh
                .iter()
                .cloned()
                .chain(docs.iter().cloned())
                .collect(),
        };
        for doc in &docs {
            match shape(&doc.value) {
                Shape::Istio => istio += check_and_validate(std::slice::from_ref(doc), &mesh),
                Shape::Bootstrap => {
                    let mut bootstrap = doc.value.clone();
                    localize_wasm(&mut bootstrap, &block.at);
                    validate(&bootstrap, &block.at);
                    envoy += 1;
                }
                Shape::Fragment(fragment) => {
                    validate(&bootstrap_from_fragment(fragment, &block.at), &block.at);
                    envoy += 1;
                }
                Shape::Other => other += 1,
            }
        }
    }
    eprintln!(
        "{} yaml blocks: {istio} Istio plugins and {envoy} Envoy configs validated, {other} documents parsed only",
        blocks.len()
    );
    assert!(istio >= 1 && envoy >= 5, "too few checked examples");
}

/// The checker's conventions, checked on themselves.
#[test]
fn blocks_and_markers_are_found_as_documented() {
    let text = "intro\n<!-- not-a-config -->\n```json\n{\"a\": 1}\n```\n\n- item\n\n  ```yaml\n  - name: x\n  ```\n```sh\necho\n```\n";
    let found = blocks(text, "t.md");
    assert_eq!(found.len(), 3);
    assert_eq!(found[0].lang, "json");
    assert_eq!(found[0].marker.as_deref(), Some("not-a-config"));
    assert_eq!(found[0].text, "{\"a\": 1}");
    assert_eq!(found[0].at, "t.md:3");
    assert_eq!(found[1].lang, "yaml");
    assert_eq!(found[1].marker, None);
    assert_eq!(found[1].text, "- name: x");
    assert_eq!(found[2].lang, "sh");
}

// ---------------------------------------------------------------------------------------
// Stat names and links

/// The stats `core/src/stats.rs` declares: a rule's (`limited`) and the plugin's
/// (`bridge.calls`).
fn defined_stats() -> (BTreeSet<String>, BTreeSet<String>) {
    use weir_core::stats::{PLUGIN_STATS, RULE_STATS};
    let rule = RULE_STATS.iter().map(|s| s.name.to_string()).collect();
    let plugin = PLUGIN_STATS
        .iter()
        .map(|s| format!("{}.{}", s.group.segment(), s.name))
        .collect();
    (rule, plugin)
}

/// docs/operations.md's tables of the stats are the ones rendered from their
/// declarations (`WEIR_WRITE_DOCS=1` writes them).
#[test]
fn the_stats_tables_are_rendered_from_the_declarations() {
    weir_e2e::generated_doc_block(
        "docs/operations.md",
        "stats-tables",
        &weir_core::stats::markdown_tables(),
    );
}

/// Every stat the docs name (`weir.PLUGIN.rule.NAME.limited`, `weir.PLUGIN.bridge.calls`)
/// is one `core/src/stats.rs` declares (operations.md's tables are rendered from it).
#[test]
fn every_stat_the_docs_name_is_one_the_filter_defines() {
    let (rule, plugin) = defined_stats();
    let name_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '<' | '>');
    let mut named = 0;
    for path in doc_files() {
        let text = std::fs::read_to_string(&path).unwrap();
        let file = repo_relative(&path);
        for (i, line) in text.lines().enumerate() {
            let at = format!("{file}:{}", i + 1);
            // `weir.<plugin>.<group>.…`: the words after the plugin's name.
            for (start, _) in line.match_indices("weir.") {
                let words: Vec<&str> = line[start + 5..]
                    .split(|c: char| !(name_char(c) || c == '.'))
                    .next()
                    .unwrap_or("")
                    .split('.')
                    .collect();
                let stat = match words.as_slice() {
                    [_, "rule", _, stat, ..] => (stat.to_string(), &rule),
                    [_, group @ ("bridge" | "store" | "vm"), stat @ ..] => {
                        (format!("{group}.{}", stat.join(".")), &plugin)
                    }
                    _ => continue,
                };
                // `weir.PLUGIN.rule.NAME.…`, `RULE.COUNTER`: a placeholder, not a name.
                let placeholder = |c: char| c.is_ascii_uppercase() || c == '<';
                if stat.0.is_empty() || stat.0.ends_with('.') || stat.0.contains(placeholder) {
                    continue;
                }
                assert!(
                    stat.1.contains(&stat.0),
                    "{at}: no stat `{}` in core/src/stats.rs",
                    stat.0
                );
                named += 1;
            }
        }
    }
    eprintln!("{named} stat names in the docs");
    assert!(named >= 15, "only {named} stat names found");
}

mod figures;
