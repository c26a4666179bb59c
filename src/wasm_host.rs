//! The only module that talks to the host: the proxy-wasm ABI calls weir makes (ABI
//! 0.2.1), declared here rather than taken from an SDK, whose helpers `panic!` on
//! statuses they do not expect — and a panic traps the VM for every request on the
//! worker. [`WasmHost`] is the core's [`Host`] over them: one ABI call per method, every
//! status a [`HostError`]. The callbacks the other way are in [`crate::abi`].
//!
//! Memory the host returns was allocated through our `proxy_on_memory_allocate` (a
//! boxed slice of exactly the requested size), so it is taken back with
//! `Vec::from_raw_parts(ptr, len, len)`.

use std::cell::Cell;
use std::ptr::null_mut;

use weir_core::filter::host::{
    store_error, BoundaryCounts, CallKind, Host, HostError, HostResult, LogLevel, MetricType,
    NOT_FOUND,
};
use weir_core::store::{SharedStore, StoreError};
use weir_core::time::Micros;

const MAP_REQUEST_HEADERS: u32 = 0;
const MAP_RESPONSE_HEADERS: u32 = 2;
const MAP_HTTP_CALL_RESPONSE_HEADERS: u32 = 6;
const BUFFER_HTTP_REQUEST_BODY: u32 = 0;
const BUFFER_HTTP_RESPONSE_BODY: u32 = 1;
const BUFFER_HTTP_CALL_RESPONSE_BODY: u32 = 4;
const BUFFER_PLUGIN_CONFIGURATION: u32 = 7;
const STREAM_HTTP_REQUEST: u32 = 0;

#[link(wasm_import_module = "env")]
extern "C" {
    fn proxy_log(level: u32, message_data: *const u8, message_size: usize) -> u32;
    fn proxy_get_log_level(return_level: *mut u32) -> u32;
    fn proxy_get_current_time_nanoseconds(return_time: *mut u64) -> u32;
    fn proxy_set_tick_period_milliseconds(period: u32) -> u32;
    fn proxy_get_buffer_bytes(
        buffer_type: u32,
        start: usize,
        max_size: usize,
        return_buffer_data: *mut *mut u8,
        return_buffer_size: *mut usize,
    ) -> u32;
    fn proxy_get_header_map_value(
        map_type: u32,
        key_data: *const u8,
        key_size: usize,
        return_value_data: *mut *mut u8,
        return_value_size: *mut usize,
    ) -> u32;
    fn proxy_add_header_map_value(
        map_type: u32,
        key_data: *const u8,
        key_size: usize,
        value_data: *const u8,
        value_size: usize,
    ) -> u32;
    fn proxy_replace_header_map_value(
        map_type: u32,
        key_data: *const u8,
        key_size: usize,
        value_data: *const u8,
        value_size: usize,
    ) -> u32;
    fn proxy_remove_header_map_value(map_type: u32, key_data: *const u8, key_size: usize) -> u32;
    fn proxy_set_buffer_bytes(
        buffer_type: u32,
        start: usize,
        size: usize,
        buffer_data: *const u8,
        buffer_size: usize,
    ) -> u32;
    fn proxy_get_property(
        path_data: *const u8,
        path_size: usize,
        return_value_data: *mut *mut u8,
        return_value_size: *mut usize,
    ) -> u32;
    fn proxy_get_shared_data(
        key_data: *const u8,
        key_size: usize,
        return_value_data: *mut *mut u8,
        return_value_size: *mut usize,
        return_cas: *mut u32,
    ) -> u32;
    fn proxy_set_shared_data(
        key_data: *const u8,
        key_size: usize,
        value_data: *const u8,
        value_size: usize,
        cas: u32,
    ) -> u32;
    fn proxy_send_local_response(
        status_code: u32,
        status_code_details_data: *const u8,
        status_code_details_size: usize,
        body_data: *const u8,
        body_size: usize,
        headers_data: *const u8,
        headers_size: usize,
        grpc_status: i32,
    ) -> u32;
    fn proxy_continue_stream(stream_type: u32) -> u32;
    fn proxy_http_call(
        upstream_data: *const u8,
        upstream_size: usize,
        headers_data: *const u8,
        headers_size: usize,
        body_data: *const u8,
        body_size: usize,
        trailers_data: *const u8,
        trailers_size: usize,
        timeout_ms: u32,
        return_token: *mut u32,
    ) -> u32;
    fn proxy_set_effective_context(context_id: u32) -> u32;
    fn proxy_set_property(
        path_data: *const u8,
        path_size: usize,
        value_data: *const u8,
        value_size: usize,
    ) -> u32;
    fn proxy_define_metric(
        metric_type: u32,
        name_data: *const u8,
        name_size: usize,
        return_id: *mut u32,
    ) -> u32;
    fn proxy_increment_metric(metric_id: u32, offset: i64) -> u32;
    fn proxy_record_metric(metric_id: u32, value: u64) -> u32;
}

