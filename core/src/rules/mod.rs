//! Compiled rules: which requests a rule applies to, and the key it counts them under.
//!
//! A request is seen through [`Facts`]: the header values and Envoy attributes the
//! rules need, each fetched from the host at most once per request and only when a
//! rule asks for it (every host call costs about a microsecond). The compiler assigns
//! every distinct fact a [`FactId`] so that a request's cache is a small vector, not a
//! map keyed by strings.
//!
//! A rule's key is an ordered list of [`KeyPart`]s. A part whose source has no value
//! (header absent, no query parameter, no JWT claim) or an empty value takes the
//! part's `default` if it has one; otherwise the rule does not apply to the request
//! (it is *skipped*, and counted). Parts are framed unambiguously when hashed or sent
//! to the bridge, so `["a:b", "c"]` and `["a", "b:c"]` are different keys, and a
//! default can never be forged by sending its text (see [`crate::key`]).
//!
//! Here: the compiled rule and what it holds. Beside it, each using only those above it
//! (and this file's types):

/// Pieces of request text the others read.
mod request_text;

/// The facts a request is read through.
mod facts;

/// Which requests a rule applies to.
mod matching;

/// The key a rule counts a request under.
mod keys;

/// What a request costs.
mod costs;

/// A concurrency rule's limit (`algorithm: "concurrency"`, `adaptive`).
mod concurrency_limit;

/// The limit a request carries, when a rule reads it from the request.
mod request_limit;

/// A limit its keys share fairly (`share`).
mod share;

pub use concurrency_limit::{Adaptive, Concurrency, MAX_IN_FLIGHT, MAX_KEY_CONTROLLERS};
pub use costs::{parse_decimal, Cost};
pub use facts::{DeadlineFacts, Fact, FactId, FactSource, FactTable, Facts};
pub use keys::{KeyPart, KeySource};
pub use matching::{HeaderMatch, HeaderTest, RequestMatch, StringMatch};
pub use request_limit::{LimitFrom, RequestLimit};
pub use request_text::{host_only, path_only, query_param, strip_port};
pub use share::{Share, ShareOf};

use crate::algorithms::{GlobalLimit, Limit, Policy};
use crate::stats::{Applies, StatsLevel};
use crate::usage::clamp::BodyClamp;
use crate::usage::UsageField;

/// A rule of a compiled config: its position in the config, which is also the order of
/// evaluation. Reports, verdicts and bridge items name rules by id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RuleId(pub u16);

impl RuleId {
    pub fn index(self) -> usize {
        usize::from(self.0)
    }
}

/// A compiled rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub id: RuleId,
    /// `[A-Za-z0-9_-]{1,64}`; unique in a config; names the rule in metrics, headers,
    /// logs, shared-data keys and the JSON body of a denial.
    pub name: String,
    pub matcher: RequestMatch,
    pub key: Vec<KeyPart>,
    pub cost: Cost,
    /// Where the rule is decided, with its limit.
    pub scope: Scope,
    /// The limit's parameters each request gives (a tenant's own limit): the limit in
    /// `scope` is built with their defaults. Local rules only.
    pub limit_from: Vec<LimitFrom>,
    /// The limit split fairly among the keys under the rule's key (a local
    /// `fixed_window` rule only).
    pub share: Option<Share>,
    /// Decide and count, but never deny.
    pub shadow: bool,
    /// How many distinct keys the rule tracks at once in this Envoy (its slot table;
    /// for global rules, its leases and cached denials).
    pub max_keys: u32,
    /// A local rule's per-worker reservoirs; `None`: every request decides in shared
    /// data (`reservoir.max` 1, and every global rule).
    pub reservoir: Option<Reservoir>,
    /// A local GCRA or token-bucket rule that holds a request it would deny, when the
    /// request fits within the delay's `max` (see [`crate::delay`]).
    pub delay: Option<Delay>,
    /// The request's cost is an estimate, corrected when the response ends (`commit`).
    pub commit: Option<Commit>,
    /// The rule's own `stats` level; `None`: the plugin's ([`crate::config::Config::stats_level`]).
    pub stats: Option<StatsLevel>,
}

