//! Global rules on a saturated key: reservations of schedule slots, what other requests
//! get while a call is in flight, and how long a lease may hold what its burst paid for.

use super::*;

#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test as test;

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
