//! What a replay reports: per rule, what the candidate decided and how that stands to what
//! the served config decided.

use std::collections::BTreeMap;

use weir_core::config::Config;
use weir_core::key::encode_part;
use weir_core::rules::{Facts, Rule};

use super::*;

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
pub(super) struct Tally<'e> {
    pub(super) rule: &'e Rule,
    /// The width of [`RuleFigures::limited_over_time`]'s buckets, never 0.
    bucket_us: u64,
    pub(super) figures: RuleFigures,
    /// Requests limited, per key.
    limited_keys: BTreeMap<String, u64>,
}

impl<'e> Tally<'e> {
    pub(super) fn new(rule: &'e Rule, bucket_us: u64) -> Self {
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
    pub(super) fn count(
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

    pub(super) fn finish(self, records: &[Record]) -> RuleFigures {
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
