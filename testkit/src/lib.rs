//! weir's test kit: what the core's tests, weir-bridge's tests, the end-to-end harness
//! and weir-bench drive the core with. Nothing of it ships: weir.wasm, weir-bridge and
//! weir-check do not depend on it.
//!
//! - [`scenarios`]: the rows' shape (one key and the requests at explicit instants),
//!   which every backend runs: the pure functions, the slot table on the in-memory
//!   store, and the bridge's Lua scripts on real Redis.
//! - [`oracles`]: what the tests know of each algorithm without asking its code: its
//!   scenario rows, its bound read from the definition, how its Redis value reads back.
//! - [`model_bridge`]: weir-bridge's semantics on a model of Redis, from the core's
//!   references.
//! - [`simulation`]: many Envoys without Envoy, each running the engine over its own
//!   shared data, against a model of the bridge or the real one.
//!
//! The scripted Envoy the lifecycle's tests run on is its own crate, `weir-scripted`,
//! since weir-check replays logs on it too.

pub mod scenarios;

pub mod oracles;

pub mod model_bridge;

pub mod simulation;
