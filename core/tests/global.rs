//! Global rules through the engine, with the bridge's replies written out by hand (the
//! real bridge is exercised by weir-bridge's suites and the end-to-end suite): what a
//! rule asks for, what a reply leaves in the key's slot (units held, a reservation, a
//! cached denial), failure modes and the backoff.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use crate::support;

use support::{engine, evaluate, user, T0};
use weir_core::engine::{
    BridgeError, Engine, Evaluation, FailureOutcome, RuleOutcome, Source, BRIDGE_FAILING_FOR_US,
    BRIDGE_FAILURES_TO_SKIP,
};
use weir_core::rules::Scope;
use weir_core::store::memory::MemoryStore;
use weir_core::store::SharedStore;
use weir_core::time::Micros;
use weir_core::wire::v2::{self, Granted};
use weir_core::wire::ReplyError;

#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test as test;

const MS: u64 = 1_000;

/// A bucket of 100 per minute per `x-user`, plus `extra` rule fields.
fn global(extra: &str) -> Engine {
    engine(&format!(
        r#"{{"bridge":{{"cluster":"weir_bridge"}},"rules":[{{"name":"tenant","scope":"global",
            "key":[{{"header":"x-user"}}],
            "limit":{{"algorithm":"token_bucket","capacity":100,"refill":100,"period":"1m"}}{extra}}}]}}"#
    ))
}

fn eval_at(e: &Engine, store: &MemoryStore, now: u64) -> Evaluation {
    evaluate(e, store, &user("acme"), now)
}

/// A result for rule 0 at T0.
fn result(allowed: bool, granted: u64, remaining: u64) -> Granted {
    Granted {
        id: 0,
        allowed,
        granted,
        limit: 100,
        remaining,
        retry_after_ns: (!allowed).then_some(5_000_000_000),
        reset_after_ns: 60_000_000_000,
        now_us: T0,
        due_ns: 0,
        spacing_ns: 0,
        valid_ns: 0,
    }
}

fn reply(items: Vec<Granted>) -> Result<v2::Reply, ReplyError> {
    Ok(v2::Reply { items })
}

/// A fresh store where acme's first request, at T0, got `answer` at once.
fn answered_at_t0(e: &Engine, answer: Result<v2::Reply, ReplyError>) -> (MemoryStore, Evaluation) {
    let store = MemoryStore::new();
    e.prepare(&store).unwrap();
    let mut eval = eval_at(e, &store, T0);
    e.complete(&mut eval, &store, Micros(T0), Micros(T0), answer);
    (store, eval)
}

/// Fails [`BRIDGE_FAILURES_TO_SKIP`] calls in a row with `error`, spread evenly over
/// [`BRIDGE_FAILING_FOR_US`] up to `last`, checking that only the last one starts the
/// backoff; the last evaluation.
fn fail_in_a_row(e: &Engine, store: &MemoryStore, last: u64, error: ReplyError) -> Evaluation {
    let calls = u64::from(BRIDGE_FAILURES_TO_SKIP);
    let mut eval = Evaluation::default();
    for n in 1..=calls {
        let now = last - BRIDGE_FAILING_FOR_US * (calls - n) / (calls - 1);
        eval = eval_at(e, store, now);
        assert_eq!(eval.pending.len(), 1, "{error}: call {n} was made");
        e.complete(
            &mut eval,
            store,
            Micros(now),
            Micros(now),
            Err(error.clone()),
        );
    }
    eval
}

#[test]
fn failures_in_a_row_skip_the_bridge_only_once_they_span_a_while() {
    let e = global("");
    let store = MemoryStore::new();
    e.prepare(&store).unwrap();
    // A batch of calls failing at once (one connection that could not be made): many
    // failures, no time: not skipped.
    for n in 0..10 {
        let mut eval = eval_at(&e, &store, T0 + n);
        assert_eq!(eval.pending.len(), 1, "call {n}");
        e.complete(
            &mut eval,
            &store,
            Micros(T0 + n),
            Micros(T0 + n),
            Err(ReplyError::Unreachable),
        );
    }
    // Still failing a while later: skipped.
    let last = T0 + BRIDGE_FAILING_FOR_US;
    let mut eval = eval_at(&e, &store, last);
    e.complete(
        &mut eval,
        &store,
        Micros(last),
        Micros(last),
        Err(ReplyError::Unreachable),
    );
    assert_eq!(
        eval_at(&e, &store, last + 1).bridge_error,
        Some(BridgeError::Skipped)
    );
}

/// The request body the engine would send, parsed back as the bridge reads it.
fn sent_items(e: &Engine, eval: &Evaluation) -> Vec<v2::Item> {
    v2::Request::parse(&e.bridge_request(&eval.pending))
        .unwrap_or_else(|err| panic!("the bridge would refuse it: {err}"))
        .items
        .into_iter()
        .map(|checked| checked.item)
        .collect()
}

