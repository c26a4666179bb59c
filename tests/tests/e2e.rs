//! weir's end-to-end tests, one module a file beside this one, built as one test binary
//! (`concurrency.rs` is its own: its tests measure latency and run with nothing beside
//! them). The binary is linked once and runs its tests two at a time across files.
//! `cargo test -p weir-e2e --test e2e global_limits::` runs one file's tests.

mod abi;
mod accuracy_gauges;
mod alerts;
mod buffers;
mod delay;
mod docs_examples;
mod docs_links;
mod global_conformance;
mod global_limits;
mod harness_smoke;
mod hostile;
mod istio;
mod local_limits;
mod manifests;
mod oci_bridge;
mod oci_wasm;
mod redis_modes;
mod release;
mod replay;
mod rolling_update;
mod shared_envoy;
mod shares;
mod stats;
mod tenant_limits;
mod token_limits;
