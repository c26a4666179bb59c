//! weir-bridge: the global-quota service of weir.
//!
//! The filter sends every global rule of a request in one `POST /v2/acquire`
//! ([`weir_protocol::wire`]); the bridge runs one Lua script per item on Redis,
//! atomically per key, in order, and stops after the first denial. Redis is a cluster, one
//! standalone server or a master behind Sentinel ([`connection`]). Time comes from Redis
//! `TIME`. See `bridge/README.md` for running it and `bridge/lua/` for the scripts.
//!
//! - [`app()`]: the axum `Router` (acquire, `/healthz`, `/metrics`); `main` only wires
//!   settings, tracing, the Redis client and graceful shutdown.
//! - [`scripts`]: the scripts, their ARGV and the pure reply decoder.
//! - [`connection`]: the connection per deployment (cluster, standalone, sentinel).
//! - [`store`]: running them (EVALSHA, EVAL on NOSCRIPT), bounded by the command timeout.
//! - [`error`]: the one error type, and [`error::classify`] for Redis errors.

pub mod app;
pub mod connection;
pub mod error;
pub mod logging;
pub mod metrics;
pub mod scripts;
pub mod settings;
pub mod store;

pub use app::{app, AppState, Draining, Secret};
pub use connection::{RedisClient, RedisConnection};
pub use error::{classify, ApiError, ErrorClass};
pub use metrics::Metrics;
pub use settings::{RedisMode, Settings};
pub use store::RedisStore;

use std::sync::Arc;
use std::time::Duration;

/// The state for [`app()`] from a Redis client (a `&ClusterClient` converts). The
/// connection is made in the background: this returns at once even if no Redis node is
/// up, and requests that need Redis fail with 503 until one is.
pub fn state_from_client(
    client: impl Into<RedisClient>,
    timeout: Duration,
    connect_timeout: Duration,
    secret: Option<Secret>,
) -> AppState {
    let metrics = Arc::new(Metrics::default());
    let conn = client.into().connect(timeout, connect_timeout);
    AppState {
        store: RedisStore::new(conn, timeout, metrics.clone()),
        secret,
        metrics,
        draining: Draining::default(),
    }
}
