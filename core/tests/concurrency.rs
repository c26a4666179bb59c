//! Concurrency limits through the engine, in simulated time: requests of a key are
//! admitted while fewer than `max_in_flight` are open, and each gives its place back
//! when its stream ends (through [`Engine::end_in_flight`], which the filter calls for
//! every end: response complete, reset, denial by a later rule) — or, refused, on a
//! later tick; a dead worker's places are reclaimed. Adaptive limits: `adaptive.rs`.
#![cfg(not(target_arch = "wasm32"))]

use crate::support;

use std::collections::BTreeMap;

use support::places::{admit, end};
use support::{engine, evaluate, evaluate_on, user, Rng, T0};
use weir_core::adaptive::{Response, LEARNING_TICK_MS};
use weir_core::concurrency::{place_epoch, PLACE_EPOCH_US};
use weir_core::engine::{Engine, PendingCommit};
use weir_core::store::memory::MemoryStore;
use weir_core::store::{StoreError, UpdateError, MAX_CAS_ATTEMPTS};
use weir_core::time::{Micros, Span};
use weir_core::worker::Worker;

const MS: u64 = 1_000;

fn fixed(max: u64) -> Engine {
    engine(&format!(
        r#"{{"rules":[{{"name":"inflight","key":[{{"header":"x-user"}}],
            "limit":{{"algorithm":"concurrency","max_in_flight":{max}}}}}]}}"#
    ))
}

#[test]
fn exactly_max_in_flight_per_key_and_other_keys_unaffected() {
    let e = fixed(3);
    let store = MemoryStore::new();
    e.prepare(&store).unwrap();
    let w = &mut e.worker();
    let open: Vec<_> = (0..5)
        .filter_map(|i| admit(&e, &store, w, &user("alice"), T0 + i))
        .collect();
    assert_eq!(open.len(), 3);
    let denied = evaluate(&e, &store, &user("alice"), T0 + 10);
    let verdict = denied.verdicts[0].decision;
    assert_eq!((verdict.limit, verdict.remaining), (3, 0));
    assert_eq!(verdict.retry_after_ns, Some(1_000_000_000));
    // Bob has his own three.
    assert_eq!(
        (0..3)
            .filter_map(|i| admit(&e, &store, w, &user("bob"), T0 + 20 + i))
            .count(),
        3
    );
    // One of Alice's ends: exactly one more fits, long before any window would pass.
    end(&e, &store, w, &open[1], T0 + 30);
    assert!(admit(&e, &store, w, &user("alice"), T0 + 31).is_some());
    assert!(admit(&e, &store, w, &user("alice"), T0 + 32).is_none());
}

/// Many workers, requests of random lengths, some ending early (aborted), 10,000 in
/// all: at no instant are more than `max_in_flight` open, and once every stream has
/// ended the key is free again — nothing leaked.
#[test]
fn ten_thousand_requests_with_aborts_never_exceed_the_limit_and_leak_nothing() {
    let e = fixed(8);
    let store = MemoryStore::new();
    e.prepare(&store).unwrap();
    let mut workers: Vec<Worker> = (0..4).map(|_| e.worker()).collect();
    let mut rng = Rng(0x5eed_c0ff_ee00);
    let mut open: BTreeMap<(u64, u64), (usize, PendingCommit)> = BTreeMap::new();
    let (mut admitted, mut most_open) = (0, 0);
    let mut now = T0;
    for i in 0..10_000u64 {
        now += rng.below(2 * MS);
        while let Some((&(ends, id), _)) = open.iter().next() {
            if ends > now {
                break;
            }
            let (w, pending) = open.remove(&(ends, id)).unwrap();
            end(&e, &store, &mut workers[w], &pending, ends);
        }
        let w = rng.below(4) as usize;
        let eval = evaluate_on(&e, &store, &mut workers[w], &user("tenant"), now);
        if eval.denied_by.is_none() {
            admitted += 1;
            // A third are aborted by their client after a few ms; the rest last up to 50.
            let length = if rng.below(3) == 0 {
                rng.below(5 * MS)
            } else {
                rng.below(50 * MS)
            };
            open.insert((now + length, i), (w, eval.commits[0].clone()));
            most_open = most_open.max(open.len());
        }
        assert!(open.len() <= 8, "{} open at {now}", open.len());
    }
    for ((ends, _), (w, pending)) in std::mem::take(&mut open) {
        end(&e, &store, &mut workers[w], &pending, ends);
    }
    assert_eq!(most_open, 8, "the limit was reached");
    assert!(admitted > 1_000, "{admitted}");
    // Nothing leaked: 8 fit again, the 9th does not.
    let again = (0..9)
        .filter_map(|k| {
            admit(
                &e,
                &store,
                &mut workers[0],
                &user("tenant"),
                now + MS * 100 + k,
            )
        })
        .count();
    assert_eq!(again, 8);
}

