//! `weir-check replay` against a real Envoy: traffic recorded with the access-log format
//! `weir-check log-format` prints, replayed through `weir_core::replay` (what the command
//! runs), predicts the recorded decisions; a tightened config predicts more 429s where
//! the traffic is heavy.

use std::collections::BTreeMap;
use std::path::Path;
use std::thread;
use std::time::{Duration, Instant};
use weir_core::config;
use weir_core::key::Seed;
use weir_core::replay::{self, Record, Replayed, Report};
use weir_e2e::decisions::with_decisions;
use weir_e2e::{wasm_filter_yaml, weir_wasm, Bootstrap, Client, Envoy, Request};

/// A local per-user rule: 10 per second, a burst of 5, reservoirs on (the default).
const SERVED: &str = r#"{"rules":[{"name":"per-user","key":[{"header":"x-user"}],
    "limit":{"algorithm":"gcra","rate":10,"period":"1s","burst":5}}]}"#;

/// The same rule at a third of the rate.
const TIGHTER: &str = r#"{"rules":[{"name":"per-user","key":[{"header":"x-user"}],
    "limit":{"algorithm":"gcra","rate":3,"period":"1s","burst":2}}]}"#;

/// Users and the rate (requests per second) each sends, for `SECONDS`.
const USERS: &[(&str, f64)] = &[
    ("heavy", 40.0),
    ("busy", 15.0),
    ("steady", 6.0),
    ("light", 1.0),
];
const SECONDS: f64 = 5.0;

/// Each user on its own connection, open loop (behind schedule: send at once).
fn offer(port: u16) -> usize {
    let start = Instant::now() + Duration::from_millis(50);
    thread::scope(|s| {
        let handles: Vec<_> = USERS
            .iter()
            .map(|&(user, per_s)| {
                s.spawn(move || {
                    let mut client = Client::connect(port).unwrap();
                    let total = (per_s * SECONDS) as usize;
                    for i in 0..total {
                        let due = start + Duration::from_secs_f64(i as f64 / per_s);
                        if let Some(wait) = due.checked_duration_since(Instant::now()) {
                            thread::sleep(wait);
                        }
                        let r = client
                            .request(Request::get("/api").header("x-user", user))
                            .unwrap();
                        assert!(r.status == 200 || r.status == 429, "status {}", r.status);
                    }
                    total
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).sum()
    })
}

/// The log's records once `lines` are there (Envoy flushes every 100 ms here), or
/// after 5 s.
fn read_log(path: &Path, lines: usize) -> String {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if text.lines().count() >= lines || Instant::now() >= deadline {
            return text;
        }
        thread::sleep(Duration::from_millis(50));
    }
}

/// Records `SERVED` in a real one-worker Envoy: the log's records, all of them read.
fn record(dir: &Path) -> Vec<Record> {
    let served = with_decisions(SERVED);
    let compiled = config::parse(served.as_bytes()).unwrap();
    let (format, unrecorded) = replay::log_format(&compiled);
    assert!(unrecorded.is_empty(), "{unrecorded:?}");
    let log = dir.join("access.jsonl");
    let bootstrap = Bootstrap::new()
        .http_filter(wasm_filter_yaml(&served, &weir_wasm()))
        .access_log_json(&log, &format);
    let envoy = Envoy::start(&bootstrap, 1);
    let sent = offer(envoy.http_port);
    let text = read_log(&log, sent);
    drop(envoy);
    let (records, bad) = replay::parse_log(&text);
    assert!(
        bad.is_empty(),
        "lines Envoy wrote that replay cannot read: {bad:?}"
    );
    assert_eq!(records.len(), sent, "every request logged once");
    records
}

fn replay(candidate: &str, records: &[Record]) -> Report {
    replay::replay(candidate.as_bytes(), records, &Seed([7; 16])).unwrap()
}

/// The outcome the served Envoy logged for `per-user` on each request, by line.
fn served_outcomes(records: &[Record]) -> BTreeMap<usize, String> {
    records
        .iter()
        .map(|r| {
            let d = r.decisions.iter().find(|d| d.rule == "per-user");
            let d = d.unwrap_or_else(|| panic!("line {}: no decision logged", r.line));
            (r.line, d.outcome.clone())
        })
        .collect()
}

fn limited_by_user(report: &Report, records: &[Record]) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for r in records {
        let user = r.headers.get("x-user").unwrap().clone();
        let limited = report.decisions[&r.line]
            .iter()
            .any(|(rule, d)| rule == "per-user" && *d == Replayed::Limited);
        *out.entry(user).or_default() += u64::from(limited);
    }
    out
}

#[test]
fn replay_predicts_what_envoy_decided_and_what_a_tighter_limit_would() {
    let dir = tempfile::tempdir().unwrap();
    let records = record(dir.path());
    let served = served_outcomes(&records);
    let served_limited = served.values().filter(|o| *o == "limited").count();
    assert!(
        served_limited > 0,
        "the served config limited nothing: the comparison would prove nothing"
    );
    // The status agrees with the logged decision: the log is what clients saw.
    for r in &records {
        let limited = served[&r.line] == "limited";
        assert_eq!(
            r.status,
            Some(if limited { 429 } else { 200 }),
            "line {}",
            r.line
        );
    }

    // (a) The served config, replayed: every request decided as Envoy decided it.
    let same = replay(SERVED, &records);
    let mismatches: Vec<String> = records
        .iter()
        .filter_map(|r| {
            let replayed = same.decisions[&r.line]
                .iter()
                .find(|(rule, _)| rule == "per-user")
                .map(|(_, d)| d.name());
            let logged = served[&r.line].as_str();
            (replayed != Some(logged)).then(|| {
                format!(
                    "line {} ({:?} at {}): logged {logged}, replayed {replayed:?}",
                    r.line,
                    r.headers.get("x-user"),
                    r.at_us()
                )
            })
        })
        .collect();
    eprintln!(
        "replay of the served config: {} of {} recorded decisions matched ({} limited)",
        records.len() - mismatches.len(),
        records.len(),
        served_limited
    );
    assert!(mismatches.is_empty(), "{mismatches:#?}");
    let rule = &same.rules[0];
    assert_eq!(
        (rule.matched, rule.newly_limited, rule.newly_allowed),
        (records.len() as u64, 0, 0)
    );

    // (b) A third of the rate: more 429s, on the users over the new rate.
    let tighter = replay(TIGHTER, &records);
    let rule = &tighter.rules[0];
    eprintln!(
        "tighter: {} limited (served {served_limited}), {} newly limited, {} newly allowed, \
         top keys {:?}",
        rule.limited, rule.newly_limited, rule.newly_allowed, rule.top_keys
    );
    assert!(rule.limited > served_limited as u64 + 20, "{rule:?}");
    let before = limited_by_user(&same, &records);
    let after = limited_by_user(&tighter, &records);
    eprintln!("limited by user: served {before:?}, tighter {after:?}");
    // The light user (1/s, under both rates) is never limited; the heavy user most.
    assert_eq!(after["light"], 0);
    assert!(after["heavy"] > before["heavy"]);
    assert!(after["busy"] > before["busy"]);
    assert!(after["heavy"] >= after["busy"] && after["busy"] >= after["steady"]);
    assert!(rule.top_keys[0].0.contains("heavy"), "{:?}", rule.top_keys);
    let per_second: u64 = rule.limited_per_second.values().sum();
    assert_eq!(per_second, rule.limited);
}
