//! The filter: a request's whole lifecycle in Envoy, behind a host seam.
//!
//! Envoy calls into the VM (the proxy-wasm ABI's callbacks); the filter crate translates
//! each call into a method of [`Vm`] and each of our calls out into a method of
//! [`host::Host`]. Everything between — which context a callback is for, pausing a
//! request for a bridge call, the answer arriving after its request is gone, requests
//! joined on one call, holding and releasing delayed requests, settling costs when the
//! response ends, the tick's work — lives here, so it runs natively in tests against a
//! scripted host.
//!
//! - [`host`]: the trait, and the host's errors, log levels and metric types.
//! - [`facts`]: a request's facts as the rules read them.
//! - [`metrics`]: Envoy stats for every decision.
//! - [`plugin`]: what a configured plugin holds in a VM: the engine, the seed, the
//!   metrics, calls in flight, commits waiting for the bridge.
//! - [`request`]: one request's decision, carried out (with [`settling`] for what is
//!   settled when its response ends, and [`reply`] for the answer it gets).
//! - [`root`]: one plugin's root context: configure and tick.
//! - [`vm`]: the contexts of one VM ([`Vm`]), and every callback routed to them.
//!
//! The scripted host that plays Envoy's part in process, and Envoy's callbacks made over
//! it, are the `weir-scripted` crate's (`weir_scripted::scripted_host`,
//! `weir_scripted::scripted_envoy`): the tests and weir-check's replay run this
//! lifecycle on them.

// Lowest first: each file uses only those declared before it (core/tests/layers.rs
// reads this order). Blank lines keep rustfmt from sorting them.
pub mod host;

pub mod facts;

pub mod metrics;

pub mod plugin;

pub mod settling;

pub mod reply;

pub mod request;

pub mod root;

pub mod vm;

pub use request::{Action, BodyAction, Request, DELAY_HEADER};
pub use vm::Vm;
