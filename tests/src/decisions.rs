//! weir's decisions as Envoy logs them, and their conformance.
//!
//! With `"response": {"filter_state": "all"}` the filter writes every rule it decided into
//! the filter state `wasm.weir.decisions` (`rule:outcome:source:cost:decided_at_us`,
//! comma-separated). [`access_log_format`] logs it with the status, what Envoy says of
//! the response (`%RESPONSE_CODE_DETAILS%`), the upstream host and the request's key
//! header; [`read`] parses the file; a [`Judge`] gathers the admissions of one rule from
//! every Envoy, per key, and runs `weir_core::conformance::check` on them. [`Logs`] does
//! all three for a set of Envoys, and [`with_decisions`] turns the filter state on.
//!
//! **What counts as an admission is what happened, not what the engine says.** A request
//! is an admission of every enforcing rule that decided it when Envoy's router had it
//! ([`Logged::forwarded`]: it was sent to an upstream host, or the route answered it
//! itself with its `direct_response`) — whatever outcome the rule labelled it with:
//! `allowed`, but also `bridge_failed` (a failure mode that let it through) or anything
//! else. Envoy's router gets a request only once every filter has let it go, so this is
//! the one fact the filter cannot label its way out of. Only a **shadow** rule is judged
//! by its `allowed` label: it never denies, so what reached the upstream says nothing of
//! it; its bound is on what it would have admitted. A test that injects a failure itself
//! (kills or stops the bridge, kills a Redis master) may leave out the admissions inside
//! a window of time it recorded around what it did ([`Excuse`]), never by the engine's
//! label.
//!
//! The instants come from one clock: each Envoy's `decided_at_us` is its own wall clock
//! (the filter reads Envoy's time source), a bridge decision's is Redis's `TIME`, and in
//! these tests every process runs on the same machine and reads the same system clock.
//! The uncertainty left is the time between a clock read and the unit really being
//! counted (µs inside one process), well below what any bound here turns on.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use weir_core::algorithms::GlobalLimit;
use weir_core::conformance::{self, Admission};
use weir_core::engine::Engine;

use crate::Bootstrap;

/// The access-log line the parser reads: status, Envoy's response code details, the
/// upstream host, decisions, then the value of `key_header` (the rest of the line; `-`
/// when absent).
pub fn access_log_format(key_header: &str) -> String {
    keyed_format(&format!("%REQ({key_header})%"))
}

/// [`access_log_format`], keyed by any of Envoy's command operators (a response header:
/// `%RESP(x-llm-used)%`).
fn keyed_format(key: &str) -> String {
    format!(
        "%RESPONSE_CODE% %RESPONSE_CODE_DETAILS% %UPSTREAM_HOST% \
         %FILTER_STATE(wasm.weir.decisions:PLAIN)% {key}"
    )
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
    /// Envoy's `%RESPONSE_CODE_DETAILS%`: `via_upstream` for an upstream's answer,
    /// `direct_response` for the route's own, `response_timeout` for the router's 504,
    /// `weir_rate_limited` for weir's 429, …
    pub details: String,
    /// `%UPSTREAM_HOST%`: the host the router sent the request to, `-` when none.
    pub upstream_host: String,
    pub key: String,
    pub decisions: Vec<RuleDecision>,
}

impl Logged {
    /// This request's decision by `rule`, if it decided.
    pub fn decision(&self, rule: &str) -> Option<&RuleDecision> {
        self.decisions.iter().find(|d| d.rule == rule)
    }

    /// Whether the request went past weir to its route: Envoy's router sent it to an
    /// upstream host (whatever came back: an answer, a timeout, a reset) or answered it
    /// with the route's own `direct_response` (the tests whose Envoy has no upstream), and
    /// weir did not answer it. The router runs after every other filter and gets a
    /// request only once each let it go: this is what happened to the request, not what
    /// a filter says of it. A reply of weir's own (`weir_rate_limited`: its 429, and the
    /// 503 of failure mode `deny`) is the exception: a rule that estimates from the body
    /// lets the headers go on before it decides, so the router may have sent them, but no
    /// byte of the body may follow — which only the upstream can tell
    /// ([`crate::Witness`]).
    pub fn forwarded(&self) -> bool {
        self.details != WEIR_REPLY
            && (self.upstream_host != "-"
                || matches!(self.details.as_str(), "via_upstream" | "direct_response"))
    }
}

