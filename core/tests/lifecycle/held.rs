//! Requests held by a delaying rule (`on_limit.delay`): released by the tick, abandoned,
//! answered when their plugin goes; what stays outstanding meanwhile.

use super::*;

#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test as test;

#[test]
fn a_held_request_is_released_by_the_tick_and_its_response_says_how_long() {
    let (mut envoy, held) = one_held();
    let root = envoy.root;
    assert!(
        envoy.host.state().tick_ms[&root] <= 10,
        "the tick speeds up while a request is held"
    );

    envoy.advance_us(50 * MS);
    envoy.tick(root);
    assert_eq!(resumed(&envoy, held), 0, "not due yet");
    envoy.advance_us(51 * MS);
    envoy.tick(root);
    assert_eq!(
        resumed(&envoy, held),
        1,
        "released on the tick after its slot"
    );
    assert!(reply_of(&envoy, held).is_none());

    envoy.respond(held, 200, &[], b"");
    let waited: u64 = envoy
        .stream(held)
        .unwrap()
        .added(DELAY_HEADER)
        .expect("a released request says how long it waited")
        .parse()
        .unwrap();
    assert_eq!(waited, 101, "held from its arrival to its release");
    flush_stats(&mut envoy);
    let stat = |name: &str| stat_of(&envoy, name);
    assert_eq!(stat("rule.api.delayed"), 1);
    assert_eq!(
        envoy.host.state().tick_ms[&root],
        100,
        "idle again: the slow tick"
    );
}

#[test]
fn a_held_request_abandoned_is_not_released_and_keeps_its_slot() {
    let (mut envoy, held) = one_held();
    let root = envoy.root;
    envoy.advance_us(20 * MS);
    envoy.close(held);

    envoy.advance_us(100 * MS);
    envoy.tick(root);
    assert_eq!(
        envoy.host.state().misdirected,
        0,
        "nothing released on a gone context"
    );
    // The slot the abandoned request was given counts as admitted: a request arriving
    // at its time waits for the slot after it.
    let (_, third) = envoy.request(&user("acme"));
    assert_eq!(
        third,
        Action::Pause,
        "the abandoned request's slot was not handed back"
    );
    flush_stats(&mut envoy);
    let stat = |name: &str| stat_of(&envoy, name);
    assert_eq!(stat("rule.api.delay_abandoned"), 1);
}

#[test]
fn a_plugin_torn_down_answers_the_requests_it_holds() {
    // weir exports no `proxy_on_done`: its root's `proxy_on_delete` must not leave a held
    // request hanging.
    let (mut envoy, held) = one_held();
    envoy.advance_us(30 * MS);
    let root = envoy.root;
    envoy.tear_down(root);
    let reply = reply_of(&envoy, held).expect("answered when its plugin went away");
    assert_eq!(reply.status, 429);
    assert_eq!(resumed(&envoy, held), 0);
    assert_eq!(envoy.host.state().misdirected, 0);
}

/// The `outstanding_units` gauge of rule `api`, as the VM last sent it (the tick sends).
fn outstanding(envoy: &mut Envoy, root: u32) -> i64 {
    envoy.advance_us(200 * MS);
    envoy.tick(root);
    stat_of(envoy, "rule.api.outstanding_units")
}

#[test]
fn held_requests_are_outstanding_until_released_abandoned_or_answered_by_a_teardown() {
    // One a second, delayed up to 5 s: each request after the first is held a second.
    let mut envoy = envoy(
        r#"{"stats":"detailed","rules":[{"name":"api","key":[{"header":"x-user"}],
        "limit":{"algorithm":"gcra","rate":1,"period":"1s","burst":0},
        "on_limit":{"delay":{"max":"5s"}}}]}"#,
    );
    let root = envoy.root;
    let (_, first) = envoy.request(&user("acme"));
    let (held, second) = envoy.request(&user("acme"));
    assert_eq!((first, second), (Action::Continue, Action::Pause));
    assert_eq!(
        outstanding(&mut envoy, root),
        1,
        "held: counted, not admitted"
    );
    envoy.close(held);
    assert_eq!(
        outstanding(&mut envoy, root),
        0,
        "abandoned: never admitted"
    );

    let (released, third) = envoy.request(&user("acme"));
    assert_eq!(third, Action::Pause);
    assert_eq!(outstanding(&mut envoy, root), 1);
    // The tick of a worker holding requests: every millisecond.
    for _ in 0..2_000 {
        envoy.advance_us(MS);
        envoy.tick(root);
    }
    assert_eq!(
        resumed(&envoy, released),
        1,
        "{:?}",
        reply_of(&envoy, released)
    );
    assert_eq!(outstanding(&mut envoy, root), 0, "released: admitted");

    let (_, fourth) = envoy.request(&user("acme"));
    assert_eq!(fourth, Action::Pause);
    assert_eq!(outstanding(&mut envoy, root), 1);
    envoy.tear_down(root);
    assert_eq!(
        stat_of(&envoy, "rule.api.outstanding_units"),
        0,
        "answered 429 by the teardown, and sent then"
    );
}

