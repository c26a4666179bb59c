//! The contexts of one VM and every callback Envoy makes, routed to them.

use super::host::Host;
use super::request::{Action, BodyAction, Request};
use super::root::Root;
use crate::time::Micros;
use std::collections::HashMap;

/// The contexts of one VM (one per worker thread, and the main thread's): a root context
/// per plugin, a request context per HTTP stream, created and deleted as Envoy says.
/// Callbacks for a context that does not exist (never created, or deleted) do nothing:
/// nothing here panics on an input the host sends.
#[derive(Default)]
pub struct Vm {
    roots: HashMap<u32, Root>,
    requests: HashMap<u32, Request>,
    /// Whether a plugin of this VM reads request or response bodies (a cost from the
    /// body, a `commit`): Envoy calls the body callbacks for every chunk of every
    /// request once they are exported, and without such a plugin they return at once.
    reads_bodies: bool,
}

impl Vm {
    /// A context is created: a plugin's root context (`parent_id` 0) or a request's,
    /// under the root context of its plugin.
    pub fn on_context_create(&mut self, context_id: u32, parent_id: u32) {
        if parent_id == 0 {
            self.roots.insert(context_id, Root::new(context_id));
            return;
        }
        if let Some(root) = self.roots.get(&parent_id) {
            let request = root.new_request(context_id);
            self.requests.insert(context_id, request);
        }
    }

    /// The plugin's configuration; false makes Envoy refuse it.
    pub fn on_configure<H: Host>(&mut self, host: &H, root_id: u32) -> bool {
        let Some(root) = self.roots.get_mut(&root_id) else {
            return false;
        };
        let ok = root.on_configure(host);
        if root
            .plugin()
            .is_some_and(|p| p.engine.config.reads_bodies())
        {
            self.reads_bodies = true;
        }
        ok
    }

    /// Whether the body and trailer callbacks have work in this VM.
    pub fn reads_bodies(&self) -> bool {
        self.reads_bodies
    }

    /// The root context's tick: its periodic work, commits sent, adaptive limits
    /// merged, then the held requests that are due are released, each in its own
    /// context.
    pub fn on_tick<H: Host>(&mut self, host: &H, root_id: u32) {
        let Some(root) = self.roots.get(&root_id) else {
            return;
        };
        root.on_tick(host);
        let Some(plugin) = root.plugin().cloned() else {
            return;
        };
        plugin.send_commits(host);
        plugin.adapt(host);
        if plugin.holds_none() {
            plugin.adjust_tick(host);
            return;
        }
        let Ok(now) = host.now() else {
            return;
        };
        for context in plugin.take_pushed_out() {
            self.in_request(host, context, |request| request.on_pushed_out(host, now));
        }
        let due = plugin.take_due(now);
        for context in due {
            self.in_request(host, context, |request| request.on_hold_due(host, now));
        }
        let _ = host.set_effective_context(root_id);
        plugin.adjust_tick(host);
    }

    /// Runs `f` on the request `context_id` after making it the effective context, from
    /// a callback of another context (the tick, a call's answer).
    fn in_request<H: Host>(&mut self, host: &H, context_id: u32, f: impl FnOnce(&mut Request)) {
        if let Some(request) = self.requests.get_mut(&context_id) {
            if host.set_effective_context(context_id).is_ok() {
                f(request);
            }
        }
    }

    /// Runs `f` on the request whose callback this is.
    fn request(&mut self, context_id: u32, f: impl FnOnce(&mut Request) -> Action) -> Action {
        self.requests
            .get_mut(&context_id)
            .map_or(Action::Continue, f)
    }

    /// Runs a body or trailers callback `f` on the request whose callback this is, if
    /// a plugin of the VM reads bodies; else what `proceed` says.
    fn body_request<A>(
        &mut self,
        context_id: u32,
        proceed: A,
        f: impl FnOnce(&mut Request) -> A,
    ) -> A {
        if !self.reads_bodies {
            return proceed;
        }
        self.requests.get_mut(&context_id).map_or(proceed, f)
    }

    pub fn on_request_headers<H: Host>(
        &mut self,
        host: &H,
        context_id: u32,
        end_of_stream: bool,
    ) -> Action {
        self.request(context_id, |r| r.on_request_headers(host, end_of_stream))
    }

