//! The top-level `bridge` settings: how the filter reaches weir-bridge.

use super::{error, Result};
use crate::bounds::{
    check_name, BRIDGE_CALL_MARGIN_MS, BRIDGE_REDIS_TIMEOUT_MS, MIN_BRIDGE_TIMEOUT_MS,
};
use crate::config::raw::RawBridge;
use crate::config::BridgeSettings;
use crate::field_error::quoted;

/// Long enough for a bridge with its default Redis timeout ([`MIN_BRIDGE_TIMEOUT_MS`]).
pub const DEFAULT_BRIDGE_TIMEOUT_US: u64 = MIN_BRIDGE_TIMEOUT_MS * 1_000;
pub const MAX_BRIDGE_TIMEOUT_US: u64 = 10_000_000;
pub const DEFAULT_DOMAIN: &str = "weir";
/// For the bridge's cluster name, authority and secret.
pub const MAX_BRIDGE_TEXT_BYTES: usize = 256;

#[inline(never)] // a wasm function of its own: see `compile::compile`
pub(super) fn compile(raw: RawBridge) -> Result<BridgeSettings> {
    let text = |value: String, at: &str, what: &str| -> Result<String> {
        let printable = value.bytes().all(|b| (0x21..0x7f).contains(&b));
        if value.is_empty() || value.len() > MAX_BRIDGE_TEXT_BYTES || !printable {
            return Err(error(
                at,
                format!(
                    "invalid {what} {}: expected 1 to {MAX_BRIDGE_TEXT_BYTES} printable ASCII characters without spaces",
                    quoted(&value)
                ),
            ));
        }
        Ok(value)
    };
    let cluster = text(raw.cluster, "bridge.cluster", "cluster name")?;
    let authority = match raw.authority {
        Some(authority) => {
            let authority = text(authority, "bridge.authority", "authority")?;
            let host_chars = |c: char| {
                c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | ':' | '[' | ']')
            };
            if !authority.chars().all(host_chars) {
                return Err(error(
                    "bridge.authority",
                    format!(
                        "invalid authority {}: expected a host name, with an optional :port",
                        quoted(&authority)
                    ),
                ));
            }
            authority
        }
        None => default_authority(&cluster),
    };
    let secret = raw
        .secret
        .map(|s| text(s, "bridge.secret", "secret"))
        .transpose()?;
    let secret_env = raw
        .secret_env
        .map(|s| text(s, "bridge.secret_env", "environment variable name"))
        .transpose()?;
    if secret.is_some() && secret_env.is_some() {
        return Err(error(
            "bridge.secret_env",
            "give the secret either inline (`secret`) or from the environment (`secret_env`), not both",
        ));
    }
    let timeout_us = match raw.timeout {
        None => DEFAULT_BRIDGE_TIMEOUT_US,
        Some(t) if t.us >= 1_000 && t.us <= MAX_BRIDGE_TIMEOUT_US => t.us,
        Some(t) => {
            return Err(error(
                "bridge.timeout",
                format!("{} is out of range: expected 1ms to 10s", quoted(&t.text)),
            ))
        }
    };
    let domain = match raw.domain {
        None => DEFAULT_DOMAIN.to_string(),
        Some(domain) => {
            check_name("domain", &domain).map_err(|message| error("bridge.domain", message))?;
            domain
        }
    };
    Ok(BridgeSettings {
        cluster,
        authority,
        timeout_ms: timeout_us / 1_000,
        secret,
        secret_env,
        domain,
    })
}

impl BridgeSettings {
    /// Why this timeout is too short for a bridge with its default Redis timeout, naming
    /// the field, its value and what to do; `None` when it is long enough. Not an error:
    /// a bridge run with a shorter `--redis-timeout` is fine with it.
    pub fn timeout_warning(&self) -> Option<String> {
        (self.timeout_ms < MIN_BRIDGE_TIMEOUT_MS).then(|| {
            format!(
                "bridge.timeout: \"{}ms\" is shorter than {MIN_BRIDGE_TIMEOUT_MS}ms, what a \
                 weir-bridge with its default Redis timeout ({BRIDGE_REDIS_TIMEOUT_MS}ms) needs \
                 with {BRIDGE_CALL_MARGIN_MS}ms for the call itself: the filter gives up on \
                 calls the bridge is still waiting on, and units Redis grants after that are \
                 lost. Raise bridge.timeout to {MIN_BRIDGE_TIMEOUT_MS}ms or more, or run the \
                 bridge with --redis-timeout at most {}ms",
                self.timeout_ms,
                self.timeout_ms.saturating_sub(BRIDGE_CALL_MARGIN_MS).max(1),
            )
        })
    }
}

/// The `:authority` of bridge calls when none is configured: the host of an Istio
/// outbound cluster name (`outbound|8081||weir-bridge.weir.svc.cluster.local`), else the
/// cluster name itself. (`|` is not valid in an authority: Envoy would answer 400.)
fn default_authority(cluster: &str) -> String {
    let parts: Vec<&str> = cluster.split('|').collect();
    match parts.as_slice() {
        ["outbound" | "inbound", port, _subset, host] if !host.is_empty() => {
            format!("{host}:{port}")
        }
        _ => cluster.to_string(),
    }
}
