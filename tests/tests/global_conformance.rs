//! Global limits hold their algorithm's bound in every interval, end to end: a 6-node Redis
//! Cluster, weir-bridge and two Envoys with two workers each; every request's decisions come
//! from the access log (`response.filter_state: all`), and every run is judged by the core's
//! `conformance::check` over the admissions of both Envoys together.
//!
//! Also checked: that the limit is not held by refusing (a floor on what is admitted), and
//! how many bridge calls it took. Load is paced and bounded in time.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use weir_core::algorithms::AlgorithmKind;
use weir_core::key::redis_key_tag;
use weir_e2e::decisions::{Checked, Excuse, Logged};
use weir_e2e::global::GlobalStack as Stack;
use weir_e2e::{
    bridge_cluster_yaml, key_slot, wasm_filter_yaml, weir_wasm, Bootstrap, Bridge, Client, Envoy,
    RedisCluster, Request,
};

const BRIDGE: &str = r#""bridge": {"cluster": "weir_bridge", "timeout": "300ms"}"#;

/// Two Envoys (2 workers each) running `rules` (a JSON list), every decision logged.
fn stack(rules: &str) -> Stack {
    let config = format!(r#"{{{BRIDGE}, "rules": {rules}}}"#);
    Stack::start(&[&config, &config], &[], "x-user")
}

/// Every access-log line of both Envoys, once `sent` requests have been logged: one line
/// per request.
fn logged(s: &Stack, sent: usize) -> Vec<Vec<Logged>> {
    let logs = s.logs.read(sent);
    let lines: usize = logs.iter().map(Vec::len).sum();
    assert_eq!(lines, sent, "access log lines vs requests sent");
    logs
}

/// Checks `rule`'s admissions in `logs`, key by key, against its configured limit.
fn check(s: &Stack, logs: &[Vec<Logged>], rule: &str) -> Checked {
    let refs: Vec<&[Logged]> = logs.iter().map(Vec::as_slice).collect();
    s.judge(rule).check(&refs).unwrap_or_else(|v| panic!("{v}"))
}

/// `per_s` requests per second for `secs`, at evenly spaced instants, from 2 threads per
/// Envoy; request `i` goes to Envoy `i % 2` and is made by `request(i)`. A thread behind
/// its schedule sends at once. Returns how many were sent and how many got 200.
///
/// A slow machine (CI shares its cores) may not keep the pace; the run then offers less
/// than it names and says so. That cannot hide a violation: the conformance checker
/// judges the admissions at the times they happened, and the tests' minimums only get
/// easier with more time. A test whose assertion needs the real duration uses
/// [`on_schedule`].
fn paced(
    ports: &[u16],
    per_s: u64,
    secs: f64,
    request: impl Fn(usize) -> Request + Sync,
) -> (usize, usize) {
    let total = (per_s as f64 * secs) as usize;
    let (ok, took) = on_schedule(ports, total, per_s as f64, request);
    if took > secs * 2.0 {
        eprintln!("slow machine: {total} requests planned over {secs} s took {took:.2} s");
    }
    (total, ok)
}

/// `total` requests from every client thread at once (2 per Envoy), as fast as the
/// Envoys answer: a burst has no pace to keep, so how long it took is not checked.
/// Returns how many were sent and how many got 200.
fn burst(ports: &[u16], total: usize, request: impl Fn(usize) -> Request + Sync) -> (usize, usize) {
    let (ok, _) = on_schedule(ports, total, f64::INFINITY, request);
    (total, ok)
}

/// Sends request `i` (of `total`) at `i / per_s` seconds after the start, or at once when
/// its thread is behind; returns how many got 200 and how many seconds it all took.
fn on_schedule(
    ports: &[u16],
    total: usize,
    per_s: f64,
    request: impl Fn(usize) -> Request + Sync,
) -> (usize, f64) {
    let threads = 2 * ports.len();
    let start = Instant::now() + Duration::from_millis(20);
    let request = &request;
    let ok: usize = thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                s.spawn(move || {
                    // Thread t serves Envoy t % envoys, and the requests of that Envoy
                    // with index ≡ t (mod threads).
                    let port = ports[t % ports.len()];
                    let mut client = Client::connect(port).unwrap();
                    let mut ok = 0;
                    for i in (t..total).step_by(threads) {
                        let due = start + Duration::from_secs_f64(i as f64 / per_s);
                        if let Some(wait) = due.checked_duration_since(Instant::now()) {
                            thread::sleep(wait);
                        }
                        let r = client.request(request(i)).unwrap();
                        match r.status {
                            200 => ok += 1,
                            429 => {}
                            other => panic!("request {i}: status {other}: {}", r.text()),
                        }
                    }
                    ok
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).sum()
    });
    (ok, start.elapsed().as_secs_f64())
}

