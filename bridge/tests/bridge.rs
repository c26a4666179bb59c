//! The bridge against real Redis: acquire replies, stop at the first denial, health,
//! metrics, commits (in process, through the Router), on every deployment the bridge
//! supports (`cluster::*`, `standalone::*`, `sentinel::*`); then the binary itself on a
//! 6-node Redis Cluster: failover under load, the drain and graceful shutdown.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod common;

use common::{Backend, Servers};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::{json, Value as Json};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tower::ServiceExt;
use weir_bridge::scripts::Invocation;
use weir_bridge::{app, state_from_client, AppState, Secret};
use weir_e2e::{key_slot, redis_cli_at, wait_until, Process, RedisCluster};
use weir_protocol::algorithms::Ask;
use weir_protocol::wire::v1::{AcquireRequest, AcquireResponse, ACQUIRE_PATH};
use weir_protocol::wire::{v2, v3, CheckedItem, SECRET_HEADER};

const SECRET: &str = "bridge-test-secret";

on_every_backend!(
    acquire_health_and_metrics,
    commits_settle_what_acquire_counted
);

fn state_for(servers: &Servers, timeout: Duration) -> AppState {
    state_from_client(
        servers.client(timeout),
        timeout,
        Duration::from_secs(1),
        Some(Secret::new(SECRET)),
    )
}

async fn call(state: &AppState, request: Request<Body>) -> (StatusCode, String) {
    let response = app(state.clone()).oneshot(request).await.unwrap();
    let status = response.status();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8(body.to_vec()).unwrap())
}

fn item(rule: &str, who: &str, limit: Json, cost: u64, want: u64) -> Json {
    json!({"rule": rule, "descriptor": [format!("={who}")], "limit": limit, "cost": cost, "want": want})
}

fn body(items: &[Json]) -> String {
    json!({"domain": "bridge-test", "items": items}).to_string()
}

async fn acquire(state: &AppState, items: &[Json]) -> AcquireResponse {
    let request = Request::post(ACQUIRE_PATH)
        .header(SECRET_HEADER, SECRET)
        .body(Body::from(body(items)))
        .unwrap();
    let (status, text) = call(state, request).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text}: {e}"))
}

/// The Redis state key of one item, as the bridge builds it.
fn key_of(items_json: &str, index: usize) -> String {
    let request = AcquireRequest::parse(items_json.as_bytes()).unwrap();
    let CheckedItem { item, limit } = &request.items[index];
    Invocation::for_limit(
        limit,
        &request.domain,
        &item.rule,
        &item.descriptor,
        0,
        Ask::exact(item.cost).with_want(item.want),
    )
    .keys[0]
        .clone()
}

