//! Concurrency limits in a real Envoy, in front of a service whose latency grows past a
//! knee ([`KneeUpstream`]): a fixed `max_in_flight` lets exactly that many requests of a
//! key reach the upstream, every way a stream can end gives its place back (response,
//! route timeout, client reset — 10,000 of them), and an adaptive limit follows the
//! service's capacity as the load doubles past it.

use std::io::Write;
use std::net::TcpStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::thread;
use std::time::{Duration, Instant};
use weir_e2e::{
    documented_json, wait_until, wasm_filter_yaml, weir_wasm, Bootstrap, Client, Envoy,
    KneeUpstream, Request,
};

/// The tests of this file run one at a time: the adaptive one measures latency, and the
/// 10,000 aborts of another (16 threads) on the same 2 cores would be what it measured.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn start(config: &str, upstream: &KneeUpstream, route_timeout: &str, workers: u32) -> Envoy {
    let bootstrap = Bootstrap::new()
        .http_filter(wasm_filter_yaml(config, &weir_wasm()))
        .cluster(upstream.cluster_yaml())
        .routes(KneeUpstream::routes_yaml(route_timeout));
    Envoy::alone(&bootstrap, workers)
}

/// docs/algorithms.md "Concurrency limits", as written there: 5 in flight per tenant.
fn per_tenant() -> String {
    documented_json("docs/algorithms.md", "concurrency-example")
}

fn slow(tenant: &str, ms: u64) -> Request {
    Request::get("/work")
        .header("x-tenant", tenant)
        .header("x-service-ms", ms.to_string())
}

