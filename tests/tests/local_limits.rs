//! Local limits in a real Envoy: exactness across workers, what clients see, shadow mode,
//! gRPC, bad configs, key isolation, bounded memory and hostile input.
//!
//! Each test serves its own listener (its plugins and clusters renamed apart) on the binary's
//! shared Envoy of its worker count (`Envoy::shared`); the memory test starts an Envoy of its
//! own, and refused configs are started alone.

use std::collections::BTreeMap;
use std::thread;
use std::time::{Duration, Instant};
use weir_e2e::decisions::{with_decisions, Judge, Logs};
use weir_e2e::jwt::{hs256, jwt_authn_filter};
use weir_e2e::{
    get, run_clients, send, wasm_filter_yaml, weir_wasm, Bootstrap, Client, Envoy, Request,
};

mod responses;

fn weir(config: &str) -> Bootstrap {
    Bootstrap::new().http_filter(wasm_filter_yaml(config, &weir_wasm()))
}

/// Parses a structured-field list of strings with integer parameters, as the IETF
/// RateLimit headers use: `"a";q=10;w=60, "b";q=5;w=1`. Panics on anything else.
fn parse_sf_list(value: &str) -> Vec<(String, BTreeMap<String, u64>)> {
    value
        .split(", ")
        .map(|member| {
            let mut parts = member.split(';');
            let name = parts.next().unwrap();
            assert!(
                name.len() >= 2 && name.starts_with('"') && name.ends_with('"'),
                "member {member:?} of {value:?} is not a quoted string"
            );
            let params = parts
                .map(|p| {
                    let (k, v) = p
                        .split_once('=')
                        .unwrap_or_else(|| panic!("bad param {p:?} in {value:?}"));
                    assert!(k.chars().all(|c| c.is_ascii_lowercase()), "bad key {k:?}");
                    (
                        k.to_string(),
                        v.parse::<u64>()
                            .unwrap_or_else(|_| panic!("bad integer {v:?} in {value:?}")),
                    )
                })
                .collect();
            (name.trim_matches('"').to_string(), params)
        })
        .collect()
}

fn count_admitted(envoy: &Envoy, clients: usize, total: usize, user: &str) -> (usize, usize) {
    let user = user.to_string();
    let report = run_clients(clients, total, envoy.http_port, move |_, _| {
        Request::get("/api/items").header("x-user", &user)
    });
    report.assert_no_errors();
    (report.count(200), report.count(429))
}

/// N workers racing on one key must admit exactly what one thread would. The refill is
/// so slow (1 per 10 minutes or slower) that what one thread admits during the test is the burst; half
/// the requests are admitted, so most of them race to write the same slot.
fn exact_across_workers(limit: &str, expected: usize) {
    let config = format!(
        r#"{{"rules":[{{"name":"per-user","key":[{{"header":"x-user"}}],"limit":{limit}}}]}}"#
    );
    let config = with_decisions(&config);
    let dir = tempfile::tempdir().unwrap();
    let logs = Logs::new(dir.path(), 1, "x-user");
    let envoy = Envoy::shared(&logs.add_to(0, weir(&config)), 4);
    let total = 2 * expected;
    let (admitted, limited) = count_admitted(&envoy, 16, total, "alice");
    let served = envoy.weir_stat("rule.per-user.reservoir_hits");
    let taken = envoy.weir_stat("rule.per-user.reservoir_units_taken");
    let lost = envoy.weir_stat("rule.per-user.reservoir_units_expired")
        + envoy.weir_stat("rule.per-user.reservoir_units_evicted");
    eprintln!(
        "{limit}: {served} served from reservoirs, {taken} units taken ahead, {lost} \
         expired or evicted, {} cached denials",
        envoy.weir_stat("rule.per-user.denial_cache_hits"),
    );
    // Exact in count and in time: the admissions of all 4 workers keep the bound, and
    // every unit of the burst is accounted for — admitted, or still in the reservoir of
    // a worker whose clients stopped before spending it (counted in shared data, never
    // admitted: the documented cost of reservoirs, at most a few units here).
    let checked = logs.assert_conformant(&Judge::configured(&config, "per-user"), total);
    assert_eq!(
        checked.admitted, admitted as u64,
        "admissions in the access log"
    );
    let still_held = taken - served - lost;
    assert_eq!(
        admitted as u64 + still_held + lost,
        expected as u64,
        "admitted across 4 workers, with {still_held} units still held and {lost} lost"
    );
    // What stays in reservoirs is bounded by one take per worker whose clients stopped
    // first: at most `reservoir.max` − 1 (31) each. Usually 0–3 here; a CI run left 7.
    assert!(
        still_held + lost <= 4 * 31,
        "{still_held} units held, {lost} lost"
    );
    assert_eq!(limited, total - admitted);
    assert_eq!(envoy.weir_stat("rule.per-user.allowed"), admitted as u64);
    assert_eq!(
        envoy.weir_stat("rule.per-user.limited"),
        (total - admitted) as u64
    );
    assert_eq!(envoy.weir_stat("store.cas_give_ups"), 0);
    eprintln!(
        "{limit}: {admitted} admitted, {limited} limited, {} CAS retries",
        envoy.weir_stat("store.cas_retries")
    );
    envoy.assert_no_panic();
}

