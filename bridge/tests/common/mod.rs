//! What the bridge's integration tests share: a real Redis Cluster, a store on it, raw
//! access to the keys, a pinned clock in the future, a seeded RNG.
#![allow(dead_code)]

use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::Value;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use weir_bridge::scripts::{Invocation, ScriptReply};
use weir_bridge::{Metrics, RedisStore};
use weir_core::algorithms::GlobalLimit;
use weir_core::algorithms::{AlgorithmKind, Ask, SlotState};
use weir_e2e::RedisCluster;

/// A 6-node cluster (3 masters, 3 replicas), a store with a generous timeout, and a raw
/// connection for inspecting keys.
pub struct Redis {
    pub cluster: RedisCluster,
    pub conn: ClusterConnection,
    pub store: RedisStore,
    pub metrics: Arc<Metrics>,
}

impl Redis {
    pub async fn start() -> Redis {
        let cluster = RedisCluster::start(3, 1);
        let client = ClusterClient::builder(cluster.seed_urls())
            .connection_timeout(Duration::from_secs(2))
            .response_timeout(Duration::from_secs(5))
            .build()
            .unwrap();
        let conn = client.get_async_connection().await.unwrap();
        let metrics = Arc::new(Metrics::default());
        let store = RedisStore::new(conn.clone(), Duration::from_secs(5), metrics.clone());
        Redis {
            cluster,
            conn,
            store,
            metrics,
        }
    }

    /// Runs one script call as given; panics, naming the call, if it fails.
    pub async fn run(&self, inv: &Invocation) -> ScriptReply {
        match self.store.run(inv).await {
            Ok(reply) => reply,
            Err(err) => panic!("script call {inv:?} failed: {err:?}"),
        }
    }

    pub async fn cmd(&self, args: &[&str]) -> Value {
        let mut cmd = redis::cmd(args[0]);
        for a in &args[1..] {
            cmd.arg(*a);
        }
        let mut conn = self.conn.clone();
        cmd.query_async::<Value>(&mut conn)
            .await
            .unwrap_or_else(|e| panic!("{args:?}: {e}"))
    }

    pub async fn get(&self, key: &str) -> Option<String> {
        match self.cmd(&["GET", key]).await {
            Value::Nil => None,
            Value::BulkString(b) => Some(String::from_utf8(b).unwrap()),
            other => panic!("GET {key}: {other:?}"),
        }
    }

    pub async fn int(&self, args: &[&str]) -> i64 {
        match self.cmd(args).await {
            Value::Int(n) => n,
            other => panic!("{args:?}: {other:?}"),
        }
    }

    /// The stored state of a slot algorithm's key, decoded into the core's slot words.
    pub async fn slot_state(&self, kind: AlgorithmKind, key: &str) -> Option<SlotState> {
        let text = self.get(key).await?;
        let n: Vec<u64> = text
            .split(' ')
            .map(|w| w.parse().unwrap_or_else(|_| panic!("{key} = {text:?}")))
            .collect();
        Some(match (kind, n.as_slice()) {
            (AlgorithmKind::TokenBucket | AlgorithmKind::FixedWindow, [a, b]) => {
                SlotState { a: *a, b: *b }
            }
            (AlgorithmKind::Gcra, [us, rem]) => {
                assert!(*rem < 1000, "{key} = {text:?}");
                SlotState {
                    a: us * 1000 + rem,
                    b: 0,
                }
            }
            (AlgorithmKind::SlidingWindow, [prev, curr, start]) => SlotState {
                a: (prev << 32) | curr,
                b: *start,
            },
            _ => panic!("{key} = {text:?} is not a {kind} state"),
        })
    }
}

/// Waits until the replica of the master at `addr` has acknowledged every write the
/// master has made, and at least one. `RedisCluster::start` returns once the replicas
/// report their link up, but after a full sync a Redis 7.0 master holds writes back until
/// the replica's first `REPLCONF ACK` (sent once a second): a master killed in between
/// takes every write since the sync with it, and a failover loses them all.
pub fn wait_until_replica_acks(addr: &str) {
    let port: u16 = addr.rsplit(':').next().unwrap().parse().unwrap();
    let field = |info: &str, name: &str| -> Option<u64> {
        info.lines()
            .find_map(|l| l.trim().strip_prefix(name))
            .and_then(|v| v.parse().ok())
    };
    let acked = weir_e2e::wait_until(Duration::from_secs(20), Duration::from_millis(20), || {
        let Ok(info) = weir_e2e::redis_cli_at(port, ["INFO", "replication"]) else {
            return false;
        };
        let master = field(&info, "master_repl_offset:");
        let replica = info
            .lines()
            .find(|l| l.starts_with("slave0:"))
            .and_then(|l| l.split(',').find_map(|kv| kv.strip_prefix("offset=")))
            .and_then(|v| v.parse::<u64>().ok());
        matches!((master, replica), (Some(m), Some(r)) if m > 0 && r == m)
    });
    assert!(acked, "the replica of {addr} never caught up");
}

/// A clock for pinned tests: `T0` (the scenarios' epoch, on a minute boundary) moved
/// forward by whole days until it is a day ahead of the real clock. Keys get absolute
/// deadlines from the pinned clock, so they outlive the test; and every window of up to a
/// day keeps the phase the scenarios were written for.
pub fn future_base(t0: u64) -> u64 {
    const DAY_US: u64 = 86_400_000_000;
    let real = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64;
    t0 + (real + DAY_US - t0).div_ceil(DAY_US) * DAY_US
}

/// The invocation for `limit` on a test descriptor.
pub fn invocation(
    limit: &GlobalLimit,
    descriptor: &str,
    now_us: u64,
    cost: u64,
    want: u64,
) -> Invocation {
    invocation_for(limit, descriptor, now_us, Ask::exact(cost).with_want(want))
}

/// The call for one descriptor of the test rule, asking `ask`.
pub fn invocation_for(limit: &GlobalLimit, descriptor: &str, now_us: u64, ask: Ask) -> Invocation {
    Invocation::for_limit(
        limit,
        "weir-test",
        "conformance",
        &[format!("={descriptor}")],
        now_us,
        ask,
    )
}

/// SplitMix64: a tiny seeded generator, so that a failing run can be replayed.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }

    pub fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }

    pub fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[(self.next() % items.len() as u64) as usize]
    }
}
