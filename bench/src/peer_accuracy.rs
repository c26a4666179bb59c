//! Accuracy beside the peers (issue 35): the loads of [`Mode::PEERS`] — 5× and 20× the
//! limit spread evenly over two Envoys, and 2× with 90 % of it, then all of it, on one —
//! offered by the same paced generator to what an Envoy user runs instead of weir for a
//! fleet-wide limit:
//!
//! - Envoy's `local_ratelimit` with `local_cluster_rate_limit`: each Envoy takes its share
//!   of one token bucket from the membership of its local cluster (the two Envoys), no
//!   Redis at all. In Envoy 1.40 the bucket keeps its size and a request costs as many
//!   tokens as there are members (`local_ratelimit_impl.cc`, `DefaultEvenShareMonitor`).
//! - Envoy's global rate limit filter calling limitador (bench/peers/limitador-rls, when
//!   built), each Envoy its own replica over one standalone Redis, as a deployment of two
//!   would; with either Redis storage.
//!
//! The limit is the same as weir's runs: 1,000/s (250/s at 20×) with a burst of 100 (25)
//! at once. limitador counts fixed 1 s windows; Envoy's bucket refills every 50 ms (100 ms
//! at 20×, its fill interval may not be shorter than 50 ms). Their admissions are counted
//! against the same bound as weir's (`b + 1 + rate · t`). The conformance checker judges
//! weir's runs from the decisions weir logs; a peer logs none, and its algorithm is not
//! one of weir's, so its runs are not judged by it.

use std::path::Path;
use std::thread;
use std::time::Duration;

use weir_e2e::loopback::cluster_yaml;
use weir_e2e::redis_single::RedisServer;
use weir_e2e::{Bootstrap, Envoy};

use crate::accuracy::{self, Mode, PacedRun};
use crate::peers::{self, Rls, RlsLimit, Storage};
use crate::{log, start_envoys, Opts};

/// The name of Envoy's fleet-split local limit in the report.
pub const LOCAL_CLUSTER: &str = "envoy-local-cluster-rate-limit";

/// The name of the RLS peer with `storage` in the report (as its cost scenarios).
pub fn rls_name(storage: Storage) -> String {
    format!("rls-limitador-{}", storage.arg())
}

/// Runs every load of [`Mode::PEERS`] (the uneven ones alone in a smoke run) on each peer:
/// Envoy's local cluster split, and limitador with each storage when `rls_bin` is there.
pub(crate) fn run_peer_accuracy(opts: &Opts, rls_bin: Option<&Path>) -> Vec<PacedRun> {
    let modes: Vec<Mode> = Mode::PEERS
        .into_iter()
        .filter(|m| !opts.smoke || m.is_uneven())
        .collect();
    let mut limits: Vec<(u64, u64)> = modes.iter().map(|m| m.limit()).collect();
    limits.sort_unstable_by(|a, b| b.cmp(a));
    limits.dedup();
    let of_limit = |limit: (u64, u64)| modes.iter().copied().filter(move |m| m.limit() == limit);
    let nonce = std::process::id();
    let mut runs = Vec::new();
    for &(rate, burst) in &limits {
        log(format!(
            "accuracy beside the peers: 2 Envoys × 2 workers splitting one bucket of {} and {rate}/s by local_cluster_rate_limit",
            burst + 1
        ));
        let envoys = local_cluster_pair(rate, burst);
        for mode in of_limit((rate, burst)) {
            let key = format!("peer-{nonce}-{}", runs.len());
            runs.push(measure(opts, &envoys, &[], LOCAL_CLUSTER, mode, &key));
        }
    }
    let Some(bin) = rls_bin else {
        log("accuracy beside the peers: limitador-rls is not built (`just bench-peers`): no RLS runs");
        return runs;
    };
    let redis = RedisServer::start(&[]);
    for storage in [Storage::Async, Storage::Cached] {
        for &(rate, burst) in &limits {
            let limit = RlsLimit {
                storage,
                key: "x-key",
                per_second: rate,
            };
            log(format!(
                "accuracy beside the peers: 2 Envoys × 2 workers, each calling its own limitador-rls ({} storage, {rate} per 1 s window) over one Redis",
                storage.arg()
            ));
            let replicas = [
                Rls::start(bin, redis.port, limit),
                Rls::start(bin, redis.port, limit),
            ];
            let envoys = start_envoys(
                replicas
                    .iter()
                    .map(|r| {
                        (
                            peers::upstream_hop(Bootstrap::new(), Some((limit, r.port))),
                            2,
                        )
                    })
                    .collect(),
            );
            let mut services: Vec<u32> = replicas.iter().map(Rls::pid).collect();
            services.push(redis.pid());
            for mode in of_limit((rate, burst)) {
                let key = format!("peer-{nonce}-{}", runs.len());
                runs.push(measure(
                    opts,
                    &envoys,
                    &services,
                    &rls_name(storage),
                    mode,
                    &key,
                ));
            }
        }
    }
    runs
}

