//! One shard down for good (its master killed, its replica told not to fail over): the
//! bridge stays ready, decides the keys of the other shards, and answers 503 for the
//! keys of the dead one. Readiness is shared by every bridge replica, so failing it for
//! one shard would fail every key.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::{json, Value as Json};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use tower::ServiceExt;
use weir_bridge::scripts::Invocation;
use weir_bridge::{app, state_from_client, AppState};
use weir_e2e::{key_slot, redis_cli_at, wait_until, RedisCluster};
use weir_protocol::algorithms::Ask;
use weir_protocol::wire::v1::{AcquireRequest, ACQUIRE_PATH};
use weir_protocol::wire::CheckedItem;

async fn call(state: &AppState, request: Request<Body>) -> (StatusCode, String) {
    let response = app(state.clone()).oneshot(request).await.unwrap();
    let status = response.status();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8(body.to_vec()).unwrap())
}

fn body(who: &str) -> String {
    let window = json!({"algorithm": "fixed_window", "limit": 1000, "window_us": 3_600_000_000u64});
    json!({"domain": "shard-test", "items": [
        {"rule": "per-user", "descriptor": [format!("={who}")], "limit": window, "cost": 1, "want": 1}
    ]})
    .to_string()
}

/// The hash slot of the Redis key the bridge writes for `who`.
fn slot_of(who: &str) -> u16 {
    let request = AcquireRequest::parse(body(who).as_bytes()).unwrap();
    let CheckedItem { item, limit } = &request.items[0];
    let inv = Invocation::for_limit(
        limit,
        &request.domain,
        &item.rule,
        &item.descriptor,
        0,
        Ask::exact(1),
    );
    key_slot(inv.keys[0].as_bytes())
}

async fn acquire(state: &AppState, who: &str) -> (StatusCode, String) {
    let request = Request::post(ACQUIRE_PATH)
        .body(Body::from(body(who)))
        .unwrap();
    call(state, request).await
}

async fn healthz(state: &AppState) -> (StatusCode, String) {
    call(state, Request::get("/healthz").body(Body::empty()).unwrap()).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_shard_down_fails_its_keys_only_and_readiness_stays_up() {
    let mut cluster = RedisCluster::start(3, 1);
    let client = redis::cluster::ClusterClient::builder(cluster.seed_urls())
        .build()
        .unwrap();
    let state = state_from_client(
        &client,
        Duration::from_millis(200),
        Duration::from_millis(200),
        None,
    );

    // A user whose key lives on each master.
    let mut user_of: BTreeMap<String, String> = BTreeMap::new();
    for i in 0.. {
        let who = format!("user-{i}");
        let master = cluster.master_of_slot(slot_of(&who)).unwrap();
        user_of.entry(master).or_insert(who);
        if user_of.len() == 3 {
            break;
        }
    }
    for who in user_of.values() {
        let (status, text) = acquire(&state, who).await;
        assert_eq!(status, StatusCode::OK, "{who}: {text}");
    }

    // The shard of the first user dies for good: its replica may not take over.
    let (dead, dead_user) = user_of.pop_first().unwrap();
    let nodes = cluster.cluster_nodes();
    let dead_id = &nodes.iter().find(|n| n.addr == dead).unwrap().id;
    let replica = nodes.iter().find(|n| n.master_id == *dead_id).unwrap();
    let replica_port: u16 = replica.addr.rsplit(':').next().unwrap().parse().unwrap();
    let set = redis_cli_at(
        replica_port,
        ["CONFIG", "SET", "cluster-replica-no-failover", "yes"],
    );
    assert_eq!(set.as_deref(), Ok("OK"));
    cluster.kill_node(&dead);
    // The other nodes mark it failed after the node timeout (1 s).
    let marked = wait_until(Duration::from_secs(10), Duration::from_millis(100), || {
        cluster
            .cluster_nodes()
            .iter()
            .any(|n| n.addr == dead && n.flags.iter().any(|f| f == "fail"))
    });
    assert!(
        marked,
        "{dead} was not marked failed:\n{}",
        cluster.describe()
    );

    // Longer than a failover takes here (2-3 s): the shard stays down throughout.
    let until = Instant::now() + Duration::from_secs(4);
    let mut rounds = 0;
    while Instant::now() < until {
        let (status, text) = healthz(&state).await;
        assert_eq!(
            (status, text.as_str()),
            (StatusCode::OK, "ok"),
            "readiness with one shard down"
        );
        // The dead shard's call at the same time as the others: they do not wait on it.
        let live: Vec<&String> = user_of.values().collect();
        let (dead_reply, first, second) = tokio::join!(
            acquire(&state, &dead_user),
            acquire(&state, live[0]),
            acquire(&state, live[1]),
        );
        for (who, (status, text)) in live.iter().zip([first, second]) {
            assert_eq!(status, StatusCode::OK, "{who}, on a live shard: {text}");
            let reply: Json = serde_json::from_str(&text).unwrap();
            assert_eq!(reply["items"][0]["allowed"], true, "{text}");
        }
        let (status, text) = dead_reply;
        assert_eq!(
            status,
            StatusCode::SERVICE_UNAVAILABLE,
            "{dead_user}, on the dead shard: {text}"
        );
        let reply: Json = serde_json::from_str(&text).unwrap();
        let error = reply["error"].as_str().unwrap();
        assert!(error.starts_with("redis unavailable ("), "{text}");
        rounds += 1;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(rounds >= 5, "{rounds} rounds");
    assert_eq!(
        cluster.master_of_slot(slot_of(&dead_user)).as_deref(),
        Some(dead.as_str()),
        "the replica was not promoted"
    );

    // Redis as a whole unreachable: not ready.
    for addr in cluster.addrs() {
        cluster.kill_node(&addr);
    }
    let (status, text) = healthz(&state).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{text}");
    assert!(text.starts_with("redis unavailable ("), "{text}");
}
