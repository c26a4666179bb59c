//! weir's core: everything the filter and the bridge decide, with no host in sight.
//!
//! This crate has no dependency on proxy-wasm, tokio or redis, so the compiler keeps
//! the seam: the filter crate is glue that feeds request facts and the clock in, and
//! carries decisions out.
//!
//! - [`algorithms`]: the rate-limit algorithms, pure functions of
//!   `(params, state, now, cost)`.
//! - [`config`]: the plugin JSON, parsed and compiled into types that cannot be invalid.
//! - [`rules`]: request matching and key building from request facts.
//! - [`store`]: the shared-data contract, the bounded CAS loop and the slot table.
//! - [`response`]: what a client sees (status, RateLimit headers, body).

pub mod algorithms;
pub mod config;
pub mod engine;
pub mod lease;
pub mod response;
pub mod rules;
pub mod store;
pub mod wire;