/// A rule per algorithm, each on its own path, about 50 units per second, with leases.
fn every_algorithm() -> Vec<(&'static str, &'static str)> {
    vec![
        (
            "gcra",
            r#"{"algorithm":"gcra","rate":50,"period":"1s","burst":24},
               "global":{"lease":{"max":20,"ttl":"100ms","horizon":"100ms"},"failure_mode":"deny","expected_instances":2}"#,
        ),
        (
            "token_bucket",
            r#"{"algorithm":"token_bucket","capacity":25,"refill":5,"period":"100ms"},
               "global":{"lease":{"max":20,"ttl":"100ms"},"failure_mode":"deny","expected_instances":2}"#,
        ),
        (
            "fixed_window",
            r#"{"algorithm":"fixed_window","limit":50,"window":"1s"},
               "global":{"lease":{"max":20,"ttl":"200ms"},"failure_mode":"deny","expected_instances":2}"#,
        ),
        (
            "sliding_window",
            r#"{"algorithm":"sliding_window","limit":50,"window":"1s"},
               "global":{"lease":{"max":20,"ttl":"200ms"},"failure_mode":"deny","expected_instances":2}"#,
        ),
        (
            "sliding_log",
            r#"{"algorithm":"sliding_log","limit":50,"window":"1s"},
               "global":{"lease":{"max":20,"ttl":"100ms"},"failure_mode":"deny","expected_instances":2}"#,
        ),
    ]
}

fn every_algorithm_rules() -> String {
    let rules: Vec<String> = every_algorithm()
        .iter()
        .map(|(name, limit_and_global)| {
            format!(
                r#"{{"name":"{name}","match":{{"path":{{"prefix":"/{name}"}}}},"scope":"global",
                    "key":[{{"header":"x-user"}}],"limit":{limit_and_global}}}"#
            )
        })
        .collect();
    format!("[{}]", rules.join(","))
}

#[test]
fn every_algorithm_keeps_its_bound_at_5x_and_20x() {
    let s = stack(&every_algorithm_rules());
    let mut sent = 0;
    let mut report = Vec::new();
    for (name, _) in every_algorithm() {
        for multiple in [5u64, 20] {
            let calls_before = s.weir_stat("bridge.calls");
            let key = format!("{name}-{multiple}x");
            let path = format!("/{name}");
            let (n, ok) = paced(&s.ports(), 50 * multiple, 2.0, |_| {
                Request::get(&path).header("x-user", &key)
            });
            sent += n;
            let calls = s.weir_stat("bridge.calls") - calls_before;
            report.push((name, multiple, n, ok, calls));
        }
    }
    let logs = logged(&s, sent);
    for (name, multiple, n, ok, calls) in report {
        eprintln!(
            "{name} at {multiple}x: {ok} of {n} admitted, {calls} bridge calls ({:.3}/request)",
            calls as f64 / n as f64
        );
        // About 50/s over 2 s: a conformant limiter that does not refuse for nothing
        // admits close to 100 (plus its burst); under load on a shared 2-core machine
        // we ask for 70 %.
        assert!(ok >= 70, "{name} at {multiple}x: only {ok} admitted");
    }
    for (name, _) in every_algorithm() {
        let checked = check(&s, &logs, name);
        assert_eq!(checked.keys, 2, "{name}: keys seen");
    }
    s.assert_no_panic();
}