fn ok(status: u32) -> HostResult<()> {
    if status == 0 {
        Ok(())
    } else {
        Err(HostError(status))
    }
}

/// Takes ownership of bytes the host allocated for us.
///
/// # Safety
/// `data` must be null or a pointer the host obtained from `proxy_on_memory_allocate`
/// for exactly `size` bytes.
unsafe fn take_bytes(data: *mut u8, size: usize) -> Vec<u8> {
    if data.is_null() {
        Vec::new()
    } else {
        COUNTS.with(|c| {
            let mut counts = c.get();
            counts.bytes_in = counts.bytes_in.wrapping_add(size as u64);
            c.set(counts);
        });
        Vec::from_raw_parts(data, size, size)
    }
}

/// Value or `None` for `NotFound`.
fn found(status: u32, data: *mut u8, size: usize) -> HostResult<Option<Vec<u8>>> {
    match status {
        0 => Ok(Some(unsafe { take_bytes(data, size) })),
        NOT_FOUND => Ok(None),
        other => Err(HostError(other)),
    }
}

pub fn log(level: LogLevel, message: &str) {
    count(CallKind::Log, message.len());
    // Nothing sensible to do if logging itself fails.
    let _ = unsafe { proxy_log(level as u32, message.as_ptr(), message.len()) };
}

/// Whether the host would print messages at `level` (so callers can skip formatting).
/// Whether Envoy logs `level` for this plugin, as of the last [`refresh_log_level`]: a
/// denied request logs at debug, and asking the host every time would cost it a call.
fn log_enabled(level: LogLevel) -> bool {
    LOG_LEVEL.with(Cell::get) <= level as u32
}

/// Reads Envoy's log level for this plugin (at configure time and on every tick, so a
/// change through Envoy's admin `/logging` applies within a tick).
fn refresh_log_level() {
    count(CallKind::Log, 0);
    let mut current = 0u32;
    let level = match unsafe { proxy_get_log_level(&mut current) } {
        0 => current,
        // Unknown: log everything rather than hide an error.
        _ => 0,
    };
    LOG_LEVEL.with(|l| l.set(level));
}

thread_local! {
    /// Envoy's log level for this plugin (0 trace … 6 off); trace until first read.
    static LOG_LEVEL: Cell<u32> = const { Cell::new(0) };
    /// What crossed this VM's boundary since it started (the `vm.*` stats, see
    /// `weir_core::filter::metrics`).
    static COUNTS: Cell<BoundaryCounts> = Cell::new(BoundaryCounts::default());
}

/// Counts one call into the host, of `kind`, handing it `out` bytes (what it copies back
/// is counted where it is taken, [`take_bytes`]).
fn count(kind: CallKind, out: usize) {
    COUNTS.with(|c| {
        let mut counts = c.get();
        counts.call(kind, out);
        c.set(counts);
    });
}

/// Counts one callback Envoy made into the VM: every export of [`crate::abi`] calls it.
pub fn entered() {
    COUNTS.with(|c| {
        let mut counts = c.get();
        counts.entries = counts.entries.wrapping_add(1);
        c.set(counts);
    });
}

/// The host's clock, read in ns and kept in µs.
fn now() -> HostResult<Micros> {
    count(CallKind::Clock, 0);
    let mut ns = 0u64;
    ok(unsafe { proxy_get_current_time_nanoseconds(&mut ns) })?;
    Ok(Micros::from_clock_nanos(ns))
}

fn set_tick_period_ms(period: u32) -> HostResult<()> {
    count(CallKind::Tick, 0);
    ok(unsafe { proxy_set_tick_period_milliseconds(period) })
}

fn buffer(buffer_type: u32, max_size: usize) -> HostResult<Option<Vec<u8>>> {
    count(CallKind::Body, 0);
    let mut data = null_mut();
    let mut size = 0;
    let status = unsafe { proxy_get_buffer_bytes(buffer_type, 0, max_size, &mut data, &mut size) };
    found(status, data, size)
}

fn plugin_configuration(max_size: usize) -> HostResult<Option<Vec<u8>>> {
    buffer(BUFFER_PLUGIN_CONFIGURATION, max_size)
}

