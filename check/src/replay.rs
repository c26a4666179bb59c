//! Replay: a candidate config run over traffic an Envoy recorded, to see what it would
//! have limited before it is rolled out.
//!
//! **The record.** One JSON object per line, written by Envoy's file access logger with
//! the `json_format` that [`log_format`] builds from a config: the request's start
//! (`start_us`, µs since the epoch) and duration (`duration_us`, for concurrency
//! rules), its status, whether a delaying rule held it (`delay_ms`), weir's decisions
//! (the filter state `wasm.weir.decisions`, `rule:outcome:source:cost:decided_at_us`,
//! written when the plugin has `"response": {"filter_state": "all"}`), and every fact
//! the config's rules read: request headers under `headers` (pseudo-headers included),
//! Envoy attributes under `attributes` by dotted path. Values are the raw request
//! values, or their keyed hashes in a log rewritten by `weir-check log-hash`
//! ([`crate::log_hash`]): a candidate that reads a hashed fact in a way the hash does
//! not keep is refused.
//!
//! **The replay.** Every line in time order through one [`Engine`] over one
//! [`MemoryStore`] and one worker: a single-worker Envoy. Several Envoys' logs are
//! replayed as one stream ([`Log::merge`]): ordered by time, equal times by log, then
//! line. A request's instant is the
//! one weir decided at when it logged a decision (the first), otherwise its start; so a
//! local rule replayed with the config that served the traffic decides as it did, to
//! the microsecond. An Envoy with several workers gave each its own reservoirs, and
//! its workers' requests of one key may commit in another order than their clocks say:
//! the replay is one worker's view (measured against two workers in
//! tests/tests/replay.rs, `two_workers_replayed_as_one`).
//!
//! ```
//! use weir_core::key::Seed;
//! use weir_check::replay::{parse_log, replay, RecordId, Replayed};
//!
//! // One request an hour per user; two requests of user `a`, one of `b`.
//! let candidate = br#"{"rules":[{"name":"per-user","key":[{"header":"x-user"}],
//!     "limit":{"algorithm":"fixed_window","limit":1,"window":"1h"}}]}"#;
//! let log = parse_log(concat!(
//!     r#"{"start_us":"1000000","headers":{"x-user":"a"}}"#, "\n",
//!     r#"{"start_us":"1000100","headers":{"x-user":"a"}}"#, "\n",
//!     r#"{"start_us":"1000200","headers":{"x-user":"b"}}"#, "\n",
//! ));
//! let report = replay(candidate, &log, &Seed([0; 16])).unwrap();
//! let rule = &report.rules[0];
//! assert_eq!((rule.matched, rule.allowed, rule.limited), (3, 2, 1));
//! assert_eq!(rule.top_keys, [("=a".to_string(), 1)]);
//! let second = RecordId::new(0, 2);
//! assert_eq!(report.decisions[&second], [("per-user".to_string(), Replayed::Limited)]);
//! ```
//!
//! **Global rules** are replayed as one central limiter, which is what a fleet's
//! leases converge to: the rule becomes local with the configured limit, without
//! reservoirs (every request decides in the one store), listed in
//! [`Report::central`]. That predicts what the quota allows across the traffic the log
//! holds: replay the logs of every Envoy together ([`Log::merge`]) for the fleet's.
//! With exact calls it predicted every served decision of two Envoys in
//! tests/tests/replay.rs; it cannot predict what leases, reservations and cached
//! denials decide ahead of Redis, a GCRA rule with leases (its burst runs reduced in
//! Redis), or what the bridge's failure mode decided while it was down
//! (docs/operations.md gives the figures measured). A `sliding_log` rule (Redis only)
//! is not replayed.
//!
//! **Concurrency rules** with a fixed `max_in_flight` hold a place from the instant a
//! request was decided until [`Record::end_us`] (its start + `duration_us`).
//!
//! **Delaying rules** (`on_limit.delay`) hold a request as the filter does (in the
//! worker's queue of the rule, at most `queue`) and release it when it is due; the
//! report counts the requests delayed and their waits. A request the served Envoy held
//! (`delay_ms` logged) is replayed from its start, not its decision (logged at its
//! release): by some µs, close to a slot, it can come out the other way.
//!
//! **Not replayed (yet):** adaptive concurrency rules and `sliding_log` global rules. They are left out of the candidate (listed in
//! [`Report::not_replayed`]) and the other rules are replayed as if they had allowed
//! every request.
//!
//! A line that is not a record is counted and reported with its number, never fatal.

use std::collections::BTreeMap;
use std::num::NonZeroU64;

