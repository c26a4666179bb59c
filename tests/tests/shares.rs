//! A limit its keys share fairly (`share`, issue 36), in a real Envoy with two workers:
//! an organisation's 100 a second shared by its users, each named by the `sub` claim of
//! a token `jwt_authn` verified. One user offers 1,000 a second, nine offer 5 each: the
//! nine get all they ask, the heavy one the rest, and when it stops another heavy user
//! rises to the rest within one window; then the same across two Envoys through the
//! bridge and a Redis Cluster. Judged from Envoy's access log (what reached the route,
//! not what weir says of it, `weir_e2e::shares`): the parent's bound by
//! `conformance::check`, every user's floor by `share::check_floor`. The rule's gauges
//! give its keys and share.

use weir_e2e::decisions::{with_decisions, Logs};
use weir_e2e::global::GlobalStack;
use weir_e2e::shares::{
    config, delayed_config, delayed_logs, jwt_authn, offer_heavy_and_light,
    offer_heavy_and_open_light, offer_tokens, token_config, Phases, ShareRun, TokenRun, LIMIT,
    WHO_HEADER,
};
use weir_e2e::{wasm_filter_yaml, weir_wasm, Bootstrap, Bridge, Envoy, LlmUpstream, RedisCluster};

const PHASES: Phases = Phases {
    seconds: 7,
    switch: 4,
};

/// Judges a run: the parent's bound and every user's floor, then the shares second by
/// second.
fn judge(run: &ShareRun) {
    judge_within(run, 0);
}

/// [`judge`], with `tolerance` units of a key's entitlement possibly leased to another
/// Envoy (and left there unspent at the window's end).
fn judge_within(run: &ShareRun, tolerance: u64) {
    run.parent_bound()
        .unwrap_or_else(|v| panic!("the parent's bound: {v}"));
    run.floor_within(tolerance)
        .unwrap_or_else(|s| panic!("a user's floor: {s}"));
    for ((second, user), (asked, admitted)) in &run.per_second {
        eprintln!("second {second} {user}: {admitted} of {asked}");
    }
    let switch = PHASES.switch;
    // Seconds 1 to 3: the light users get all they ask; heavy1 the rest.
    for second in 1..switch {
        for user in 1..=9 {
            let user = format!("u{user}");
            let (admitted, asked) = (run.admitted(second, &user), run.asked(second, &user));
            assert_eq!(admitted, asked, "{user} in second {second}");
        }
        let light = run.light(second) + run.admitted(second, "u1");
        let heavy = run.admitted(second, "heavy1");
        assert!(
            heavy <= LIMIT - light && heavy + tolerance >= LIMIT - light,
            "heavy1 in second {second}: {heavy}"
        );
    }
    // heavy1 stops; u1 offers 1,000 a second. The second after that, u1 is entitled to
    // all the eight others leave: the rest within one window. (A request of heavy1's sent
    // just before the switch may be decided just after it, by the clock that decides:
    // heavy1 is then entitled to what it asked in that second, held for it.)
    let rest = LIMIT - run.light(switch + 1) - run.asked(switch, "heavy1");
    let risen = run.admitted(switch + 1, "u1");
    assert!(
        risen <= rest && risen + tolerance >= rest,
        "u1 rises to the rest in one window: {risen} of {rest}"
    );
    assert!(rest >= 55, "{rest}");
}

#[test]
fn nine_light_users_get_all_they_ask_and_a_heavy_one_the_rest() {
    let config = with_decisions(&config(true, false));
    let dir = tempfile::tempdir().unwrap();
    let logs = Logs::new(dir.path(), 1, WHO_HEADER);
    let bootstrap = Bootstrap::new()
        .http_filter(jwt_authn())
        .http_filter(wasm_filter_yaml(&config, &weir_wasm()));
    let envoy = Envoy::start(&logs.add_to(0, bootstrap), 2);
    let start = offer_heavy_and_light(&[envoy.http_port], PHASES);
    judge(&ShareRun::read(&logs, start, PHASES));
    assert!(envoy.weir_stat("rule.per-org.limited") > 0);
    // The gauges, from the last request: the nine users active in the second before it,
    // each entitled to at least ⌊100 / 9⌋.
    assert_eq!(envoy.weir_stat("rule.per-org.share_keys"), 9);
    assert_eq!(envoy.weir_stat("rule.per-org.share_units"), 11);
    assert_eq!(envoy.weir_stat("rule.per-org.share_untracked"), 0);
    envoy.assert_no_panic();
}

