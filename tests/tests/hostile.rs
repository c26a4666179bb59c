//! Hostile clients in a real Envoy (issue 32: "no excuse the engine gives itself"). Each
//! case plays one trick a client can play on its own requests, and is judged twice: by
//! the conformance checker from the access log (an admission is a request that went past
//! weir to its route, whatever weir labelled it: tests/src/decisions.rs), and by what
//! the upstream received (a request whose body reached the upstream was admitted,
//! whatever its client was answered). No case reads the engine's labels to excuse an
//! admission; the crowds check that no `bridge_failed` label appears while the bridge
//! is healthy.
//!
//! The global cases share one stack (a Redis Cluster, weir-bridge behind a TCP proxy
//! that adds 40 ms to every round trip, the stand-in upstream, and Envoys with 2
//! workers): [`hostile_clients_against_global_rules`] runs them in turn and reports each,
//! so that one failing does not hide the others. Costs known after the response and
//! bodies a strict parser refuses need no bridge and have an Envoy each.
//!
//! Every case prints what it measured: admitted against the bound, 429s, refusals,
//! bodies received.

use std::collections::BTreeMap;
use std::panic::{self, AssertUnwindSafe};
use std::sync::Barrier;
use std::thread;
use std::time::{Duration, Instant};

use weir_e2e::decisions::{now_us, with_decisions, Checked, Judge, Logged, Logs};
use weir_e2e::h2::{self, StreamEnd};
use weir_e2e::{
    shipped_bridge_cluster_yaml, shipped_plugin_config, wasm_filter_yaml, weir_wasm, with_stats,
    Bootstrap, Bridge, Client, Envoy, LlmUpstream, Received, RedisCluster, Request, SlowProxy,
    TestDir,
};

mod bodies;

/// What the delaying proxy adds to every round trip between Envoy and weir-bridge.
const BRIDGE_DELAY: Duration = Duration::from_millis(40);

/// How many clients a crowd on one key has.
const CROWD: usize = 300;

/// The rules of the `hostile` Envoy: a leased token bucket of 5 an hour (the crowds'
/// target, `failure_mode` the default, `allow`), and a global rule estimating its cost
/// from the body, whose key fits one request (a body over `max_bytes`, 512 KiB by
/// default, costs the `max`).
const HOSTILE: &str = r#"{"bridge":{"cluster":"weir_bridge","timeout":"500ms"},"rules":[
  {"name":"crowd","match":{"path":{"prefix":"/crowd"}},"scope":"global","key":[{"header":"x-user"}],
   "limit":{"algorithm":"token_bucket","capacity":5,"refill":5,"period":"1h"},
   "global":{"lease":{"max":5,"ttl":"1s"}}},
  {"name":"body","match":{"path":{"prefix":"/body"}},"scope":"global","key":[{"header":"x-user"}],
   "limit":{"algorithm":"token_bucket","capacity":1000,"refill":1000,"period":"1h"},
   "cost":{"body":{},"default":1000,"max":1000}}]}"#;

/// An exact global rule, `failure_mode: allow`: a crowd over many keys makes a bridge
/// call per request.
const EXACT_ALLOW: &str = r#"{"bridge":{"cluster":"weir_bridge","timeout":"500ms"},"rules":[
  {"name":"exact","scope":"global","key":[{"header":"x-user"}],
   "limit":{"algorithm":"token_bucket","capacity":5,"refill":5,"period":"1h"},
   "global":{"failure_mode":"allow"}}]}"#;

/// The calls in flight the circuit breaker of [`EXACT_ALLOW`]'s bridge cluster allows.
const BREAKER: usize = 8;

