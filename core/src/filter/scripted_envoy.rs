//! Envoy as one VM sees it, over a [`ScriptedHost`]: contexts created and callbacks made
//! in the order Envoy makes them — a plugin configured (again, on a reload), a request's
//! headers, body, response and end, the tick, a call's answer — with every callback
//! counted as a VM entry.

use super::request::Action;
use super::scripted::{Dispatched, ScriptedHost, Stream};
use super::vm::Vm;

/// Envoy, as far as one VM sees it: contexts created and callbacks made in Envoy's
/// order, over a [`ScriptedHost`].
#[derive(Default)]
pub struct Envoy {
    pub host: ScriptedHost,
    pub vm: Vm,
    /// The root context new requests go to (the latest configured).
    pub root: u32,
    next_context: u32,
}

impl Envoy {
    /// A VM with one plugin of `config` (JSON), named `weir`; the error is the log line
    /// of a configuration Envoy would refuse.
    pub fn new(config: &str) -> Result<Envoy, String> {
        let mut envoy = Envoy::default();
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
        let context = self.open_stream(headers);
        self.entering(1);
        let action = self.vm.on_request_headers(&self.host, context, true);
        (context, action)
    }

    /// A request with `headers` then `body`: what the filter said to the headers and to
    /// the body.
    pub fn request_with_body(
        &mut self,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> (u32, Action, Action) {
        let context = self.open_stream(headers);
        self.entering(1);
        let on_headers = self.vm.on_request_headers(&self.host, context, false);
        self.host
            .state()
            .streams
            .entry(context)
            .or_default()
            .request_body = body.to_vec();
        self.enter(context);
        let on_body = self
            .vm
            .on_request_body(&self.host, context, body.len(), true);
        (context, on_headers, on_body)
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
                b"via_upstream".to_vec(),
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
    }

    /// Envoy tears the plugin of root context `root` down (a config update drained, a
    /// listener removed): `proxy_on_delete` on it (weir exports no `proxy_on_done`, so
    /// Envoy takes it as done at once).
    pub fn tear_down(&mut self, root: u32) {
        self.enter(root);
        self.vm.on_delete(&self.host, root);
        self.host.state().roots.remove(&root);
    }

    /// The root context `root`'s tick.
    pub fn tick(&mut self, root: u32) {
        self.enter(root);
        self.vm.on_tick(&self.host, root);
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
        let root = {
            let mut state = self.host.state();
            let Some(call) = state.dispatched.iter_mut().find(|d| d.token == token) else {
                return;
            };
            call.answered = true;
            let root = call.root;
            state.answering = Some((status, body.to_vec()));
            state.effective = root;
            root
        };
        self.entering(1);
        self.vm
            .on_http_call_response(&self.host, root, token, body.len());
        self.host.state().answering = None;
    }

    /// The stream `context` as Envoy holds it (a clone).
    pub fn stream(&self, context: u32) -> Option<Stream> {
        self.host.state().streams.get(&context).cloned()
    }
}
