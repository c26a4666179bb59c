//! weir's core: everything the filter decides, with no host in sight (what the bridge
//! decides too is `weir-protocol`'s, re-exported here).
//!
//! This crate has no dependency on proxy-wasm, tokio or redis, so the compiler keeps
//! the seam: the filter crate is glue that feeds request facts and the clock in, and
//! carries decisions out.
//!
//! Modules are layered: each uses only the ones listed before it (a test,
//! `core/tests/layers.rs`, fails on an import that breaks the order). Those marked
//! `weir-protocol` are that crate's, re-exported here: what the filter and weir-bridge
//! agree on, and all of this crate the bridge compiles.
//!
//! - [`field_error`]: (`weir-protocol`) the one error type of parsed JSON (a path and a message).
//! - [`bounds`]: (`weir-protocol`) every size limit the config, the wire and the bridge share.
//! - [`stats`]: weir's Envoy stats, each declared once, and the levels that choose them.
//! - [`time`]: (`weir-protocol`) [`time::Micros`] and [`time::Nanos`], times where they cross modules.
//! - [`buffers`]: a VM's budget of bytes kept for requests in flight.
//! - [`algorithms`]: (`weir-protocol`) the rate-limit algorithms, pure functions of
//!   `(params, state, now, cost)`, each with everything weir knows about it.
//! - [`conformance`]: (`weir-protocol`) whether admissions of one key, from anywhere, keep their
//!   algorithm's bound.
//! - [`share`]: (`weir-protocol`) a fixed window's limit split fairly among the keys
//!   under a parent.
//! - [`key`]: (`weir-protocol`) key parts, their hashing to slots, their names on the wire and in Redis.
//! - [`store`]: the shared-data contract, the seed, the bounded CAS loop and slot tables.
//! - [`lease`]: leases and cached denials of global rules.
//! - [`response`]: what a client sees (status, RateLimit headers, body).
//! - [`usage`]: what a response says it cost (token usage in JSON bodies and streams).
//! - [`deadline`]: a request's own deadline, as its headers state it (delays end before it).
//! - [`rules`]: request matching, key building, costs, and a concurrency rule's limit.
//! - [`adaptive`]: latency sketches and the controller of adaptive concurrency limits.
//! - [`concurrency`]: concurrency limits, requests in flight per key.
//! - [`reservoir`]: a worker's units taken ahead and cached denials of local rules.
//! - [`config`]: the plugin JSON, parsed and compiled into types that cannot be invalid.
//! - [`delay`]: a worker's requests held instead of denied (`on_limit.delay`).
//! - [`worker`]: what one worker keeps beside shared data (reservoirs, held requests).
//! - [`wire`]: (`weir-protocol`) the filter ⇄ bridge format.
//! - [`engine`]: one request through every rule; one file per scope (local,
//!   concurrency, global) around each rule's runtime value.
//! - [`flight`]: bridge calls in flight, one per key (single flight).
//! - [`filter`]: a request's whole lifecycle in Envoy, behind a host seam (the
//!   [`filter::host::Host`] trait): the filter crate only translates the ABI.
//!
//! What the test suites and weir-bench drive this crate with (the scenario tables, a
//! scripted Envoy host, a simulated fleet) is the `weir-testkit` crate's.

pub use weir_protocol::field_error;

pub use weir_protocol::bounds;

pub mod stats;

pub use weir_protocol::time;

pub mod buffers;

pub use weir_protocol::algorithms;
pub use weir_protocol::with_every_algorithm;

pub use weir_protocol::conformance;

pub use weir_protocol::share;

pub use weir_protocol::key;

pub mod store;

pub mod lease;

pub mod response;

pub mod usage;

pub mod deadline;

pub mod rules;

pub mod adaptive;

pub mod concurrency;

pub mod reservoir;

pub mod config;

pub mod delay;

pub mod worker;

pub use weir_protocol::wire;

pub mod engine;

pub mod flight;

pub mod filter;
