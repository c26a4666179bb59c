//! What weir's filter and weir-bridge agree on, and nothing else: the bridge depends on
//! this crate alone, not on the filter's config model, engine or lifecycle (`weir-core`,
//! which re-exports every module here under the same name).
//!
//! Modules are layered as in `weir-core`: each uses only the ones listed before it
//! (`core/tests/layers.rs` checks both crates).
//!
//! - [`field_error`]: the one error type of parsed JSON (a path and a message).
//! - [`bounds`]: every size limit the config, the wire and the bridge share.
//! - [`time`]: [`time::Micros`] and [`time::Nanos`], times where they cross modules.
//! - [`duration`]: durations as the config and the bridge's flags write them (`"500ms"`).
//! - [`algorithms`]: the rate-limit algorithms, pure functions of
//!   `(params, state, now, cost)`, each with everything weir knows about it.
//! - [`conformance`]: whether admissions of one key, from anywhere, keep their
//!   algorithm's bound.
//! - [`share`]: a fixed window's limit split fairly among the keys under a parent.
//! - [`key`]: key parts, their hashing to slots, their names on the wire and in Redis.
//! - [`wire`]: the filter ⇄ bridge format.

pub mod field_error;

pub mod bounds;

pub mod time;

pub mod duration;

pub mod algorithms;

pub mod conformance;

pub mod share;

pub mod key;

pub mod wire;
