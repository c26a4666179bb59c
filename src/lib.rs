//! weir as a proxy-wasm HTTP filter: glue between Envoy and `weir_core`.
//!
//! - [`host`]: the only module that calls the host ABI; every status becomes a `Result`.
//! - [`store`]: the core's store contract over Envoy shared data, and request facts
//!   read from the host.
//! - [`metrics`]: Envoy stats for every decision.
//! - [`plugin`]: what a configured VM holds: it compiles the plugin JSON, shares the
//!   seed, creates the slot tables and defines the metrics.
//! - [`filter`]: per request, asks the core for a decision and carries it out.
//! - [`root`]: the root context: configure, tick, and an HTTP context per request.
//!
//! Each uses only the ones listed before it (`core/tests/layers.rs` checks).

pub mod filter;
pub mod host;
pub mod metrics;
pub mod plugin;
pub mod root;
pub mod store;

#[cfg(target_arch = "wasm32")]
proxy_wasm::main! {{
    std::panic::set_hook(Box::new(|info| {
        host::log(host::LogLevel::Critical, &format!("panic: {info}"));
    }));
    proxy_wasm::set_root_context(|context_id| Box::new(root::Root::new(context_id)));
}}
