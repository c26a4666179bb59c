//! What a client sees: the denial (429, or gRPC RESOURCE_EXHAUSTED), `Retry-After`,
//! RateLimit headers and the JSON body.
//!
//! Header styles:
//! - `ietf` (draft-ietf-httpapi-ratelimit-headers, structured fields):
//!   `RateLimit-Policy: "per-user";q=100;w=60` and `RateLimit: "per-user";r=42;t=17`,
//!   one list member per enforcing rule that applied to the request.
//! - `legacy`: `X-RateLimit-Limit`, `X-RateLimit-Remaining`, `X-RateLimit-Reset` for the
//!   most restrictive rule (the one that denied, else the one with least remaining).
//! - `none`.
//!
//! Times are whole seconds rounded up, so a client that waits what it is told is never
//! early. Shadow rules never show in headers (clients must not see limits that are not
//! enforced); `shadow_header`, when set, names the shadow rules that would have denied.

use crate::algorithms::{Decision, Policy};
use std::fmt::Write as _;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeaderStyle {
    Ietf,
    Legacy,
    None,
}

/// Which requests carry weir's decisions in Envoy filter state (`wasm.weir.rule`,
/// `wasm.weir.decisions`), for access logs and later filters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FilterState {
    /// Denied requests only, and only `wasm.weir.rule` (one host call on the denial
    /// path): what the shipped access log prints.
    Rule,
    /// Denied requests only, both entries (two host calls on the denial path).
    Denied,
    /// Every request a rule applied to.
    All,
    None,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResponseSettings {
    /// HTTP status of a denial (gRPC requests always get 200 + `grpc-status: 8`).
    pub status: u16,
    pub header_style: HeaderStyle,
    /// Also put the RateLimit headers on responses that were allowed.
    pub headers_on_allowed: bool,
    /// Replaces the JSON body of a denial.
    pub body: Option<CustomBody>,
    /// Response header naming the shadow rules that would have denied the request.
    pub shadow_header: Option<String>,
    pub filter_state: FilterState,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CustomBody {
    pub content_type: String,
    pub text: String,
}

impl Default for ResponseSettings {
    fn default() -> Self {
        ResponseSettings {
            status: 429,
            header_style: HeaderStyle::Ietf,
            headers_on_allowed: false,
            body: None,
            shadow_header: None,
            filter_state: FilterState::Rule,
        }
    }
}

/// One enforcing rule's verdict on a request, as the headers report it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RuleVerdict<'a> {
    pub rule: &'a str,
    pub decision: Decision,
    pub policy: Policy,
}

/// A response the filter sends instead of forwarding the request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Denial {
    pub status: u16,
    pub headers: Vec<(&'static str, String)>,
    pub body: Vec<u8>,
    /// `Some(8)` (RESOURCE_EXHAUSTED) for gRPC requests; the status is then 200.
    pub grpc_status: Option<u32>,
    pub grpc_message: Option<String>,
}

pub const GRPC_RESOURCE_EXHAUSTED: u32 = 8;
pub const GRPC_UNAVAILABLE: u32 = 14;

/// Whole seconds, rounded up.
pub fn ceil_seconds(ns: u64) -> u64 {
    ns.div_ceil(1_000_000_000)
}

/// The verdict that denied the request: evaluation stops at the first enforcing denial,
/// so there is at most one.
fn denying<'v, 'a>(verdicts: &'v [RuleVerdict<'a>]) -> Option<&'v RuleVerdict<'a>> {
    verdicts.iter().find(|v| !v.decision.allowed)
}

