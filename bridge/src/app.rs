//! The HTTP surface: `POST /v2/acquire` (and `/v1/acquire` for older filters),
//! `POST /v3/commit`, `GET /healthz`, `GET /metrics`.

use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::scripts::{Invocation, ScriptReply, Settle};
use crate::store::{CallError, RedisStore};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use sha2::{Digest, Sha256};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use subtle::{Choice, ConstantTimeEq};
use weir_protocol::algorithms::Ask;
use weir_protocol::bounds::MAX_BODY_BYTES;
use weir_protocol::wire::{v1, v2, v3, CheckedItem, SECRET_HEADER};

/// The shared secret a call must present, kept as its SHA-256 so that the comparison
/// takes the same time whatever the length or content of what a client sends; during a
/// rotation, the next secret too, and either is accepted.
#[derive(Clone)]
pub struct Secret {
    current: [u8; 32],
    next: Option<[u8; 32]>,
}

impl Secret {
    pub fn new(secret: &str) -> Secret {
        Secret {
            current: Sha256::digest(secret.as_bytes()).into(),
            next: None,
        }
    }

    /// Accepts `next` as well: the secret the filters move to during a rotation.
    pub fn with_next(self, next: &str) -> Secret {
        Secret {
            next: Some(Sha256::digest(next.as_bytes()).into()),
            ..self
        }
    }

    /// Whether a next secret is accepted too (a rotation is under way).
    pub fn has_next(&self) -> bool {
        self.next.is_some()
    }