async fn acquire_health_and_metrics(backend: Backend) {
    let mut servers = Servers::start(backend);
    let state = state_for(&servers, Duration::from_millis(500));
    let (status, text) = call(
        &state,
        Request::get("/healthz").body(Body::empty()).unwrap(),
    )
    .await;
    assert_eq!((status, text.as_str()), (StatusCode::OK, "ok"));

    // A fixed window of 3 per hour: a lease of 2, the last one, then a denial.
    let window = json!({"algorithm": "fixed_window", "limit": 3, "window_us": 3_600_000_000u64});
    let r = acquire(&state, &[item("per-user", "alice", window.clone(), 1, 2)]).await;
    let first = r.items[0];
    assert!(first.allowed);
    assert_eq!((first.granted, first.limit, first.remaining), (2, 3, 1));
    assert_eq!(first.retry_after_ns, None);
    let until_end_ns = (3_600_000_000 - r.now_us % 3_600_000_000) * 1000;
    assert_eq!(first.reset_after_ns, until_end_ns);
    assert_eq!(
        first.lease_ttl_ns,
        Some(until_end_ns),
        "leases end with the window"
    );

    let r = acquire(&state, &[item("per-user", "alice", window.clone(), 1, 5)]).await;
    assert_eq!((r.items[0].granted, r.items[0].remaining), (1, 0));
    let r = acquire(&state, &[item("per-user", "alice", window.clone(), 1, 5)]).await;
    let denied = r.items[0];
    let until_end_ns = (3_600_000_000 - r.now_us % 3_600_000_000) * 1000;
    assert!(!denied.allowed);
    assert_eq!((denied.granted, denied.remaining), (0, 0));
    assert_eq!(denied.retry_after_ns, Some(until_end_ns));
    assert_eq!(denied.lease_ttl_ns, None);

    // GCRA: a lease has no end of its own.
    let gcra = json!({"algorithm": "gcra", "burst": 9, "rate": 10, "period_us": 1_000_000});
    let r = acquire(&state, &[item("per-tenant", "acme", gcra.clone(), 1, 4)]).await;
    assert_eq!((r.items[0].granted, r.items[0].remaining), (4, 6));
    assert_eq!(r.items[0].reset_after_ns, 400_000_000);
    assert_eq!(r.items[0].lease_ttl_ns, None);

    // In order, stopping after the first denial: bob is charged, alice is denied, carol
    // is not even looked at (no key is written for her).
    let items = [
        item("per-user", "bob", window.clone(), 1, 1),
        item("per-user", "alice", window.clone(), 1, 1),
        item("per-user", "carol", window.clone(), 1, 1),
    ];
    let r = acquire(&state, &items).await;
    assert_eq!(r.items.len(), 2, "{r:?}");
    assert!(r.items[0].allowed && !r.items[1].allowed);
    let carol = key_of(&body(&items), 2);
    assert_eq!(servers.redis_cli(&["EXISTS", &carol]), "0");
    let bob = key_of(&body(&items), 0);
    assert!(servers.redis_cli(&["GET", &bob]).starts_with("1 "));

    // The sliding log and the token bucket through HTTP too.
    let log = json!({"algorithm": "sliding_log", "limit": 2, "window_us": 60_000_000});
    let r = acquire(&state, &[item("log", "dave", log.clone(), 1, 5)]).await;
    assert_eq!(
        (r.items[0].granted, r.items[0].lease_ttl_ns),
        (2, Some(60_000_000_000))
    );
    let bucket =
        json!({"algorithm": "token_bucket", "capacity": 5, "refill": 1, "period_us": 1_000_000});
    let r = acquire(&state, &[item("bucket", "erin", bucket, 2, 2)]).await;
    assert_eq!((r.items[0].granted, r.items[0].remaining), (2, 3));

    let (status, metrics) = call(
        &state,
        Request::get("/metrics").body(Body::empty()).unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    for line in [
        r#"weir_bridge_requests_total{code="200"} 8"#,
        r#"weir_bridge_decisions_total{rule="per-user",result="allowed"} 3"#,
        r#"weir_bridge_decisions_total{rule="per-user",result="denied"} 2"#,
        r#"weir_bridge_decisions_total{rule="per-tenant",result="allowed"} 1"#,
        "weir_bridge_items_evaluated_total 8",
        r#"weir_bridge_units_granted_total{rule="bucket"} 2"#,
        r#"weir_bridge_redis_call_duration_seconds_count{algorithm="fixed_window"} 5"#,
    ] {
        assert!(metrics.contains(line), "{line} missing from\n{metrics}");
    }

    // Every node down: health and acquire answer 503 within the timeout.
    servers.kill_all();
    let started = Instant::now();
    let (status, text) = call(
        &state,
        Request::get("/healthz").body(Body::empty()).unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{text}");
    let request = Request::post(ACQUIRE_PATH)
        .header(SECRET_HEADER, SECRET)
        .body(Body::from(body(&[item("per-user", "zed", window, 1, 1)])))
        .unwrap();
    let (status, text) = call(&state, request).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{text}");
    assert!(text.contains("redis unavailable"), "{text}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
}

/// The bridge binary on a free port, with the cluster's nodes as seeds, stopping without
/// a drain delay unless `extra` sets one.
fn spawn_bridge(cluster: &RedisCluster, timeout: &str, extra: &[&str]) -> (Process, u16) {
    let port = weir_e2e::free_port();
    let listen = format!("127.0.0.1:{port}");
    let nodes = cluster.seed_nodes().join(",");
    let mut args = vec!["--listen", &listen, "--redis-timeout", timeout];
    if !extra.contains(&"--drain-delay") {
        args.extend(["--drain-delay", "0s"]);
    }
    args.extend_from_slice(extra);
    let bridge = Process::spawn(
        env!("CARGO_BIN_EXE_weir-bridge"),
        args,
        &[
            ("WEIR_BRIDGE_REDIS_NODES", nodes.as_str()),
            ("WEIR_BRIDGE_SECRET", SECRET),
            ("WEIR_BRIDGE_LOG", "info,redis=warn"),
        ],
    );
    let up = wait_until(Duration::from_secs(20), Duration::from_millis(50), || {
        weir_e2e::get(port, "/healthz", &[]).is_ok_and(|r| r.status == 200)
    });
    assert!(up, "the bridge did not become healthy:\n{}", bridge.log());
    (bridge, port)
}

/// Waits for the bridge to exit (at most 10 s) and checks it exited cleanly.
fn exits_cleanly(bridge: &mut Process) {
    let status = bridge
        .child()
        .wait_exit(Duration::from_secs(10))
        .expect("the bridge exits");
    assert!(status.success(), "{status:?}\n{}", bridge.log());
}

fn post(items: &[Json]) -> weir_e2e::Request {
    weir_e2e::Request::post(ACQUIRE_PATH, body(items)).header(SECRET_HEADER, SECRET)
}

/// One request as the load threads saw it.
#[derive(Debug, Clone, Copy)]
struct Seen {
    sent: Instant,
    latency: Duration,
    status: u16,
    granted: u64,
}

fn metric(port: u16, line_prefix: &str) -> f64 {
    let text = weir_e2e::get(port, "/metrics", &[]).unwrap().text();
    text.lines()
        .find_map(|l| l.strip_prefix(line_prefix)?.trim().parse().ok())
        .unwrap_or(0.0)
}

#[test]
fn failover_under_load_fails_fast_recovers_and_never_over_admits() {
    let mut cluster = RedisCluster::start(3, 1);
    let (mut bridge, port) = spawn_bridge(&cluster, "100ms", &[]);

    // A bucket of 200_000 tokens whose first refill is 100 s away: over this test the
    // limit is exactly the capacity.
    const CAPACITY: u64 = 200_000;
    let bucket = json!({"algorithm": "token_bucket", "capacity": CAPACITY, "refill": 1, "period_us": 100_000_000u64});
    let hot = item("failover", "hot", bucket.clone(), 1, 1);
    let hot_key = key_of(&body(std::slice::from_ref(&hot)), 0);
    let slot = key_slot(hot_key.as_bytes());
    let master = cluster.master_of_slot(slot).unwrap();
    // A key on another master: it keeps being served while the hot one fails over.
    let cold = (0..)
        .map(|i| item("failover", &format!("cold-{i}"), bucket.clone(), 1, 1))
        .find(|it| {
            let key = key_of(&body(std::slice::from_ref(it)), 0);
            cluster.master_of_slot(key_slot(key.as_bytes())).as_deref() != Some(master.as_str())
        })
        .unwrap();

    let r = weir_e2e::send(port, post(std::slice::from_ref(&hot))).unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    // The replica must be streaming before the master dies (see the helper).
    common::wait_until_replica_acks(&master);
    let fallbacks_before = metric(
        port,
        r#"weir_bridge_script_fallbacks_total{algorithm="token_bucket"}"#,
    );
    assert!(
        fallbacks_before >= 1.0,
        "the first call loaded the script with EVAL"
    );

    let stop = AtomicBool::new(false);
    let seen: Mutex<Vec<(bool, Seen)>> = Mutex::new(Vec::new());
    let (killed_at, promoted_at, new_master) = std::thread::scope(|s| {
        for t in 0..5 {
            let (stop, seen) = (&stop, &seen);
            let (hot, cold) = (&hot, &cold);
            s.spawn(move || {
                let is_hot = t != 0;
                let it = if is_hot { hot } else { cold };
                let mut client: Option<weir_e2e::Client> = None;
                let mut local = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let sent = Instant::now();
                    let c = match client.as_mut() {
                        Some(c) => c,
                        None => client.insert(weir_e2e::Client::connect(port).unwrap()),
                    };
                    let r = c.request(post(std::slice::from_ref(it)));
                    let latency = sent.elapsed();
                    let (status, granted) = match r {
                        Ok(r) => {
                            let granted = if r.status == 200 {
                                let reply: AcquireResponse =
                                    serde_json::from_slice(&r.body).unwrap();
                                reply.items[0].granted
                            } else {
                                0
                            };
                            (r.status, granted)
                        }
                        Err(e) => panic!("the bridge did not answer: {e}"),
                    };
                    local.push((
                        is_hot,
                        Seen {
                            sent,
                            latency,
                            status,
                            granted,
                        },
                    ));
                }
                seen.lock().unwrap().extend(local);
            });
        }
        std::thread::sleep(Duration::from_millis(500));
        let killed_at = Instant::now();
        cluster.kill_node(&master);
        let new_master = cluster.wait_for_failover(slot, Duration::from_secs(30));
        let promoted_at = Instant::now();
        // Keep the load on until the bridge has been serving the new master for a while.
        std::thread::sleep(Duration::from_millis(1500));
        stop.store(true, Ordering::Relaxed);
        (killed_at, promoted_at, new_master)
    });
    assert_ne!(new_master, master);

    let seen = seen.into_inner().unwrap();
    let hot: Vec<Seen> = seen.iter().filter(|(h, _)| *h).map(|(_, s)| *s).collect();
    let cold: Vec<Seen> = seen.iter().filter(|(h, _)| !*h).map(|(_, s)| *s).collect();
    let statuses = |v: &[Seen]| {
        let mut m = std::collections::BTreeMap::new();
        for s in v {
            *m.entry(s.status).or_insert(0) += 1;
        }
        m
    };
    eprintln!(
        "hot: {:?}, cold: {:?}; promoted {:?} after the kill",
        statuses(&hot),
        statuses(&cold),
        promoted_at - killed_at
    );
    // Only answers and fast failures: no 500, no hang.
    for s in &seen {
        assert!(matches!(s.1.status, 200 | 503), "{s:?}");
    }
    let slowest = seen.iter().map(|s| s.1.latency).max().unwrap();
    eprintln!("slowest answer {slowest:?}");
    assert!(
        slowest < Duration::from_millis(1000),
        "a request took {slowest:?}"
    );
    let failed: Vec<&Seen> = hot.iter().filter(|s| s.status == 503).collect();
    assert!(!failed.is_empty(), "the failover was visible");
    let recovered = hot
        .iter()
        .filter(|s| s.status == 200 && s.sent > killed_at)
        .filter(|s| s.sent > failed.iter().map(|f| f.sent).max().unwrap())
        .map(|s| s.sent)
        .min()
        .expect("requests succeed again after the promotion");
    eprintln!(
        "recovered {:?} after the kill, {:?} after the promotion was visible",
        recovered - killed_at,
        recovered.saturating_duration_since(promoted_at)
    );
    assert!(
        cold.iter()
            .any(|s| s.status == 200 && s.sent > killed_at && s.sent < promoted_at),
        "the other masters kept serving during the failover"
    );

    // The promoted replica had no script: NOSCRIPT, then EVAL, and it ran.
    let fallbacks_after = metric(
        port,
        r#"weir_bridge_script_fallbacks_total{algorithm="token_bucket"}"#,
    );
    assert!(
        fallbacks_after > fallbacks_before,
        "{fallbacks_before} → {fallbacks_after}"
    );

    // Drain what is left in one lease: whatever the clients were granted plus the rest
    // can never exceed the capacity (a lost write on the dead master would show here).
    let granted_during: u64 = hot.iter().map(|s| s.granted).sum::<u64>() + 1;
    let drain = item("failover", "hot", bucket, 1, 1_000_000);
    let r = weir_e2e::send(port, post(&[drain])).unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let reply: AcquireResponse = serde_json::from_slice(&r.body).unwrap();
    let rest = reply.items[0].granted;
    eprintln!("granted during the test {granted_during}, left {rest}, capacity {CAPACITY}");
    assert!(
        granted_during + rest <= CAPACITY,
        "over-admission: {granted_during} + {rest} > {CAPACITY}"
    );
    bridge.kill();
}

#[test]
fn sigterm_finishes_in_flight_requests_then_exits() {
    let cluster = RedisCluster::start(3, 1);
    let (mut bridge, port) = spawn_bridge(&cluster, "5s", &[]);
    let window = json!({"algorithm": "fixed_window", "limit": 10, "window_us": 3_600_000_000u64});
    let it = item("shutdown", "slow", window, 1, 1);
    let key = key_of(&body(std::slice::from_ref(&it)), 0);
    let master = cluster.master_of_slot(key_slot(key.as_bytes())).unwrap();
    let master_port: u16 = master.rsplit(':').next().unwrap().parse().unwrap();

    let result = std::thread::scope(|s| {
        // Hold the key's master for 800 ms: CLIENT PAUSE WRITE blocks EVALSHA (it may
        // write) while the cluster bus keeps running, so no failover starts.
        let paused = redis_cli_at(master_port, ["CLIENT", "PAUSE", "800", "WRITE"]);
        assert_eq!(paused.as_deref(), Ok("OK"));
        let in_flight = s.spawn(|| {
            let started = Instant::now();
            let r = weir_e2e::send(port, post(std::slice::from_ref(&it)));
            (r, started.elapsed())
        });
        std::thread::sleep(Duration::from_millis(200));
        bridge.child().signal(libc::SIGTERM);
        std::thread::sleep(Duration::from_millis(100));
        // No new connections once shutting down.
        let refused = weir_e2e::get(port, "/healthz", &[]);
        assert!(refused.is_err(), "a new request was accepted: {refused:?}");
        in_flight.join().unwrap()
    });
    let (response, took) = result;
    let response = response.expect("the in-flight request got its answer");
    assert_eq!(response.status, 200, "{}", response.text());
    eprintln!("in-flight request answered after {took:?}");
    assert!(
        took > Duration::from_millis(300),
        "it was still in flight at SIGTERM"
    );
    exits_cleanly(&mut bridge);
    assert!(bridge.log().contains("SIGTERM"), "{}", bridge.log());
}

/// SIGTERM with a drain delay: at once `/healthz` answers 503 `draining`, while
/// `/v2/acquire` and `/v3/commit` are still answered, on new connections too; once the
/// delay is over the listener closes and the process exits cleanly.
#[test]
fn sigterm_fails_readiness_for_the_drain_delay_then_stops() {
    let cluster = RedisCluster::start(3, 1);
    let (mut bridge, port) = spawn_bridge(&cluster, "1s", &["--drain-delay", "2s"]);
    let limit = json!({"algorithm": "token_bucket", "capacity": 100, "refill": 100, "period_us": 3_600_000_000u64});
    let acquire = || {
        let body = json!({"domain": "bridge-test", "items": [{"id": 0, "rule": "drain",
            "descriptor": ["=acme"], "limit": limit, "cost": 10, "want": 10}]});
        weir_e2e::send(
            port,
            weir_e2e::Request::post(v2::ACQUIRE_PATH, body.to_string())
                .header(SECRET_HEADER, SECRET),
        )
    };
    let commit = |counted_at: u64| {
        let body = json!({"domain": "bridge-test", "items": [{"id": 3, "rule": "drain",
            "descriptor": ["=acme"], "limit": limit, "counted_at_us": counted_at,
            "reserved": 10, "actual": 1}]});
        weir_e2e::send(
            port,
            weir_e2e::Request::post(v3::COMMIT_PATH, body.to_string())
                .header(SECRET_HEADER, SECRET),
        )
    };
    let health = || weir_e2e::get(port, "/healthz", &[]);
    assert_eq!(health().unwrap().status, 200);

    let signalled = Instant::now();
    bridge.child().signal(libc::SIGTERM);
    let draining = wait_until(Duration::from_secs(1), Duration::from_millis(10), || {
        health().is_ok_and(|r| r.status == 503 && r.text() == "draining")
    });
    assert!(draining, "readiness did not fail:\n{}", bridge.log());
    let acquired = acquire().expect("acquire is served while draining");
    assert_eq!(acquired.status, 200, "{}", acquired.text());
    let granted: Json = serde_json::from_str(&acquired.text()).unwrap();
    assert_eq!(granted["items"][0]["allowed"], true, "{granted}");
    let counted_at = granted["items"][0]["now_us"].as_u64().unwrap();
    let committed = commit(counted_at).expect("commit is served while draining");
    assert_eq!(committed.status, 200, "{}", committed.text());
    assert_eq!(
        serde_json::from_str::<Json>(&committed.text()).unwrap(),
        json!({"items": [{"id": 3, "settled": true}]})
    );
    assert!(
        signalled.elapsed() < Duration::from_millis(1500),
        "the checks above took too long to prove anything: {:?}",
        signalled.elapsed()
    );
    // Still draining: new connections are served to the end of the delay.
    assert_eq!(health().unwrap().status, 503);

    exits_cleanly(&mut bridge);
    let stopped = signalled.elapsed();
    assert!(
        stopped >= Duration::from_secs(2),
        "it exited {stopped:?} after SIGTERM, before the drain delay ended"
    );
    assert!(health().is_err(), "the listener is closed");
    let log = bridge.log();
    assert!(log.contains("draining"), "{log}");
    eprintln!("exited {stopped:?} after SIGTERM");
}

/// A second signal during the drain ends it at once.
#[test]
fn a_second_signal_ends_the_drain_early() {
    let cluster = RedisCluster::start(3, 1);
    let (mut bridge, port) = spawn_bridge(&cluster, "100ms", &["--drain-delay", "30s"]);
    let signalled = Instant::now();
    bridge.child().signal(libc::SIGTERM);
    let draining = wait_until(Duration::from_secs(1), Duration::from_millis(10), || {
        weir_e2e::get(port, "/healthz", &[]).is_ok_and(|r| r.status == 503)
    });
    assert!(draining, "{}", bridge.log());
    bridge.child().signal(libc::SIGINT);
    exits_cleanly(&mut bridge);
    assert!(
        signalled.elapsed() < Duration::from_secs(10),
        "{:?}",
        signalled.elapsed()
    );
    assert!(bridge.log().contains("second signal"), "{}", bridge.log());
}

#[test]
fn sigint_stops_too() {
    let cluster = RedisCluster::start(3, 1);
    let (mut bridge, _port) = spawn_bridge(&cluster, "100ms", &[]);
    bridge.child().signal(libc::SIGINT);
    exits_cleanly(&mut bridge);
}

/// `/v3/commit` beside `/v2/acquire`: a reservation settled with a smaller actual cost
/// gives its units back to the next acquire; every result echoes its item's id; an item
/// without an id, or an algorithm that cannot settle, is a 400 naming the field; the
/// secret is required; the metrics count the commits.
async fn commits_settle_what_acquire_counted(backend: Backend) {
    let servers = Servers::start(backend);
    let state = state_for(&servers, Duration::from_secs(2));
    let limit = json!({"algorithm": "token_bucket", "capacity": 100, "refill": 100, "period_us": 3_600_000_000u64});
    let post = |path: &'static str, body: String, secret: bool| {
        let mut r = Request::post(path);
        if secret {
            r = r.header(SECRET_HEADER, SECRET);
        }
        r.body(Body::from(body)).unwrap()
    };
    let acquire_v2 = |cost: u64| {
        json!({"domain": "bridge-test", "items": [{"id": 0, "rule": "tokens",
            "descriptor": ["=acme"], "limit": limit, "cost": cost, "want": cost}]})
        .to_string()
    };
    let item = |id: u16, counted_at: u64, reserved: u64, actual: u64, limit: &Json| {
        json!({"id": id, "rule": "tokens", "descriptor": ["=acme"], "limit": limit,
            "counted_at_us": counted_at, "reserved": reserved, "actual": actual})
    };
    let commit = |counted_at: u64, reserved: u64, actual: u64, limit: &Json| {
        json!({"domain": "bridge-test", "items": [item(9, counted_at, reserved, actual, limit)]})
            .to_string()
    };
    let reply = |text: &str| -> Json { serde_json::from_str(text).unwrap() };

    let (status, text) = call(&state, post(v2::ACQUIRE_PATH, acquire_v2(80), true)).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let first = reply(&text)["items"][0].clone();
    assert_eq!(first["allowed"], true);
    let counted_at = first["now_us"].as_u64().unwrap();
    let (_, text) = call(&state, post(v2::ACQUIRE_PATH, acquire_v2(30), true)).await;
    assert_eq!(reply(&text)["items"][0]["allowed"], false, "20 left");

    let (status, _) = call(
        &state,
        post(v3::COMMIT_PATH, commit(counted_at, 80, 10, &limit), false),
    )
    .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, text) = call(
        &state,
        post(v3::COMMIT_PATH, commit(counted_at, 80, 10, &limit), true),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{text}");
    assert_eq!(reply(&text), json!({"items": [{"id": 9, "settled": true}]}));
    let (_, text) = call(&state, post(v2::ACQUIRE_PATH, acquire_v2(30), true)).await;
    let after = reply(&text)["items"][0].clone();
    assert_eq!(
        (after["allowed"].clone(), after["remaining"].clone()),
        (json!(true), json!(60)),
        "70 came back: 90 − 30"
    );

    // Each result carries its item's id: an exact estimate (nothing to change) and an
    // excess (charged now).
    let counted_at = after["now_us"].as_u64().unwrap();
    let two = json!({"domain": "bridge-test", "items": [item(5, counted_at, 30, 30, &limit),
        item(2, counted_at, 1, 2, &limit)]});
    let (status, text) = call(&state, post(v3::COMMIT_PATH, two.to_string(), true)).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    assert_eq!(
        reply(&text),
        json!({"items": [{"id": 5, "settled": false}, {"id": 2, "settled": true}]})
    );
    // A commit without ids (the v3 before them, never released) is refused.
    let mut without_id = two.clone();
    without_id["items"][0].as_object_mut().unwrap().remove("id");
    let (status, text) = call(&state, post(v3::COMMIT_PATH, without_id.to_string(), true)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(text.contains("items[0]: missing field `id`"), "{text}");

    let gcra = json!({"algorithm": "gcra", "rate": 10, "period_us": 1_000_000, "burst": 9});
    let (status, text) = call(
        &state,
        post(v3::COMMIT_PATH, commit(counted_at, 1, 0, &gcra), true),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(
        text.contains("items[0].limit.algorithm: gcra cannot settle"),
        "{text}"
    );

    let (_, metrics) = call(
        &state,
        Request::get("/metrics").body(Body::empty()).unwrap(),
    )
    .await;
    assert!(
        metrics.contains(r#"weir_bridge_commits_total{rule="tokens",result="settled"} 2"#),
        "{metrics}"
    );
    assert!(
        metrics.contains(r#"weir_bridge_commits_total{rule="tokens",result="unchanged"} 1"#),
        "{metrics}"
    );
}
