//! Requests held instead of denied (`on_limit.delay`), in simulated time: several
//! workers share one Envoy's shared data, each holds the requests its rule delays and
//! releases them when due — on time, a little late (within the release slack), or too
//! late (the slot is lost and the request is decided again) — and every admission is
//! judged by `conformance::check` at the instant it was released.
//!
//! The same runs bound what holding costs: a key offered five times its rate admits
//! what a central limiter would (burst, then the rate), and no request waits longer
//! than the delay's `max`.
#![cfg(not(target_arch = "wasm32"))]

use crate::support;

use std::collections::BTreeMap;

use support::{engine, evaluate_on, user, FakeRequest, Rng, SEED, T0};
use weir_core::conformance::{self, Admission};
use weir_core::delay::RELEASE_SLACK_US;
use weir_core::engine::{Engine, Evaluation, RuleOutcome};
use weir_core::rules::RuleId;
use weir_core::store::memory::MemoryStore;
use weir_core::time::{Micros, Span};
use weir_core::worker::Worker;
use weir_testkit::simulation::configured_limit;

const MS: u64 = 1_000;

fn delayed_rule(limit: &str, delay: &str) -> Engine {
    engine(&format!(
        r#"{{"rules":[{{"name":"api","key":[{{"header":"x-user"}}],
            "limit":{limit},"reservoir":{{"max":1}},
            "on_limit":{{"delay":{delay}}}}}]}}"#
    ))
}

const GCRA_100: &str = r#"{"algorithm":"gcra","rate":100,"period":"1s","burst":4}"#;
const BUCKET_100: &str = r#"{"algorithm":"token_bucket","capacity":5,"refill":1,"period":"10ms"}"#;

/// What a run did: admissions by release instant, the longest wait, and counts.
#[derive(Default)]
struct Run {
    admissions: Vec<Admission>,
    longest_wait_us: u64,
    held: u64,
    late: u64,
    denied: u64,
    queue_full: u64,
    abandoned: u64,
}

/// An event of the simulation: a request arrives, or a worker's tick releases a held
/// one (`lateness_us` after it is due).
enum Event {
    Arrive { worker: usize },
    Release { worker: usize, context: u32 },
}

/// Offers `per_s` requests per second of user `alice` for `secs`, spread over
/// `workers` workers; each held request is released up to `max_late_us` after it is
/// due (at random), and one in `abandon_one_in` held requests is abandoned by its
/// client instead (0: none).
fn run(
    e: &Engine,
    workers: usize,
    per_s: u64,
    secs: u64,
    max_late_us: u64,
    abandon_one_in: u64,
) -> Run {
    let store = MemoryStore::new();
    e.prepare(&store).unwrap();
    let mut worker_states: Vec<Worker> = (0..workers).map(|_| e.worker()).collect();
    let mut rng = Rng(0x005e_ed0f_de1a_u64);
    let mut events: BTreeMap<(u64, u64), Event> = BTreeMap::new();
    let mut seq = 0u64;
    let gap_us = 1_000_000 / per_s;
    for i in 0..per_s * secs {
        let worker = rng.below(workers as u64) as usize;
        events.insert((T0 + i * gap_us, seq), Event::Arrive { worker });
        seq += 1;
    }
    let mut held: BTreeMap<u32, (Evaluation, u64)> = BTreeMap::new();
    let mut out = Run::default();
    let mut next_context = 1u32;
    let request = user("alice");
    while let Some(((now, _), event)) = events.pop_first() {
        let (worker, eval, arrived_us, context) = match event {
            Event::Arrive { worker } => {
                let eval = evaluate_on(e, &store, &mut worker_states[worker], &request, now);
                let context = next_context;
                next_context += 1;
                (worker, eval, now, context)
            }
            Event::Release { worker, context } => {
                // The worker's tick takes the request out of its list when it is due.
                let (mut eval, arrived_us) = held.remove(&context).unwrap();
                assert!(worker_states[worker].waiting.forget(context).is_some());
                let mut facts = e.facts(request.clone());
                e.release(
                    &mut eval,
                    &store,
                    &mut worker_states[worker],
                    &SEED,
                    &mut facts,
                    Micros(now),
                );
                if eval.delayed.unwrap().late {
                    out.late += 1;
                }
                (worker, eval, arrived_us, context)
            }
        };
        if let Some(h) = eval.held {
            let w = &mut worker_states[worker].waiting;
            assert!(
                w.hold(context, h.rule, h.hold.due_us, h.turn),
                "the engine held with room"
            );
            out.held += 1;
            if abandon_one_in > 0 && rng.below(abandon_one_in) == 0 {
                // The client leaves: its slot stays counted, never admitted.
                w.forget(context);
                out.abandoned += 1;
                continue;
            }
            let late = rng.below(max_late_us + 1);
            events.insert(
                (h.hold.due_us + late, seq),
                Event::Release { worker, context },
            );
            seq += 1;
            held.insert(context, (eval, arrived_us));
            continue;
        }
        if let Some(delayed) = eval.delayed {
            assert_eq!(delayed.waited, Span(now - arrived_us));
        }
        let report = *eval.reports.last().unwrap();
        out.queue_full += u64::from(report.delay_queue_full);
        if eval.denied() {
            out.denied += 1;
            continue;
        }
        assert_eq!(report.outcome, RuleOutcome::Allowed);
        out.longest_wait_us = out.longest_wait_us.max(now - arrived_us);
        out.admissions.push(Admission {
            at_us: now,
            cost: report.cost,
        });
    }
    out
}