#[test]
fn a_later_rule_denying_gives_the_place_back_through_the_commit() {
    // The filter settles an admission with 0 when a later rule denies the request.
    let e = engine(
        r#"{"rules":[
            {"name":"inflight","limit":{"algorithm":"concurrency","max_in_flight":1}},
            {"name":"rate","limit":{"algorithm":"fixed_window","limit":1,"window":"1m"}}]}"#,
    );
    let store = MemoryStore::new();
    e.prepare(&store).unwrap();
    let w = &mut e.worker();
    let first = admit(&e, &store, w, &user("a"), T0).unwrap();
    end(&e, &store, w, &first, T0 + 1);
    let denied = evaluate_on(&e, &store, w, &user("a"), T0 + 2);
    assert_eq!(denied.denied_by.map(|r| r.0), Some(1));
    assert_eq!(
        denied.commits.len(),
        1,
        "the concurrency rule's place to give back"
    );
    end(&e, &store, w, &denied.commits[0], T0 + 3);
    // The place is free: the concurrency rule admits again (the window still denies).
    let again = evaluate_on(&e, &store, w, &user("a"), T0 + 4);
    assert_eq!(again.denied_by.map(|r| r.0), Some(1));
}

#[test]
fn shadow_concurrency_rules_count_but_never_deny() {
    let e = engine(
        r#"{"rules":[{"name":"inflight","shadow":true,
            "limit":{"algorithm":"concurrency","max_in_flight":1}}]}"#,
    );
    let store = MemoryStore::new();
    e.prepare(&store).unwrap();
    let first = evaluate(&e, &store, &user("a"), T0);
    let second = evaluate(&e, &store, &user("a"), T0 + 1);
    assert!(first.denied_by.is_none() && second.denied_by.is_none());
    assert_eq!(second.shadow_limited.len(), 1);
    // Only the admitted one holds a place.
    assert_eq!((first.commits.len(), second.commits.len()), (1, 0));
}

/// Defect 5: a give-back that lost every CAS race (or met a store error) was never
/// retried, and the key was denied an hour later with nothing in flight. Now the worker
/// keeps it marked ended and gives it back on its next tick.
#[test]
fn a_give_back_refused_by_shared_data_is_finished_on_the_next_tick() {
    let e = fixed(2);
    let store = MemoryStore::new();
    e.prepare(&store).unwrap();
    let w = &mut e.worker();
    let a = admit(&e, &store, w, &user("k"), T0).unwrap();
    let b = admit(&e, &store, w, &user("k"), T0 + 1).unwrap();
    // Every attempt of a's give-back loses its race.
    store.fail_next_writes(MAX_CAS_ATTEMPTS, StoreError::CasMismatch);
    assert_eq!(
        e.end_in_flight(&store, w, &a, Micros(T0 + 2)),
        Err(UpdateError::GaveUp {
            attempts: MAX_CAS_ATTEMPTS
        })
    );
    // b's give-back meets a host error.
    store.fail_next_writes(1, StoreError::Host(7));
    assert!(e.end_in_flight(&store, w, &b, Micros(T0 + 3)).is_err());
    // Until then both still count: another worker is denied.
    let mut other = e.worker();
    assert!(admit(&e, &store, &mut other, &user("k"), T0 + 4).is_none());
    // The next tick gives both back.
    let tended = e.tend_places(&store, w, Micros(T0 + 100 * MS));
    assert_eq!((tended.failed, tended.given_back), (0, 2));
    assert!(w.places.is_empty(), "{:?}", w.places);
    // The key is free: two fit again.
    let open: Vec<_> = (0..3)
        .filter_map(|i| admit(&e, &store, &mut other, &user("k"), T0 + 200 * MS + i))
        .collect();
    assert_eq!(open.len(), 2);
}