#[test]
fn bursts_after_an_idle_period_keep_the_bound() {
    let s = stack(&every_algorithm_rules());
    let mut sent = 0;
    for (name, _) in every_algorithm() {
        let path = format!("/{name}");
        let key = format!("{name}-idle");
        // Warm: both Envoys hold units for the key.
        let (n, _) = paced(&s.ports(), 100, 1.0, |_| {
            Request::get(&path).header("x-user", &key)
        });
        sent += n;
        // Idle longer than any tolerance here (GCRA: 25 / 50 per s = 0.5 s), shorter than
        // a lease could have lived before leases were bounded (seconds).
        thread::sleep(Duration::from_millis(700));
        if name == "fixed_window" {
            // Windows are whole seconds of the epoch: a burst in the window the warm-up
            // ended in finds it spent (up to 50 counted, leased units included), and one
            // in the next finds it fresh. Burst just after a window starts, so the test
            // sees what it means to (a CI run's burst met a spent window: 9 admitted).
            let into_second = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .subsec_millis();
            thread::sleep(Duration::from_millis(u64::from(1_020 - into_second)));
        }
        // Then every worker of both Envoys bursts at once.
        let (n, ok) = burst(&s.ports(), 200, |_| {
            Request::get(&path).header("x-user", &key)
        });
        sent += n;
        eprintln!("{name}: {ok} of {n} admitted in the burst");
        assert!(ok >= 10, "{name}: only {ok} admitted in the burst");
    }
    let logs = logged(&s, sent);
    for (name, _) in every_algorithm() {
        check(&s, &logs, name);
    }
    s.assert_no_panic();
}

#[test]
fn alternating_envoys_many_keys_and_mixed_costs_keep_the_bound() {
    let rule = |name: &str, cost: &str| {
        format!(
            r#"{{"name":"{name}","match":{{"path":{{"prefix":"/{name}"}}}},"scope":"global",
                "key":[{{"header":"x-user"}}],{cost}
                "limit":{{"algorithm":"gcra","rate":50,"period":"1s","burst":24}},
                "global":{{"lease":{{"max":20,"ttl":"100ms","horizon":"100ms"}},"failure_mode":"deny","expected_instances":2}}}}"#
        )
    };
    let s = stack(&format!(
        "[{},{},{}]",
        rule("alternating", ""),
        rule("costs", r#""cost":{"header":"x-cost","max":10},"#),
        // Many keys of 10/s each: a burst of 9 pays one unit for the 100 ms hold.
        r#"{"name":"keys","match":{"path":{"prefix":"/keys"}},"scope":"global",
            "key":[{"header":"x-user"}],"limit":{"algorithm":"gcra","rate":10,"period":"1s","burst":9},
            "global":{"lease":{"max":5,"ttl":"100ms","horizon":"200ms"},"failure_mode":"deny","expected_instances":2}}"#
    ));
    let ports = s.ports();
    let mut sent = 0;

    // Alternating Envoys, one client: A, B, A, B … at 5× the rate.
    let started = Instant::now();
    let mut clients: Vec<Client> = ports.iter().map(|&p| Client::connect(p).unwrap()).collect();
    let mut alternating_ok = 0;
    for i in 0..500usize {
        let due = started + Duration::from_micros(4_000 * i as u64);
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            thread::sleep(wait);
        }
        let r = clients[i % 2]
            .request(Request::get("/alternating").header("x-user", "a"))
            .unwrap();
        alternating_ok += usize::from(r.status == 200);
        sent += 1;
    }
    eprintln!("alternating: {alternating_ok} of 500 admitted in 2 s");
    assert!(alternating_ok >= 70, "alternating: {alternating_ok}");

    // Many keys at their limits at once: 20 keys of 10/s, each offered twice that for
    // 2 s (40 requests, of which the bound admits 10 + 20). Nearly every request of a
    // key that far over its limit needs a bridge call, so 20 keys is what a shared
    // 2-core machine can offer on time.
    let (n, ok) = paced(&ports, 20 * 20, 2.0, |i| {
        Request::get("/keys").header("x-user", format!("many-{}", i % 20))
    });
    sent += n;
    eprintln!("20 keys: {ok} of {n} admitted");
    assert!(ok >= 20 * 30 * 7 / 10, "20 keys: only {ok} admitted");

    // Cost 10 and cost 1 on one key: a denied cost-10 request does not hold the cost-1
    // requests back for its own retry time.
    let (n, ok) = paced(&ports, 500, 2.0, |i| {
        let cost = if i % 5 == 0 { "10" } else { "1" };
        Request::get("/costs")
            .header("x-user", "mixed")
            .header("x-cost", cost)
    });
    sent += n;
    let logs = logged(&s, sent);
    check(&s, &logs, "alternating");
    let checked_keys = check(&s, &logs, "keys");
    assert_eq!(checked_keys.keys, 20);
    let costs = check(&s, &logs, "costs");
    let ones_allowed = logs
        .iter()
        .flatten()
        .filter_map(|l| l.decision("costs"))
        .filter(|d| d.cost == 1 && d.outcome == "allowed")
        .count();
    eprintln!(
        "mixed costs: {ok} of {n} requests, {} units admitted, {ones_allowed} cost-1 requests",
        costs.admitted
    );
    assert!(
        costs.admitted >= 70,
        "mixed costs: {} units",
        costs.admitted
    );
    assert!(
        ones_allowed >= 50,
        "cost-1 requests allowed: {ones_allowed}"
    );
    s.assert_no_panic();
}

