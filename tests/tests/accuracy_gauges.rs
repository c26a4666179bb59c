//! The accuracy gauges in a real Envoy (2 workers) with weir-bridge and a Redis Cluster:
//! after load on a leased global rule and on a local rule with reservoirs, each rule's
//! `outstanding_units` equals what the store counted less what the access log admitted
//! (as the conformance checker reads the log, judging each key's admissions too) —
//! for the global rule, the units Redis granted (the bridge's
//! `weir_bridge_units_granted_total`); for the local rule, its bucket's whole capacity,
//! which a 429 proves is counted (it refills 1 unit an hour). Once the units' time is
//! over, both gauges return to 0 and what was never admitted is counted as expired.

use std::thread;
use std::time::Duration;

use weir_e2e::decisions::{self, Logged};
use weir_e2e::global::GlobalStack;
use weir_e2e::{wasm_filter_yaml, weir_wasm, Bootstrap, Client, Envoy, Request};

const CAPACITY: u64 = 60;
/// How long a lease's and a reservoir's units may be spent: long enough for the load and
/// the first look at the gauges to end well within it.
const HOLD: &str = "2s";

fn config() -> String {
    format!(
        r#"{{"bridge":{{"cluster":"weir_bridge","timeout":"300ms"}},
 "rules":[
  {{"name":"leased","stats":"detailed","scope":"global","match":{{"path":{{"prefix":"/g"}}}},"key":[{{"header":"x-user"}}],"max_keys":64,
   "limit":{{"algorithm":"token_bucket","capacity":100000,"refill":100000,"period":"1h"}},
   "global":{{"lease":{{"max":20,"ttl":"{HOLD}"}},"failure_mode":"deny"}}}},
  {{"name":"pooled","match":{{"path":{{"prefix":"/l"}}}},"key":[{{"header":"x-user"}}],
   "limit":{{"algorithm":"token_bucket","capacity":{CAPACITY},"refill":1,"period":"1h"}},
   "reservoir":{{"max":10,"hold":"{HOLD}"}}}}]}}"#
    )
}

/// Units `rule` admitted, as the conformance checker derives them from the access log
/// (which also judges them against the rule's configured limit, key by key).
fn admitted(s: &GlobalStack, logs: &[Vec<Logged>], rule: &str) -> u64 {
    let refs: Vec<&[Logged]> = logs.iter().map(Vec::as_slice).collect();
    decisions::Judge::configured(&s.configs[0], rule)
        .check(&refs)
        .unwrap_or_else(|v| panic!("{v}"))
        .admitted
}

