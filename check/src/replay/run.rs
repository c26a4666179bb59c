//! A replay's run: the candidate made replayable, every record played in the order of
//! the log as a request on a scripted Envoy of one worker (`weir_scripted`), so that the
//! filter's own lifecycle decides, holds and releases, gives places back and ticks.

use std::collections::{BTreeMap, HashMap};
use std::num::NonZeroU64;
use std::sync::Arc;

use serde_json::Value;

use crate::log_hash::{self, Form, Read};
use weir_core::config::{self, Config};
use weir_core::filter::host::LogLevel;
use weir_core::key::Seed;
use weir_core::rules::{Fact, FactId, Facts, Rule, Scope};
use weir_core::store::memory::MemoryStore;
use weir_core::store::seed::SEED_KEY;
use weir_core::store::SharedStore;
use weir_scripted::scripted_envoy::Envoy;

use super::log::parse_decisions;
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
    let bucket_us = options.bucket_us.get();
    if not_replayed.len() == config.rules.len() {
        // Nothing to replay: a config needs a rule.
        return Ok(Report {
            requests: log.records.len() as u64,
            bucket_us,
            bad_lines: log.bad_lines.clone(),
            not_replayed,
            ..Report::default()
        });
    }
    let json = replayable(candidate_json, &not_replayed, &central)?;
    let config = config::parse(json.as_bytes())
        .map_err(|e| format!("replaying global rules as local ones: {e}"))?;
    let mut order: Vec<&Record> = log.records.iter().collect();
    order.sort_by_key(|r| (r.at_us(), r.id));
    let first_us = order.first().map_or(0, |r| r.at_us());
    let mut run = Run::new(&json, &config, &options.seed, bucket_us, first_us)?;
    for record in order {
        run.until(record.at_us());
        run.arrive(record);
    }
    run.until(u64::MAX);
    let without_duration = if run.held_a_place {
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
        rules: run
            .tallies
            .into_iter()
            .map(|t| t.finish(&log.records))
            .collect(),
        not_replayed,
        central,
        decisions: run.decisions,
    })
}

