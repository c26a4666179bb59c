//! weir's Envoy stats, each declared once: its name, kind, level and one line of doc.
//!
//! Envoy exports every stat a plugin *defines*, at zero too, from every sidecar: what an
//! operator pays for is what is defined. So each stat has a **level** and a plugin
//! defines only the stats of its level (the plugin's `stats`, which a rule's `stats`
//! overrides for the rule's own): a stat not in the level is never defined with Envoy,
//! and recording it does nothing. A rule's stat also says which rules it **applies** to
//! (a local rule has no `bridge_decisions`): it is defined for those only.
//!
//! - [`StatsLevel::Default`]: exactly what the shipped alerts and dashboard read
//!   (`deploy/alerts`, `deploy/dashboards`; `tests/tests/alerts.rs` keeps the two equal).
//! - [`StatsLevel::Detailed`]: also every per-rule and plugin-wide counter that says why
//!   requests were decided as they were (delays, commits, lease and reservoir units).
//! - [`StatsLevel::All`]: also the plugin's counters of what crosses the VM's boundary
//!   (`vm.*`: host calls, callbacks, bytes), what the benchmark reads.
//!
//! The declarations are the macros [`rule_stats!`](crate::stats::rule_stats) and
//! [`plugin_stats!`](crate::stats::plugin_stats), in the manner of Envoy's
//! `ALL_LOCAL_RATE_LIMIT_STATS(COUNTER)`: each hands its list to a macro of the caller's.
//! [`RULE_STATS`] and [`PLUGIN_STATS`] are the lists as values (for the docs' tables and
//! the series counts); `filter::metrics` makes its structs of stat handles from the same
//! lists, so a stat is named in one place.
//!
//! ```
//! use weir_core::stats::{self, Applies, StatsLevel};
//! let allowed = stats::RULE_STATS.iter().find(|s| s.name == "allowed").unwrap();
//! assert_eq!(allowed.level, StatsLevel::Default);
//! assert_eq!(allowed.group, stats::Group::Rule(Applies::Every));
//! assert!(StatsLevel::Default < StatsLevel::Detailed);
//! assert!(StatsLevel::Detailed.includes(StatsLevel::Default));
//! ```

use serde::de::{self, Deserializer, Visitor};
use serde::Deserialize;
use std::fmt;

/// Which stats a plugin, or a rule, defines. Ordered: each level holds the ones before.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum StatsLevel {
    /// What the shipped alerts and dashboard read, and nothing else.
    #[default]
    Default,
    /// Also the counters that say why requests were decided as they were.
    Detailed,
    /// Also the VM's boundary counters (`vm.*`).
    All,
}

impl StatsLevel {
    pub const ALL: [StatsLevel; 3] = [StatsLevel::Default, StatsLevel::Detailed, StatsLevel::All];

    /// The level's name in the configuration.
    pub const fn name(self) -> &'static str {
        match self {
            StatsLevel::Default => "default",
            StatsLevel::Detailed => "detailed",
            StatsLevel::All => "all",
        }
    }

    /// Whether a stat of level `stat` is defined at this level.
    pub fn includes(self, stat: StatsLevel) -> bool {
        stat <= self
    }
}

/// A level's name, and nothing else (serde's derive would also take `{"all": null}`).
impl<'de> Deserialize<'de> for StatsLevel {
    #[inline(never)] // as the config's (`config::raw::object_only!`)
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        const NAMES: [&str; 3] = [
            StatsLevel::Default.name(),
            StatsLevel::Detailed.name(),
            StatsLevel::All.name(),
        ];
        struct LevelVisitor;
        impl Visitor<'_> for LevelVisitor {
            type Value = StatsLevel;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a stats level: \"default\", \"detailed\" or \"all\"")
            }
            fn visit_str<E: de::Error>(self, name: &str) -> Result<StatsLevel, E> {
                StatsLevel::ALL
                    .into_iter()
                    .find(|level| level.name() == name)
                    .ok_or_else(|| E::unknown_variant(name, &NAMES))
            }
        }
        deserializer.deserialize_str(LevelVisitor)
    }
}

/// What Envoy keeps of a stat.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatKind {
    Counter,
    Gauge,
    /// Envoy exports it as buckets, `_sum` and `_count` ([`HISTOGRAM_SERIES`] series).
    Histogram,
}

impl StatKind {
    pub const fn name(self) -> &'static str {
        match self {
            StatKind::Counter => "counter",
            StatKind::Gauge => "gauge",
            StatKind::Histogram => "histogram",
        }
    }
}