use serde_json::{Map, Value};

use crate::log_hash::{self, Form, Read};
use weir_core::config::{self, Config};
use weir_core::engine::{Engine, Evaluation, PendingCommit, RuleOutcome};
use weir_core::key::{encode_part, Seed};
use weir_core::rules::{Fact, FactId, FactSource, Facts, Rule, Scope};
use weir_core::store::memory::MemoryStore;
use weir_core::time::Micros;
use weir_core::worker::Worker;

/// The filter state weir writes its decisions to.
pub const DECISIONS_FILTER_STATE: &str = "wasm.weir.decisions";

/// How many keys the report lists per rule.
pub const TOP_KEYS: usize = 10;

/// The Envoy access-log `json_format` that records what `config`'s rules read, and the
/// facts it cannot record (named as in the config's fact table).
pub fn log_format(config: &Config) -> (Value, Vec<String>) {
    let mut headers = Map::new();
    let mut attributes = Map::new();
    let mut unrecorded = Vec::new();
    for fact in config.facts.iter() {
        match fact {
            Fact::Header(name) => {
                // Envoy's `%REQ()%` takes pseudo-headers in upper case (`:PATH`).
                let arg = if name.starts_with(':') {
                    name.to_uppercase()
                } else {
                    name.clone()
                };
                headers.insert(name.clone(), Value::String(format!("%REQ({arg})%")));
            }
            Fact::Property(path) => match attribute_command(path) {
                Some(command) => {
                    attributes.insert(path.join("."), Value::String(command));
                }
                None => unrecorded.push(format!("attribute {}", path.join("."))),
            },
            Fact::RequestBodyEstimate(_) => unrecorded.push("request body estimate".into()),
            // Read only with a body estimate, already named.
            Fact::RequestBodyPrompt(_) => {}
        }
    }
    let mut format = Map::new();
    format.insert("start_us".into(), "%START_TIME(%s%6f)%".into());
    // When a concurrency rule's place is given back, for its replay: from the first
    // byte received to the last sent downstream (`START_TIME` is no endpoint of
    // COMMON_DURATION); the filter gives the place back as the response passes it, a
    // few µs before its last byte is sent.
    format.insert(
        "duration_us".into(),
        "%COMMON_DURATION(DS_RX_BEG:DS_TX_END:us)%".into(),
    );
    format.insert("status".into(), "%RESPONSE_CODE%".into());
    // A held request's decision is logged at its release: this says it was held.
    format.insert("delay_ms".into(), "%RESP(x-weir-delay-ms)%".into());
    format.insert(
        "decisions".into(),
        Value::String(format!("%FILTER_STATE({DECISIONS_FILTER_STATE}:PLAIN)%")),
    );
    format.insert("headers".into(), Value::Object(headers));
    format.insert("attributes".into(), Value::Object(attributes));
    (Value::Object(format), unrecorded)
}

/// The access-log command that logs an attribute as the filter reads it, if there is one.
fn attribute_command(path: &[String]) -> Option<String> {
    let path: Vec<&str> = path.iter().map(String::as_str).collect();
    match path.as_slice() {
        // The attribute carries the port, as `client_ip` reads it (it strips the port).
        ["source", "address"] => Some("%DOWNSTREAM_REMOTE_ADDRESS%".into()),
        ["destination", "address"] => Some("%DOWNSTREAM_LOCAL_ADDRESS%".into()),
        ["request", "host"] => Some("%REQ(:AUTHORITY)%".into()),
        ["request", "path"] => Some("%REQ(:PATH)%".into()),
        ["request", "method"] => Some("%REQ(:METHOD)%".into()),
        ["metadata", "filter_metadata", namespace, keys @ ..] if !keys.is_empty() => Some(format!(
            "%DYNAMIC_METADATA({namespace}:{})%",
            keys.join(":")
        )),
        _ => None,
    }
}

/// One rule's decision as the served Envoy logged it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoggedDecision {
    pub rule: String,
    /// `allowed`, `limited`, `shadow_limited`, `store_failed`, `bridge_failed`.
    pub outcome: String,
    pub at_us: u64,
}

/// Where a record was read: which log (0-based, in the order the logs were given to
/// [`Log::merge`]; 0 for a single log) and which line of it (1-based).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RecordId {
    pub log: usize,
    pub line: usize,
}

impl RecordId {
    pub fn new(log: usize, line: usize) -> Self {
        RecordId { log, line }
    }
}