#[test]
fn exact_global_rules_ask_the_bridge_every_time() {
    let e = global("");
    let store = MemoryStore::new();
    e.prepare(&store).unwrap();
    for _ in 0..3 {
        let mut eval = eval_at(&e, &store, T0);
        let items = sent_items(&e, &eval);
        let item = &items[0];
        assert_eq!((item.id, item.cost, item.want, item.reserve), (0, 1, 1, 0));
        assert_eq!((item.ttl_us, item.horizon_us, item.shadow), (0, 0, false));
        assert_eq!(item.descriptor, ["=acme"]);
        e.complete(
            &mut eval,
            &store,
            Micros(T0),
            Micros(T0),
            reply(vec![result(true, 1, 50)]),
        );
        assert!(!eval.denied());
        assert_eq!(eval.verdicts[0].decision.remaining, 50);
        assert_eq!(eval.reports[0].source, Some(Source::Bridge));
    }
}

#[test]
fn leases_are_sized_by_demand_and_spent_locally() {
    // 10 requests a millisecond; units may wait 10 ms.
    let e = global(r#","global":{"lease":{"max":1000,"ttl":"10ms"}}"#);
    let store = MemoryStore::new();
    e.prepare(&store).unwrap();
    let mut wants = Vec::new();
    let mut calls = 0;
    for i in 0..2_000 {
        let now = T0 + i * 100;
        let mut eval = eval_at(&e, &store, now);
        if let Some(item) = eval.pending.first() {
            calls += 1;
            wants.push(item.want);
            let want = item.want;
            let mut granted = result(true, want, 10_000);
            granted.valid_ns = 10_000_000;
            e.complete(
                &mut eval,
                &store,
                Micros(now),
                Micros(now),
                reply(vec![granted]),
            );
        } else {
            assert_eq!(eval.reports[0].source, Some(Source::Lease));
        }
        assert!(!eval.denied());
    }
    assert_eq!(wants[0], 1, "a first request has no demand yet");
    // At 10,000 per second, 10 ms of demand is 100 units.
    let settled = *wants.last().unwrap();
    assert!((90..=120).contains(&settled), "{wants:?}");
    assert!(calls < 40, "{calls} calls for 2,000 requests: {wants:?}");
}

#[test]
fn held_units_are_spent_only_within_their_validity() {
    let e = global(r#","global":{"lease":{"max":100,"ttl":"10ms"}}"#);
    let store = MemoryStore::new();
    e.prepare(&store).unwrap();
    let mut eval = eval_at(&e, &store, T0);
    let mut granted = result(true, 50, 50);
    granted.valid_ns = 10_000_000;
    // The call left at T0 and came back 2 ms later: units expire 10 ms after T0.
    e.complete(
        &mut eval,
        &store,
        Micros(T0),
        Micros(T0 + 2 * MS),
        reply(vec![granted]),
    );
    let eval = eval_at(&e, &store, T0 + 10 * MS);
    assert_eq!(eval.reports[0].source, Some(Source::Lease));
    let eval = eval_at(&e, &store, T0 + 10 * MS + 1);
    assert_eq!(
        eval.pending.len(),
        1,
        "expired units are dropped, not spent"
    );
}

#[test]
fn lease_served_requests_report_the_global_quota() {
    let e = engine(
        r#"{"bridge":{"cluster":"b"},"rules":[{"name":"tenant","scope":"global",
            "limit":{"algorithm":"fixed_window","limit":1000,"window":"1h"},
            "global":{"lease":{"max":10}}}]}"#,
    );
    let store = MemoryStore::new();
    e.prepare(&store).unwrap();
    let mut eval = eval_at(&e, &store, T0);
    let mut granted = result(true, 10, 900);
    granted.limit = 1000;
    granted.valid_ns = 1_000_000_000;
    e.complete(
        &mut eval,
        &store,
        Micros(T0),
        Micros(T0),
        reply(vec![granted]),
    );
    let eval = eval_at(&e, &store, T0 + MS);
    assert_eq!(eval.reports[0].source, Some(Source::Lease));
    // What Redis had left plus the 8 units this Envoy still holds: not the lease's own 8.
    let d = eval.verdicts[0].decision;
    assert_eq!((d.limit, d.remaining), (1000, 908));
    assert!(d.reset_after_ns > 59_000_000_000);
}

#[test]
fn a_denial_is_cached_for_its_cost_and_above() {
    let e = engine(
        r#"{"bridge":{"cluster":"b"},"rules":[{"name":"tenant","scope":"global",
            "cost":{"header":"x-cost"},
            "limit":{"algorithm":"fixed_window","limit":100,"window":"1h"}}]}"#,
    );
    let store = MemoryStore::new();
    e.prepare(&store).unwrap();
    let cost = |n: &str| user("acme").header("x-cost", n);
    let mut eval = evaluate(&e, &store, &cost("10"), T0);
    e.complete(
        &mut eval,
        &store,
        Micros(T0),
        Micros(T0),
        reply(vec![result(false, 0, 4)]),
    );
    assert!(eval.denied());
    for t in [1, MS, 4_999_999] {
        let eval = evaluate(&e, &store, &cost("10"), T0 + t);
        assert!(eval.pending.is_empty(), "a cached denial called the bridge");
        assert_eq!(eval.reports[0].source, Some(Source::DenialCache));
        let retry = eval.verdicts[0].decision.retry_after_ns.unwrap();
        assert_eq!(retry, (5_000_000 - t) * 1_000);
        assert!(evaluate(&e, &store, &cost("20"), T0 + t).denied());
    }
    // A smaller request may fit: it asks Redis (the bug of envoyproxy/ratelimit#1077).
    assert_eq!(evaluate(&e, &store, &cost("1"), T0 + MS).pending.len(), 1);
    assert_eq!(
        evaluate(&e, &store, &cost("10"), T0 + 5_000_000)
            .pending
            .len(),
        1
    );
}