/// Regression: a shadow global rule before an enforcing one. The bridge used to stop at
/// the shadow rule's denial and the filter matched results by position, so the enforcing
/// rule was never decided and everything passed (777–811 admitted in 5 s against 101).
#[test]
fn a_shadow_rule_before_an_enforcing_one_keeps_the_enforcing_bound() {
    let s = stack(
        r#"[{"name":"dry-run","scope":"global","shadow":true,"key":[{"header":"x-user"}],
             "limit":{"algorithm":"fixed_window","limit":1,"window":"1h"}},
            {"name":"enforced","scope":"global","key":[{"header":"x-user"}],
             "limit":{"algorithm":"gcra","rate":50,"period":"1s","burst":24},
             "global":{"lease":{"max":20,"ttl":"100ms"},"expected_instances":2}}]"#,
    );
    let n = 250;
    let (ok, took) = on_schedule(&s.ports(), n, 125.0, |_| {
        Request::get("/").header("x-user", "shadowed")
    });
    let logs = logged(&s, n);
    let enforced = check(&s, &logs, "enforced");
    let shadow_limited = logs
        .iter()
        .flatten()
        .filter_map(|l| l.decision("dry-run"))
        .filter(|d| d.outcome == "shadow_limited")
        .count();
    eprintln!("{ok} of {n} admitted; the shadow rule would have limited {shadow_limited}");
    // Burst + 1 and 50/s for as long as the run took (2 s when the machine keeps pace).
    let bound = 24 + 1 + (50.0 * took).ceil() as usize + 5;
    assert!(ok <= bound, "{ok} admitted in {took:.2} s");
    assert!(ok >= 70, "{ok} admitted");
    assert_eq!(enforced.requests, ok);
    assert!(shadow_limited >= n / 2, "shadow_limited {shadow_limited}");
    s.assert_no_panic();
}

