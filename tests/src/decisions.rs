//! weir's decisions as Envoy logs them, and their conformance.
//!
//! With `"response": {"filter_state": "all"}` the filter writes every rule it decided into
//! the filter state `wasm.weir.decisions` (`rule:outcome:source:cost:decided_at_us`,
//! comma-separated). [`access_log_format`] logs it with the status and the request's key
//! header; [`read`] parses the file; [`check`] gathers the admissions of one rule from
//! every Envoy, per key, and runs `weir_core::conformance::check` on them. [`Logs`] does
//! all three for a set of Envoys, and [`with_decisions`] turns the filter state on.
//!
//! The instants come from one clock: each Envoy's `decided_at_us` is its own wall clock
//! (the filter reads Envoy's time source), a bridge decision's is Redis's `TIME`, and in
//! these tests every process runs on the same machine and reads the same system clock.
//! The uncertainty left is the time between a clock read and the unit really being
//! counted (µs inside one process), well below what any bound here turns on.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use weir_core::algorithms::GlobalLimit;
use weir_core::conformance::{self, Admission};
use weir_core::engine::Engine;

use crate::Bootstrap;

/// The access-log line the parser reads: status, decisions, then the value of
/// `key_header` (the rest of the line; `-` when absent).
pub fn access_log_format(key_header: &str) -> String {
    format!("%RESPONSE_CODE% %FILTER_STATE(wasm.weir.decisions:PLAIN)% %REQ({key_header})%")
}

/// One rule's decision for one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleDecision {
    pub rule: String,
    /// `allowed`, `limited`, `shadow_limited`, `store_failed`, `bridge_failed`.
    pub outcome: String,
    /// `slot`, `lease`, `cache`, `bridge`, `fallback`, `none`.
    pub source: String,
    pub cost: u64,
    pub at_us: u64,
}

/// One access-log line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Logged {
    pub status: u16,
    pub key: String,
    pub decisions: Vec<RuleDecision>,
}

impl Logged {
    /// This request's decision by `rule`, if it decided.
    pub fn decision(&self, rule: &str) -> Option<&RuleDecision> {
        self.decisions.iter().find(|d| d.rule == rule)
    }
}

/// Parses one line of [`access_log_format`]; `None` for a line that is not one.
pub fn parse_line(line: &str) -> Option<Logged> {
    let mut parts = line.splitn(3, ' ');
    let status = parts.next()?.parse().ok()?;
    let decisions = parts.next()?;
    let key = parts.next().unwrap_or("-").to_string();
    let decisions = if decisions == "-" || decisions.is_empty() {
        Vec::new()
    } else {
        decisions
            .split(',')
            .map(|d| {
                // Rule names have no ':' (the config's name rule).
                let f: Vec<&str> = d.split(':').collect();
                match f.as_slice() {
                    [rule, outcome, source, cost, at] => Some(RuleDecision {
                        rule: rule.to_string(),
                        outcome: outcome.to_string(),
                        source: source.to_string(),
                        cost: cost.parse().ok()?,
                        at_us: at.parse().ok()?,
                    }),
                    _ => None,
                }
            })
            .collect::<Option<Vec<_>>>()?
    };
    Some(Logged {
        status,
        key,
        decisions,
    })
}

/// Every line of an access log written with [`access_log_format`] (panics on a line it
/// cannot read: the format is ours).
pub fn read(path: &Path) -> Vec<Logged> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .filter(|l| !l.is_empty())
        .map(|l| {
            parse_line(l).unwrap_or_else(|| panic!("{}: cannot read line {l:?}", path.display()))
        })
        .collect()
}

/// The plugin config `json` with `response.filter_state: all`, so that every request's
/// decisions reach the access log.
pub fn with_decisions(json: &str) -> String {
    let mut v: serde_json::Value =
        serde_json::from_str(json).unwrap_or_else(|e| panic!("config is not JSON: {e}"));
    v["response"]["filter_state"] = "all".into();
    v.to_string()
}

/// The access logs of a set of Envoys, one file each, read and judged together.
pub struct Logs {
    pub paths: Vec<PathBuf>,
    format: String,
}

impl Logs {
    /// `n` log files in `dir` (created if missing), lines keyed by the request header
    /// `key_header`.
    pub fn new(dir: &Path, n: usize, key_header: &str) -> Logs {
        std::fs::create_dir_all(dir)
            .unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
        Logs {
            paths: (0..n)
                .map(|i| dir.join(format!("access-{i}.log")))
                .collect(),
            format: access_log_format(key_header),
        }
    }

    /// `bootstrap` writing its access log to file `i`.
    pub fn add_to(&self, i: usize, bootstrap: Bootstrap) -> Bootstrap {
        bootstrap.access_log(&self.paths[i], &self.format)
    }

