//! The ABI weir exports to Envoy: every callback Envoy makes into an HTTP filter's VM is
//! exported by the built `weir.wasm`, none that Envoy would call for something weir does
//! not do (network filters, gRPC calls, queues), and each export in `src/abi.rs` is a
//! translation into the core's `Vm` — the lifecycle itself is tested in
//! `core/tests/lifecycle.rs`, natively, against a scripted host.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::collections::BTreeSet;
use weir_e2e::prereq::{repo_root, weir_wasm};

/// The callbacks of proxy-wasm ABI 0.2.1 that Envoy makes into an HTTP filter, and the
/// core method each becomes (`None`: answered in `src/abi.rs` itself).
const HTTP_FILTER_CALLBACKS: &[(&str, Option<&str>)] = &[
    ("_initialize", None),
    ("proxy_abi_version_0_2_1", None),
    ("proxy_on_memory_allocate", None),
    ("proxy_on_vm_start", None),
    ("proxy_on_context_create", Some("on_context_create")),
    ("proxy_on_configure", Some("on_configure")),
    ("proxy_on_tick", Some("on_tick")),
    ("proxy_on_request_headers", Some("on_request_headers")),
    ("proxy_on_request_body", Some("on_request_body")),
    ("proxy_on_request_trailers", Some("on_request_trailers")),
    ("proxy_on_response_headers", Some("on_response_headers")),
    ("proxy_on_response_body", Some("on_response_body")),
    ("proxy_on_response_trailers", Some("on_response_trailers")),
    ("proxy_on_http_call_response", Some("on_http_call_response")),
    ("proxy_on_delete", Some("on_delete")),
];

/// Callbacks of the ABI for what weir does not do: exported, Envoy would call them
/// (`proxy_on_log` and `proxy_on_done`: once per request each, for nothing weir needs;
/// without `proxy_on_done` a context is done at once, and weir finishes in
/// `proxy_on_delete`).
const NOT_EXPORTED: &[&str] = &[
    "proxy_on_log",
    "proxy_on_done",
    "proxy_on_new_connection",
    "proxy_on_downstream_data",
    "proxy_on_downstream_connection_close",
    "proxy_on_upstream_data",
    "proxy_on_upstream_connection_close",
    "proxy_on_grpc_receive_initial_metadata",
    "proxy_on_grpc_receive",
    "proxy_on_grpc_receive_trailing_metadata",
    "proxy_on_grpc_close",
    "proxy_on_queue_ready",
    "proxy_on_foreign_function",
    "proxy_on_request_metadata",
    "proxy_on_response_metadata",
];

#[test]
fn weir_wasm_exports_every_http_filter_callback_and_nothing_else_envoy_calls() {
    let module = std::fs::read(weir_wasm()).unwrap();
    let exported = weir_e2e::wasm::exported_functions(&module);
    for (callback, _) in HTTP_FILTER_CALLBACKS {
        assert!(
            exported.contains(*callback),
            "weir.wasm does not export {callback}"
        );
    }
    for callback in NOT_EXPORTED {
        assert!(
            !exported.contains(*callback),
            "weir.wasm exports {callback}"
        );
    }
    let known: BTreeSet<&str> = HTTP_FILTER_CALLBACKS.iter().map(|(c, _)| *c).collect();
    let unknown: Vec<&String> = exported
        .iter()
        .filter(|name| name.starts_with("proxy_") && !known.contains(name.as_str()))
        .collect();
    assert!(unknown.is_empty(), "exports no test covers: {unknown:?}");
}

/// The largest function body weir.wasm may have. Envoy's V8 compiles every function of
/// the module with its optimizing compiler at each start and each new VM, in time that
/// grows faster than a function's size: a 65 KB config deserializer took 294 ms of the
/// module's 921 (measured 2026-11-29; core/src/config/raw.rs, `object_only!`, says how
/// that was cut to 18 KB for the largest). Bodies are about 18 KB at most today.
const MAX_FUNCTION_BODY: usize = 24 * 1024;

#[test]
fn no_function_of_weir_wasm_is_large_enough_to_slow_envoys_start() {
    let module = std::fs::read(weir_wasm()).unwrap();
    let sizes = weir_e2e::wasm::function_body_sizes(&module);
    assert!(
        sizes.len() > 100,
        "{} functions: not weir.wasm's code",
        sizes.len()
    );
    let largest: Vec<(usize, usize)> = sizes
        .iter()
        .copied()
        .enumerate()
        .filter(|(_, size)| *size > MAX_FUNCTION_BODY)
        .collect();
    assert!(
        largest.is_empty(),
        "functions (index in the code section, bytes) over {MAX_FUNCTION_BODY} bytes: \
         {largest:?}; split them (`#[inline(never)]` on what is inlined into them)"
    );
}

/// The first `{ … }` of `source`, braces matched.
fn braced(source: &str) -> &str {
    let start = source.find('{').unwrap();
    let mut depth = 0;
    for (i, c) in source[start..].char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return &source[start..=start + i];
                }
            }
            _ => {}
        }
    }
    panic!("unbalanced braces")
}

#[test]
fn every_export_is_a_translation_into_the_core() {
    let source = std::fs::read_to_string(repo_root().join("src/abi.rs")).unwrap();
    for (callback, method) in HTTP_FILTER_CALLBACKS {
        if callback.starts_with('_') {
            continue;
        }
        let at = source
            .find(&format!("pub extern \"C\" fn {callback}("))
            .unwrap_or_else(|| panic!("src/abi.rs does not define {callback}"));
        let body = braced(&source[at..]);
        if *callback != "proxy_abi_version_0_2_1" {
            assert!(
                body.contains("host::entered();"),
                "{callback} does not count itself in vm.entries: {body}"
            );
        }
        match method {
            Some(method) => {
                assert!(
                    body.contains(&format!("vm.{method}(")),
                    "{callback} does not call Vm::{method}: {body}"
                );
                assert!(
                    body.lines().count() <= 5,
                    "{callback} does more than translate: {body}"
                );
            }
            None => assert!(
                !body.contains("vm."),
                "{callback} is answered in src/abi.rs: {body}"
            ),
        }
    }
}