/// The request body Envoy buffered for this filter, up to `max_size` bytes.
fn request_body(max_size: usize) -> HostResult<Option<Vec<u8>>> {
    buffer(BUFFER_HTTP_REQUEST_BODY, max_size)
}

/// The piece of the response body this callback was given (`size` bytes).
fn response_body(size: usize) -> HostResult<Option<Vec<u8>>> {
    buffer(BUFFER_HTTP_RESPONSE_BODY, size)
}

fn http_call_response_body(max_size: usize) -> HostResult<Option<Vec<u8>>> {
    buffer(BUFFER_HTTP_CALL_RESPONSE_BODY, max_size)
}

fn map_value(map_type: u32, name: &str) -> HostResult<Option<Vec<u8>>> {
    count(CallKind::Header, name.len());
    let mut data = null_mut();
    let mut size = 0;
    let status = unsafe {
        proxy_get_header_map_value(map_type, name.as_ptr(), name.len(), &mut data, &mut size)
    };
    found(status, data, size)
}

fn request_header(name: &str) -> HostResult<Option<Vec<u8>>> {
    map_value(MAP_REQUEST_HEADERS, name)
}

fn response_header(name: &str) -> HostResult<Option<Vec<u8>>> {
    map_value(MAP_RESPONSE_HEADERS, name)
}

fn http_call_response_header(name: &str) -> HostResult<Option<Vec<u8>>> {
    map_value(MAP_HTTP_CALL_RESPONSE_HEADERS, name)
}

fn add_response_header(name: &str, value: &str) -> HostResult<()> {
    count(CallKind::Header, name.len() + value.len());
    ok(unsafe {
        proxy_add_header_map_value(
            MAP_RESPONSE_HEADERS,
            name.as_ptr(),
            name.len(),
            value.as_ptr(),
            value.len(),
        )
    })
}

/// Sets a request header, replacing any value it had.
fn replace_request_header(name: &str, value: &str) -> HostResult<()> {
    count(CallKind::Header, name.len() + value.len());
    ok(unsafe {
        proxy_replace_header_map_value(
            MAP_REQUEST_HEADERS,
            name.as_ptr(),
            name.len(),
            value.as_ptr(),
            value.len(),
        )
    })
}

fn remove_request_header(name: &str) -> HostResult<()> {
    count(CallKind::Header, name.len());
    ok(unsafe { proxy_remove_header_map_value(MAP_REQUEST_HEADERS, name.as_ptr(), name.len()) })
}

/// Replaces bytes `0..size` of the buffered request body with `body`.
fn replace_request_body(size: usize, body: &[u8]) -> HostResult<()> {
    count(CallKind::Body, body.len());
    ok(unsafe {
        proxy_set_buffer_bytes(BUFFER_HTTP_REQUEST_BODY, 0, size, body.as_ptr(), body.len())
    })
}

/// An Envoy attribute by path, e.g. `["source", "address"]`.
fn property(path: &[String]) -> HostResult<Option<Vec<u8>>> {
    let mut serialized = Vec::with_capacity(path.iter().map(|p| p.len() + 1).sum());
    for (i, part) in path.iter().enumerate() {
        if i > 0 {
            serialized.push(0);
        }
        serialized.extend_from_slice(part.as_bytes());
    }
    count(CallKind::Property, serialized.len());
    let mut data = null_mut();
    let mut size = 0;
    let status =
        unsafe { proxy_get_property(serialized.as_ptr(), serialized.len(), &mut data, &mut size) };
    found(status, data, size)
}

/// The value and version of a shared-data key (`(None, None)` when it does not exist).
fn shared_get(key: &str) -> HostResult<(Option<Vec<u8>>, Option<u32>)> {
    count(CallKind::SharedGet, key.len());
    let mut data = null_mut();
    let mut size = 0;
    let mut cas = 0u32;
    let status =
        unsafe { proxy_get_shared_data(key.as_ptr(), key.len(), &mut data, &mut size, &mut cas) };
    match status {
        0 => {
            let value = (!data.is_null()).then(|| unsafe { take_bytes(data, size) });
            Ok((value, (cas != 0).then_some(cas)))
        }
        NOT_FOUND => Ok((None, None)),
        other => Err(HostError(other)),
    }
}

fn shared_set(key: &str, value: &[u8], cas: Option<u32>) -> HostResult<()> {
    count(CallKind::SharedSet, key.len() + value.len());
    ok(unsafe {
        proxy_set_shared_data(
            key.as_ptr(),
            key.len(),
            value.as_ptr(),
            value.len(),
            cas.unwrap_or(0),
        )
    })
}

