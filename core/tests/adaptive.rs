//! Adaptive concurrency limits through the engine, in simulated time: a rule's limit
//! follows the latency that workers observe and merge through shared data, per rule or
//! per key, and stays clamped to `max_in_flight` across reloads.
#![cfg(not(target_arch = "wasm32"))]

use crate::support;

use std::collections::BTreeMap;

use support::places::{end, end_due, Open};
use support::{engine, evaluate_on, user, T0};
use weir_core::adaptive::{Response, SharedRecord, LEARNING_TICK_MS};
use weir_core::engine::{Engine, PendingCommit};
use weir_core::store::memory::MemoryStore;
use weir_core::store::SharedStore;
use weir_core::time::{Micros, Span};
use weir_core::worker::Worker;

const MS: u64 = 1_000;

/// An adaptive rule for every request (interval 200 ms, `max_in_flight` 100), its store
/// and two workers.
fn adaptive_route() -> (Engine, MemoryStore, Vec<Worker>) {
    let e = engine(
        r#"{"rules":[{"name":"route","limit":{"algorithm":"concurrency","max_in_flight":100,
            "adaptive":{"interval":"200ms"}}}]}"#,
    );
    let store = MemoryStore::new();
    e.prepare(&store).unwrap();
    let workers = (0..2).map(|_| e.worker()).collect();
    (e, store, workers)
}

/// Every 100 ms, each worker merges its latencies: the limits they decide with after.
fn tick_if_due(
    e: &Engine,
    store: &MemoryStore,
    workers: &mut [Worker],
    now: u64,
    next_tick: &mut u64,
) -> Vec<u64> {
    if now < *next_tick {
        return Vec::new();
    }
    *next_tick = now + 100 * MS;
    workers
        .iter_mut()
        .filter_map(|worker| e.adapt(store, worker, Micros(now)).first().map(|a| a.limit))
        .collect()
}

/// A service that serves 8 requests at once in 20 ms and queues the rest, offered far
/// more than it can take by two workers: the adaptive limit, starting at 1, finds the
/// knee and stays near it.
#[test]
fn an_adaptive_limit_finds_the_knee_of_a_saturated_service() {
    let (e, store, mut workers) = adaptive_route();
    let mut open = Open::new();
    let mut limits = Vec::new();
    let mut now = T0;
    let mut next_tick = T0;
    for i in 0..60_000u64 {
        now += 500; // 2,000 requests a second offered
        end_due(&e, &store, &mut workers, &mut open, now);
        limits.extend(tick_if_due(&e, &store, &mut workers, now, &mut next_tick));
        let w = (i % 2) as usize;
        let eval = evaluate_on(&e, &store, &mut workers[w], &user("x"), now);
        if eval.denied_by.is_none() {
            // 20 ms of service, stretched by the queue beyond 8 in flight.
            let in_flight = open.len() as u64 + 1;
            let latency = 20 * MS * in_flight.max(8) / 8;
            open.insert((now + latency, i), (w, eval.commits[0].clone(), now));
        }
    }
    let settled = &limits[limits.len() / 2..];
    assert!(
        settled.iter().all(|&l| (8..=16).contains(&l)),
        "limits over time: {limits:?}"
    );
    // RateLimit-Policy names the limit the request met, not the ceiling of 100.
    let eval = evaluate_on(&e, &store, &mut workers[0], &user("x"), now);
    let quota = e.rule_verdicts(&eval)[0].policy.quota;
    assert_eq!(Some(&quota), limits.last(), "limits over time: {limits:?}");
}

