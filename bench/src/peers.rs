//! The peers weir is measured beside (issue 35): what an Envoy user runs instead for a
//! fleet-wide limit. Here, Envoy's global rate limit filter (`envoy.filters.http.ratelimit`)
//! calling a rate limit service over gRPC on every request, the service being Kuadrant's
//! limitador engine behind a thin adapter (bench/peers/limitador-rls, built apart from the
//! suite by `just bench-peers`) over one standalone `redis-server`, the setup limitador
//! supports. It is the limitador engine, not envoyproxy/ratelimit.
//!
//! Envoy's rate limit filter does nothing on a `direct_response` route (it limits routes
//! to a cluster), so a peer's Envoy routes to an upstream it serves itself, on a second
//! listener of the same process; `no-filter-upstream` is that hop with no filter, the
//! baseline of the peers' own cost.

use std::path::{Path, PathBuf};
use std::time::Duration;

use weir_e2e::loopback::cluster_yaml;
use weir_e2e::{free_port, repo_root, wait_until, Bootstrap, Process};

/// limitador's two Redis storages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Storage {
    /// `AsyncRedisStorage`: Redis on every hit, exact.
    Async,
    /// `CachedRedisStorage`: counters cached in the process, flushed to Redis in batches.
    Cached,
}

impl Storage {
    pub fn arg(self) -> &'static str {
        match self {
            Storage::Async => "async",
            Storage::Cached => "cached",
        }
    }
}

/// One rate limit service's limit: `per_second` hits in each 1 s window for each value
/// of the descriptor entry `key` (`generic_key`: one counter for all requests).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RlsLimit {
    pub storage: Storage,
    pub key: &'static str,
    pub per_second: u64,
}

/// The limited cost scenarios' limit, per second on their one key: about 5 % of what the
/// limited async peer's Envoy answers on the bench machine (19,099/s in a trial run,
/// 2026-11-29), so most requests get 429.
pub const LIMITED_PER_SECOND: u64 = 1000;

impl RlsLimit {
    /// A cost scenario's limit: one per tenant far above the load, or one key for every
    /// request at [`LIMITED_PER_SECOND`].
    pub fn cost(storage: Storage, limited: bool) -> RlsLimit {
        if limited {
            RlsLimit {
                storage,
                key: "generic_key",
                per_second: LIMITED_PER_SECOND,
            }
        } else {
            RlsLimit {
                storage,
                key: "x-tenant",
                per_second: 1_000_000_000,
            }
        }
    }

    /// limitador-rls's arguments for this limit (domain `bench`, 1 s windows); the
    /// descriptor comes from [`RlsLimit::rate_limit_actions`].
    fn args(self) -> Vec<String> {
        let limit = self.per_second.to_string();
        let args = [
            "--storage",
            self.storage.arg(),
            "--domain",
            "bench",
            "--key",
            self.key,
            "--limit",
            &limit,
            "--seconds",
            "1",
        ];
        args.iter().map(|s| s.to_string()).collect()
    }

    /// The route's `rate_limits` actions: the request header named by the key, or one
    /// generic key for all.
    pub fn rate_limit_actions(self) -> String {
        if self.key == "generic_key" {
            "{ generic_key: { descriptor_value: all } }".to_string()
        } else {
            format!(
                "{{ request_headers: {{ header_name: {0}, descriptor_key: {0} }} }}",
                self.key
            )
        }
    }
}

/// `$WEIR_PEER_LIMITADOR_RLS`, else `target/peers/release/limitador-rls` (what `just
/// bench-peers` builds), if it is there.
pub fn limitador_rls_bin() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("WEIR_PEER_LIMITADOR_RLS") {
        return Some(PathBuf::from(p));
    }
    let p = repo_root().join("target/peers/release/limitador-rls");
    p.is_file().then_some(p)
}

/// One limitador-rls process.
pub struct Rls {
    pub limit: RlsLimit,
    pub port: u16,
    process: Process,
}