/// The Prometheus series one histogram is in Envoy 1.40's `/stats/prometheus`: its 19
/// default buckets and `+Inf`, `_sum` and `_count` (measured by `tests/tests/stats.rs`).
pub const HISTOGRAM_SERIES: usize = 22;

/// Which rules have a rule stat.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Applies {
    Every,
    /// `shadow: true`.
    Shadow,
    /// `scope: global`.
    Global,
    /// Global rules, and local rules with reservoirs (whose workers cache denials).
    DenialCache,
    /// Local rules with reservoirs (`reservoir.max` above 1, the default).
    Reservoir,
    /// `on_limit.delay`.
    Delay,
    /// `commit`.
    Commit,
    /// `algorithm: concurrency`.
    Concurrency,
    /// `adaptive` with one controller for the rule (not `per_key`).
    Adaptive,
    /// `adaptive` with `per_key`.
    PerKey,
    /// A limit read from the request (a tenant's own), or a shared limit's weight.
    FromRequest,
    /// `share`.
    Share,
}

impl Applies {
    pub const ALL: [Applies; 12] = [
        Applies::Every,
        Applies::Shadow,
        Applies::Global,
        Applies::DenialCache,
        Applies::Reservoir,
        Applies::Delay,
        Applies::Commit,
        Applies::Concurrency,
        Applies::Adaptive,
        Applies::PerKey,
        Applies::FromRequest,
        Applies::Share,
    ];

    /// The rules it applies to, as the docs' tables say it.
    pub const fn describe(self) -> &'static str {
        match self {
            Applies::Every => "every rule",
            Applies::Shadow => "`shadow`",
            Applies::Global => "global",
            Applies::DenialCache => "global; local with reservoirs",
            Applies::Reservoir => "local with reservoirs",
            Applies::Delay => "`on_limit.delay`",
            Applies::Commit => "`commit`",
            Applies::Concurrency => "`concurrency`",
            Applies::Adaptive => "`adaptive`, one controller",
            Applies::PerKey => "`adaptive` with `per_key`",
            Applies::FromRequest => "a limit or weight from the request",
            Applies::Share => "`share`",
        }
    }
}

/// Where a stat's name lives under `weir.<plugin>.`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Group {
    /// `rule.<rule>.<name>`, for the rules it applies to.
    Rule(Applies),
    /// `store.<name>`: shared data.
    Store,
    /// `bridge.<name>`: the calls to weir-bridge; defined when the config has a `bridge`.
    Bridge,
    /// `vm.<name>`: what crosses the VM's boundary.
    Vm,
}

impl Group {
    /// The segment after the plugin's name (`rule`, `store`, `bridge`, `vm`).
    pub const fn segment(self) -> &'static str {
        match self {
            Group::Rule(_) => "rule",
            Group::Store => "store",
            Group::Bridge => "bridge",
            Group::Vm => "vm",
        }
    }
}

/// One stat's declaration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatDecl {
    pub group: Group,
    /// The last segments of its name: `allowed`, `calls.clock`.
    pub name: &'static str,
    pub kind: StatKind,
    /// The lowest level that defines it.
    pub level: StatsLevel,
    pub doc: &'static str,
}

impl StatDecl {
    /// Its name in Prometheus with weir's stats tags: `weir_rule_allowed`,
    /// `weir_vm_calls_clock` (a histogram's series add `_bucket`, `_sum`, `_count`).
    pub fn prometheus_name(&self) -> String {
        format!("weir_{}_{}", self.group.segment(), self.name).replace('.', "_")
    }

    /// Its series in `/stats/prometheus`.
    pub fn series(&self) -> usize {
        match self.kind {
            StatKind::Histogram => HISTOGRAM_SERIES,
            StatKind::Counter | StatKind::Gauge => 1,
        }
    }
}

/// A stat's name in the declarations: its field's name, or the literal given after `=`.
macro_rules! stat_name {
    ($field:ident) => {
        stringify!($field)
    };
    ($field:ident $name:literal) => {
        $name
    };
}
pub(crate) use stat_name;