/// A key of `max_in_flight` 1 whose only request ended at T0 + 1 and whose give-back
/// lost every CAS race: still marked ended in the worker.
fn one_refused_give_back() -> (Engine, MemoryStore, Worker) {
    let e = fixed(1);
    let store = MemoryStore::new();
    e.prepare(&store).unwrap();
    let mut w = e.worker();
    let a = admit(&e, &store, &mut w, &user("k"), T0).unwrap();
    store.fail_next_writes(MAX_CAS_ATTEMPTS, StoreError::CasMismatch);
    assert!(e.end_in_flight(&store, &mut w, &a, Micros(T0 + 1)).is_err());
    (e, store, w)
}

/// A worker's own write of a key carries its ended places: a give-back that failed is
/// done by the worker's next admission of the key, tick or not.
#[test]
fn a_workers_next_admission_of_the_key_gives_its_ended_places_back() {
    let (e, store, mut worker) = one_refused_give_back();
    let w = &mut worker;
    assert!(admit(&e, &store, w, &user("k"), T0 + 2).is_some());
    assert_eq!(w.places.units(), 1);
}

/// Defect 5, the tick alone: a give-back that failed is retried on the tick even if no
/// request of the key comes, and a tick that fails too leaves it for the next.
#[test]
fn a_failed_give_back_waits_in_the_worker_until_a_tick_succeeds() {
    let (e, store, mut worker) = one_refused_give_back();
    let w = &mut worker;
    assert_eq!(w.places.units(), 1, "kept, marked ended");
    assert!(admit(&e, &store, &mut e.worker(), &user("k"), T0 + 2).is_none());
    // The first tick fails as well.
    store.fail_next_writes(1, StoreError::Host(3));
    let tended = e.tend_places(&store, w, Micros(T0 + 100 * MS));
    assert_eq!((tended.failed, tended.given_back), (1, 0));
    let tended = e.tend_places(&store, w, Micros(T0 + 200 * MS));
    assert_eq!((tended.failed, tended.given_back), (0, 1));
    assert!(w.places.is_empty());
    assert!(admit(&e, &store, &mut e.worker(), &user("k"), T0 + 201 * MS).is_some());
}

