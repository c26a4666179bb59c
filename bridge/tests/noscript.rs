//! NOSCRIPT on a real cluster: a node without the script costs one `EVAL` to the key's
//! own slot, whatever the rest of the cluster is doing (here: a shard lost for good).
//! The failover test (`bridge.rs`) covers the other way a node lacks the script: a
//! promoted replica (`SCRIPT LOAD` and `EVAL` are not replicated).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod common;

use common::{future_base, invocation, Backend, Redis};
use weir_e2e::{key_slot, redis_cli_at};
use weir_protocol::algorithms::fixed_window::FixedWindow;
use weir_protocol::algorithms::GlobalLimit;
use weir_protocol::algorithms::Limit;

fn port_of(addr: &str) -> u16 {
    addr.rsplit(':').next().unwrap().parse().unwrap()
}

fn fallbacks(redis: &Redis) -> String {
    redis
        .metrics
        .render()
        .lines()
        .find(|l| l.starts_with("weir_bridge_script_fallbacks_total{algorithm=\"fixed_window\"}"))
        .unwrap_or("none")
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flushed_script_cache_costs_one_eval_even_with_a_shard_down() {
    let mut redis = Redis::start(Backend::Cluster).await;
    let limit = GlobalLimit::Slot(Limit::FixedWindow(
        FixedWindow::new(100, 60_000_000).unwrap(),
    ));
    let now = future_base(1_700_000_000_000_000);
    let inv = invocation(&limit, "noscript", now, 1, 1);
    let key = inv.keys[0].clone();
    let master = redis
        .servers
        .cluster()
        .master_of_slot(key_slot(key.as_bytes()))
        .unwrap();

    // First call: NOSCRIPT, then EVAL (which caches the script on that master).
    assert!(redis.run(&inv).await.grant.decision.allowed);
    assert!(fallbacks(&redis).ends_with(" 1"), "{}", fallbacks(&redis));
    assert!(redis.run(&inv).await.grant.decision.allowed);
    assert!(fallbacks(&redis).ends_with(" 1"), "EVALSHA hits now");

    // Lose another shard for good (its replica, then its master): with
    // cluster-require-full-coverage no, the other shards keep serving.
    let nodes = redis.servers.cluster().cluster_nodes();
    let other_master = nodes
        .iter()
        .find(|n| n.is_master() && n.addr != master)
        .unwrap()
        .clone();
    let its_replica = nodes
        .iter()
        .find(|n| n.master_id == other_master.id)
        .unwrap()
        .addr
        .clone();
    redis.servers.cluster().kill_node(&its_replica);
    redis.servers.cluster().kill_node(&other_master.addr);
    // Then flush the scripts of the key's master, as a restart or a promoted replica
    // would have it.
    assert_eq!(
        redis_cli_at(port_of(&master), ["SCRIPT", "FLUSH"]).unwrap(),
        "OK"
    );

    // EVALSHA → NOSCRIPT → EVAL, to the key's slot only.
    let reply = redis.store.run(&inv).await.unwrap();
    assert!(reply.grant.decision.allowed);
    assert!(fallbacks(&redis).ends_with(" 2"), "{}", fallbacks(&redis));
    // EVAL cached the script on that node: EVALSHA hits again.
    assert!(redis.run(&inv).await.grant.decision.allowed);
    assert!(fallbacks(&redis).ends_with(" 2"), "{}", fallbacks(&redis));
}
