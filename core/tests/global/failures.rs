//! Global rules when the bridge fails: the failure modes, the backoff that leaves the
//! bridge alone for a while, calls sent again, and the local fallback.

use super::*;

#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test as test;

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
