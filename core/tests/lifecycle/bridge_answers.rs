//! What reading a bridge call's answer costs in host calls: the answer's body, and its
//! status only when the body is not the reply; the latency stat at most once a
//! millisecond per worker; no switch back to the root context.

use super::*;
use weir_core::filter::host::CallKind;

#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test as test;

/// A global token bucket per `x-user` with no lease: every request asks Redis.
const EXACT: &str = r#"{"bridge":{"cluster":"weir_bridge"},"rules":[
    {"name":"tenant","scope":"global","key":[{"header":"x-user"}],
     "limit":{"algorithm":"token_bucket","capacity":6000,"refill":6000,"period":"1m"}}]}"#;

/// The host calls of each kind made while `f` ran.
fn calls_during(envoy: &mut Envoy, f: impl FnOnce(&mut Envoy)) -> [u64; CallKind::ALL.len()] {
    let before = envoy.host.state().counts.calls;
    f(envoy);
    let after = envoy.host.state().counts.calls;
    std::array::from_fn(|i| after[i] - before[i])
}

fn of(calls: &[u64], kind: CallKind) -> u64 {
    calls[kind.index()]
}

/// A request of `name` paused on its call, and the reply weir-bridge's model gives it.
fn asked(envoy: &mut Envoy, bridge: &mut ModelBridge, name: &str) -> (u32, u32, Vec<u8>) {
    let (context, action) = envoy.request(&user(name));
    assert_eq!(action, Action::Pause);
    let call = envoy.open_calls().pop().unwrap();
    let reply = bridge.acquire(&call.body, envoy.now_us()).unwrap();
    (context, call.token, serde_json::to_vec(&reply).unwrap())
}

#[test]
fn an_answer_that_is_the_reply_is_read_from_its_body_alone_and_nothing_switches_back() {
    let mut envoy = envoy(EXACT);
    let mut bridge = ModelBridge::default();
    let (context, token, reply) = asked(&mut envoy, &mut bridge, "acme");
    envoy.advance_us(2 * MS);
    let calls = calls_during(&mut envoy, |e| e.answer(token, 200, &reply));
    assert_eq!(resumed(&envoy, context), 1);
    assert_eq!(of(&calls, CallKind::Body), 1);
    assert_eq!(of(&calls, CallKind::Header), 0, "the status is not read");
    // Into the request, and its resume: Envoy restores the effective context when the
    // callback returns.
    assert_eq!(of(&calls, CallKind::Stream), 2);

    // The bridge answers with a 200 alone; a reply under another status is taken all
    // the same (documented in docs/global.md).
    let (context, token, reply) = asked(&mut envoy, &mut bridge, "globex");
    envoy.answer(token, 500, &reply);
    assert_eq!(resumed(&envoy, context), 1);

    // Anything else is read with its status: Envoy's own 503 is the bridge unavailable
    // (sent once more, then the failure mode decides).
    let (context, action) = envoy.request(&user("initech"));
    assert_eq!(action, Action::Pause);
    let envoys_503 = b"upstream connect error or disconnect/reset before headers";
    let token = envoy.open_calls().pop().unwrap().token;
    let calls = calls_during(&mut envoy, |e| e.answer(token, 503, envoys_503));
    assert!(of(&calls, CallKind::Header) >= 1, "the status is read");
    for call in envoy.open_calls() {
        envoy.answer(call.token, 503, envoys_503);
    }
    assert_eq!(
        resumed(&envoy, context),
        1,
        "failure_mode allow lets it through"
    );
    flush_stats(&mut envoy);
    assert_eq!(stat_of(&envoy, "bridge.errors_unavailable"), 1);
}

#[test]
fn a_worker_records_a_calls_latency_at_most_once_a_millisecond() {
    let mut envoy = envoy(EXACT);
    let mut bridge = ModelBridge::default();
    // The first answer, and the stats it sends: what follows counts the records alone.
    warm_up(&mut envoy, &mut bridge, "warm");
    flush_stats(&mut envoy);
    let mut recorded = Vec::new();
    // Answers 400 µs apart: at 0.4, 0.8, 1.2, 1.6, 2.0, 2.4 ms after the first request.
    for n in 0..6 {
        let (_, token, reply) = asked(&mut envoy, &mut bridge, &format!("u{n}"));
        envoy.advance_us(400);
        let calls = calls_during(&mut envoy, |e| e.answer(token, 200, &reply));
        recorded.push(of(&calls, CallKind::Stats));
    }
    // The first, then the first sent at least a millisecond after the last recorded
    // answer (its sending says whether the answer's clock is read for it): sent at 1.6 ms.
    assert_eq!(recorded, [1, 0, 0, 0, 1, 0]);
}