impl Rls {
    /// limitador-rls with `limit` over the Redis on `redis_port`; fails loudly when it
    /// does not listen.
    pub fn start(bin: &Path, redis_port: u16, limit: RlsLimit) -> Rls {
        let port = free_port();
        let mut args = vec![
            "--listen".to_string(),
            format!("127.0.0.1:{port}"),
            "--redis".to_string(),
            format!("redis://127.0.0.1:{redis_port}"),
        ];
        args.extend(limit.args());
        let mut process = Process::spawn(bin, &args, &[]);
        let listening = wait_until(Duration::from_secs(20), Duration::from_millis(50), || {
            std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
        });
        assert!(
            listening && process.is_running(),
            "limitador-rls ({limit:?}) did not listen on {port}: {}",
            process.log()
        );
        Rls {
            limit,
            port,
            process,
        }
    }

    pub fn pid(&self) -> u32 {
        self.process.pid()
    }
}

/// The rate limit services of a run, one per limit.
pub struct RlsServices {
    services: Vec<Rls>,
}

impl RlsServices {
    /// A limitador-rls per limit in `limits`, over the `redis-server` on `redis_port`.
    pub fn start(bin: &Path, redis_port: u16, limits: &[RlsLimit]) -> RlsServices {
        let services = limits
            .iter()
            .map(|&limit| Rls::start(bin, redis_port, limit))
            .collect();
        RlsServices { services }
    }

    pub fn port(&self, limit: RlsLimit) -> u16 {
        self.services
            .iter()
            .find(|r| r.limit == limit)
            .map(|r| r.port)
            .unwrap_or_else(|| panic!("no limitador-rls for {limit:?}"))
    }

    /// The services' process ids, for their CPU time.
    pub fn pids(&self) -> Vec<u32> {
        self.services.iter().map(Rls::pid).collect()
    }
}

/// What the cost run's Envoys call besides the Redis Cluster's weir-bridge: the peers'
/// rate limit services, and the weir-bridge over the peers' standalone Redis (the
/// `*-single-redis` scenarios).
#[derive(Clone, Copy, Default)]
pub struct PeerBackends<'a> {
    pub rls: Option<&'a RlsServices>,
    pub single_redis_bridge: Option<u16>,
}

/// The upstream hop: the ingress route goes to cluster `upstream`, a second listener of
/// the same Envoy that answers 200 (`direct_response`). With `rls`, the route carries the
/// limit's actions and Envoy's rate limit filter calls the service on `rls_port`
/// (gRPC, HTTP/2; a failed call denies, as a quota should).
pub fn upstream_hop(b: Bootstrap, rls: Option<(RlsLimit, u16)>) -> Bootstrap {
    let upstream_port = free_port();
    let rate_limits = rls.map_or(String::new(), |(limit, _)| {
        format!(
            "    rate_limits: [ {{ actions: [ {} ] }} ]\n",
            limit.rate_limit_actions()
        )
    });
    let mut b = b
        .routes(format!(
            "- match: {{ prefix: \"/\" }}\n  route:\n    cluster: upstream\n{rate_limits}"
        ))
        .listener(upstream_listener(upstream_port))
        .cluster(cluster_yaml("upstream", upstream_port, ""));
    if let Some((_, port)) = rls {
        b = b.http_filter(RATELIMIT_FILTER).cluster(cluster_yaml(
            "rls",
            port,
            "  typed_extension_protocol_options:
    envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
      \"@type\": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
      explicit_http_config: { http2_protocol_options: {} }
",
        ));
    }
    b
}

/// Envoy's global rate limit filter, calling cluster `rls` for domain `bench`.
const RATELIMIT_FILTER: &str = r#"- name: envoy.filters.http.ratelimit
  typed_config:
    "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit
    domain: bench
    failure_mode_deny: true
    timeout: 0.25s
    rate_limit_service:
      transport_api_version: V3
      grpc_service: { envoy_grpc: { cluster_name: rls } }
"#;

/// The upstream's listener (stat prefix `upstream`, so the ingress counters stay the
/// ingress's).
fn upstream_listener(port: u16) -> String {
    format!(
        r#"- name: upstream
  address:
    socket_address: {{ address: 127.0.0.1, port_value: {port} }}
  filter_chains:
  - filters:
    - name: envoy.filters.network.http_connection_manager
      typed_config:
        "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
        stat_prefix: upstream
        route_config:
          virtual_hosts:
          - name: all
            domains: ["*"]
            routes: [ {{ match: {{ prefix: "/" }}, direct_response: {{ status: 200, body: {{ inline_string: "ok\n" }} }} }} ]
        http_filters:
        - name: envoy.filters.http.router
          typed_config:
            "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
"#
    )
}
