//! weir's end-to-end harness: real Envoy, the built `weir.wasm` and a real Redis Cluster, all on
//! 127.0.0.1 ephemeral ports.
//!
//! Vocabulary:
//! - **guard** — a value that owns a child process ([`Child`], [`Envoy`], [`RedisCluster`],
//!   [`Process`]) and kills exactly that PID when dropped; never anything by name.
//! - **test dir** — a [`TestDir`] holding configs and logs; removed after a passing test, kept
//!   (path printed) after a failing one or with `WEIR_E2E_KEEP=1`.
//! - **rendered** — an Envoy bootstrap built the way istiod would from Istio resources
//!   ([`istio`]: `envoy/istio/*.yaml` and the docs' examples), to validate or to start;
//!   an AuthorizationPolicy becomes the RBAC filter istiod would build ([`istio_authz`]).
//! - **overlay** — a kustomize overlay of the Kubernetes package `deploy/kubernetes/`,
//!   rendered by `kubectl kustomize` and validated offline ([`manifests`]).
//! - **shared Envoy** — one Envoy per worker count for the whole test binary
//!   ([`shared_envoy`]), serving each test's bootstrap as a listener of its own through
//!   file-based LDS and CDS ([`Envoy::shared`]): `weir.wasm` is compiled once per process,
//!   not once per test. Tests that need the process itself use [`Envoy::start`].
//! - **prerequisite** — an external binary or the built filter; missing ones panic with the
//!   command that fixes it ([`envoy_bin`], [`weir_wasm`]).
//!
//! ```no_run
//! use weir_e2e::{get, Bootstrap, Envoy};
//!
//! let envoy = Envoy::start(&Bootstrap::new(), 1);
//! let r = get(envoy.http_port, "/", &[("x-user", "alice")]).unwrap();
//! assert_eq!(r.status, 200);
//! assert!(envoy.stat("http.ingress.downstream_rq_2xx").unwrap() >= 1);
//! ```
//!
//! Everything is blocking std code (no async runtime): tests are sequences of real requests.

pub mod bootstrap;
pub mod bridge;
pub mod decisions;
pub mod envoy;
pub mod global;
pub mod h2;
pub mod http;
pub mod istio;
pub mod istio_authz;
pub mod jwt;
pub mod knee_upstream;
pub mod llm_upstream;
pub mod load;
pub mod loopback;
pub mod manifests;
pub mod mesh_tls;
pub mod ports;
pub mod prereq;
pub mod process;
pub mod prometheus;
pub mod promql;
pub mod py_upstream;
pub mod redis;
pub mod redis_single;
pub mod registry;
pub mod shared_envoy;
pub mod shares;
pub mod slow_proxy;
pub mod wasm;

pub use bootstrap::{
    shipped_plugin_config, shipped_stats_config, wasm_filter_yaml, with_stats, Bootstrap,
};
pub use bridge::{
    bridge_bin, bridge_cluster_yaml, bridge_cluster_yaml_with, prometheus_sum,
    shipped_bridge_cluster_yaml, Bridge, BridgeProtocol,
};
pub use envoy::{parse_stats, Envoy, WEIR_STATS_LAG};
pub use http::{get, send, Client, Request, Response};
pub use knee_upstream::KneeUpstream;
pub use llm_upstream::LlmUpstream;
pub use load::{run_clients, LoadReport, Outcome};
pub use loopback::{Received, Witness};
pub use ports::{free_port, free_ports};
pub use prereq::{
    doc_files, documented_json, envoy_bin, generated_doc_block, python3_bin, redis_cli_bin,
    redis_server_bin, repo_relative, repo_root, venv_tool, weir_wasm,
};
pub use process::{pid_exists, wait_for, wait_until, Child, Process, TestDir};
pub use py_upstream::PyUpstream;
pub use redis::{key_slot, redis_cli_at, RedisCluster};
pub use redis_single::{RedisSentinel, RedisServer};
pub use slow_proxy::SlowProxy;