/// The same rule holding what it would deny (`on_limit.delay`, up to 1 s, 100 requests a
/// worker), each light user's requests on connections of their own: the users held in the
/// first second (nobody entitled yet) are admitted in the next, the backlog drains, and
/// from the fifth second on the shares are those without a delay — every light user its
/// 5 a second with no request held, the heavy user the rest, its excess waiting for the
/// next window instead of failing. Judged from the access log, each held request's hold
/// an ask of the window before its release.
#[test]
fn a_delay_keeps_the_shares_and_holds_the_heavy_users_excess() {
    const SECONDS: u64 = 7;
    let config = with_decisions(&delayed_config());
    let dir = tempfile::tempdir().unwrap();
    let logs = delayed_logs(dir.path());
    let bootstrap = Bootstrap::new()
        .http_filter(jwt_authn())
        .http_filter(wasm_filter_yaml(&config, &weir_wasm()));
    let envoy = Envoy::start(&logs.add_to(0, bootstrap), 2);
    let (start, answered) = offer_heavy_and_open_light(envoy.http_port, SECONDS);
    let run = ShareRun::read_delayed(&logs, start, SECONDS, answered);
    run.parent_bound()
        .unwrap_or_else(|v| panic!("the parent's bound: {v}"));
    run.floor()
        .unwrap_or_else(|s| panic!("a user's floor: {s}"));
    for ((second, user), (asked, admitted)) in &run.per_second {
        eprintln!("second {second} {user}: {admitted} of {asked}");
    }
    let held_at = |user: &str, from_us: u64| {
        run.held
            .iter()
            .filter(|(who, at, _)| who == user && *at >= from_us)
            .count()
    };
    // Second 2: each light user's backlog (asked in second 1, so entitled to it) drains.
    for u in 1..=9 {
        let user = format!("u{u}");
        assert_eq!(
            run.admitted(2, &user),
            run.asked(2, &user),
            "{user} in second 2"
        );
    }
    for second in 4..SECONDS {
        let light: u64 = (1..=9)
            .map(|u| {
                let admitted = run.admitted(second, &format!("u{u}"));
                assert_eq!(admitted, 5, "u{u} in second {second}");
                admitted
            })
            .sum();
        assert_eq!(
            run.admitted(second, "heavy1"),
            LIMIT - light,
            "second {second}"
        );
    }
    for u in 1..=9 {
        let user = format!("u{u}");
        assert_eq!(held_at(&user, start + 4 * 1_000_000), 0, "{user} held late");
    }
    assert!(held_at("heavy1", start + 4 * 1_000_000) > 0);
    let longest = run.held.iter().map(|(_, _, ms)| *ms).max().unwrap_or(0);
    assert!(longest <= 1_010, "held {longest} ms");
    assert!(envoy.weir_stat("rule.per-org.delayed") > 0);
    envoy.assert_no_panic();
}

/// The same through the bridge and a Redis Cluster, each user's requests spread over two
/// Envoys: the parent's keys live in Redis, one quota for both.
#[test]
fn the_same_shares_across_two_envoys_through_the_bridge() {
    let config = with_decisions(&config(true, true));
    let filters = format!("{}{}", jwt_authn(), wasm_filter_yaml(&config, &weir_wasm()));
    let stack = GlobalStack::start_filters(&[filters.clone(), filters], &[], WHO_HEADER);
    let start = offer_heavy_and_light(&stack.ports(), PHASES);
    judge(&ShareRun::read(&stack.logs, start, PHASES));
    assert!(stack.weir_stat("rule.per-org.bridge_decisions") > 7000);
    assert_eq!(stack.weir_stat("rule.per-org.failure_allowed"), 0);
    stack.assert_no_panic();
}