/// Every rule stat: `field [= "name"]: Kind, Level, Applies, "doc";`, handed to `$then!`.
macro_rules! rule_stats {
    ($then:ident) => {
        $then! {
            allowed: Counter, Default, Every,
                "requests the rule allowed (for a global rule in local failure mode, also the local decisions)";
            limited: Counter, Default, Every,
                "requests the rule denied";
            shadow_limited: Counter, Default, Shadow,
                "requests a shadow rule would have denied (they were let through)";
            key_missing: Counter, Default, Every,
                "requests the rule matched but could not key (a key source had no value and no default): the rule did not apply";
            limit_invalid: Counter, Default, FromRequest,
                "requests whose limit value (a tenant's own) or share weight was there but not a whole number: its `default` decided them";
            store_errors: Counter, Default, Every,
                "shared data failed or the CAS loop gave up: a local rule let the request through; a global rule asked the bridge (or its failure mode decided)";
            slots_in_use: Gauge, Default, Every,
                "slots of the rule's table that hold a key (they are reused, never emptied)";
            slots_capacity: Gauge, Default, Every,
                "slots of the rule's table: `max_keys` rounded up to a multiple of 4";
            slot_evictions: Counter, Default, Every,
                "every slot of a set was live and the one holding the fewest units was evicted: its key restarts fresh (a key at its limit is the last to go); more live keys than `max_keys`";
            limit_units: Gauge, Default, Every,
                "the rule's limit for one key, in units (a GCRA's burst + 1, a bucket's capacity, a window's limit; a global rule's whole-fleet limit; 0 for a concurrency rule), set when the config loads";
            outstanding_units: Gauge, Default, Every,
                "units counted in the store but not admitted yet, in this Envoy: held in the rule's lease slots (global), in its workers' reservoirs (local), and by its held requests (`on_limit.delay`) — the most the rule could admit beyond what its store shows ([reading them](#reading-the-accuracy-gauges))";
            lease_hits: Counter, Default, Global,
                "served from a lease, no bridge call";
            denial_cache_hits: Counter, Default, DenialCache,
                "denied by a cached denial (a global rule's in shared data, a local rule's in the worker), no bridge or shared-data call";
            bridge_decisions: Counter, Default, Global,
                "decided by Redis through the bridge";
            failure_allowed: Counter, Default, Global,
                "the bridge failed and `failure_mode: allow` let the request through";
            failure_denied: Counter, Default, Global,
                "the bridge failed and `failure_mode: deny` answered 503";
            failure_local: Counter, Default, Global,
                "the bridge failed and the local share decided (also counted in `allowed` / `limited`)";
            lease_units_granted: Counter, Detailed, Global,
                "units Redis granted ahead of requests (a lease's leftover or a reservation), counted in Redis from then on";
            lease_units_late: Counter, Detailed, Global,
                "of those, units whose call came back slower than the hold it asked for, with no time left to spend them (never admitted): a bridge slower than `ttl` + `round_trip`; set `lease.round_trip` to its p99";
            lease_units_expired: Counter, Detailed, Global,
                "units dropped unspent from a key's slot, past their time, or lost with a slot another key took (never admitted); counted when a request reads the slot or, at the latest, when a worker's sweep reaches it";
            reservoir_hits: Counter, Default, Reservoir,
                "served from units the worker took ahead, no shared-data call";
            reservoir_units_taken: Counter, Default, Reservoir,
                "units workers took ahead of their requests";
            reservoir_units_expired: Counter, Default, Reservoir,
                "units a worker held past their time (never admitted); counted when the key is next asked for or, at the latest, at the worker's next sweep (every 250 ms)";
            reservoir_evictions: Counter, Detailed, Reservoir,
                "a key took another key's entry in a worker's full reservoir table";
            reservoir_units_evicted: Counter, Default, Reservoir,
                "units such an entry still held, and units every entry of a worker held when it forgot them all (a new hashing seed, its plugin replaced) (never admitted)";
            delayed: Counter, Detailed, Delay,
                "requests held instead of denied (a request held again after a late release counts twice)";
            delay_waited_us: Counter, Detailed, Delay,
                "µs the released requests waited, summed (÷ released requests: the mean wait)";
            delay_late: Counter, Detailed, Delay,
                "releases that came after their slot could still be used (the worker stalled); decided again";
            delay_past_deadline: Counter, Detailed, Delay,
                "requests denied that `max` would have held, because the deadline they stated (`grpc-timeout`, `x-envoy-expected-rq-timeout-ms`) came before their slot, at once with `Retry-After`; or held requests whose release came after that deadline (not forwarded)";
            delay_queue_full: Counter, Detailed, Delay,
                "requests denied that would have been held, because the worker already held `queue` of them (a shared limit's: or pushed out of the full queue by a key holding fewer)";
            delay_abandoned: Counter, Detailed, Delay,
                "held requests whose client left before the release (their slot stays counted)";
            committed: Counter, Detailed, Commit,
                "costs settled when the response ended; the sum of the eight `commit_*` reasons below";
            commit_usage_read: Counter, Detailed, Commit,
                "settled at the usage the response reported (JSON body, event stream or header)";
            commit_on_error: Counter, Detailed, Commit,
                "settled at `on_error` — the upstream itself answered 5xx";
            commit_no_usage: Counter, Detailed, Commit,
                "a response (1xx–4xx) without a readable usage: the estimate stands (an OpenAI stream without `stream_options.include_usage`, a usage under a field not configured, a missing header)";
            commit_over_max_bytes: Counter, Detailed, Commit,
                "the JSON body, or an event of the stream, was over `body.max_bytes` and no usage was found: the estimate stands";
            commit_compressed: Counter, Detailed, Commit,
                "the body came with a `content-encoding` other than `identity` (weir asks for `identity`): the estimate stands";
            commit_aborted: Counter, Detailed, Commit,
                "the response was cut (client gone, reset) before a usage came: the estimate stands";
            commit_local_reply: Counter, Detailed, Commit,
                "Envoy answered the request itself (a route timeout's 504, a 503 for an unreachable or reset upstream, another filter's reply): the estimate stands, since the upstream may still be generating";
            commit_not_forwarded: Counter, Detailed, Commit,
                "the request never reached the upstream (a later rule denied it, or its client left while a bridge call decided it): nothing is charged";
            commit_units_refunded: Counter, Detailed, Commit,
                "units given back (the estimate above the actual cost, while the refund was exact)";
            commit_units_charged: Counter, Detailed, Commit,
                "units charged beyond the estimate (debt)";
            commit_errors: Counter, Detailed, Commit,
                "settling failed — shared data, or for a global rule the bridge (call failed, answer not 200 or a bad reply, queue full); the estimate stands";
            commit_clamped: Counter, Detailed, Commit,
                "`commit.clamp`: requests reserved less than their estimate (the key had less left), sent upstream with their body's output lowered to fit";
            in_flight_released: Counter, Default, Concurrency,
                "streams that ended (however they ended), their places given back at once or, when shared data refused, on the worker's next tick; equal to `allowed` once no request of the rule is in flight";
            in_flight_release_errors: Counter, Default, Concurrency,
                "a give-back shared data refused when the stream ended (a host error, or every CAS attempt lost): the worker keeps the place marked ended and gives it back on its next tick";
            in_flight_reclaimed: Counter, Default, Concurrency,
                "units of places dropped because no live worker re-counted them for a whole 5 s epoch — places of a Wasm VM that died with requests in flight, or give-backs never written; each was back within 10 s of its last count";
            concurrency_limit: Gauge, Default, Adaptive,
                "the rule's current limit (rounded down)";
            latency_sample_us: Gauge, Default, Adaptive,
                "the last interval's latency quantile (`latency`, p90 by default), µs";
            latency_baseline_us: Gauge, Default, Adaptive,
                "the latency the controller takes as the service's uncongested one, µs";
            share_keys: Gauge, Detailed, Share,
                "keys the parent decided last (on any worker of this Envoy) tracks in its window: those active in the window before and those asking in this one";
            share_units: Gauge, Detailed, Share,
                "the share of the parent's limit the key decided last is entitled to at least (`⌊limit × w / Σ w⌋` among the keys tracked), units";
            share_untracked: Counter, Detailed, Share,
                "requests of a key past `share.max_keys`, or naming no key: entitled to nothing, they got only what no key was entitled to";
            keys_without_controller: Counter, Detailed, PerKey,
                "requests whose key found no controller of its own (every record it may use held by an active key): decided against `max_in_flight` (a `per_key` rule has no limit gauges: its limits are one per key)";
        }
    };
}
pub(crate) use rule_stats;

