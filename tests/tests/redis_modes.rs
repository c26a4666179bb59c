//! Global limits on the Redis an operator already runs (docs/redis.md): one standalone
//! `redis-server`, and a master behind Sentinel through a failover. The same stack as
//! global_conformance.rs (weir-bridge and two Envoys with two workers each, every decision
//! in the access logs) with the bridge in `--redis-mode standalone` or `sentinel`, and every
//! run judged by the core's conformance checker over the admissions of both Envoys.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use weir_e2e::decisions::{Excuse, Logged};
use weir_e2e::global::GlobalStack;
use weir_e2e::{Client, Request};

/// How many requests to each path got each status.
type Statuses = BTreeMap<(String, u16), usize>;

/// A global GCRA rule (50/s, burst 24) on `/{name}`, leased, with `failure_mode`.
fn rule(name: &str, failure_mode: &str) -> String {
    format!(
        r#"{{"name":"{name}","match":{{"path":{{"prefix":"/{name}"}}}},"scope":"global",
            "key":[{{"header":"x-user"}}],
            "limit":{{"algorithm":"gcra","rate":50,"period":"1s","burst":24}},
            "global":{{"lease":{{"max":20,"ttl":"100ms","horizon":"100ms"}},"failure_mode":"{failure_mode}","expected_instances":2}}}}"#
    )
}

fn config(rules: &[String]) -> String {
    format!(
        r#"{{"bridge": {{"cluster": "weir_bridge", "timeout": "300ms"}}, "rules": [{}]}}"#,
        rules.join(",")
    )
}

/// Requests to `paths` in turn (one key each), alternating between the Envoys of `ports`,
/// `per_s` in all, until `stop`; returns how many were sent and the statuses per path.
fn load(
    ports: Vec<u16>,
    paths: Vec<String>,
    per_s: f64,
    stop: Arc<AtomicBool>,
) -> thread::JoinHandle<(usize, Statuses)> {
    thread::spawn(move || {
        let mut clients: Vec<Client> = ports.iter().map(|&p| Client::connect(p).unwrap()).collect();
        let mut statuses = BTreeMap::new();
        let started = Instant::now();
        let mut i = 0usize;
        while !stop.load(Ordering::Relaxed) {
            let due = started + Duration::from_secs_f64(i as f64 / per_s);
            if let Some(wait) = due.checked_duration_since(Instant::now()) {
                thread::sleep(wait);
            }
            let path = &paths[i % paths.len()];
            let envoy = i / paths.len() % clients.len();
            let r = clients[envoy]
                .request(Request::get(path).header("x-user", "tenant"))
                .unwrap();
            *statuses.entry((path.clone(), r.status)).or_insert(0) += 1;
            i += 1;
        }
        (i, statuses)
    })
}

fn logged<R>(s: &GlobalStack<R>, sent: usize) -> Vec<Vec<Logged>> {
    let logs = s.logs.read(sent);
    let lines: usize = logs.iter().map(Vec::len).sum();
    assert_eq!(lines, sent, "access log lines vs requests sent");
    logs
}

fn admitted(statuses: &Statuses, path: &str) -> usize {
    statuses.get(&(path.to_string(), 200)).copied().unwrap_or(0)
}

/// One standalone server: at 5× the rate from two Envoys, what Redis and the leases
/// admit keeps the bound, and close to the bound is admitted.
#[test]
fn a_standalone_redis_keeps_the_bound_across_two_envoys() {
    let config = config(&[rule("quota", "deny")]);
    let s = GlobalStack::standalone(&[&config, &config], "x-user");
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let run = load(s.ports(), vec!["/quota".into()], 250.0, stop.clone());
    thread::sleep(Duration::from_secs(2));
    stop.store(true, Ordering::Relaxed);
    let (sent, statuses) = run.join().unwrap();
    let took = started.elapsed().as_secs_f64();
    let logs = logged(&s, sent);
    let refs: Vec<&[Logged]> = logs.iter().map(Vec::as_slice).collect();
    let checked = s
        .judge("quota")
        .check(&refs)
        .unwrap_or_else(|v| panic!("{v}"));
    let ok = admitted(&statuses, "/quota");
    eprintln!(
        "standalone: {ok} of {sent} admitted in {took:.2} s; {statuses:?}; {:?}",
        checked.labelled
    );
    // Burst + 1 and 50/s: about 125 in 2 s. Refusing everything would also keep the bound.
    assert!(ok >= 70, "only {ok} admitted");
    assert!(
        s.weir_stat("rule.quota.failure_denied") == 0,
        "a failure on a healthy Redis"
    );
    s.assert_no_panic();
}

/// The master behind Sentinel SIGKILLed under load, with each failure mode: the
/// sentinels promote the replica and the bridge follows without a restart. What Redis
/// and the leases admit keeps the bound (`deny` is judged whole); inside the outage
/// `allow` and `local` admit by their failure mode, and the local fallback keeps the
/// bound plus two bursts (docs/global.md).
#[test]
fn a_sentinel_failover_under_load_keeps_the_bound_with_each_failure_mode() {
    let modes = ["allow", "deny", "local"];
    let rules: Vec<String> = modes.iter().map(|m| rule(m, m)).collect();
    let config = config(&rules);
    let mut s = GlobalStack::sentinel(&[&config, &config], 1, "x-user");
    let stop = Arc::new(AtomicBool::new(false));
    let paths: Vec<String> = modes.iter().map(|m| format!("/{m}")).collect();
    // 5× each rule's rate: 3 rules × 250/s.
    let run = load(s.ports(), paths, 750.0, stop.clone());
    thread::sleep(Duration::from_millis(1500));
    let old = s.redis.master_addr().expect("a sentinel names the master");
    // What the harness did, and when: from the kill until a second after the promotion
    // (an Envoy whose bridge failed 3 times in a row leaves it alone for a second), the
    // rules' failure modes decide.
    let outage = Excuse::starting("the Sentinel master killed");
    s.redis.server(&old).kill();
    let promoted = s.redis.wait_for_new_master(&old, Duration::from_secs(30));
    let outage = outage.ended(Duration::from_secs(1));
    // Serve a while on the new master.
    thread::sleep(Duration::from_secs(3));
    stop.store(true, Ordering::Relaxed);
    let (sent, statuses) = run.join().unwrap();
    eprintln!("killed {old}, {promoted} promoted; statuses per rule: {statuses:?}");
    let logs = logged(&s, sent);
    s.assert_failure_modes_keep_their_bounds(&logs, &outage);
    let failed = statuses
        .get(&("/deny".to_string(), 503))
        .copied()
        .unwrap_or(0);
    assert!(
        failed > 0,
        "the outage never reached the failure mode: {statuses:?}"
    );
    // After the promotion the bridge serves again: every rule admits on the new master.
    for path in ["/allow", "/deny", "/local"] {
        assert!(admitted(&statuses, path) >= 70, "{path}: {statuses:?}");
    }
    s.assert_no_panic();
}