/// `commit`: the cost a request was admitted with (its `cost`) is an estimate; the
/// response says what it really cost, and the key's state is corrected then.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Commit {
    pub source: CommitSource,
    /// What a request costs when the upstream answered an error status (5xx). Any other
    /// response without a readable usage keeps its estimate
    /// ([`crate::usage::settlement`]).
    pub on_error: u64,
    /// Admit a request whose estimate is more than its key has left with its output
    /// lowered to fit, rather than deny it (`commit.clamp`).
    pub clamp: Option<Clamp>,
}

/// `commit.clamp`: a request is reserved as much of its estimate as its key has left,
/// down to its prompt and `min_output`, and its body's max-token fields are lowered to
/// what that leaves for output ([`crate::usage::clamp`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Clamp {
    /// [`Fact::RequestBodyPrompt`]: the prompt's share of the estimate.
    pub prompt: FactId,
    /// The fewest output tokens a clamped request is sent with.
    pub min_output: u64,
    pub body: BodyClamp,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CommitSource {
    /// A response header (lower case) holding a decimal integer.
    Header(String),
    /// The usage in the response's JSON body or event stream (see [`crate::usage`]).
    Body {
        fields: Vec<UsageField>,
        max_bytes: usize,
    },
}

/// `on_limit.delay`: hold a request that would be limited until its slot in the key's
/// schedule, instead of denying it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Delay {
    /// The longest a request is held (µs); one that would wait longer is denied.
    pub max_us: u64,
    /// Most requests of this rule held at once by one worker; beyond, denied.
    pub queue: u32,
    /// Where a request states its own deadline: it is held only until then
    /// ([`crate::deadline`]).
    pub deadline: DeadlineFacts,
}

/// How a local rule's workers take units ahead of their requests (see
/// [`crate::reservoir`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reservoir {
    /// Most units one take holds, the request's own included (≥ 2).
    pub max: u64,
    /// Longest a worker keeps a unit it took (µs); the algorithm may allow less.
    pub hold_us: u64,
    /// Keys each worker keeps reservoirs for at once.
    pub max_keys: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    /// Decided inside this Envoy process, shared by its workers.
    Local(Limit),
    /// One quota across every Envoy, kept in Redis by weir-bridge.
    Global(GlobalRule),
    /// Requests in flight per key, in this Envoy process: taken when admitted, given
    /// back when the stream ends.
    Concurrency(Concurrency),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GlobalRule {
    /// The limit as configured: what the RateLimit headers advertise.
    pub limit: GlobalLimit,
    /// The limit Redis enforces: the configured one, except that a GCRA rule with leases
    /// gives up `⌈hold / T⌉` units of its burst to pay for the time a leased unit may
    /// wait (docs/global.md, "What the limit guarantees").
    pub redis_limit: GlobalLimit,
    /// `None`: exact, every request asks Redis.
    pub lease: Option<Lease>,
    /// What to do when the bridge or Redis cannot answer.
    pub failure_mode: FailureMode,
    /// How many Envoys share the quota (sizes the local fallback and leases).
    pub expected_instances: u64,
}

/// How a global rule takes units ahead of its requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    /// Most units taken at once, now or reserved (≥ 2).
    pub max: u64,
    /// How long a unit may wait to be spent once its call is answered (µs): the hold a
    /// call asks for is this plus the bridge's round trip, which the hold counts from
    /// the call's departure; a unit is dropped, not carried, past its hold.
    pub ttl_us: u64,
    /// The longest hold a call asks for (µs): `ttl` plus `round_trip` (by default
    /// `bridge.timeout`; a GCRA key pays for it with burst, and Redis runs the burst
    /// reduced by it).
    pub hold_max_us: u64,
    /// At saturation, the span (µs) one call covers: a GCRA key reserves the slots of
    /// its schedule due within it; every key, once denied, is not asked about again
    /// sooner (its cached denial lasts at least this long).
    pub horizon_us: u64,
}

