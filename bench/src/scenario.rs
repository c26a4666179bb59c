//! The cost scenarios: one listener and route (a `direct_response` 200), and the HTTP
//! filters in front of the router that each scenario measures.

use std::path::{Path, PathBuf};
use std::time::Duration;

use weir_e2e::{bridge_cluster_yaml_with, wasm_filter_yaml, with_stats, Bootstrap, BridgeProtocol};

use crate::peers::{self, RlsLimit, RlsServices, Storage};
use crate::wrk::Traffic;

/// One way of serving the same requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Scenario {
    NoFilter,
    Native,
    /// Envoy's local rate limit denying almost every request: what a 429 costs natively.
    NativeLimited,
    EmptyWasm,
    /// The empty filter making weir-local's host calls and nothing else.
    HostCallFloor,
    WeirLocal,
    /// weir-local with reservoirs off: every request decides in shared data.
    WeirLocalExact,
    /// Ten hot keys far from their limits: what reservoirs are for.
    WeirLocalHot,
    WeirLocalHalf,
    WeirGlobalExact,
    /// The same over HTTP/2 to the bridge.
    WeirGlobalExactH2,
    WeirGlobalLeases,
    /// One global key offered far more than its limit: reservations and denials.
    WeirGlobalSaturated,
    /// The empty filter making weir-global-exact's bridge call and nothing else: what
    /// Envoy's HTTP client and the bridge cost, without weir's VM work.
    BridgeCallFloor,
    /// The same over HTTP/2 to the bridge.
    BridgeCallFloorH2,
    /// weir-global-saturated with the bridge 10 ms, then 30 ms, further away (see
    /// [`Scenario::slowed`]).
    WeirGlobalSaturatedSlow10,
    WeirGlobalSaturatedSlow30,
    /// weir-global-exact and weir-global-leases with a second weir-bridge over the peers'
    /// standalone redis-server instead of the Redis Cluster (see [`Scenario::single_redis`]).
    WeirGlobalExactSingleRedis,
    WeirGlobalLeasesSingleRedis,
    /// No filter, the route going to an upstream the same Envoy serves: the peers'
    /// baseline ([`crate::peers`]).
    NoFilterUpstream,
    /// Peers: Envoy's global rate limit filter calling limitador (async or cached Redis
    /// storage) on every request, below its limit or limited (~95 % 429).
    RlsAsync,
    RlsAsyncLimited,
    RlsCached,
    RlsCachedLimited,
    /// Diagnostic (`--only`): weir with one rule whose match never holds.
    WeirNoMatch,
    /// Diagnostic (`--only`): weir with one local rule without a key (one bucket).
    WeirUnkeyed,
}

/// The bridge cluster's timeout in the global scenarios: long enough that a busy load core
/// never turns a slow answer into a failure (failures are counted and reported anyway).
const BRIDGE: &str = r#""bridge": {"cluster": "weir_bridge", "timeout": "250ms"}"#;

/// Global scenarios: one key per tenant, a limit far above the offered load.
const GLOBAL_LIMIT: &str =
    r#""limit": {"algorithm": "gcra", "rate": 1000000, "period": "1s", "burst": 999999}"#;

impl Scenario {
    pub const ALL: [Scenario; 20] = [
        Scenario::NoFilter,
        Scenario::NoFilterUpstream,
        Scenario::Native,
        Scenario::NativeLimited,
        Scenario::EmptyWasm,
        Scenario::HostCallFloor,
        Scenario::WeirLocal,
        Scenario::WeirLocalExact,
        Scenario::WeirLocalHot,
        Scenario::WeirLocalHalf,
        Scenario::WeirGlobalExact,
        Scenario::WeirGlobalExactH2,
        Scenario::WeirGlobalLeases,
        Scenario::WeirGlobalSaturated,
        // The bridge call's floor (issue 21, item 4).
        Scenario::BridgeCallFloor,
        Scenario::BridgeCallFloorH2,
        Scenario::WeirGlobalSaturatedSlow10,
        Scenario::WeirGlobalSaturatedSlow30,
        Scenario::WeirGlobalExactSingleRedis,
        Scenario::WeirGlobalLeasesSingleRedis,
    ];

    /// In the default run when the peer is built (`just bench-peers`;
    /// [`peers::limitador_rls_bin`]).
    pub const PEERS: [Scenario; 4] = [
        Scenario::RlsAsync,
        Scenario::RlsAsyncLimited,
        Scenario::RlsCached,
        Scenario::RlsCachedLimited,
    ];

