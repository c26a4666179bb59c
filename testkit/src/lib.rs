//! weir's test kit: what the core's tests, weir-bridge's tests, the end-to-end harness
//! and weir-bench drive the core with. Nothing of it ships: weir.wasm, weir-bridge and
//! weir-check do not depend on it.
//!
//! - [`scenarios`]: the behavioural tables of the algorithms, one key and the requests
//!   at explicit instants, which every backend runs: the pure functions, the slot table
//!   on the in-memory store, and the bridge's Lua scripts on real Redis.
//! - [`scripted`]: a scripted host, Envoy's side of the proxy-wasm ABI played in process,
//!   so a request's whole lifecycle runs natively.
//! - [`scripted_envoy`]: Envoy's callbacks made over it, in the order Envoy makes them.
//! - [`simulation`]: many Envoys without Envoy, each running the engine over its own
//!   shared data, against a model of the bridge or the real one.

pub mod scenarios;

pub mod scripted;

pub mod scripted_envoy;

pub mod simulation;
