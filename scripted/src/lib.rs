//! Envoy played in process, so that weir's one request lifecycle (`weir_core::filter`)
//! runs natively: weir-check replays access logs on it, and the tests and the benchmark
//! drive the filter with it.
//!
//! - [`scripted_host`]: Envoy's side of the proxy-wasm ABI, the host calls answered as
//!   Envoy answers them, with a clock the script moves.
//! - [`scripted_envoy`]: Envoy's callbacks made over it, in the order Envoy makes them.

pub mod scripted_host;

pub mod scripted_envoy;
