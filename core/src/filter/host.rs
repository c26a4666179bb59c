//! The host seam: what a request's lifecycle needs from the proxy, as a trait.
//!
//! The lifecycle ([`super`]) asks the host for the clock, shared data, request and
//! response facts, a bridge call, to resume or answer a request, to set headers and
//! properties, to define and bump stats, and for the tick. In Envoy the host is the
//! proxy-wasm ABI (the filter crate implements this trait over its imports, one call
//! each); in tests it is a scripted host that plays Envoy's part, so the whole lifecycle
//! runs natively, with no Envoy.
//!
//! The methods mirror the ABI closely, including its one piece of hidden state: the
//! *effective context*. Envoy runs every callback in the context it is for, and calls on
//! the current request (headers, bodies, properties, `resume_request`,
//! `send_local_response`) act on that context; [`Host::set_effective_context`] switches
//! to another request — to resume or answer it from the tick or from a bridge call's
//! answer, which arrive on the plugin's root context.

use crate::store::SharedStore;
use crate::time::Micros;
use std::fmt;

/// A status other than `Ok` from the host (proxy-wasm's `proxy_status_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostError(pub u32);

/// `NotFound`: no such header, property, buffer or shared-data key.
pub const NOT_FOUND: u32 = 1;
/// `CasMismatch`: a shared-data write lost a race.
pub const CAS_MISMATCH: u32 = 8;

impl fmt::Display for HostError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self.0 {
            1 => "NotFound",
            2 => "BadArgument",
            3 => "SerializationFailure",
            4 => "ParseFailure",
            5 => "BadExpression",
            6 => "InvalidMemoryAccess",
            7 => "Empty",
            8 => "CasMismatch",
            9 => "ResultMismatch",
            10 => "InternalFailure",
            11 => "BrokenConnection",
            12 => "Unimplemented",
            _ => "Unknown",
        };
        write!(f, "{name} ({})", self.0)
    }
}

pub type HostResult<T> = Result<T, HostError>;

/// proxy-wasm's log levels (trace is 0, off is 6); Envoy's default is info.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u32)]
pub enum LogLevel {
    Debug = 1,
    #[default]
    Info = 2,
    Warn = 3,
    Error = 4,
    Critical = 5,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum MetricType {
    Counter = 0,
    Gauge = 1,
    Histogram = 2,
}

/// The kinds of host call a VM counts (`vm.calls.<kind>`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallKind {
    /// The clock.
    Clock,
    /// A request, response or call-answer header read, added or replaced.
    Header,
    /// A body or configuration buffer read, or a body written.
    Body,
    /// A shared-data read.
    SharedGet,
    /// A shared-data write (compare-and-swap or create).
    SharedSet,
    /// An attribute read or a property set (filter state).
    Property,
    /// An HTTP call started.
    Dispatch,
    /// A request resumed or answered, or the effective context switched.
    Stream,
    /// A stat defined, incremented or recorded.
    Stats,
    /// A log line, or the log level read.
    Log,
    /// The tick period set.
    Tick,
}

impl CallKind {
    pub const ALL: [CallKind; 11] = [
        CallKind::Clock,
        CallKind::Header,
        CallKind::Body,
        CallKind::SharedGet,
        CallKind::SharedSet,
        CallKind::Property,
        CallKind::Dispatch,
        CallKind::Stream,
        CallKind::Stats,
        CallKind::Log,
        CallKind::Tick,
    ];

    /// Its position in [`BoundaryCounts::calls`].
    pub const fn index(self) -> usize {
        self as usize
    }

    /// The last segment of its stat, `vm.calls.<name>`.
    pub const fn stat_name(self) -> &'static str {
        match self {
            CallKind::Clock => "clock",
            CallKind::Header => "header",
            CallKind::Body => "body",
            CallKind::SharedGet => "shared_get",
            CallKind::SharedSet => "shared_set",
            CallKind::Property => "property",
            CallKind::Dispatch => "dispatch",
            CallKind::Stream => "stream",
            CallKind::Stats => "stats",
            CallKind::Log => "log",
            CallKind::Tick => "tick",
        }
    }
}

/// What crossed a VM's boundary with the host: machine-independent figures of what a
/// request costs (the benchmark divides them by requests).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BoundaryCounts {
    /// Callbacks the host made into the VM (every export, memory allocation included).
    pub entries: u64,
    /// Calls the VM made into the host, by [`CallKind::index`].
    pub calls: [u64; CallKind::ALL.len()],
    /// Bytes the host copied into the VM (values, bodies, answers).
    pub bytes_in: u64,
    /// Bytes the VM handed the host (keys, names, values, bodies).
    pub bytes_out: u64,
}

impl BoundaryCounts {
    /// Every call out, whatever its kind.
    pub fn total_calls(&self) -> u64 {
        self.calls.iter().sum()
    }

    /// Counts one call of `kind` that handed the host `out` bytes (what comes back is
    /// counted where it is taken).
    pub fn call(&mut self, kind: CallKind, out: usize) {
        if let Some(n) = self.calls.get_mut(kind.index()) {
            *n = n.wrapping_add(1);
        }
        self.bytes_out = self.bytes_out.wrapping_add(out as u64);
    }
}