    /// Not in the default run: they split weir's cost for whoever profiles the filter.
    pub const DIAGNOSTIC: [Scenario; 2] = [Scenario::WeirNoMatch, Scenario::WeirUnkeyed];

    pub fn id(self) -> &'static str {
        match self {
            Scenario::NoFilter => "no-filter",
            Scenario::Native => "native-local-ratelimit",
            Scenario::NativeLimited => "native-local-ratelimit-limited",
            Scenario::EmptyWasm => "empty-wasm",
            Scenario::HostCallFloor => "host-call-floor",
            Scenario::WeirLocal => "weir-local",
            Scenario::WeirLocalExact => "weir-local-exact",
            Scenario::WeirLocalHot => "weir-local-hot",
            Scenario::WeirLocalHalf => "weir-local-half-limited",
            Scenario::WeirGlobalExact => "weir-global-exact",
            Scenario::WeirGlobalExactH2 => "weir-global-exact-h2",
            Scenario::WeirGlobalLeases => "weir-global-leases",
            Scenario::WeirGlobalSaturated => "weir-global-saturated",
            Scenario::BridgeCallFloor => "bridge-call-floor",
            Scenario::BridgeCallFloorH2 => "bridge-call-floor-h2",
            Scenario::WeirGlobalSaturatedSlow10 => "weir-global-saturated-slow10",
            Scenario::WeirGlobalSaturatedSlow30 => "weir-global-saturated-slow30",
            Scenario::WeirGlobalExactSingleRedis => "weir-global-exact-single-redis",
            Scenario::WeirGlobalLeasesSingleRedis => "weir-global-leases-single-redis",
            Scenario::NoFilterUpstream => "no-filter-upstream",
            Scenario::RlsAsync => "rls-limitador-async",
            Scenario::RlsAsyncLimited => "rls-limitador-async-limited",
            Scenario::RlsCached => "rls-limitador-cached",
            Scenario::RlsCachedLimited => "rls-limitador-cached-limited",
            Scenario::WeirNoMatch => "weir-no-match",
            Scenario::WeirUnkeyed => "weir-unkeyed",
        }
    }

    pub fn from_id(id: &str) -> Option<Scenario> {
        Scenario::ALL
            .into_iter()
            .chain(Scenario::PEERS)
            .chain(Scenario::DIAGNOSTIC)
            .find(|s| s.id() == id)
    }

    /// What the scenario is, for the report.
    pub fn describe(self) -> &'static str {
        match self {
            Scenario::NoFilter => "no HTTP filter but the router",
            Scenario::Native => {
                "`envoy.filters.http.local_ratelimit`, one bucket of 10⁹ tokens refilled every second (never limits), enabled and enforced at 100 %"
            }
            Scenario::NativeLimited => {
                "the same native filter with a bucket of 1,000 tokens refilled every second: almost every request gets its 429 (what users run instead of weir-global-saturated)"
            }
            Scenario::EmptyWasm => {
                "`weir-empty-filter` (bench/empty-filter): root + HTTP context that do nothing, same `vm_config` as weir (V8)"
            }
            Scenario::HostCallFloor => {
                "the empty filter configured to make, per request, the host calls weir-local makes and nothing else: read the clock, read `x-user`, get one of 2,500 shared-data keys of 96 bytes (weir-local's slot sets) and write it back with its CAS version"
            }
            Scenario::WeirLocal => {
                "weir, one local GCRA rule keyed by `x-user` (1,000 users), 1,000/s per user with burst 100: nothing is limited (reservoirs on, the default; each user's demand is too low for a worker to take units ahead)"
            }
            Scenario::WeirLocalExact => {
                "the same as weir-local with `reservoir.max` 1: every request decides in shared data (weir before reservoirs)"
            }
            Scenario::WeirLocalHot => {
                "weir, one local GCRA rule keyed by `x-tenant` (10 tenants, each about a tenth of the load), 100,000/s per tenant with burst 9,999: far from the limit, workers serve most requests from their reservoirs"
            }
            Scenario::WeirLocalHalf => {
                "weir, one local GCRA rule keyed by `x-user`, 1 per day, burst 0, `max_keys` 10⁶; every other request is one of 1,000 users (limited since the warm-up), the others are users never seen before (allowed): half the requests get 429"
            }
            Scenario::WeirGlobalExact => {
                "weir, one global GCRA rule keyed by `x-tenant` (10 tenants), 10⁶/s: every request asks weir-bridge (`lease.max` 1)"
            }
            Scenario::WeirGlobalExactH2 => {
                "the same as weir-global-exact, with Envoy's bridge cluster speaking HTTP/2 (prior knowledge) instead of HTTP/1.1"
            }
            Scenario::WeirGlobalLeases => {
                "the same global rule with `lease.max` 1000 and `lease.ttl` 900ms (the hold; it costs 900,000 of the 999,999 burst, which this limit can afford; the default, a quarter of the burst, is 250 ms): requests are served from leases in shared data"
            }
            Scenario::WeirGlobalSaturated => {
                "weir, one global GCRA key (no key parts) of 1,000/s, burst 99, `lease.max` 50, `ttl` 20ms, `horizon` 100ms, offered all wrk can send (a closed loop: each connection sends its next request when the last is answered, so what is offered depends on how fast weir answers; the non-2xx column shows how many were denied)"
            }
            Scenario::BridgeCallFloor => {
                "the empty filter configured to make, per request, weir-global-exact's bridge call and nothing else: one `dispatch_http_call` to the same bridge cluster (HTTP/1.1) with weir's headers and a fixed `/v2/acquire` body byte for byte what weir sends (one GCRA item, cost = want = 1; always tenant `t0`), the request paused until the answer, nothing of the answer read"
            }
            Scenario::BridgeCallFloorH2 => {
                "the same as bridge-call-floor, with the bridge cluster speaking HTTP/2 (prior knowledge), as weir-global-exact-h2"
            }
            Scenario::WeirGlobalSaturatedSlow10 => {
                "weir-global-saturated with a slow bridge: Envoy's bridge cluster points at a delaying TCP proxy (tests/src/slow_proxy.rs, in weir-bench's process on the load core) that adds 10 ms to every round trip, 5 ms each way; `bridge.timeout` is 250ms here as in every global scenario (the default, 50 ms, would leave a slow bridge little room)"
            }
            Scenario::WeirGlobalSaturatedSlow30 => {
                "the same with 30 ms added to every bridge round trip (15 ms each way), longer than the rule's 20 ms lease hold"
            }
            Scenario::WeirGlobalExactSingleRedis => {
                "weir-global-exact with its bridge cluster pointing at a second weir-bridge (`--redis-mode standalone`) over the one redis-server the peers use, instead of the 6-node Redis Cluster"
            }
            Scenario::WeirGlobalLeasesSingleRedis => {
                "weir-global-leases over the same single redis-server"
            }
            Scenario::NoFilterUpstream => {
                "no HTTP filter but the router; the route goes to an upstream the same Envoy serves on a second listener (a `direct_response` 200): the hop the peers need, their baseline"
            }
            Scenario::RlsAsync => {
                "Envoy's global rate limit filter (`envoy.filters.http.ratelimit`) calling, on every request, Envoy's rate limit service on Kuadrant's limitador engine (bench/peers/limitador-rls, limitador 0.14) with `AsyncRedisStorage` (Redis on every hit) over one standalone redis-server; one limit per `x-tenant` (10 tenants) far above the load; the route goes to the upstream of no-filter-upstream"
            }
            Scenario::RlsAsyncLimited => {
                "the same with one key for all requests (`generic_key`) limited to 1,000 per 1 s window: most requests get 429"
            }
            Scenario::RlsCached => {
                "rls-limitador-async with limitador's `CachedRedisStorage` (counters cached in the process, flushed to Redis in batches)"
            }
            Scenario::RlsCachedLimited => {
                "rls-limitador-async-limited with the cached storage"
            }
            Scenario::WeirNoMatch => {
                "diagnostic: weir with one local rule whose `match` (path prefix `/never/`) never holds: the filter's fixed cost"
            }
            Scenario::WeirUnkeyed => {
                "diagnostic: weir with one local GCRA rule without a key (one bucket for all), never limited: no header read"
            }
        }
    }

    pub fn traffic(self) -> Traffic {
        if let Some(same) = self.twin() {
            return same.traffic();
        }
        match self {
            Scenario::WeirLocalHalf => Traffic::HalfNew,
            _ => Traffic::Users,
        }
    }

    /// The peer's rate limit service's limit, for the peers.
    pub fn rls(self) -> Option<RlsLimit> {
        let (storage, limited) = match self {
            Scenario::RlsAsync => (Storage::Async, false),
            Scenario::RlsAsyncLimited => (Storage::Async, true),
            Scenario::RlsCached => (Storage::Cached, false),
            Scenario::RlsCachedLimited => (Storage::Cached, true),
            _ => return None,
        };
        Some(RlsLimit::cost(storage, limited))
    }

    /// Whether the route goes to an upstream (the peers and their baseline) rather than
    /// answering `direct_response`.
    pub fn upstream_hop(self) -> bool {
        self == Scenario::NoFilterUpstream || self.rls().is_some()
    }

    /// The scenario whose whole-system cost is taken from this one's for its own cost:
    /// no filter, with the same route.
    pub fn baseline(self) -> Scenario {
        if self.upstream_hop() {
            Scenario::NoFilterUpstream
        } else {
            Scenario::NoFilter
        }
    }

    pub fn is_global(self) -> bool {
        matches!(
            self,
            Scenario::WeirGlobalExact
                | Scenario::WeirGlobalExactH2
                | Scenario::WeirGlobalLeases
                | Scenario::WeirGlobalSaturated
        ) || self.twin().is_some()
    }

    /// A scenario that is another one on a standalone Redis: that scenario. Its config
    /// and traffic are the other's; its Envoy calls the bridge over the single Redis.
    pub fn single_redis(self) -> Option<Scenario> {
        match self {
            Scenario::WeirGlobalExactSingleRedis => Some(Scenario::WeirGlobalExact),
            Scenario::WeirGlobalLeasesSingleRedis => Some(Scenario::WeirGlobalLeases),
            _ => None,
        }
    }

    /// The scenario this one repeats with a slower bridge or another Redis, if any.
    pub fn twin(self) -> Option<Scenario> {
        self.slowed().map(|(same, _)| same).or(self.single_redis())
    }

    /// A scenario that is another one with a slower bridge: that scenario, and the time a
    /// delaying proxy ([`weir_e2e::slow_proxy`]) between Envoy and weir-bridge adds to every
    /// round trip. Its config and traffic are the other scenario's.
    pub fn slowed(self) -> Option<(Scenario, Duration)> {
        match self {
            Scenario::WeirGlobalSaturatedSlow10 => {
                Some((Scenario::WeirGlobalSaturated, Duration::from_millis(10)))
            }
            Scenario::WeirGlobalSaturatedSlow30 => {
                Some((Scenario::WeirGlobalSaturated, Duration::from_millis(30)))
            }
            _ => None,
        }
    }

    /// Whether the scenario's Envoy calls weir-bridge: weir's global scenarios and the
    /// bridge-call floors.
    pub fn calls_bridge(self) -> bool {
        self.is_global() || self.is_bridge_call_floor()
    }

    /// The empty filter making weir-global-exact's bridge call (issue 21, item 4).
    pub fn is_bridge_call_floor(self) -> bool {
        matches!(
            self,
            Scenario::BridgeCallFloor | Scenario::BridgeCallFloorH2
        )
    }

    /// weir's plugin configuration, for the weir scenarios, at `"stats": "all"`: the
    /// benchmark reads the VM's boundary counters (`vm.*`), which only that level defines.
    pub fn plugin_config(self) -> Option<String> {
        if let Some(same) = self.twin() {
            return same.plugin_config();
        }
        let json = match self {
            Scenario::WeirLocal => {
                r#"{"rules": [{"name": "per-user", "key": [{"header": "x-user"}],
  "limit": {"algorithm": "gcra", "rate": 1000, "period": "1s", "burst": 100}, "max_keys": 10000}]}"#
                    .to_string()
            }
            Scenario::WeirLocalExact => {
                r#"{"rules": [{"name": "per-user", "key": [{"header": "x-user"}],
  "limit": {"algorithm": "gcra", "rate": 1000, "period": "1s", "burst": 100}, "max_keys": 10000,
  "reservoir": {"max": 1}}]}"#
                    .to_string()
            }
            Scenario::WeirLocalHot => {
                r#"{"rules": [{"name": "per-tenant", "key": [{"header": "x-tenant"}],
  "limit": {"algorithm": "gcra", "rate": 100000, "period": "1s", "burst": 9999}}]}"#
                    .to_string()
            }
            Scenario::WeirLocalHalf => {
                r#"{"rules": [{"name": "per-user", "key": [{"header": "x-user"}],
  "limit": {"algorithm": "gcra", "rate": 1, "period": "1d", "burst": 0}, "max_keys": 1000000}]}"#
                    .to_string()
            }
            Scenario::WeirNoMatch => r#"{"rules": [{"name": "never", "match": {"path": {"prefix": "/never/"}},
  "key": [{"header": "x-user"}], "limit": {"algorithm": "gcra", "rate": 1000, "period": "1s", "burst": 100}}]}"#
                .to_string(),
            Scenario::WeirUnkeyed => r#"{"rules": [{"name": "all",
  "limit": {"algorithm": "gcra", "rate": 1000000, "period": "1s", "burst": 1000000}}]}"#
                .to_string(),
            Scenario::WeirGlobalExact | Scenario::WeirGlobalExactH2 => format!(
                r#"{{{BRIDGE}, "rules": [{{"name": "per-tenant", "key": [{{"header": "x-tenant"}}],
  "scope": "global", {GLOBAL_LIMIT}}}]}}"#
            ),
            Scenario::WeirGlobalLeases => format!(
                r#"{{{BRIDGE}, "rules": [{{"name": "per-tenant", "key": [{{"header": "x-tenant"}}],
  "scope": "global", {GLOBAL_LIMIT}, "global": {{"lease": {{"max": 1000, "ttl": "900ms"}}}}}}]}}"#
            ),
            Scenario::WeirGlobalSaturated => format!(
                r#"{{{BRIDGE}, "rules": [{{"name": "hot", "scope": "global",
  "limit": {{"algorithm": "gcra", "rate": 1000, "period": "1s", "burst": 99}},
  "global": {{"lease": {{"max": 50, "ttl": "20ms", "horizon": "100ms"}}}}}}]}}"#
            ),
            _ => return None,
        };
        Some(with_stats(&json, "all"))
    }

    /// The bootstrap of this scenario's Envoy; `bridge_port` is where its bridge cluster
    /// points (a delaying proxy's port for a [`Scenario::slowed`] one), `rls` the peers'
    /// rate limit services.
    pub fn bootstrap(
        self,
        wasm: &Wasm,
        bridge_port: Option<u16>,
        rls: Option<&RlsServices>,
    ) -> Bootstrap {
        let mut b = Bootstrap::new();
        if self.upstream_hop() {
            let service = self.rls().map(|limit| {
                let services =
                    rls.unwrap_or_else(|| panic!("{} needs its rate limit service", self.id()));
                (limit, services.port(limit))
            });
            return peers::upstream_hop(b, service);
        }
        match self {
            Scenario::NoFilter => {}
            Scenario::Native => b = b.http_filter(NATIVE_LOCAL_RATELIMIT),
            Scenario::NativeLimited => {
                b = b.http_filter(
                    NATIVE_LOCAL_RATELIMIT
                        .replace("max_tokens: 1000000000", "max_tokens: 1000")
                        .replace("tokens_per_fill: 1000000000", "tokens_per_fill: 1000"),
                )
            }
            Scenario::EmptyWasm => b = b.http_filter(wasm_filter_yaml("{}", &wasm.empty)),
            Scenario::HostCallFloor => {
                b = b.http_filter(wasm_filter_yaml(HOST_CALL_FLOOR, &wasm.empty))
            }
            Scenario::BridgeCallFloor | Scenario::BridgeCallFloorH2 => {
                b = b.http_filter(wasm_filter_yaml(BRIDGE_CALL_FLOOR, &wasm.empty))
            }
            _ => {
                let config = self.plugin_config().unwrap_or_default();
                b = b.http_filter(wasm_filter_yaml(&config, &wasm.weir));
            }
        }
        if self.calls_bridge() {
            let port = bridge_port.unwrap_or_else(|| panic!("{} needs a bridge", self.id()));
            let h2 = matches!(
                self,
                Scenario::WeirGlobalExactH2 | Scenario::BridgeCallFloorH2
            );
            let protocol = if h2 {
                BridgeProtocol::Http2
            } else {
                BridgeProtocol::Http1
            };
            b = b.cluster(bridge_cluster_yaml_with(port, protocol));
        }
        b
    }
}

