//! The empty filter: a proxy-wasm root context and an HTTP context that do nothing.
//!
//! Envoy still creates a context per request and calls into the VM for every callback
//! the SDK exports (headers, body, trailers, log, done, delete), so what this filter
//! costs per request is the floor any proxy-wasm filter pays in this Envoy and runtime.
//! `weir-bench` runs it side by side with weir under the same `vm_config` (V8,
//! `FAIL_RELOAD`), so the difference between the two is weir's own work.

#[cfg(target_arch = "wasm32")]
use proxy_wasm::traits::{Context, HttpContext, RootContext};
#[cfg(target_arch = "wasm32")]
use proxy_wasm::types::ContextType;

#[cfg(target_arch = "wasm32")]
proxy_wasm::main! {{
    proxy_wasm::set_root_context(|_| Box::new(EmptyRoot));
}}

#[cfg(target_arch = "wasm32")]
struct EmptyRoot;

#[cfg(target_arch = "wasm32")]
impl Context for EmptyRoot {}

#[cfg(target_arch = "wasm32")]
impl RootContext for EmptyRoot {
    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(EmptyHttp))
    }
}

#[cfg(target_arch = "wasm32")]
struct EmptyHttp;

#[cfg(target_arch = "wasm32")]
impl Context for EmptyHttp {}

#[cfg(target_arch = "wasm32")]
impl HttpContext for EmptyHttp {}
