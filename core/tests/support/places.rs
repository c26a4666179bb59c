//! Places of concurrency rules in simulated time: admit a request on a worker, end its
//! stream, end every stream due.
#![allow(dead_code)]

use super::{evaluate_on, FakeRequest};
use std::collections::BTreeMap;
use weir_core::engine::{Engine, PendingCommit};
use weir_core::store::memory::MemoryStore;
use weir_core::time::{Micros, Span};
use weir_core::worker::Worker;

/// Admits one request on `worker`; its pending release when allowed.
pub fn admit(
    e: &Engine,
    store: &MemoryStore,
    worker: &mut Worker,
    req: &FakeRequest,
    now: u64,
) -> Option<PendingCommit> {
    let eval = evaluate_on(e, store, worker, req, now);
    if eval.denied_by.is_some() {
        assert!(eval.commits.is_empty(), "a denial holds nothing");
        return None;
    }
    assert_eq!(eval.commits.len(), 1);
    eval.commits.into_iter().next()
}

/// The stream of `open`, admitted by `worker`, ends: its place is given back.
pub fn end(e: &Engine, store: &MemoryStore, worker: &mut Worker, open: &PendingCommit, now: u64) {
    assert_eq!(e.end_in_flight(store, worker, open, Micros(now)), Ok(true));
}

/// Requests open by (end, id): the worker that admitted each, its release, its start.
pub type Open = BTreeMap<(u64, u64), (usize, PendingCommit, u64)>;

/// Ends the requests of `open` due by `now`: their latencies observed, their places
/// given back by the workers that admitted them.
pub fn end_due(e: &Engine, store: &MemoryStore, workers: &mut [Worker], open: &mut Open, now: u64) {
    while let Some((&(ends, id), _)) = open.iter().next() {
        if ends > now {
            break;
        }
        let (w, pending, started) = open.remove(&(ends, id)).unwrap();
        e.observe_latency(&mut workers[w], &pending, Span(ends - started));
        end(e, store, &mut workers[w], &pending, ends);
    }
}