    pub fn on_request_body<H: Host>(
        &mut self,
        host: &H,
        context_id: u32,
        body_size: usize,
        end_of_stream: bool,
    ) -> BodyAction {
        self.body_request(context_id, BodyAction::Continue, |r| {
            r.on_request_body(host, body_size, end_of_stream)
        })
    }

    pub fn on_request_trailers<H: Host>(&mut self, host: &H, context_id: u32) -> Action {
        self.body_request(context_id, Action::Continue, |r| {
            r.on_request_trailers(host)
        })
    }

    pub fn on_response_headers<H: Host>(
        &mut self,
        host: &H,
        context_id: u32,
        end_of_stream: bool,
    ) -> Action {
        self.request(context_id, |r| r.on_response_headers(host, end_of_stream))
    }

    pub fn on_response_body<H: Host>(
        &mut self,
        host: &H,
        context_id: u32,
        body_size: usize,
        end_of_stream: bool,
    ) -> Action {
        self.body_request(context_id, Action::Continue, |r| {
            r.on_response_body(host, body_size, end_of_stream)
        })
    }

    pub fn on_response_trailers<H: Host>(&mut self, host: &H, context_id: u32) -> Action {
        self.body_request(context_id, Action::Continue, |r| {
            r.on_response_trailers(host)
        })
    }

    /// A context is gone. A request stops waiting on a call or being held, and settles
    /// what its response never will. A root context torn down while its plugin still
    /// holds requests answers each now (429, its remaining wait as the retry) rather than
    /// leave it hanging. (Envoy stopping on SIGTERM closes the connections first: then
    /// there is nothing left to answer.)
    ///
    /// weir exports no `proxy_on_done`: without it Envoy takes every context as done at
    /// once and deletes it, which is what weir would answer, and a request costs one VM
    /// entry less.
    pub fn on_delete<H: Host>(&mut self, host: &H, context_id: u32) {
        if let Some(root) = self.roots.remove(&context_id) {
            if let Some(plugin) = root.plugin() {
                let held = plugin.take_all_held();
                if !held.is_empty() {
                    let now = host.now().unwrap_or(Micros::ZERO);
                    for context in held {
                        self.in_request(host, context, |r| r.on_plugin_done(host, now));
                    }
                    let _ = host.set_effective_context(context_id);
                }
                plugin.retire(host);
            }
        }
        if let Some(mut request) = self.requests.remove(&context_id) {
            request.on_delete(host);
        }
    }

    /// The answer of a call, on the root context of the plugin that made it
    /// ([`Plugin::on_call_answer`] reads it): a bridge call's request is resumed or
    /// answered — or, gone, what its call decided is wound up by the plugin — then every
    /// request that waited on the call looks again.
    ///
    /// [`Plugin::on_call_answer`]: super::plugin::Plugin::on_call_answer
    pub fn on_http_call_response<H: Host>(
        &mut self,
        host: &H,
        root_id: u32,
        token: u32,
        body_size: usize,
    ) {
        let Some(plugin) = self.roots.get(&root_id).and_then(|r| r.plugin().cloned()) else {
            return;
        };
        let Some(landed) = plugin.on_call_answer(host, token, body_size) else {
            return;
        };
        let now = landed.now;
        let owner = self
            .requests
            .get_mut(&landed.owner)
            .filter(|_| host.set_effective_context(landed.owner).is_ok());
        match owner {
            Some(owner) => owner.on_own_call_answered(host, landed.eval, now),
            None => plugin.on_owner_gone(host, &landed),
        }
        // Each looks again knowing how many still wait (itself included): the first to
        // miss asks for them all. Its own call leaves from the root context whatever the
        // effective context (Envoy's `http_call` acts on the effective context's root),
        // and Envoy restores the effective context when this callback returns: nothing
        // switches back to the root here.
        let waiters = landed.waiters.len();
        for (looked, waiter) in landed.waiters.into_iter().enumerate() {
            let waiting = (waiters - looked) as u64;
            self.in_request(host, waiter, |r| r.on_flight_landed(host, now, waiting));
        }
    }
}