/// Sends `n` requests at once, each on its own connection; their statuses and the
/// `Retry-After` of the denials.
fn at_once(
    port: u16,
    n: usize,
    request: impl Fn(usize) -> Request + Sync,
) -> Vec<(u16, Option<String>)> {
    let request = &request;
    thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|i| {
                s.spawn(move || {
                    let mut c = Client::connect(port).unwrap();
                    let r = c.request(request(i)).unwrap();
                    let headers = ["retry-after", "ratelimit-policy"].map(|h| r.header(h));
                    let denial = match headers {
                        [Some(retry), Some(policy)] => Some(format!("{retry} {policy}")),
                        _ => None,
                    };
                    (r.status, denial)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn count(statuses: &[(u16, Option<String>)], status: u16) -> usize {
    statuses.iter().filter(|(s, _)| *s == status).count()
}

#[test]
fn exactly_max_in_flight_reach_the_upstream_and_other_keys_are_unaffected() {
    let _alone = one_at_a_time();
    let upstream = KneeUpstream::start(1_000, Duration::from_millis(10));
    let envoy = start(&per_tenant(), &upstream, "1s", 2);
    // 12 slow requests of acme and 5 of globex, all at once.
    let statuses = at_once(envoy.http_port, 17, |i| {
        slow(if i < 12 { "acme" } else { "globex" }, 600)
    });
    assert_eq!(count(&statuses, 200), 10, "{statuses:?}");
    assert_eq!(count(&statuses, 429), 7);
    assert!(statuses
        .iter()
        .filter(|(s, _)| *s == 429)
        .all(|(_, denial)| denial.as_deref() == Some("1 \"tenant-in-flight\";q=5;w=1")));
    assert_eq!(
        upstream.max_in_flight(),
        10,
        "5 per tenant reached the upstream"
    );
    // Every way a stream ends gives its place back: these 5 time out at the route's
    // 1 s (Envoy answers 504 and resets the upstream request).
    upstream.reset_max_in_flight();
    let timed_out = at_once(envoy.http_port, 5, |_| slow("acme", 3_000));
    assert_eq!(count(&timed_out, 504), 5, "{timed_out:?}");
    let again = at_once(envoy.http_port, 6, |_| slow("acme", 300));
    assert_eq!(
        (count(&again, 200), count(&again, 429)),
        (5, 1),
        "{again:?}"
    );
    assert_eq!(
        envoy.plugin_stat("weir", "rule.tenant-in-flight.in_flight_released"),
        envoy.plugin_stat("weir", "rule.tenant-in-flight.allowed")
    );
    assert_eq!(
        envoy.plugin_stat("weir", "rule.tenant-in-flight.in_flight_release_errors"),
        0
    );
    envoy.assert_no_panic();
}

/// 10,000 requests whose clients hang up: some before the filter decides, most while
/// the upstream holds them. Every place is given back: afterwards the tenant has all 5.
#[test]
fn ten_thousand_aborted_requests_leak_no_place() {
    let _alone = one_at_a_time();
    let upstream = KneeUpstream::start(1_000, Duration::from_millis(10));
    let envoy = start(&per_tenant(), &upstream, "5s", 2);
    let port = envoy.http_port;
    let sent = AtomicU64::new(0);
    thread::scope(|s| {
        for t in 0..16u64 {
            let sent = &sent;
            s.spawn(move || {
                let mut i = 0u64;
                while sent.fetch_add(1, Ordering::Relaxed) < 10_000 {
                    let Ok(mut conn) = TcpStream::connect(("127.0.0.1", port)) else {
                        continue;
                    };
                    let request = slow("acme", 200).encode(port);
                    if conn.write_all(&request).is_ok() {
                        // Hang up at once, or after the request had time to be admitted.
                        thread::sleep(Duration::from_micros((t * 131 + i * 977) % 3_000));
                    }
                    drop(conn);
                    i += 1;
                }
            });
        }
    });
    // The upstream sees the resets as its writes fail, once its service time is over.
    assert!(wait_until(
        Duration::from_secs(10),
        Duration::from_millis(50),
        || upstream.in_flight() == 0
    ));
    // Stats lag traffic: each worker sends its increments on its next tick, so the two
    // counters are read until they agree (a place never given back keeps them apart).
    let stat = |name: &str| envoy.plugin_stat("weir", &format!("rule.tenant-in-flight.{name}"));
    wait_until(Duration::from_secs(3), Duration::from_millis(100), || {
        stat("in_flight_released") == stat("allowed")
    });
    let allowed = stat("allowed");
    let released = stat("in_flight_released");
    assert!(
        allowed >= 1_000,
        "only {allowed} admitted: the test did not exercise aborts"
    );
    assert_eq!(
        released, allowed,
        "every admitted stream gave its place back"
    );
    upstream.reset_max_in_flight();
    let after = at_once(port, 6, |_| slow("acme", 500));
    assert_eq!(
        (count(&after, 200), count(&after, 429)),
        (5, 1),
        "{after:?}"
    );
    assert_eq!(upstream.max_in_flight(), 5);
    envoy.assert_no_panic();
}

/// What closed-loop clients saw in one phase of a load.
#[derive(Default)]
struct Phase {
    ok: u64,
    limited: u64,
    latencies_us: Vec<u64>,
    /// The `q` of the `RateLimit-Policy` of every response that had one.
    quotas: Vec<u64>,
}

impl Phase {
    fn p99_us(&mut self) -> u64 {
        self.latencies_us.sort_unstable();
        let at =
            (self.latencies_us.len() * 99 / 100).min(self.latencies_us.len().saturating_sub(1));
        self.latencies_us.get(at).copied().unwrap_or(0)
    }
}

/// `clients` clients (of `tenant`, when given), each sending its next request as soon as
/// the last is answered (a denied one waits 10 ms first), for `secs`.
fn closed_loop(port: u16, clients: usize, secs: f64, tenant: Option<&str>) -> Phase {
    let phase = Mutex::new(Phase::default());
    let until = Instant::now() + Duration::from_secs_f64(secs);
    thread::scope(|s| {
        for _ in 0..clients {
            let phase = &phase;
            s.spawn(move || {
                let mut c = Client::connect(port).unwrap();
                let mut mine = Phase::default();
                while Instant::now() < until {
                    let started = Instant::now();
                    let mut request = Request::get("/work");
                    if let Some(tenant) = tenant {
                        request = request.header("x-tenant", tenant);
                    }
                    let r = c.request(request).unwrap();
                    let quota = r.header("ratelimit-policy").and_then(|p| {
                        p.split(";q=")
                            .nth(1)?
                            .split(';')
                            .next()?
                            .parse::<u64>()
                            .ok()
                    });
                    mine.quotas.extend(quota);
                    match r.status {
                        200 => {
                            mine.ok += 1;
                            mine.latencies_us.push(started.elapsed().as_micros() as u64);
                        }
                        429 => {
                            mine.limited += 1;
                            thread::sleep(Duration::from_millis(10));
                        }
                        other => panic!("status {other}"),
                    }
                }
                let mut all = phase.lock().unwrap();
                all.ok += mine.ok;
                all.limited += mine.limited;
                all.latencies_us.extend(mine.latencies_us);
                all.quotas.extend(mine.quotas);
            });
        }
    });
    phase.into_inner().unwrap()
}

/// The service serves 4 at once in 40 ms: 100 requests a second at most, and a latency of
/// 40 ms × in-flight / 4 past the knee. Clients double from 4 (the knee) to 8 and 16.
/// Stated bounds: 3 s after each doubling, and 4 s later, the limit is between one
/// below the knee and twice the knee (it can dip one below: the latencies of requests
/// admitted under a higher limit arrive in the next interval, with their queueing); the
/// P99 of admitted requests stays under 2.5× the uncongested 40 ms (without a limiter,
/// 16 clients would see 160 ms); goodput stays within 80 % of the best static
/// limit's (the knee: 100 per second).
#[test]
fn an_adaptive_limit_follows_a_load_that_doubles_past_the_knee() {
    let _alone = one_at_a_time();
    let upstream = KneeUpstream::start(4, Duration::from_millis(40));
    let config = documented_json("docs/algorithms.md", "adaptive-concurrency-example");
    let envoy = start(&config, &upstream, "5s", 2);
    let limit = || {
        envoy
            .stat("wasmcustom.weir.weir.rule.service.concurrency_limit")
            .unwrap_or(0)
    };
    let mut report = Vec::new();
    for clients in [4usize, 8, 16] {
        // Settling, then measured.
        let _ = closed_loop(envoy.http_port, clients, 3.0, None);
        let settled = limit();
        let mut phase = closed_loop(envoy.http_port, clients, 4.0, None);
        let (after, p99_ms) = (limit(), phase.p99_us() as f64 / 1e3);
        let goodput = phase.ok as f64 / 4.0;
        report.push(format!(
            "{clients} clients: limit {settled} then {after}, {goodput:.0} ok/s, {} limited, p99 {p99_ms:.1} ms",
            phase.limited
        ));
        assert!(
            (3..=8).contains(&settled) && (3..=8).contains(&after),
            "{report:?}"
        );
        assert!(p99_ms < 100.0, "{report:?}");
        assert!(goodput >= 80.0, "{report:?}");
    }
    eprintln!("{}", report.join("\n"));
    let stat = |name: &str| envoy.plugin_stat("weir", &format!("rule.service.{name}"));
    assert!(stat("latency_baseline_us") >= 40_000 && stat("latency_baseline_us") < 60_000);
    assert_eq!(stat("in_flight_released"), stat("allowed"));
    envoy.assert_no_panic();
}

/// `adaptive.per_key`: two tenants in front of two services, one that serves 4 at once
/// and one that serves 1 (40 ms each; 8 and 4 closed-loop clients), behind one rule
/// keyed by tenant. Each tenant's
/// limit (the `q` of `RateLimit-Policy` on every response) settles near its own
/// service's knee; with one controller for the rule they would share one limit.
#[test]
fn per_key_adaptive_limits_follow_each_tenants_own_service() {
    let _alone = one_at_a_time();
    let wide = KneeUpstream::start(4, Duration::from_millis(40));
    let narrow = KneeUpstream::start(1, Duration::from_millis(40));
    let config = r#"{"response":{"headers_on_allowed":true},
        "rules":[{"name":"tenants","stats":"detailed","key":[{"header":"x-tenant"}],
        "limit":{"algorithm":"concurrency","max_in_flight":200,
                 "adaptive":{"interval":"500ms","per_key":true}}}]}"#;
    let routes = "- match: { prefix: \"/\", headers: [ { name: x-tenant, string_match: { exact: narrow } } ] }
  route: { cluster: narrow, timeout: 5s }
- match: { prefix: \"/\" }
  route: { cluster: wide, timeout: 5s }
";
    let bootstrap = Bootstrap::new()
        .http_filter(wasm_filter_yaml(config, &weir_wasm()))
        .cluster(wide.cluster_yaml_named("wide"))
        .cluster(narrow.cluster_yaml_named("narrow"))
        .routes(routes);
    let envoy = Envoy::alone(&bootstrap, 2);
    let port = envoy.http_port;
    // Every response names its key's limit (`headers_on_allowed`).
    let load = |tenant: &str, clients: usize, secs: f64| {
        let phase = closed_loop(port, clients, secs, Some(tenant));
        assert_eq!(
            phase.quotas.len() as u64,
            phase.ok + phase.limited,
            "a response without its quota"
        );
        phase.quotas
    };
    let both = |secs: f64| {
        thread::scope(|s| {
            let w = s.spawn(|| load("wide", 8, secs));
            let n = s.spawn(|| load("narrow", 4, secs));
            (w.join().unwrap(), n.join().unwrap())
        })
    };
    let _ = both(4.0); // settling
    wide.reset_max_in_flight();
    narrow.reset_max_in_flight();
    let (w, n) = both(4.0);
    let range = |q: &[u64]| (q.iter().min().copied(), q.iter().max().copied());
    let report = format!(
        "wide: quotas {:?}, at most {} at the service; narrow: quotas {:?}, at most {}",
        range(&w),
        wide.max_in_flight(),
        range(&n),
        narrow.max_in_flight()
    );
    eprintln!("{report}");
    // Each near its own knee: tolerance × c to that plus its square root, give or take
    // one (one run: 4–6 and 2–3), and the two apart.
    assert!(w.iter().all(|q| (3..=8).contains(q)), "{report}");
    assert!(n.iter().all(|q| (1..=3).contains(q)), "{report}");
    assert!(narrow.max_in_flight() <= 3, "{report}");
    let median = |q: &[u64]| {
        let mut q = q.to_vec();
        q.sort_unstable();
        q[q.len() / 2]
    };
    assert!(median(&w) > median(&n), "{report}");
    assert_eq!(
        envoy.plugin_stat("weir", "rule.tenants.keys_without_controller"),
        0
    );
    let stat = |name: &str| envoy.plugin_stat("weir", &format!("rule.tenants.{name}"));
    assert_eq!(stat("in_flight_released"), stat("allowed"));
    envoy.assert_no_panic();
}

/// Adaptive samples measure the service: a local reply is not sampled even when its
/// status is 200 (a `direct_response` route; the filter reads Envoy's
/// `response.code_details`, which is `via_upstream` only for the upstream's answers),
/// while the upstream's answers are.
#[test]
fn local_replies_are_not_sampled_by_an_adaptive_rule() {
    let _alone = one_at_a_time();
    let upstream = KneeUpstream::start(4, Duration::from_millis(5));
    let config = r#"{"rules":[{"name":"service","limit":{"algorithm":"concurrency",
        "max_in_flight":200,"adaptive":{"interval":"100ms"}}}]}"#;
    let routes = format!(
        "- match: {{ prefix: \"/local\" }}\n  direct_response: {{ status: 200, body: {{ inline_string: \"local\" }} }}\n{}",
        KneeUpstream::routes_yaml("5s")
    );
    let bootstrap = Bootstrap::new()
        .http_filter(wasm_filter_yaml(config, &weir_wasm()))
        .cluster(upstream.cluster_yaml())
        .routes(routes);
    let envoy = Envoy::alone(&bootstrap, 2);
    let sample = || {
        envoy
            .stat("wasmcustom.weir.weir.rule.service.latency_sample_us")
            .unwrap_or(0)
    };
    let send = |path: &str, n: usize| {
        let mut c = Client::connect(envoy.http_port).unwrap();
        for _ in 0..n {
            assert_eq!(c.request(Request::get(path)).unwrap().status, 200);
        }
    };
    send("/local", 300);
    thread::sleep(Duration::from_millis(700));
    assert_eq!(sample(), 0, "local replies were sampled");
    send("/work", 300);
    assert!(
        wait_until(
            Duration::from_secs(5),
            Duration::from_millis(50),
            || sample() > 0
        ),
        "the upstream's answers were not sampled"
    );
    assert_eq!(upstream.received(), 300);
    envoy.assert_no_panic();
}
