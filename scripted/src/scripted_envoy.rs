//! Envoy as one VM sees it, over a [`ScriptedHost`]: contexts created and callbacks made
//! in the order Envoy makes them — a plugin configured (again, on a reload), a request's
//! headers, body, response and end, the tick, a call's answer — with every callback
//! counted as a VM entry.
//!
//! It also plays what Envoy does with the filter's answers, and records what reached
//! the upstream ([`Stream::upstream`]): headers the filter paused (Envoy's Wasm host
//! turns that into "stop everything": no body callback until resumed) go on when it
//! resumes them, and the body then reaches the filter; a body the filter buffers
//! ([`BodyAction::Read`]) or holds ([`BodyAction::Hold`]) stays in Envoy, growing with
//! each piece, until a body callback says [`BodyAction::Continue`] or the filter
//! resumes the request; a local reply ends it there, and resets what went on.

use std::collections::HashMap;
use std::sync::Arc;

use weir_core::store::memory::MemoryStore;

use crate::scripted_host::{Dispatched, ScriptedHost, Stream};
use weir_core::filter::Vm;
use weir_core::filter::{Action, BodyAction};

/// Envoy, as far as one VM sees it: contexts created and callbacks made in Envoy's
/// order, over a [`ScriptedHost`].
#[derive(Default)]
pub struct Envoy {
    pub host: ScriptedHost,
    pub vm: Vm,
    /// The root context new requests go to (the latest configured).
    pub root: u32,
    next_context: u32,
    /// Where Envoy stands with each request's flow to the upstream.
    flows: HashMap<u32, Flow>,
    /// Requests whose flow or answer may have changed since [`Envoy::take_changed`].
    changed: Vec<u32>,
}

/// Where Envoy stands with one request's flow to the upstream.
#[derive(Debug, Default, Clone, Copy)]
struct Flow {
    /// The filter paused the headers and has not resumed them.
    headers_stopped: bool,
    /// The filter stopped the body (to read or to hold it) and has not let it go.
    body_stopped: bool,
    /// The client sent the request's end.
    client_ended: bool,
    /// The filter's resumes of the stream seen so far.
    resumes: u32,
}

impl Envoy {
    /// A VM with one plugin of `config` (JSON), named `weir`; the error is the log line
    /// of a configuration Envoy would refuse.
    pub fn new(config: &str) -> Result<Envoy, String> {
        let mut envoy = Envoy::default();
        envoy.configure(config)?;
        Ok(envoy)
    }

    /// Another worker of an Envoy whose shared data is `store`: a VM of its own, with
    /// `config`.
    pub fn worker(config: &str, store: Arc<MemoryStore>) -> Result<Envoy, String> {
        let mut envoy = Envoy {
            host: ScriptedHost::sharing(store),
            ..Envoy::default()
        };
        envoy.configure(config)?;
        Ok(envoy)
    }

    /// A new root context with `config`, as Envoy makes on a config update; new requests
    /// go to it, requests of older ones stay with theirs. Returns its id.
    pub fn configure(&mut self, config: &str) -> Result<u32, String> {
        let root = self.new_context_id();
        {
            let mut state = self.host.state();
            state.roots.insert(root);
            state
                .configurations
                .insert(root, (config.as_bytes().to_vec(), "weir".to_string()));
            state.effective = root;
        }
        // proxy_on_context_create, proxy_on_vm_start (weir's answers at once),
        // proxy_on_configure.
        self.entering(3);
        self.vm.on_context_create(root, 0);
        if !self.vm.on_configure(&self.host, root) {
            let state = self.host.state();
            let last = state.logs.last().map(|(_, line)| line.clone());
            return Err(last.unwrap_or_default());
        }
        self.root = root;
        Ok(root)
    }

    fn new_context_id(&mut self) -> u32 {
        self.next_context += 1;
        self.next_context
    }

    pub fn now_us(&self) -> u64 {
        self.host.state().now_us
    }

    pub fn advance_us(&mut self, us: u64) {
        self.host.state().now_us += us;
    }

    pub fn set_now_us(&mut self, now_us: u64) {
        self.host.state().now_us = now_us;
    }

    /// Envoy makes a callback into the VM for `context_id`: it is the effective context.
    fn enter(&self, context_id: u32) {
        let mut state = self.host.state();
        state.effective = context_id;
        state.counts.entries += 1;
    }