impl Lease {
    /// Whether a key is saturated as Redis last spoke of it: nothing remaining, said at
    /// `at_us`, within the span a reservation covers (or a hold) of `now_us`.
    pub fn saturated(&self, remaining: u64, at_us: u64, now_us: u64) -> bool {
        let recent_us = self.horizon_us.max(self.hold_max_us);
        at_us > 0 && remaining == 0 && now_us.saturating_sub(at_us) <= recent_us
    }

    /// The hold a call asks for: `ttl` plus the bridge's round trip (µs, as measured),
    /// which the hold counts from the call's departure, at most what the rule's Redis
    /// limit paid for ([`Lease::hold_max_us`]). So a slow bridge does not eat the time a
    /// unit may wait to be spent. Before the plugin's first answer (`round_trip_us` 0:
    /// not measured yet) the longest: the first calls take a key's burst, and a hold of
    /// `ttl` alone lost all of it behind a bridge slower than `ttl`.
    pub fn hold_for(&self, round_trip_us: u64) -> u64 {
        if round_trip_us == 0 {
            return self.hold_max_us.max(self.ttl_us);
        }
        self.ttl_us
            .saturating_add(round_trip_us)
            .min(self.hold_max_us)
            .max(self.ttl_us)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FailureMode {
    /// Let the request through.
    Allow,
    /// Answer 503.
    Deny,
    /// Decide with this local limit (the global one divided by the expected instances).
    Local(Limit),
}

impl Rule {
    pub fn matches<S: FactSource>(&self, facts: &mut Facts<'_, S>) -> bool {
        self.matcher.matches(facts)
    }

    /// The algorithm's name, as in the config.
    pub fn algorithm_name(&self) -> &'static str {
        match &self.scope {
            Scope::Local(limit) => limit.kind().name(),
            Scope::Global(global) => global.limit.kind().name(),
            Scope::Concurrency(_) => "concurrency",
        }
    }

    /// The controller's settings of an adaptive concurrency rule.
    pub fn adaptive(&self) -> Option<&Adaptive> {
        match &self.scope {
            Scope::Concurrency(c) => c.adaptive.as_ref(),
            _ => None,
        }
    }

    pub fn policy(&self) -> Policy {
        match &self.scope {
            Scope::Local(limit) => limit.policy(),
            Scope::Global(global) => global.limit.policy(),
            Scope::Concurrency(c) => c.policy(),
        }
    }

    pub fn is_global(&self) -> bool {
        matches!(self.scope, Scope::Global(_))
    }

    /// Whether the rule has the stats declared for `applies` rules
    /// ([`crate::stats::rule_stats`]).
    pub fn has_stats(&self, applies: Applies) -> bool {
        let adaptive = self.adaptive();
        match applies {
            Applies::Every => true,
            Applies::FromRequest => {
                !self.limit_from.is_empty()
                    || self.share.as_ref().is_some_and(|s| s.weight.is_some())
            }
            Applies::Share => self.share.is_some(),
            Applies::Shadow => self.shadow,
            Applies::Global => self.is_global(),
            Applies::DenialCache => self.is_global() || self.reservoir.is_some(),
            Applies::Reservoir => self.reservoir.is_some(),
            Applies::Delay => self.delay.is_some(),
            Applies::Commit => self.commit.is_some(),
            Applies::Concurrency => matches!(self.scope, Scope::Concurrency(_)),
            Applies::Adaptive => adaptive.is_some_and(|a| a.key_controllers.is_none()),
            Applies::PerKey => adaptive.is_some_and(|a| a.key_controllers.is_some()),
        }
    }
}
