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

use crate::adaptive::Adaptive;
use crate::algorithms::{GlobalLimit, Limit, Policy};
use crate::concurrency::Concurrency;
use crate::key::PartOrigin;
use crate::stats::{Applies, StatsLevel};
use crate::usage::clamp::BodyClamp;
use crate::usage::{BodyEstimate, UsageField};

/// Index of a fact in the [`FactTable`] of a compiled config.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FactId(pub u16);

/// Something the host can tell about a request.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Fact {
    /// A request header by lowercase name; pseudo-headers (`:path`, `:method`,
    /// `:authority`) included.
    Header(String),
    /// An Envoy attribute by path, e.g. `["source", "address"]`.
    Property(Vec<String>),
    /// A cost estimated from the request's JSON body, as a decimal integer (see
    /// [`BodyEstimate::estimate`]; `u64::MAX` for a body too large to read). The filter
    /// reads the body only for requests a rule with this fact matches.
    RequestBodyEstimate(BodyEstimate),
    /// The prompt's share of a body estimate, as a decimal integer, when the body can be
    /// clamped (see [`BodyClamp::prompt`]); absent otherwise. Read by rules with
    /// `commit.clamp`.
    RequestBodyPrompt(BodyClamp),
}

/// Every distinct fact the rules of one config can ask for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FactTable {
    facts: Vec<Fact>,
}

impl FactTable {
    /// Returns the id of `fact`, adding it if new. Fails past `u16::MAX` facts.
    pub fn intern(&mut self, fact: Fact) -> Option<FactId> {
        if let Some(at) = self.facts.iter().position(|f| *f == fact) {
            return u16::try_from(at).ok().map(FactId);
        }
        let id = u16::try_from(self.facts.len()).ok()?;
        self.facts.push(fact);
        Some(FactId(id))
    }

    pub fn get(&self, id: FactId) -> Option<&Fact> {
        self.facts.get(usize::from(id.0))
    }

    pub fn iter(&self) -> impl Iterator<Item = &Fact> {
        self.facts.iter()
    }

    pub fn len(&self) -> usize {
        self.facts.len()
    }

    pub fn is_empty(&self) -> bool {
        self.facts.is_empty()
    }
}

/// Where request facts come from: the proxy-wasm host in the filter, a map in tests.
pub trait FactSource {
    /// The raw bytes of `fact`, or `None` when the request does not have it.
    fn fetch(&mut self, fact: &Fact) -> Option<Vec<u8>>;
}

/// One request's facts, fetched lazily and at most once each.
pub struct Facts<'t, S> {
    source: S,
    table: &'t FactTable,
    cache: Vec<Option<Option<Vec<u8>>>>,
}

impl<'t, S: FactSource> Facts<'t, S> {
    pub fn new(table: &'t FactTable, source: S) -> Self {
        Facts {
            source,
            table,
            cache: Vec::new(),
        }
    }

    pub fn get(&mut self, id: FactId) -> Option<&[u8]> {
        let at = usize::from(id.0);
        if self.cache.len() <= at {
            self.cache.resize(self.table.len().max(at + 1), None);
        }
        let slot = self.cache.get_mut(at)?;
        if slot.is_none() {
            let fetched = self.table.get(id).and_then(|fact| self.source.fetch(fact));
            *slot = Some(fetched);
        }
        slot.as_ref().and_then(|v| v.as_deref())
    }
}

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

/// Where a delaying rule reads its requests' own deadlines: the facts of the two headers
/// [`crate::deadline`] reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeadlineFacts {
    pub grpc_timeout: FactId,
    pub expected_rq_timeout: FactId,
}

