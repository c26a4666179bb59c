//! weir as a proxy-wasm HTTP filter: the ABI, translated. The request lifecycle is
//! `weir_core::filter`; this crate only connects it to Envoy.
//!
//! - [`wasm_host`]: the only module that calls the host ABI; [`wasm_host::WasmHost`] is the core's
//!   `Host` over it, every status a `Result`.
//! - [`abi`]: the callbacks Envoy makes, each a call into the core's `Vm`.
//!
//! Each uses only the ones listed before it (`core/tests/layers.rs` checks).

pub mod wasm_host;

pub mod abi;

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
        wasm_host::log(
            weir_core::filter::host::LogLevel::Critical,
            &format!("panic: {info}"),
        );
    }));
}
