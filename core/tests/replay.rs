//! `weir_core::replay` on logs written by hand: bad lines, time order, and how global and
//! concurrency rules are replayed. The recorded run of a real Envoy is in
//! tests/tests/replay.rs.

#![cfg(not(target_arch = "wasm32"))]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use weir_core::config;
use weir_core::key::Seed;
use weir_core::replay::{self, Replayed};

const SEED: Seed = Seed([1; 16]);

/// A request of user `user` at `at_us`, no decision logged.
fn line(user: &str, at_us: u64) -> String {
    format!(
        r#"{{"start_us":"{at_us}","status":200,"decisions":null,"headers":{{"x-user":"{user}"}},"attributes":{{}}}}"#
    )
}

fn outcomes(report: &replay::Report, rule: &str) -> Vec<&'static str> {
    report
        .decisions
        .values()
        .filter_map(|d| d.iter().find(|(r, _)| r == rule).map(|(_, o)| o.name()))
        .collect()
}

#[test]
fn a_bad_line_is_counted_with_its_number_and_the_rest_replayed() {
    let log = [
        line("a", 1_000_000),
        "not json".into(),
        r#"{"status":200}"#.into(),
        r#"{"start_us":1,"decisions":"per-user:allowed"}"#.into(),
        String::new(),
        line("a", 1_000_001),
    ]
    .join("\n");
    let (records, bad) = replay::parse_log(&log);
    assert_eq!(records.len(), 2);
    let bad: Vec<(usize, &str)> = bad.iter().map(|b| (b.line, b.error.as_str())).collect();
    assert_eq!(bad.len(), 3, "{bad:?}");
    assert_eq!(bad[0].0, 2);
    assert!(bad[0].1.starts_with("not JSON"), "{bad:?}");
    assert_eq!(bad[1], (3, "start_us: missing or not a number of µs"));
    assert_eq!(
        bad[2],
        (
            4,
            "decisions: \"per-user:allowed\" is not rule:outcome:source:cost:decided_at_us"
        )
    );
}

#[test]
fn requests_are_replayed_in_time_order_not_line_order() {
    // A limit of 1 per hour: whichever request comes first is allowed.
    let candidate = r#"{"rules":[{"name":"per-user","key":[{"header":"x-user"}],
        "limit":{"algorithm":"fixed_window","limit":1,"window":"1h"}}]}"#;
    let log = [line("a", 2_000_000), line("a", 1_000_000)].join("\n");
    let (records, _) = replay::parse_log(&log);
    let report = replay::replay(candidate.as_bytes(), &records, &SEED).unwrap();
    assert_eq!(
        report.decisions[&2],
        vec![("per-user".to_string(), Replayed::Allowed)]
    );
    assert_eq!(
        report.decisions[&1],
        vec![("per-user".to_string(), Replayed::Limited)]
    );
    assert_eq!(report.rules[0].limited_per_second.get(&2), Some(&1));
    assert_eq!(report.rules[0].top_keys.len(), 1);
}

#[test]
fn a_global_rule_is_replayed_as_one_central_limiter() {
    // Leases of up to 10 units would let each Envoy admit ahead; one central limiter
    // admits the limit exactly.
    let candidate = r#"{"bridge":{"cluster":"weir-bridge","timeout":"50ms"},
        "rules":[{"name":"per-tenant","scope":"global","key":[{"header":"x-user"}],
        "global":{"lease":{"max":10}},
        "limit":{"algorithm":"fixed_window","limit":3,"window":"1h"}}]}"#;
    config::parse(candidate.as_bytes()).unwrap();
    let log: Vec<String> = (0..5).map(|i| line("t", 1_000_000 + i)).collect();
    let (records, _) = replay::parse_log(&log.join("\n"));
    let report = replay::replay(candidate.as_bytes(), &records, &SEED).unwrap();
    assert_eq!(report.central, vec!["per-tenant".to_string()]);
    assert_eq!(
        outcomes(&report, "per-tenant"),
        ["allowed", "allowed", "allowed", "limited", "limited"]
    );
}

#[test]
fn a_concurrency_rule_is_named_not_replayed_and_the_others_are() {
    let candidate = r#"{"rules":[
        {"name":"in-flight","key":[{"header":"x-user"}],
         "limit":{"algorithm":"concurrency","max_in_flight":1}},
        {"name":"per-user","key":[{"header":"x-user"}],
         "limit":{"algorithm":"fixed_window","limit":1,"window":"1h"}}]}"#;
    let log = [line("a", 1_000_000), line("a", 1_000_001)].join("\n");
    let (records, _) = replay::parse_log(&log);
    let report = replay::replay(candidate.as_bytes(), &records, &SEED).unwrap();
    assert_eq!(report.not_replayed.len(), 1);
    assert_eq!(report.not_replayed[0].0, "in-flight");
    assert_eq!(outcomes(&report, "per-user"), ["allowed", "limited"]);
}
