//! The callbacks Envoy makes into the VM (proxy-wasm ABI 0.2.1), routed to weir's
//! contexts: one [`Root`] per plugin, one [`Filter`] per request.
//!
//! weir implements them itself rather than through an SDK's dispatcher for two
//! reasons. A bridge call's answer must reach whoever needs it whether or not the
//! request that made the call still exists: Envoy makes the call on the plugin's root
//! context and answers it there with the call's token, and here the token finds the call
//! (`weir_core::flight`), whose evaluation is completed and whose waiters are woken,
//! each in its own context. And nothing here can panic on an input the host sends: an
//! unknown context or token is ignored.
//!
//! A context is taken out of its table while its callback runs and put back after, so a
//! callback that re-enters the VM for the same context (Envoy does not, but nothing
//! here relies on it) finds nothing and does nothing, rather than borrowing twice.

use crate::filter::{Action, Filter};
use crate::host;
use crate::root::Root;
use crate::store::SharedData;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;

#[derive(Default)]
struct Contexts {
    roots: HashMap<u32, Root>,
    filters: HashMap<u32, Filter>,
    /// The root context of each request's context.
    parents: HashMap<u32, u32>,
}

thread_local! {
    static CONTEXTS: RefCell<Contexts> = RefCell::new(Contexts::default());
    /// Whether a plugin of this VM reads request or response bodies (a cost from the
    /// body, a `commit`): Envoy calls the body callbacks for every chunk of every
    /// request once they are exported, and without such a plugin they return at once.
    static READS_BODIES: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f` on the root context `id`, taken out of the table meanwhile.
fn with_root<R>(id: u32, f: impl FnOnce(&mut Root) -> R) -> Option<R> {
    let mut root = CONTEXTS.with(|c| c.borrow_mut().roots.remove(&id))?;
    let result = f(&mut root);
    CONTEXTS.with(|c| c.borrow_mut().roots.insert(id, root));
    Some(result)
}

/// Runs `f` on the request context `id`, taken out of the table meanwhile.
fn with_filter<R>(id: u32, f: impl FnOnce(&mut Filter) -> R) -> Option<R> {
    let mut filter = CONTEXTS.with(|c| c.borrow_mut().filters.remove(&id))?;
    let result = f(&mut filter);
    CONTEXTS.with(|c| c.borrow_mut().filters.insert(id, filter));
    Some(result)
}

#[no_mangle]
pub extern "C" fn proxy_abi_version_0_2_1() {}

/// Memory the host asks for to hand data in: a boxed slice of exactly `size` bytes,
/// taken back by `host` with `Vec::from_raw_parts(ptr, size, size)`.
#[no_mangle]
pub extern "C" fn proxy_on_memory_allocate(size: usize) -> *mut u8 {
    let mut bytes = vec![0u8; size].into_boxed_slice();
    let ptr = bytes.as_mut_ptr();
    std::mem::forget(bytes);
    ptr
}

#[no_mangle]
pub extern "C" fn proxy_on_context_create(context_id: u32, parent_id: u32) {
    if parent_id == 0 {
        CONTEXTS.with(|c| {
            c.borrow_mut()
                .roots
                .insert(context_id, Root::new(context_id))
        });
        return;
    }
    let Some(filter) = with_root(parent_id, |root| root.new_filter(context_id)) else {
        return;
    };
    CONTEXTS.with(|c| {
        let mut c = c.borrow_mut();
        c.filters.insert(context_id, filter);
        c.parents.insert(context_id, parent_id);
    });
}

#[no_mangle]
pub extern "C" fn proxy_on_vm_start(_root_id: u32, _vm_configuration_size: usize) -> u32 {
    1
}

#[no_mangle]
pub extern "C" fn proxy_on_configure(root_id: u32, _plugin_configuration_size: usize) -> u32 {
    let configured = with_root(root_id, |root| {
        let ok = root.on_configure();
        if root
            .plugin()
            .is_some_and(|p| p.engine.config.reads_bodies())
        {
            READS_BODIES.with(|r| r.set(true));
        }
        ok
    });
    u32::from(configured.unwrap_or(false))
}

/// The root context's tick: its periodic work, then the held requests that are due are
/// released, each in its own context.
#[no_mangle]
pub extern "C" fn proxy_on_tick(root_id: u32) {
    let Some(plugin) = with_root(root_id, |root| {
        root.on_tick();
        root.plugin().cloned()
    })
    .flatten() else {
        return;
    };
    plugin.send_commits();
    plugin.adapt();
    if plugin.worker.borrow().waiting.is_empty() {
        plugin.adjust_tick();
        return;
    }
    let Ok(now_us) = host::now_us() else {
        return;
    };
    let due = plugin.worker.borrow_mut().waiting.take_due(now_us);
    for context in due {
        if host::set_effective_context(context).is_ok() {
            with_filter(context, |f| f.on_hold_due(now_us));
        }
    }
    let _ = host::set_effective_context(root_id);
    plugin.adjust_tick();
}

#[no_mangle]
pub extern "C" fn proxy_on_request_headers(context_id: u32, _headers: usize, eos: u32) -> u32 {
    with_filter(context_id, |f| f.on_request_headers(eos != 0)).unwrap_or(Action::Continue) as u32
}

#[no_mangle]
pub extern "C" fn proxy_on_request_body(context_id: u32, body_size: usize, eos: u32) -> u32 {
    if !READS_BODIES.with(Cell::get) {
        return Action::Continue as u32;
    }
    with_filter(context_id, |f| f.on_request_body(body_size, eos != 0)).unwrap_or(Action::Continue)
        as u32
}

#[no_mangle]
pub extern "C" fn proxy_on_request_trailers(context_id: u32, _trailers: usize) -> u32 {
    if !READS_BODIES.with(Cell::get) {
        return Action::Continue as u32;
    }
    with_filter(context_id, Filter::on_request_trailers).unwrap_or(Action::Continue) as u32
}

#[no_mangle]
pub extern "C" fn proxy_on_response_headers(context_id: u32, _headers: usize, eos: u32) -> u32 {
    with_filter(context_id, |f| f.on_response_headers(eos != 0)).unwrap_or(Action::Continue) as u32
}

#[no_mangle]
pub extern "C" fn proxy_on_response_trailers(context_id: u32, _trailers: usize) -> u32 {
    if !READS_BODIES.with(Cell::get) {
        return Action::Continue as u32;
    }
    with_filter(context_id, Filter::on_response_trailers).unwrap_or(Action::Continue) as u32
}

#[no_mangle]
pub extern "C" fn proxy_on_response_body(context_id: u32, body_size: usize, eos: u32) -> u32 {
    if !READS_BODIES.with(Cell::get) {
        return Action::Continue as u32;
    }
    with_filter(context_id, |f| f.on_response_body(body_size, eos != 0)).unwrap_or(Action::Continue)
        as u32
}

/// A context is done. Should a root context be torn down while its plugin still holds
/// requests, each is answered now (429, its remaining wait as the retry) rather than left
/// hanging. (Envoy stopping on SIGTERM closes the connections first: then there is
/// nothing left to answer.)
#[no_mangle]
pub extern "C" fn proxy_on_done(context_id: u32) -> u32 {
    let plugin = with_root(context_id, |root| root.plugin().cloned()).flatten();
    if let Some(plugin) = plugin {
        let held = plugin.worker.borrow_mut().waiting.take_all();
        if !held.is_empty() {
            let now_us = host::now_us().unwrap_or(0);
            for context in held {
                if host::set_effective_context(context).is_ok() {
                    with_filter(context, |f| f.on_plugin_done(now_us));
                }
            }
            let _ = host::set_effective_context(context_id);
        }
    }
    1
}

#[no_mangle]
pub extern "C" fn proxy_on_log(_context_id: u32) {}

#[no_mangle]
pub extern "C" fn proxy_on_delete(context_id: u32) {
    let filter = CONTEXTS.with(|c| {
        let mut c = c.borrow_mut();
        c.parents.remove(&context_id);
        c.roots.remove(&context_id);
        c.filters.remove(&context_id)
    });
    if let Some(mut filter) = filter {
        filter.on_delete();
    }
}

/// The answer of a bridge call, on the root context of the plugin that made it: the
/// call's evaluation is completed (what Redis granted goes into the lease table even if
/// its request is gone), its request resumed or answered, then every request that
/// waited on it looks again.
#[no_mangle]
pub extern "C" fn proxy_on_http_call_response(
    root_id: u32,
    token: u32,
    _headers: u32,
    body_size: usize,
    _trailers: u32,
) {
    let Some(plugin) = with_root(root_id, |root| root.plugin().cloned()).flatten() else {
        return;
    };
    let commits = plugin.commits.borrow_mut().land(token);
    if let Some(commits) = commits {
        plugin.commits_answered(commits, body_size);
        return;
    }
    let Some(call) = plugin.flights.borrow_mut().land(token) else {
        return;
    };
    let now_us = host::now_us().unwrap_or(call.sent_at_us);
    plugin
        .metrics
        .bridge_latency(now_us.saturating_sub(call.sent_at_us));
    let reply = plugin.read_bridge_reply(&call, body_size);
    let mut eval = call.eval;
    plugin
        .engine
        .complete(&mut eval, &SharedData, call.sent_at_us, now_us, reply);
    let owner_here = CONTEXTS.with(|c| c.borrow().filters.contains_key(&call.owner));
    if owner_here && host::set_effective_context(call.owner).is_ok() {
        with_filter(call.owner, |f| f.on_own_call_answered(eval, now_us));
    } else {
        // Its request is gone; what the call decided is still counted, and what its
        // rules hold for a response that will never come is settled now (a
        // concurrency rule's place given back; an estimate given back too: the
        // request, paused for this call, never reached the upstream).
        plugin.metrics.record(&eval, now_us);
        for commit in &eval.commits {
            plugin.settle(commit, None);
        }
    }
    for waiter in call.waiters {
        if host::set_effective_context(waiter).is_ok() {
            with_filter(waiter, |f| f.on_flight_landed(now_us));
        }
    }
    let _ = host::set_effective_context(root_id);
}
