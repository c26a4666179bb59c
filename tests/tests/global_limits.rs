//! Global limits end to end: a 6-node Redis Cluster, weir-bridge and two Envoys
//! (`--concurrency 2` each) sharing one quota. Every Envoy logs every decision, and the
//! tests that admit judge the admissions of both Envoys with the core's conformance
//! checker (`GlobalStack::assert_conformant`); tests/tests/global_conformance.rs does so under
//! load, after idle periods and through failures.

use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use weir_core::algorithms::AlgorithmKind;
use weir_core::algorithms::GlobalLimit;
use weir_core::key::redis_key_tag;
use weir_e2e::global::GlobalStack as Stack;
use weir_e2e::{get, key_slot, run_clients, wasm_filter_yaml, weir_wasm, Request};

fn stack(config: &str) -> Stack {
    stack_with(&[config, config], &[])
}

fn stack_with(configs: &[&str], bridge_args: &[&str]) -> Stack {
    Stack::start(configs, bridge_args, "x-k")
}

fn stack_with_filters(filters: &[String], bridge_args: &[&str]) -> Stack {
    Stack::start_filters(filters, bridge_args, "x-k")
}

/// `per_envoy` requests to each Envoy, 4 client threads each, all at once; returns the
/// statuses counted over all of them.
fn load(
    s: &Stack,
    per_envoy: usize,
    request: impl Fn() -> Request + Sync + Clone + Send + 'static,
) -> (usize, usize, usize) {
    let handles: Vec<_> = s
        .ports()
        .into_iter()
        .map(|port| {
            let request = request.clone();
            thread::spawn(move || {
                let report = run_clients(4, per_envoy, port, move |_, _| request());
                report.assert_no_errors();
                (report.count(200), report.count(429), report.count(503))
            })
        })
        .collect();
    handles
        .into_iter()
        .map(|h| h.join().unwrap())
        .fold((0, 0, 0), |a, b| (a.0 + b.0, a.1 + b.1, a.2 + b.2))
}

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64
}

const BRIDGE: &str = r#""bridge": {"cluster": "weir_bridge", "timeout": "500ms"}"#;

/// Every algorithm, leases off and on: across two Envoys the total admitted never
/// exceeds the limit; exact mode admits exactly the limit, and so does the sliding log.
#[test]
fn the_limit_holds_across_two_envoys() {
    let limits = [
        (
            "tb",
            r#"{"algorithm":"token_bucket","capacity":100,"refill":1,"period":"1h"}"#,
        ),
        (
            "gcra",
            r#"{"algorithm":"gcra","rate":1,"period":"1h","burst":99}"#,
        ),
        (
            "fw",
            r#"{"algorithm":"fixed_window","limit":100,"window":"1d"}"#,
        ),
        (
            "sw",
            r#"{"algorithm":"sliding_window","limit":100,"window":"1d"}"#,
        ),
        (
            "log",
            r#"{"algorithm":"sliding_log","limit":100,"window":"1d"}"#,
        ),
    ];
    let mut rules = Vec::new();
    for (name, limit) in limits {
        for (mode, global) in [
            ("exact", "{}"),
            (
                "lease",
                r#"{"lease":{"max":20,"ttl":"10s"},"expected_instances":2}"#,
            ),
        ] {
            rules.push(format!(
                r#"{{"name":"{name}-{mode}","match":{{"path":{{"exact":"/{name}/{mode}"}}}},"scope":"global",
                    "key":[{{"header":"x-k"}}],"limit":{limit},"global":{global}}}"#
            ));
        }
    }
    let config = format!(r#"{{{BRIDGE}, "rules": [{}]}}"#, rules.join(","));
    let s = stack(&config);
    let day_at_start = now_us() / 86_400_000_000;
    for (name, _) in limits {
        for mode in ["exact", "lease"] {
            let path = format!("/{name}/{mode}");
            let (ok, limited, unavailable) = load(&s, 150, move || {
                Request::get(&path).header("x-k", "shared-key")
            });
            let granted = s.bridge.metric_sum(
                "weir_bridge_units_granted_total",
                &[("rule", &format!("{name}-{mode}"))],
            );
            eprintln!("{name}-{mode}: admitted {ok}, limited {limited}, 503 {unavailable}; Redis granted {granted}");
            assert_eq!(unavailable, 0);
            if now_us() / 86_400_000_000 != day_at_start {
                eprintln!(
                    "crossed a UTC day boundary: window bounds double, skipping the exact check"
                );
                assert!(ok <= 200);
                continue;
            }
            assert!(ok <= 100, "{name}-{mode} admitted {ok} > 100");
            assert!(
                granted <= 100.0,
                "{name}-{mode}: Redis granted {granted} > 100"
            );
            if mode == "exact" {
                assert_eq!(ok, 100, "{name}-exact under-admitted");
            } else {
                // Leases strand at most what the two Envoys still hold.
                assert!(ok >= 60, "{name}-lease admitted only {ok}");
            }
        }
    }
    // Every admission of both Envoys, rule by rule, keeps the algorithm's bound (300
    // requests were sent per rule).
    for (name, _) in limits {
        for mode in ["exact", "lease"] {
            s.assert_conformant(&s.judge(&format!("{name}-{mode}")), 300 * 10);
        }
    }
}