impl std::fmt::Debug for Run {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} admitted, longest wait {} us, {} held, {} late, {} denied, {} queue full, {} abandoned",
            self.admissions.len(),
            self.longest_wait_us,
            self.held,
            self.late,
            self.denied,
            self.queue_full,
            self.abandoned
        )
    }
}

fn assert_conformant(e: &Engine, run: &Run, what: &str) {
    let limit = configured_limit(e, RuleId(0)).unwrap();
    if let Err(v) = conformance::check(&limit, &run.admissions) {
        panic!("{what}: {v}");
    }
}

#[test]
fn five_times_the_rate_is_released_at_the_rate_and_waits_at_most_max() {
    for (name, limit) in [("gcra", GCRA_100), ("token_bucket", BUCKET_100)] {
        let e = delayed_rule(limit, r#"{"max":"500ms","queue":1000}"#);
        // Released on time or within the slack the key's state pays for.
        let r = run(&e, 4, 500, 4, RELEASE_SLACK_US, 0);
        println!("{name}: {r:?}");
        assert_conformant(&e, &r, name);
        assert!(
            r.longest_wait_us <= 500 * MS + RELEASE_SLACK_US,
            "{name}: {r:?}"
        );
        assert!(r.held > 400, "{name}: all but the burst were held: {r:?}");
        assert_eq!(r.late, 0, "{name}");
        // A central limiter admits 5 at once, then 100/s, over the 4 s of arrivals and
        // the 0.5 s their last held requests may wait.
        let admitted = r.admissions.len() as u64;
        assert!(
            (440..=455).contains(&admitted),
            "{name}: {admitted} admitted, expected about 5 + 100/s x 4.5 s: {r:?}"
        );
        assert!(r.denied > 1_000, "{name}: beyond max, requests are denied");
    }
}

#[test]
fn releases_later_than_the_slack_lose_their_slot_and_still_keep_the_bound() {
    for (name, limit) in [("gcra", GCRA_100), ("token_bucket", BUCKET_100)] {
        let e = delayed_rule(limit, r#"{"max":"500ms","queue":1000}"#);
        let r = run(&e, 3, 500, 2, 60 * MS, 0);
        println!("{name}: {r:?}");
        assert!(r.late > 20, "{name}: releases miss their slot: {r:?}");
        assert_conformant(&e, &r, name);
        assert!(r.longest_wait_us <= 500 * MS + 60 * MS, "{name}: {r:?}");
    }
}

#[test]
fn abandoned_requests_keep_their_slot_counted_and_the_bound() {
    let e = delayed_rule(GCRA_100, r#"{"max":"300ms","queue":1000}"#);
    let r = run(&e, 2, 500, 2, MS, 4);
    assert!(r.abandoned > 40, "{r:?}");
    assert_conformant(&e, &r, "abandoned");
    // Abandoned slots are gone: fewer admissions than without them.
    let full = run(&e, 2, 500, 2, MS, 0);
    assert!(
        r.admissions.len() < full.admissions.len(),
        "{r:?} vs {full:?}"
    );
}

#[test]
fn a_full_queue_denies_what_it_would_have_held_and_counts_it() {
    let e = delayed_rule(GCRA_100, r#"{"max":"1s","queue":3}"#);
    let r = run(&e, 1, 500, 1, 0, 0);
    println!("{r:?}");
    assert_conformant(&e, &r, "queue 3");
    assert!(r.queue_full > 300, "{r:?}");
    // Held at once: at most 3, so about 5 + 100/s admitted, never more than the bound.
    assert!(r.held >= 90, "{r:?}");
}

#[test]
fn a_request_is_not_held_by_a_rule_after_one_that_counted_it() {
    let e = engine(
        r#"{"rules":[
            {"name":"all","limit":{"algorithm":"gcra","rate":1000,"period":"1s","burst":1000},
             "reservoir":{"max":1}},
            {"name":"api","key":[{"header":"x-user"}],
             "limit":{"algorithm":"gcra","rate":1,"period":"1s","burst":0},"reservoir":{"max":1},
             "on_limit":{"delay":{"max":"5s"}}}]}"#,
    );
    let store = MemoryStore::new();
    e.prepare(&store).unwrap();
    let mut worker = e.worker();
    let first = evaluate_on(&e, &store, &mut worker, &user("a"), T0);
    assert!(!first.denied() && first.held.is_none());
    let second = evaluate_on(&e, &store, &mut worker, &user("a"), T0 + MS);
    assert!(second.held.is_none(), "rule `all` counted it first");
    assert!(second.denied());

    // The delaying rule first: held.
    let e = engine(
        r#"{"rules":[
            {"name":"api","key":[{"header":"x-user"}],
             "limit":{"algorithm":"gcra","rate":1,"period":"1s","burst":0},"reservoir":{"max":1},
             "on_limit":{"delay":{"max":"5s"}}},
            {"name":"all","limit":{"algorithm":"gcra","rate":1000,"period":"1s","burst":1000},
             "reservoir":{"max":1}}]}"#,
    );
    let store = MemoryStore::new();
    e.prepare(&store).unwrap();
    let mut worker = e.worker();
    let _ = evaluate_on(&e, &store, &mut worker, &user("a"), T0);
    let mut second = evaluate_on(&e, &store, &mut worker, &user("a"), T0 + MS);
    let held = second.held.expect("held by the first rule");
    assert_eq!(held.hold.due_us, T0 + 1_000 * MS);
    assert_eq!(second.reports.len(), 0, "no rule decided yet");
    // Released on time: the rule after it decides then.
    let mut facts = e.facts(user("a"));
    e.release(
        &mut second,
        &store,
        &mut worker,
        &SEED,
        &mut facts,
        Micros(held.hold.due_us),
    );
    assert!(!second.denied());
    assert_eq!(second.reports.len(), 2);
    assert_eq!(second.reports[1].decided_at_us, held.hold.due_us);
    assert_eq!(second.delayed.unwrap().waited, Span(999 * MS));
}

