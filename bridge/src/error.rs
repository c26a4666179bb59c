//! The one error type the handlers return, and how Redis errors are classified.
//!
//! A client learns the status and a short message: what was wrong with its request, or
//! the class of a Redis failure (`"redis unavailable (timeout)"`), never a Redis error
//! text, a node address or a key. The details go to the log.

use crate::store::CallError;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use redis::{ErrorKind, RedisError, ServerErrorKind};
use std::fmt;

/// Whether retrying later can succeed without anyone changing anything.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// The cluster is moving (failover, resharding, loading) or a node is unreachable:
    /// 503, and the filter applies its failure mode.
    Transient,
    /// A bug or a misconfiguration (script error, wrong type, auth, ACL): 500.
    Permanent,
}

/// Classifies a Redis error. Pure: decided from the error's kind and code only.
pub fn classify(err: &RedisError) -> ErrorClass {
    describe(err).0
}

/// An error's class, and a short, stable name for it (a metric label and the reply's
/// words), from one match so that the two cannot drift apart.
fn describe(err: &RedisError) -> (ErrorClass, &'static str) {
    use ErrorClass::{Permanent, Transient};
    match err.kind() {
        ErrorKind::Io => (Transient, "io"),
        ErrorKind::ClusterConnectionNotFound => (Transient, "no_connection"),
        ErrorKind::Server(kind) => match kind {
            ServerErrorKind::BusyLoading => (Transient, "loading"),
            ServerErrorKind::Moved | ServerErrorKind::Ask => (Transient, "moved"),
            ServerErrorKind::TryAgain => (Transient, "tryagain"),
            ServerErrorKind::ClusterDown => (Transient, "clusterdown"),
            ServerErrorKind::MasterDown => (Transient, "masterdown"),
            // A write on a master just demoted by a failover.
            ServerErrorKind::ReadOnly => (Transient, "readonly"),
            // The store answers NOSCRIPT by sending the script itself (EVAL), which
            // cannot answer NOSCRIPT; should one get here all the same, the node lost its
            // scripts, as a node does when it is replaced.
            ServerErrorKind::NoScript => (Transient, "noscript"),
            ServerErrorKind::NoPerm => (Permanent, "noperm"),
            _ => (Permanent, "server"),
        },
        ErrorKind::AuthenticationFailed => (Permanent, "auth"),
        // Codes the crate has no kind for. BUSY: another script runs too long on that
        // node; NOREPLICAS: min-replicas not met during a failover; UNBLOCKED: a blocked
        // client released by a role change.
        ErrorKind::Extension => match err.code() {
            Some("BUSY") => (Transient, "busy"),
            Some("NOREPLICAS") => (Transient, "noreplicas"),
            Some("UNBLOCKED") => (Transient, "unblocked"),
            _ => (Permanent, "server"),
        },
        _ => {
            if err.is_timeout() || err.is_connection_dropped() || err.is_connection_refusal() {
                (Transient, "client")
            } else {
                (Permanent, "client")
            }
        }
    }
}

