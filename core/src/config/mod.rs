//! The plugin configuration: JSON in, [`Config`] out.
//!
//! Parse, then compile: `raw` holds serde structs that mirror the JSON exactly
//! (`deny_unknown_fields` everywhere); `compile` turns them into the runtime types of
//! [`crate::rules`] and [`crate::response`], which cannot be invalid. Every error names
//! the JSON path of the field and the value that was wrong. The same function runs in
//! the filter's `on_configure` and in the offline checker (`weir-check check-config FILE`).

mod compile;
pub use weir_protocol::duration;
mod raw;

pub use compile::{DEFAULT_MAX_KEYS, MAX_MAX_KEYS};

use crate::field_error::FieldError;
use crate::response::ResponseSettings;
use crate::rules::{Cost, Fact, FactTable, Rule, RuleId};
use crate::stats::StatsLevel;

/// A compiled, valid configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    pub rules: Vec<Rule>,
    /// Every request fact the rules can ask for.
    pub facts: FactTable,
    pub response: ResponseSettings,
    /// How to reach weir-bridge; present whenever a rule is global.
    pub bridge: Option<BridgeSettings>,
    /// The most bytes one worker's VM keeps for its requests in flight (request bodies
    /// read for an estimate, response bodies read for a usage): see [`crate::buffers`].
    pub max_buffered_bytes: u64,
    /// The plugin's stats level: its plugin-wide stats, and each rule's that does not
    /// set its own ([`crate::stats`]).
    pub stats: StatsLevel,
}

/// The filter's side of the bridge connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BridgeSettings {
    /// The Envoy cluster that routes to weir-bridge.
    pub cluster: String,
    /// `:authority` of the calls (default: the host of an Istio `outbound|PORT||HOST`
    /// cluster name, else the cluster name).
    pub authority: String,
    /// Longest a request waits for the bridge; then the rule's failure mode applies.
    pub timeout_ms: u64,
    /// Sent as `x-weir-secret` when set.
    pub secret: Option<String>,
    /// The name of an environment variable of the Wasm VM (Envoy's
    /// `vm_config.environment_variables`) holding the secret; read by the filter when it
    /// is configured, so the secret need not be written in the plugin configuration.
    pub secret_env: Option<String>,
    /// Namespace of every global key, so several deployments can share one Redis.
    pub domain: String,
}

impl Config {
    /// The rule with id `id` (ids come from this config, so it is always there).
    /// Whether a rule reads a request body (a cost estimated from it) or a response
    /// (`commit`): the filter then looks at bodies.
    pub fn reads_bodies(&self) -> bool {
        self.rules.iter().any(|rule| {
            rule.commit.is_some()
                || matches!(rule.cost, Cost::FromRequest { fact, .. }
                    if matches!(self.facts.get(fact), Some(Fact::RequestBodyEstimate(_))))
        })
    }

    pub fn rule(&self, id: RuleId) -> Option<&Rule> {
        self.rules.get(id.index())
    }

    /// The stats level of `rule`: its own, or else the plugin's.
    pub fn stats_level(&self, rule: &Rule) -> StatsLevel {
        rule.stats.unwrap_or(self.stats)
    }
}

/// Parses and compiles the plugin configuration.
pub fn parse(json: &[u8]) -> Result<Config, FieldError> {
    let raw = raw::parse(json)?;
    compile::compile(raw)
}