#[test]
fn a_denial_from_the_lease_slot_writes_nothing() {
    // Under attack every request of a denied key is answered from its lease slot: one
    // read of shared data, no CAS, so workers do not contend on the key. (Before, each
    // denial wrote its demand into the slot.)
    let e = global("");
    let (store, _) = answered_at_t0(&e, reply(vec![result(false, 0, 0)]));
    store.fail_next_writes(1, weir_core::store::StoreError::Host(1));
    for t in [1, MS, 2 * MS] {
        let eval = eval_at(&e, &store, T0 + t);
        assert!(eval.denied() && eval.pending.is_empty());
        assert_eq!(eval.reports[0].source, Some(Source::DenialCache));
    }
    assert_eq!(store.failures_left(), 1, "a denial wrote shared data");
}

#[test]
fn a_saturated_gcra_key_is_served_by_reservation() {
    // 1,000 per second, burst 99; units may wait 20 ms after the answer, and by default
    // the hold covers a round trip of up to a quarter of the burst's time (24 ms): 44 of
    // the burst pay for it.
    let e = engine(
        r#"{"bridge":{"cluster":"b"},"rules":[{"name":"tenant","scope":"global",
            "limit":{"algorithm":"gcra","rate":1000,"period":"1s","burst":99},
            "global":{"lease":{"max":500,"ttl":"20ms","horizon":"100ms"}}}]}"#,
    );
    let Scope::Global(global) = &e.config.rules[0].scope else {
        panic!("global")
    };
    assert_eq!(
        global.redis_limit.max_cost(),
        56,
        "burst 99 − 44 for the hold"
    );
    let store = MemoryStore::new();
    e.prepare(&store).unwrap();
    let mut eval = eval_at(&e, &store, T0);
    let item = &sent_items(&e, &eval)[0];
    // No round trip measured yet: the longest hold, `ttl` + the default `round_trip`.
    assert_eq!((item.ttl_us, item.horizon_us), (44_000, 100_000));
    // Redis: saturated; 3 units reserved, due 1, 2 and 3 ms after it decided.
    let mut reserved = result(false, 3, 0);
    reserved.retry_after_ns = Some(1_000_000);
    (reserved.due_ns, reserved.spacing_ns, reserved.valid_ns) = (1_000_000, 1_000_000, 20_000_000);
    e.complete(
        &mut eval,
        &store,
        Micros(T0),
        Micros(T0),
        reply(vec![reserved]),
    );
    assert!(eval.denied());
    // Before the first unit is due: denied locally, told when.
    let eval = eval_at(&e, &store, T0 + 500);
    assert!(eval.pending.is_empty() && eval.denied());
    assert_eq!(eval.verdicts[0].decision.retry_after_ns, Some(500_000));
    // Then one unit each millisecond, at its due time.
    for at in [T0 + MS, T0 + 2 * MS, T0 + 3 * MS] {
        let eval = eval_at(&e, &store, at);
        assert!(!eval.denied(), "unit due at {at}");
        assert_eq!(eval.reports[0].source, Some(Source::Lease));
    }
    assert_eq!(
        eval_at(&e, &store, T0 + 3 * MS).pending.len(),
        1,
        "all spent"
    );
}