#[test]
fn gcra_is_exact_across_four_workers() {
    exact_across_workers(
        r#"{"algorithm":"gcra","rate":1,"period":"10m","burst":1999}"#,
        2000,
    );
}

/// The issue's figure: a burst of 50 from 16 clients on 4 workers, with the default
/// reservoirs (which take nothing once half the limit is gone). Usually exactly 50; a
/// unit a worker took while the key was far from its limit and never spent (its clients
/// stopped first) is the documented exception, accounted for by the check.
#[test]
fn a_burst_of_50_is_exact_across_four_workers() {
    exact_across_workers(
        r#"{"algorithm":"gcra","rate":1,"period":"10m","burst":49}"#,
        50,
    );
    exact_across_workers(
        r#"{"algorithm":"fixed_window","limit":50,"window":"1h"}"#,
        50,
    );
}

#[test]
fn token_bucket_is_exact_across_four_workers() {
    exact_across_workers(
        r#"{"algorithm":"token_bucket","capacity":2000,"refill":1,"period":"1h"}"#,
        2000,
    );
}

/// Workers take units ahead while the key is far from its limit, go idle, then all burst
/// at once: what they held must not add to what the bucket refilled meanwhile.
#[test]
fn reservoirs_then_idle_then_a_burst_on_every_worker_keep_the_bound() {
    let config = with_decisions(
        r#"{"rules":[{"name":"per-user","key":[{"header":"x-user"}],
            "limit":{"algorithm":"gcra","rate":1000,"period":"1s","burst":499},
            "reservoir":{"max":16}}]}"#,
    );
    let dir = tempfile::tempdir().unwrap();
    let logs = Logs::new(dir.path(), 1, "x-user");
    let envoy = Envoy::shared(&logs.add_to(0, weir(&config)), 4);
    // Far from the limit: 400 requests paced over a second from 16 clients.
    let start = Instant::now();
    let far = run_clients(16, 400, envoy.http_port, |_, i| {
        let due = start + Duration::from_micros(2_500 * i as u64);
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            thread::sleep(wait);
        }
        Request::get("/").header("x-user", "alice")
    });
    far.assert_no_errors();
    assert_eq!(far.count(200), 400, "far from the limit nothing is denied");
    thread::sleep(Duration::from_millis(700));
    // Every worker at once.
    let burst = run_clients(16, 2_000, envoy.http_port, |_, _| {
        Request::get("/").header("x-user", "alice")
    });
    burst.assert_no_errors();
    let checked = logs.assert_conformant(&Judge::configured(&config, "per-user"), 2_400);
    let hits = envoy.weir_stat("rule.per-user.reservoir_hits");
    eprintln!(
        "burst: {} of 2000 admitted; {hits} requests served from reservoirs, {} units taken, \
         {} expired",
        burst.count(200),
        envoy.weir_stat("rule.per-user.reservoir_units_taken"),
        envoy.weir_stat("rule.per-user.reservoir_units_expired"),
    );
    assert_eq!(checked.requests, 400 + burst.count(200));
    assert!(hits > 0, "no request was served from a reservoir");
    // A full bucket after the idle period: the burst (500) less what the hold costs.
    assert!(burst.count(200) >= 400, "burst: {}", burst.count(200));
    envoy.assert_no_panic();
}