/// Far from the limit, leases make bridge calls rare; once a key is limited, its
/// cached denial keeps requests away from the bridge until the retry time.
#[test]
fn leases_and_the_denial_cache_keep_redis_out_of_the_hot_path() {
    let config = format!(
        r#"{{{BRIDGE}, "rules": [
          {{"name":"wide","stats":"detailed","match":{{"path":{{"exact":"/wide"}}}},"scope":"global","key":[{{"header":"x-k"}}],
            "limit":{{"algorithm":"token_bucket","capacity":1000000,"refill":1000000,"period":"1h"}},
            "global":{{"lease":{{"max":200,"ttl":"10s"}},"expected_instances":2}}}},
          {{"name":"tight","match":{{"path":{{"exact":"/tight"}}}},"scope":"global","key":[{{"header":"x-k"}}],
            "limit":{{"algorithm":"fixed_window","limit":5,"window":"1d"}}}}]}}"#
    );
    let s = stack(&config);
    let (ok, limited, unavailable) =
        load(&s, 2000, || Request::get("/wide").header("x-k", "tenant-a"));
    assert_eq!(
        (ok, limited, unavailable),
        (4000, 0, 0),
        "refused {}, errors {}",
        s.weir_stat("bridge.refused"),
        s.weir_stat("bridge.errors_bad_body") + s.weir_stat("bridge.errors_status")
    );
    let calls = s.weir_stat("rule.wide.bridge_decisions");
    let lease_hits = s.weir_stat("rule.wide.lease_hits");
    eprintln!("wide: 4000 requests, {calls} bridge decisions, {lease_hits} lease hits");
    assert!(
        calls * 20 <= 4000,
        "{calls} bridge calls for 4000 requests (> 1/20)"
    );
    assert_eq!(calls + lease_hits, 4000);
    // Every lease hit spent a unit Redis granted ahead and the Envoy kept: with a 10 s
    // `ttl`, none came back late or expired, and what is left is still held.
    let granted = s.weir_stat("rule.wide.lease_units_granted");
    let late = s.weir_stat("rule.wide.lease_units_late");
    let expired = s.weir_stat("rule.wide.lease_units_expired");
    eprintln!("wide: {granted} units granted ahead, {late} late, {expired} expired");
    assert_eq!((late, expired), (0, 0));
    assert!(
        lease_hits <= granted,
        "{granted} units granted ahead for {lease_hits} lease hits"
    );

    // Sequential requests per Envoy: 5 admitted in total, then one bridge denial per Envoy,
    // then only cached denials; but a worker whose last answer from Redis had units left
    // asks again without reading the cache (`LastAnswers`), so up to one more denial per
    // worker (2 Envoys × 2 workers).
    let decisions_before = s.weir_stat("rule.tight.bridge_decisions");
    let mut statuses = Vec::new();
    for i in 0..60 {
        let envoy = &s.envoys[i % 2];
        statuses.push(
            get(envoy.http_port, "/tight", &[("x-k", "tenant-b")])
                .unwrap()
                .status,
        );
    }
    assert_eq!(statuses.iter().filter(|&&s| s == 200).count(), 5);
    let decisions = s.weir_stat("rule.tight.bridge_decisions") - decisions_before;
    let cached = s.weir_stat("rule.tight.denial_cache_hits");
    eprintln!("tight: {decisions} bridge decisions, {cached} cached denials");
    assert!(
        (7..=9).contains(&decisions),
        "5 grants + one denial per Envoy, and at most one more per worker: {decisions}"
    );
    assert_eq!(cached, 60 - decisions);
}

