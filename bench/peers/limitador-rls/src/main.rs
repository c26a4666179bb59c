//! Envoy's rate limit service (`envoy.service.ratelimit.v3.RateLimitService`) on Kuadrant's
//! limitador engine (the `limitador` crate), as the benchmark's peer: what Envoy's global
//! rate limit filter (`envoy.filters.http.ratelimit`) calls on every request. This is the
//! limitador engine behind a thin adapter, not envoyproxy/ratelimit and not
//! limitador-server.
//!
//! ```text
//! limitador-rls --listen 127.0.0.1:8089 --redis redis://127.0.0.1:6379 \
//!     --storage async|cached --domain bench --key x-user --limit 1000 --seconds 1
//! ```
//!
//! One limit: `--limit` hits per `--seconds` for each value of the request's descriptor
//! entry `--key` in the domain `--domain`. A request whose domain is another, or whose
//! first descriptor lacks the key, is not limited (limitador finds no counter for it).
//! Storages: `async` (`AsyncRedisStorage`: Redis on every hit) and `cached`
//! (`CachedRedisStorage`: counters cached in the process, flushed to Redis in batches).

use std::collections::HashMap;
use std::net::SocketAddr;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use limitador::limit::{Context, Expression, Limit, Namespace};
use limitador::storage::redis::{AsyncRedisStorage, CachedRedisStorageBuilder};
use limitador::AsyncRateLimiter;
use tonic::{Request, Response, Status};

struct Settings {
    listen: SocketAddr,
    redis: String,
    cached: bool,
    domain: String,
    key: String,
    limit: u64,
    seconds: u64,
}

const USAGE: &str = "usage: limitador-rls --listen ADDR --redis URL --storage async|cached \
--domain NAME --key DESCRIPTOR_KEY --limit N --seconds S";

fn settings(args: &[String]) -> Result<Settings, String> {
    let mut values: HashMap<&str, &str> = HashMap::new();
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let name = flag
            .strip_prefix("--")
            .ok_or_else(|| format!("{flag:?}: not a flag\n{USAGE}"))?;
        let value = it.next().ok_or_else(|| format!("--{name} needs a value"))?;
        values.insert(name, value);
    }
    let get = |name: &str| {
        values
            .get(name)
            .copied()
            .ok_or_else(|| format!("--{name} is missing\n{USAGE}"))
    };
    let number = |name: &str| -> Result<u64, String> {
        let text = get(name)?;
        text.parse()
            .ok()
            .filter(|&n| n > 0)
            .ok_or_else(|| format!("--{name} {text:?}: not a whole number above 0"))
    };
    let cached = match get("storage")? {
        "async" => false,
        "cached" => true,
        other => return Err(format!("--storage {other:?}: async or cached")),
    };
    Ok(Settings {
        listen: get("listen")?
            .parse()
            .map_err(|e| format!("--listen: {e}"))?,
        redis: get("redis")?.to_string(),
        cached,
        domain: get("domain")?.to_string(),
        key: get("key")?.to_string(),
        limit: number("limit")?,
        seconds: number("seconds")?,
    })
}

struct Service {
    limiter: AsyncRateLimiter,
    namespace: Namespace,
}

#[tonic::async_trait]
impl RateLimitService for Service {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let request = request.into_inner();
        let mut overall = Code::Ok;
        if request.domain == self.namespace.as_ref() {
            // The descriptors as limitador-server binds them: `descriptors[i][key]`.
            let descriptors: Vec<HashMap<String, String>> = (request.descriptors.iter())
                .map(|d| {
                    (d.entries.iter())
                        .map(|e| (e.key.clone(), e.value.clone()))
                        .collect()
                })
                .collect();
            let mut ctx = Context::default();
            ctx.list_binding("descriptors".to_string(), descriptors);
            let hits = u64::from(request.hits_addend.max(1));
            let checked = self
                .limiter
                .check_rate_limited_and_update(&self.namespace, &ctx, hits)
                .await
                .map_err(|e| Status::unavailable(format!("limitador: {e}")))?;
            if checked.limited {
                overall = Code::OverLimit;
            }
        }
        Ok(Response::new(RateLimitResponse {
            overall_code: overall as i32,
            ..RateLimitResponse::default()
        }))
    }
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let settings = match settings(&args) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("limitador-rls: {e}");
            std::process::exit(2);
        }
    };
    if let Err(e) = serve(settings).await {
        eprintln!("limitador-rls: {e}");
        std::process::exit(1);
    }
}

async fn serve(s: Settings) -> Result<(), String> {
    let limiter = if s.cached {
        let storage = CachedRedisStorageBuilder::new(&s.redis)
            .build()
            .await
            .map_err(|e| format!("cached Redis storage at {}: {e}", s.redis))?;
        AsyncRateLimiter::new_with_storage(Box::new(storage))
    } else {
        let storage = AsyncRedisStorage::new(&s.redis)
            .await
            .map_err(|e| format!("Redis storage at {}: {e}", s.redis))?;
        AsyncRateLimiter::new_with_storage(Box::new(storage))
    };
    let variable = format!("descriptors[0][{:?}]", s.key);
    let variable = Expression::parse(&variable).map_err(|e| format!("--key {:?}: {e:?}", s.key))?;
    let namespace = Namespace::from(s.domain.as_str());
    limiter.add_limit(Limit::new(
        namespace.clone(),
        s.limit,
        s.seconds,
        [],
        [variable],
    ));
    eprintln!(
        "limitador-rls serving on {} ({} storage at {}): {} per {} s per {} in {}",
        s.listen,
        if s.cached { "cached" } else { "async" },
        s.redis,
        s.limit,
        s.seconds,
        s.key,
        s.domain
    );
    tonic::transport::Server::builder()
        .add_service(RateLimitServiceServer::new(Service { limiter, namespace }))
        .serve_with_shutdown(s.listen, async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await
        .map_err(|e| format!("serving on {}: {e}", s.listen))
}