/// One request of the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub id: RecordId,
    pub start_us: u64,
    /// From its start until its last byte was sent downstream (µs); `None` when the
    /// log does not record it or Envoy had no such instant (a stream reset early).
    pub duration_us: Option<u64>,
    /// How long a delaying rule held it (`x-weir-delay-ms` of its response), if one did.
    pub delay_ms: Option<u64>,
    pub status: Option<u16>,
    pub decisions: Vec<LoggedDecision>,
    pub headers: BTreeMap<String, String>,
    pub attributes: BTreeMap<String, String>,
}

impl Record {
    /// The instant the replay decides this request at: weir's own, when it decided;
    /// its start when it was not decided, or was held (its decision is logged at its
    /// release, and when it arrived is not logged to the µs).
    pub fn at_us(&self) -> u64 {
        match (self.delay_ms, self.decisions.first()) {
            (None, Some(first)) => first.at_us,
            _ => self.start_us,
        }
    }

    /// The instant its stream ended, as the replay gives a concurrency rule's place
    /// back: its start + duration, never before it was decided; without a duration,
    /// the instant it was decided (it held no place).
    pub fn end_us(&self) -> u64 {
        let end = self.duration_us.map(|d| self.start_us.saturating_add(d));
        end.unwrap_or(0).max(self.at_us())
    }
}

/// A line that is not a record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadLine {
    /// Which log, as in [`RecordId::log`].
    pub log: usize,
    pub line: usize,
    pub error: String,
}

/// A parsed log: its records, and the lines that are not records.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Log {
    pub records: Vec<Record>,
    pub bad_lines: Vec<BadLine>,
}

impl Log {
    /// Several Envoys' logs as one: each record and bad line is renumbered with its
    /// log's position in `logs`. The replay orders every record by its instant, and
    /// records of equal instants by log, then line: the logs are merged by time,
    /// stably.
    pub fn merge(logs: Vec<Log>) -> Log {
        let mut merged = Log::default();
        for (at, log) in logs.into_iter().enumerate() {
            merged.records.extend(log.records.into_iter().map(|mut r| {
                r.id.log = at;
                r
            }));
            merged
                .bad_lines
                .extend(log.bad_lines.into_iter().map(|mut b| {
                    b.log = at;
                    b
                }));
        }
        merged
    }
}

/// Parses a whole log; empty lines are skipped.
pub fn parse_log(text: &str) -> Log {
    let mut records = Vec::new();
    let mut bad = Vec::new();
    for (at, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        match parse_record(at + 1, line) {
            Ok(record) => records.push(record),
            Err(error) => bad.push(BadLine {
                log: 0,
                line: at + 1,
                error,
            }),
        }
    }
    Log {
        records,
        bad_lines: bad,
    }
}

/// Parses one line of the [`log_format`] record.
pub fn parse_record(line: usize, text: &str) -> Result<Record, String> {
    let value: Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
    let object = value.as_object().ok_or("not a JSON object")?;
    let start_us = object
        .get("start_us")
        .and_then(number)
        .ok_or("start_us: missing or not a number of µs")?;
    let status = object
        .get("status")
        .and_then(number)
        .and_then(|s| u16::try_from(s).ok());
    let decisions = match object.get("decisions") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(s)) => parse_decisions(s)?,
        Some(_) => return Err("decisions: not a string".into()),
    };
    Ok(Record {
        id: RecordId::new(0, line),
        start_us,
        duration_us: object.get("duration_us").and_then(number),
        delay_ms: object.get("delay_ms").and_then(number),
        status,
        decisions,
        headers: strings(object.get("headers"), "headers")?,
        attributes: strings(object.get("attributes"), "attributes")?,
    })
}

/// A number, or a string of digits (Envoy logs some commands as strings).
fn number(value: &Value) -> Option<u64> {
    match value {
        Value::Number(n) => n.as_u64(),
        Value::String(s) => s.parse().ok(),
        _ => None,
    }
}

/// The string values of an object; `null` (Envoy's "not there") is left out.
fn strings(value: Option<&Value>, field: &str) -> Result<BTreeMap<String, String>, String> {
    let mut out = BTreeMap::new();
    let Some(value) = value else {
        return Ok(out);
    };
    let object = value
        .as_object()
        .ok_or_else(|| format!("{field}: not an object"))?;
    for (name, value) in object {
        match value {
            Value::Null => {}
            Value::String(s) => {
                out.insert(name.clone(), s.clone());
            }
            Value::Number(n) => {
                out.insert(name.clone(), n.to_string());
            }
            _ => return Err(format!("{field}.{name}: not a string")),
        }
    }
    Ok(out)
}