/// Every plugin-wide stat, by group: `group(Group) { field [= "name"]: Kind, Level,
/// "doc"; … }`, handed to `$then!`.
macro_rules! plugin_stats {
    ($then:ident) => {
        $then! {
            store(Store) {
                cas_retries: Counter, Default,
                    "a worker lost a compare-and-swap race and decided again: normal under contention on hot keys";
                cas_give_ups: Counter, Default,
                    "32 lost races in a row: a local rule failed open, a global rule went to the bridge";
                slot_takeovers: Counter, Default,
                    "a slot whose state carried no information any more was reused: harmless";
            }
            bridge(Bridge) {
                calls: Counter, Default,
                    "calls made to the bridge";
                joined: Counter, Default,
                    "a request waited for a call already asking about its keys instead of making its own";
                refused: Counter, Default,
                    "Envoy refused a call at once: the bridge cluster's circuit breaker was full, and the request got 429 — or the cluster has no host, and once Envoy has taken no call for longer than the timeout the failure mode applies, also counted in `errors_unavailable` ([global.md](global.md#what-a-crowd-gets))";
                resent: Counter, Detailed,
                    "Envoy could not deliver a call — its own 503 for no healthy host or a connection refused or reset — so it was sent once more, with what was left of `bridge.timeout`; also counted in `calls`";
                skipped: Counter, Default,
                    "not called: 3 calls of this worker failed in a row, over at least 100 ms, less than a second ago, so the request went straight to its failure mode";
                errors_timeout: Counter, Default,
                    "no answer within `bridge.timeout`";
                errors_unavailable: Counter, Default,
                    "a 503: no bridge reachable even when sent once more, a cluster Envoy does not know or without hosts, the bridge's own 503 when Redis fails, or a connection reset or refused before any status";
                errors_status: Counter, Default,
                    "any other non-2xx: 401 for a wrong secret, 400 for a request the bridge refuses (the log line quotes its reason), 500 for a Redis error that retrying will not fix";
                errors_bad_body: Counter, Default,
                    "a reply that does not decode";
                latency_us: Histogram, Default,
                    "a call's round trip, µs, each worker's at most one a millisecond: every call below 1,000 calls a second per worker, a sample above (it appears after Envoy's 5-second stats flush)";
            }
            vm(Vm) {
                buffer_full: Counter, Detailed,
                    "bodies a VM did not read because its `max_buffered_bytes` was full: a request body (estimated at its rule's cost `max`) or a response body (its request keeps its estimate, also counted in the rule's `commit_over_max_bytes`)";
                host_calls: Counter, All,
                    "calls every VM of the plugin made into Envoy (shared data, headers, the clock, logs, stats)";
                calls_clock = "calls.clock": Counter, All,
                    "calls into Envoy of kind `clock` (each `vm.calls.<kind>` counts one kind of `host_calls`)";
                calls_header = "calls.header": Counter, All,
                    "… of kind `header`";
                calls_body = "calls.body": Counter, All,
                    "… of kind `body`";
                calls_shared_get = "calls.shared_get": Counter, All,
                    "… of kind `shared_get`";
                calls_shared_set = "calls.shared_set": Counter, All,
                    "… of kind `shared_set`";
                calls_property = "calls.property": Counter, All,
                    "… of kind `property`";
                calls_dispatch = "calls.dispatch": Counter, All,
                    "… of kind `dispatch`";
                calls_stream = "calls.stream": Counter, All,
                    "… of kind `stream`";
                calls_stats = "calls.stats": Counter, All,
                    "… of kind `stats`";
                calls_log = "calls.log": Counter, All,
                    "… of kind `log`";
                calls_tick = "calls.tick": Counter, All,
                    "… of kind `tick`";
                entries: Counter, All,
                    "callbacks Envoy made into the VM";
                bytes_in: Counter, All,
                    "bytes copied into the VM";
                bytes_out: Counter, All,
                    "bytes the VM handed out";
            }
        }
    };
}
pub(crate) use plugin_stats;