#[test]
fn reservoir_units_are_outstanding_until_spent_expired_or_their_plugin_goes() {
    let config = r#"{"stats":"detailed","rules":[{"name":"api","key":[{"header":"x-user"}],
        "limit":{"algorithm":"token_bucket","capacity":1000,"refill":1000,"period":"1s"},
        "reservoir":{"max":20,"hold":"500ms"}}]}"#;
    let mut envoy = envoy(config);
    let root = envoy.root;
    // A busy key: the worker takes units ahead of its requests.
    for _ in 0..50 {
        let (_, action) = envoy.request(&user("acme"));
        assert_eq!(action, Action::Continue);
        envoy.advance_us(100);
    }
    // Stats are sent on the tick (no unit has expired yet).
    envoy.advance_us(150 * MS);
    envoy.tick(root);
    let held = stat_of(&envoy, "rule.api.reservoir_units_taken")
        - stat_of(&envoy, "rule.api.reservoir_hits")
        - stat_of(&envoy, "rule.api.reservoir_units_expired");
    let gauge = stat_of(&envoy, "rule.api.outstanding_units");
    assert!(held > 0, "the reservoir holds units");
    assert_eq!(gauge, held, "taken less spent less expired");
    // Past their hold with no request for the key: the tick's sweep drops them.
    let expired_before = stat_of(&envoy, "rule.api.reservoir_units_expired");
    envoy.advance_us(400 * MS);
    assert_eq!(outstanding(&mut envoy, root), 0);
    assert_eq!(
        stat_of(&envoy, "rule.api.reservoir_units_expired") - expired_before,
        held,
        "counted as expired, never admitted"
    );

    // Taken again, then the plugin goes (a config update): lost with its worker.
    for _ in 0..50 {
        envoy.request(&user("acme"));
        envoy.advance_us(100);
    }
    envoy.advance_us(150 * MS);
    envoy.tick(root);
    assert!(stat_of(&envoy, "rule.api.outstanding_units") > 0);
    let lost = stat_of(&envoy, "rule.api.outstanding_units");
    let new_root = envoy.configure(config).unwrap();
    envoy.tear_down(root);
    assert_eq!(stat_of(&envoy, "rule.api.outstanding_units"), 0);
    assert_eq!(stat_of(&envoy, "rule.api.reservoir_units_evicted"), lost);
    envoy.tick(new_root);
}

/// A shared limit of 1 a second with a queue of 2 in Envoy: a member holding both places
/// loses its newest to another member's request (answered 429 on the next tick, counted
/// in `delay_queue_full`), and at the window's end the held requests leave in turns and
/// are decided again.
#[test]
fn a_full_shared_queue_pushes_out_the_newest_request_of_the_member_holding_most() {
    let mut envoy = envoy(
        r#"{"stats":"detailed","trusted_headers":["x-member"],"rules":[{"name":"team",
        "key":[{"header":"x-user"}],
        "limit":{"algorithm":"fixed_window","limit":1,"window":"1s"},
        "share":{"by":[{"header":"x-member"}]},
        "on_limit":{"delay":{"max":"2s","queue":2}}}]}"#,
    );
    let root = envoy.root;
    let member = |m: &'static str| [(":path", "/"), ("x-user", "acme"), ("x-member", m)];
    let (_, first) = envoy.request(&member("a"));
    assert_eq!(first, Action::Continue);
    let (a2, held_a2) = envoy.request(&member("a"));
    let (a3, held_a3) = envoy.request(&member("a"));
    assert_eq!((held_a2, held_a3), (Action::Pause, Action::Pause));
    let (b1, held_b1) = envoy.request(&member("b"));
    assert_eq!(held_b1, Action::Pause, "b takes a's newest place");
    envoy.advance_us(MS);
    envoy.tick(root);
    assert_eq!(reply_of(&envoy, a3).map(|r| r.status), Some(429));
    assert!(reply_of(&envoy, a2).is_none() && reply_of(&envoy, b1).is_none());
    // The window ends: a and b asked in it, so both are active; the unit goes to one of
    // them and the other is held for the next window (its `max` covers it).
    envoy.advance_us(1_000 * MS);
    envoy.tick(root);
    let released = resumed(&envoy, a2) + resumed(&envoy, b1);
    assert_eq!(released, 1, "one unit in the window");
    flush_stats(&mut envoy);
    assert_eq!(stat_of(&envoy, "rule.team.delay_queue_full"), 1);
}