fn parse_decisions(text: &str) -> Result<Vec<LoggedDecision>, String> {
    if text.is_empty() || text == "-" {
        return Ok(Vec::new());
    }
    text.split(',')
        .map(|d| {
            // Rule names have no ':' (the config's name rule).
            let fields: Vec<&str> = d.split(':').collect();
            match fields.as_slice() {
                [rule, outcome, _source, _cost, at] => Ok(LoggedDecision {
                    rule: (*rule).to_string(),
                    outcome: (*outcome).to_string(),
                    at_us: at
                        .parse()
                        .map_err(|_| format!("decisions: {d:?}: bad decided_at_us"))?,
                }),
                _ => Err(format!(
                    "decisions: {d:?} is not rule:outcome:source:cost:decided_at_us"
                )),
            }
        })
        .collect()
}

impl FactSource for &Record {
    fn fetch(&mut self, fact: &Fact) -> Option<Vec<u8>> {
        match fact {
            Fact::Header(name) => self.headers.get(name),
            Fact::Property(path) => self.attributes.get(&path.join(".")),
            Fact::RequestBodyEstimate(_) | Fact::RequestBodyPrompt(_) => None,
        }
        .map(|v| v.clone().into_bytes())
    }
}

/// What the replay decided for one request under one rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replayed {
    Allowed,
    Limited,
    ShadowLimited,
}

impl Replayed {
    /// As the filter state spells it.
    pub fn name(self) -> &'static str {
        match self {
            Replayed::Allowed => "allowed",
            Replayed::Limited => "limited",
            Replayed::ShadowLimited => "shadow_limited",
        }
    }

    fn denies(self) -> bool {
        matches!(self, Replayed::Limited | Replayed::ShadowLimited)
    }
}

/// One rule's figures over the replay.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RuleFigures {
    pub rule: String,
    pub matched: u64,
    pub allowed: u64,
    pub limited: u64,
    pub shadow_limited: u64,
    /// Of the allowed, requests this (delaying) rule held first, and their waits summed
    /// (µs).
    pub delayed: u64,
    pub delayed_us: u64,
    /// Keys by requests limited (shadow included), most first, at most [`TOP_KEYS`].
    pub top_keys: Vec<(String, u64)>,
    /// Requests limited (shadow included) per bucket of [`Options::bucket_us`], by the
    /// bucket's start (µs since the epoch, a multiple of the bucket's width).
    pub limited_over_time: BTreeMap<u64, u64>,
    /// Against the decisions the served Envoy logged for a rule of the same name:
    /// requests it allowed that the candidate limits, and the reverse.
    pub newly_limited: u64,
    pub newly_allowed: u64,
    /// Requests the served Envoy logged a decision of this rule for.
    pub served_decided: u64,
    /// Of the requests both decided, those where the candidate agrees.
    pub agreed: u64,
}

/// The whole replay.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    pub requests: u64,
    /// With a concurrency rule replayed: requests the log has no duration of, which
    /// held their place for no time at all.
    pub without_duration: u64,
    /// The width of the buckets of [`RuleFigures::limited_over_time`] (µs).
    pub bucket_us: u64,
    pub bad_lines: Vec<BadLine>,
    pub rules: Vec<RuleFigures>,
    /// Rules of the candidate not replayed, with why.
    pub not_replayed: Vec<(String, String)>,
    /// Global rules replayed as one central limiter.
    pub central: Vec<String>,
    /// Per request, what the candidate decided for each rule that decided.
    pub decisions: BTreeMap<RecordId, Vec<(String, Replayed)>>,
}

/// How the replay treats a rule of the candidate.
enum Treatment {
    AsIs,
    /// A concurrency rule with a fixed `max_in_flight`: a request holds its place from
    /// the instant it was decided until [`Record::end_us`].
    InFlight,
    /// A global rule, as one central limiter.
    Central,
    NotReplayed(&'static str),
}

fn treatment(rule: &Rule) -> Treatment {
    match &rule.scope {
        Scope::Local(_) => Treatment::AsIs,
        Scope::Global(_) if rule.algorithm_name() == "sliding_log" => {
            Treatment::NotReplayed("global sliding_log rule: runs only in Redis, not replayed")
        }
        Scope::Global(_) => Treatment::Central,
        Scope::Concurrency(c) if c.adaptive.is_some() => Treatment::NotReplayed(
            "adaptive concurrency rule: its limit follows the latencies the upstream showed \
             under the served config, and a candidate changes the load that made them: not \
             replayed",
        ),
        Scope::Concurrency(_) => Treatment::InFlight,
    }
}

/// How a replay runs and counts.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Options {
    /// Keys the slot hash: any is fine unless a rule's `max_keys` is so small that keys
    /// collide.
    pub seed: Seed,
    /// The width of the buckets the report counts 429s over time in (µs).
    pub bucket_us: NonZeroU64,
}

