//! weir-core's integration tests, one module a file beside this one, built as one test
//! binary: the shared `support` module is compiled once, the binary is linked once (natively
//! and for wasm32), and its tests run in parallel instead of one file after another.
//! `cargo test -p weir-core --test suite search_global::` runs one file's tests.
// Test code: a failed unwrap or index is a failed test (for every module of the suite).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod support;

mod adaptive;
mod adding_an_algorithm;
mod algorithm_properties;
mod algorithms;
mod architecture;
mod clamp;
mod commit;
mod commit_lying;
mod concurrency;
mod config;
mod conformance;
mod conformance_properties;
mod cost_property;
mod delay;
mod engine;
mod filter_paths;
mod global;
mod global_simulation;
mod hostile;
mod hostile_bodies;
mod layers;
mod lifecycle;
mod limit_changes;
mod outstanding;
mod request_limits;
mod reservoirs;
mod search;
mod search_global;
mod search_hostile;
mod search_shares;
mod shares;
mod shares_delay;