/// proxy-wasm's header map wire format: count, (name len, value len)*, then each name
/// and value NUL-terminated.
fn serialize_headers<V: AsRef<[u8]>>(headers: &[(&str, V)]) -> Vec<u8> {
    let size = 4 + headers
        .iter()
        .map(|(n, v)| 10 + n.len() + v.as_ref().len())
        .sum::<usize>();
    let mut out = Vec::with_capacity(size);
    out.extend_from_slice(&(headers.len() as u32).to_le_bytes());
    for (name, value) in headers {
        out.extend_from_slice(&(name.len() as u32).to_le_bytes());
        out.extend_from_slice(&(value.as_ref().len() as u32).to_le_bytes());
    }
    for (name, value) in headers {
        out.extend_from_slice(name.as_bytes());
        out.push(0);
        out.extend_from_slice(value.as_ref());
        out.push(0);
    }
    out
}

/// Answers the request locally. `grpc_status` ≥ 0 makes Envoy send a gRPC
/// trailers-only response with that status (HTTP 200) and `body` as `grpc-message`.
fn send_local_response<V: AsRef<[u8]>>(
    status: u32,
    headers: &[(&str, V)],
    body: &[u8],
    grpc_status: i32,
) -> HostResult<()> {
    let details = b"weir_rate_limited";
    let headers = serialize_headers(headers);
    count(CallKind::Stream, details.len() + body.len() + headers.len());
    ok(unsafe {
        proxy_send_local_response(
            status,
            details.as_ptr(),
            details.len(),
            body.as_ptr(),
            body.len(),
            headers.as_ptr(),
            headers.len(),
            grpc_status,
        )
    })
}

/// Starts an HTTP call to Envoy cluster `upstream`; returns its token. The answer (or a
/// 503/504 made up by Envoy) arrives in `proxy_on_http_call_response` with this token.
/// Envoy makes the call on the plugin's root context, so it outlives the request that
/// started it; the core routes the answer by token (`weir_core::filter::Vm`).
fn http_call(
    upstream: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    timeout_ms: u64,
) -> HostResult<u32> {
    let headers = serialize_headers(headers);
    let trailers = serialize_headers::<&str>(&[]);
    count(
        CallKind::Dispatch,
        upstream.len() + headers.len() + body.len() + trailers.len(),
    );
    let timeout = u32::try_from(timeout_ms).unwrap_or(u32::MAX);
    let mut token = 0u32;
    ok(unsafe {
        proxy_http_call(
            upstream.as_ptr(),
            upstream.len(),
            headers.as_ptr(),
            headers.len(),
            body.as_ptr(),
            body.len(),
            trailers.as_ptr(),
            trailers.len(),
            timeout,
            &mut token,
        )
    })?;
    Ok(token)
}

/// Makes `context_id` the context later host calls act on (resuming or answering a
/// request other than the one whose callback is running).
fn set_effective_context(context_id: u32) -> HostResult<()> {
    count(CallKind::Stream, 0);
    ok(unsafe { proxy_set_effective_context(context_id) })
}

/// Sets a property of the current request: Envoy keeps it as filter state under
/// `wasm.<name>`, which access logs (`%FILTER_STATE(wasm.<name>:PLAIN)%`) and later
/// filters can read.
fn set_property(name: &str, value: &[u8]) -> HostResult<()> {
    count(CallKind::Property, name.len() + value.len());
    ok(unsafe { proxy_set_property(name.as_ptr(), name.len(), value.as_ptr(), value.len()) })
}

fn resume_http_request() -> HostResult<()> {
    count(CallKind::Stream, 0);
    ok(unsafe { proxy_continue_stream(STREAM_HTTP_REQUEST) })
}

fn define_metric(metric_type: MetricType, name: &str) -> HostResult<u32> {
    count(CallKind::Stats, name.len());
    let mut id = 0u32;
    ok(unsafe { proxy_define_metric(metric_type as u32, name.as_ptr(), name.len(), &mut id) })?;
    Ok(id)
}

fn increment_metric(id: u32, offset: i64) -> HostResult<()> {
    count(CallKind::Stats, 0);
    ok(unsafe { proxy_increment_metric(id, offset) })
}

fn record_metric(id: u32, value: u64) -> HostResult<()> {
    count(CallKind::Stats, 0);
    ok(unsafe { proxy_record_metric(id, value) })
}