macro_rules! rule_table {
    ($($field:ident $(= $name:literal)?: $kind:ident, $level:ident, $applies:ident, $doc:literal;)*) => {
        &[$(StatDecl {
            group: Group::Rule(Applies::$applies),
            name: stat_name!($field $($name)?),
            kind: StatKind::$kind,
            level: StatsLevel::$level,
            doc: $doc,
        },)*]
    };
}

macro_rules! plugin_table {
    ($($group:ident($variant:ident) {
        $($field:ident $(= $name:literal)?: $kind:ident, $level:ident, $doc:literal;)*
    })*) => {
        &[$($(StatDecl {
            group: Group::$variant,
            name: stat_name!($field $($name)?),
            kind: StatKind::$kind,
            level: StatsLevel::$level,
            doc: $doc,
        },)*)*]
    };
}

/// Every rule stat, in declaration order.
pub const RULE_STATS: &[StatDecl] = rule_stats!(rule_table);

/// Every plugin-wide stat, in declaration order.
pub const PLUGIN_STATS: &[StatDecl] = plugin_stats!(plugin_table);

/// The rule stats a rule that `applies` to defines at `level`, one per [`Applies`] it
/// has: stats, then Prometheus series.
pub fn rule_count(level: StatsLevel, applies: Applies) -> (usize, usize) {
    count(
        RULE_STATS
            .iter()
            .filter(|s| s.group == Group::Rule(applies) && level.includes(s.level)),
    )
}

