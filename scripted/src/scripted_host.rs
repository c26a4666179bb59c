//! A scripted host: Envoy's side of the proxy-wasm ABI, played in process, so a
//! request's whole lifecycle runs natively (tests, and the benchmark's counts).
//!
//! [`ScriptedHost`] answers the [`Host`] calls the way Envoy does: shared data with
//! Envoy's semantics (a [`MemoryStore`]), an effective context that callbacks act on,
//! request and response headers and bodies per stream, local replies and resumes
//! recorded per stream, calls out recorded with a token, stats kept by id, a clock the
//! script moves. [`crate::scripted_envoy::Envoy`] drives a `Vm` over it.
//!
//! Calls on a context that does not exist (a request already deleted) fail as Envoy's
//! do, with `BadArgument`, and are counted in [`HostState::misdirected`]: a lifecycle
//! that resumes or answers a request that is gone is a bug these tests see.

use std::cell::{RefCell, RefMut};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use weir_core::filter::host::{
    BoundaryCounts, CallKind, Host, HostError, HostResult, LogLevel, MetricType,
};
use weir_core::store::memory::MemoryStore;
use weir_core::store::{SharedStore, StoreError};
use weir_core::time::Micros;

const BAD_ARGUMENT: HostError = HostError(2);
const NOT_FOUND: HostError = HostError(weir_core::filter::host::NOT_FOUND);
const INTERNAL_FAILURE: HostError = HostError(10);

/// One HTTP stream as Envoy holds it.
#[derive(Debug, Default, Clone)]
pub struct Stream {
    /// The root context of the stream's plugin.
    pub root: u32,
    pub request_headers: Vec<(String, String)>,
    pub request_body: Vec<u8>,
    pub response_headers: Vec<(String, String)>,
    /// The piece of the response body of the running callback.
    pub response_chunk: Vec<u8>,
    /// Attributes the filter may read (`source.address`, `response.code_details`).
    pub attributes: HashMap<Vec<String>, Vec<u8>>,
    /// Properties the filter set (Envoy's filter state `wasm.<name>`).
    pub filter_state: HashMap<String, Vec<u8>>,
    /// Times the filter resumed the stream.
    pub resumed: u32,
    /// The local reply the filter sent, if it did.
    pub local_reply: Option<LocalReply>,
    /// Headers the filter added to the response.
    pub added_response_headers: Vec<(String, String)>,
    /// What went on to the upstream (see [`crate::scripted_envoy::Envoy`]).
    pub upstream: Upstream,
    /// Whether the filter may read or write the request body now: during a body
    /// callback, or after one that buffered it (`StopIterationAndBuffer`). Envoy's Wasm
    /// host keeps a pointer to the last piece otherwise, which dangles once the
    /// callback returned: a later access crashes Envoy (seen in 1.40 after
    /// `StopIterationAndWatermark`).
    pub body_access: bool,
}

/// What the upstream received of a request: Envoy's side of the filter's answers to
/// its callbacks (played by [`crate::scripted_envoy::Envoy`]). The upstream is a
/// witness: a request whose body it received was admitted, whatever the client was
/// answered.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Upstream {
    /// The request's headers went on.
    pub headers: bool,
    /// The body bytes that went on.
    pub body: Vec<u8>,
    /// The request's end went on: the upstream has all of it.
    pub ended: bool,
    /// The request went on, then the filter answered it (Envoy resets what it sent).
    pub reset: bool,
}

