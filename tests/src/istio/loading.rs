//! Loading: the YAML documents of `envoy/istio/` (and of any text under test) as
//! [`Resource`]s.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde_json::Value;

use crate::prereq::{repo_relative, repo_root};

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