/// While a saturated key's call is in flight, the key's other requests are denied from
/// its slot at once (on every worker) instead of waiting on the call or making their
/// own; the denial ends when the call lands or fails, and a key with units left in
/// Redis is not touched.
#[test]
fn a_saturated_keys_other_requests_are_denied_while_its_call_is_in_flight() {
    let e = engine(
        r#"{"bridge":{"cluster":"b","timeout":"40ms"},"rules":[{"name":"tenant","scope":"global",
            "limit":{"algorithm":"gcra","rate":1000,"period":"1s","burst":99},
            "global":{"lease":{"max":500,"ttl":"20ms","horizon":"100ms"}}}]}"#,
    );
    let store = MemoryStore::new();
    e.prepare(&store).unwrap();
    let reservation = |units: u64| {
        let mut reserved = result(false, units, 0);
        reserved.retry_after_ns = Some(1_000_000);
        (reserved.due_ns, reserved.spacing_ns, reserved.valid_ns) =
            (1_000_000, 1_000_000, 20_000_000);
        reply(vec![reserved])
    };
    // Redis said the key is saturated: one unit reserved, spent at its due time.
    let mut first = eval_at(&e, &store, T0);
    e.note_call_sent(&mut first, &store, Micros(T0));
    e.complete(&mut first, &store, Micros(T0), Micros(T0), reservation(1));
    assert!(!eval_at(&e, &store, T0 + MS).denied(), "the reserved unit");
    // The next miss asks; while its call is in flight, the others are denied at once.
    let sent_us = T0 + 2 * MS;
    let mut asking = eval_at(&e, &store, sent_us);
    assert_eq!(asking.pending.len(), 1);
    e.note_call_sent(&mut asking, &store, Micros(sent_us));
    for at in [sent_us, sent_us + 10 * MS, sent_us + 39 * MS] {
        let other = eval_at(&e, &store, at);
        assert!(other.pending.is_empty() && other.denied(), "at {at}");
        assert_eq!(other.reports[0].source, Some(Source::DenialCache));
        assert_eq!(
            other.verdicts[0].decision.retry_after_ns,
            Some((sent_us + 40 * MS - at) * 1_000),
            "until the call's deadline"
        );
    }
    // It lands with two more units: served, and once they are spent the key asks again.
    let landed_us = sent_us + 30 * MS;
    e.complete(
        &mut asking,
        &store,
        Micros(sent_us),
        Micros(landed_us),
        reservation(2),
    );
    for at in [landed_us + MS, landed_us + 2 * MS] {
        assert!(!eval_at(&e, &store, at).denied(), "unit due at {at}");
    }
    let mut again = eval_at(&e, &store, landed_us + 3 * MS);
    assert_eq!(
        again.pending.len(),
        1,
        "the denial ended when the call landed"
    );
    // A call that fails ends its denial too.
    e.note_call_sent(&mut again, &store, Micros(landed_us + 3 * MS));
    assert!(eval_at(&e, &store, landed_us + 4 * MS).denied());
    e.complete(
        &mut again,
        &store,
        Micros(landed_us + 3 * MS),
        Micros(landed_us + 5 * MS),
        Err(ReplyError::Status(503, String::new())),
    );
    let after = eval_at(&e, &store, landed_us + 6 * MS);
    assert_eq!(after.pending.len(), 1, "no cached denial: it asks again");

    // A key Redis still had units for: its other requests wait on the call or ask.
    let (store, _) = answered_at_t0(&e, reply(vec![result(true, 1, 40)]));
    let mut asking = eval_at(&e, &store, T0 + MS);
    assert_eq!(asking.pending.len(), 1);
    e.note_call_sent(&mut asking, &store, Micros(T0 + MS));
    assert_eq!(eval_at(&e, &store, T0 + 2 * MS).pending.len(), 1);
}

#[test]
fn a_slow_bridge_lengthens_the_hold_up_to_what_the_burst_paid_for() {
    // A unit's hold counts from when its call left, so a call asks for `ttl` plus the
    // round trip this plugin measured; a GCRA key's burst paid for at most `ttl` plus
    // `round_trip` (here 30 ms of 99: 50 units).
    let e = global(r#","global":{"lease":{"max":50,"ttl":"20ms"}}"#);
    let asked_hold = |e: &Engine, store: &MemoryStore, at: u64| -> u64 {
        let eval = eval_at(e, store, at);
        sent_items(e, &eval)[0].ttl_us
    };
    let store = MemoryStore::new();
    e.prepare(&store).unwrap();
    // No round trip measured yet: the longest, so the first calls (which take the
    // key's burst) keep their units behind a slow bridge. With `ttl` alone, a bridge
    // 30 ms away lost them all.
    assert_eq!(
        asked_hold(&e, &store, T0),
        70_000,
        "no round trip measured yet"
    );
    // An answer 15 ms after its call left: later calls ask for 35 ms.
    let mut eval = eval_at(&e, &store, T0);
    let nothing = Granted {
        retry_after_ns: None,
        ..result(true, 1, 99)
    };
    e.complete(
        &mut eval,
        &store,
        Micros(T0),
        Micros(T0 + 15 * MS),
        reply(vec![nothing]),
    );
    assert_eq!(e.round_trip_us(), 15_000);
    let other = MemoryStore::new();
    e.prepare(&other).unwrap();
    assert_eq!(asked_hold(&e, &other, T0 + 20 * MS), 35_000);
    // A faster answer lowers the estimate by a sixteenth of the difference, not at once.
    e.note_round_trip(1_000);
    assert_eq!(e.round_trip_us(), 15_000 - 875);
    // A token bucket's hold is free in bound terms: up to `ttl` plus `bridge.timeout`.
    e.note_round_trip(80_000);
    assert_eq!(
        e.round_trip_us(),
        50_000,
        "no answer is slower than the timeout"
    );
    assert_eq!(asked_hold(&e, &other, T0 + 30 * MS), 70_000);

    // GCRA: the burst pays for `ttl` + `round_trip`, and no call asks for more.
    let gcra = engine(
        r#"{"bridge":{"cluster":"b"},"rules":[{"name":"t","scope":"global",
            "limit":{"algorithm":"gcra","rate":1000,"period":"1s","burst":99},
            "global":{"lease":{"max":50,"ttl":"20ms","round_trip":"30ms"}}}]}"#,
    );
    let Scope::Global(global) = &gcra.config.rules[0].scope else {
        panic!("global")
    };
    assert_eq!(
        global.redis_limit.max_cost(),
        50,
        "burst 99 − 50 for the hold"
    );
    gcra.note_round_trip(45_000);
    let store = MemoryStore::new();
    gcra.prepare(&store).unwrap();
    let eval = evaluate(&gcra, &store, &user("acme"), T0);
    assert_eq!(
        sent_items(&gcra, &eval)[0].ttl_us,
        50_000,
        "capped at what was paid"
    );
}