    /// Every file's lines, once `done` says enough are there (Envoy flushes every 100 ms in
    /// the harness) or after 5 s.
    pub fn read_until(&self, done: impl Fn(&[Vec<Logged>]) -> bool) -> Vec<Vec<Logged>> {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let logs: Vec<Vec<Logged>> = self.paths.iter().map(|p| read(p)).collect();
            if done(&logs) || Instant::now() >= deadline {
                return logs;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Every file's lines once `lines` are there in all.
    pub fn read(&self, lines: usize) -> Vec<Vec<Logged>> {
        self.read_until(|logs| logs.iter().map(Vec::len).sum::<usize>() >= lines)
    }

    /// Judges `rule`'s admissions in every file, key by key, against `limit` (by default
    /// the one `config_json` configures), once `lines` are logged; panics on a violation,
    /// or when the rule admitted nothing (a check of nothing proves nothing).
    pub fn assert_conformant(
        &self,
        config_json: &str,
        rule: &str,
        lines: usize,
        limit: Option<GlobalLimit>,
    ) -> Checked {
        let limit = limit.unwrap_or_else(|| configured_limit(config_json, rule));
        let logs = self.read(lines);
        let refs: Vec<&[Logged]> = logs.iter().map(Vec::as_slice).collect();
        let checked = check(&refs, rule, &limit).unwrap_or_else(|v| panic!("{v}"));
        assert!(
            checked.admitted > 0,
            "no admission of {rule} in the access logs"
        );
        checked
    }
}

/// The limit a rule's admissions must keep: the one configured in `config_json` (for a
/// global rule, not the one it runs with in Redis).
pub fn configured_limit(config_json: &str, rule: &str) -> GlobalLimit {
    let config = weir_core::config::parse(config_json.as_bytes())
        .unwrap_or_else(|e| panic!("config does not parse: {e}"));
    let engine = Engine::new(config);
    let id = engine
        .config
        .rules
        .iter()
        .find(|r| r.name == rule)
        .unwrap_or_else(|| panic!("no rule named {rule}"))
        .id;
    weir_core::simulation::configured_limit(&engine, id)
        .unwrap_or_else(|| panic!("no limit for rule {rule}"))
}

/// What one rule admitted, per key, from every log given, in time order.
pub fn admissions(logs: &[&[Logged]], rule: &str) -> BTreeMap<String, Vec<Admission>> {
    let mut per_key: BTreeMap<String, Vec<Admission>> = BTreeMap::new();
    for log in logs {
        for line in log.iter() {
            if let Some(d) = line.decision(rule) {
                if d.outcome == "allowed" {
                    per_key
                        .entry(line.key.clone())
                        .or_default()
                        .push(Admission {
                            at_us: d.at_us,
                            cost: d.cost,
                        });
                }
            }
        }
    }
    for admissions in per_key.values_mut() {
        admissions.sort_by_key(|a| a.at_us);
    }
    per_key
}

/// What the check saw.
#[derive(Debug, Clone, Default)]
pub struct Checked {
    pub keys: usize,
    /// Units admitted, over every key.
    pub admitted: u64,
    pub requests: usize,
}

/// Checks the admissions of `rule` in every log, key by key, against `limit`; the error
/// names the key and the violation.
pub fn check(logs: &[&[Logged]], rule: &str, limit: &GlobalLimit) -> Result<Checked, String> {
    let mut checked = Checked::default();
    for (key, admissions) in admissions(logs, rule) {
        conformance::check(limit, &admissions)
            .map_err(|v| format!("rule {rule}, key {key:?}: {v:?}"))?;
        checked.keys += 1;
        checked.requests += admissions.len();
        checked.admitted += admissions.iter().map(|a| a.cost).sum::<u64>();
    }
    Ok(checked)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_parse_with_and_without_decisions() {
        let l = parse_line(
            "200 api:allowed:lease:3:1795478039912711,b:shadow_limited:bridge:1:7 acme corp",
        )
        .unwrap();
        assert_eq!(l.status, 200);
        assert_eq!(l.key, "acme corp");
        assert_eq!(l.decisions.len(), 2);
        assert_eq!(
            l.decision("api").unwrap(),
            &RuleDecision {
                rule: "api".into(),
                outcome: "allowed".into(),
                source: "lease".into(),
                cost: 3,
                at_us: 1795478039912711
            }
        );
        let none = parse_line("429 - -").unwrap();
        assert!(none.decisions.is_empty());
        assert_eq!(none.key, "-");
        assert!(parse_line("200 api:allowed:lease:1795478039912711 k").is_none());
    }

    #[test]
    fn a_burst_over_the_limit_is_a_violation_naming_the_key() {
        let config = r#"{"rules":[{"name":"api","key":[{"header":"x-user"}],
            "limit":{"algorithm":"fixed_window","limit":2,"window":"1m"}}]}"#;
        let limit = configured_limit(config, "api");
        let line =
            |key: &str, at: u64| parse_line(&format!("200 api:allowed:slot:1:{at} {key}")).unwrap();
        // A minute boundary (1.8e15 µs is a whole number of minutes).
        let t = 1_800_000_000_000_000u64;
        assert_eq!(t % 60_000_000, 0);
        let a = vec![line("a", t + 1), line("a", t + 2), line("b", t + 3)];
        let b = vec![line("a", t + 4)];
        assert_eq!(check(&[&a], "api", &limit).unwrap().admitted, 3);
        let err = check(&[&a, &b], "api", &limit).unwrap_err();
        assert!(err.contains("key \"a\""), "{err}");
    }
}