/// One second: the default bucket.
pub const DEFAULT_BUCKET_US: NonZeroU64 = match NonZeroU64::new(1_000_000) {
    Some(us) => us,
    None => unreachable!(),
};

impl Options {
    /// Buckets of [`DEFAULT_BUCKET_US`].
    pub fn new(seed: Seed) -> Self {
        Options {
            seed,
            bucket_us: DEFAULT_BUCKET_US,
        }
    }
}

/// Parses a bucket width as the config writes durations (`"100ms"`, `"1s"`, `"1m"`).
/// The error names `option` and the value.
pub fn parse_bucket(option: &str, text: &str) -> Result<NonZeroU64, String> {
    weir_core::config::duration::parse_duration(text)
        .ok()
        .and_then(NonZeroU64::new)
        .ok_or_else(|| {
            format!(
                "{option} {text:?}: not a duration: expected a whole number followed by us, \
                 ms, s, m, h or d (e.g. \"100ms\"), above 0 and at most 30 days"
            )
        })
}

/// Replays `log` through the candidate config (its JSON), with [`Options::new`]`(seed)`.
pub fn replay(candidate_json: &[u8], log: &Log, seed: &Seed) -> Result<Report, String> {
    replay_with(candidate_json, log, &Options::new(*seed))
}

/// Replays `log` through the candidate config (its JSON).
pub fn replay_with(candidate_json: &[u8], log: &Log, options: &Options) -> Result<Report, String> {
    let seed = &options.seed;
    let config = config::parse(candidate_json).map_err(|e| e.to_string())?;
    check_hashed(&config, log)?;
    let mut not_replayed = Vec::new();
    let mut central = Vec::new();
    for rule in &config.rules {
        match treatment(rule) {
            Treatment::AsIs => {}
            Treatment::InFlight if !log.records.iter().any(|r| r.duration_us.is_some()) => {
                not_replayed.push((
                    rule.name.clone(),
                    "concurrency rule: the log records no duration_us (record it with the \
                     format weir-check log-format prints)"
                        .to_string(),
                ))
            }
            Treatment::InFlight => {}
            Treatment::Central => central.push(rule.name.clone()),
            Treatment::NotReplayed(why) => not_replayed.push((rule.name.clone(), why.to_string())),
        }
    }
    if not_replayed.len() == config.rules.len() {
        // Nothing to replay: a config needs a rule.
        return Ok(Report {
            requests: log.records.len() as u64,
            bucket_us: options.bucket_us.get(),
            bad_lines: log.bad_lines.clone(),
            not_replayed,
            ..Report::default()
        });
    }
    let config = if not_replayed.is_empty() && central.is_empty() {
        config
    } else {
        replayable(candidate_json, &not_replayed, &central)?
    };
    let engine = Engine::new(config);
    let store = MemoryStore::new();
    engine.prepare(&store).map_err(|e| format!("{e:?}"))?;
    let mut worker = engine.worker();

    let mut order: Vec<&Record> = log.records.iter().collect();
    order.sort_by_key(|r| (r.at_us(), r.id));

    let bucket_us = options.bucket_us.get();
    let tallies: Vec<Tally> = (engine.config.rules.iter())
        .map(|rule| Tally::new(rule, bucket_us))
        .collect();
    let mut run = Run {
        engine: &engine,
        store: &store,
        worker: &mut worker,
        seed,
        tallies,
        decisions: BTreeMap::new(),
        in_flight: InFlight::default(),
        held: BTreeMap::new(),
    };
    // Arrivals in time order, and held requests released when due (a release due at the
    // instant of an arrival comes first, as the filter's tick runs before it).
    let mut arrivals = order.into_iter().enumerate().peekable();
    loop {
        let due = run.held.keys().next().map(|&(due_us, _)| due_us);
        match (arrivals.peek().map(|(_, r)| r.at_us()), due) {
            (None, None) => break,
            (Some(arrival), Some(due)) if due <= arrival => run.release(due),
            (None, Some(due)) => run.release(due),
            _ => {
                if let Some((at, record)) = arrivals.next() {
                    run.arrive(u32::try_from(at).unwrap_or(u32::MAX), record);
                }
            }
        }
    }
    let Run {
        tallies,
        decisions,
        in_flight,
        ..
    } = run;
    let without_duration = if in_flight.held {
        log.records
            .iter()
            .filter(|r| r.duration_us.is_none())
            .count() as u64
    } else {
        0
    };
    Ok(Report {
        requests: log.records.len() as u64,
        without_duration,
        bucket_us,
        bad_lines: log.bad_lines.clone(),
        rules: tallies
            .into_iter()
            .map(|t| t.finish(&log.records))
            .collect(),
        not_replayed,
        central,
        decisions,
    })
}