/// A simulated service per key, in front of a `per_key` rule: `knees[k]` requests of key
/// `k` served at once in 20 ms, the rest queued; 2 workers, 2,000 requests a second
/// spread over the keys, each worker ticking every 100 ms. Returns, per key, the quota
/// (`RateLimit-Policy` q: the limit the request met) of its requests in the last half,
/// and the requests decided without a controller of their own.
fn per_key_service(
    config: &str,
    knees: &[u64],
    keys_active: impl Fn(u64) -> usize,
) -> (Vec<Vec<u64>>, u64) {
    let e = engine(config);
    let store = MemoryStore::new();
    e.prepare(&store).unwrap();
    let mut workers: Vec<Worker> = (0..2).map(|_| e.worker()).collect();
    // (ends, id) -> (worker, key, pending, started)
    let mut open: BTreeMap<(u64, u64), (usize, usize, PendingCommit, u64)> = BTreeMap::new();
    let mut in_flight = vec![0u64; knees.len()];
    let mut quotas = vec![Vec::new(); knees.len()];
    let mut without = 0;
    let (mut now, mut next_tick) = (T0, T0);
    const N: u64 = 40_000;
    for i in 0..N {
        now += 500;
        while let Some((&(ends, id), _)) = open.iter().next() {
            if ends > now {
                break;
            }
            let (w, k, pending, started) = open.remove(&(ends, id)).unwrap();
            e.observe_latency(&mut workers[w], &pending, Span(ends - started));
            end(&e, &store, &mut workers[w], &pending, ends);
            in_flight[k] -= 1;
        }
        if now >= next_tick {
            for worker in &mut workers {
                e.adapt(&store, worker, Micros(now));
            }
            next_tick = now + 100 * MS;
        }
        let k = (i as usize) % keys_active(i);
        let w = (i % 2) as usize;
        let eval = evaluate_on(&e, &store, &mut workers[w], &user(&format!("k{k}")), now);
        without += eval
            .reports
            .iter()
            .filter(|r| r.key_without_controller)
            .count() as u64;
        if i >= N / 2 && k < knees.len() {
            quotas[k].push(e.rule_verdicts(&eval)[0].policy.quota);
        }
        if eval.denied_by.is_none() && k < knees.len() {
            in_flight[k] += 1;
            let latency = 20 * MS * in_flight[k].max(knees[k]) / knees[k];
            open.insert((now + latency, i), (w, k, eval.commits[0].clone(), now));
        }
    }
    (quotas, without)
}

const PER_KEY: &str = r#"{"rules":[{"name":"tenants","key":[{"header":"x-user"}],
    "limit":{"algorithm":"concurrency","max_in_flight":100,
    "adaptive":{"interval":"200ms","per_key":true,"keys":8}}}]}"#;

#[test]
fn per_key_controllers_follow_each_keys_own_knee() {
    let (quotas, without) = per_key_service(PER_KEY, &[8, 2], |_| 2);
    assert_eq!(without, 0);
    let (a, b) = (&quotas[0], &quotas[1]);
    // Each settles between its own knee and twice it (one run: 10–12 and 2–3).
    assert!(
        a.iter().all(|q| (8..=16).contains(q)),
        "key with a knee of 8: {a:?}"
    );
    assert!(
        b.iter().all(|q| (2..=4).contains(q)),
        "key with a knee of 2: {b:?}"
    );
}

