//! weir-bridge: the global-quota service of weir.
//!
//! The filter sends every global rule of a request in one `POST /v1/acquire`
//! ([`weir_core::wire`]); the bridge runs one Lua script per item on a Redis Cluster,
//! atomically per key, in order, and stops after the first denial. Time comes from Redis
//! `TIME`. See `bridge/README.md` for running it and `bridge/lua/` for the scripts.
//!
//! - [`app()`]: the axum `Router` (acquire, `/healthz`, `/metrics`); `main` only wires
//!   settings, tracing, the cluster client and graceful shutdown.
//! - [`scripts`]: the scripts, their ARGV and the pure reply decoder.
//! - [`store`]: running them (EVALSHA, EVAL on NOSCRIPT), bounded by the command timeout.
//! - [`error`]: the one error type, and [`error::classify`] for Redis errors.

pub mod app;
pub mod error;
pub mod logging;
pub mod metrics;
pub mod scripts;
pub mod settings;
pub mod store;

pub use app::{app, AppState, Draining, Secret};
pub use error::{classify, ApiError, ErrorClass};
pub use metrics::Metrics;
pub use settings::Settings;
pub use store::RedisStore;

use redis::cluster::ClusterClient;
use std::sync::Arc;
use std::time::Duration;

/// The state for [`app()`] from a cluster client. The connection is made in the
/// background: this returns at once even if no Redis node is up, and requests that need
/// Redis fail with 503 until one is.
pub fn state_from_client(
    client: &ClusterClient,
    timeout: Duration,
    connect_timeout: Duration,
    secret: Option<Secret>,
) -> AppState {
    let metrics = Arc::new(Metrics::default());
    // A connection config replaces the client's timeouts: repeat them.
    let config = redis::cluster::ClusterConfig::new()
        .set_connection_timeout(connect_timeout)
        .set_response_timeout(timeout);
    let conn = client.get_pending_async_connection_with_config(config);
    AppState {
        store: RedisStore::new(conn, timeout, metrics.clone()),
        secret,
        metrics,
        draining: Draining::default(),
    }
}