/// One replay under way: the engine's state, what each rule counted, and the requests
/// a delaying rule holds.
struct Run<'e, 'l> {
    engine: &'e Engine,
    store: &'e MemoryStore,
    worker: &'e mut Worker,
    seed: &'e Seed,
    tallies: Vec<Tally<'e>>,
    decisions: BTreeMap<RecordId, Vec<(String, Replayed)>>,
    in_flight: InFlight,
    /// Held requests by (due µs, context): the record and its evaluation.
    held: BTreeMap<(u64, u32), (&'l Record, Evaluation)>,
}

impl<'l> Run<'_, 'l> {
    /// `record` arrives (`context`: its place in time order, as the filter's context id).
    fn arrive(&mut self, context: u32, record: &'l Record) {
        self.decide(context, record, None, record.at_us());
    }

    /// Releases every held request due by `now_us`, at `now_us`.
    fn release(&mut self, now_us: u64) {
        // The worker's queue gives them up as the filter's tick takes them: in the order
        // of `held`, (due, context). Every call releases at least one (the loop's next).
        let _ = self.worker.waiting.take_due(now_us);
        let due: Vec<(u64, u32)> = self
            .held
            .range(..=(now_us, u32::MAX))
            .map(|(k, _)| *k)
            .collect();
        for key in due {
            if let Some((record, eval)) = self.held.remove(&key) {
                self.decide(key.1, record, Some(eval), now_us);
            }
        }
    }

    /// Decides `record` at `now_us`: evaluated on arrival, or released (`held`).
    fn decide(&mut self, context: u32, record: &'l Record, held: Option<Evaluation>, now_us: u64) {
        let (engine, store, seed) = (self.engine, self.store, self.seed);
        self.in_flight.end_until(engine, store, self.worker, now_us);
        let mut facts = Facts::new(&engine.config.facts, record);
        let now = Micros(now_us);
        let eval = match held {
            None => engine.evaluate(store, self.worker, seed, &mut facts, now),
            Some(mut eval) => {
                engine.release(&mut eval, store, self.worker, seed, &mut facts, now);
                eval
            }
        };
        self.decided(context, record, eval, now_us);
    }

    /// The engine decided `record` at `now_us`, or holds it.
    fn decided(&mut self, context: u32, record: &'l Record, mut eval: Evaluation, now_us: u64) {
        if let Some(held) = &eval.held {
            let due_us = held.hold.due_us;
            if self.worker.waiting.hold(context, held.rule, due_us) {
                self.held.insert((due_us, context), (record, eval));
                return;
            }
            // As the filter: no room (never expected) denies it.
            eval.deny_held(Micros(now_us));
        }
        self.in_flight.hold(self.engine, record, &eval.commits);
        let mut facts = Facts::new(&self.engine.config.facts, record);
        let mut decided = Vec::new();
        for report in &eval.reports {
            let replayed = match report.outcome {
                RuleOutcome::Allowed => Replayed::Allowed,
                RuleOutcome::Limited => Replayed::Limited,
                RuleOutcome::ShadowLimited => Replayed::ShadowLimited,
                _ => continue,
            };
            if let Some(tally) = self.tallies.get_mut(report.rule.index()) {
                let delayed = eval.delayed.as_ref().filter(|d| d.rule == report.rule);
                tally.count(record, replayed, &mut facts, now_us);
                if let Some(delayed) = delayed.filter(|_| replayed == Replayed::Allowed) {
                    tally.figures.delayed += 1;
                    tally.figures.delayed_us += delayed.waited.us();
                }
                decided.push((tally.rule.name.clone(), replayed));
            }
        }
        self.decisions.insert(record.id, decided);
    }
}

/// The places of concurrency rules held by replayed requests, by the instant their
/// stream ended.
#[derive(Default)]
struct InFlight {
    /// (end µs, record, the place): given back in end order.
    ends: std::collections::BinaryHeap<std::cmp::Reverse<(u64, RecordId, usize)>>,
    places: Vec<Option<PendingCommit>>,
    /// Whether any request held a place.
    held: bool,
    /// The last tick (µs): places are re-counted once per second of the log, as the
    /// filter's tick does, so that a request longer than an epoch keeps its place.
    ticked_us: u64,
}