#[test]
fn one_controller_for_the_rule_cannot_serve_two_knees() {
    // The same service without per_key: one limit for both keys, which the knee-2 key
    // drives (its latency rises first) — what per_key is for.
    let config = PER_KEY.replace(r#","per_key":true,"keys":8"#, "");
    let (quotas, _) = per_key_service(&config, &[8, 2], |_| 2);
    // One run: 2–3 for the key whose service takes 8.
    assert!(quotas[0].iter().all(|q| *q <= 4), "{:?}", quotas[0]);
}

#[test]
fn keys_beyond_adaptive_keys_wait_for_a_record_and_take_an_idle_one() {
    // 2 records; 3 keys for the first half (the third finds both taken: decided against
    // max_in_flight), then only the third (the others' records go stale and it takes one).
    let config = PER_KEY.replace(r#""keys":8"#, r#""keys":2"#);
    let e = engine(&config);
    let store = MemoryStore::new();
    e.prepare(&store).unwrap();
    let mut worker = e.worker();
    let quota = |worker: &mut Worker, key: &str, now: u64| {
        let eval = evaluate_on(&e, &store, worker, &user(key), now);
        for pending in &eval.commits {
            e.observe_latency(worker, pending, Span(20 * MS));
            end(&e, &store, worker, pending, now);
        }
        let without = eval.reports[0].key_without_controller;
        (e.rule_verdicts(&eval)[0].policy.quota, without)
    };
    let mut now = T0;
    assert_eq!(quota(&mut worker, "k0", now), (1, false), "initial: min");
    assert_eq!(quota(&mut worker, "k1", now), (1, false));
    assert_eq!(quota(&mut worker, "k2", now), (100, true), "no record left");
    // k0 and k1 stay busy for a second: k2 still has none.
    for _ in 0..10 {
        now += 100 * MS;
        quota(&mut worker, "k0", now);
        quota(&mut worker, "k1", now);
        assert_eq!(quota(&mut worker, "k2", now), (100, true));
        e.adapt(&store, &mut worker, Micros(now));
    }
    // Then only k2: the worker keeps 2 keys, so k2 makes room by forgetting k0 and k1
    // (idle, nothing to merge); nobody merges into their records any more, which go
    // stale 3 s after the last merge (3 intervals, and at least 3 s of wall time), and
    // k2 takes one on a tick.
    let mut got = None;
    for step in 0..80 {
        now += 100 * MS;
        let (q, without) = quota(&mut worker, "k2", now);
        e.adapt(&store, &mut worker, Micros(now));
        if !without {
            got = Some((step, q));
            break;
        }
    }
    let (step, q) = got.expect("k2 never got a controller");
    assert!((28..=32).contains(&step), "took {step} ticks");
    assert_eq!(q, 1, "a new controller starts at initial");
}

/// The shared-data key of a `per_key` rule's record `index` (or the rule's record).
fn record_key(rule: &str, index: Option<u32>) -> String {
    match index {
        Some(i) => format!("weir/v1/{rule}/adaptive/{i}"),
        None => format!("weir/v1/{rule}/adaptive"),
    }
}

fn read_record(store: &MemoryStore, key: &str) -> Option<SharedRecord> {
    let (value, _) = store.get(key).unwrap();
    SharedRecord::decode(&value?)
}

/// Defect 6: with an `interval` below about three ticks, a busy key's record looked
/// stale between two ticks (untouched for three intervals) and another key took it:
/// 32 owner changes in 5 s. A record is free only once untouched for
/// `Adaptive::stale_after_us` of wall time, whatever the interval.
#[test]
fn a_busy_keys_controller_stays_its_own_with_an_interval_of_20ms() {
    let config = PER_KEY
        .replace(r#""interval":"200ms""#, r#""interval":"20ms""#)
        .replace(r#""keys":8"#, r#""keys":1"#);
    let e = engine(&config);
    let store = MemoryStore::new();
    e.prepare(&store).unwrap();
    let key = record_key("tenants", Some(0));
    let mut workers: Vec<Worker> = (0..2).map(|_| e.worker()).collect();
    let mut open = Open::new();
    let (mut owner, mut owner_changes, mut busy_without) = (None, 0, 0);
    // Both workers tick together, every 100 ms: five intervals apart.
    let mut next_tick = [T0, T0];
    let mut now = T0;
    for i in 0..5_000u64 {
        now += MS;
        end_due(&e, &store, &mut workers, &mut open, now);
        for (w, worker) in workers.iter_mut().enumerate() {
            if now >= next_tick[w] {
                e.adapt(&store, worker, Micros(now));
                next_tick[w] = now + 100 * MS;
            }
        }
        let w = (i % 2) as usize;
        let busy = evaluate_on(&e, &store, &mut workers[w], &user("busy"), now);
        busy_without += u64::from(busy.reports[0].key_without_controller);
        if busy.denied_by.is_none() {
            open.insert((now + 5 * MS, i), (w, busy.commits[0].clone(), now));
        }
        if i % 37 == 0 {
            // Another key now and then, on a worker that has not seen it yet (there
            // are many): it looks for a record, and must find the only one in use.
            let mut third = e.worker();
            let other = evaluate_on(&e, &store, &mut third, &user("other"), now);
            for pending in &other.commits {
                end(&e, &store, &mut third, pending, now);
            }
        }
        let now_owner = read_record(&store, &key).map(|r| r.owner);
        if owner.is_some() && now_owner != owner {
            owner_changes += 1;
        }
        owner = now_owner;
    }
    assert_eq!(
        (owner_changes, busy_without),
        (0, 0),
        "owner changes, busy requests without a controller"
    );
}

/// Defect 6: after a reload that lowers `max_in_flight` from 50 to 10, a key whose
/// controller had reached 50 was decided against 50 until the next tick. The limit of
/// the moment is clamped to the rule's `max_in_flight` at every decision.
#[test]
fn a_reload_lowering_max_in_flight_from_50_to_10_admits_at_most_10() {
    for per_key in [true, false] {
        let config = |max: u64| {
            let keyed = if per_key {
                r#","per_key":true,"keys":1"#
            } else {
                ""
            };
            format!(
                r#"{{"rules":[{{"name":"tenants","key":[{{"header":"x-user"}}],
                "limit":{{"algorithm":"concurrency","max_in_flight":{max},
                "adaptive":{{"interval":"200ms"{keyed}}}}}}}]}}"#
            )
        };
        let store = MemoryStore::new();
        let before = engine(&config(50));
        before.prepare(&store).unwrap();
        let mut w = before.worker();
        for pending in &evaluate_on(&before, &store, &mut w, &user("k"), T0).commits {
            end(&before, &store, &mut w, pending, T0);
        }
        before.adapt(&store, &mut w, Micros(T0));
        // The controller had grown to 50.
        let key = record_key("tenants", per_key.then_some(0));
        let (value, version) = store.get(&key).unwrap();
        let mut record = SharedRecord::decode(&value.unwrap()).unwrap();
        record.controller.limit_milli = 50_000;
        store
            .compare_and_set(&key, &record.encode(), version.unwrap())
            .unwrap();
        // Reloaded: the same rule with max_in_flight 10, decided before any tick.
        let after = engine(&config(10));
        after.prepare(&store).unwrap();
        let mut w = after.worker();
        let admitted = (0..50)
            .filter(|i| {
                let eval = evaluate_on(&after, &store, &mut w, &user("k"), T0 + MS + i);
                assert!(eval.verdicts[0].decision.limit <= 10);
                eval.denied_by.is_none()
            })
            .count();
        assert!(admitted <= 10, "per_key {per_key}: {admitted} admitted");
    }
}

