//! A global-limit stack on 127.0.0.1: a 6-node Redis Cluster (3 masters, 3 replicas),
//! weir-bridge, and Envoys with 2 workers each running weir with every decision in their
//! access logs, so that a test can judge the admissions of all of them together.

use crate::decisions::{with_decisions, Checked, Judge, Logs};
use crate::{bridge_cluster_yaml, wasm_filter_yaml, weir_wasm, Bootstrap, Bridge, Envoy};
use crate::{RedisCluster, TestDir};

/// Field order is drop order: Envoys, then the bridge, then Redis, then the logs' dir.
pub struct GlobalStack {
    pub envoys: Vec<Envoy>,
    pub bridge: Bridge,
    pub redis: RedisCluster,
    pub logs: Logs,
    /// The plugin config of each Envoy (empty for [`GlobalStack::start_filters`]).
    pub configs: Vec<String>,
    _dir: TestDir,
}

impl GlobalStack {
    /// One Envoy per plugin config (filter state turned on), the bridge started with
    /// `bridge_args`, access-log lines keyed by the request header `key_header`.
    pub fn start(configs: &[&str], bridge_args: &[&str], key_header: &str) -> GlobalStack {
        let configs: Vec<String> = configs.iter().map(|c| with_decisions(c)).collect();
        let filters: Vec<String> = configs
            .iter()
            .map(|c| wasm_filter_yaml(c, &weir_wasm()))
            .collect();
        let mut stack = GlobalStack::start_filters(&filters, bridge_args, key_header);
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
        let dir = TestDir::new("global-stack");
        let logs = Logs::new(dir.path(), filters.len(), key_header);
        let envoys = filters
            .iter()
            .enumerate()
            .map(|(i, filter)| {
                let bootstrap = Bootstrap::new()
                    .http_filter(filter.clone())
                    .cluster(bridge_cluster_yaml(bridge.port));
                Envoy::start(&logs.add_to(i, bootstrap), 2)
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

    pub fn assert_no_panic(&self) {
        for e in &self.envoys {
            e.assert_no_panic();
        }
    }
}