/// A flood of new keys through a table of 64 keys (and 16 per worker's reservoirs) while
/// one key is at its limit: the flood evicts its own kind, never the key at its limit,
/// which would then start afresh and admit a second window's worth.
#[test]
fn a_key_flood_at_max_keys_keeps_the_bound_of_a_key_at_its_limit() {
    let config = with_decisions(
        r#"{"rules":[{"name":"per-user","stats":"detailed","key":[{"header":"x-user"}],"max_keys":64,
            "limit":{"algorithm":"fixed_window","limit":100,"window":"1s"},
            "reservoir":{"max":16,"max_keys":16}}]}"#,
    );
    let dir = tempfile::tempdir().unwrap();
    let logs = Logs::new(dir.path(), 1, "x-user");
    let envoy = Envoy::shared(&logs.add_to(0, weir(&config)), 4);
    let report = run_clients(16, 3_000, envoy.http_port, |_, i| {
        let user = if i % 2 == 0 {
            "hot".to_string()
        } else {
            format!("flood-{i}")
        };
        Request::get("/").header("x-user", user)
    });
    report.assert_no_errors();
    let checked = logs.assert_conformant(&Judge::configured(&config, "per-user"), 3_000);
    let evictions = envoy.weir_stat("rule.per-user.slot_evictions");
    eprintln!(
        "{} keys, {} admitted; {evictions} slot evictions, {} reservoir evictions",
        checked.keys,
        checked.admitted,
        envoy.weir_stat("rule.per-user.reservoir_evictions")
    );
    assert!(
        evictions > 100,
        "the flood did not fill the table: {evictions} evictions"
    );
    assert_eq!(checked.keys, 1_501);
    envoy.assert_no_panic();
}

#[test]
fn envoy_refuses_a_bad_config_and_says_which_field() {
    let config = r#"{"rules":[{"name":"per-user","key":[{"header":"x-user"}],
                     "limit":{"algorithm":"gcra","rate":10,"period":"5x"}}]}"#;
    let log = Envoy::start_expect_failure(&weir(config));
    let line = log
        .lines()
        .find(|l| l.contains("invalid configuration:"))
        .unwrap_or_else(|| panic!("log does not carry weir's message:\n{log}"));
    assert!(
        line.ends_with(r#": invalid configuration: rules[0].limit.period: invalid duration "5x": expected a whole number followed by us, ms, s, m, h or d (e.g. "500ms")"#),
        "{line}"
    );
    // Envoy names the plugin; weir does not repeat it.
    assert!(
        !line.contains("weir: weir:") && !line.contains(": weir: "),
        "{line}"
    );
    // A secret that should come from the VM's environment, which does not have it.
    let config = r#"{"bridge":{"cluster":"weir_bridge","secret_env":"WEIR_BRIDGE_SECRET"},
        "rules":[{"name":"quota","scope":"global","limit":{"algorithm":"fixed_window","limit":10,"window":"1m"}}]}"#;
    let log = Envoy::start_expect_failure(&weir(config));
    assert!(
        log.contains(
            r#"bridge.secret_env: the environment variable "WEIR_BRIDGE_SECRET" is not set"#
        ),
        "log does not carry weir's message:\n{log}"
    );
}

#[test]
fn users_never_share_a_bucket_and_parts_cannot_be_spliced() {
    let config = r#"{"rules":[
      {"name":"per-user","match":{"path":{"prefix":"/u"}},"key":[{"header":"x-user"}],
       "limit":{"algorithm":"fixed_window","limit":3,"window":"1h"}},
      {"name":"pair","match":{"path":{"prefix":"/pair"}},"key":[{"header":"x-a"},{"header":"x-b"}],
       "limit":{"algorithm":"fixed_window","limit":1,"window":"1h"}},
      {"name":"anon","match":{"path":{"prefix":"/anon"}},"key":[{"header":"x-user","default":"anonymous"}],
       "limit":{"algorithm":"fixed_window","limit":1,"window":"1h"}}]}"#;
    let envoy = Envoy::shared(&weir(config), 2);
    let status =
        |path: &str, headers: &[(&str, &str)]| get(envoy.http_port, path, headers).unwrap().status;

    for _ in 0..3 {
        assert_eq!(status("/u", &[("x-user", "alice")]), 200);
    }
    assert_eq!(status("/u", &[("x-user", "alice")]), 429);
    for _ in 0..3 {
        assert_eq!(
            status("/u", &[("x-user", "bob")]),
            200,
            "bob pays for alice"
        );
    }
    assert_eq!(
        status("/u", &[("x-user", "alice ")]),
        429,
        "Envoy trims header whitespace"
    );
    assert_eq!(
        status("/u", &[("x-user", "Alice")]),
        200,
        "values are case-sensitive"
    );

    assert_eq!(status("/pair", &[("x-a", "a:b"), ("x-b", "c")]), 200);
    assert_eq!(status("/pair", &[("x-a", "a:b"), ("x-b", "c")]), 429);
    assert_eq!(
        status("/pair", &[("x-a", "a"), ("x-b", "b:c")]),
        200,
        "spliced parts collided"
    );
    assert_eq!(
        status("/pair", &[("x-a", "a:b:c"), ("x-b", "")]),
        200,
        "empty part is missing"
    );

    assert_eq!(status("/anon", &[]), 200);
    assert_eq!(
        status("/anon", &[]),
        429,
        "clients without x-user share the default bucket"
    );
    assert_eq!(
        status("/anon", &[("x-user", "anonymous")]),
        200,
        "a client forged the default"
    );
    envoy.assert_no_panic();
}