#[test]
fn gcra_leases_pay_for_their_hold_with_burst() {
    let refused = |lease: &str| {
        let json = format!(
            r#"{{"bridge":{{"cluster":"b"}},"rules":[{{"name":"r","scope":"global",
                "limit":{{"algorithm":"gcra","rate":1000,"period":"1s","burst":9}},
                "global":{{"lease":{lease}}}}}]}}"#
        );
        weir_core::config::parse(json.as_bytes())
            .map(|_| ())
            .map_err(|e| e.to_string())
    };
    assert_eq!(
        refused(r#"{"max":5,"ttl":"50ms"}"#).unwrap_err(),
        "rules[0].global.lease: a gcra lease holds each unit for up to `ttl` and pays for it \
         with burst, one unit per 1000us; with a burst of 9 a `ttl` of \"50ms\" costs 50: use \
         exact calls (`max`: 1), raise the burst, or set `ttl` to at most 9000us"
    );
    assert!(refused(r#"{"max":5,"ttl":"5ms"}"#).is_ok());
    // The round trip the hold covers is paid for too.
    assert_eq!(
        refused(r#"{"max":5,"ttl":"5ms","round_trip":"5ms"}"#).unwrap_err(),
        "rules[0].global.lease.round_trip: \"5ms\" and `ttl` together cost 10 units of a \
         burst of 9: at most 4000us of round trip fit"
    );
    assert!(refused(r#"{"max":5,"ttl":"5ms","round_trip":"4ms"}"#).is_ok());
    // By default the round trip never leaves requests less than a quarter of the burst: a
    // `ttl` that already costs more gets none (the benchmark's leased key keeps 100,000).
    let leased = engine(
        r#"{"bridge":{"cluster":"b","timeout":"250ms"},"rules":[{"name":"r","scope":"global",
            "limit":{"algorithm":"gcra","rate":1000000,"period":"1s","burst":999999},
            "global":{"lease":{"max":1000,"ttl":"900ms"}}}]}"#,
    );
    let Scope::Global(global) = &leased.config.rules[0].scope else {
        panic!("global")
    };
    assert_eq!(global.redis_limit.max_cost(), 100_000);
    assert_eq!(global.lease.map(|l| l.hold_max_us), Some(900_000));
    // A burst too small for the default hold (a quarter of it) cannot lease at all.
    let tiny = r#"{"bridge":{"cluster":"b"},"rules":[{"name":"r","scope":"global",
        "limit":{"algorithm":"gcra","rate":10,"period":"1s","burst":2},
        "global":{"lease":{"max":2}}}]}"#;
    assert!(weir_core::config::parse(tiny.as_bytes()).is_err());
}

#[test]
fn a_shadow_global_rule_does_not_switch_off_the_rules_after_it() {
    let e = engine(
        r#"{"bridge":{"cluster":"b"},"rules":[
            {"name":"trial","scope":"global","shadow":true,"limit":{"algorithm":"fixed_window","limit":1,"window":"1h"}},
            {"name":"enforced","scope":"global","limit":{"algorithm":"fixed_window","limit":5,"window":"1h"}}]}"#,
    );
    let store = MemoryStore::new();
    e.prepare(&store).unwrap();
    let mut eval = eval_at(&e, &store, T0);
    let items = sent_items(&e, &eval);
    assert_eq!(
        items.iter().map(|i| (i.id, i.shadow)).collect::<Vec<_>>(),
        [(0, true), (1, false)]
    );
    // The bridge goes on past the shadow denial and denies the enforcing rule too.
    let shadow_denied = result(false, 0, 0);
    let mut enforced = result(false, 0, 0);
    enforced.id = 1;
    e.complete(
        &mut eval,
        &store,
        Micros(T0),
        Micros(T0),
        reply(vec![shadow_denied, enforced]),
    );
    assert_eq!(eval.shadow_limited.len(), 1);
    assert!(eval.denied(), "the enforcing rule decided");
    assert_eq!(e.rule_name(eval.denied_by.unwrap()), "enforced");
}

#[test]
fn failure_modes_apply_and_the_bridge_is_left_alone_for_a_while() {
    for (mode, expect_unavailable) in [("allow", false), ("deny", true), ("local", false)] {
        // A local share of 10: each failure below is allowed under `local`.
        let e = global(&format!(
            r#","global":{{"failure_mode":"{mode}","expected_instances":10}}"#
        ));
        let store = MemoryStore::new();
        e.prepare(&store).unwrap();
        let eval = fail_in_a_row(&e, &store, T0, ReplyError::NoResponse);
        assert!(eval.denied_by.is_none(), "{mode}");
        assert_eq!(eval.unavailable.is_some(), expect_unavailable, "{mode}");
        assert!(store.get(e.bridge_down_key()).unwrap().0.is_some());
        // Within the backoff: no call, the failure mode again.
        let eval = eval_at(&e, &store, T0 + 10);
        assert!(
            eval.pending.is_empty(),
            "{mode}: called a bridge that just failed"
        );
        assert_eq!(eval.bridge_error, Some(BridgeError::Skipped));
        let outcome = eval.reports[0].outcome;
        match mode {
            "allow" => assert_eq!(outcome, RuleOutcome::BridgeFailed(FailureOutcome::Allowed)),
            "deny" => assert_eq!(outcome, RuleOutcome::BridgeFailed(FailureOutcome::Denied)),
            _ => assert_eq!(
                outcome,
                RuleOutcome::BridgeFailed(FailureOutcome::Local { allowed: true })
            ),
        }
        // After the backoff the bridge is asked again.
        assert_eq!(
            eval_at(&e, &store, T0 + 1_000_000).pending.len(),
            1,
            "{mode}"
        );
    }
}