/// Defect 5, leaked places: a VM that dies with requests in flight never gives them
/// back. Its places are dropped once no live worker re-counted them for a whole epoch:
/// at the start of the second epoch after the one they were counted in (at most
/// `2 × PLACE_EPOCH_US`). A live worker's place, re-counted on its ticks, stays.
#[test]
fn places_of_a_dead_worker_come_back_within_two_epochs_and_live_ones_stay() {
    let e = fixed(3);
    let store = MemoryStore::new();
    e.prepare(&store).unwrap();
    let mut live = e.worker();
    let held = admit(&e, &store, &mut live, &user("k"), T0).unwrap();
    {
        let mut dead = e.worker();
        for i in 1..=2 {
            assert!(admit(&e, &store, &mut dead, &user("k"), T0 + i).is_some());
        }
        // The VM dies: its worker and its requests are gone, nothing is given back.
    }
    let back_at = (place_epoch(T0) + 2) * PLACE_EPOCH_US;
    assert!(back_at - T0 <= 2 * PLACE_EPOCH_US);
    let mut probe = e.worker();
    let mut now = T0;
    let mut first_admitted = None;
    while now < T0 + 30 * PLACE_EPOCH_US && first_admitted.is_none() {
        now += 100 * MS;
        e.tend_places(&store, &mut live, Micros(now));
        if let Some(open) = admit(&e, &store, &mut probe, &user("k"), now) {
            first_admitted = Some(now);
            end(&e, &store, &mut probe, &open, now);
        }
    }
    let first_admitted = first_admitted.expect("the dead worker's places never came back");
    assert!(
        first_admitted >= back_at && first_admitted < back_at + 100 * MS,
        "back {} ms after the admission, expected {} ms",
        (first_admitted - T0) / MS,
        (back_at - T0) / MS
    );
    // Thirty seconds on, the live worker's place still counts: exactly 2 fit.
    let mut later = T0 + 30 * PLACE_EPOCH_US;
    while now < later {
        now += 100 * MS;
        e.tend_places(&store, &mut live, Micros(now));
    }
    later += 1;
    let open: Vec<_> = (0..3)
        .filter_map(|i| admit(&e, &store, &mut probe, &user("k"), later + i))
        .collect();
    assert_eq!(open.len(), 2);
    // And it is given back when its stream ends.
    end(&e, &store, &mut live, &held, later + 10);
    assert!(admit(&e, &store, &mut probe, &user("k"), later + 11).is_some());
}

/// One random run of [`random_walks_never_exceed_the_limit_and_give_every_place_back`]:
/// its seed, and what it did, for a failure's message.
#[derive(Debug, Default)]
struct Walk {
    admitted: u64,
    failed_give_backs: u64,
    dead_workers: u64,
    reloads: u64,
}

/// The config of a random walk: `max` in flight per key, costs from a header, a fixed
/// limit (`kind` 0), one adaptive controller (1) or one per key (2), the controller's
/// parameters drawn over the whole range the config accepts (intervals up to 2 s: a walk
/// lasts seconds); its `min`, when adaptive.
fn walk_config(rng: &mut Rng, kind: u64, max: u64) -> (String, Option<u64>) {
    if kind == 0 {
        return (limit_config(max, ""), None);
    }
    let min = 1 + rng.below(max);
    let initial = min + rng.below(max - min + 1);
    // Log-uniform from 10 ms to 2 s.
    let interval_ms = (10.0 * 200f64.powf(rng.below(1_001) as f64 / 1_000.0)).round();
    let latency = match rng.below(4) {
        0 => "p99.9".to_string(),
        _ => format!("p{}", 1 + rng.below(99)),
    };
    let smoothing = (1 + rng.below(1_000)) as f64 / 1_000.0;
    let tolerance = 1.0 + rng.below(9_001) as f64 / 1_000.0;
    let per_key = match kind {
        1 => String::new(),
        _ => format!(r#","per_key":true,"keys":{}"#, 1 + rng.below(4)),
    };
    let adaptive = format!(
        r#","adaptive":{{"latency":"{latency}","interval":"{interval_ms}ms","min":{min},
        "initial":{initial},"smoothing":{smoothing},"tolerance":{tolerance}{per_key}}}"#
    );
    (limit_config(max, &adaptive), Some(min))
}

fn limit_config(max: u64, adaptive: &str) -> String {
    format!(
        r#"{{"rules":[{{"name":"walk","key":[{{"header":"x-user"}}],
        "cost":{{"header":"x-cost","default":1,"max":{max}}},
        "limit":{{"algorithm":"concurrency","max_in_flight":{max}{adaptive}}}}}]}}"#
    )
}