/// The plugin-wide stats a plugin defines at `level`, with or without a bridge: stats,
/// then Prometheus series.
pub fn plugin_count(level: StatsLevel, bridge: bool) -> (usize, usize) {
    count(
        PLUGIN_STATS
            .iter()
            .filter(|s| (bridge || s.group != Group::Bridge) && level.includes(s.level)),
    )
}

fn count<'a>(stats: impl Iterator<Item = &'a StatDecl>) -> (usize, usize) {
    stats.fold((0, 0), |(n, series), s| (n + 1, series + s.series()))
}

/// docs/operations.md's tables of the stats, rendered from the declarations: the rule
/// stats, the plugin-wide ones, and the count per level (`tests/tests/docs_examples.rs`
/// fails when the doc has other ones).
pub fn markdown_tables() -> String {
    let mut out = String::new();
    out.push_str(
        "Per rule, `weir.PLUGIN.rule.NAME.…` (Prometheus: `weir_rule_…{weir_plugin,weir_rule}`):\n\n\
         | stat | type | level | rules | counts |\n|---|---|---|---|---|\n",
    );
    for s in RULE_STATS {
        let Group::Rule(applies) = s.group else {
            continue;
        };
        out.push_str(&format!(
            "| `{}` | {} | {} | {} | {} |\n",
            s.name,
            s.kind.name(),
            s.level.name(),
            applies.describe(),
            s.doc
        ));
    }
    out.push_str(
        "\nPlugin-wide, `weir.PLUGIN.GROUP.…` (Prometheus: `weir_GROUP_…{weir_plugin}`); the \
         `bridge` group is defined when the configuration has a `bridge`:\n\n\
         | stat | type | level | counts |\n|---|---|---|---|\n",
    );
    for s in PLUGIN_STATS {
        out.push_str(&format!(
            "| `{}.{}` | {} | {} | {} |\n",
            s.group.segment(),
            s.name,
            s.kind.name(),
            s.level.name(),
            s.doc
        ));
    }
    out.push_str(
        "\nStats defined per level (Prometheus series in parentheses where they differ: a \
         histogram is 22). A rule defines the `every rule` row and the row of each feature \
         it has; a plugin adds its plugin-wide row once:\n\n| defined for |",
    );
    for level in StatsLevel::ALL {
        out.push_str(&format!(" `{}` |", level.name()));
    }
    out.push_str("\n|---|");
    for _ in StatsLevel::ALL {
        out.push_str("---:|");
    }
    out.push('\n');
    let cell = |(n, series): (usize, usize)| {
        if n == series {
            format!(" {n} |")
        } else {
            format!(" {n} ({series}) |")
        }
    };
    for applies in Applies::ALL {
        out.push_str(&format!("| rule: {} |", applies.describe()));
        for level in StatsLevel::ALL {
            out.push_str(&cell(rule_count(level, applies)));
        }
        out.push('\n');
    }
    for (what, bridge) in [
        ("plugin, without a `bridge`", false),
        ("plugin, with a `bridge`", true),
    ] {
        out.push_str(&format!("| {what} |"));
        for level in StatsLevel::ALL {
            out.push_str(&cell(plugin_count(level, bridge)));
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_shaped_as_envoy_and_the_stats_tags_expect() {
        let mut seen = std::collections::BTreeSet::new();
        for s in RULE_STATS.iter().chain(PLUGIN_STATS) {
            let full = format!("{}.{}", s.group.segment(), s.name);
            assert!(seen.insert(full.clone()), "{full} declared twice");
            assert!(
                s.name
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '.'),
                "{full}"
            );
            // The `weir_rule` tag's regex ends with `[a-z_]+$`.
            if matches!(s.group, Group::Rule(_)) {
                assert!(!s.name.contains('.'), "{full}");
            }
            assert!(!s.doc.is_empty() && !s.doc.contains('|'), "{full}");
        }
    }

    #[test]
    fn level_names_are_the_config_names() {
        for level in StatsLevel::ALL {
            let parsed: StatsLevel =
                serde_json::from_str(&format!("\"{}\"", level.name())).unwrap_or_default();
            assert_eq!(parsed, level);
        }
    }
}