impl Stream {
    fn header(headers: &[(String, String)], name: &str) -> Option<Vec<u8>> {
        headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.clone().into_bytes())
    }

    /// A header the filter added to the response.
    pub fn added(&self, name: &str) -> Option<&str> {
        self.added_response_headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalReply {
    pub status: u32,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    pub grpc_status: i32,
}

/// A call the filter made.
#[derive(Debug, Clone)]
pub struct Dispatched {
    pub token: u32,
    /// The context that was effective when the call was made.
    pub from_context: u32,
    /// The root context of that context's plugin: Envoy answers there.
    pub root: u32,
    pub cluster: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    pub timeout_ms: u64,
    /// Answered by the script already.
    pub answered: bool,
}

impl Dispatched {
    pub fn path(&self) -> &str {
        self.headers
            .iter()
            .find(|(n, _)| n == ":path")
            .map_or("", |(_, v)| v.as_str())
    }
}

/// A stat as the filter defined it, and its value.
#[derive(Debug, Clone)]
pub struct Metric {
    pub metric_type: MetricType,
    pub name: String,
    pub value: i64,
}

/// What Envoy refuses, when the script wants it to.
#[derive(Debug, Default, Clone, Copy)]
pub struct Refusals {
    /// `dispatch_call` fails (no such cluster, or no host in it).
    pub dispatch: bool,
    /// `dispatch_call` fails while this many calls are in flight (made and not
    /// answered): the bridge cluster's circuit breaker (`max_requests`), which Envoy
    /// applies at once, with `InternalFailure`.
    pub calls_in_flight: Option<usize>,
    /// `send_local_response` fails.
    pub local_response: bool,
}

/// Everything the scripted host knows and recorded.
#[derive(Debug, Default)]
pub struct HostState {
    pub now_us: u64,
    /// The context host calls act on.
    pub effective: u32,
    pub roots: HashSet<u32>,
    /// Each root context's plugin configuration and name.
    pub configurations: HashMap<u32, (Vec<u8>, String)>,
    pub environment: HashMap<String, String>,
    pub logs: Vec<(LogLevel, String)>,
    /// The plugin's log level: lines below it are not logged.
    pub log_level: LogLevel,
    /// Callbacks made into the VM and calls out by kind (bytes are not counted here).
    pub counts: BoundaryCounts,
    /// The tick period each root context asked for.
    pub tick_ms: HashMap<u32, u32>,
    pub streams: HashMap<u32, Stream>,
    /// Every call made, in order: call `token` is at `token - 1`.
    pub dispatched: Vec<Dispatched>,
    /// Calls made and not answered yet.
    pub in_flight: usize,
    /// Streams the filter resumed or answered since the script last looked
    /// ([`crate::scripted_envoy::Envoy`] acts on them).
    pub touched: Vec<u32>,
    /// The answer of the call whose callback is running: status (0: none) and body.
    pub answering: Option<(u16, Vec<u8>)>,
    /// The headers of that answer, beyond `:status`.
    pub answering_headers: Vec<(String, String)>,
    pub metrics: Vec<Metric>,
    pub refuse: Refusals,
    /// Calls made on a context that does not exist.
    pub misdirected: u32,
    /// Reads or writes of a request body Envoy did not hold for the filter any more
    /// ([`Stream::body_access`]): each would have crashed Envoy.
    pub dangling_body: u32,
}

impl HostState {
    /// The value of the stat `name` (counters as sent by the filter's flushes).
    pub fn metric(&self, name: &str) -> Option<i64> {
        self.metrics
            .iter()
            .find(|m| m.name == name)
            .map(|m| m.value)
    }
}

/// The kind of an ABI function, as the filter crate counts it.
fn kind_of(method: &str) -> CallKind {
    match method {
        "get_current_time" => CallKind::Clock,
        "get_header_map_value" | "add_header_map_value" | "replace_header_map_value" => {
            CallKind::Header
        }
        "get_buffer_bytes" => CallKind::Body,
        "get_shared_data" => CallKind::SharedGet,
        "set_shared_data" => CallKind::SharedSet,
        "get_property" | "set_property" => CallKind::Property,
        "http_call" => CallKind::Dispatch,
        "define_metric" | "increment_metric" | "record_metric" => CallKind::Stats,
        "log" | "get_log_level" => CallKind::Log,
        "set_tick_period" => CallKind::Tick,
        _ => CallKind::Stream,
    }
}

#[derive(Debug, Default)]
pub struct ScriptedHost {
    /// Shared data: of this VM's Envoy, seen by every VM (worker) of it.
    pub store: Arc<MemoryStore>,
    state: RefCell<HostState>,
}

impl ScriptedHost {
    /// A host whose shared data is `store`, shared with the other workers of its Envoy.
    pub fn sharing(store: Arc<MemoryStore>) -> ScriptedHost {
        ScriptedHost {
            store,
            state: RefCell::default(),
        }
    }

    pub fn state(&self) -> RefMut<'_, HostState> {
        self.state.borrow_mut()
    }

    /// Counts a call of `method`, and gives the state to act on.
    fn call(&self, method: &'static str) -> RefMut<'_, HostState> {
        let mut state = self.state.borrow_mut();
        state.counts.call(kind_of(method), 0);
        state
    }

    /// A value Envoy copies into the VM, through `proxy_on_memory_allocate`: one more
    /// entry into the VM.
    fn handed_in(&self, value: HostResult<Option<Vec<u8>>>) -> HostResult<Option<Vec<u8>>> {
        if let Ok(Some(_)) = &value {
            self.state.borrow_mut().counts.entries += 1;
        }
        value
    }

    /// Counts an access to a request body Envoy no longer holds for the filter
    /// ([`Stream::body_access`]): in Envoy, a crash.
    fn body_accessed(&self, ok: bool) -> HostResult<()> {
        if ok {
            return Ok(());
        }
        self.state.borrow_mut().dangling_body += 1;
        Err(BAD_ARGUMENT)
    }

    /// The effective context's stream.
    fn stream<R>(&self, method: &'static str, f: impl FnOnce(&mut Stream) -> R) -> HostResult<R> {
        let mut state = self.call(method);
        let effective = state.effective;
        match state.streams.get_mut(&effective) {
            Some(stream) => Ok(f(stream)),
            None => {
                state.misdirected += 1;
                Err(BAD_ARGUMENT)
            }
        }
    }
}

impl SharedStore for ScriptedHost {
    fn get(&self, key: &str) -> Result<(Option<Vec<u8>>, Option<u32>), StoreError> {
        drop(self.call("get_shared_data"));
        let found = self.store.get(key);
        if let Ok((Some(_), _)) = &found {
            self.state.borrow_mut().counts.entries += 1;
        }
        found
    }

    fn compare_and_set(&self, key: &str, value: &[u8], version: u32) -> Result<(), StoreError> {
        drop(self.call("set_shared_data"));
        self.store.compare_and_set(key, value, version)
    }

    fn create(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        drop(self.call("set_shared_data"));
        self.store.create(key, value)
    }
}

impl Host for ScriptedHost {
    fn now(&self) -> HostResult<Micros> {
        Ok(Micros(self.call("get_current_time").now_us))
    }

    fn log(&self, level: LogLevel, message: &str) {
        self.call("log").logs.push((level, message.to_string()));
    }

    /// As Envoy's default log level (info): debug lines are not even built.
    fn log_enabled(&self, level: LogLevel) -> bool {
        level >= self.state.borrow().log_level
    }

    fn refresh_log_level(&self) {
        drop(self.call("get_log_level"));
    }

    fn counts(&self) -> BoundaryCounts {
        self.state.borrow().counts
    }

    fn set_tick_period_ms(&self, period_ms: u32) -> HostResult<()> {
        let mut state = self.call("set_tick_period");
        // Envoy sets the tick of the effective context's root context.
        let effective = state.effective;
        let root = state.streams.get(&effective).map_or(effective, |s| s.root);
        state.tick_ms.insert(root, period_ms);
        Ok(())
    }

    fn plugin_configuration(&self, max_size: usize) -> HostResult<Option<Vec<u8>>> {
        let config = {
            let state = self.call("get_buffer_bytes");
            let (config, _) = state
                .configurations
                .get(&state.effective)
                .ok_or(NOT_FOUND)?;
            config.iter().copied().take(max_size).collect()
        };
        self.handed_in(Ok(Some(config)))
    }

    fn environment_variable(&self, name: &str) -> Option<String> {
        self.state.borrow().environment.get(name).cloned()
    }

    fn entropy(&self) -> Result<[u8; 16], String> {
        Ok(*b"scripted-entropy")
    }

    fn define_metric(&self, metric_type: MetricType, name: &str) -> HostResult<u32> {
        let mut state = self.call("define_metric");
        // Envoy maps one name to one stat, whoever defines it.
        if let Some(id) = state.metrics.iter().position(|m| m.name == name) {
            return u32::try_from(id).map_err(|_| BAD_ARGUMENT);
        }
        state.metrics.push(Metric {
            metric_type,
            name: name.to_string(),
            value: 0,
        });
        u32::try_from(state.metrics.len() - 1).map_err(|_| BAD_ARGUMENT)
    }

    fn increment_metric(&self, id: u32, offset: i64) -> HostResult<()> {
        let mut state = self.call("increment_metric");
        let metric = state.metrics.get_mut(id as usize).ok_or(NOT_FOUND)?;
        metric.value = metric.value.saturating_add(offset);
        Ok(())
    }

    fn record_metric(&self, id: u32, value: u64) -> HostResult<()> {
        let mut state = self.call("record_metric");
        let metric = state.metrics.get_mut(id as usize).ok_or(NOT_FOUND)?;
        metric.value = i64::try_from(value).unwrap_or(i64::MAX);
        Ok(())
    }

    fn set_effective_context(&self, context_id: u32) -> HostResult<()> {
        let mut state = self.call("set_effective_context");
        if state.roots.contains(&context_id) || state.streams.contains_key(&context_id) {
            state.effective = context_id;
            Ok(())
        } else {
            state.misdirected += 1;
            Err(BAD_ARGUMENT)
        }
    }

    fn property(&self, path: &[String]) -> HostResult<Option<Vec<u8>>> {
        if path == ["plugin_name"] {
            let name = {
                let state = self.call("get_property");
                let root = match state.streams.get(&state.effective) {
                    Some(stream) => stream.root,
                    None => state.effective,
                };
                state
                    .configurations
                    .get(&root)
                    .map(|(_, name)| name.clone().into_bytes())
            };
            return self.handed_in(Ok(name));
        }
        let found = self.stream("get_property", |s| s.attributes.get(path).cloned());
        self.handed_in(found)
    }

    fn set_property(&self, name: &str, value: &[u8]) -> HostResult<()> {
        self.stream("set_property", |s| {
            s.filter_state.insert(name.to_string(), value.to_vec());
        })
    }

    fn request_header(&self, name: &str) -> HostResult<Option<Vec<u8>>> {
        let found = self.stream("get_header_map_value", |s| {
            Stream::header(&s.request_headers, name)
        });
        self.handed_in(found)
    }

    fn replace_request_header(&self, name: &str, value: &str) -> HostResult<()> {
        self.stream("replace_header_map_value", |s| {
            s.request_headers
                .retain(|(n, _)| !n.eq_ignore_ascii_case(name));
            s.request_headers
                .push((name.to_string(), value.to_string()));
        })
    }

    fn remove_request_header(&self, name: &str) -> HostResult<()> {
        self.stream("remove_header_map_value", |s| {
            s.request_headers
                .retain(|(n, _)| !n.eq_ignore_ascii_case(name));
        })
    }

    fn replace_request_body(&self, size: usize, body: &[u8]) -> HostResult<()> {
        let done = self.stream("set_buffer_bytes", |s| {
            if !s.body_access {
                return false;
            }
            let size = size.min(s.request_body.len());
            s.request_body.splice(..size, body.iter().copied());
            true
        })?;
        self.body_accessed(done)
    }

    fn request_body(&self, max_size: usize) -> HostResult<Option<Vec<u8>>> {
        let found = self.stream("get_buffer_bytes", |s| {
            s.body_access
                .then(|| s.request_body.iter().copied().take(max_size).collect())
        })?;
        self.body_accessed(found.is_some())?;
        self.handed_in(Ok(found))
    }

    fn response_header(&self, name: &str) -> HostResult<Option<Vec<u8>>> {
        let found = self.stream("get_header_map_value", |s| {
            Stream::header(&s.response_headers, name)
        });
        self.handed_in(found)
    }

    fn add_response_header(&self, name: &str, value: &str) -> HostResult<()> {
        self.stream("add_header_map_value", |s| {
            s.added_response_headers
                .push((name.to_string(), value.to_string()));
        })
    }

    fn response_body(&self, size: usize) -> HostResult<Option<Vec<u8>>> {
        let found = self.stream("get_buffer_bytes", |s| {
            Some(s.response_chunk.iter().copied().take(size).collect())
        });
        self.handed_in(found)
    }

    fn send_local_response(
        &self,
        status: u32,
        headers: &[(&str, &str)],
        body: &[u8],
        grpc_status: i32,
    ) -> HostResult<()> {
        if self.state.borrow().refuse.local_response {
            drop(self.call("send_local_response"));
            return Err(BAD_ARGUMENT);
        }
        self.stream("send_local_response", |s| {
            s.local_reply = Some(LocalReply {
                status,
                headers: headers
                    .iter()
                    .map(|(n, v)| (n.to_string(), v.to_string()))
                    .collect(),
                body: body.to_vec(),
                grpc_status,
            });
        })?;
        let mut state = self.state.borrow_mut();
        let effective = state.effective;
        state.touched.push(effective);
        Ok(())
    }

    fn resume_request(&self) -> HostResult<()> {
        self.stream("continue_stream", |s| s.resumed += 1)?;
        let mut state = self.state.borrow_mut();
        let effective = state.effective;
        state.touched.push(effective);
        Ok(())
    }

    fn dispatch_call(
        &self,
        cluster: &str,
        headers: &[(&str, &str)],
        body: &[u8],
        timeout_ms: u64,
    ) -> HostResult<u32> {
        let mut state = self.call("http_call");
        if state.refuse.dispatch {
            return Err(BAD_ARGUMENT);
        }
        if let Some(max) = state.refuse.calls_in_flight {
            if state.in_flight >= max {
                return Err(INTERNAL_FAILURE);
            }
        }
        let token = u32::try_from(state.dispatched.len() + 1).map_err(|_| BAD_ARGUMENT)?;
        let from_context = state.effective;
        let root = state
            .streams
            .get(&from_context)
            .map_or(from_context, |s| s.root);
        state.in_flight += 1;
        state.dispatched.push(Dispatched {
            token,
            from_context,
            root,
            cluster: cluster.to_string(),
            headers: headers
                .iter()
                .map(|(n, v)| (n.to_string(), v.to_string()))
                .collect(),
            body: body.to_vec(),
            timeout_ms,
            answered: false,
        });
        Ok(token)
    }

    fn call_response_header(&self, name: &str) -> HostResult<Option<Vec<u8>>> {
        let found = {
            let state = self.call("get_header_map_value");
            let (status, _) = state.answering.as_ref().ok_or(NOT_FOUND)?;
            if name == ":status" {
                (*status != 0).then(|| status.to_string().into_bytes())
            } else {
                Stream::header(&state.answering_headers, name)
            }
        };
        self.handed_in(Ok(found))
    }

    fn call_response_body(&self, max_size: usize) -> HostResult<Option<Vec<u8>>> {
        let body = {
            let state = self.call("get_buffer_bytes");
            let (_, body) = state.answering.as_ref().ok_or(NOT_FOUND)?;
            body.iter().copied().take(max_size).collect()
        };
        self.handed_in(Ok(Some(body)))
    }
}