/// Two Envoys (2 workers each) whose `local_ratelimit` splits one token bucket of
/// `burst + 1` tokens refilled at `rate` per second by the membership of their local
/// cluster, which lists both.
fn local_cluster_pair(rate: u64, burst: u64) -> Vec<Envoy> {
    let bootstraps = [Bootstrap::new(), Bootstrap::new()];
    let members: Vec<u16> = bootstraps.iter().map(|b| b.http_port).collect();
    let fleet = local_cluster_yaml(&members);
    let filter = local_cluster_filter(rate, burst);
    start_envoys(
        bootstraps
            .into_iter()
            .map(|b| {
                let b = b
                    .http_filter(filter.clone())
                    .cluster(fleet.clone())
                    .top_level("cluster_manager:\n  local_cluster_name: fleet\n");
                (b, 2)
            })
            .collect(),
    )
}

/// The cluster `fleet`: one endpoint per member's listener (only its size matters).
fn local_cluster_yaml(members: &[u16]) -> String {
    let mut yaml = cluster_yaml("fleet", members[0], "");
    for &port in &members[1..] {
        yaml.push_str(&format!(
            "      - endpoint:\n          address:\n            socket_address: {{ address: 127.0.0.1, port_value: {port} }}\n"
        ));
    }
    yaml
}

/// Envoy's local rate limit (1.40) with `local_cluster_rate_limit`: `burst + 1` tokens,
/// `rate` per second refilled every 50 ms, or every 100 ms when 50 ms would need a
/// fraction of a token. Enabled and enforced for every request (both default to 0 %).
fn local_cluster_filter(rate: u64, burst: u64) -> String {
    let fill_ms = if (rate * 50).is_multiple_of(1000) {
        50
    } else {
        100
    };
    format!(
        r#"- name: envoy.filters.http.local_ratelimit
  typed_config:
    "@type": type.googleapis.com/envoy.extensions.filters.http.local_ratelimit.v3.LocalRateLimit
    stat_prefix: fleet
    token_bucket:
      max_tokens: {tokens}
      tokens_per_fill: {per_fill}
      fill_interval: {fill}s
    filter_enabled:
      default_value: {{ numerator: 100, denominator: HUNDRED }}
    filter_enforced:
      default_value: {{ numerator: 100, denominator: HUNDRED }}
    local_cluster_rate_limit: {{}}
"#,
        tokens = burst + 1,
        per_fill = rate * fill_ms / 1000,
        fill = fill_ms as f64 / 1000.0,
    )
}

/// Runs `mode` on `envoys` (key `key`), with the CPU of the Envoys, `services` (the rate
/// limit services and their Redis) and the generator over it; then pauses so the next
/// run starts from a full bucket (a fresh key for the services).
fn measure(
    opts: &Opts,
    envoys: &[Envoy],
    services: &[u32],
    limiter: &str,
    mode: Mode,
    key: &str,
) -> PacedRun {
    let ports: Vec<u16> = envoys.iter().map(|e| e.http_port).collect();
    let groups: Vec<(&str, Vec<u32>)> = vec![
        ("envoys", envoys.iter().map(Envoy::pid).collect()),
        ("rate limit services and Redis", services.to_vec()),
        ("generator", vec![std::process::id()]),
    ];
    log(format!(
        "accuracy beside the peers: {limiter}, {} for {} s",
        mode.load_label(),
        opts.accuracy_secs
    ));
    let mut run = accuracy::paced_with_cpu(mode, &ports, opts.accuracy_secs, key, &groups);
    run.limiter = Some(limiter.to_string());
    log(format!(
        "accuracy beside the peers: {}: sent {:.0}/s, admitted {} of bound {:.0} (over {:.2} %, under {:.2} %), max lag {:.1} ms",
        run.label(),
        run.sent_rps,
        run.admitted,
        run.exact_bound,
        run.over_pct,
        run.under_pct,
        run.max_lag_ms
    ));
    thread::sleep(Duration::from_millis(1000));
    run
}