/// Defect 9: every response's latency was sampled, fast failures included, so an
/// interval of fast failures dragged the baseline down and the limit then halved
/// towards `min` against a service that had recovered. Only upstream answers from 100
/// to 399 are sampled now. A service of 8 × 20 ms offered 2,000 requests a second;
/// from 15 s to 17 s nine requests in ten fail in 1 ms with a 503 (a dependency down).
#[test]
fn an_interval_of_fast_failures_does_not_halve_the_limit() {
    let (e, store, mut workers) = adaptive_route();
    // (ends, id) -> (worker, release, start, status)
    let mut open: BTreeMap<(u64, u64), (usize, PendingCommit, u64, u16)> = BTreeMap::new();
    let mut limits = Vec::new();
    let (mut now, mut next_tick) = (T0, T0);
    let failing = T0 + 15_000 * MS..T0 + 17_000 * MS;
    for i in 0..60_000u64 {
        now += 500;
        while let Some((&(ends, id), _)) = open.iter().next() {
            if ends > now {
                break;
            }
            let (w, pending, started, status) = open.remove(&(ends, id)).unwrap();
            let response = Response {
                status,
                from_upstream: Some(true),
            };
            e.observe_response(&mut workers[w], &pending, response, Span(ends - started));
            end(&e, &store, &mut workers[w], &pending, ends);
        }
        let limit = tick_if_due(&e, &store, &mut workers, now, &mut next_tick);
        limits.extend(limit.into_iter().map(|l| (now - T0, l)));
        let w = (i % 2) as usize;
        let eval = evaluate_on(&e, &store, &mut workers[w], &user("x"), now);
        if eval.denied_by.is_some() {
            continue;
        }
        let commit = eval.commits[0].clone();
        if failing.contains(&now) && i % 10 != 0 {
            open.insert((now + MS, i), (w, commit, now, 503));
            continue;
        }
        // 20 ms of service, stretched by the queue beyond 8 served.
        let served = open.values().filter(|o| o.3 == 200).count() as u64 + 1;
        let latency = 20 * MS * served.max(8) / 8;
        open.insert((now + latency, i), (w, commit, now, 200));
    }
    let before: Vec<u64> = limits
        .iter()
        .filter(|(t, _)| (10_000 * MS..15_000 * MS).contains(t))
        .map(|(_, l)| *l)
        .collect();
    let after: Vec<u64> = limits
        .iter()
        .filter(|(t, _)| *t >= 15_000 * MS)
        .map(|(_, l)| *l)
        .collect();
    let settled = *before.iter().min().unwrap();
    assert!(settled >= 8, "before: {before:?}");
    let lowest = *after.iter().min().unwrap();
    assert!(
        lowest * 4 >= settled * 3,
        "settled at {settled} or more, then down to {lowest}: {after:?}"
    );
}