/// Defects 5 and 6, searched: random configs (`max_in_flight` 1–8, costs 1–3, fixed or
/// adaptive, one controller or one per key, the controller's parameters over the whole
/// range the config accepts), 1–4 workers, 1–3 keys, requests of random lengths (a
/// third aborted early) or, half the walks, the lengths of a service that slows past a
/// knee, answered by the upstream, with a 503 or by a local reply; CAS mismatches and
/// host errors injected at random into admissions and give-backs, workers that die with
/// requests in flight, reloads that change `max_in_flight` and the controller, workers
/// ticking every 10–500 ms and every 10 ms while a controller they merged into learns
/// (as the plugin does). At every admission the units admitted with a place and still
/// open (on live workers) stay within the limit the request met (`RateLimit-Policy`'s
/// quota), which is within [`min`, `max_in_flight`] (an admission the store failed is
/// let through without a place, as for every local rule, and is not counted); once
/// every stream has ended, every key is free again within the documented bound: at
/// once for places given back, by the next tick for give-backs shared data refused,
/// and within 2 epochs (`2 × PLACE_EPOCH_US`) for the places of dead workers.
///
/// `WEIR_CONCURRENCY_WALKS` walks (300 by default) from `WEIR_CONCURRENCY_SEED` (1).
#[test]
fn random_walks_never_exceed_the_limit_and_give_every_place_back() {
    let env = |name: &str, default: u64| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let walks = env("WEIR_CONCURRENCY_WALKS", 300);
    let first = env("WEIR_CONCURRENCY_SEED", 1);
    let mut total = Walk::default();
    for seed in first..first + walks {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ seed.wrapping_mul(0x2545_f491));
        let walk = random_walk(&mut rng);
        let walk = walk.unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        assert!(walk.admitted > 0, "seed {seed}: {walk:?}");
        total.admitted += walk.admitted;
        total.failed_give_backs += walk.failed_give_backs;
        total.dead_workers += walk.dead_workers;
        total.reloads += walk.reloads;
    }
    eprintln!("{walks} walks from seed {first}: {total:?}");
}

/// One time in `one_in`, the next 1 to 32 writes fail: CAS mismatches (as many races
/// lost) or host errors.
fn maybe_fail_writes(rng: &mut Rng, store: &MemoryStore, one_in: u64) {
    if rng.below(one_in) != 0 {
        return;
    }
    let error = if rng.below(2) == 0 {
        StoreError::CasMismatch
    } else {
        StoreError::Host(1)
    };
    store.fail_next_writes(1 + rng.below(u64::from(MAX_CAS_ATTEMPTS)) as u32, error);
}

