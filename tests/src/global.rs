//! A global-limit stack on 127.0.0.1: a 6-node Redis Cluster (3 masters, 3 replicas),
//! weir-bridge, and Envoys with 2 workers each running weir with every decision in their
//! access logs, so that a test can judge the admissions of all of them together.

use crate::decisions::{with_decisions, Checked, Excuse, Judge, Logged, Logs};
use crate::redis_single::MASTER_NAME;
use crate::{bridge_cluster_yaml, wasm_filter_yaml, weir_wasm, Bootstrap, Bridge, Envoy};
use crate::{free_port, RedisCluster, RedisSentinel, RedisServer, TestDir};
use weir_testkit::simulation::with_extra_bursts;

/// Field order is drop order: Envoys, then the bridge, then Redis, then the logs' dir.
/// `R` is the Redis the bridge runs on: a cluster ([`GlobalStack::start`]), a standalone
/// server ([`GlobalStack::standalone`]) or Sentinel ([`GlobalStack::sentinel`]).
pub struct GlobalStack<R = RedisCluster> {
    pub envoys: Vec<Envoy>,
    pub bridge: Bridge,
    pub redis: R,
    pub logs: Logs,
    /// The plugin config of each Envoy (empty for [`GlobalStack::start_filters`]).
    pub configs: Vec<String>,
    _dir: TestDir,
}

impl GlobalStack<RedisCluster> {
    /// One Envoy per plugin config (filter state turned on), the bridge started with
    /// `bridge_args`, access-log lines keyed by the request header `key_header`.
    pub fn start(configs: &[&str], bridge_args: &[&str], key_header: &str) -> GlobalStack {
        let configs: Vec<String> = configs.iter().map(|c| with_decisions(c)).collect();
        let mut stack = GlobalStack::start_filters(&filters(&configs), bridge_args, key_header);
        stack.configs = configs;
        stack
    }

    /// One Envoy per HTTP filter (a YAML list item), as given.
    pub fn start_filters(
        filters: &[String],
        bridge_args: &[&str],
        key_header: &str,
    ) -> GlobalStack {
        let redis = RedisCluster::start(3, 1);
        let bridge = Bridge::start(&redis, bridge_args);
        GlobalStack::around(redis, bridge, filters, key_header)
    }
}

impl GlobalStack<RedisServer> {
    /// [`GlobalStack::start`] on one `redis-server` (`--redis-mode standalone`).
    pub fn standalone(configs: &[&str], key_header: &str) -> GlobalStack<RedisServer> {
        let redis = RedisServer::start(&[]);
        let addr = redis.addr();
        let bridge = Bridge::start_with_redis(
            free_port(),
            &["--redis-mode", "standalone", "--redis-nodes", &addr],
            &[],
        );
        GlobalStack::with_configs(redis, bridge, configs, key_header)
    }
}

impl GlobalStack<RedisSentinel> {
    /// [`GlobalStack::start`] on a master with `replicas` replicas and 3 sentinels
    /// (`--redis-mode sentinel`).
    pub fn sentinel(
        configs: &[&str],
        replicas: usize,
        key_header: &str,
    ) -> GlobalStack<RedisSentinel> {
        let redis = RedisSentinel::start(replicas, 3);
        let sentinels = redis.sentinel_addrs().join(",");
        let bridge = Bridge::start_with_redis(
            free_port(),
            &[
                "--redis-mode",
                "sentinel",
                "--redis-nodes",
                &sentinels,
                "--redis-sentinel-master",
                MASTER_NAME,
            ],
            &[],
        );
        GlobalStack::with_configs(redis, bridge, configs, key_header)
    }
}

/// Each plugin config as an HTTP filter running this tree's weir.wasm.
fn filters(configs: &[String]) -> Vec<String> {
    configs
        .iter()
        .map(|c| wasm_filter_yaml(c, &weir_wasm()))
        .collect()
}

impl<R> GlobalStack<R> {
    fn with_configs(
        redis: R,
        bridge: Bridge,
        configs: &[&str],
        key_header: &str,
    ) -> GlobalStack<R> {
        let configs: Vec<String> = configs.iter().map(|c| with_decisions(c)).collect();
        let mut stack = GlobalStack::around(redis, bridge, &filters(&configs), key_header);
        stack.configs = configs;
        stack
    }

    /// One Envoy (2 workers) per filter, reaching `bridge`, each logging every decision.
    fn around(redis: R, bridge: Bridge, filters: &[String], key_header: &str) -> GlobalStack<R> {
        let dir = TestDir::new("global-stack");
        let logs = Logs::new(dir.path(), filters.len(), key_header);
        let envoys = filters
            .iter()
            .enumerate()
            .map(|(i, filter)| {
                let bootstrap = Bootstrap::new()
                    .http_filter(filter.clone())
                    .cluster(bridge_cluster_yaml(bridge.port));
                Envoy::shared(&logs.add_to(i, bootstrap), 2)
            })
            .collect();
        GlobalStack {
            envoys,
            bridge,
            redis,
            logs,
            configs: Vec::new(),
            _dir: dir,
        }
    }

    pub fn ports(&self) -> Vec<u16> {
        self.envoys.iter().map(|e| e.http_port).collect()
    }

    /// A weir stat summed over every Envoy.
    pub fn weir_stat(&self, name: &str) -> u64 {
        self.envoys.iter().map(|e| e.weir_stat(name)).sum()
    }

    /// Rule `rule` as the first Envoy's config sets it, to judge its admissions.
    pub fn judge(&self, rule: &str) -> Judge {
        let config = self.configs.first().map(String::as_str).unwrap_or("{}");
        Judge::configured(config, rule)
    }

    /// Judges the admissions of every Envoy with `judge` (e.g. [`GlobalStack::judge`]),
    /// once `lines` requests are logged (see [`Logs::assert_conformant`]).
    pub fn assert_conformant(&self, judge: &Judge, lines: usize) -> Checked {
        self.logs.assert_conformant(judge, lines)
    }

    /// Rules named after their failure mode (`allow`, `deny`, `local`), judged after an
    /// outage the harness caused: what Redis and the leases admitted keeps the bound;
    /// `deny` is judged whole, `allow` and `local` leave out their admissions inside
    /// `outage`. The `local` rule's fallback must have decided, and everything that rule
    /// let through, Redis's and the fallback's together, keeps the bound plus two bursts
    /// (docs/global.md, "Failure modes").
    pub fn assert_failure_modes_keep_their_bounds(&self, logs: &[Vec<Logged>], outage: &Excuse) {
        let refs: Vec<&[Logged]> = logs.iter().map(Vec::as_slice).collect();
        for mode in ["allow", "deny", "local"] {
            let judge = match mode {
                "deny" => self.judge(mode),
                _ => self.judge(mode).excusing(outage.clone()),
            };
            let checked = judge.check(&refs).unwrap_or_else(|v| panic!("{mode}: {v}"));
            eprintln!(
                "{mode}: {} units admitted outside the outage, {} admissions inside it; {:?}",
                checked.admitted, checked.excused, checked.labelled
            );
        }
        let fallback = logs
            .iter()
            .flatten()
            .filter_map(|l| l.decision("local"))
            .filter(|d| d.source == "fallback")
            .count();
        assert!(fallback > 0, "the local fallback never decided");
        let judge = self.judge("local");
        let loose = with_extra_bursts(&judge.limit, 2);
        if let Err(v) = judge.against(loose).check(&refs) {
            panic!("local fallback beyond the bound plus two bursts: {v}");
        }
    }

    pub fn assert_no_panic(&self) {
        for e in &self.envoys {
            e.assert_no_panic();
        }
    }
}
