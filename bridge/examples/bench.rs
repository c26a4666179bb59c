//! Loopback numbers for the bridge: script latency per algorithm (sequential calls
//! through the cluster client) and `POST /v1/acquire` end to end through the bridge
//! binary, one item, N keep-alive clients.
//!
//! `cargo run --release -p weir-bridge --example bench` (starts its own 6-node cluster and
//! bridge; prints numbers, and asserts no timing: only that every script call is allowed).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::sync::Arc;
use std::time::{Duration, Instant};
use weir_bridge::scripts::Invocation;
use weir_bridge::{Metrics, RedisStore};
use weir_e2e::{wait_until, Process, RedisCluster};
use weir_protocol::algorithms::{AlgorithmKind, Ask, GlobalLimit, Unit};

const CALLS: usize = 20_000;
/// The keys the script calls are spread over, in turn.
const KEYS: usize = 100;

/// A limit of `kind` under which every call of the run is allowed, so that each script
/// is timed on the same path (an admission written back): each count the largest of
/// 10^9, 10^6 and 10^5 its algorithm accepts (the sliding log keeps one entry per unit
/// and caps its limit), each duration an hour, longer than the run.
fn roomy_limit(kind: AlgorithmKind) -> GlobalLimit {
    const HOUR_US: u64 = 3_600_000_000;
    let limit = [1_000_000_000, 1_000_000, 100_000]
        .into_iter()
        .find_map(|count| {
            let values: Vec<u64> = kind
                .spec()
                .parameters
                .iter()
                .map(|parameter| match parameter.unit {
                    Unit::Count => count,
                    Unit::Duration => HOUR_US,
                })
                .collect();
            let limit = GlobalLimit::build(kind, &values).ok()?;
            limit
                .algorithm()
                .check_script_exact()
                .is_ok()
                .then_some(limit)
        })
        .unwrap_or_else(|| panic!("{kind}: no roomy limit among the counts tried"));
    assert!(
        limit.max_cost() >= (CALLS / KEYS) as u64,
        "{kind}: {limit:?} would deny some of the {} calls per key",
        CALLS / KEYS
    );
    limit
}

fn percentiles(mut v: Vec<Duration>) -> String {
    v.sort();
    let at = |p: f64| v[((v.len() as f64 - 1.0) * p) as usize];
    format!(
        "p50 {:>6.1} µs  p99 {:>6.1} µs  max {:>7.1} µs",
        at(0.5).as_secs_f64() * 1e6,
        at(0.99).as_secs_f64() * 1e6,
        at(1.0).as_secs_f64() * 1e6
    )
}

fn main() {
    let cluster = RedisCluster::start(3, 1);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(scripts(&cluster));
    http(&cluster);
}

async fn scripts(cluster: &RedisCluster) {
    let client = redis::cluster::ClusterClient::new(cluster.seed_urls()).unwrap();
    let conn = client.get_async_connection().await.unwrap();
    let store = RedisStore::new(conn, Duration::from_secs(1), Arc::new(Metrics::default()));
    println!("script calls, sequential, {CALLS} per algorithm, {KEYS} keys:");
    for kind in AlgorithmKind::ALL {
        let limit = roomy_limit(kind);
        let mut times = Vec::with_capacity(CALLS);
        let started = Instant::now();
        for i in 0..CALLS {
            let key = format!("=bench-{}", i % KEYS);
            let inv = Invocation::for_limit(&limit, "bench", "r", &[key], 0, Ask::exact(1));
            let t = Instant::now();
            let reply = store.run(&inv).await.unwrap();
            times.push(t.elapsed());
            assert!(reply.grant.decision.allowed, "{kind}: call {i} denied");
        }
        let rate = CALLS as f64 / started.elapsed().as_secs_f64();
        println!(
            "  {:<15} {}  ({rate:.0} calls/s)",
            kind.name(),
            percentiles(times)
        );
    }
}

fn http(cluster: &RedisCluster) {
    let port = weir_e2e::free_port();
    let bin = std::env::current_exe()
        .unwrap()
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .join("weir-bridge");
    let nodes = cluster.seed_nodes().join(",");
    let _bridge = Process::spawn(
        &bin,
        ["--listen", &format!("127.0.0.1:{port}")],
        &[
            ("WEIR_BRIDGE_REDIS_NODES", nodes.as_str()),
            ("WEIR_BRIDGE_LOG", "warn"),
        ],
    );
    assert!(wait_until(
        Duration::from_secs(20),
        Duration::from_millis(50),
        || { weir_e2e::get(port, "/healthz", &[]).is_ok_and(|r| r.status == 200) }
    ));
    let body = r#"{"domain":"bench","items":[{"rule":"r","descriptor":["=k"],"limit":{"algorithm":"gcra","burst":1000000,"rate":1000000,"period_us":1000000},"cost":1,"want":1}]}"#;
    for clients in [1, 8] {
        let total = 20_000;
        let report = weir_e2e::run_clients(clients, total, port, |_, _| {
            weir_e2e::Request::post("/v1/acquire", body)
        });
        report.assert_no_errors();
        println!(
            "POST /v1/acquire, {clients} clients: {:.0} requests/s ({:?})",
            total as f64 / report.elapsed.as_secs_f64(),
            report.status_counts()
        );
    }
}
