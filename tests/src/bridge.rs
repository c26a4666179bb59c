//! weir-bridge as a child process, and the Envoy cluster that reaches it.

use std::env;
use std::path::PathBuf;
use std::process::ExitStatus;
use std::time::Duration;

use crate::http::get;
use crate::ports::free_port;
use crate::prereq::repo_root;
use crate::process::{wait_until, Process};
use crate::redis::RedisCluster;

/// The built bridge: `$WEIR_BRIDGE_BIN`, else `<target>/debug/weir-bridge`.
pub fn bridge_bin() -> PathBuf {
    if let Some(p) = env::var_os("WEIR_BRIDGE_BIN") {
        return PathBuf::from(p);
    }
    let target = env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("target"));
    let p = target.join("debug/weir-bridge");
    assert!(
        p.is_file(),
        "weir-bridge not found at {}: build it with `cargo build -p weir-bridge`, or set WEIR_BRIDGE_BIN",
        p.display()
    );
    p
}

/// A running weir-bridge; killed by PID on drop.
#[derive(Debug)]
pub struct Bridge {
    pub port: u16,
    process: Process,
}

impl Bridge {
    /// Starts the bridge against `redis` on a free port and waits until `/healthz` is
    /// 200. `extra` are more flags (e.g. `["--secret", "s"]`). Without a
    /// `--drain-delay` among them it stops at once on SIGTERM: tests that do not roll it
    /// need not wait for a drain. Without a `--redis-timeout` it waits 100 ms for Redis,
    /// as before the default became 40 ms: most tests' filters wait 200 ms or more for
    /// the bridge (a loaded test machine), and on one the first `EVAL`s of a script timed
    /// out at 40 ms (tests/tests/global_conformance.rs, bursts after an idle period).
    pub fn start(redis: &RedisCluster, extra: &[&str]) -> Bridge {
        Bridge::start_on(redis, free_port(), extra)
    }

    /// [`Bridge::start`] on `port`: a replica that replaces one stopped on that port.
    pub fn start_on(redis: &RedisCluster, port: u16, extra: &[&str]) -> Bridge {
        let nodes = redis.seed_nodes().join(",");
        Bridge::start_with_redis(port, &["--redis-nodes", &nodes], extra)
    }

    /// [`Bridge::start_on`] with the Redis flags given (`--redis-mode`, `--redis-nodes`…):
    /// a standalone server or Sentinel.
    pub fn start_with_redis(port: u16, redis_args: &[&str], extra: &[&str]) -> Bridge {
        let listen = format!("127.0.0.1:{port}");
        let mut args = vec!["--listen", &listen];
        args.extend_from_slice(redis_args);
        if !extra.contains(&"--drain-delay") {
            args.extend(["--drain-delay", "0s"]);
        }
        if !extra.contains(&"--redis-timeout") {
            args.extend(["--redis-timeout", "100ms"]);
        }
        args.extend_from_slice(extra);
        let mut process = Process::spawn(bridge_bin(), &args, &[("WEIR_BRIDGE_LOG", "info")]);
        let healthy = wait_until(Duration::from_secs(20), Duration::from_millis(50), || {
            get(port, "/healthz", &[]).is_ok_and(|r| r.status == 200)
        });
        if !healthy {
            let running = process.is_running();
            panic!(
                "weir-bridge not healthy after 20 s (running: {running}); log:\n{}",
                process.log()
            );
        }
        Bridge { port, process }
    }

    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    pub fn log(&self) -> String {
        self.process.log()
    }

    /// Kills the bridge now (SIGKILL: it gets no chance to answer anything more).
    pub fn kill_hard(&mut self) {
        self.process.child().kill_hard();
    }

    /// Stops the bridge as an orchestrator does (SIGTERM) and waits up to `timeout` for
    /// it to exit; its exit status, `None` if it is still running.
    pub fn stop(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let child = self.process.child();
        child.signal(libc::SIGTERM);
        child.wait_exit(timeout)
    }