/// The empty filter's steps for [`Scenario::HostCallFloor`]: weir-local's rule has
/// `max_keys` 10,000, so 2,500 sets of 4 slots.
const HOST_CALL_FLOOR: &str = "time, header:x-user, shared_cas:2500";

/// The empty filter's steps for [`Scenario::BridgeCallFloor`]: weir-global-exact's call,
/// to the cluster its bridge settings name (`weir_bridge`, as `BRIDGE`).
pub const BRIDGE_CALL_FLOOR: &str = "call:weir_bridge:/v2/acquire";

/// Envoy's own local rate limit (Envoy 1.40 fields), with a bucket nothing can empty:
/// 10⁹ tokens, refilled every second, on every request (enabled and enforced at 100 %).
pub const NATIVE_LOCAL_RATELIMIT: &str = r#"- name: envoy.filters.http.local_ratelimit
  typed_config:
    "@type": type.googleapis.com/envoy.extensions.filters.http.local_ratelimit.v3.LocalRateLimit
    stat_prefix: bench_local_rate_limit
    token_bucket:
      max_tokens: 1000000000
      tokens_per_fill: 1000000000
      fill_interval: 1s
    filter_enabled:
      runtime_key: bench_local_rate_limit_enabled
      default_value: { numerator: 100, denominator: HUNDRED }
    filter_enforced:
      runtime_key: bench_local_rate_limit_enforced
      default_value: { numerator: 100, denominator: HUNDRED }
