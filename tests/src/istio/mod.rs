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

// Each uses only those above it.

/// The YAML documents.
mod loading;

/// Resources to plugins.
mod plugins;

/// The mesh istiod sees.
mod mesh;

/// Bootstraps.
mod render;

pub use loading::*;
pub use mesh::*;
pub use plugins::*;
pub use render::*;

/// Where Istio 1.21+ has jwt_authn write verified payloads.
pub const ISTIO_JWT_METADATA_KEY: &str = "payload";
/// The HS256 key that replaces every `jwksUri` in rendered bootstraps.
pub const TEST_JWT_SECRET: &[u8] = b"weir-istio-test-secret-32-bytes!";