/// The core's host seam over the ABI: what `weir_core::filter` asks, one ABI call each.
pub struct WasmHost;

impl SharedStore for WasmHost {
    fn get(&self, key: &str) -> Result<(Option<Vec<u8>>, Option<u32>), StoreError> {
        shared_get(key).map_err(store_error)
    }

    fn compare_and_set(&self, key: &str, value: &[u8], version: u32) -> Result<(), StoreError> {
        // A version of 0 would be an unconditional write: never pass one (a `get` never
        // returns it).
        if version == 0 {
            return Err(StoreError::CasMismatch);
        }
        shared_set(key, value, Some(version)).map_err(store_error)
    }

    fn create(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        shared_set(key, value, None).map_err(store_error)
    }
}

impl Host for WasmHost {
    fn now(&self) -> HostResult<Micros> {
        now()
    }

    fn log(&self, level: LogLevel, message: &str) {
        log(level, message);
    }

    fn log_enabled(&self, level: LogLevel) -> bool {
        log_enabled(level)
    }

    fn refresh_log_level(&self) {
        refresh_log_level();
    }

    fn counts(&self) -> BoundaryCounts {
        COUNTS.with(Cell::get)
    }

    fn set_tick_period_ms(&self, period_ms: u32) -> HostResult<()> {
        set_tick_period_ms(period_ms)
    }

    fn plugin_configuration(&self, max_size: usize) -> HostResult<Option<Vec<u8>>> {
        plugin_configuration(max_size)
    }

    /// WASI's environment: Envoy's `vm_config.environment_variables`.
    fn environment_variable(&self, name: &str) -> Option<String> {
        std::env::var(name).ok()
    }

    /// WASI's `random_get`, which Envoy serves from the OS.
    fn entropy(&self) -> Result<[u8; 16], String> {
        let mut seed = [0u8; 16];
        getrandom::fill(&mut seed).map_err(|e| e.to_string())?;
        Ok(seed)
    }

    fn define_metric(&self, metric_type: MetricType, name: &str) -> HostResult<u32> {
        define_metric(metric_type, name)
    }

    fn increment_metric(&self, id: u32, offset: i64) -> HostResult<()> {
        increment_metric(id, offset)
    }

    fn record_metric(&self, id: u32, value: u64) -> HostResult<()> {
        record_metric(id, value)
    }

    fn set_effective_context(&self, context_id: u32) -> HostResult<()> {
        set_effective_context(context_id)
    }

    fn property(&self, path: &[String]) -> HostResult<Option<Vec<u8>>> {
        property(path)
    }

    fn set_property(&self, name: &str, value: &[u8]) -> HostResult<()> {
        set_property(name, value)
    }

    fn request_header(&self, name: &str) -> HostResult<Option<Vec<u8>>> {
        request_header(name)
    }

    fn replace_request_header(&self, name: &str, value: &str) -> HostResult<()> {
        replace_request_header(name, value)
    }

    fn remove_request_header(&self, name: &str) -> HostResult<()> {
        remove_request_header(name)
    }

    fn request_body(&self, max_size: usize) -> HostResult<Option<Vec<u8>>> {
        request_body(max_size)
    }

    fn replace_request_body(&self, size: usize, body: &[u8]) -> HostResult<()> {
        replace_request_body(size, body)
    }

    fn response_header(&self, name: &str) -> HostResult<Option<Vec<u8>>> {
        response_header(name)
    }

    fn add_response_header(&self, name: &str, value: &str) -> HostResult<()> {
        add_response_header(name, value)
    }

    fn response_body(&self, size: usize) -> HostResult<Option<Vec<u8>>> {
        response_body(size)
    }

    fn send_local_response(
        &self,
        status: u32,
        headers: &[(&str, &str)],
        body: &[u8],
        grpc_status: i32,
    ) -> HostResult<()> {
        send_local_response(status, headers, body, grpc_status)
    }

    fn resume_request(&self) -> HostResult<()> {
        resume_http_request()
    }

    fn dispatch_call(
        &self,
        cluster: &str,
        headers: &[(&str, &str)],
        body: &[u8],
        timeout_ms: u64,
    ) -> HostResult<u32> {
        http_call(cluster, headers, body, timeout_ms)
    }

    fn call_response_header(&self, name: &str) -> HostResult<Option<Vec<u8>>> {
        http_call_response_header(name)
    }

    fn call_response_body(&self, max_size: usize) -> HostResult<Option<Vec<u8>>> {
        http_call_response_body(max_size)
    }
}