#[test]
fn every_error_reply_in_a_row_starts_the_backoff_and_plugins_back_off_apart() {
    let config = r#"{"bridge":{"cluster":"weir_bridge"},"rules":[{"name":"tenant","scope":"global",
        "limit":{"algorithm":"fixed_window","limit":10,"window":"1h"}}]}"#;
    let parse = || weir_core::config::parse(config.as_bytes()).unwrap();
    let one = Engine::with_namespace(parse(), "plugin-one");
    let two = Engine::with_namespace(parse(), "plugin-two");
    let store = MemoryStore::new();
    one.prepare(&store).unwrap();
    two.prepare(&store).unwrap();
    let failures = [
        ReplyError::NoResponse,
        ReplyError::Status(400, "items[0].cost: out of range".into()),
        ReplyError::Status(401, String::new()),
        ReplyError::BadBody("x".into()),
    ];
    for (i, failure) in failures.into_iter().enumerate() {
        let now = T0 + i as u64 * 2_000_000;
        // An answer before: failures count from there.
        let answered = now - 2 * BRIDGE_FAILING_FOR_US;
        let mut eval = eval_at(&one, &store, answered);
        let answer = reply(vec![result(true, 1, 5)]);
        one.complete(
            &mut eval,
            &store,
            Micros(answered),
            Micros(answered),
            answer,
        );
        fail_in_a_row(&one, &store, now, failure.clone());
        assert_eq!(
            eval_at(&one, &store, now + 1).bridge_error,
            Some(BridgeError::Skipped),
            "{failure}"
        );
        // The other plugin in the same VM still asks its own bridge.
        assert_eq!(eval_at(&two, &store, now + 1).pending.len(), 1, "{failure}");
    }
}

#[test]
fn only_a_call_envoy_could_not_deliver_is_sent_again_and_within_the_timeout() {
    // The default bridge timeout: 50 ms.
    let e = global("");
    let sent = Micros(T0);
    let after = |ms: u64| Micros(T0 + ms * MS);
    let unreachable = ReplyError::Unreachable;
    assert_eq!(
        e.resend_timeout_ms(&unreachable, false, sent, after(2)),
        Some(48)
    );
    assert_eq!(
        e.resend_timeout_ms(&ReplyError::NoResponse, false, sent, after(0)),
        Some(50)
    );
    assert_eq!(
        e.resend_timeout_ms(&unreachable, true, sent, after(2)),
        None,
        "sent twice"
    );
    assert_eq!(
        e.resend_timeout_ms(&unreachable, false, sent, after(50)),
        None,
        "no time left"
    );
    for answered in [
        ReplyError::Timeout,
        ReplyError::Unavailable,
        ReplyError::Status(401, String::new()),
        ReplyError::BadBody("x".into()),
    ] {
        assert_eq!(
            e.resend_timeout_ms(&answered, false, sent, after(1)),
            None,
            "{answered}"
        );
    }
}

#[test]
fn a_worker_learns_of_another_workers_bridge_failure_within_10_ms() {
    // Two workers of one Envoy (one engine each, one shared data): each reads the
    // backoff the others wrote at most every 10 ms, not on every call.
    let config = r#"{"bridge":{"cluster":"weir_bridge"},"rules":[{"name":"tenant","scope":"global",
        "limit":{"algorithm":"fixed_window","limit":10,"window":"1h"}}]}"#;
    let parse = || weir_core::config::parse(config.as_bytes()).unwrap();
    let (a, b) = (Engine::new(parse()), Engine::new(parse()));
    let store = MemoryStore::new();
    a.prepare(&store).unwrap();
    assert_eq!(
        eval_at(&b, &store, T0).pending.len(),
        1,
        "b read: no backoff"
    );
    fail_in_a_row(&a, &store, T0 + MS, ReplyError::NoResponse);
    let skipped =
        |e: &Engine, at| eval_at(e, &store, at).bridge_error == Some(BridgeError::Skipped);
    assert!(skipped(&a, T0 + MS + 1), "its own failure at once");
    assert!(
        !skipped(&b, T0 + 9 * MS),
        "b's last read is under 10 ms old"
    );
    assert!(skipped(&b, T0 + 10 * MS), "b reads again");
}