fn random_walk(rng: &mut Rng) -> Result<Walk, String> {
    let mut walk = Walk::default();
    let store = MemoryStore::new();
    let mut max = 1 + rng.below(8);
    let kind = rng.below(3);
    let (config, mut min) = walk_config(rng, kind, max);
    let e = engine(&config);
    e.prepare(&store).unwrap();
    let engines_made = 1 + rng.below(2);
    let workers_n = 1 + rng.below(4) as usize;
    let keys = 1 + rng.below(3);
    // Workers: (engine generation, worker, next tick, alive). A reload makes new
    // workers on the new engine; the old ones keep their requests and their ticks.
    let mut engines = vec![e];
    let mut workers: Vec<(usize, Worker, u64, bool)> = (0..workers_n)
        .map(|_| (0, engines[0].worker(), T0, true))
        .collect();
    // (ends, id) -> (worker, release, cost, key)
    let mut open: BTreeMap<(u64, u64), (usize, PendingCommit, u64, u64)> = BTreeMap::new();
    let tick_every = (10 + rng.below(490)) * MS;
    // Half the walks: a service that serves `knee` units at once, each stream 5–25 ms,
    // longer by the queue past the knee.
    let knee = (rng.below(2) == 0).then(|| 1 + rng.below(8));
    let mut now = T0;
    let mut last_death = None;
    for i in 0..400u64 {
        now += if rng.below(20) == 0 {
            rng.below(3 * PLACE_EPOCH_US)
        } else {
            rng.below(20 * MS)
        };
        // Streams that ended give their places back (maybe refused by shared data).
        while let Some((&(ends, id), _)) = open.iter().next() {
            if ends > now {
                break;
            }
            let (w, pending, _, _) = open.remove(&(ends, id)).unwrap();
            maybe_fail_writes(rng, &store, 8);
            let (generation, worker, _, _) = &mut workers[w];
            let response = match rng.below(10) {
                0 => Response {
                    status: 503,
                    from_upstream: Some(true),
                },
                1 => Response {
                    status: 429,
                    from_upstream: Some(false),
                },
                _ => Response {
                    status: 200,
                    from_upstream: Some(true),
                },
            };
            let latency = Span(ends.saturating_sub(pending.counted_at.us()));
            engines[*generation].observe_response(worker, &pending, response, latency);
            if engines[*generation]
                .end_in_flight(&store, worker, &pending, Micros(ends))
                .is_err()
            {
                walk.failed_give_backs += 1;
            }
            store.fail_next_writes(0, StoreError::CasMismatch);
        }
        for (generation, worker, next_tick, alive) in &mut workers {
            if *alive && now >= *next_tick {
                engines[*generation].tend_places(&store, worker, Micros(now));
                let adapted = engines[*generation].adapt(&store, worker, Micros(now));
                *next_tick = now
                    + if adapted.iter().any(|a| a.learning) {
                        u64::from(LEARNING_TICK_MS) * MS
                    } else {
                        tick_every
                    };
            }
        }
        match rng.below(100) {
            // A worker dies with its requests: they are gone, nothing is given back.
            0 => {
                let w = rng.below(workers.len() as u64) as usize;
                if workers[w].3 {
                    workers[w].3 = false;
                    open.retain(|_, o| o.0 != w);
                    walk.dead_workers += 1;
                    last_death = Some(now);
                    let generation = engines.len() - 1;
                    workers.push((generation, engines[generation].worker(), now, true));
                }
                continue;
            }
            // A reload: a new max_in_flight, new workers; the old keep their requests.
            1 if (engines.len() as u64) <= engines_made => {
                max = 1 + rng.below(8);
                let kind = rng.below(3);
                let (config, next_min) = walk_config(rng, kind, max);
                min = next_min;
                let next = engine(&config);
                next.prepare(&store).unwrap();
                engines.push(next);
                let generation = engines.len() - 1;
                for _ in 0..workers_n {
                    workers.push((generation, engines[generation].worker(), now, true));
                }
                walk.reloads += 1;
                continue;
            }
            _ => {}
        }
        // A request, on a live worker of the current engine.
        let generation = engines.len() - 1;
        let live: Vec<usize> = (0..workers.len())
            .filter(|&w| workers[w].0 == generation && workers[w].3)
            .collect();
        let w = live[rng.below(live.len() as u64) as usize];
        let cost = 1 + rng.below(3);
        let key = rng.below(keys);
        let req = user(&format!("u{key}")).header("x-cost", cost.to_string());
        maybe_fail_writes(rng, &store, 10);
        let eval = evaluate_on(&engines[generation], &store, &mut workers[w].1, &req, now);
        store.fail_next_writes(0, StoreError::CasMismatch);
        let Some(pending) = eval.commits.first().cloned() else {
            continue;
        };
        walk.admitted += 1;
        // What the request costs: its header, capped at the rule's `max`.
        let cost = pending.reserved;
        let open_of_key: u64 = open.values().filter(|o| o.3 == key).map(|o| o.2).sum();
        // The limit the request met: the adaptive one of the moment, or the fixed one.
        let met = eval.verdicts[0].decision.limit;
        let at = (now - T0) / MS;
        if open_of_key + cost > met || met > max {
            return Err(format!(
                "{} units open after admitting {cost} at {at} ms, against a limit of {met} \
                 (max_in_flight {max}): {walk:?}",
                open_of_key + cost,
            ));
        }
        if min.is_some_and(|min| met < min) {
            return Err(format!(
                "a limit of {met} met at {at} ms, below adaptive.min {min:?}: {walk:?}"
            ));
        }
        let length = match knee {
            Some(knee) => {
                let open_all: u64 = open.values().map(|o| o.2).sum::<u64>() + cost;
                (5 + rng.below(21)) * MS * open_all.max(knee) / knee
            }
            None if rng.below(3) == 0 => rng.below(5 * MS),
            None => rng.below(2 * PLACE_EPOCH_US),
        };
        open.insert((now + length, i), (w, pending, cost, key));
    }
    // Everything ends.
    for ((ends, _), (w, pending, _, _)) in std::mem::take(&mut open) {
        let (generation, worker, _, _) = &mut workers[w];
        now = now.max(ends);
        if engines[*generation]
            .end_in_flight(&store, worker, &pending, Micros(now))
            .is_err()
        {
            walk.failed_give_backs += 1;
        }
    }
    // The bound: live workers' places at their next tick, dead ones' within 2 epochs.
    let ended = now;
    let bound = match last_death {
        Some(_) => ended + 2 * PLACE_EPOCH_US + tick_every,
        None => ended + tick_every,
    };
    while now < bound {
        now += tick_every.min(bound - now).max(1);
        for (generation, worker, _, alive) in &mut workers {
            if *alive {
                engines[*generation].tend_places(&store, worker, Micros(now));
            }
        }
    }
    // A probe with a fixed limit of the same rule (the same table) counts what fits.
    let fixed = engine(&limit_config(max, ""));
    let mut probe = fixed.worker();
    for key in 0..keys {
        let fits = (0..=max)
            .filter(|k| {
                let req = user(&format!("u{key}"));
                let eval = evaluate_on(&fixed, &store, &mut probe, &req, now + k);
                !eval.denied() && !eval.commits.is_empty()
            })
            .count() as u64;
        if fits != max {
            return Err(format!(
                "key u{key}: {fits} of {max} fit {} ms after every stream ended: {walk:?}",
                (now - ended) / MS
            ));
        }
    }
    Ok(walk)
}