/// What the lifecycle asks of the proxy. Shared data is the [`SharedStore`] it extends.
///
/// Every method returns what the host said; none may panic (in Envoy a panic traps the
/// VM for every request of the worker). The lifecycle decides what an error means —
/// usually: log, count, fail open.
pub trait Host: SharedStore {
    // The VM.

    /// The host's clock: µs since the Unix epoch.
    fn now(&self) -> HostResult<Micros>;
    fn log(&self, level: LogLevel, message: &str);
    /// Whether Envoy logs `level` for this plugin, as of the last
    /// [`Host::refresh_log_level`] (asking every time would cost a host call).
    fn log_enabled(&self, level: LogLevel) -> bool;
    /// Reads the plugin's log level again (configure time and every tick).
    fn refresh_log_level(&self);
    /// What crossed this VM's boundary with the host since it started: callbacks in,
    /// calls out by kind, bytes each way (the `vm.*` stats).
    fn counts(&self) -> BoundaryCounts;
    fn set_tick_period_ms(&self, period_ms: u32) -> HostResult<()>;
    /// The plugin configuration, up to `max_size` bytes.
    fn plugin_configuration(&self, max_size: usize) -> HostResult<Option<Vec<u8>>>;
    /// A variable of the VM's environment (Envoy's `vm_config.environment_variables`).
    fn environment_variable(&self, name: &str) -> Option<String>;
    /// 16 random bytes: a fresh hashing seed.
    fn entropy(&self) -> Result<[u8; 16], String>;
    fn define_metric(&self, metric_type: MetricType, name: &str) -> HostResult<u32>;
    fn increment_metric(&self, id: u32, offset: i64) -> HostResult<()>;
    fn record_metric(&self, id: u32, value: u64) -> HostResult<()>;

    // The effective context, and the request it is.

    /// Makes `context_id` the context later calls act on.
    fn set_effective_context(&self, context_id: u32) -> HostResult<()>;
    /// An Envoy attribute by path, e.g. `["source", "address"]`.
    fn property(&self, path: &[String]) -> HostResult<Option<Vec<u8>>>;
    /// Sets a property of the request: Envoy keeps it as filter state `wasm.<name>`.
    fn set_property(&self, name: &str, value: &[u8]) -> HostResult<()>;
    fn request_header(&self, name: &str) -> HostResult<Option<Vec<u8>>>;
    /// Sets a request header, replacing any value it had.
    fn replace_request_header(&self, name: &str, value: &str) -> HostResult<()>;
    /// Removes a request header (every value of it).
    fn remove_request_header(&self, name: &str) -> HostResult<()>;
    /// The request body Envoy buffered for this filter, up to `max_size` bytes.
    fn request_body(&self, max_size: usize) -> HostResult<Option<Vec<u8>>>;
    /// Replaces the first `size` bytes of the buffered request body with `body`.
    fn replace_request_body(&self, size: usize, body: &[u8]) -> HostResult<()>;
    fn response_header(&self, name: &str) -> HostResult<Option<Vec<u8>>>;
    fn add_response_header(&self, name: &str, value: &str) -> HostResult<()>;
    /// The piece of the response body this callback was given (`size` bytes).
    fn response_body(&self, size: usize) -> HostResult<Option<Vec<u8>>>;
    /// Answers the request locally. `grpc_status` ≥ 0 makes Envoy send a gRPC
    /// trailers-only response with that status and `body` as `grpc-message`.
    fn send_local_response(
        &self,
        status: u32,
        headers: &[(&str, &str)],
        body: &[u8],
        grpc_status: i32,
    ) -> HostResult<()>;
    /// Lets a paused request go on.
    fn resume_request(&self) -> HostResult<()>;

    // Calls out.

    /// Starts an HTTP call to the Envoy cluster `cluster`; returns its token. Envoy
    /// answers it (or makes up a 503/504) on the plugin's root context, with the token.
    fn dispatch_call(
        &self,
        cluster: &str,
        headers: &[(&str, &str)],
        body: &[u8],
        timeout_ms: u64,
    ) -> HostResult<u32>;
    /// A header of the call whose answer this callback is.
    fn call_response_header(&self, name: &str) -> HostResult<Option<Vec<u8>>>;
    /// The body of the call whose answer this callback is, up to `max_size` bytes.
    fn call_response_body(&self, max_size: usize) -> HostResult<Option<Vec<u8>>>;
}

/// A shared-data error as the store contract names it.
pub fn store_error(e: HostError) -> crate::store::StoreError {
    if e.0 == CAS_MISMATCH {
        crate::store::StoreError::CasMismatch
    } else {
        crate::store::StoreError::Host(e.0)
    }
}

/// Logs `message` for the context `context_id` if Envoy logs `level` (the message is
/// only built then). Envoy prefixes the plugin's name; the line carries the context.
pub fn log<H: Host>(host: &H, context_id: u32, level: LogLevel, message: impl FnOnce() -> String) {
    if host.log_enabled(level) {
        host.log(level, &format!("#{context_id}: {}", message()));
    }
}