/// A global token bucket of 1 an hour per `x-user`, exact: a key's second request is
/// denied by Redis.
const TIGHT: &str = r#"{"bridge":{"cluster":"weir_bridge"},"rules":[
    {"name":"tenant","scope":"global","key":[{"header":"x-user"}],
     "limit":{"algorithm":"token_bucket","capacity":1,"refill":1,"period":"1h"}}]}"#;

/// Issue 35: an exact grant of what the request costs needs no instant (no round trip
/// to measure, nothing held, nothing recorded), so its answer reads no clock but for
/// the latency's sample, at most once a millisecond; a denial, cached for the key's
/// other requests, reads it; so does every answer of a leased rule.
#[test]
fn an_exact_grant_reads_no_clock_and_a_denial_or_a_lease_does() {
    let clocks = |envoy: &mut Envoy, bridge: &mut ModelBridge, name: &str| {
        let (context, token, reply) = asked(envoy, bridge, name);
        envoy.advance_us(100);
        let calls = calls_during(envoy, |e| e.answer(token, 200, &reply));
        (context, of(&calls, CallKind::Clock))
    };
    let mut envoy = super::envoy(TIGHT);
    let mut bridge = ModelBridge::default();
    let (first, read) = clocks(&mut envoy, &mut bridge, "acme");
    assert_eq!(read, 1, "the latency's first sample");
    assert_eq!(resumed(&envoy, first), 1);
    let (second, read) = clocks(&mut envoy, &mut bridge, "initech");
    assert_eq!(read, 0, "an exact grant within the millisecond");
    assert_eq!(resumed(&envoy, second), 1);
    let (denied, read) = clocks(&mut envoy, &mut bridge, "acme");
    assert_eq!(read, 1, "a denial is recorded at its instant");
    assert_eq!(reply_of(&envoy, denied).map(|r| r.status), Some(429));

    let mut envoy = super::envoy(LEASED);
    let mut bridge = ModelBridge::default();
    warm_up(&mut envoy, &mut bridge, "acme");
    let (_, read) = clocks(&mut envoy, &mut bridge, "initech");
    assert_eq!(read, 1, "a leased rule's answer anchors its grant");
}

/// Issue 35: a key Redis last had units left for is asked about again with no read of
/// the Envoy's cached denials (a shared-data get per request); a key it had nothing left
/// for reads them, and once Redis denied it, the cached denial answers with no call.
#[test]
fn a_key_with_units_left_skips_the_cached_denials_and_one_without_reads_them() {
    let ask = |envoy: &mut Envoy, name: &str| {
        let mut context = 0;
        let calls = calls_during(envoy, |e| context = e.request(&user(name)).0);
        (
            context,
            of(&calls, CallKind::SharedGet),
            of(&calls, CallKind::Dispatch),
        )
    };
    let mut envoy = super::envoy(EXACT);
    let mut bridge = ModelBridge::default();
    warm_up(&mut envoy, &mut bridge, "acme");
    let (_, gets, calls) = ask(&mut envoy, "acme");
    assert_eq!((gets, calls), (0, 1), "5,999 left: straight to Redis");

    let mut envoy = super::envoy(TIGHT);
    let mut bridge = ModelBridge::default();
    warm_up(&mut envoy, &mut bridge, "acme");
    let (denied, gets, calls) = ask(&mut envoy, "acme");
    assert_eq!((gets, calls), (1, 1), "nothing left: the cache, then Redis");
    answer_calls(&mut envoy, &mut bridge);
    assert_eq!(reply_of(&envoy, denied).map(|r| r.status), Some(429));
    let (cached, gets, calls) = ask(&mut envoy, "acme");
    assert_eq!((gets, calls), (1, 0), "the cached denial answers");
    assert_eq!(reply_of(&envoy, cached).map(|r| r.status), Some(429));
}