/// Judges a token run: the budget's bound at what responses used, every member's floor in
/// estimates, and that the nine light members got every request they sent while the
/// heavy one used what they left.
fn judge_tokens(run: &TokenRun, seconds: u64) {
    let used = run
        .parent_bound
        .clone()
        .unwrap_or_else(|v| panic!("the budget's bound: {v}"));
    run.floor
        .clone()
        .unwrap_or_else(|s| panic!("a member's floor: {s}"));
    for ((second, who), (sent, admitted, tokens)) in &run.per_second {
        eprintln!("second {second} {who}: {admitted} of {sent}, {tokens} tokens");
    }
    eprintln!("{used} tokens used in all");
    for second in 1..seconds {
        for user in 1..=9 {
            let (sent, admitted, _) = run.of(second, &format!("u{user}"));
            assert_eq!(admitted, sent, "u{user} in second {second}");
        }
        // The heavy member is entitled to what the nine leave of the estimates (1,000 −
        // 9 × 50) and gets back what its responses did not use: it uses most of it.
        let (_, _, heavy) = run.of(second, "heavy1");
        assert!(
            heavy >= 400,
            "heavy1 used {heavy} tokens in second {second}"
        );
    }
}

/// The same with a team's token budget (`commit`): one Envoy, then two through the
/// bridge, in front of a stand-in LLM that reports what each request used.
#[test]
fn a_shared_token_budget_gives_each_member_its_share_and_the_heavy_one_the_rest() {
    const SECONDS: u64 = 5;
    let upstream = LlmUpstream::start();
    let config = with_decisions(&token_config(false));
    let dir = tempfile::tempdir().unwrap();
    let logs = Logs::new(dir.path(), 1, WHO_HEADER);
    let filter = format!("{}{}", jwt_authn(), wasm_filter_yaml(&config, &weir_wasm()));
    let envoy = Envoy::start(&logs.add_to(0, upstream.bootstrap(filter, None)), 2);
    let start = offer_tokens(&[envoy.http_port], SECONDS);
    judge_tokens(&TokenRun::read(&logs, start, SECONDS), SECONDS);
    assert!(envoy.weir_stat("rule.per-org.commit_units_refunded") > 0);
    envoy.assert_no_panic();

    let redis = RedisCluster::start(3, 1);
    let bridge = Bridge::start(&redis, &[]);
    let config = with_decisions(&token_config(true));
    let dir = tempfile::tempdir().unwrap();
    let logs = Logs::new(dir.path(), 2, WHO_HEADER);
    let filter = format!("{}{}", jwt_authn(), wasm_filter_yaml(&config, &weir_wasm()));
    let envoys: Vec<Envoy> = (0..2)
        .map(|i| {
            let bootstrap = upstream.bootstrap(filter.clone(), Some(bridge.port));
            Envoy::start(&logs.add_to(i, bootstrap), 2)
        })
        .collect();
    let ports: Vec<u16> = envoys.iter().map(|e| e.http_port).collect();
    let start = offer_tokens(&ports, SECONDS);
    judge_tokens(&TokenRun::read(&logs, start, SECONDS), SECONDS);
    let settled: u64 = envoys
        .iter()
        .map(|e| e.weir_stat("rule.per-org.commit_usage_read"))
        .sum();
    assert!(settled > 0);
    for envoy in &envoys {
        assert_eq!(envoy.weir_stat("rule.per-org.commit_errors"), 0);
        envoy.assert_no_panic();
    }
}

/// The same with leases (`global.lease.max` 8): a call takes beyond its request only what
/// is left of its user's own entitlement, spent in that Envoy without a call. The shares
/// hold to within what one user's leases may leave in the other Envoy's workers, and the
/// bridge is asked far less.
#[test]
fn the_same_shares_with_leases_ask_the_bridge_less() {
    let global = config(true, true).replacen(
        r#""scope":"global","#,
        r#""scope":"global","global":{"lease":{"max":8}},"#,
        1,
    );
    let config = with_decisions(&global);
    let filters = format!("{}{}", jwt_authn(), wasm_filter_yaml(&config, &weir_wasm()));
    let stack = GlobalStack::start_filters(&[filters.clone(), filters], &[], WHO_HEADER);
    let start = offer_heavy_and_light(&stack.ports(), PHASES);
    let run = ShareRun::read(&stack.logs, start, PHASES);
    // One lease (7 units beyond its request) per worker of the other Envoy.
    judge_within(&run, 2 * 7);
    let calls = stack.weir_stat("rule.per-org.bridge_decisions");
    let leased = stack.weir_stat("rule.per-org.lease_hits");
    eprintln!("{calls} bridge decisions, {leased} requests served from leases");
    assert!(leased > 0);
    assert_eq!(stack.weir_stat("rule.per-org.failure_allowed"), 0);
    stack.assert_no_panic();
}