/// The README's config (envoy/envoy.yaml's plugin config) with only its global rule,
/// `per-tenant` (a GCRA of 20 a minute with a burst of 10, leased 5 at a time,
/// `failure_mode: local`), and its `response` settings as shipped. Its local rules are
/// left out: `per-ip` (50 a minute per client address) would stop a crowd from one
/// address before it reaches the global rule. Its `bridge.timeout`, 50 ms, is sized for a
/// bridge next to Envoy: 40 ms away, the calls of a crowd timed out (all 5 calls of the
/// HTTP/2 crowd, then the Envoy left its bridge alone for a second and the local fallback
/// decided all 300 requests: 5 admitted, within the bound) — a slow bridge, which may
/// take a rule into its failure mode, not a crowd. So the bridge gets 250 ms here.
fn readme_config() -> String {
    let mut config: serde_json::Value = serde_json::from_str(&shipped_plugin_config())
        .unwrap_or_else(|e| panic!("envoy/envoy.yaml's plugin config is not JSON: {e}"));
    let rules = config["rules"].as_array_mut().expect("rules");
    rules.retain(|r| r["name"] == "per-tenant");
    assert_eq!(rules.len(), 1, "envoy/envoy.yaml has a per-tenant rule");
    assert_eq!(
        config["bridge"]["timeout"], "50ms",
        "the shipped bridge timeout"
    );
    config["bridge"]["timeout"] = "250ms".into();
    config.to_string()
}

/// An Envoy (2 workers) running weir with `config`, every decision in its access log,
/// lines keyed by the request header `key_header`. Its listener is the harness's, as the
/// README's: `use_remote_address: true`.
struct Front {
    envoy: Envoy,
    logs: Logs,
    /// The plugin config, filter state on.
    config: String,
    _dir: TestDir,
}

impl Front {
    /// `bootstrap` makes the Envoy's bootstrap around weir's HTTP filter (a YAML list
    /// item).
    fn start(config: &str, key_header: &str, bootstrap: impl FnOnce(String) -> Bootstrap) -> Front {
        // Detailed stats: the cases read why costs settled as they did (`commit_*`).
        let config = with_stats(&with_decisions(config), "detailed");
        let dir = TestDir::new("hostile");
        let logs = Logs::new(dir.path(), 1, key_header);
        let bootstrap = bootstrap(wasm_filter_yaml(&config, &weir_wasm()));
        let envoy = Envoy::shared(&logs.add_to(0, bootstrap), 2);
        Front {
            envoy,
            logs,
            config,
            _dir: dir,
        }
    }

    /// In front of `upstream`'s routes, with the bridge cluster `bridge`.
    fn global(config: &str, key_header: &str, upstream: &LlmUpstream, bridge: &str) -> Front {
        Front::start(config, key_header, |filter| {
            upstream.bootstrap(filter, None).cluster(bridge.to_string())
        })
    }

    /// In front of the cluster `llm` (`cluster`), with `routes` (route list items).
    fn local(config: &str, key_header: &str, cluster: String, routes: &str) -> Front {
        Front::start(config, key_header, |filter| {
            Bootstrap::new()
                .http_filter(filter)
                .cluster(cluster)
                .routes(routes.to_string())
        })
    }

    fn port(&self) -> u16 {
        self.envoy.http_port
    }

    /// The access-log lines of key `key`, once `n` are there (or after 5 s).
    fn lines_of(&self, key: &str, n: usize) -> Vec<Logged> {
        let of_key = |logs: &[Vec<Logged>]| -> Vec<Logged> {
            logs.iter()
                .flatten()
                .filter(|l| l.key == key)
                .cloned()
                .collect()
        };
        of_key(&self.logs.read_until(|logs| of_key(logs).len() >= n))
    }

    /// This Envoy's bridge counters (weir's `bridge.*`), and Envoy's overflows of the
    /// bridge cluster's circuit breaker, in one look; those above 0.
    fn bridge_stats(&self) -> BTreeMap<String, u64> {
        thread::sleep(weir_e2e::WEIR_STATS_LAG);
        let pattern = r"^(wasmcustom\.weir\.weir\.bridge\.|cluster\.weir_bridge\.upstream_rq_(pending|active)_overflow$)";
        self.envoy
            .stats_matching(pattern)
            .into_iter()
            .filter(|(_, n)| *n > 0)
            .map(|(name, n)| {
                let short = name
                    .trim_start_matches("wasmcustom.weir.weir.")
                    .trim_start_matches("cluster.weir_bridge.upstream_rq_");
                (short.to_string(), n)
            })
            .collect()
    }

    /// Judges `rule`'s admissions in the whole log, every key, with the checker;
    /// panics on a violation, or when nothing was admitted.
    fn judge(&self, rule: &str) -> Checked {
        let all = self.logs.read_until(|_| true);
        let refs: Vec<&[Logged]> = all.iter().map(Vec::as_slice).collect();
        let checked = Judge::configured(&self.config, rule)
            .check(&refs)
            .unwrap_or_else(|v| panic!("{v}"));
        assert!(checked.admitted > 0, "no admission of {rule} to judge");
        checked
    }
}

