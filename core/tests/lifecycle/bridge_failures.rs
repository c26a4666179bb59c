//! The lifecycle when a bridge call fails: the failure mode applied and the request resumed
//! or answered, a call Envoy could not deliver sent once more, and calls failing in a row.

use super::*;

#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test as test;

#[test]
fn a_failed_call_applies_the_failure_mode_and_resumes_or_answers() {
    let mut envoy = envoy(
        r#"{"stats":"detailed","bridge":{"cluster":"weir_bridge"},"rules":[
        {"name":"tenant","scope":"global","key":[{"header":"x-user"}],"global":{"failure_mode":"deny"},
         "limit":{"algorithm":"token_bucket","capacity":100,"refill":100,"period":"1m"}}]}"#,
    );
    for _ in 0..BRIDGE_FAILURES_TO_SKIP {
        let (request, action) = envoy.request(&user("acme"));
        assert_eq!(action, Action::Pause);
        let token = envoy.open_calls()[0].token;
        envoy.answer(token, 504, b"upstream request timeout");
        assert!(envoy.open_calls().is_empty(), "a timeout is not sent again");
        assert_eq!(resumed(&envoy, request), 0);
        assert_eq!(reply_of(&envoy, request).unwrap().status, 503);
        envoy.advance_us(BRIDGE_FAILING_FOR_US / 2);
    }
    // Calls failed that many times in a row, for a while, less than a second ago: the
    // next request is not paused for the bridge.
    let (skipped, action) = envoy.request(&user("acme"));
    assert_eq!(action, Action::Pause, "answered here");
    assert!(envoy.open_calls().is_empty());
    assert_eq!(reply_of(&envoy, skipped).unwrap().status, 503);
    // No cluster to call: the failure mode decides at once.
    envoy.advance_us(2_000 * MS);
    envoy.host.state().refuse.dispatch = true;
    let (refused, _) = envoy.request(&user("acme"));
    assert_eq!(reply_of(&envoy, refused).unwrap().status, 503);
    flush_stats(&mut envoy);
    let stat = |name: &str| stat_of(&envoy, name);
    assert_eq!(stat("bridge.errors_timeout"), 3);
    assert_eq!(stat("bridge.skipped"), 1);
    assert_eq!(stat("rule.tenant.failure_denied"), 5);
}

const DENY: &str = r#"{"stats":"detailed","bridge":{"cluster":"weir_bridge","timeout":"100ms"},"rules":[
    {"name":"tenant","scope":"global","key":[{"header":"x-user"}],"global":{"failure_mode":"deny"},
     "limit":{"algorithm":"token_bucket","capacity":100,"refill":100,"period":"1m"}}]}"#;
/// What Envoy answers itself for a host that refuses the connection.
const REFUSED: &[u8] =
    b"upstream connect error or disconnect/reset before headers. reset reason: connection failure";

/// A replica restarts: Envoy answers the call itself (503, not the bridge's body). The
/// call is sent once more, with the same body and what is left of the timeout, and the
/// answer of the second send decides — for the request and for one that waited on it.
/// Such failures, answered in between, never skip the bridge.
#[test]
fn a_call_envoy_could_not_deliver_is_sent_once_more() {
    let mut envoy = envoy(LEASED);
    let mut bridge = ModelBridge::default();
    warm_up(&mut envoy, &mut bridge, "acme");
    for round in 0..2 * BRIDGE_FAILURES_TO_SKIP {
        let (request, action) = envoy.request(&user(&format!("user-{round}")));
        assert_eq!(action, Action::Pause);
        let (waiter, action) = envoy.request(&user(&format!("user-{round}")));
        let [first] = &envoy.open_calls()[..] else {
            panic!("one call: {:?}", envoy.open_calls())
        };
        assert_eq!(action, Action::Pause, "waits on the call");
        envoy.advance_us(30 * MS);
        envoy.answer(first.token, 503, REFUSED);
        let [again] = &envoy.open_calls()[..] else {
            panic!("sent once more: {:?}", envoy.open_calls())
        };
        assert_ne!(again.token, first.token);
        assert_eq!((again.path(), &again.body), (first.path(), &first.body));
        assert_eq!(
            (first.timeout_ms, again.timeout_ms),
            (50, 20),
            "what is left of the timeout"
        );
        assert!(reply_of(&envoy, request).is_none() && resumed(&envoy, request) == 0);
        answer_calls(&mut envoy, &mut bridge);
        assert_eq!(resumed(&envoy, request), 1, "round {round}");
        // The waiter looked again: served by what the call brought, or by a call of its
        // own (a key without demand yet asks for no more than its request).
        answer_calls(&mut envoy, &mut bridge);
        assert_eq!(resumed(&envoy, waiter), 1, "round {round}");
        assert!(envoy.open_calls().is_empty());
    }
    flush_stats(&mut envoy);
    let stat = |name: &str| stat_of(&envoy, name);
    assert_eq!(stat("bridge.resent"), 6);
    assert_eq!(stat("bridge.joined"), 6);
    assert_eq!(stat("bridge.errors_unavailable"), 0);
    assert_eq!(stat("bridge.skipped"), 0);
}

