//! The callbacks Envoy makes into the VM (proxy-wasm ABI 0.2.1), each translated into a
//! method of the core's [`Vm`], with [`WasmHost`] as its host. Nothing else happens
//! here: which context a callback is for, and what it does, is decided in
//! `weir_core::filter`, where it is tested natively against a scripted host.
//!
//! weir exports these itself rather than through an SDK's dispatcher (see
//! docs/architecture.md, "Why weir carries its own ABI layer"): a bridge call's answer
//! must reach its call whether or not the request that made it still exists, and
//! nothing here may panic on an input the host sends.
//!
//! Every callback Envoy makes counts itself (`vm.entries`, see [`wasm_host::entered`]).
//!
//! The VM's state is borrowed for the length of a callback. Should Envoy ever re-enter
//! the VM from within a callback (it does not: a local reply or a resumed request is
//! carried out after the callback returns), the inner callback finds the state borrowed
//! and does nothing, rather than borrowing twice.

use crate::wasm_host::{self, WasmHost};
use std::cell::RefCell;
use weir_core::filter::{Action, BodyAction, Vm};

thread_local! {
    static VM: RefCell<Vm> = RefCell::new(Vm::default());
}

/// Runs `f` on the VM's contexts; `None` if a callback is already running.
fn with_vm<R>(f: impl FnOnce(&mut Vm) -> R) -> Option<R> {
    VM.with(|vm| vm.try_borrow_mut().ok().map(|mut vm| f(&mut vm)))
}

fn action(f: impl FnOnce(&mut Vm) -> Action) -> u32 {
    with_vm(f).unwrap_or(Action::Continue) as u32
}

#[no_mangle]
pub extern "C" fn proxy_abi_version_0_2_1() {}

/// Memory the host asks for to hand data in: a boxed slice of exactly `size` bytes,
/// taken back by `host` with `Vec::from_raw_parts(ptr, size, size)`.
#[no_mangle]
pub extern "C" fn proxy_on_memory_allocate(size: usize) -> *mut u8 {
    wasm_host::entered();
    let mut bytes = vec![0u8; size].into_boxed_slice();
    let ptr = bytes.as_mut_ptr();
    std::mem::forget(bytes);
    ptr
}

#[no_mangle]
pub extern "C" fn proxy_on_context_create(context_id: u32, parent_id: u32) {
    wasm_host::entered();
    with_vm(|vm| vm.on_context_create(context_id, parent_id));
}

#[no_mangle]
pub extern "C" fn proxy_on_vm_start(_root_id: u32, _vm_configuration_size: usize) -> u32 {
    wasm_host::entered();
    1
}

#[no_mangle]
pub extern "C" fn proxy_on_configure(root_id: u32, _plugin_configuration_size: usize) -> u32 {
    wasm_host::entered();
    u32::from(with_vm(|vm| vm.on_configure(&WasmHost, root_id)).unwrap_or(false))
}

#[no_mangle]
pub extern "C" fn proxy_on_tick(root_id: u32) {
    wasm_host::entered();
    with_vm(|vm| vm.on_tick(&WasmHost, root_id));
}

#[no_mangle]
pub extern "C" fn proxy_on_request_headers(context_id: u32, _headers: usize, eos: u32) -> u32 {
    wasm_host::entered();
    action(|vm| vm.on_request_headers(&WasmHost, context_id, eos != 0))
}

#[no_mangle]
pub extern "C" fn proxy_on_request_body(context_id: u32, body_size: usize, eos: u32) -> u32 {
    wasm_host::entered();
    with_vm(|vm| vm.on_request_body(&WasmHost, context_id, body_size, eos != 0))
        .unwrap_or(BodyAction::Continue) as u32
}

#[no_mangle]
pub extern "C" fn proxy_on_request_trailers(context_id: u32, _trailers: usize) -> u32 {
    wasm_host::entered();
    action(|vm| vm.on_request_trailers(&WasmHost, context_id))
}

#[no_mangle]
pub extern "C" fn proxy_on_response_headers(context_id: u32, _headers: usize, eos: u32) -> u32 {
    wasm_host::entered();
    action(|vm| vm.on_response_headers(&WasmHost, context_id, eos != 0))
}

#[no_mangle]
pub extern "C" fn proxy_on_response_body(context_id: u32, body_size: usize, eos: u32) -> u32 {
    wasm_host::entered();
    action(|vm| vm.on_response_body(&WasmHost, context_id, body_size, eos != 0))
}

#[no_mangle]
pub extern "C" fn proxy_on_response_trailers(context_id: u32, _trailers: usize) -> u32 {
    wasm_host::entered();
    action(|vm| vm.on_response_trailers(&WasmHost, context_id))
}

// No `proxy_on_done` and no `proxy_on_log`: a callback the VM does not export is one
// Envoy does not make (a VM entry per request saved each). Without `proxy_on_done` Envoy
// takes a context as done at once and deletes it, which is all weir would answer (it
// finishes its work in `proxy_on_delete`); weir has nothing to do when Envoy logs.

#[no_mangle]
pub extern "C" fn proxy_on_delete(context_id: u32) {
    wasm_host::entered();
    with_vm(|vm| vm.on_delete(&WasmHost, context_id));
}

#[no_mangle]
pub extern "C" fn proxy_on_http_call_response(
    root_id: u32,
    token: u32,
    _headers: u32,
    body_size: usize,
    _trailers: u32,
) {
    wasm_host::entered();
    with_vm(|vm| vm.on_http_call_response(&WasmHost, root_id, token, body_size));
}