/// The shared stack: Redis Cluster, weir-bridge behind the delaying proxy, the stand-in
/// upstream, and the Envoys of the cases (dropped first: field order is drop order).
struct Stack {
    hostile: Front,
    readme: Front,
    breaker: Front,
    upstream: LlmUpstream,
    bridge: Bridge,
    _proxy: SlowProxy,
    _redis: RedisCluster,
}

impl Stack {
    fn start() -> Stack {
        let started = Instant::now();
        let redis = RedisCluster::start(3, 1);
        let bridge = Bridge::start(&redis, &[]);
        let proxy = SlowProxy::start(bridge.port, BRIDGE_DELAY);
        let upstream = LlmUpstream::start();
        // The shipped bridge cluster (HTTP/2, health check, circuit breakers of 2,048),
        // its one endpoint the proxy.
        let shipped = shipped_bridge_cluster_yaml(&[proxy.port]);
        let small = shipped
            .replace("max_requests: 2048", &format!("max_requests: {BREAKER}"))
            .replace(
                "max_pending_requests: 2048",
                &format!("max_pending_requests: {BREAKER}"),
            );
        assert_eq!(
            small.matches(&format!(": {BREAKER}\n")).count(),
            2,
            "the circuit breakers of the shipped cluster:\n{shipped}"
        );
        let stack = Stack {
            hostile: Front::global(HOSTILE, "x-user", &upstream, &shipped),
            readme: Front::global(&readme_config(), "x-tenant", &upstream, &shipped),
            breaker: Front::global(EXACT_ALLOW, "x-user", &upstream, &small),
            upstream,
            bridge,
            _proxy: proxy,
            _redis: redis,
        };
        eprintln!("stack up in {:.1} s", started.elapsed().as_secs_f64());
        stack
    }

    /// What the upstream received with header `name` set to `value`.
    fn received(&self, name: &str, value: &str) -> Vec<Received> {
        self.upstream.witness().with_header(name, value)
    }
}

/// A case of a test that runs several on one stack: its name, and what it does.
type Case<S> = (&'static str, fn(&S));

/// Runs every case, each to its end; panics at the end naming those that failed.
fn run_cases<S>(stack: &S, cases: &[Case<S>]) {
    let mut failed = Vec::new();
    for (name, case) in cases {
        eprintln!("--- {name}");
        let started = Instant::now();
        let outcome = panic::catch_unwind(AssertUnwindSafe(|| case(stack)));
        let took = started.elapsed().as_secs_f64();
        match outcome {
            Ok(()) => eprintln!("--- {name}: passed in {took:.1} s"),
            Err(_) => {
                eprintln!("--- {name}: FAILED in {took:.1} s");
                failed.push(*name);
            }
        }
    }
    assert!(failed.is_empty(), "failed: {failed:?}");
}

/// The global cases, on one stack.
#[test]
fn hostile_clients_against_global_rules() {
    let stack = Stack::start();
    run_cases(
        &stack,
        &[
            ("a crowd on one key over 300 HTTP/1 connections", |s| {
                crowd_on_one_key(s, Target::leased(s), Protocol::Http1)
            }),
            ("a crowd on one key over one HTTP/2 connection", |s| {
                crowd_on_one_key(s, Target::leased(s), Protocol::Http2)
            }),
            (
                "the README's config, a crowd over 300 HTTP/1 connections",
                |s| crowd_on_one_key(s, Target::readme(s), Protocol::Http1),
            ),
            (
                "the README's config, a crowd over one HTTP/2 connection",
                |s| crowd_on_one_key(s, Target::readme(s), Protocol::Http2),
            ),
            (
                "a crowd over many keys fills the circuit breaker of an Envoy just started",
                |s| a_crowd_over_many_keys_fills_the_circuit_breaker(s, Before::Cold),
            ),
            (
                "a crowd over many keys fills the circuit breaker while calls end",
                |s| a_crowd_over_many_keys_fills_the_circuit_breaker(s, Before::Warm),
            ),
            (
                "a crowd over many keys fills the circuit breaker after a quiet second",
                |s| a_crowd_over_many_keys_fills_the_circuit_breaker(s, Before::Quiet),
            ),
            (
                "a body over body.max_bytes is not sent before admission",
                a_body_over_max_bytes_is_not_sent_before_admission,
            ),
        ],
    );
}

#[derive(Clone, Copy, Debug)]
enum Protocol {
    /// One request per connection, every connection open before the first request.
    Http1,
    /// Every request a stream of one connection, all in one write.
    Http2,
}

/// A crowd's target: a rule of one of the stack's Envoys, and the bound its key keeps.
struct Target<'a> {
    front: &'a Front,
    rule: &'static str,
    path: &'static str,
    key_header: &'static str,
    /// Units the key admits at once, and then per second.
    at_once: f64,
    per_s: f64,
}