    /// Counts `n` more callbacks into the VM (the `proxy_on_*` exports Envoy calls).
    fn entering(&self, n: u64) {
        self.host.state().counts.entries += n;
    }

    /// A request with `headers` and no body: its context and what the filter said.
    pub fn request(&mut self, headers: &[(&str, &str)]) -> (u32, Action) {
        self.headers(headers, true)
    }

    /// A request's `headers`, its body to follow ([`Envoy::body`]): its context and
    /// what the filter said.
    pub fn request_headers(&mut self, headers: &[(&str, &str)]) -> (u32, Action) {
        self.headers(headers, false)
    }

    /// A request with `headers`, the `attributes` Envoy gives the filter (by path:
    /// `["source", "address"]`) and no body: its context and what the filter said.
    pub fn request_with_attributes(
        &mut self,
        headers: &[(&str, &str)],
        attributes: HashMap<Vec<String>, Vec<u8>>,
    ) -> (u32, Action) {
        self.headers_with(headers, attributes, true)
    }

    fn headers(&mut self, headers: &[(&str, &str)], end_of_stream: bool) -> (u32, Action) {
        self.headers_with(headers, HashMap::new(), end_of_stream)
    }

    fn headers_with(
        &mut self,
        headers: &[(&str, &str)],
        attributes: HashMap<Vec<String>, Vec<u8>>,
        end_of_stream: bool,
    ) -> (u32, Action) {
        let context = self.open_stream(headers);
        if let Some(stream) = self.host.state().streams.get_mut(&context) {
            stream.attributes.extend(attributes);
        }
        self.entering(1);
        let action = self
            .vm
            .on_request_headers(&self.host, context, end_of_stream);
        let flow = Flow {
            headers_stopped: action == Action::Pause,
            client_ended: end_of_stream,
            ..Flow::default()
        };
        if action == Action::Continue {
            self.with_upstream(context, |up| {
                up.headers = true;
                up.ended = end_of_stream;
            });
        }
        self.flows.insert(context, flow);
        self.changed.push(context);
        self.flow();
        (context, action)
    }

    /// The requests whose flow to the upstream, or answer, may have changed since the
    /// last call (each at most once, in the order they changed first).
    pub fn take_changed(&mut self) -> Vec<u32> {
        let mut changed = std::mem::take(&mut self.changed);
        let mut seen = std::collections::HashSet::new();
        changed.retain(|c| seen.insert(*c));
        changed
    }