#[test]
fn a_request_that_would_wait_longer_than_max_is_denied_with_its_retry() {
    let e = delayed_rule(
        r#"{"algorithm":"gcra","rate":1,"period":"1s","burst":0}"#,
        r#"{"max":"1500ms"}"#,
    );
    let store = MemoryStore::new();
    e.prepare(&store).unwrap();
    let mut worker = e.worker();
    let a = user("a");
    assert!(!evaluate_on(&e, &store, &mut worker, &a, T0).denied());
    let second = evaluate_on(&e, &store, &mut worker, &a, T0);
    assert_eq!(second.held.unwrap().hold.due_us, T0 + 1_000 * MS);
    let third = evaluate_on(&e, &store, &mut worker, &a, T0);
    assert!(third.held.is_none());
    assert!(third.denied(), "would wait 2 s, max is 1.5 s");
    assert_eq!(
        third.verdicts[0].decision.retry_after_ns,
        Some(2_000_000_000 + RELEASE_SLACK_US * 1_000)
    );
}

/// Issue 19, defect 1: a held request stored the bucket decided at its future refill, and
/// every request before that instant spent the refill early — 595 admitted at once where
/// the bound allows 200 (capacity 100, refill 100 per second, 1,000 requests a second).
#[test]
fn a_token_bucket_refilling_many_per_period_keeps_its_bound_while_it_holds() {
    let e = delayed_rule(
        r#"{"algorithm":"token_bucket","capacity":100,"refill":100,"period":"1s"}"#,
        r#"{"max":"5s","queue":10000}"#,
    );
    for workers in [1, 2] {
        let r = run(&e, workers, 1_000, 1, RELEASE_SLACK_US, 0);
        println!("{workers} workers: {r:?}");
        assert_conformant(&e, &r, "capacity 100, refill 100 per 1s");
        // Released at the refills: 100 at once, then 100 at each of the 5 refills the
        // delay's max reaches.
        let first_second = r
            .admissions
            .iter()
            .filter(|a| a.at_us < T0 + 1_000 * MS)
            .count();
        assert_eq!(first_second, 100, "{workers} workers: {r:?}");
        assert_eq!(r.admissions.len(), 600, "{workers} workers: {r:?}");
    }
}