#[test]
fn a_denial_spends_earlier_rules_but_not_later_ones() {
    let config = r#"{"rules":[
      {"name":"route-before","limit":{"algorithm":"fixed_window","limit":1000,"window":"1h"}},
      {"name":"per-user","key":[{"header":"x-user"}],"limit":{"algorithm":"fixed_window","limit":2,"window":"1h"}},
      {"name":"route-after","limit":{"algorithm":"fixed_window","limit":1000,"window":"1h"}}]}"#;
    let envoy = Envoy::shared(&weir(config), 1);
    for _ in 0..5 {
        get(envoy.http_port, "/", &[("x-user", "dave")]).unwrap();
    }
    assert_eq!(envoy.weir_stat("rule.per-user.allowed"), 2);
    assert_eq!(envoy.weir_stat("rule.per-user.limited"), 3);
    assert_eq!(
        envoy.weir_stat("rule.route-before.allowed"),
        5,
        "rules before the denial are spent"
    );
    assert_eq!(
        envoy.weir_stat("rule.route-after.allowed"),
        2,
        "rules after the denial are not charged"
    );
    let r = get(envoy.http_port, "/", &[("x-user", "dave")]).unwrap();
    let policy = parse_sf_list(r.header("ratelimit-policy").unwrap());
    let names: Vec<_> = policy.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["route-before", "per-user"]);
}

#[test]
fn cost_from_a_header_is_bounded() {
    let config = r#"{"rules":[{"name":"bytes","key":[{"header":"x-user"}],
        "cost":{"header":"x-cost","default":1,"max":4},
        "limit":{"algorithm":"token_bucket","capacity":10,"refill":10,"period":"1h"}}]}"#;
    let envoy = Envoy::shared(&weir(config), 1);
    let remaining = |cost: &str| {
        let r = get(
            envoy.http_port,
            "/",
            &[("x-user", "erin"), ("x-cost", cost)],
        )
        .unwrap();
        (
            r.status,
            r.header("ratelimit").map(|v| parse_sf_list(v)[0].1["r"]),
        )
    };
    assert_eq!(remaining("3").0, 200); // 7 left
    assert_eq!(remaining("1000").0, 200); // clamped to 4: 3 left
    assert_eq!(remaining("abc").0, 200); // default 1: 2 left
    assert_eq!(remaining("-2").0, 200); // default 1: 1 left
    let (status, r) = remaining("2");
    assert_eq!((status, r), (429, Some(1)));
}