/// Envoy's `%RESPONSE_CODE_DETAILS%` for a reply weir sent itself.
pub const WEIR_REPLY: &str = "weir_rate_limited";

/// Parses one line of [`access_log_format`]; `None` for a line that is not one.
pub fn parse_line(line: &str) -> Option<Logged> {
    let mut parts = line.splitn(5, ' ');
    let status = parts.next()?.parse().ok()?;
    let details = parts.next()?.to_string();
    let upstream_host = parts.next()?.to_string();
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
        details,
        upstream_host,
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
        Logs::keyed(dir, n, &format!("%REQ({key_header})%"))
    }

    /// `n` log files in `dir`, lines keyed by the response header `header`.
    pub fn by_response_header(dir: &Path, n: usize, header: &str) -> Logs {
        Logs::keyed(dir, n, &format!("%RESP({header})%"))
    }

    /// `n` log files in `dir`, lines keyed by `key`, any of Envoy's command operators
    /// (the rest of the line).
    pub fn keyed(dir: &Path, n: usize, key: &str) -> Logs {
        std::fs::create_dir_all(dir)
            .unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
        Logs {
            paths: (0..n)
                .map(|i| dir.join(format!("access-{i}.log")))
                .collect(),
            format: keyed_format(key),
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

    /// Judges the admissions in every file with `judge`, once `lines` are logged; panics
    /// on a violation, or when the rule admitted nothing (a check of nothing proves
    /// nothing).
    pub fn assert_conformant(&self, judge: &Judge, lines: usize) -> Checked {
        let logs = self.read(lines);
        let refs: Vec<&[Logged]> = logs.iter().map(Vec::as_slice).collect();
        let checked = judge.check(&refs).unwrap_or_else(|v| panic!("{v}"));
        assert!(
            checked.admitted > 0,
            "no admission of {} in the access logs",
            judge.rule
        );
        checked
    }
}

/// Microseconds since the Unix epoch, now: the clock every process of a test reads.
pub fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// A span of time `[from_us, to_us)` that a test recorded around a failure it injected
/// itself (the bridge killed or stopped, a Redis master killed), inside which a rule's
/// admissions are left out of its check: there the rule's failure mode decides, which
/// the docs bound otherwise (docs/global.md, "Failure modes"), if at all (`allow`).
/// Only the harness makes one, from what it did and when; never from a label the engine
/// wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Excuse {
    pub what: String,
    pub from_us: u64,
    pub to_us: u64,
}

impl Excuse {
    /// An excuse for `what`, starting now, open until [`Excuse::ended`].
    pub fn starting(what: &str) -> Excuse {
        Excuse {
            what: what.to_string(),
            from_us: now_us(),
            to_us: u64::MAX,
        }
    }

    /// The excuse ending `after` from now: how long the docs say the failure's effects
    /// outlast it (e.g. the second an Envoy leaves its bridge alone after 3 failures).
    pub fn ended(self, after: Duration) -> Excuse {
        Excuse {
            to_us: now_us() + after.as_micros() as u64,
            ..self
        }
    }

    pub fn covers(&self, at_us: u64) -> bool {
        (self.from_us..self.to_us).contains(&at_us)
    }
}

/// How one rule's admissions are read from the access logs, and the bound they must
/// keep. See the module doc for what counts as an admission.
#[derive(Debug, Clone)]
pub struct Judge {
    pub rule: String,
    pub limit: GlobalLimit,
    /// A shadow rule: its admissions are the requests it labelled `allowed`.
    pub shadow: bool,
    pub excuses: Vec<Excuse>,
}

impl Judge {
    /// Rule `rule` of the plugin config `config_json`, against the limit configured
    /// there (for a global rule, not the one it runs with in Redis).
    pub fn configured(config_json: &str, rule: &str) -> Judge {
        let config = weir_core::config::parse(config_json.as_bytes())
            .unwrap_or_else(|e| panic!("config does not parse: {e}"));
        let engine = Engine::new(config);
        let configured = engine
            .config
            .rules
            .iter()
            .find(|r| r.name == rule)
            .unwrap_or_else(|| panic!("no rule named {rule}"));
        let limit = weir_testkit::simulation::configured_limit(&engine, configured.id)
            .unwrap_or_else(|| panic!("no limit for rule {rule}"));
        Judge {
            rule: rule.to_string(),
            limit,
            shadow: configured.shadow,
            excuses: Vec::new(),
        }
    }

