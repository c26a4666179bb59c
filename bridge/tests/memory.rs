//! Redis memory per key, as the bridge's scripts leave it: `MEMORY USAGE` of each key of
//! each algorithm, plus its share of the indexes `MEMORY USAGE` leaves out (the expiry
//! times, the slot-to-key index, the hash tables' buckets), read from the growth of
//! `MEMORY STATS` over many keys. The figures are printed for docs/capacity.md and
//! checked against the bounds that page gives.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod common;

use redis::Value;
use serde_json::json;
use weir_protocol::algorithms::GlobalLimit;
use weir_protocol::wire::v1::AcquireRequest;

/// Keys written per algorithm for the `used_memory` growth.
const KEYS: u64 = 3_000;

/// A limit from its wire form.
fn limit(wire: serde_json::Value) -> GlobalLimit {
    let body = json!({"domain": "weir", "items": [{"rule": "m", "descriptor": [], "limit": wire,
        "cost": 1, "want": 1}]});
    let request = AcquireRequest::parse(body.to_string().as_bytes()).unwrap();
    request.items[0].limit.clone()
}

/// What indexes keys on the masters, summed (`MEMORY STATS`): the keyspace's hash table
/// (its buckets and one 24-byte entry per key), the expiry times' and the slot-to-key
/// index. `MEMORY USAGE` counts the keyspace entry but none of the rest; the dataset's
/// total is too noisy to read a key's share from (Lua's and the clients' allocations
/// come and go with the calls).
fn index_memory(redis: &common::Redis) -> i64 {
    redis
        .servers
        .masters()
        .iter()
        .map(|addr| {
            let port: u16 = addr.rsplit(':').next().unwrap().parse().unwrap();
            let stats = weir_e2e::redis_cli_at(port, ["MEMORY", "STATS"]).unwrap();
            let lines: Vec<&str> = stats.lines().map(str::trim).collect();
            // A master without keys has no `db.0` section.
            let field = |name: &str| -> i64 {
                lines
                    .iter()
                    .position(|l| *l == name)
                    .map_or(0, |at| lines[at + 1].parse().unwrap())
            };
            field("overhead.hashtable.main")
                + field("overhead.hashtable.expires")
                + field("overhead.hashtable.slot-to-keys")
        })
        .sum()
}

/// `MEMORY USAGE` of a key: its name, its value and its keyspace entry.
async fn memory_usage(redis: &common::Redis, key: &str) -> i64 {
    match redis.cmd(&["MEMORY", "USAGE", key, "SAMPLES", "0"]).await {
        Value::Int(n) => n,
        other => panic!("MEMORY USAGE {key}: {other:?}"),
    }
}

/// The keyspace entry `MEMORY USAGE` includes (a `dictEntry`: key, value, next).
const ENTRY_BYTES: i64 = 24;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_memory_per_key_of_each_algorithm() {
    let redis = common::Redis::start(common::Backend::Cluster).await;
    // Hour-long periods: no key expires while it is measured. Each key is granted 2
    // units (a sliding log holds one entry per unit).
    let hour = 3_600_000_000u64;
    // (algorithm, limit, bound on MEMORY USAGE of all its keys, bound on used_memory
    // growth per key: docs/capacity.md)
    let cases = [
        (
            "token_bucket",
            json!({"algorithm": "token_bucket", "capacity": 100, "refill": 1, "period_us": hour}),
            160,
            320,
        ),
        (
            "gcra",
            json!({"algorithm": "gcra", "burst": 99, "rate": 100, "period_us": hour}),
            160,
            320,
        ),
        (
            "fixed_window",
            json!({"algorithm": "fixed_window", "limit": 100, "window_us": hour}),
            160,
            320,
        ),
        (
            "sliding_window",
            json!({"algorithm": "sliding_window", "limit": 100, "window_us": hour}),
            160,
            320,
        ),
        (
            "sliding_log",
            json!({"algorithm": "sliding_log", "limit": 100, "window_us": hour}),
            300,
            520,
        ),
    ];
    for (name, wire, usage_bound, growth_bound) in cases {
        let limit = limit(wire);
        let first = common::invocation(&limit, &format!("{name}-probe"), 0, 2, 2);
        assert_eq!(redis.run(&first).await.grant.granted, 2, "{name}");
        let mut usage = 0;
        let mut parts = Vec::new();
        for key in &first.keys {
            let bytes = memory_usage(&redis, key).await;
            parts.push(format!("{key} {bytes} B"));
            usage += bytes;
        }

        let before = index_memory(&redis);
        for i in 0..KEYS {
            let inv = common::invocation(&limit, &format!("{name}-{i}"), 0, 2, 2);
            assert_eq!(redis.run(&inv).await.grant.granted, 2, "{name} {i}");
        }
        let index = (index_memory(&redis) - before) / KEYS as i64;
        let entries = ENTRY_BYTES * first.keys.len() as i64;
        let growth = usage - entries + index;
        eprintln!(
            "{name}: MEMORY USAGE {usage} B ({}); indexes {index} B per key over {KEYS} keys \
             (the keyspace entries included); in all {growth} B per key",
            parts.join(", ")
        );
        assert!(usage <= usage_bound, "{name}: {usage} B > {usage_bound} B");
        assert!(
            growth <= growth_bound,
            "{name}: {growth} B per key > {growth_bound} B"
        );
        assert!(index > 0, "{name}: the keys were written");
    }

    // A sliding log holds one entry per unit in its window: small logs are a compact
    // list, logs of more than 128 entries a skip list.
    let log = limit(json!({"algorithm": "sliding_log", "limit": 100_000, "window_us": hour}));
    let mut previous = 0;
    for (entries, bound) in [(2, 200), (128, 2_000), (129, 16_000), (1_000, 100_000)] {
        let inv = common::invocation(&log, &format!("log-{entries}"), 0, entries, entries);
        assert_eq!(redis.run(&inv).await.grant.granted, entries);
        let usage = match redis
            .cmd(&["MEMORY", "USAGE", &inv.keys[0], "SAMPLES", "0"])
            .await
        {
            Value::Int(n) => n,
            other => panic!("MEMORY USAGE: {other:?}"),
        };
        eprintln!("sliding_log with {entries} entries: MEMORY USAGE {usage} B (the log key)");
        assert!(usage <= bound, "{entries} entries: {usage} B > {bound} B");
        assert!(usage > previous, "{entries} entries: {usage} B");
        previous = usage;
    }
}