impl Target<'_> {
    fn leased(s: &Stack) -> Target<'_> {
        Target {
            front: &s.hostile,
            rule: "crowd",
            path: "/crowd",
            key_header: "x-user",
            at_once: 5.0,
            per_s: 5.0 / 3600.0,
        }
    }

    fn readme(s: &Stack) -> Target<'_> {
        Target {
            front: &s.readme,
            rule: "per-tenant",
            path: "/tenant/acme",
            key_header: "x-tenant",
            at_once: 11.0,
            per_s: 20.0 / 60.0,
        }
    }
}

/// A fresh key per crowd: the cases share Envoys and Redis.
fn fresh_key(what: &str) -> String {
    format!("{what}-{}", now_us())
}

/// 300 requests on one key at once, against a rule whose key admits `at_once` units:
/// the upstream receives no more than the bound, every other request gets 429, no
/// decision says the bridge failed, and the checker passes. On 20691aa a bridge call
/// carried its caller and 64 waiters, and the 66th request took the rule's failure
/// mode with a healthy bridge.
fn crowd_on_one_key(s: &Stack, target: Target, protocol: Protocol) {
    let key = fresh_key(&format!("{protocol:?}").to_lowercase());
    let request = || {
        Request::get(target.path)
            .header(target.key_header, &key)
            .header("x-crowd", &key)
    };
    let stats_before = target.front.bridge_stats();
    let started = Instant::now();
    let client_statuses = match protocol {
        Protocol::Http1 => Some(http1_crowd(target.front.port(), CROWD, |_| request())),
        Protocol::Http2 => {
            let requests: Vec<_> = (0..CROWD)
                .map(|_| {
                    let headers = vec![
                        (target.key_header.to_string(), key.clone()),
                        ("x-crowd".to_string(), key.clone()),
                    ];
                    (target.path.to_string(), headers)
                })
                .collect();
            let ends = h2::crowd(target.front.port(), &requests, Duration::from_secs(20))
                .unwrap_or_else(|e| panic!("HTTP/2 crowd: {e}"));
            let answered = ends.iter().filter(|e| **e == StreamEnd::Answered).count();
            assert_eq!(answered, CROWD, "streams not answered: {ends:?}");
            None
        }
    };
    let took = started.elapsed().as_secs_f64();
    let lines = target.front.lines_of(&key, CROWD);
    assert_eq!(lines.len(), CROWD, "access-log lines of the crowd");
    let statuses = count_statuses(lines.iter().map(|l| l.status));
    if let Some(client) = &client_statuses {
        assert_eq!(client, &statuses, "what the clients saw, what Envoy logged");
    }
    let admitted = lines.iter().filter(|l| l.forwarded()).count();
    let received = s.received("x-crowd", &key);
    let bound = (target.at_once + target.per_s * took).floor() as usize;
    let labels = count_labels(&lines, target.rule);
    let failed = labels.get("bridge_failed").copied().unwrap_or(0);
    eprintln!(
        "{protocol:?} crowd of {CROWD} on rule {}: the upstream received {} (bound {bound} in \
         {took:.2} s), the access log admitted {admitted}; statuses {statuses:?}; \
         decisions {labels:?}; bridge counters {:?}",
        target.rule,
        received.len(),
        difference(&target.front.bridge_stats(), &stats_before),
    );
    assert!(
        received.len() <= bound,
        "the upstream received {} requests of the crowd, the bound is {bound}",
        received.len()
    );
    assert_eq!(received.len(), admitted, "the upstream and the access log");
    assert_eq!(failed, 0, "decisions that say the bridge failed");
    let limited = statuses.get(&429).copied().unwrap_or(0);
    assert_eq!(
        admitted + limited,
        CROWD,
        "every other request 429: {statuses:?}"
    );
    let checked = target.front.judge(target.rule);
    eprintln!("checker: {checked:?}");
    target.front.envoy.assert_no_panic();
}