/// The RateLimit headers for `verdicts` in `style` (empty for `None` or no verdicts).
pub fn rate_limit_headers(
    style: HeaderStyle,
    verdicts: &[RuleVerdict<'_>],
) -> Vec<(&'static str, String)> {
    if verdicts.is_empty() {
        return Vec::new();
    }
    match style {
        HeaderStyle::None => Vec::new(),
        HeaderStyle::Ietf => {
            let mut policy = String::new();
            let mut state = String::new();
            for (i, v) in verdicts.iter().enumerate() {
                let sep = if i == 0 { "" } else { ", " };
                let _ = write!(
                    policy,
                    "{sep}\"{}\";q={};w={}",
                    v.rule,
                    v.policy.quota,
                    ceil_seconds(v.policy.window_ns).max(1)
                );
                let _ = write!(
                    state,
                    "{sep}\"{}\";r={};t={}",
                    v.rule,
                    v.decision.remaining,
                    ceil_seconds(v.decision.reset_after_ns)
                );
            }
            vec![("ratelimit-policy", policy), ("ratelimit", state)]
        }
        HeaderStyle::Legacy => {
            let chosen =
                denying(verdicts).or_else(|| verdicts.iter().min_by_key(|v| v.decision.remaining));
            match chosen {
                Some(v) => vec![
                    ("x-ratelimit-limit", v.decision.limit.to_string()),
                    ("x-ratelimit-remaining", v.decision.remaining.to_string()),
                    (
                        "x-ratelimit-reset",
                        ceil_seconds(v.decision.reset_after_ns).to_string(),
                    ),
                ],
                None => Vec::new(),
            }
        }
    }
}

/// The reply for a request denied by the one denying verdict among `verdicts`.
pub fn denial(settings: &ResponseSettings, verdicts: &[RuleVerdict<'_>], grpc: bool) -> Denial {
    let denied_by = denying(verdicts);
    let rule = denied_by.map_or("", |v| v.rule);
    let retry_after = denied_by
        .and_then(|v| v.decision.retry_after_ns)
        .map(ceil_seconds);
    let mut headers = Vec::new();
    if let Some(seconds) = retry_after {
        headers.push(("retry-after", seconds.to_string()));
    }
    headers.extend(rate_limit_headers(settings.header_style, verdicts));
    if grpc {
        return Denial {
            status: 200,
            headers,
            body: Vec::new(),
            grpc_status: Some(GRPC_RESOURCE_EXHAUSTED),
            grpc_message: Some(format!("rate limited by rule {rule}")),
        };
    }
    let body = match &settings.body {
        Some(custom) => {
            headers.push(("content-type", custom.content_type.clone()));
            custom.text.clone().into_bytes()
        }
        None => {
            headers.push(("content-type", "application/json".to_string()));
            json_body(rule, retry_after).into_bytes()
        }
    };
    Denial {
        status: settings.status,
        headers,
        body,
        grpc_status: None,
        grpc_message: None,
    }
}

/// The reply when a global rule with `failure_mode: deny` cannot reach the bridge:
/// 503 (gRPC UNAVAILABLE), `Retry-After: 1`, and a JSON body naming the rule. It is not
/// a 429: no limit was found exceeded, the limiter could not tell.
pub fn unavailable(rule: &str, grpc: bool) -> Denial {
    let mut headers = vec![("retry-after", "1".to_string())];
    if grpc {
        return Denial {
            status: 200,
            headers,
            body: Vec::new(),
            grpc_status: Some(GRPC_UNAVAILABLE),
            grpc_message: Some(format!("rate limit of rule {rule} unavailable")),
        };
    }
    headers.push(("content-type", "application/json".to_string()));
    let body = format!("{{\"error\":\"rate_limit_unavailable\",\"rule\":\"{rule}\"}}");
    Denial {
        status: 503,
        headers,
        body: body.into_bytes(),
        grpc_status: None,
        grpc_message: None,
    }
}

/// `{"error":"rate_limited","rule":"per-user","retry_after":3}`; `retry_after` is
/// `null` when the request can never pass (its cost is above the limit). Rule names
/// are `[A-Za-z0-9_-]`, so they need no escaping.
pub fn json_body(rule: &str, retry_after: Option<u64>) -> String {
    match retry_after {
        Some(s) => {
            format!("{{\"error\":\"rate_limited\",\"rule\":\"{rule}\",\"retry_after\":{s}}}")
        }
        None => format!("{{\"error\":\"rate_limited\",\"rule\":\"{rule}\",\"retry_after\":null}}"),
    }
}

/// True for `content-type: application/grpc`, `application/grpc+proto`, … .
pub fn is_grpc(content_type: Option<&[u8]>) -> bool {
    content_type.is_some_and(|ct| {
        let ct = ct.to_ascii_lowercase();
        ct == b"application/grpc"
            || ct.starts_with(b"application/grpc+")
            || ct.starts_with(b"application/grpc;")
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn verdict(rule: &str, remaining: u64, retry: Option<u64>) -> RuleVerdict<'_> {
        RuleVerdict {
            rule,
            decision: Decision {
                allowed: retry.is_none(),
                limit: 10,
                remaining,
                retry_after_ns: retry,
                reset_after_ns: 1_500_000_000,
            },
            policy: Policy {
                quota: 10,
                window_ns: 60_000_000_000,
            },
        }
    }

    #[test]
    fn ietf_headers_list_every_rule() {
        let v = [
            verdict("per-user", 3, None),
            verdict("per-ip", 0, Some(200_000_000)),
        ];
        let headers = rate_limit_headers(HeaderStyle::Ietf, &v);
        assert_eq!(
            headers,
            vec![
                (
                    "ratelimit-policy",
                    "\"per-user\";q=10;w=60, \"per-ip\";q=10;w=60".to_string()
                ),
                (
                    "ratelimit",
                    "\"per-user\";r=3;t=2, \"per-ip\";r=0;t=2".to_string()
                ),
            ]
        );
    }

    #[test]
    fn denial_names_the_rule_and_rounds_retry_up() {
        let v = [verdict("per-user", 0, Some(200_000_000))];
        let d = denial(&ResponseSettings::default(), &v, false);
        assert_eq!(d.status, 429);
        assert_eq!(d.headers.first(), Some(&("retry-after", "1".to_string())));
        assert_eq!(
            String::from_utf8(d.body).unwrap(),
            r#"{"error":"rate_limited","rule":"per-user","retry_after":1}"#
        );
        let g = denial(&ResponseSettings::default(), &v, true);
        assert_eq!((g.status, g.grpc_status), (200, Some(8)));
    }

    #[test]
    fn legacy_headers_follow_the_denying_rule() {
        let v = [verdict("a", 5, None), verdict("b", 7, Some(1))];
        let h = rate_limit_headers(HeaderStyle::Legacy, &v);
        assert_eq!(h.get(1), Some(&("x-ratelimit-remaining", "7".to_string())));
        let v = [verdict("a", 5, None), verdict("b", 7, None)];
        let h = rate_limit_headers(HeaderStyle::Legacy, &v);
        assert_eq!(h.get(1), Some(&("x-ratelimit-remaining", "5".to_string())));
    }

    #[test]
    fn grpc_content_types() {
        assert!(is_grpc(Some(b"application/grpc")));
        assert!(is_grpc(Some(b"application/grpc+proto")));
        assert!(!is_grpc(Some(b"application/grpc-web")));
        assert!(!is_grpc(None));
    }
}