/// Regression: two plugins in one VM (Istio gives every WasmPlugin the same `vm_id`), one
/// with a dead bridge. The bridge backoff was process-wide, so one failure of the dead
/// bridge made the other plugin skip its healthy bridge for a second.
#[test]
fn a_dead_bridge_of_one_plugin_does_not_pause_another_plugin_in_the_same_vm() {
    let redis = RedisCluster::start(3, 1);
    let bridge = Bridge::start(&redis, &[]);
    let plugin = |name: &str, cluster: &str, mode: &str| {
        let config = format!(
            r#"{{"bridge": {{"cluster": "{cluster}", "timeout": "200ms"}}, "rules": [
              {{"name":"quota","scope":"global","key":[{{"header":"x-user"}}],
                "limit":{{"algorithm":"fixed_window","limit":100000,"window":"1h"}},
                "global":{{"failure_mode":"{mode}"}}}}]}}"#
        );
        wasm_filter_yaml(&config, &weir_wasm())
            .replace("      name: weir\n", &format!("      name: {name}\n"))
    };
    let dead_port = weir_e2e::free_port();
    let dead_cluster = bridge_cluster_yaml(dead_port).replace("weir_bridge", "dead_bridge");
    let bootstrap = Bootstrap::new()
        .http_filter(plugin("broken", "dead_bridge", "allow"))
        .http_filter(plugin("healthy", "weir_bridge", "deny"))
        .cluster(bridge_cluster_yaml(bridge.port))
        .cluster(dead_cluster);
    let envoy = Envoy::shared(&bootstrap, 2);
    let mut client = Client::connect(envoy.http_port).unwrap();
    let mut statuses = std::collections::BTreeMap::new();
    for i in 0..200 {
        let r = client
            .request(Request::get("/").header("x-user", format!("u{}", i % 7)))
            .unwrap();
        *statuses.entry(r.status).or_insert(0) += 1;
        thread::sleep(Duration::from_millis(2));
    }
    assert_eq!(statuses.get(&200), Some(&200), "statuses {statuses:?}");
    assert!(envoy.plugin_stat("broken", "bridge.errors_unavailable") >= 1);
    assert!(envoy.plugin_stat("broken", "bridge.skipped") >= 1);
    assert_eq!(envoy.plugin_stat("healthy", "bridge.skipped"), 0);
    assert_eq!(envoy.plugin_stat("healthy", "rule.quota.failure_denied"), 0);
    assert_eq!(envoy.plugin_stat("healthy", "rule.quota.allowed"), 200);
    envoy.assert_no_panic();
}

/// A key of `rule` (descriptor `=name`) whose Redis slot lives on `master`.
fn key_on(redis: &RedisCluster, master: &str, rule: &str, kind: AlgorithmKind) -> String {
    (0..10_000)
        .map(|i| format!("k{i}"))
        .find(|k| {
            let tag = redis_key_tag("weir", rule, kind, &[format!("={k}")]);
            redis.master_of_slot(key_slot(tag.as_bytes())).as_deref() == Some(master)
        })
        .unwrap()
}

/// A Redis master SIGKILLed under load with each failure mode. What Redis and the leases
/// admit keeps the bound, up to what the dead master had granted and not replicated; the
/// local fallback keeps the bound plus two bursts (docs/global.md).
#[test]
fn a_redis_master_killed_under_load_with_each_failure_mode() {
    let rule = |mode: &str| {
        format!(
            r#"{{"name":"{mode}","match":{{"path":{{"prefix":"/{mode}"}}}},"scope":"global",
                "key":[{{"header":"x-user"}}],
                "limit":{{"algorithm":"gcra","rate":50,"period":"1s","burst":24}},
                "global":{{"lease":{{"max":20,"ttl":"100ms","horizon":"100ms"}},"failure_mode":"{mode}","expected_instances":2}}}}"#
        )
    };
    let mut s = stack(&format!(
        "[{},{},{}]",
        rule("allow"),
        rule("deny"),
        rule("local")
    ));
    let master = s.redis.masters()[0].clone();
    let keys: Vec<(String, String)> = ["allow", "deny", "local"]
        .iter()
        .map(|m| {
            (
                m.to_string(),
                key_on(&s.redis, &master, m, AlgorithmKind::Gcra),
            )
        })
        .collect();
    let ports = s.ports();
    let stop = Arc::new(AtomicBool::new(false));
    let load = {
        let (stop, keys) = (stop.clone(), keys.clone());
        thread::spawn(move || {
            let mut sent = 0;
            let mut statuses = std::collections::BTreeMap::new();
            let mut clients: Vec<Client> =
                ports.iter().map(|&p| Client::connect(p).unwrap()).collect();
            let started = Instant::now();
            let mut i = 0u64;
            // 5× each rule's rate: 3 rules × 250/s, alternating Envoys.
            while !stop.load(Ordering::Relaxed) {
                let due = started + Duration::from_micros(1_333 * i);
                if let Some(wait) = due.checked_duration_since(Instant::now()) {
                    thread::sleep(wait);
                }
                let (mode, key) = &keys[(i % 3) as usize];
                let r = clients[(i / 3 % 2) as usize]
                    .request(Request::get(&format!("/{mode}")).header("x-user", key))
                    .unwrap();
                *statuses.entry((mode.clone(), r.status)).or_insert(0) += 1;
                sent += 1;
                i += 1;
            }
            (sent, statuses)
        })
    };
    thread::sleep(Duration::from_millis(1500));
    let slot = key_slot(
        redis_key_tag(
            "weir",
            "deny",
            AlgorithmKind::Gcra,
            &[format!("={}", keys[1].1)],
        )
        .as_bytes(),
    );
    // What the harness did, and when: from the kill until a second after the replica's
    // promotion (an Envoy whose bridge failed 3 times in a row leaves it alone for a
    // second: docs/global.md, "Failure modes"), the rules' failure modes decide.
    let outage = Excuse::starting("a Redis master killed");
    s.redis.kill_master_of_slot(slot);
    s.redis.wait_for_failover(slot, Duration::from_secs(20));
    let outage = outage.ended(Duration::from_secs(1));
    // Serve a while on the new master.
    thread::sleep(Duration::from_secs(3));
    stop.store(true, Ordering::Relaxed);
    let (sent, statuses) = load.join().unwrap();
    eprintln!("statuses per rule: {statuses:?}");
    let logs = logged(&s, sent);
    // What Redis and the leases admitted keeps the bound; inside the outage the failure
    // modes `allow` and `local` admit too (under `allow` nothing is counted: fail-open),
    // and every admission of those rules that lay there is left out, whatever its label.
    // `deny` admits nothing more: it is judged whole.
    s.assert_failure_modes_keep_their_bounds(&logs, &outage);
    assert!(
        statuses
            .get(&("deny".to_string(), 503))
            .copied()
            .unwrap_or(0)
            > 0
    );
    s.assert_no_panic();
}