/// Sent once more and refused again: the failure mode decides, once. The bridge's own
/// 503 (Redis failing behind it, the same for every replica) is not sent again. Only
/// [`BRIDGE_FAILURES_TO_SKIP`] failed calls in a row, over [`BRIDGE_FAILING_FOR_US`], skip
/// the bridge; an answered call between starts the count again.
#[test]
fn only_calls_failing_in_a_row_skip_the_bridge() {
    let mut envoy = envoy(DENY);
    let fail = |envoy: &mut Envoy, status: u16, body: &[u8]| {
        let (request, action) = envoy.request(&user("acme"));
        assert_eq!(action, Action::Pause);
        let token = envoy.open_calls()[0].token;
        envoy.answer(token, status, body);
        if status == 503 && body == REFUSED {
            let token = envoy.open_calls()[0].token;
            envoy.answer(token, 0, b"");
        }
        assert!(envoy.open_calls().is_empty(), "sent at most twice");
        assert_eq!(reply_of(envoy, request).unwrap().status, 503);
        envoy.advance_us(BRIDGE_FAILING_FOR_US / 2);
    };
    let redis_down = br#"{"error":"redis unavailable (timeout)"}"#;
    for _ in 1..BRIDGE_FAILURES_TO_SKIP {
        fail(&mut envoy, 503, REFUSED);
    }
    // An answer between: the count starts again.
    let (answered, _) = envoy.request(&user("acme"));
    let mut bridge = ModelBridge::default();
    answer_calls(&mut envoy, &mut bridge);
    assert_eq!(resumed(&envoy, answered), 1);
    for _ in 1..BRIDGE_FAILURES_TO_SKIP {
        fail(&mut envoy, 503, redis_down);
    }
    let (called, action) = envoy.request(&user("acme"));
    assert_eq!(action, Action::Pause);
    assert_eq!(envoy.open_calls().len(), 1, "not skipped yet");
    let token = envoy.open_calls()[0].token;
    envoy.answer(token, 503, redis_down);
    assert_eq!(reply_of(&envoy, called).unwrap().status, 503);
    // That many in a row: skipped, then tried again after the backoff.
    let (skipped, _) = envoy.request(&user("acme"));
    assert!(envoy.open_calls().is_empty());
    assert_eq!(reply_of(&envoy, skipped).unwrap().status, 503);
    envoy.advance_us(BRIDGE_BACKOFF_US);
    let (tried, _) = envoy.request(&user("acme"));
    assert_eq!(envoy.open_calls().len(), 1, "tried again after the backoff");
    answer_calls(&mut envoy, &mut bridge);
    assert_eq!(resumed(&envoy, tried), 1);
    flush_stats(&mut envoy);
    let stat = |name: &str| stat_of(&envoy, name);
    assert_eq!(stat("bridge.resent"), 2);
    assert_eq!(stat("bridge.errors_unavailable"), 2 + 3);
    assert_eq!(stat("bridge.skipped"), 1);
    assert_eq!(stat("rule.tenant.failure_denied"), 2 + 3 + 1);
}
