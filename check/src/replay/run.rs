//! A replay's run: the candidate made replayable, every record through its engine in
//! the order of the log, requests held and released as the filter does.

use std::collections::BTreeMap;
use std::num::NonZeroU64;

use serde_json::Value;

use crate::log_hash::{self, Form, Read};
use weir_core::config::{self, Config};
use weir_core::engine::{Engine, Evaluation, PendingCommit, RuleOutcome};
use weir_core::key::Seed;
use weir_core::rules::{FactId, Rule, Scope};
use weir_core::store::memory::MemoryStore;
use weir_core::time::Micros;
use weir_core::worker::Worker;

use super::report::Tally;
use super::*;

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
        let mut facts = engine.facts(record);
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
        let mut facts = self.engine.facts(record);
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