#[test]
fn an_exact_rules_answer_writes_nothing_it_would_not_read() {
    // An exact rule keeps no demand and no units: a request it asks Redis about, allowed,
    // reads its key's slot (for a cached denial) and writes nothing to shared data.
    let e = global("");
    let store = MemoryStore::new();
    e.prepare(&store).unwrap();
    store.fail_next_writes(1, weir_core::store::StoreError::Host(1));
    for n in 0..3 {
        let mut eval = eval_at(&e, &store, T0 + n);
        assert_eq!(eval.pending.len(), 1);
        let answer = reply(vec![result(true, 1, 50)]);
        e.complete(&mut eval, &store, Micros(T0 + n), Micros(T0 + n), answer);
        assert!(!eval.denied());
        assert!(eval.reports[0].lease_store_error.is_none());
    }
    assert_eq!(
        store.failures_left(),
        1,
        "an exact answer wrote shared data"
    );
    store.fail_next_writes(0, weir_core::store::StoreError::Host(1));
    // A denial is still cached.
    let mut eval = eval_at(&e, &store, T0 + 10);
    e.complete(
        &mut eval,
        &store,
        Micros(T0 + 10),
        Micros(T0 + 10),
        reply(vec![result(false, 0, 0)]),
    );
    assert_eq!(
        eval_at(&e, &store, T0 + 11).reports[0].source,
        Some(Source::DenialCache)
    );
}

#[test]
fn the_local_fallback_starts_from_what_the_envoy_last_knew() {
    // 100 per minute over 2 instances; Redis said 10 remain, then the bridge fails.
    let e = global(r#","global":{"failure_mode":"local","expected_instances":2}"#);
    let store = MemoryStore::new();
    e.prepare(&store).unwrap();
    let mut eval = eval_at(&e, &store, T0);
    e.complete(
        &mut eval,
        &store,
        Micros(T0),
        Micros(T0),
        reply(vec![result(true, 1, 10)]),
    );
    let mut allowed = 0;
    for i in 1..=40 {
        let now = T0 + i;
        let mut eval = eval_at(&e, &store, now);
        if !eval.pending.is_empty() {
            e.complete(
                &mut eval,
                &store,
                Micros(now),
                Micros(now),
                Err(ReplyError::Unavailable),
            );
        }
        allowed += usize::from(!eval.denied());
    }
    // Half of the 10 that remained: not the full local share of 50.
    assert_eq!(allowed, 5);
}

#[test]
fn the_local_fallback_of_an_unknown_key_is_a_full_share() {
    let e = global(r#","global":{"failure_mode":"local","expected_instances":50}"#);
    let store = MemoryStore::new();
    e.prepare(&store).unwrap();
    let mut allowed = 0;
    for i in 0..5 {
        let mut eval = eval_at(&e, &store, T0 + i);
        if !eval.pending.is_empty() {
            e.complete(
                &mut eval,
                &store,
                Micros(T0 + i),
                Micros(T0 + i),
                Err(ReplyError::Unavailable),
            );
        }
        allowed += usize::from(!eval.denied());
    }
    // 100 per minute over 50 instances: 2 each while the bridge is away.
    assert_eq!(allowed, 2);
}

#[test]
fn rules_after_a_bridge_denial_are_not_charged() {
    let e = engine(
        r#"{"bridge":{"cluster":"b"},"rules":[
            {"name":"first","scope":"global","limit":{"algorithm":"fixed_window","limit":5,"window":"1m"}},
            {"name":"second","scope":"global","limit":{"algorithm":"fixed_window","limit":5,"window":"1m"}}]}"#,
    );
    let store = MemoryStore::new();
    e.prepare(&store).unwrap();
    let mut eval = eval_at(&e, &store, T0);
    assert_eq!(eval.pending.len(), 2, "both rules go in one call");
    e.complete(
        &mut eval,
        &store,
        Micros(T0),
        Micros(T0),
        reply(vec![result(false, 0, 0)]),
    );
    assert!(eval.denied());
    assert_eq!(eval.reports.len(), 1, "the second rule was not evaluated");
}

#[test]
fn a_waiting_request_is_served_from_what_another_call_left() {
    let e = global(r#","global":{"lease":{"max":100,"ttl":"1s"}}"#);
    let store = MemoryStore::new();
    e.prepare(&store).unwrap();
    // Two requests miss at once; the first one's call brings back units for both.
    let mut first = eval_at(&e, &store, T0);
    let mut waiting = eval_at(&e, &store, T0);
    assert_eq!((first.pending.len(), waiting.pending.len()), (1, 1));
    let mut granted = result(true, 5, 50);
    granted.valid_ns = 1_000_000_000;
    e.complete(
        &mut first,
        &store,
        Micros(T0),
        Micros(T0 + 1),
        reply(vec![granted]),
    );
    e.revisit(&mut waiting, &store, Micros(T0 + 1), 1);
    assert!(waiting.pending.is_empty() && !waiting.denied());
    assert_eq!(waiting.reports[0].source, Some(Source::Lease));
}

/// Issue 19, defect 8: the config accepted a `horizon` of a minute and the bridge refused
/// every call of the rule (400). The longest `ttl` and `horizon` the config accepts travel
/// to the bridge and are accepted there; one µs more is refused by the config check.
#[test]
fn the_longest_lease_a_config_accepts_is_one_the_bridge_accepts() {
    let gcra = |ttl: &str, horizon: &str| {
        format!(
            r#"{{"bridge":{{"cluster":"weir_bridge"}},"rules":[{{"name":"tenant","scope":"global",
                "key":[{{"header":"x-user"}}],
                "limit":{{"algorithm":"gcra","rate":1,"period":"1s","burst":100000}},
                "global":{{"lease":{{"max":50,"ttl":"{ttl}","horizon":"{horizon}"}}}}}}]}}"#
        )
    };
    let e = engine(&gcra("1h", "10s"));
    let store = MemoryStore::new();
    e.prepare(&store).unwrap();
    let eval = eval_at(&e, &store, T0);
    let sent = sent_items(&e, &eval);
    assert_eq!(
        (sent[0].ttl_us, sent[0].horizon_us),
        (3_600_000_000, 10_000_000)
    );
    for (ttl, horizon, field) in [
        ("1h", "10000001us", "horizon"),
        ("3600000001us", "10s", "ttl"),
    ] {
        let err = weir_core::config::parse(gcra(ttl, horizon).as_bytes()).unwrap_err();
        assert_eq!(err.path, format!("rules[0].global.lease.{field}"), "{err}");
    }
}