/// `clients` closed-loop clients (each sends its next request when the last is
/// answered, a rejected one 10 ms later) for `secs` seconds from a cold start, in front
/// of a service that serves 8 at once in 20 ms and queues the rest; the rule's
/// interval is 500 ms (the benchmark's) and two workers tick as the plugin does (every
/// 100 ms, every 10 ms while a controller learns), the first tick `first_tick_ms` after
/// the load begins. Returns (answered, rejected).
fn closed_loop_from_cold(clients: u64, secs: u64, first_tick_ms: u64) -> (u64, u64) {
    let e = engine(
        r#"{"rules":[{"name":"route","limit":{"algorithm":"concurrency","max_in_flight":200,
            "adaptive":{"latency":"p90","interval":"500ms"}}}]}"#,
    );
    let store = MemoryStore::new();
    e.prepare(&store).unwrap();
    let mut workers: Vec<Worker> = (0..2).map(|_| e.worker()).collect();
    let mut open = Open::new();
    // Each client's next send; a client with a request open has none.
    let mut next_send: Vec<Option<u64>> = (0..clients).map(|c| Some(T0 + c * 100)).collect();
    let mut client_of = BTreeMap::new();
    let (mut answered, mut rejected) = (0, 0);
    let mut next_tick = T0 + first_tick_ms * MS;
    let end_at = T0 + secs * 1_000 * MS;
    let mut now = T0;
    let mut id = 0u64;
    while now < end_at {
        now += 100;
        // Answers due: their clients send again at once.
        let due: Vec<(u64, u64)> = open.range(..(now + 1, 0)).map(|(k, _)| *k).collect();
        end_due(&e, &store, &mut workers, &mut open, now);
        for (ends, request) in due {
            let client: usize = client_of.remove(&request).unwrap();
            next_send[client] = Some(ends);
            answered += 1;
        }
        if now >= next_tick {
            // As the plugin does: every 10 ms while a controller learns, else 100 ms.
            let adapted: Vec<_> = workers
                .iter_mut()
                .flat_map(|worker| e.adapt(&store, worker, Micros(now)))
                .collect();
            let learning = adapted.iter().any(|a| a.learning);
            next_tick = now
                + if learning {
                    LEARNING_TICK_MS as u64
                } else {
                    100
                } * MS;
        }
        for (client, next) in next_send.iter_mut().enumerate() {
            if next.is_none_or(|at| at > now) {
                continue;
            }
            id += 1;
            let w = client % 2;
            let eval = evaluate_on(&e, &store, &mut workers[w], &user("x"), now);
            if eval.denied_by.is_some() {
                rejected += 1;
                *next = Some(now + 10 * MS);
                continue;
            }
            let in_service = open.len() as u64 + 1;
            let latency = 20 * MS * in_service.max(8) / 8;
            open.insert((now + latency, id), (w, eval.commits[0].clone(), now));
            client_of.insert(id, client);
            *next = None;
        }
    }
    (answered, rejected)
}

/// Issue 35: eight clients in front of a service that serves eight at once need no
/// limiter, yet weir's adaptive limit rejected 21.8 % of their requests in the
/// benchmark: it starts at its floor (1) and doubled once per interval (500 ms), so the
/// clients were turned away for about 2 s (19.2 % here on that code). Slow start now
/// steps as soon as it holds a few latencies with the limit in use, and the workers
/// tick faster while it does.
#[test]
fn eight_clients_at_the_knee_are_rarely_turned_away_from_a_cold_start() {
    for first_tick_ms in [0, 37, 71, 99] {
        let (answered, rejected) = closed_loop_from_cold(8, 10, first_tick_ms);
        let share = rejected as f64 / (answered + rejected) as f64;
        eprintln!("first tick at {first_tick_ms} ms: {rejected} rejected, {answered} answered");
        assert!(
            share <= 0.035,
            "first tick at {first_tick_ms} ms: {rejected} rejected, {answered} answered \
             ({:.1} %)",
            share * 100.0
        );
    }
}
