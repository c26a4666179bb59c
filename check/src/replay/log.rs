//! The access log replay reads: the `json_format` that records what a config's rules read,
//! and its lines parsed into records.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use weir_core::config::Config;
use weir_core::rules::{Fact, FactSource};

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

pub(super) fn parse_decisions(text: &str) -> Result<Vec<LoggedDecision>, String> {
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