#[test]
fn hostile_input_never_panics_and_missing_keys_skip_the_rule() {
    let config = r#"{"rules":[
      {"name":"per-user","key":[{"header":"x-user"}],"limit":{"algorithm":"gcra","rate":1,"period":"1h","burst":1}},
      {"name":"by-query","key":[{"query_param":"tenant"}],"limit":{"algorithm":"sliding_window","limit":1,"window":"1h"}}]}"#;
    let envoy = Envoy::shared(&weir(config), 2);
    let big = "u".repeat(60 * 1024);
    let binary: Vec<u8> = (0x80u8..=0xff).collect();
    let mut client = Client::connect(envoy.http_port).unwrap();
    let mut go = |req: Request| client.request(req).unwrap().status;

    // Big and non-UTF-8 values are keys like any other: two requests pass, the third is limited.
    assert_eq!(go(Request::get("/").header("x-user", &big)), 200);
    assert_eq!(go(Request::get("/").header("x-user", &big)), 200);
    assert_eq!(go(Request::get("/").header("x-user", &big)), 429);
    assert_eq!(go(Request::get("/").header("x-user", &binary)), 200);
    assert_eq!(go(Request::get("/").header("x-user", &binary)), 200);
    assert_eq!(go(Request::get("/").header("x-user", &binary)), 429);

    // Missing and empty sources: the rule does not apply (counted as key_missing).
    for _ in 0..3 {
        assert_eq!(go(Request::get("/")), 200);
        assert_eq!(go(Request::get("/").header("x-user", "")), 200);
    }
    assert_eq!(envoy.weir_stat("rule.per-user.key_missing"), 6);

    // Malformed query strings.
    for path in [
        "/?tenant=%zz%",
        "/?tenant",
        "/?&&=&tenant=",
        "/?tenant=%FF%FE",
        "/?tenant=a&tenant=b",
    ] {
        go(Request::get(path));
    }
    assert_eq!(
        go(Request::get("/?tenant=%61%62")),
        200,
        "percent-decoded 'ab' is a new key"
    );
    assert_eq!(
        go(Request::get("/?tenant=ab")),
        429,
        "'ab' and '%61%62' are the same tenant"
    );
    envoy.assert_no_panic();
    assert_eq!(
        go(Request::get("/").header("x-user", "frank")),
        200,
        "still serving"
    );
}

#[test]
fn memory_stays_bounded_by_max_keys() {
    let config = r#"{"rules":[{"name":"per-user","key":[{"header":"x-user"}],"max_keys":1000,
        "limit":{"algorithm":"gcra","rate":1,"period":"1h","burst":4}}]}"#;
    let envoy = Envoy::start(&weir(config), 2);
    assert_eq!(envoy.weir_stat("rule.per-user.slots_capacity"), 1000);
    let send_users = |from: usize, to: usize| {
        let report = run_clients(4, to - from, envoy.http_port, move |_, i| {
            Request::get("/").header("x-user", format!("user-{}", from + i))
        });
        report.assert_no_errors();
        assert_eq!(report.count(200), to - from, "a fresh user was limited");
    };
    send_users(0, 10_000);
    let rss_warm = envoy.memory_rss();
    send_users(10_000, 100_000);
    let rss_end = envoy.memory_rss();
    let in_use = envoy.weir_stat("rule.per-user.slots_in_use");
    eprintln!(
        "100k keys: slots_in_use {in_use}, takeovers {}, evictions {}, RSS {} → {} KiB",
        envoy.weir_stat("store.slot_takeovers"),
        envoy.weir_stat("rule.per-user.slot_evictions"),
        rss_warm >> 10,
        rss_end >> 10
    );
    assert!(in_use <= 1000, "slots in use {in_use} > max_keys");
    assert_eq!(in_use, 1000, "every slot gets used by 100k keys");
    // One shared-data key per distinct client would cost ~140 bytes × 90k ≈ 12 MiB here.
    let growth = rss_end.saturating_sub(rss_warm);
    assert!(
        growth < 4 << 20,
        "Envoy RSS grew {} KiB over 90k new keys",
        growth >> 10
    );
    envoy.assert_no_panic();
}