    /// Whether `presented` is the secret (or the next one). Both are compared every time,
    /// in constant time, so the time taken does not say which one matched.
    pub fn accepts(&self, presented: &[u8]) -> bool {
        let digest: [u8; 32] = Sha256::digest(presented).into();
        let current = digest.ct_eq(&self.current);
        let next = self
            .next
            .map_or(Choice::from(0), |next| digest.ct_eq(&next));
        bool::from(current | next)
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

/// Whether the bridge is shutting down: from the first signal on, `/healthz` answers 503
/// `draining` so that load balancers take this replica out before its listener closes,
/// while every other path is served as before. Clones share one flag.
#[derive(Clone, Debug, Default)]
pub struct Draining(Arc<AtomicBool>);

impl Draining {
    pub fn start(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    pub fn is_on(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// What every handler shares.
#[derive(Clone)]
pub struct AppState {
    pub store: RedisStore,
    pub secret: Option<Secret>,
    pub metrics: Arc<Metrics>,
    pub draining: Draining,
}

/// What the bridge serves on: `listener`, every connection it accepts with `TCP_NODELAY`.
/// Over HTTP/2 a response is a HEADERS frame and a DATA frame, each its own write; with
/// Nagle's algorithm the second waits until the first is acknowledged, and Envoy, with
/// nothing to send back, delays that acknowledgement up to 40 ms: that was the HTTP/2
/// p99 of the benchmark's bridge calls (about 40 ms against 2 over HTTP/1.1, whose
/// response is one write).
pub fn nodelay_listener(
    listener: tokio::net::TcpListener,
) -> impl axum::serve::Listener<Io = tokio::net::TcpStream, Addr = std::net::SocketAddr> {
    use axum::serve::ListenerExt;
    listener.tap_io(|stream| {
        if let Err(e) = stream.set_nodelay(true) {
            tracing::warn!(error = %e, "cannot set TCP_NODELAY on a connection: HTTP/2 answers may wait for a delayed ACK");
        }
    })
}

/// The bridge's routes, with request counting.
pub fn app(state: AppState) -> Router {
    Router::new()
        .route(
            v2::ACQUIRE_PATH,
            post(acquire_v2).layer(DefaultBodyLimit::max(MAX_BODY_BYTES)),
        )
        .route(
            v3::COMMIT_PATH,
            post(commit_v3).layer(DefaultBodyLimit::max(MAX_BODY_BYTES)),
        )
        .route(
            v1::ACQUIRE_PATH,
            post(acquire_v1).layer(DefaultBodyLimit::max(MAX_BODY_BYTES)),
        )
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            count_requests,
        ))
        .with_state(state)
}

async fn count_requests(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let response = next.run(request).await;
    state.metrics.request(response.status().as_u16());
    response
}

/// `POST /v2/acquire`: every item decided in order, up to the first denied item that is
/// not shadow.
async fn acquire_v2(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<v2::Reply>, ApiError> {
    counted(&state, decide_v2(&state, &headers, body).await)
}

async fn decide_v2(
    state: &AppState,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<v2::Reply, ApiError> {
    let body = authorized_body(state, headers, body)?;
    let request = v2::Request::parse(&body).map_err(|e| ApiError::BadRequest(e.to_string()))?;
    let mut items = Vec::with_capacity(request.items.len());
    for CheckedItem { item, limit } in &request.items {
        let (domain, rule, descriptor) = (&request.domain, &item.rule, &item.descriptor);
        let inv = match &item.share {
            Some(share) => {
                Invocation::for_share(limit, domain, rule, descriptor, 0, (share, item.ask()))
            }
            None => Invocation::for_limit(limit, domain, rule, descriptor, 0, item.ask())
                .keeping_interval(item.limit_from_request),
        };
        let reply = run_item(state, rule, &inv).await?;
        items.push(v2::Granted::new(item.id, &reply.grant, reply.now_us));
        if !reply.grant.decision.allowed && !item.shadow {
            break;
        }
    }
    Ok(v2::Reply { items })
}

/// `POST /v3/commit`: every item settled on its own, in order, answered with its id.
async fn commit_v3(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<v3::CommitReply>, ApiError> {
    counted(&state, settle_v3(&state, &headers, body).await)
}

async fn settle_v3(
    state: &AppState,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<v3::CommitReply, ApiError> {
    let body = authorized_body(state, headers, body)?;
    let request =
        v3::CommitRequest::parse(&body).map_err(|e| ApiError::BadRequest(e.to_string()))?;
    let mut items = Vec::with_capacity(request.items.len());
    for CheckedItem { item, limit } in &request.items {
        let settle = Settle {
            counted_at_us: item.counted_at_us,
            reserved: item.reserved,
            actual: item.actual,
        };
        let inv = match &item.share_key {
            Some(key) => {
                let parent = (
                    request.domain.as_str(),
                    item.rule.as_str(),
                    item.descriptor.as_slice(),
                );
                Invocation::settle_share(limit, parent, key, 0, settle)
            }
            None => Invocation::settle(
                limit,
                &request.domain,
                &item.rule,
                &item.descriptor,
                0,
                settle,
            ),
        };
        let (changed, _) = state.store.run_settle(&inv).await.map_err(|err| {
            let api = ApiError::from_call(&err);
            tracing::warn!(rule = %item.rule, algorithm = %inv.kind, error = ?err, "settle failed");
            api
        })?;
        state.metrics.commit(&item.rule, changed);
        items.push(v3::Committed {
            id: item.id,
            settled: changed,
        });
    }
    Ok(v3::CommitReply { items })
}

/// `POST /v1/acquire`, for filters before v2: in order, stopping after the first denial;
/// leases as v1 knew them (no hold, `lease_ttl_ns` from the algorithm's windows).
async fn acquire_v1(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<v1::AcquireResponse>, ApiError> {
    counted(&state, decide_v1(&state, &headers, body).await)
}

async fn decide_v1(
    state: &AppState,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<v1::AcquireResponse, ApiError> {
    let body = authorized_body(state, headers, body)?;
    let request =
        v1::AcquireRequest::parse(&body).map_err(|e| ApiError::BadRequest(e.to_string()))?;
    let mut now_us = None;
    let mut items = Vec::with_capacity(request.items.len());
    for CheckedItem { item, limit } in &request.items {
        let ask = Ask::exact(item.cost).with_want(item.want);
        let inv =
            Invocation::for_limit(limit, &request.domain, &item.rule, &item.descriptor, 0, ask);
        let reply = run_item(state, &item.rule, &inv).await?;
        now_us.get_or_insert(reply.now_us);
        let d = reply.grant.decision;
        items.push(v1::ItemResult {
            allowed: d.allowed,
            granted: reply.grant.granted,
            limit: d.limit,
            remaining: d.remaining,
            retry_after_ns: d.retry_after_ns,
            reset_after_ns: d.reset_after_ns,
            lease_ttl_ns: if d.allowed && reply.grant.granted > 0 {
                limit.lease_ttl_ns(reply.now_us)
            } else {
                None
            },
        });
        if !d.allowed {
            break;
        }
    }
    Ok(v1::AcquireResponse {
        // The Redis time of the first item (each item's node reads its own clock).
        now_us: now_us.unwrap_or(0),
        items,
    })
}

/// Counts a failed call by its class, and turns the reply into JSON.
fn counted<T>(state: &AppState, result: Result<T, ApiError>) -> Result<Json<T>, ApiError> {
    if let Err(err) = &result {
        state.metrics.error(err.metric_class());
    }
    result.map(Json)
}

/// The body of a call that presents the secret, when the bridge has one.
fn authorized_body(
    state: &AppState,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Bytes, ApiError> {
    if let Some(secret) = &state.secret {
        let presented = headers.get(SECRET_HEADER).map(|v| v.as_bytes());
        if !presented.is_some_and(|p| secret.accepts(p)) {
            return Err(ApiError::Unauthorized);
        }
    }
    body.map_err(|rejection| {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::PayloadTooLarge
        } else {
            ApiError::BadRequest(format!("cannot read the body: {}", rejection.body_text()))
        }
    })
}

/// Runs one item's script (validation already refused what Lua cannot compute exactly,
/// as the config checker does), counts its decision, and maps a failure to the reply.
async fn run_item(state: &AppState, rule: &str, inv: &Invocation) -> Result<ScriptReply, ApiError> {
    let reply = state.store.run(inv).await.map_err(|err| {
        let api = ApiError::from_call(&err);
        match &err {
            CallError::Timeout => {
                tracing::warn!(rule = %rule, algorithm = %inv.kind, "redis call timed out")
            }
            CallError::Redis(err) => {
                tracing::warn!(rule = %rule, algorithm = %inv.kind, error = %err, status = %api.status(), "redis call failed")
            }
            CallError::BadReply(why) => {
                tracing::error!(rule = %rule, algorithm = %inv.kind, why, "bad script reply")
            }
        }
        api
    })?;
    state
        .metrics
        .decision(rule, reply.grant.decision.allowed, reply.grant.granted);
    Ok(reply)
}

/// `GET /healthz`, the readiness of this replica: 503 `draining` once it is shutting
/// down; else 200 `ok` when a Redis node it is connected to answers PING, 503 when none
/// does (this replica cannot reach Redis at all). A shard that is down fails its own
/// keys' calls (503) and leaves readiness alone: every replica shares it, so taking them
/// out of service would only fail the keys of the shards that still answer.
async fn healthz(State(state): State<AppState>) -> Response {
    if state.draining.is_on() {
        return (StatusCode::SERVICE_UNAVAILABLE, "draining").into_response();
    }
    match state.store.ping().await {
        Ok(()) => (StatusCode::OK, "ok").into_response(),
        Err(err) => {
            let class = ApiError::from_call(&err).metric_class();
            tracing::warn!(class, "health check: redis did not answer PING");
            (
                StatusCode::SERVICE_UNAVAILABLE,
                format!("redis unavailable ({class})"),
            )
                .into_response()
        }
    }
}

async fn metrics(State(state): State<AppState>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        state.metrics.render(),
    )
        .into_response()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use axum::serve::Listener;

    /// Without `TCP_NODELAY` an HTTP/2 answer's DATA frame waits for Envoy's delayed ACK.
    #[tokio::test]
    async fn every_connection_the_bridge_accepts_has_nodelay() {
        let bound = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = bound.local_addr().unwrap();
        let mut listener = nodelay_listener(bound);
        let _client = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (stream, _) = listener.accept().await;
        assert!(stream.nodelay().unwrap());
    }
}