#[test]
fn outstanding_units_match_the_store_less_the_access_log_and_return_to_zero() {
    let s = GlobalStack::start(&[&config()], &[], "x-user");
    let port = s.envoys[0].http_port;
    // Two clients at once (each connection lands on one worker), 150 requests each on
    // the leased rule over three keys.
    thread::scope(|scope| {
        for t in 0..2 {
            scope.spawn(move || {
                let mut client = Client::connect(port).unwrap();
                for i in 0..150 {
                    let user = format!("u{}", (i + t) % 3);
                    let r = client
                        .request(Request::get("/g").header("x-user", &user))
                        .unwrap();
                    assert_eq!(r.status, 200, "the leased rule has room");
                }
            });
        }
    });
    let mut total = 300;
    // The pooled key: a few requests on several connections, so that both workers take
    // units ahead; then one connection until the bucket says 429 (every unit counted).
    // What the other worker took is still in its reservoir.
    let pooled = || Request::get("/l").header("x-user", "pool");
    for _ in 0..6 {
        let mut client = Client::connect(port).unwrap();
        for _ in 0..3 {
            assert_eq!(client.request(pooled()).unwrap().status, 200);
            total += 1;
        }
    }
    let mut client = Client::connect(port).unwrap();
    let limited = (0..2 * CAPACITY).any(|_| {
        total += 1;
        client.request(pooled()).unwrap().status == 429
    });
    assert!(limited, "the pooled bucket never ran out");

    // Well within the units' hold: the gauges (one snapshot, once the workers' stats
    // are in) against the store and the log.
    let envoy = &s.envoys[0];
    thread::sleep(weir_e2e::WEIR_STATS_LAG);
    let snapshot = envoy.stats_matching(r"^wasmcustom\.weir\.weir\.rule\.");
    let stat = |name: &str| {
        snapshot
            .get(&format!("wasmcustom.weir.weir.rule.{name}"))
            .copied()
            .unwrap_or_else(|| panic!("no stat {name}"))
    };
    let leased_gauge = stat("leased.outstanding_units");
    let pooled_gauge = stat("pooled.outstanding_units");
    let expired_early = stat("leased.lease_units_expired")
        + stat("leased.lease_units_late")
        + stat("pooled.reservoir_units_expired")
        + stat("pooled.reservoir_units_evicted");
    let granted =
        s.bridge
            .metric_sum("weir_bridge_units_granted_total", &[("rule", "leased")]) as u64;
    let logs = s.logs.read(total);
    let leased_admitted = admitted(&s, &logs, "leased");
    let pooled_admitted = admitted(&s, &logs, "pooled");
    eprintln!(
        "leased: Redis granted {granted}, the log admitted {leased_admitted}, gauge {leased_gauge}; \
         pooled: capacity {CAPACITY}, the log admitted {pooled_admitted}, gauge {pooled_gauge}; \
         expired before the look {expired_early}"
    );
    assert_eq!(expired_early, 0, "nothing expired within the hold");
    assert_eq!(leased_admitted, 300);
    assert_eq!(
        leased_gauge,
        granted - leased_admitted,
        "leased: outstanding = granted in Redis - admitted in the log"
    );
    assert!(
        leased_gauge > 0,
        "the leases held units when the load stopped"
    );
    assert_eq!(
        pooled_gauge,
        CAPACITY - pooled_admitted,
        "pooled: outstanding = the bucket's capacity (all counted) - admitted in the log"
    );
    assert_eq!(stat("leased.limit_units"), 100_000);
    assert_eq!(stat("pooled.limit_units"), CAPACITY);

    // The units' time ends with no request looking: the workers' sweeps drop them.
    let zero = weir_e2e::wait_until(Duration::from_secs(10), Duration::from_millis(200), || {
        envoy.weir_stat("rule.leased.outstanding_units") == 0
            && envoy.weir_stat("rule.pooled.outstanding_units") == 0
    });
    assert!(
        zero,
        "the gauges did not return to 0: leased {}, pooled {}",
        envoy.weir_stat("rule.leased.outstanding_units"),
        envoy.weir_stat("rule.pooled.outstanding_units")
    );
    // What was outstanding was never admitted: counted as expired.
    assert_eq!(
        envoy.weir_stat("rule.leased.lease_units_expired")
            + envoy.weir_stat("rule.leased.lease_units_late"),
        leased_gauge
    );
    assert_eq!(
        envoy.weir_stat("rule.pooled.reservoir_units_expired")
            + envoy.weir_stat("rule.pooled.reservoir_units_evicted"),
        pooled_gauge
    );
    s.assert_no_panic();
}

/// Requests held by a delay are outstanding from their hold to their release (or their
/// denial): one a second, four at once, so three wait (1, 2 and 3 s).
#[test]
fn held_requests_are_outstanding_until_their_release() {
    let config = r#"{"rules":[{"name":"api","key":[{"header":"x-user"}],
        "limit":{"algorithm":"gcra","rate":1,"period":"1s","burst":0},
        "on_limit":{"delay":{"max":"4s","queue":4}}}]}"#;
    let bootstrap = Bootstrap::new().http_filter(wasm_filter_yaml(config, &weir_wasm()));
    let envoy = Envoy::shared(&bootstrap, 2);
    let port = envoy.http_port;
    let gauge = || envoy.weir_stat("rule.api.outstanding_units");
    thread::scope(|scope| {
        let clients: Vec<_> = (0..4)
            .map(|_| {
                scope.spawn(move || {
                    let mut client = Client::connect(port).unwrap();
                    let r = client
                        .request(Request::get("/").header("x-user", "acme"))
                        .unwrap();
                    r.status
                })
            })
            .collect();
        // Well before the first release (1 s; the read waits 250 ms for the workers'
        // stats): three held, one unit each.
        thread::sleep(Duration::from_millis(100));
        let while_held = gauge();
        // Released on time (200), or, on a machine whose worker ticks came late, decided
        // again and maybe denied (429): either way no longer outstanding.
        for client in clients {
            let status = client.join().unwrap();
            assert!(status == 200 || status == 429, "status {status}");
        }
        assert_eq!(while_held, 3, "three requests held");
    });
    assert_eq!(gauge(), 0, "released (admitted) or denied");
    envoy.assert_no_panic();
}
