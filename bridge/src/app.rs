//! The HTTP surface: `POST /v1/acquire`, `GET /healthz`, `GET /metrics`.

use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::scripts::Invocation;
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
use std::sync::Arc;
use subtle::ConstantTimeEq;
use weir_core::bounds::MAX_BODY_BYTES;
use weir_core::wire::{AcquireRequest, AcquireResponse, ItemResult, ACQUIRE_PATH, SECRET_HEADER};

/// The shared secret, kept as its SHA-256 so that the comparison takes the same time
/// whatever the length or content of what a client sends.
#[derive(Clone)]
pub struct Secret([u8; 32]);

impl Secret {
    pub fn new(secret: &str) -> Secret {
        Secret(Sha256::digest(secret.as_bytes()).into())
    }

    fn matches(&self, presented: &[u8]) -> bool {
        let digest: [u8; 32] = Sha256::digest(presented).into();
        bool::from(digest.ct_eq(&self.0))
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

/// What every handler shares.
#[derive(Clone)]
pub struct AppState {
    pub store: RedisStore,
    pub secret: Option<Secret>,
    pub metrics: Arc<Metrics>,
}

/// The bridge's routes, with request counting.
pub fn app(state: AppState) -> Router {
    Router::new()
        .route(
            ACQUIRE_PATH,
            post(acquire).layer(DefaultBodyLimit::max(MAX_BODY_BYTES)),
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

async fn acquire(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<AcquireResponse>, ApiError> {
    let result = decide(&state, &headers, body).await;
    if let Err(err) = &result {
        state.metrics.error(err.metric_class());
    }
    result.map(Json)
}

async fn decide(
    state: &AppState,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<AcquireResponse, ApiError> {
    if let Some(secret) = &state.secret {
        let presented = headers.get(SECRET_HEADER).map(|v| v.as_bytes());
        if !presented.is_some_and(|p| secret.matches(p)) {
            return Err(ApiError::Unauthorized);
        }
    }
    let body = body.map_err(|rejection| {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::PayloadTooLarge
        } else {
            ApiError::BadRequest(format!("cannot read the body: {}", rejection.body_text()))
        }
    })?;
    // Validation includes what the Lua scripts cannot compute exactly: the config
    // checker refuses the same (one definition, in the core).
    let (request, limits) =
        AcquireRequest::parse(&body).map_err(|e| ApiError::BadRequest(e.to_string()))?;

    let mut now_us = None;
    let mut items = Vec::with_capacity(request.items.len());
    // In order, stopping after the first denial: the items after it are not charged.
    for (item, limit) in request.items.iter().zip(&limits) {
        let inv = Invocation::for_limit(
            limit,
            &request.domain,
            &item.rule,
            &item.descriptor,
            0,
            item.cost,
            item.want,
        );
        let reply = state.store.run(&inv).await.map_err(|err| {
            let api = ApiError::from_call(&err);
            match &err {
                CallError::Timeout => {
                    tracing::warn!(rule = %item.rule, algorithm = %inv.kind, "redis call timed out")
                }
                CallError::Redis(err) => {
                    tracing::warn!(rule = %item.rule, algorithm = %inv.kind, error = %err, status = %api.status(), "redis call failed")
                }
                CallError::BadReply(why) => {
                    tracing::error!(rule = %item.rule, algorithm = %inv.kind, why, "bad script reply")
                }
            }
            api
        })?;
        now_us.get_or_insert(reply.now_us);
        let result = reply.item;
        state
            .metrics
            .decision(&item.rule, result.allowed, result.granted);
        items.push(ItemResult {
            lease_ttl_ns: if result.allowed && result.granted > 0 {
                limit.lease_ttl_ns(reply.now_us)
            } else {
                None
            },
            ..result
        });
        if !result.allowed {
            break;
        }
    }
    Ok(AcquireResponse {
        // The Redis time of the first item (each item's node reads its own clock).
        now_us: now_us.unwrap_or(0),
        items,
    })
}

async fn healthz(State(state): State<AppState>) -> Response {
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