/// The bridge killed by PID: each failure mode does what it says, within the timeout;
/// then a bridge that hangs (SIGSTOP): the same, bounded by the timeout.
#[test]
fn failure_modes_when_the_bridge_dies_or_hangs() {
    let rule = |name: &str, mode: &str| {
        format!(
            r#"{{"name":"{name}","match":{{"path":{{"exact":"/{name}"}}}},"scope":"global","key":[{{"header":"x-k"}}],
               "limit":{{"algorithm":"fixed_window","limit":10,"window":"1d"}},
               "global":{{"failure_mode":"{mode}","expected_instances":2}}}}"#
        )
    };
    let config = format!(
        r#"{{"bridge": {{"cluster": "weir_bridge", "timeout": "200ms"}}, "rules": [{}, {}, {}]}}"#,
        rule("open", "allow"),
        rule("closed", "deny"),
        rule("fallback", "local")
    );
    let mut s = stack(&config);
    for name in ["open", "closed", "fallback"] {
        let path = format!("/{name}");
        assert_eq!(
            get(s.envoys[0].http_port, &path, &[("x-k", "a")])
                .unwrap()
                .status,
            200
        );
    }

    let check = |s: &Stack, what: &str, limit_ms: u128| {
        let port = s.envoys[0].http_port;
        let timed = |path: &str| {
            let started = Instant::now();
            let r = get(port, path, &[("x-k", "b")]).unwrap();
            let ms = started.elapsed().as_millis();
            assert!(ms <= limit_ms, "{what}: {path} took {ms} ms");
            r
        };
        for _ in 0..3 {
            assert_eq!(timed("/open").status, 200, "{what}: failure_mode allow");
            let closed = timed("/closed");
            assert_eq!(closed.status, 503, "{what}: failure_mode deny");
            assert!(closed.text().contains("rate_limit_unavailable"));
        }
        // The local share is 10 / 2 = 5 per Envoy per window.
        let statuses: Vec<u16> = (0..7).map(|_| timed("/fallback").status).collect();
        assert_eq!(
            statuses.iter().filter(|&&s| s == 200).count(),
            5,
            "{what}: local fallback {statuses:?}"
        );
    };

    s.bridge.kill_hard();
    check(&s, "bridge killed", 250);
    assert!(s.weir_stat("rule.closed.failure_denied") >= 3);
    assert!(s.weir_stat("rule.open.failure_allowed") >= 3);
    assert!(s.weir_stat("rule.fallback.failure_local") >= 7);
    assert!(s.weir_stat("bridge.errors_unavailable") >= 1);
    drop(s);

    // A bridge that accepts connections but never answers: every call times out.
    let s = stack(&config);
    let pid = s.bridge.pid() as i32;
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    thread::sleep(Duration::from_millis(1100)); // let any earlier backoff lapse
    check(&s, "bridge hung", 200 + 150);
    assert!(s.weir_stat("bridge.errors_timeout") >= 1);
    unsafe { libc::kill(pid, libc::SIGCONT) };
}