/// A store where another worker makes the same first write just before ours: the first
/// compare-and-swap is lost to an identical value.
struct ClaimRace {
    inner: MemoryStore,
    raced: std::sync::atomic::AtomicBool,
}

impl weir_core::store::SharedStore for ClaimRace {
    fn get(&self, key: &str) -> Result<(Option<Vec<u8>>, Option<u32>), StoreError> {
        self.inner.get(key)
    }
    fn compare_and_set(&self, key: &str, value: &[u8], version: u32) -> Result<(), StoreError> {
        if !self.raced.swap(true, std::sync::atomic::Ordering::SeqCst) {
            self.inner.compare_and_set(key, value, version)?;
        }
        self.inner.compare_and_set(key, value, version)
    }
    fn create(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        self.inner.create(key, value)
    }
}

/// Two workers' first requests of a key at once: both find its controller record free,
/// and one claims it first. The other looks again and finds the key's own controller
/// (it used to decide that request without one: `keys_without_controller`, seen in the
/// e2e `per_key_adaptive_limits_follow_each_tenants_own_service`).
#[test]
fn a_claim_lost_to_another_worker_finds_the_key_controller_it_made() {
    let e = engine(
        r#"{"rules":[{"name":"tenants","key":[{"header":"x-user"}],
        "limit":{"algorithm":"concurrency","max_in_flight":200,
                 "adaptive":{"interval":"500ms","per_key":true}}}]}"#,
    );
    let store = ClaimRace {
        inner: MemoryStore::new(),
        raced: false.into(),
    };
    e.prepare(&store.inner).unwrap();
    let mut worker = e.worker();
    let mut facts = e.facts(user("ann"));
    let eval = e.evaluate(&store, &mut worker, &support::SEED, &mut facts, Micros(T0));
    assert!(!eval.denied());
    assert!(
        !eval.reports[0].key_without_controller,
        "{:?}",
        eval.reports[0]
    );
}