impl InFlight {
    /// The places `record`'s admission took (its concurrency rules' commits).
    fn hold(&mut self, engine: &Engine, record: &Record, commits: &[PendingCommit]) {
        for commit in commits {
            let concurrency = engine
                .config
                .rule(commit.rule)
                .is_some_and(|r| matches!(r.scope, Scope::Concurrency(_)));
            if concurrency {
                let at = self.places.len();
                self.places.push(Some(commit.clone()));
                self.ends
                    .push(std::cmp::Reverse((record.end_us(), record.id, at)));
                self.held = true;
            }
        }
    }

    /// Gives back every place whose stream ended by `now_us` (a request ending at the
    /// instant another is decided ends first), at the instant it ended.
    fn end_until(
        &mut self,
        engine: &Engine,
        store: &MemoryStore,
        worker: &mut Worker,
        now_us: u64,
    ) {
        while let Some(std::cmp::Reverse((end_us, _, at))) = self.ends.peek().copied() {
            if end_us > now_us {
                break;
            }
            self.ends.pop();
            self.tick(engine, store, worker, end_us);
            if let Some(commit) = self.places.get_mut(at).and_then(Option::take) {
                // The in-memory store does not fail.
                let _ = engine.end_in_flight(store, worker, &commit, Micros(end_us));
            }
        }
        self.tick(engine, store, worker, now_us);
    }

    fn tick(&mut self, engine: &Engine, store: &MemoryStore, worker: &mut Worker, now_us: u64) {
        if self.held && now_us >= self.ticked_us.saturating_add(1_000_000) {
            engine.tend_places(store, worker, Micros(now_us));
            self.ticked_us = now_us;
        }
    }
}

/// Refuses a candidate that reads a fact the log holds hashed ([`crate::log_hash`]) in a
/// way the hash does not keep: a match, a cost or a deadline on it, a `query_param` key
/// over it, or a key reading it in another form than it was hashed in (a `client_ip`
/// key over an address hashed with its port). Replayed, such a rule would decide on
/// hashes as if they were values: a silent mis-prediction.
fn check_hashed(config: &Config, log: &Log) -> Result<(), String> {
    for at in 0..config.facts.len() {
        let Ok(id) = u16::try_from(at).map(FactId) else {
            continue;
        };
        let Some((section, field)) = config.facts.get(id).and_then(log_hash::log_field) else {
            continue;
        };
        let (mut forms, mut clear) = (Vec::new(), false);
        for record in &log.records {
            let values = match section {
                "headers" => &record.headers,
                _ => &record.attributes,
            };
            match values.get(&field).map(|v| (Form::of(v), v.is_empty())) {
                Some((Some(form), _)) if !forms.contains(&form) => forms.push(form),
                Some((None, false)) => clear = true,
                _ => {}
            }
        }
        let name = format!("{section}.{field}");
        let form = match forms.as_slice() {
            [] => continue,
            [form] if !clear => *form,
            _ => {
                return Err(format!(
                    "{name}: the log holds it both in clear and hashed, or hashed in two \
                     forms (logs hashed with different configs?): replay them apart"
                ))
            }
        };
        for (rule, read) in log_hash::reads(config, id) {
            if !matches!(read, Read::Key(key) if key.form() == Some(form)) {
                return Err(format!(
                    "rule {rule} {} ({name}), which the log holds hashed {}: a replay \
                     cannot evaluate that; replay the raw log, or one hashed for a config \
                     that reads {name} the way this one does",
                    read.describe(),
                    form.describe()
                ));
            }
        }
    }
    Ok(())
}

/// How the candidate's rules stand to those of the config that served the log.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AgainstServed {
    /// Rules served and not in the candidate, with the requests the log says each
    /// limited (the candidate lets them through, unless another of its rules limits them).
    pub dropped: Vec<(String, u64)>,
    /// Rules of the candidate the served config did not have: nothing to compare.
    pub added: Vec<String>,
    /// Rules the log has decisions of that the served config does not have: the log was
    /// not (only) served by it.
    pub unknown: Vec<String>,
}