"#;

/// The two filters under test.
#[derive(Clone, Debug)]
pub struct Wasm {
    pub weir: PathBuf,
    pub empty: PathBuf,
}

impl Wasm {
    /// `weir.wasm` as weir-e2e finds it, and the empty filter next to it (or
    /// `$WEIR_EMPTY_WASM`).
    pub fn locate() -> Wasm {
        let weir = weir_e2e::weir_wasm();
        let empty = std::env::var_os("WEIR_EMPTY_WASM")
            .map(PathBuf::from)
            .unwrap_or_else(|| sibling(&weir, "weir_empty_filter.wasm"));
        assert!(
            empty.is_file(),
            "the empty filter is not at {}: build it with \
             `cargo build -p weir-empty-filter --target wasm32-wasip1 --profile wasm`, \
             or set WEIR_EMPTY_WASM",
            empty.display()
        );
        Wasm { weir, empty }
    }
}

fn sibling(path: &Path, name: &str) -> PathBuf {
    path.parent()
        .map(|d| d.join(name))
        .unwrap_or_else(|| PathBuf::from(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A single-Redis scenario is its twin on another Redis and nothing else: same plugin
    /// config and traffic, global, in the default run, calling a bridge.
    #[test]
    fn a_single_redis_scenario_is_its_twin_on_another_redis() {
        let single: Vec<Scenario> = Scenario::ALL
            .into_iter()
            .filter(|s| s.single_redis().is_some())
            .collect();
        assert_eq!(single.len(), 2);
        for s in single {
            let twin = s.single_redis().unwrap();
            assert_eq!(s.twin(), Some(twin));
            assert!(
                twin.twin().is_none() && s.is_global() && s.calls_bridge(),
                "{s:?}"
            );
            assert_eq!(s.plugin_config(), twin.plugin_config(), "{s:?}");
            assert_eq!(s.traffic(), twin.traffic(), "{s:?}");
            assert!(s.id().starts_with(twin.id()) && s.id().ends_with("-single-redis"));
            assert_eq!(Scenario::from_id(s.id()), Some(s));
        }
    }

    /// A slowed scenario is its twin with a slower bridge and nothing else: same plugin
    /// config, same traffic, global, in the default run, and its twin is not slowed.
    #[test]
    fn a_slowed_scenario_is_its_twin_behind_a_delay() {
        let slowed: Vec<Scenario> = Scenario::ALL
            .into_iter()
            .filter(|s| s.slowed().is_some())
            .collect();
        assert_eq!(slowed.len(), 2);
        for s in slowed {
            let (twin, delay) = s.slowed().unwrap();
            assert!(twin.slowed().is_none(), "{s:?}");
            assert!(s.is_global() && twin.is_global(), "{s:?}");
            assert_eq!(s.plugin_config(), twin.plugin_config(), "{s:?}");
            assert_eq!(s.traffic(), twin.traffic(), "{s:?}");
            assert!(s.id().ends_with(&format!("-slow{}", delay.as_millis())));
            assert_eq!(Scenario::from_id(s.id()), Some(s));
            // A slow answer must stay an answer, not the failure mode (50 ms by default).
            let config = weir_core::config::parse(s.plugin_config().unwrap().as_bytes()).unwrap();
            let timeout_ms = config.bridge.unwrap().timeout_ms;
            assert!(
                timeout_ms >= delay.as_millis() as u64 + 200,
                "{s:?}: bridge.timeout {timeout_ms} ms"
            );
        }
    }
}
