//! What a wasm module exports, read from its export section: the callbacks Envoy will
//! make into a proxy-wasm filter built from it.

use std::collections::BTreeSet;

/// The callbacks Envoy makes into an HTTP filter's VM for every request (a GET without
/// a body, answered with one): each one the module exports is one VM entry.
pub const PER_REQUEST_CALLBACKS: [&str; 7] = [
    "proxy_on_context_create",
    "proxy_on_request_headers",
    "proxy_on_response_headers",
    "proxy_on_response_body",
    "proxy_on_done",
    "proxy_on_log",
    "proxy_on_delete",
];

/// VM entries per request of a filter whose module exports `exports` and that hands
/// nothing into the VM (no host call returning a value): the per-request callbacks it
/// exports.
pub fn callback_entries(exports: &BTreeSet<String>) -> u64 {
    PER_REQUEST_CALLBACKS
        .iter()
        .filter(|name| exports.contains(**name))
        .count() as u64
}

/// A LEB128 unsigned integer at `at`, and where the next field starts.
fn leb128(bytes: &[u8], mut at: usize) -> (u64, usize) {
    let (mut value, mut shift) = (0u64, 0);
    loop {
        let byte = bytes[at];
        at += 1;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return (value, at);
        }
        shift += 7;
    }
}

/// Each section of a wasm module: its id and its contents.
fn sections(module: &[u8]) -> Vec<(u8, &[u8])> {
    assert_eq!(&module[..8], b"\0asm\x01\0\0\0", "not a wasm module");
    let mut at = 8;
    let mut found = Vec::new();
    while at < module.len() {
        let (size, start) = leb128(module, at + 1);
        let end = start + size as usize;
        found.push((module[at], &module[start..end]));
        at = end;
    }
    found
}

/// The size in bytes of each function body a wasm module defines (its code section), in
/// the order of the section.
pub fn function_body_sizes(module: &[u8]) -> Vec<usize> {
    let mut sizes = Vec::new();
    for (_, code) in sections(module).into_iter().filter(|(id, _)| *id == 10) {
        let (count, mut p) = leb128(code, 0);
        for _ in 0..count {
            let (size, body) = leb128(code, p);
            sizes.push(size as usize);
            p = body + size as usize;
        }
    }
    sizes
}

/// The names of the functions a wasm module exports (section 7, kind 0).
pub fn exported_functions(module: &[u8]) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for (_, exports) in sections(module).into_iter().filter(|(id, _)| *id == 7) {
        let (count, mut p) = leb128(exports, 0);
        for _ in 0..count {
            let (len, name_at) = leb128(exports, p);
            let name_end = name_at + len as usize;
            let name = String::from_utf8(exports[name_at..name_end].to_vec()).unwrap();
            let kind = exports[name_end];
            let (_, next) = leb128(exports, name_end + 1);
            if kind == 0 {
                names.insert(name);
            }
            p = next;
        }
    }
    names
}
