//! weir as a proxy-wasm HTTP filter: glue between Envoy and `weir_core`.
//!
//! - [`host`]: the only module that calls the host ABI; every status becomes a `Result`.
//! - [`store`]: the core's store contract over Envoy shared data, and request facts
//!   read from the host.
//! - [`metrics`]: Envoy stats for every decision.
//! - [`plugin`]: what a configured VM holds: it compiles the plugin JSON, shares the
//!   seed, creates the slot tables, defines the metrics and makes the bridge calls.
//! - [`filter`]: per request, asks the core for a decision and carries it out.
//! - [`root`]: one plugin's root context: configure and tick.
//! - [`abi`]: the callbacks Envoy makes, routed to the contexts.
//!
//! Each uses only the ones listed before it (`core/tests/layers.rs` checks).

pub mod abi;
pub mod filter;
pub mod host;
pub mod metrics;
pub mod plugin;
pub mod root;
pub mod store;

#[cfg(target_os = "wasi")]
extern "C" {
    fn __wasm_call_ctors();
}

/// The WASI reactor's entry point, run once when the VM starts: a panic is logged at
/// critical level before the VM traps (it should never happen: the workspace denies
/// `unwrap`, `expect`, `panic` and indexing outside tests).
#[cfg(target_arch = "wasm32")]
#[no_mangle]
pub extern "C" fn _initialize() {
    #[cfg(target_os = "wasi")]
    unsafe {
        __wasm_call_ctors();
    }
    std::panic::set_hook(Box::new(|info| {
        host::log(host::LogLevel::Critical, &format!("panic: {info}"));
    }));
}