/// Everything a request can fail with; each variant knows its HTTP status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApiError {
    /// 401: the shared secret is missing or wrong.
    Unauthorized,
    /// 413: the body is larger than the wire's limit.
    PayloadTooLarge,
    /// 400: bad JSON or a field that fails validation; the message names the field.
    BadRequest(String),
    /// 503: Redis did not answer in time, or the cluster is moving. `class` is short.
    Unavailable { class: &'static str },
    /// 500: Redis refused in a way retrying will not fix, or replied nonsense.
    Internal { class: &'static str },
}

impl ApiError {
    pub fn from_redis(err: &RedisError) -> ApiError {
        match describe(err) {
            (ErrorClass::Transient, class) => ApiError::Unavailable { class },
            (ErrorClass::Permanent, class) => ApiError::Internal { class },
        }
    }

    /// What a failed script call or PING tells the client.
    pub fn from_call(err: &CallError) -> ApiError {
        match err {
            CallError::Timeout => ApiError::Unavailable { class: "timeout" },
            CallError::Redis(err) => ApiError::from_redis(err),
            CallError::BadReply(_) => ApiError::Internal { class: "bad_reply" },
        }
    }

    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::Unauthorized => StatusCode::UNAUTHORIZED,
            ApiError::PayloadTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ApiError::Unavailable { .. } => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Internal { .. } => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The label of the `errors_total` metric.
    pub fn metric_class(&self) -> &'static str {
        match self {
            ApiError::Unauthorized => "unauthorized",
            ApiError::PayloadTooLarge => "too_large",
            ApiError::BadRequest(_) => "bad_request",
            ApiError::Unavailable { class } | ApiError::Internal { class } => class,
        }
    }
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ApiError::Unauthorized => {
                write!(f, "missing or wrong {}", weir_protocol::wire::SECRET_HEADER)
            }
            ApiError::PayloadTooLarge => write!(
                f,
                "body larger than {} bytes",
                weir_protocol::bounds::MAX_BODY_BYTES
            ),
            ApiError::BadRequest(message) => f.write_str(message),
            ApiError::Unavailable { class } => write!(f, "redis unavailable ({class})"),
            ApiError::Internal { class } => write!(f, "redis error ({class})"),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({ "error": self.to_string() });
        (self.status(), Json(body)).into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server error reply as the crate parses it off the wire.
    fn server(reply: &str) -> RedisError {
        let wire = format!("-{reply}\r\n");
        match redis::parse_redis_value(wire.as_bytes()) {
            Ok(value) => value.extract_error().unwrap_err(),
            Err(err) => err,
        }
    }

    fn io(kind: std::io::ErrorKind) -> RedisError {
        RedisError::from(std::io::Error::from(kind))
    }

    #[test]
    fn cluster_movement_and_connection_trouble_are_transient() {
        for reply in [
            "CLUSTERDOWN The cluster is down",
            "TRYAGAIN Multiple keys request during rehashing of slot",
            "MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.",
            "LOADING Redis is loading the dataset in memory",
            "MOVED 3999 127.0.0.1:6381",
            "ASK 3999 127.0.0.1:6381",
            "READONLY You can't write against a read only replica.",
            "BUSY Redis is busy running a script.",
            "NOSCRIPT No matching script.",
        ] {
            assert_eq!(classify(&server(reply)), ErrorClass::Transient, "{reply}");
        }
        for kind in [
            std::io::ErrorKind::ConnectionRefused,
            std::io::ErrorKind::ConnectionReset,
            std::io::ErrorKind::TimedOut,
            std::io::ErrorKind::BrokenPipe,
            std::io::ErrorKind::UnexpectedEof,
        ] {
            assert_eq!(classify(&io(kind)), ErrorClass::Transient, "{kind:?}");
        }
        let no_conn = RedisError::from((ErrorKind::ClusterConnectionNotFound, "no conn"));
        assert_eq!(classify(&no_conn), ErrorClass::Transient);
    }

    #[test]
    fn bugs_and_misconfiguration_are_permanent() {
        for reply in [
            "ERR user_script:1: Script attempted to access nonexistent global variable 'x'",
            "WRONGTYPE Operation against a key holding the wrong kind of value",
            "CROSSSLOT Keys in request don't hash to the same slot",
            "NOPERM this user has no permissions to run the 'evalsha' command",
            "WRONGPASS invalid username-password pair or user is disabled.",
        ] {
            assert_eq!(classify(&server(reply)), ErrorClass::Permanent, "{reply}");
        }
        let typed = RedisError::from((ErrorKind::UnexpectedReturnType, "bad reply"));
        assert_eq!(classify(&typed), ErrorClass::Permanent);
        let auth = RedisError::from((ErrorKind::AuthenticationFailed, "auth"));
        assert_eq!(classify(&auth), ErrorClass::Permanent);
    }

    #[test]
    fn replies_name_the_class_only() {
        let err = ApiError::from_redis(&server("CLUSTERDOWN The cluster is down"));
        assert_eq!(err.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(err.to_string(), "redis unavailable (clusterdown)");
        let err = ApiError::from_redis(&server("ERR user_script:1: secret detail"));
        assert_eq!(err.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(err.to_string(), "redis error (server)");
        assert_eq!(
            ApiError::Unauthorized.to_string(),
            "missing or wrong x-weir-secret"
        );
    }
}