/// GCRA 100/s burst 4 with a 500 ms delay, after alice's burst (5 at once) at T0: her
/// next slot is 10 ms away, and each after it 10 ms later.
fn alice_after_her_burst() -> (Engine, MemoryStore, Worker) {
    let e = delayed_rule(GCRA_100, r#"{"max":"500ms","queue":1000}"#);
    let store = MemoryStore::new();
    e.prepare(&store).unwrap();
    let mut worker = e.worker();
    for _ in 0..5 {
        let eval = evaluate_on(&e, &store, &mut worker, &user("alice"), T0);
        assert!(eval.held.is_none() && !eval.denied());
    }
    (e, store, worker)
}

/// A request states its own deadline (`grpc-timeout`, `x-envoy-expected-rq-timeout-ms`):
/// it is held only when its slot comes before it; otherwise it is answered 429 at once,
/// with the slot's time as `Retry-After`, and nothing is counted for it.
#[test]
fn a_request_is_held_only_until_its_own_deadline() {
    let (e, store, mut worker) = alice_after_her_burst();
    let stating = |header: &str, value: &str| user("alice").header(header, value);
    // 9 ms: its slot (10 ms away) comes after it — denied at once, not held, not counted.
    for request in [
        stating("grpc-timeout", "9m"),
        stating("grpc-timeout", "9999u"),
        stating("x-envoy-expected-rq-timeout-ms", "9"),
        // Both: the earlier wins.
        stating("grpc-timeout", "1S").header("x-envoy-expected-rq-timeout-ms", "9"),
    ] {
        let eval = evaluate_on(&e, &store, &mut worker, &request, T0);
        assert!(eval.held.is_none(), "held past its deadline");
        assert!(eval.denied());
        let report = eval.reports[0];
        assert!(report.delay_past_deadline);
        assert_eq!(
            eval.verdicts[0].decision.retry_after_ns,
            Some(10_000_000),
            "Retry-After: its slot"
        );
    }
    // 10 ms (or a header that does not parse: the `max` alone): held until its slot.
    for request in [
        stating("grpc-timeout", "10m"),
        stating("x-envoy-expected-rq-timeout-ms", "soon"),
    ] {
        let eval = evaluate_on(&e, &store, &mut worker, &request, T0);
        let held = eval.held.expect("held");
        assert!(held.hold.due_us <= T0 + 10 * MS * 2);
        assert!(!eval.reports.iter().any(|r| r.delay_past_deadline));
    }
}

/// `request` arriving at T0, held until `due_us` (asserted), and released `late_us`
/// after it.
fn hold_then_release(
    e: &Engine,
    store: &MemoryStore,
    worker: &mut Worker,
    request: FakeRequest,
    (due_us, late_us): (u64, u64),
) -> Evaluation {
    let mut eval = evaluate_on(e, store, worker, &request, T0);
    assert_eq!(eval.held.expect("held").hold.due_us, due_us);
    let mut facts = e.facts(request);
    let at = Micros(due_us + late_us);
    e.release(&mut eval, store, worker, &SEED, &mut facts, at);
    eval
}

/// A held request whose release comes after the deadline it stated (the worker's timer
/// was late) is not forwarded: its client no longer waits for it. Its slot stays counted.
#[test]
fn a_release_after_the_requests_deadline_is_not_forwarded() {
    let (e, store, mut worker) = alice_after_her_burst();
    let request = user("alice").header("grpc-timeout", "10500u");
    // Held for its slot 10 ms away; released 1 ms late: within the slack (the slot is
    // still its), past its deadline.
    let eval = hold_then_release(&e, &store, &mut worker, request, (T0 + 10 * MS, MS));
    let delayed = eval.delayed.expect("released");
    assert!(delayed.past_deadline && !delayed.late);
    assert!(eval.denied(), "not forwarded");
    assert!(eval.reports[0].delay_past_deadline);
    // The next slot (20 ms away) for a request with 30 ms to go: released on time,
    // before its deadline, admitted as before.
    let request = user("alice").header("x-envoy-expected-rq-timeout-ms", "30");
    let eval = hold_then_release(&e, &store, &mut worker, request, (T0 + 20 * MS, 0));
    assert!(!eval.denied());
    assert!(eval.delayed.is_some_and(|d| !d.past_deadline));
}