/// `n` requests from `n` HTTP/1 connections, every connection open before the first
/// request goes; the statuses counted.
fn http1_crowd(
    port: u16,
    n: usize,
    request: impl Fn(usize) -> Request + Sync,
) -> BTreeMap<u16, usize> {
    let ready = Barrier::new(n);
    let (ready, request) = (&ready, &request);
    let statuses: Vec<u16> = thread::scope(|scope| {
        let handles: Vec<_> = (0..n)
            .map(|i| {
                scope.spawn(move || {
                    let mut client = Client::connect(port).unwrap();
                    ready.wait();
                    client.request(request(i)).map(|r| r.status).unwrap_or(0)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    count_statuses(statuses)
}

fn count_statuses(statuses: impl IntoIterator<Item = u16>) -> BTreeMap<u16, usize> {
    let mut counts = BTreeMap::new();
    for s in statuses {
        *counts.entry(s).or_insert(0) += 1;
    }
    counts
}

/// How the Envoy of a crowd over many keys was when the crowd came.
#[derive(Clone, Copy, Debug)]
enum Before {
    /// Just started: no bridge call of it has ended yet.
    Cold,
    /// A call of it ended just before.
    Warm,
    /// Its last call ended a second before: longer than the bridge timeout (500 ms)
    /// and 100 ms.
    Quiet,
}

/// ~100 requests at once, each on a key of its own, against an exact rule
/// (`failure_mode: allow`) whose bridge cluster lets 8 calls be in flight: Envoy refuses
/// the calls beyond them at once. A full circuit breaker is not an outage: the refused
/// requests get 429, never the failure mode, and the upstream receives exactly the
/// requests Redis admitted. On 20691aa the refused requests were allowed, whatever came
/// before (100 received, 8 granted).
///
/// On 2940c1a only the Envoy whose bridge calls are ending passes. A refusal counts as
/// a full circuit breaker only while a call of the Envoy ended less than the bridge
/// timeout and 110 ms ago; otherwise it is read as a cluster without hosts, and the
/// failure mode applies. So a crowd that comes after a quiet second opens the rule (all
/// 100 received, 8 granted, 92 `bridge_failed`), and so do the first requests of a crowd
/// on an Envoy just started, until the first call ends (9 to 48 received, 8 granted).
/// The checker alone cannot see it (each key admitted once is within its bound): the
/// upstream, against what Redis granted, does.
fn a_crowd_over_many_keys_fills_the_circuit_breaker(s: &Stack, before: Before) {
    const N: usize = 100;
    let front = &s.breaker;
    let run = fresh_key(&format!("breaker-{before:?}").to_lowercase());
    let keys: Vec<String> = (0..N).map(|i| format!("{run}-{i}")).collect();
    let stats_before = front.bridge_stats();
    match before {
        Before::Cold => {}
        Before::Warm => warm_up(front, &run),
        Before::Quiet => {
            warm_up(front, &run);
            thread::sleep(Duration::from_secs(1));
        }
    }
    let granted_before = granted(s, "exact");
    let client = http1_crowd(front.port(), N, |i| {
        Request::get("/many")
            .header("x-user", &keys[i])
            .header("x-crowd", &run)
    });
    let lines: Vec<Logged> = keys.iter().flat_map(|k| front.lines_of(k, 1)).collect();
    assert_eq!(lines.len(), N, "access-log lines of the crowd");
    let statuses = count_statuses(lines.iter().map(|l| l.status));
    assert_eq!(client, statuses, "what the clients saw, what Envoy logged");
    let received = s.received("x-crowd", &run).len();
    let granted = granted(s, "exact") - granted_before;
    let stats = difference(&front.bridge_stats(), &stats_before);
    let labels = count_labels(&lines, "exact");
    eprintln!(
        "{before:?} Envoy, {N} keys at once, {BREAKER} calls in flight at most: statuses \
         {statuses:?}; the upstream received {received}, Redis granted {granted}; bridge \
         counters {stats:?}; decisions {labels:?}"
    );
    assert_eq!(
        received as u64, granted,
        "the upstream received what Redis admitted"
    );
    assert!(
        stats.contains_key("bridge.refused"),
        "no call was refused: the crowd did not fill the breaker"
    );
    assert_eq!(
        labels.get("bridge_failed"),
        None,
        "decisions that say the bridge failed"
    );
    assert_eq!(
        statuses.get(&200).copied().unwrap_or(0) + statuses.get(&429).copied().unwrap_or(0),
        N,
        "only 200 and 429: {statuses:?}"
    );
    let checked = front.judge("exact");
    eprintln!("checker: {checked:?}");
    front.envoy.assert_no_panic();
}

/// One request on a key of its own, so that a bridge call of `front` has just ended.
fn warm_up(front: &Front, run: &str) {
    let r = weir_e2e::get(front.port(), "/warm", &[("x-user", &format!("{run}-warm"))])
        .unwrap_or_else(|e| panic!("warm-up request: {e}"));
    assert_eq!(r.status, 200, "warm-up request");
}

/// `after` less `before`, counter by counter, without those that did not move.
fn difference(
    after: &BTreeMap<String, u64>,
    before: &BTreeMap<String, u64>,
) -> BTreeMap<String, u64> {
    after
        .iter()
        .map(|(name, n)| (name.clone(), n - before.get(name).copied().unwrap_or(0)))
        .filter(|(_, n)| *n > 0)
        .collect()
}

/// Units weir-bridge granted for `rule` so far.
fn granted(s: &Stack, rule: &str) -> u64 {
    s.bridge
        .metric_sum("weir_bridge_units_granted_total", &[("rule", rule)]) as u64
}

/// The decisions of `rule` in `lines`, counted by `outcome:source`.
fn count_labels(lines: &[Logged], rule: &str) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for d in lines.iter().filter_map(|l| l.decision(rule)) {
        *counts.entry(d.outcome.clone()).or_insert(0) += 1;
        *counts
            .entry(format!("{}:{}", d.outcome, d.source))
            .or_insert(0) += 1;
    }
    counts
}

/// Three requests in a row on one key, each with a 600 KB body (over `body.max_bytes`:
/// estimated at the `max`, 1,000, which the key holds once): the upstream receives the
/// first body whole and not one byte of the others' bodies, their clients get 429. On
/// 20691aa a body over `max_bytes` went on to the upstream while the bridge call was in
/// flight: all three reached it whole.
fn a_body_over_max_bytes_is_not_sent_before_admission(s: &Stack) {
    const BYTES: usize = 600_000;
    let front = &s.hostile;
    let key = fresh_key("body");
    let prompt = "x".repeat(BYTES - 60);
    let body =
        format!(r#"{{"max_tokens":10,"messages":[{{"role":"user","content":"{prompt}"}}]}}"#);
    let mut statuses = Vec::new();
    for _ in 0..3 {
        // A connection each: Envoy may close one after refusing a body it did not read.
        let mut client = Client::connect(front.port()).unwrap();
        let r = client.request(
            Request::post("/body", body.clone())
                .header("content-type", "application/json")
                .header("x-user", &key),
        );
        statuses.push(r.map_or(0, |r| r.status));
    }
    let lines = front.lines_of(&key, 3);
    // Give the upstream a moment to read what reached it.
    thread::sleep(Duration::from_millis(200));
    let received = s.received("x-user", &key);
    let bodies: Vec<(usize, bool)> = received
        .iter()
        .map(|r| (r.body_bytes, r.complete))
        .collect();
    eprintln!(
        "three {BYTES}-byte bodies on one key: statuses {statuses:?}; the upstream received \
         {} requests, their body bytes (and whether whole) {bodies:?}; decisions {:?}",
        received.len(),
        count_labels(&lines, "body")
    );
    assert_eq!(statuses, [200, 429, 429]);
    let whole = received.iter().filter(|r| r.complete).count();
    assert_eq!(whole, 1, "bodies the upstream received whole: {bodies:?}");
    let bytes: usize = received.iter().map(|r| r.body_bytes).sum();
    assert_eq!(
        bytes,
        body.len(),
        "body bytes the upstream received: {bodies:?}"
    );
    let checked = front.judge("body");
    eprintln!("checker: {checked:?}");
    front.envoy.assert_no_panic();
}