    /// The same rule against `limit` instead (a looser bound a test documents).
    pub fn against(self, limit: GlobalLimit) -> Judge {
        Judge { limit, ..self }
    }

    /// Leaves out the admissions inside `excuse`.
    pub fn excusing(mut self, excuse: Excuse) -> Judge {
        self.excuses.push(excuse);
        self
    }

    /// This rule's decision of `line` if the request was one of its admissions.
    pub fn admission<'a>(&self, line: &'a Logged) -> Option<&'a RuleDecision> {
        let d = line.decision(&self.rule)?;
        let admitted = if self.shadow {
            d.outcome == "allowed"
        } else {
            line.forwarded()
        };
        admitted.then_some(d)
    }

    /// What the rule admitted, per key, from every log given, in time order, with what
    /// the excuses left out and the labels the engine gave the admissions; each at the
    /// cost its decision logged.
    pub fn admissions(&self, logs: &[&[Logged]]) -> Admitted {
        self.admissions_costing(logs, |_, d| d.cost)
    }

    /// [`Judge::admissions`], each admission at `cost(line, decision)`: for a cost known
    /// after the response (`commit`), what it settled at.
    pub fn admissions_costing(
        &self,
        logs: &[&[Logged]],
        cost: impl Fn(&Logged, &RuleDecision) -> u64,
    ) -> Admitted {
        let mut admitted = Admitted::default();
        for line in logs.iter().flat_map(|log| log.iter()) {
            let Some(d) = self.admission(line) else {
                continue;
            };
            if self.excuses.iter().any(|e| e.covers(d.at_us)) {
                admitted.excused += 1;
                continue;
            }
            *admitted.labelled.entry(d.outcome.clone()).or_default() += 1;
            admitted
                .per_key
                .entry(line.key.clone())
                .or_default()
                .push(Admission {
                    at_us: d.at_us,
                    cost: cost(line, d),
                });
        }
        for admissions in admitted.per_key.values_mut() {
            admissions.sort_by_key(|a| a.at_us);
        }
        admitted
    }

    /// Checks the rule's admissions in every log, key by key; the error names the key
    /// and the violation.
    pub fn check(&self, logs: &[&[Logged]]) -> Result<Checked, String> {
        self.check_costing(logs, |_, d| d.cost)
    }

    /// [`Judge::check`] with each admission at `cost(line, decision)` (see
    /// [`Judge::admissions_costing`]).
    pub fn check_costing(
        &self,
        logs: &[&[Logged]],
        cost: impl Fn(&Logged, &RuleDecision) -> u64,
    ) -> Result<Checked, String> {
        let admitted = self.admissions_costing(logs, cost);
        let mut checked = Checked {
            excused: admitted.excused,
            labelled: admitted.labelled,
            ..Checked::default()
        };
        for (key, admissions) in admitted.per_key {
            conformance::check(&self.limit, &admissions).map_err(|v| {
                format!(
                    "rule {}, key {key:?}: {v:?} (admissions by label: {:?})",
                    self.rule, checked.labelled
                )
            })?;
            checked.keys += 1;
            checked.requests += admissions.len();
            checked.admitted += admissions.iter().map(|a| a.cost).sum::<u64>();
        }
        Ok(checked)
    }
}

/// One rule's admissions as a [`Judge`] reads them.
#[derive(Debug, Clone, Default)]
pub struct Admitted {
    pub per_key: BTreeMap<String, Vec<Admission>>,
    /// Admissions left out by an excuse.
    pub excused: usize,
    /// Admissions judged, by the outcome the engine labelled them with.
    pub labelled: BTreeMap<String, usize>,
}

/// What the check saw.
#[derive(Debug, Clone, Default)]
pub struct Checked {
    pub keys: usize,
    /// Units admitted, over every key.
    pub admitted: u64,
    pub requests: usize,
    /// Admissions left out by an excuse.
    pub excused: usize,
    /// Admissions judged, by the outcome the engine labelled them with (`allowed`, and
    /// `bridge_failed` for a failure mode that let a request through).
    pub labelled: BTreeMap<String, usize>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_parse_with_and_without_decisions() {
        let l = parse_line(
            "200 via_upstream 127.0.0.1:8080 api:allowed:lease:3:1795478039912711,b:shadow_limited:bridge:1:7 acme corp",
        )
        .unwrap();
        assert_eq!(l.status, 200);
        assert!(l.forwarded());
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
        let none = parse_line("429 weir_rate_limited - - -").unwrap();
        assert!(none.decisions.is_empty());
        assert_eq!(none.key, "-");
        assert!(!none.forwarded());
        assert!(parse_line("200 direct_response - - -").unwrap().forwarded());
        assert!(parse_line("504 response_timeout 127.0.0.1:1 - -")
            .unwrap()
            .forwarded());
        // Headers sent on ahead of a body estimate, then weir's 429.
        assert!(!parse_line("429 weir_rate_limited 127.0.0.1:1 - -")
            .unwrap()
            .forwarded());
        assert!(parse_line("200 via_upstream - api:allowed:lease:1795478039912711 k").is_none());
    }