impl DeadlineFacts {
    /// The request's deadline, µs since the epoch, for a request that arrived at
    /// `arrived_us`; `None` when no header states one.
    pub fn deadline_us<F: FactSource>(
        &self,
        facts: &mut Facts<'_, F>,
        arrived_us: u64,
    ) -> Option<u64> {
        let grpc = facts.get(self.grpc_timeout).map(<[u8]>::to_vec);
        let expected = facts.get(self.expected_rq_timeout);
        let timeout_us = crate::deadline::stated_timeout_us(grpc.as_deref(), expected)?;
        Some(arrived_us.saturating_add(timeout_us))
    }
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

/// All conditions must hold; an absent condition always holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestMatch {
    /// Against `:path` without its query string.
    pub path: Option<(FactId, StringMatch)>,
    /// Uppercase method names; empty means any method.
    pub methods: Vec<Vec<u8>>,
    pub method_fact: Option<FactId>,
    pub headers: Vec<HeaderMatch>,
    /// Against `:authority` without its port, lowercased.
    pub authority: Option<(FactId, StringMatch)>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StringMatch {
    Exact(Vec<u8>),
    Prefix(Vec<u8>),
    Suffix(Vec<u8>),
}

impl StringMatch {
    pub fn matches(&self, value: &[u8]) -> bool {
        match self {
            StringMatch::Exact(want) => value == want.as_slice(),
            StringMatch::Prefix(want) => value.starts_with(want),
            StringMatch::Suffix(want) => value.ends_with(want),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeaderMatch {
    /// Lowercase header name (for messages; the lookup goes through `fact`).
    pub name: String,
    pub fact: FactId,
    pub test: HeaderTest,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeaderTest {
    Present,
    Absent,
    Is(StringMatch),
}

/// One element of a rule's key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyPart {
    pub source: KeySource,
    /// Used when the source has no value or an empty one.
    pub default: Option<Vec<u8>>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeySource {
    /// A request header's value, as raw bytes.
    Header {
        fact: FactId,
    },
    /// The downstream address without its port (`source.address`; trust it only with
    /// `use_remote_address: true` or trusted hops in the connection manager).
    ClientIp {
        fact: FactId,
    },
    /// `:path` without its query string.
    Path {
        fact: FactId,
    },
    Method {
        fact: FactId,
    },
    /// The first value of a query parameter, percent-decoded.
    QueryParam {
        fact: FactId,
        name: Vec<u8>,
    },
    /// A JWT claim that Envoy's jwt_authn filter placed in dynamic metadata, or any
    /// other Envoy attribute: the attribute's bytes as the host returns them.
    Attribute {
        fact: FactId,
    },
    /// A fixed value (e.g. to name a bucket shared by every request of the rule).
    Static {
        value: Vec<u8>,
    },
}

/// What one request costs under a rule: never 0 (a request of cost 0 would only peek at
/// its key and always pass), never more than the limit can admit at once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cost {
    Fixed(u64),
    /// Read from the request as a decimal integer (spaces around it allowed): a header,
    /// or the estimate of its body ([`Fact::RequestBodyEstimate`]). Absent, empty,
    /// negative or not a whole number → `default`; below `min` → `min`; above `max` →
    /// `max`. `1 ≤ min ≤ default ≤ max`.
    FromRequest {
        fact: FactId,
        default: u64,
        min: u64,
        max: u64,
    },
}

impl Rule {
    pub fn matches<S: FactSource>(&self, facts: &mut Facts<'_, S>) -> bool {
        self.matcher.matches(facts)
    }

    /// Feeds the rule's key parts, in order, to `sink`. Returns false (and stops) when a
    /// part has no value and no default: the rule does not apply to this request.
    pub fn visit_key<S: FactSource>(
        &self,
        facts: &mut Facts<'_, S>,
        mut sink: impl FnMut(PartOrigin, &[u8]),
    ) -> bool {
        for part in &self.key {
            let found = part_value(&part.source, facts);
            match found {
                Some(PartValue::Borrowed(origin, bytes)) if !bytes.is_empty() => {
                    sink(origin, bytes)
                }
                Some(PartValue::Owned(bytes)) if !bytes.is_empty() => {
                    sink(PartOrigin::Request, &bytes)
                }
                _ => match &part.default {
                    Some(default) => sink(PartOrigin::Default, default),
                    None => return false,
                },
            }
        }
        true
    }

    /// The clamp of an enforcing rule (a shadow rule never changes a request).
    pub fn clamp(&self) -> Option<&Clamp> {
        self.commit
            .as_ref()
            .and_then(|c| c.clamp.as_ref())
            .filter(|_| !self.shadow)
    }

    /// What a clamping rule may reserve for this request whose estimate is `cost`: at
    /// least its prompt's share and `min_output` (no less than the cost's `min`), at most
    /// the estimate — or that least when it is more: the output is what a clamp lowers,
    /// never the prompt. With the prompt's share. `(cost, cost, None)` when the rule does
    /// not clamp or the body cannot be clamped.
    pub fn clamp_range<S: FactSource>(
        &self,
        facts: &mut Facts<'_, S>,
        cost: u64,
    ) -> (u64, u64, Option<u64>) {
        let Some(clamp) = self.clamp() else {
            return (cost, cost, None);
        };
        let Some(prompt) = facts.get(clamp.prompt).and_then(parse_decimal) else {
            return (cost, cost, None);
        };
        let min = match self.cost {
            Cost::Fixed(fixed) => fixed,
            Cost::FromRequest { min, .. } => min,
        };
        let least = prompt.saturating_add(clamp.min_output).max(min);
        (least, cost.max(least), Some(prompt))
    }

    /// The cost of this request under this rule.
    pub fn cost<S: FactSource>(&self, facts: &mut Facts<'_, S>) -> u64 {
        match self.cost {
            Cost::Fixed(cost) => cost,
            Cost::FromRequest {
                fact,
                default,
                min,
                max,
            } => facts
                .get(fact)
                .and_then(parse_decimal)
                .map_or(default, |cost| cost.clamp(min, max)),
        }
    }
}

enum PartValue<'a> {
    Borrowed(PartOrigin, &'a [u8]),
    Owned(Vec<u8>),
}

fn part_value<'a, S: FactSource>(
    source: &'a KeySource,
    facts: &'a mut Facts<'_, S>,
) -> Option<PartValue<'a>> {
    let request = |bytes| PartValue::Borrowed(PartOrigin::Request, bytes);
    match source {
        KeySource::Header { fact } | KeySource::Method { fact } | KeySource::Attribute { fact } => {
            facts.get(*fact).map(request)
        }
        KeySource::ClientIp { fact } => facts.get(*fact).map(strip_port).map(request),
        KeySource::Path { fact } => facts.get(*fact).map(path_only).map(request),
        KeySource::QueryParam { fact, name } => facts
            .get(*fact)
            .and_then(|path| query_param(path, name))
            .map(PartValue::Owned),
        KeySource::Static { value } => Some(PartValue::Borrowed(PartOrigin::Static, value)),
    }
}

impl RequestMatch {
    pub fn matches<S: FactSource>(&self, facts: &mut Facts<'_, S>) -> bool {
        if let Some((fact, want)) = &self.path {
            match facts.get(*fact) {
                Some(path) if want.matches(path_only(path)) => {}
                _ => return false,
            }
        }
        if !self.methods.is_empty() {
            let Some(fact) = self.method_fact else {
                return false;
            };
            match facts.get(fact) {
                Some(method) if self.methods.iter().any(|m| m.as_slice() == method) => {}
                _ => return false,
            }
        }
        for header in &self.headers {
            let value = facts.get(header.fact);
            let ok = match (&header.test, value) {
                (HeaderTest::Present, found) => found.is_some(),
                (HeaderTest::Absent, found) => found.is_none(),
                (HeaderTest::Is(want), Some(found)) => want.matches(found),
                (HeaderTest::Is(_), None) => false,
            };
            if !ok {
                return false;
            }
        }
        if let Some((fact, want)) = &self.authority {
            match facts.get(*fact) {
                Some(authority) => {
                    let host = host_only(authority);
                    if !want.matches(&host.to_ascii_lowercase()) {
                        return false;
                    }
                }
                None => return false,
            }
        }
        true
    }
}

/// `/a/b?x=1` → `/a/b`.
pub fn path_only(path: &[u8]) -> &[u8] {
    match path.iter().position(|&b| b == b'?') {
        Some(at) => path.get(..at).unwrap_or(path),
        None => path,
    }
}

/// `example.com:8080` → `example.com`; `[::1]:80` → `[::1]`.
pub fn host_only(authority: &[u8]) -> &[u8] {
    if authority.first() == Some(&b'[') {
        return match authority.iter().position(|&b| b == b']') {
            Some(end) => authority.get(..=end).unwrap_or(authority),
            None => authority,
        };
    }
    match authority.iter().rposition(|&b| b == b':') {
        Some(at) => authority.get(..at).unwrap_or(authority),
        None => authority,
    }
}

/// `1.2.3.4:5678` → `1.2.3.4`; `[2001:db8::1]:443` → `2001:db8::1`; anything else as is.
pub fn strip_port(address: &[u8]) -> &[u8] {
    if address.first() == Some(&b'[') {
        if let Some(end) = address.iter().position(|&b| b == b']') {
            return address.get(1..end).unwrap_or(address);
        }
        return address;
    }
    let colons = address.iter().filter(|&&b| b == b':').count();
    if colons == 1 {
        if let Some(at) = address.iter().position(|&b| b == b':') {
            return address.get(..at).unwrap_or(address);
        }
    }
    address
}

/// The first value of query parameter `name` in `path`, percent-decoded (`+` stays `+`).
/// A parameter present without `=` has the empty value.
pub fn query_param(path: &[u8], name: &[u8]) -> Option<Vec<u8>> {
    let at = path.iter().position(|&b| b == b'?')?;
    let query = path.get(at + 1..)?;
    let query = match query.iter().position(|&b| b == b'#') {
        Some(end) => query.get(..end)?,
        None => query,
    };
    for pair in query.split(|&b| b == b'&') {
        let (raw_name, raw_value) = match pair.iter().position(|&b| b == b'=') {
            Some(eq) => (pair.get(..eq)?, pair.get(eq + 1..)?),
            None => (pair, &[][..]),
        };
        if percent_decode(raw_name) == name {
            return Some(percent_decode(raw_value));
        }
    }
    None
}

fn percent_decode(input: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(input.len());
    let mut i = 0;
    while let Some(&b) = input.get(i) {
        if b == b'%' {
            let hi = input.get(i + 1).and_then(|&h| hex_value(h));
            let lo = input.get(i + 2).and_then(|&l| hex_value(l));
            if let (Some(hi), Some(lo)) = (hi, lo) {
                out.push(hi << 4 | lo);
                i += 3;
                continue;
            }
        }
        out.push(b);
        i += 1;
    }
    out
}

fn hex_value(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// A plain decimal integer (surrounding spaces allowed), or `None`.
pub fn parse_decimal(bytes: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(bytes).ok()?.trim();
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn query_params_are_decoded_and_first_wins() {
        assert_eq!(
            query_param(b"/x?user=a%62&user=c", b"user"),
            Some(b"ab".to_vec())
        );
        assert_eq!(query_param(b"/x?a=1&flag&b=2", b"flag"), Some(Vec::new()));
        assert_eq!(query_param(b"/x?u%73er=z", b"user"), Some(b"z".to_vec()));
        assert_eq!(query_param(b"/x?a=1#user=2", b"user"), None);
        assert_eq!(query_param(b"/x", b"user"), None);
        assert_eq!(
            query_param(b"/x?user=%zz%4", b"user"),
            Some(b"%zz%4".to_vec())
        );
    }

    #[test]
    fn ports_are_stripped() {
        assert_eq!(strip_port(b"10.0.0.1:5555"), b"10.0.0.1");
        assert_eq!(strip_port(b"[2001:db8::1]:443"), b"2001:db8::1");
        assert_eq!(strip_port(b"2001:db8::1"), b"2001:db8::1");
        assert_eq!(host_only(b"Example.com:8080"), b"Example.com");
        assert_eq!(host_only(b"[::1]:80"), b"[::1]");
        assert_eq!(path_only(b"/a/b?c=d"), b"/a/b");
    }

    #[test]
    fn decimals() {
        assert_eq!(parse_decimal(b" 42 "), Some(42));
        assert_eq!(parse_decimal(b"-1"), None);
        assert_eq!(parse_decimal(b"1e3"), None);
        assert_eq!(parse_decimal(b"99999999999999999999999"), None);
        assert_eq!(parse_decimal(b"\xff"), None);
    }
}