    /// Sends `signal` to the bridge (e.g. `SIGSTOP`: it keeps its connections and answers
    /// nothing; `SIGCONT` resumes it).
    pub fn signal(&mut self, signal: libc::c_int) {
        self.process.child().signal(signal);
    }

    /// The Prometheus text of `/metrics`.
    pub fn metrics(&self) -> String {
        get(self.port, "/metrics", &[])
            .map(|r| r.text())
            .unwrap_or_default()
    }

    /// Sum of every sample of metric `name` whose labels contain all of `labels`
    /// (e.g. `("rule", "per-tenant")`).
    pub fn metric_sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        prometheus_sum(&self.metrics(), name, labels)
    }
}

/// Sums the samples of `name` in Prometheus text whose labels include `labels`.
pub fn prometheus_sum(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let (metric, label_text) = match series.split_once('{') {
                Some((m, rest)) => (m, rest.trim_end_matches('}')),
                None => (series, ""),
            };
            if metric != name {
                return None;
            }
            let all = labels
                .iter()
                .all(|(k, v)| label_text.contains(&format!("{k}=\"{v}\"")));
            if !all {
                return None;
            }
            value.parse::<f64>().ok()
        })
        .sum()
}

/// The Envoy cluster `weir_bridge` pointing at `port` on 127.0.0.1 (HTTP/1.1), as a
/// list item for [`crate::Bootstrap::cluster`].
pub fn bridge_cluster_yaml(port: u16) -> String {
    bridge_cluster_yaml_with(port, BridgeProtocol::Http1)
}

/// How Envoy talks to weir-bridge.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BridgeProtocol {
    Http1,
    /// HTTP/2 over plain TCP (prior knowledge): one connection per worker, calls multiplexed.
    Http2,
}

/// The `weir_bridge` cluster, speaking `protocol`.
pub fn bridge_cluster_yaml_with(port: u16, protocol: BridgeProtocol) -> String {
    let options = match protocol {
        BridgeProtocol::Http1 => "",
        BridgeProtocol::Http2 => {
            "  typed_extension_protocol_options:
    envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
      \"@type\": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
      explicit_http_config:
        http2_protocol_options: {}
"
        }
    };
    format!(
        "- name: weir_bridge
  type: STATIC
  connect_timeout: 0.25s
{options}  load_assignment:
    cluster_name: weir_bridge
    endpoints:
    - lb_endpoints:
      - endpoint:
          address:
            socket_address: {{ address: 127.0.0.1, port_value: {port} }}
"
    )
}

/// The `weir_bridge` cluster of the shipped `envoy/envoy.yaml` — its protocol, health
/// check and outlier detection as users get them — with one endpoint on 127.0.0.1 per
/// port, as a list item for [`crate::Bootstrap::cluster`].
pub fn shipped_bridge_cluster_yaml(ports: &[u16]) -> String {
    let path = repo_root().join("envoy/envoy.yaml");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let bootstrap: serde_yaml::Value = serde_yaml::from_str(&text)
        .unwrap_or_else(|e| panic!("{} is not YAML: {e}", path.display()));
    let mut cluster = bootstrap["static_resources"]["clusters"]
        .as_sequence()
        .and_then(|clusters| clusters.iter().find(|c| c["name"] == "weir_bridge"))
        .unwrap_or_else(|| panic!("no weir_bridge cluster in {}", path.display()))
        .clone();
    let endpoints: Vec<serde_yaml::Value> = ports
        .iter()
        .map(|port| {
            serde_yaml::from_str(&format!(
                "endpoint: {{ address: {{ socket_address: {{ address: 127.0.0.1, port_value: {port} }} }} }}"
            ))
            .unwrap_or_else(|e| panic!("endpoint YAML: {e}"))
        })
        .collect();
    cluster["load_assignment"]["endpoints"] =
        serde_yaml::Value::Sequence(vec![serde_yaml::Mapping::from_iter([(
            "lb_endpoints".into(),
            serde_yaml::Value::Sequence(endpoints),
        )])
        .into()]);
    serde_yaml::to_string(&vec![cluster]).unwrap_or_else(|e| panic!("cluster YAML: {e}"))
}
