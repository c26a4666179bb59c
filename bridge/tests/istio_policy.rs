//! The AuthorizationPolicies shipped in front of the bridge (`envoy/istio/`, whatever
//! file holds them) let every call of the filter through, and nothing the bridge does not
//! serve: each path in `weir_protocol::wire::FILTER_PATHS` is admitted with `FILTER_METHOD`,
//! and each `(method, path)` they list is one the bridge's own router answers (asked in
//! process: not 404, not 405). tests/tests/istio.rs runs the same policy, rendered into
//! Envoy's RBAC filter, in front of a real bridge.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::collections::BTreeMap;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use tower::ServiceExt;
use weir_bridge::{app, state_from_client, AppState, Secret};
use weir_e2e::istio::{shipped, Mesh, Resource};
use weir_e2e::istio_authz::{admits, listed_operations, pod_labels, policies_for};
use weir_protocol::wire::{FILTER_METHOD, FILTER_PATHS};

/// The shipped weir-bridge Deployments and their pods' labels.
fn bridge_workloads(mesh: &Mesh) -> Vec<(&Resource, BTreeMap<String, String>)> {
    let found: Vec<_> = mesh
        .resources
        .iter()
        .filter(|r| r.kind() == "Deployment" && r.name() == "weir-bridge")
        .map(|d| (d, pod_labels(d)))
        .collect();
    assert!(!found.is_empty(), "no weir-bridge Deployment shipped");
    found
}

/// Every AuthorizationPolicy shipped that selects the bridge's pods, at least one.
fn bridge_policies<'a>(
    mesh: &'a Mesh,
    deployment: &Resource,
    labels: &BTreeMap<String, String>,
) -> Vec<&'a Resource> {
    let policies = policies_for(mesh, deployment.namespace(), labels);
    assert!(
        !policies.is_empty(),
        "no AuthorizationPolicy selects the bridge ({}): anyone in the mesh could call it",
        deployment.source
    );
    policies
}

#[test]
fn the_shipped_policy_admits_every_call_the_filter_makes() {
    let mesh = Mesh {
        resources: shipped(),
    };
    for (deployment, labels) in bridge_workloads(&mesh) {
        let policies = bridge_policies(&mesh, deployment, &labels);
        let sources: Vec<&str> = policies.iter().map(|p| p.source.as_str()).collect();
        for path in FILTER_PATHS {
            assert!(
                admits(&policies, FILTER_METHOD, path),
                "{sources:?} refuse {FILTER_METHOD} {path}, which the filter calls: every \
                 bridge call would get 403 and every global rule run in its failure mode"
            );
        }
    }
}

/// The router with a secret, so that a served path answers 401 without reaching Redis
/// (nothing listens on the seed's port).
fn state() -> AppState {
    let port = weir_e2e::free_port();
    let client = redis::cluster::ClusterClient::builder(vec![format!("redis://127.0.0.1:{port}")])
        .build()
        .unwrap();
    let timeout = Duration::from_millis(100);
    state_from_client(&client, timeout, timeout, Some(Secret::new("policy-test")))
}

async fn status_of(state: &AppState, method: &str, path: &str) -> StatusCode {
    let request = Request::builder()
        .method(method)
        .uri(path)
        .body(Body::empty())
        .unwrap();
    app(state.clone()).oneshot(request).await.unwrap().status()
}

#[tokio::test]
async fn the_shipped_policy_admits_nothing_the_bridge_does_not_serve() {
    let mesh = Mesh {
        resources: shipped(),
    };
    let state = state();
    assert_eq!(
        status_of(&state, "POST", "/no-such-path").await,
        StatusCode::NOT_FOUND,
        "how the router answers a path it does not serve"
    );
    for (deployment, labels) in bridge_workloads(&mesh) {
        let policies = bridge_policies(&mesh, deployment, &labels);
        let listed = listed_operations(&policies).unwrap_or_else(|e| {
            panic!("the bridge's policy must list exact methods and paths: {e}")
        });
        for (method, path) in &listed {
            let status = status_of(&state, method, path).await;
            assert!(
                status != StatusCode::NOT_FOUND && status != StatusCode::METHOD_NOT_ALLOWED,
                "the policy admits {method} {path}, which the bridge answers {status}"
            );
        }
        // Listed is all it admits: older filters' v1 path, reads and probes are refused.
        for (method, path) in [
            ("POST", weir_protocol::wire::v1::ACQUIRE_PATH),
            ("GET", weir_protocol::wire::v2::ACQUIRE_PATH),
            ("GET", "/metrics"),
            ("GET", "/healthz"),
        ] {
            assert!(
                !admits(&policies, method, path),
                "the policy admits {method} {path}"
            );
        }
        let expected: Vec<(String, String)> = FILTER_PATHS
            .iter()
            .map(|p| (FILTER_METHOD.to_string(), p.to_string()))
            .collect();
        assert_eq!(
            listed.into_iter().collect::<Vec<_>>(),
            expected,
            "the policy lists exactly the filter's calls"
        );
    }
}