/// One replay under way: a scripted Envoy of one worker running the candidate, what each
/// rule counted, and the requests the filter holds or has let through.
struct Run<'c, 'l> {
    envoy: Envoy,
    config: &'c Config,
    tallies: Vec<Tally<'c>>,
    decisions: BTreeMap<RecordId, Vec<(String, Replayed)>>,
    /// Requests the filter holds (a delaying rule's), by context, and their arrival.
    held: HashMap<u32, (&'l Record, u64)>,
    /// Requests let through, by the instant their stream ends (µs), then record.
    ends: BTreeMap<(u64, RecordId), (u32, &'l Record)>,
    /// The tick period the filter asked for (µs), and the next tick.
    period_us: u64,
    next_tick_us: u64,
    /// Whether a concurrency rule let a request through (it held a place).
    held_a_place: bool,
    /// The longest `delay.max` + a second, and the last arrival's instant + that.
    longest_delay_us: u64,
    drained_by_us: u64,
}

impl<'c, 'l> Run<'c, 'l> {
    fn new(
        json: &str,
        config: &'c Config,
        seed: &Seed,
        bucket_us: u64,
        first_us: u64,
    ) -> Result<Self, String> {
        // The slot hash's seed, stored before the plugin starts: it adopts it.
        let store = Arc::new(MemoryStore::new());
        store
            .create(SEED_KEY, &seed.0)
            .map_err(|e| format!("{e:?}"))?;
        let mut envoy = Envoy::worker(json, store)?;
        // What it logs is not kept: a replay of millions of requests would pile it up.
        envoy.host.state().log_level = LogLevel::Critical;
        envoy.set_now_us(first_us);
        let mut run = Run {
            envoy,
            config,
            tallies: (config.rules.iter())
                .map(|rule| Tally::new(rule, bucket_us))
                .collect(),
            decisions: BTreeMap::new(),
            held: HashMap::new(),
            ends: BTreeMap::new(),
            period_us: 0,
            next_tick_us: u64::MAX,
            held_a_place: false,
            longest_delay_us: (config.rules.iter())
                .filter_map(|r| r.delay.as_ref().map(|d| d.max_us))
                .max()
                .unwrap_or(0)
                .saturating_add(1_000_000),
            drained_by_us: 0,
        };
        run.follow_tick();
        Ok(run)
    }

    /// Envoy's timer: a new period starts from now, as `set_tick_period` re-arms it.
    fn follow_tick(&mut self) {
        let root = self.envoy.root;
        let period_ms = self.envoy.host.state().tick_ms.get(&root).copied();
        let period_us = u64::from(period_ms.unwrap_or(0)) * 1_000;
        if period_us != self.period_us {
            self.period_us = period_us;
            self.next_tick_us = match period_us {
                0 => u64::MAX,
                us => self.envoy.now_us().saturating_add(us),
            };
        }
    }

    /// Everything due by `now_us`, in time order: streams that end (first, at an equal
    /// instant, as a place given back before another is decided), then the tick.
    /// Ticks while no request is open or held are skipped (they would decide nothing),
    /// keeping their phase.
    fn until(&mut self, now_us: u64) {
        loop {
            let end = self.ends.keys().next().map(|&(at, _)| at);
            let idle = self.held.is_empty() && end.is_none();
            if idle && (now_us == u64::MAX || self.period_us == 0) {
                return;
            }
            // After the last arrival, a held request is released or limited within its
            // rule's `delay.max`: a request paused past that (never expected) is left
            // undecided rather than ticked for ever.
            if now_us == u64::MAX && end.is_none() && self.next_tick_us > self.drained_by_us {
                return;
            }
            if idle && self.next_tick_us <= now_us {
                let behind = (now_us - self.next_tick_us) / self.period_us + 1;
                self.next_tick_us += behind * self.period_us;
            }
            match end {
                Some(end) if end <= now_us && end <= self.next_tick_us => self.end(),
                _ if self.next_tick_us <= now_us && self.period_us > 0 => self.tick(),
                _ => return,
            }
        }
    }

    /// `record` arrives: its headers and the attributes its rules read, no body.
    fn arrive(&mut self, record: &'l Record) {
        let now_us = record.at_us();
        self.drained_by_us = now_us.saturating_add(self.longest_delay_us);
        self.envoy.set_now_us(now_us);
        let headers: Vec<(&str, &str)> = (record.headers.iter())
            .map(|(n, v)| (n.as_str(), v.as_str()))
            .collect();
        let mut attributes = HashMap::new();
        for fact in self.config.facts.iter() {
            if let Fact::Property(path) = fact {
                if let Some(value) = record.attributes.get(&path.join(".")) {
                    attributes.insert(path.clone(), value.clone().into_bytes());
                }
            }
        }
        let (context, _) = self.envoy.request_with_attributes(&headers, attributes);
        self.envoy.take_changed();
        self.follow_tick();
        self.decided_or_held(context, record, now_us);
    }

    /// The filter's tick: held requests due are released (or limited).
    fn tick(&mut self) {
        let at = self.next_tick_us;
        self.envoy.set_now_us(at);
        let root = self.envoy.root;
        self.envoy.tick(root);
        self.next_tick_us = at.saturating_add(self.period_us);
        self.follow_tick();
        for context in self.envoy.take_changed() {
            if let Some((record, arrived_us)) = self.held.remove(&context) {
                self.decided_or_held(context, record, arrived_us);
            }
        }
    }

    /// The first stream due to end does: its response (the status the log says the
    /// upstream gave, 200 when weir answered it or none is logged), then its end.
    fn end(&mut self) {
        let Some(((at, _), (context, record))) = self.ends.pop_first() else {
            return;
        };
        self.envoy.set_now_us(at);
        let served_denied = (record.decisions.iter()).any(|d| d.outcome == "limited");
        let status = match record.status {
            Some(s) if (200..=599).contains(&s) && !served_denied => s,
            _ => 200,
        };
        self.envoy.respond(context, status, &[], b"");
        self.envoy.close(context);
        self.envoy.take_changed();
        self.follow_tick();
    }

    /// Counts what the filter decided for `context` (its filter state), or keeps it
    /// held. A request let through ends at [`Record::end_us`] (never before now); one
    /// limited gets its reply and ends now.
    fn decided_or_held(&mut self, context: u32, record: &'l Record, arrived_us: u64) {
        let Some(stream) = self.envoy.stream(context) else {
            return;
        };
        let answered = stream.local_reply.is_some();
        if !answered && stream.resumed == 0 && !stream.upstream.headers {
            self.held.insert(context, (record, arrived_us));
            return;
        }
        let logged = stream.filter_state.get("weir.decisions");
        let text = logged.map(|v| String::from_utf8_lossy(v).into_owned());
        let decisions = parse_decisions(text.as_deref().unwrap_or("")).unwrap_or_default();
        let mut facts = Facts::new(&self.config.facts, record);
        let mut decided = Vec::new();
        let mut delayed = self.envoy.now_us() > arrived_us;
        for d in decisions {
            let replayed = match d.outcome.as_str() {
                "allowed" => Replayed::Allowed,
                "limited" => Replayed::Limited,
                "shadow_limited" => Replayed::ShadowLimited,
                _ => continue,
            };
            let Some(tally) = self.tallies.iter_mut().find(|t| t.rule.name == d.rule) else {
                continue;
            };
            tally.count(record, replayed, &mut facts, d.at_us);
            // The rule that held it is the first decided after its arrival.
            if delayed && d.at_us > arrived_us {
                delayed = false;
                if replayed == Replayed::Allowed {
                    tally.figures.delayed += 1;
                    tally.figures.delayed_us += d.at_us - arrived_us;
                }
            }
            let in_flight = matches!(tally.rule.scope, Scope::Concurrency(_));
            self.held_a_place |= in_flight && replayed == Replayed::Allowed;
            decided.push((tally.rule.name.clone(), replayed));
        }
        self.decisions.insert(record.id, decided);
        let now_us = self.envoy.now_us();
        if answered {
            self.envoy.deliver_local_reply(context);
            self.envoy.close(context);
            self.envoy.take_changed();
            self.follow_tick();
        } else {
            let end_us = record.end_us().max(now_us);
            self.ends.insert((end_us, record.id), (context, record));
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

/// The candidate as the replay runs it: without the rules not replayed, its global rules
/// made local (the same limit, every request deciding in the store: `reservoir.max` 1),
/// and every decision written to filter state (`response.filter_state` `all`), which
/// the replay reads them from as an access log does.
fn replayable(
    json: &[u8],
    drop: &[(String, String)],
    central: &[String],
) -> Result<String, String> {
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
    if let Some(top) = value.as_object_mut() {
        let response = top
            .entry("response")
            .or_insert_with(|| serde_json::json!({}));
        if let Some(response) = response.as_object_mut() {
            response.insert("filter_state".into(), "all".into());
        }
    }
    serde_json::to_string(&value).map_err(|e| e.to_string())
}