/// envoy/envoy.yaml as shipped (ports rewritten), with a Redis Cluster and weir-bridge:
/// the local per-user and login limits, and the global per-tenant quota.
#[test]
fn the_demo_config_limits_per_user_and_per_tenant() {
    let redis = weir_e2e::RedisCluster::start(3, 1);
    let bridge = weir_e2e::Bridge::start(&redis, &[]);
    let yaml = std::fs::read_to_string(weir_e2e::repo_root().join("envoy/envoy.yaml")).unwrap();
    let (admin, http) = (weir_e2e::free_port(), weir_e2e::free_port());
    let yaml = yaml
        .replace("port_value: 9901", &format!("port_value: {admin}"))
        .replace("port_value: 10000", &format!("port_value: {http}"))
        .replace("port_value: 8081", &format!("port_value: {}", bridge.port))
        .replace(
            "target/wasm32-wasip1/wasm/weir.wasm",
            weir_wasm().to_str().unwrap(),
        );
    let envoy = Envoy::start_yaml(&yaml, admin, http, 2);
    let statuses: Vec<u16> = (0..7)
        .map(|_| {
            get(http, "/api/orders", &[("x-user", "alice")])
                .unwrap()
                .status
        })
        .collect();
    assert_eq!(statuses, [200, 200, 200, 200, 200, 429, 429]);
    assert_eq!(
        get(http, "/api/orders", &[("x-user", "bob")])
            .unwrap()
            .status,
        200
    );
    let login: Vec<u16> = (0..4)
        .map(|_| send(http, Request::post("/login", "")).unwrap().status)
        .collect();
    assert_eq!(login, [200, 200, 200, 429]);
    // GCRA 20/min, burst 10, less the one unit the leases' 1 s hold costs: 10 at once
    // (one Envoy here, so leases strand nothing).
    let tenant: Vec<u16> = (0..12)
        .map(|_| {
            get(http, "/tenant/reports", &[("x-tenant", "acme")])
                .unwrap()
                .status
        })
        .collect();
    assert_eq!(
        tenant.iter().filter(|&&s| s == 200).count(),
        10,
        "{tenant:?}"
    );
    assert_eq!(envoy.weir_stat("rule.per-tenant.failure_local"), 0);
    assert!(envoy.weir_stat("rule.per-tenant.bridge_decisions") >= 1);
}

/// Keys from JWT claims that Envoy's jwt_authn verified and put in dynamic metadata, and
/// from any attribute by path.
#[test]
fn keys_from_jwt_claims_and_attributes() {
    let secret = b"weir-test-secret-of-32-bytes!!!!";
    let jwt_authn = jwt_authn_filter(secret, "test", "", true);
    let config = r#"{"rules":[
      {"name":"per-sub","match":{"path":{"prefix":"/sub"}},"key":[{"jwt_claim":"sub"}],
       "limit":{"algorithm":"fixed_window","limit":2,"window":"1h"}},
      {"name":"per-org","match":{"path":{"prefix":"/org"}},"key":[{"jwt_claim":["org","id"]}],
       "limit":{"algorithm":"fixed_window","limit":2,"window":"1h"}},
      {"name":"per-host","match":{"path":{"prefix":"/host"}},"key":[{"attribute":["request","host"]}],
       "limit":{"algorithm":"fixed_window","limit":1,"window":"1h"}}]}"#;
    let bootstrap = Bootstrap::new()
        .http_filter(jwt_authn)
        .http_filter(wasm_filter_yaml(config, &weir_wasm()));
    let envoy = Envoy::shared(&bootstrap, 1);
    let token = |sub: &str, org: &str| {
        let payload = format!(
            r#"{{"iss":"weir-test","sub":"{sub}","org":{{"id":"{org}"}},"exp":4102444800}}"#
        );
        format!("Bearer {}", hs256(secret, &payload))
    };
    let status = |path: &str, auth: Option<&str>| {
        let mut request = Request::get(path);
        if let Some(auth) = auth {
            request = request.header("authorization", auth);
        }
        send(envoy.http_port, request).unwrap().status
    };
    let (alice, bob) = (token("alice", "acme"), token("bob", "acme"));
    assert_eq!(status("/sub", Some(&alice)), 200);
    assert_eq!(status("/sub", Some(&alice)), 200);
    assert_eq!(
        status("/sub", Some(&alice)),
        429,
        "the sub claim is the key"
    );
    assert_eq!(
        status("/sub", Some(&bob)),
        200,
        "bob has a bucket of his own"
    );
    assert_eq!(
        status("/sub", None),
        200,
        "no token: no claim, the rule does not apply"
    );
    assert_eq!(envoy.weir_stat("rule.per-sub.key_missing"), 1);
    let forged = format!("{}x", token("alice", "acme"));
    assert_eq!(
        status("/sub", Some(&forged)),
        401,
        "jwt_authn rejects a bad signature"
    );

    assert_eq!(status("/org", Some(&alice)), 200);
    assert_eq!(status("/org", Some(&bob)), 200);
    assert_eq!(
        status("/org", Some(&token("carol", "acme"))),
        429,
        "a nested claim is the key"
    );
    assert_eq!(status("/org", Some(&token("carol", "other"))), 200);

    assert_eq!(status("/host", None), 200);
    assert_eq!(status("/host", None), 429, "request.host is the key");
    envoy.assert_no_panic();
}