/// The bridge stopped (SIGSTOP: it accepts and never answers), resumed, then killed:
/// requests get their failure mode within the timeout, and what the limiter admits keeps
/// the bound throughout.
#[test]
fn a_bridge_stopped_resumed_and_killed_keeps_the_bound() {
    let mut s = stack(
        r#"[{"name":"quota","scope":"global","key":[{"header":"x-user"}],
             "limit":{"algorithm":"gcra","rate":50,"period":"1s","burst":24},
             "global":{"lease":{"max":20,"ttl":"100ms","horizon":"100ms"},"failure_mode":"deny","expected_instances":2}}]"#,
    );
    let ports = s.ports();
    let run = |secs: f64| {
        paced_any_status(&ports, 250, secs, |_| {
            Request::get("/").header("x-user", "k")
        })
    };
    let mut sent = run(1.0);
    s.bridge.signal(libc::SIGSTOP);
    sent += run(1.0);
    s.bridge.signal(libc::SIGCONT);
    thread::sleep(Duration::from_millis(1100));
    sent += run(1.0);
    s.bridge.kill_hard();
    sent += run(1.0);
    let logs = logged(&s, sent);
    let checked = check(&s, &logs, "quota");
    eprintln!("{} units admitted over {sent} requests", checked.admitted);
    s.assert_no_panic();
}

/// Like [`paced`] from one thread per Envoy, accepting any status (a failure mode may
/// answer 503); returns how many were sent.
fn paced_any_status(
    ports: &[u16],
    per_s: u64,
    secs: f64,
    request: impl Fn(usize) -> Request,
) -> usize {
    let total = (per_s as f64 * secs) as usize;
    let mut clients: Vec<Client> = ports.iter().map(|&p| Client::connect(p).unwrap()).collect();
    let started = Instant::now();
    for i in 0..total {
        let due = started + Duration::from_secs_f64(i as f64 / per_s as f64);
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            thread::sleep(wait);
        }
        let sent_at = Instant::now();
        let r = clients[i % ports.len()].request(request(i)).unwrap();
        assert!(
            matches!(r.status, 200 | 429 | 503),
            "request {i}: status {}",
            r.status
        );
        // A request waits at most the bridge timeout (300 ms), plus margin.
        let waited = sent_at.elapsed();
        assert!(
            waited < Duration::from_millis(800),
            "request {i} waited {waited:?}"
        );
    }
    total
}