/// Issue 19, defect 7: a global rule's local fallback admitted requests with their
/// estimate and never settled them (the commit looked for a local rule's table): a
/// response that used less refunded nothing, one that used more was never charged.
#[test]
fn a_global_rules_local_fallback_settles_its_commits() {
    let e = engine(
        r#"{"bridge":{"cluster":"weir_bridge"},"rules":[{"name":"llm","scope":"global",
            "key":[{"header":"x-user"}],
            "limit":{"algorithm":"token_bucket","capacity":1000,"refill":1000,"period":"1m"},
            "cost":{"header":"x-estimate","max":1000},"commit":{"header":"x-tokens"},
            "global":{"failure_mode":"local","expected_instances":2}}]}"#,
    );
    let store = MemoryStore::new();
    e.prepare(&store).unwrap();
    let ask = |estimate: u64, now: u64| {
        let mut eval = evaluate(
            &e,
            &store,
            &user("acme").header("x-estimate", estimate.to_string()),
            now,
        );
        e.complete(
            &mut eval,
            &store,
            Micros(now),
            Micros(now),
            Err(ReplyError::NoResponse),
        );
        eval
    };
    // The local share: 500 tokens. An estimate of 400 is admitted by the fallback…
    let first = ask(400, T0);
    assert_eq!(
        first.reports[0].outcome,
        RuleOutcome::BridgeFailed(FailureOutcome::Local { allowed: true })
    );
    let [commit] = &first.commits[..] else {
        panic!("the fallback reserved the estimate: {:?}", first.commits);
    };
    assert!(!commit.is_global(), "counted in this Envoy's shared data");
    // …and used 10: 390 come back, so 450 more fit.
    assert!(
        e.commit(&store, commit, 10, Micros(T0 + MS)).unwrap(),
        "settled"
    );
    let second = ask(450, T0 + 2 * MS);
    assert!(!second.denied(), "{:?}", second.reports);
    // Used 950: 500 more than reserved are charged; nothing fits now.
    assert!(e
        .commit(&store, &second.commits[0], 950, Micros(T0 + 3 * MS))
        .unwrap());
    assert!(ask(1, T0 + 4 * MS).denied());
}

#[test]
fn what_became_of_leased_units_is_counted() {
    let e = global(r#","global":{"lease":{"max":50,"ttl":"20ms"}}"#);
    let granted = |valid_ms: u64| Granted {
        valid_ns: valid_ms * 1_000_000,
        ..result(true, 10, 90)
    };
    // An answer 1 ms after its call: 9 units beyond the request's own, kept.
    let store = MemoryStore::new();
    e.prepare(&store).unwrap();
    let mut eval = eval_at(&e, &store, T0);
    e.complete(
        &mut eval,
        &store,
        Micros(T0),
        Micros(T0 + MS),
        reply(vec![granted(20)]),
    );
    let report = &eval.reports[0];
    assert_eq!(
        (
            report.lease_units_granted,
            report.lease_units_late,
            report.lease_units_expired
        ),
        (9, 0, 0)
    );
    // Two are spent; the other seven are dropped by the first write after they expired
    // (20 ms from the call), and counted once.
    for at in [T0 + 2 * MS, T0 + 3 * MS] {
        let eval = eval_at(&e, &store, at);
        assert_eq!(eval.reports[0].source, Some(Source::Lease));
        assert_eq!(eval.reports[0].lease_units_expired, 0);
    }
    let mut after = eval_at(&e, &store, T0 + 21 * MS);
    assert_eq!(after.pending.len(), 1, "nothing left: it asks");
    let at = Micros(T0 + 21 * MS);
    e.complete(&mut after, &store, at, at, reply(vec![result(true, 1, 50)]));
    assert_eq!(after.reports[0].lease_units_expired, 7);
    let mut again = eval_at(&e, &store, T0 + 22 * MS);
    let at = Micros(T0 + 22 * MS);
    e.complete(&mut again, &store, at, at, reply(vec![result(true, 1, 50)]));
    assert_eq!(again.reports[0].lease_units_expired, 0, "counted once");

    // An answer slower than the units were valid: granted, and all of them late.
    let store = MemoryStore::new();
    e.prepare(&store).unwrap();
    let mut eval = eval_at(&e, &store, T0);
    e.complete(
        &mut eval,
        &store,
        Micros(T0),
        Micros(T0 + 25 * MS),
        reply(vec![granted(20)]),
    );
    let report = &eval.reports[0];
    assert!(!eval.denied(), "the request's own unit is Redis's decision");
    assert_eq!(
        (report.lease_units_granted, report.lease_units_late),
        (9, 9)
    );
}