/// Compares the candidate's rule names with `served`'s and the log's.
pub fn against_served(served: &Config, report: &Report, log: &Log) -> AgainstServed {
    let served_names: Vec<&str> = served.rules.iter().map(|r| r.name.as_str()).collect();
    let candidate: Vec<&str> = report
        .rules
        .iter()
        .map(|r| r.rule.as_str())
        .chain(report.not_replayed.iter().map(|(r, _)| r.as_str()))
        .collect();
    let limited_in_log = |rule: &str| {
        let limited = |d: &&LoggedDecision| d.rule == rule && d.outcome == "limited";
        log.records
            .iter()
            .filter(|r| r.decisions.iter().any(|d| limited(&d)))
            .count() as u64
    };
    let mut unknown: Vec<String> = log
        .records
        .iter()
        .flat_map(|r| r.decisions.iter())
        .filter(|d| !served_names.contains(&d.rule.as_str()))
        .map(|d| d.rule.clone())
        .collect();
    unknown.sort();
    unknown.dedup();
    AgainstServed {
        dropped: served_names
            .iter()
            .filter(|n| !candidate.contains(n))
            .map(|n| (n.to_string(), limited_in_log(n)))
            .collect(),
        added: candidate
            .iter()
            .filter(|n| !served_names.contains(n))
            .map(|n| n.to_string())
            .collect(),
        unknown,
    }
}

/// One rule's figures as the replay counts them.
struct Tally<'e> {
    rule: &'e Rule,
    /// The width of [`RuleFigures::limited_over_time`]'s buckets, never 0.
    bucket_us: u64,
    figures: RuleFigures,
    /// Requests limited, per key.
    limited_keys: BTreeMap<String, u64>,
}

impl<'e> Tally<'e> {
    fn new(rule: &'e Rule, bucket_us: u64) -> Self {
        Tally {
            rule,
            bucket_us,
            figures: RuleFigures {
                rule: rule.name.clone(),
                ..RuleFigures::default()
            },
            limited_keys: BTreeMap::new(),
        }
    }

    /// The rule decided `record` at `now_us`.
    fn count(
        &mut self,
        record: &Record,
        replayed: Replayed,
        facts: &mut Facts<'_, &Record>,
        now_us: u64,
    ) {
        let figures = &mut self.figures;
        figures.matched += 1;
        match replayed {
            Replayed::Allowed => figures.allowed += 1,
            Replayed::Limited => figures.limited += 1,
            Replayed::ShadowLimited => figures.shadow_limited += 1,
        }
        if replayed.denies() {
            let mut parts = Vec::new();
            self.rule.visit_key(facts, |origin, bytes| {
                parts.push(encode_part(origin, bytes))
            });
            *self.limited_keys.entry(parts.join(" ")).or_default() += 1;
            let bucket = now_us - now_us % self.bucket_us;
            *figures.limited_over_time.entry(bucket).or_default() += 1;
        }
        if let Some(served) = record.decisions.iter().find(|d| d.rule == figures.rule) {
            let served_denied = matches!(served.outcome.as_str(), "limited" | "shadow_limited");
            match (served_denied, replayed.denies()) {
                (false, true) => figures.newly_limited += 1,
                (true, false) => figures.newly_allowed += 1,
                _ => figures.agreed += 1,
            }
        }
    }

    fn finish(self, records: &[Record]) -> RuleFigures {
        let mut figures = self.figures;
        figures.served_decided = records
            .iter()
            .filter(|r| r.decisions.iter().any(|d| d.rule == figures.rule))
            .count() as u64;
        let mut keys: Vec<(String, u64)> = self.limited_keys.into_iter().collect();
        keys.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        keys.truncate(TOP_KEYS);
        figures.top_keys = keys;
        figures
    }
}

/// The candidate without the rules not replayed, its global rules made local: the same
/// limit, every request deciding in the store (`reservoir.max` 1).
fn replayable(
    json: &[u8],
    drop: &[(String, String)],
    central: &[String],
) -> Result<Config, String> {
    let mut value: Value = serde_json::from_slice(json).map_err(|e| e.to_string())?;
    if let Some(Value::Array(rules)) = value.get_mut("rules") {
        rules.retain(|rule| {
            let name = rule.get("name").and_then(Value::as_str);
            !drop.iter().any(|(d, _)| Some(d.as_str()) == name)
        });
        for rule in rules.iter_mut() {
            let name = rule.get("name").and_then(Value::as_str);
            if !central.iter().any(|c| Some(c.as_str()) == name) {
                continue;
            }
            if let Some(rule) = rule.as_object_mut() {
                rule.remove("global");
                rule.insert("scope".into(), "local".into());
                rule.insert("reservoir".into(), serde_json::json!({ "max": 1 }));
            }
        }
    }
    let json = serde_json::to_vec(&value).map_err(|e| e.to_string())?;
    config::parse(&json).map_err(|e| format!("replaying global rules as local ones: {e}"))
}