/// The bridge refuses calls without its secret (401): for the filter that is a failure
/// like any other, so the rule's failure mode applies — never a free pass. The right
/// secret comes from the Wasm VM's environment (`secret_env`).
#[test]
fn a_wrong_secret_gets_the_failure_mode() {
    let config = |secret: &str| {
        format!(
            r#"{{"bridge": {{"cluster": "weir_bridge", {secret}}}, "rules": [
              {{"name":"quota","scope":"global","limit":{{"algorithm":"fixed_window","limit":100,"window":"1d"}},
                "global":{{"failure_mode":"deny"}}}}]}}"#
        )
    };
    let right = wasm_filter_yaml(&config(r#""secret_env": "WEIR_BRIDGE_SECRET""#), &weir_wasm()).replace(
        "runtime: envoy.wasm.runtime.v8\n",
        "runtime: envoy.wasm.runtime.v8\n        environment_variables: { key_values: { WEIR_BRIDGE_SECRET: s3cret } }\n",
    );
    assert!(right.contains("environment_variables"));
    let wrong = wasm_filter_yaml(&config(r#""secret": "guess""#), &weir_wasm());
    let s = stack_with_filters(&[right, wrong], &["--secret", "s3cret"]);
    assert_eq!(get(s.envoys[0].http_port, "/", &[]).unwrap().status, 200);
    let denied = get(s.envoys[1].http_port, "/", &[]).unwrap();
    assert_eq!(denied.status, 503, "{}", denied.text());
    let status_errors = s.envoys[1].weir_stat("bridge.errors_status");
    assert_eq!(status_errors, 1);
    assert_eq!(
        s.bridge
            .metric_sum("weir_bridge_errors_total", &[("class", "unauthorized")]),
        1.0
    );
    assert_eq!(
        s.bridge
            .metric_sum("weir_bridge_decisions_total", &[("rule", "quota")]),
        1.0
    );
}

/// A Redis master killed by PID while requests flow: nothing hangs past the timeout, the
/// bridge recovers once the replica is promoted, and the quota holds — up to what the
/// dead master granted in its last moments and never replicated (the documented bound).
#[test]
fn a_redis_failover_under_load() {
    const CAPACITY: u64 = 3000;
    let config = format!(
        r#"{{"bridge": {{"cluster": "weir_bridge", "timeout": "300ms"}}, "rules": [
          {{"name":"quota","scope":"global","key":[{{"header":"x-k"}}],
            "limit":{{"algorithm":"token_bucket","capacity":{CAPACITY},"refill":1,"period":"1h"}},
            "global":{{"failure_mode":"deny","lease":{{"max":10,"ttl":"1s"}},"expected_instances":2}}}}]}}"#
    );
    let mut s = stack(&config);
    let tag = redis_key_tag(
        "weir",
        "quota",
        AlgorithmKind::TokenBucket,
        &["=hot".to_string()],
    );
    let slot = key_slot(tag.as_bytes());

    let counts: std::sync::Arc<[AtomicU64; 3]> = std::sync::Arc::new(Default::default());
    let slowest_ms = std::sync::Arc::new(AtomicU64::new(0));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let workers: Vec<_> = s
        .envoys
        .iter()
        .flat_map(|e| [e.http_port, e.http_port])
        .map(|port| {
            let (counts, slowest, stop) = (counts.clone(), slowest_ms.clone(), stop.clone());
            thread::spawn(move || {
                let mut client = weir_e2e::Client::connect(port).unwrap();
                while !stop.load(Ordering::Relaxed) {
                    let started = Instant::now();
                    let r = client
                        .request(Request::get("/").header("x-k", "hot"))
                        .unwrap();
                    slowest.fetch_max(started.elapsed().as_millis() as u64, Ordering::Relaxed);
                    let at = match r.status {
                        200 => 0,
                        429 => 1,
                        503 => 2,
                        other => panic!("unexpected status {other}"),
                    };
                    counts[at].fetch_add(1, Ordering::Relaxed);
                    thread::sleep(Duration::from_millis(5));
                }
            })
        })
        .collect();
    let admitted = || counts[0].load(Ordering::Relaxed);

    thread::sleep(Duration::from_secs(2));
    let before_kill = admitted();
    assert!(
        before_kill < CAPACITY / 2,
        "the quota ran low before the kill ({before_kill})"
    );
    let killed = s.redis.kill_master_of_slot(slot);
    let started = Instant::now();
    let promoted = s.redis.wait_for_failover(slot, Duration::from_secs(20));
    let failover = started.elapsed();
    // Requests succeed again once the bridge has found the new master…
    let mark = admitted();
    let recovered =
        weir_e2e::wait_until(Duration::from_secs(15), Duration::from_millis(50), || {
            admitted() > mark + 20
        });
    let recovery = started.elapsed();
    // …and then run the quota out.
    let exhausted =
        weir_e2e::wait_until(Duration::from_secs(20), Duration::from_millis(100), || {
            counts[1].load(Ordering::Relaxed) > 100
        });
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.join().unwrap();
    }
    let total = admitted();
    let granted = s
        .bridge
        .metric_sum("weir_bridge_units_granted_total", &[("rule", "quota")]);
    eprintln!(
        "killed {killed}, {promoted} promoted after {failover:?}, requests admitted again after {recovery:?}; \
         admitted {before_kill} before the kill and {total} in all (capacity {CAPACITY}); \
         {} limited, {} answered 503; Redis granted {granted}; slowest {} ms",
        counts[1].load(Ordering::Relaxed),
        counts[2].load(Ordering::Relaxed),
        slowest_ms.load(Ordering::Relaxed)
    );
    assert!(
        recovered,
        "requests did not succeed again after the failover:\n{}",
        s.bridge.log()
    );
    assert!(exhausted, "the quota was never exhausted");
    assert!(
        slowest_ms.load(Ordering::Relaxed) <= 300 + 200,
        "a request waited past the timeout"
    );
    // Replication is asynchronous: what the old master granted and had not yet sent to
    // its replica is forgotten by the new one. At this request rate that is a few units.
    assert!(
        total <= CAPACITY + 20,
        "over-admitted: {total} > {CAPACITY} + 20"
    );
    // And in time: the bucket's bound, with the same allowance for lost writes.
    let sent =
        (total + counts[1].load(Ordering::Relaxed) + counts[2].load(Ordering::Relaxed)) as usize;
    let loose = GlobalLimit::build(
        AlgorithmKind::TokenBucket,
        &[CAPACITY + 20, 1, 3_600_000_000],
    )
    .unwrap();
    s.assert_conformant(&s.judge("quota").against(loose), sent);
}
