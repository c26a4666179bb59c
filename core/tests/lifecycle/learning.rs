//! An adaptive concurrency rule learning its service from the floor: the worker ticks
//! fast while slow start turns requests away, and at its usual pace once it does not.

use super::*;

#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test as test;

#[test]
fn the_tick_speeds_up_while_slow_start_turns_requests_away_and_slows_after() {
    let mut envoy = envoy(
        r#"{"rules":[{"name":"route","limit":{"algorithm":"concurrency","max_in_flight":100,
            "adaptive":{"interval":"500ms"}}}]}"#,
    );
    let root = envoy.root;
    envoy.tick(root);
    assert_eq!(
        envoy.host.state().tick_ms[&root],
        100,
        "nothing to learn yet"
    );

    // The limit starts at its floor, 1: a second request in flight is turned away.
    let (first, action) = envoy.request(&user("a"));
    assert_eq!(action, Action::Continue);
    let (second, _) = envoy.request(&user("b"));
    assert_eq!(reply_of(&envoy, second).map(|r| r.status), Some(429));
    envoy.advance_us(20 * MS);
    envoy.respond(first, 200, &[], b"");
    envoy.close(first);
    envoy.tick(root);
    assert_eq!(
        envoy.host.state().tick_ms[&root],
        LEARNING_TICK_MS,
        "slow start with its limit in use: the worker ticks fast"
    );

    // Nothing turned away (nor the limit reached) since the last merge: the usual pace.
    envoy.advance_us(10 * MS);
    envoy.tick(root);
    assert_eq!(envoy.host.state().tick_ms[&root], 100);
}