    /// A request with `headers` then `body` in one piece: what the filter said to the
    /// headers and to the body (`None`: Envoy did not call it, the headers being paused).
    pub fn request_with_body(
        &mut self,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> (u32, Action, Option<BodyAction>) {
        let (context, on_headers) = self.request_headers(headers);
        let on_body = self.body(context, body, true);
        (context, on_headers, on_body)
    }

    /// The next piece of `context`'s request body, the last one if `end_of_stream`:
    /// what the filter said, or `None` when Envoy did not call it (paused headers, a
    /// request answered or gone, a VM that reads no bodies... as Envoy decides).
    pub fn body(&mut self, context: u32, piece: &[u8], end_of_stream: bool) -> Option<BodyAction> {
        let mut flow = *self.flows.get(&context)?;
        let buffered = {
            let mut state = self.host.state();
            let stream = state.streams.get_mut(&context)?;
            if stream.local_reply.is_some() {
                return None;
            }
            stream.request_body.extend_from_slice(piece);
            stream.request_body.len()
        };
        flow.client_ended = end_of_stream;
        self.flows.insert(context, flow);
        if flow.headers_stopped {
            return None;
        }
        let action = self.body_callback(context, buffered, end_of_stream);
        self.changed.push(context);
        self.flow();
        Some(action)
    }

    /// Envoy calls the filter with the body it holds, and acts on the answer.
    fn body_callback(&mut self, context: u32, buffered: usize, end_of_stream: bool) -> BodyAction {
        self.enter(context);
        self.set_body_access(context, true);
        let action = self
            .vm
            .on_request_body(&self.host, context, buffered, end_of_stream);
        // Envoy keeps the body for the filter only when it buffers it.
        self.set_body_access(context, action == BodyAction::Read);
        let stopped = action != BodyAction::Continue;
        if let Some(flow) = self.flows.get_mut(&context) {
            flow.body_stopped = stopped;
        }
        if !stopped {
            self.forward_body(context);
        }
        action
    }

    /// The body Envoy holds for `context` goes on, and its end if the client sent it.
    fn forward_body(&mut self, context: u32) {
        let ended = self.flows.get(&context).is_some_and(|f| f.client_ended);
        let mut state = self.host.state();
        if let Some(stream) = state.streams.get_mut(&context) {
            let body = std::mem::take(&mut stream.request_body);
            stream.upstream.body.extend(body);
            stream.upstream.ended |= ended;
        }
    }

    fn set_body_access(&self, context: u32, access: bool) {
        if let Some(stream) = self.host.state().streams.get_mut(&context) {
            stream.body_access = access;
        }
    }

    fn with_upstream(&self, context: u32, f: impl FnOnce(&mut crate::scripted_host::Upstream)) {
        if let Some(stream) = self.host.state().streams.get_mut(&context) {
            f(&mut stream.upstream);
        }
    }

    /// What Envoy does after callbacks that may have resumed or answered requests: a
    /// local reply resets what went on; a resumed request's headers go on (and its body
    /// then reaches the filter), or its held body does.
    fn flow(&mut self) {
        let contexts = std::mem::take(&mut self.host.state().touched);
        self.changed.extend(&contexts);
        for context in contexts {
            let Some(mut flow) = self.flows.get(&context).copied() else {
                continue;
            };
            let (resumed, replied, buffered) = {
                let state = self.host.state();
                let Some(stream) = state.streams.get(&context) else {
                    continue;
                };
                (
                    stream.resumed,
                    stream.local_reply.is_some(),
                    stream.request_body.len(),
                )
            };
            if replied {
                self.with_upstream(context, |up| up.reset = up.headers && !up.ended);
                self.flows.remove(&context);
                continue;
            }
            if resumed <= flow.resumes {
                continue;
            }
            flow.resumes = resumed;
            if flow.headers_stopped {
                flow.headers_stopped = false;
                self.flows.insert(context, flow);
                let ended = flow.client_ended && buffered == 0;
                self.with_upstream(context, |up| {
                    up.headers = true;
                    up.ended = ended;
                });
                if buffered > 0 {
                    self.body_callback(context, buffered, flow.client_ended);
                }
            } else if flow.body_stopped {
                flow.body_stopped = false;
                self.flows.insert(context, flow);
                self.forward_body(context);
            } else {
                self.flows.insert(context, flow);
            }
        }
    }

    fn open_stream(&mut self, headers: &[(&str, &str)]) -> u32 {
        let context = self.new_context_id();
        let root = self.root;
        {
            let mut state = self.host.state();
            let stream = Stream {
                root,
                request_headers: headers
                    .iter()
                    .map(|(n, v)| (n.to_string(), v.to_string()))
                    .collect(),
                ..Stream::default()
            };
            state.streams.insert(context, stream);
            state.effective = context;
        }
        self.entering(1);
        self.vm.on_context_create(context, root);
        context
    }

    /// The upstream answers `context` with `status`, `headers` and `body` (in one piece).
    pub fn respond(&mut self, context: u32, status: u16, headers: &[(&str, &str)], body: &[u8]) {
        self.respond_with_details(context, status, headers, body, "via_upstream");
    }

    /// Envoy answers `context` itself, as its router does for a route timeout
    /// (`upstream_response_timeout`, 504) or an upstream reset before a response (503):
    /// the filter sees the reply's headers and body, with its `code_details`.
    pub fn local_reply(&mut self, context: u32, status: u16, code_details: &str) {
        let body = format!("upstream {code_details}");
        self.respond_with_details(context, status, &[], body.as_bytes(), code_details);
    }

    /// A response to `context`, whose `response.code_details` is `code_details`.
    pub fn respond_with_details(
        &mut self,
        context: u32,
        status: u16,
        headers: &[(&str, &str)],
        body: &[u8],
        code_details: &str,
    ) {
        {
            let mut state = self.host.state();
            let Some(stream) = state.streams.get_mut(&context) else {
                return;
            };
            stream.response_headers = vec![(":status".to_string(), status.to_string())];
            stream
                .response_headers
                .extend(headers.iter().map(|(n, v)| (n.to_string(), v.to_string())));
            stream.attributes.insert(
                vec!["response".to_string(), "code_details".to_string()],
                code_details.as_bytes().to_vec(),
            );
            stream.response_chunk = body.to_vec();
            state.effective = context;
        }
        self.entering(1);
        self.vm
            .on_response_headers(&self.host, context, body.is_empty());
        if !body.is_empty() {
            self.enter(context);
            self.vm
                .on_response_body(&self.host, context, body.len(), true);
        }
    }

    /// The local reply the filter sent for `context` goes out through the response
    /// callbacks, as in Envoy: the filter that sent it sees its headers and body too.
    pub fn deliver_local_reply(&mut self, context: u32) {
        let reply = {
            let mut state = self.host.state();
            let Some(stream) = state.streams.get_mut(&context) else {
                return;
            };
            let Some(reply) = stream.local_reply.clone() else {
                return;
            };
            stream.response_headers = vec![(":status".to_string(), reply.status.to_string())];
            stream
                .response_headers
                .extend(reply.headers.iter().cloned());
            stream.attributes.insert(
                vec!["response".to_string(), "code_details".to_string()],
                b"weir_rate_limited".to_vec(),
            );
            stream.response_chunk = reply.body.clone();
            reply
        };
        self.enter(context);
        self.vm
            .on_response_headers(&self.host, context, reply.body.is_empty());
        if !reply.body.is_empty() {
            self.enter(context);
            self.vm
                .on_response_body(&self.host, context, reply.body.len(), true);
        }
    }

    /// The stream is over (ended, reset or the client went away): Envoy's last
    /// callbacks for it, then it is gone.
    pub fn close(&mut self, context: u32) {
        // proxy_on_delete (weir exports neither proxy_on_done nor proxy_on_log).
        self.enter(context);
        self.vm.on_delete(&self.host, context);
        self.host.state().streams.remove(&context);
        self.flows.remove(&context);
    }

    /// Envoy tears the plugin of root context `root` down (a config update drained, a
    /// listener removed): `proxy_on_delete` on it (weir exports no `proxy_on_done`, so
    /// Envoy takes it as done at once).
    pub fn tear_down(&mut self, root: u32) {
        self.enter(root);
        self.vm.on_delete(&self.host, root);
        self.host.state().roots.remove(&root);
        self.flow();
    }

    /// The root context `root`'s tick.
    pub fn tick(&mut self, root: u32) {
        self.enter(root);
        self.vm.on_tick(&self.host, root);
        self.flow();
    }

    /// Calls made and not answered yet.
    pub fn open_calls(&self) -> Vec<Dispatched> {
        self.host
            .state()
            .dispatched
            .iter()
            .filter(|d| !d.answered)
            .cloned()
            .collect()
    }

    /// Envoy delivers the answer of the call `token` (`status` 0: no response) on the
    /// root context of the plugin that made it.
    pub fn answer(&mut self, token: u32, status: u16, body: &[u8]) {
        self.answer_with_headers(token, status, &[], body);
    }

    /// [`Envoy::answer`], with response headers beyond `:status` (Envoy's own reply for
    /// an overflow carries `x-envoy-overloaded`).
    pub fn answer_with_headers(
        &mut self,
        token: u32,
        status: u16,
        headers: &[(&str, &str)],
        body: &[u8],
    ) {
        let root = {
            let mut state = self.host.state();
            let index = usize::try_from(token).unwrap_or(0).wrapping_sub(1);
            let Some(call) = state.dispatched.get_mut(index).filter(|d| !d.answered) else {
                return;
            };
            call.answered = true;
            let root = call.root;
            state.in_flight = state.in_flight.saturating_sub(1);
            state.answering = Some((status, body.to_vec()));
            state.answering_headers = headers
                .iter()
                .map(|(n, v)| (n.to_string(), v.to_string()))
                .collect();
            state.effective = root;
            root
        };
        self.entering(1);
        self.vm
            .on_http_call_response(&self.host, root, token, body.len());
        self.host.state().answering = None;
        self.flow();
    }

    /// The stream `context` as Envoy holds it (a clone).
    pub fn stream(&self, context: u32) -> Option<Stream> {
        self.host.state().streams.get(&context).cloned()
    }
}