    /// A minute boundary (1.8e15 µs is a whole number of minutes).
    const T: u64 = 1_800_000_000_000_000;

    fn line(outcome: &str, details: &str, key: &str, at: u64) -> Logged {
        parse_line(&format!("200 {details} - api:{outcome}:slot:1:{at} {key}")).unwrap()
    }

    const FIXED_2: &str = r#"{"rules":[{"name":"api","key":[{"header":"x-user"}],
        "limit":{"algorithm":"fixed_window","limit":2,"window":"1m"}}]}"#;

    #[test]
    fn a_burst_over_the_limit_is_a_violation_naming_the_key() {
        let judge = Judge::configured(FIXED_2, "api");
        assert!(!judge.shadow);
        assert_eq!(T % 60_000_000, 0);
        let allowed = |key: &str, at: u64| line("allowed", "direct_response", key, at);
        let a = vec![
            allowed("a", T + 1),
            allowed("a", T + 2),
            allowed("b", T + 3),
        ];
        let b = vec![allowed("a", T + 4)];
        assert_eq!(judge.check(&[&a]).unwrap().admitted, 3);
        let err = judge.check(&[&a, &b]).unwrap_err();
        assert!(err.contains("key \"a\""), "{err}");
    }

    /// The engine's label excuses nothing: a request the upstream answered is an
    /// admission whatever the rule called it, and one it never had is none.
    #[test]
    fn what_reached_the_upstream_counts_whatever_its_label() {
        let judge = Judge::configured(FIXED_2, "api");
        let log = vec![
            line("allowed", "via_upstream", "a", T + 1),
            line("bridge_failed", "via_upstream", "a", T + 2),
            // Labelled allowed, answered by someone else (a later filter): not admitted.
            line("allowed", "weir_rate_limited", "a", T + 3),
        ];
        let checked = judge.check(&[&log]).unwrap();
        assert_eq!(checked.requests, 2);
        assert_eq!(checked.labelled.get("bridge_failed"), Some(&1));
        let mut more = log.clone();
        more.push(line("limited", "via_upstream", "a", T + 4));
        assert!(
            judge.check(&[&more]).is_err(),
            "a 'limited' request that went on"
        );
    }

    /// A shadow rule never denies: its admissions are what it labelled `allowed`.
    #[test]
    fn a_shadow_rule_is_judged_by_what_it_would_have_admitted() {
        let config = FIXED_2.replace(r#""name":"api","#, r#""name":"api","shadow":true,"#);
        let judge = Judge::configured(&config, "api");
        assert!(judge.shadow);
        let log = vec![
            line("allowed", "via_upstream", "a", T + 1),
            line("shadow_limited", "via_upstream", "a", T + 2),
            line("allowed", "weir_rate_limited", "a", T + 3),
        ];
        assert_eq!(judge.check(&[&log]).unwrap().requests, 2);
    }

    /// A window the harness recorded leaves out what was admitted inside it, and only that.
    #[test]
    fn an_excuse_leaves_out_its_window_only() {
        let excuse = Excuse {
            what: "bridge stopped".into(),
            from_us: T + 10,
            to_us: T + 20,
        };
        let judge = Judge::configured(FIXED_2, "api").excusing(excuse);
        let log: Vec<Logged> = [T + 1, T + 10, T + 15, T + 19, T + 20]
            .iter()
            .map(|&at| line("bridge_failed", "via_upstream", "a", at))
            .collect();
        assert!(judge
            .check(&[&log])
            .is_ok_and(|c| c.excused == 3 && c.requests == 2));
        let mut more = log.clone();
        more.push(line("allowed", "via_upstream", "a", T + 21));
        assert!(judge.check(&[&more]).is_err());
    }
}
