//! `weir_check::replay` on logs written by hand: bad lines, time order, and how global and
//! concurrency rules are replayed. The recorded run of a real Envoy is in
//! tests/tests/replay.rs.

use std::path::PathBuf;
use std::process::Command;
use weir_check::replay::{self, RecordId, Replayed};
use weir_core::config;
use weir_core::key::Seed;

pub(crate) const SEED: Seed = Seed([1; 16]);

/// A request of user `user` at `at_us`, no decision logged.
pub(crate) fn line(user: &str, at_us: u64) -> String {
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
    let parsed = replay::parse_log(&log);
    assert_eq!(parsed.records.len(), 2);
    let bad: Vec<(usize, &str)> = parsed
        .bad_lines
        .iter()
        .map(|b| (b.line, b.error.as_str()))
        .collect();
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
    let report = replay::replay(candidate.as_bytes(), &replay::parse_log(&log), &SEED).unwrap();
    assert_eq!(
        report.decisions[&RecordId::new(0, 2)],
        vec![("per-user".to_string(), Replayed::Allowed)]
    );
    assert_eq!(
        report.decisions[&RecordId::new(0, 1)],
        vec![("per-user".to_string(), Replayed::Limited)]
    );
    assert_eq!(report.rules[0].limited_over_time.get(&2_000_000), Some(&1));
    assert_eq!(report.rules[0].top_keys.len(), 1);
}

/// A tenant's limit from a numeric claim: the access log prints the metadata number as
/// `4.5`, and the replay reads its whole part, as the filter does from the double Envoy
/// hands it.
#[test]
fn a_limit_from_a_numeric_claim_replays_as_the_filter_reads_it() {
    let candidate = r#"{"rules":[{"name":"per-sub","key":[{"jwt_claim":"sub"}],
        "limit":{"algorithm":"fixed_window","window":"1h",
                 "limit":{"jwt_claim":"quota","default":1,"max":100}}}]}"#;
    let claim = "metadata.filter_metadata.envoy.filters.http.jwt_authn.jwt_payload";
    let log: Vec<String> = (1..=6)
        .map(|i| line("-", i * 1_000_000))
        .map(|l| {
            l.replace(
                r#""attributes":{}"#,
                &format!(r#""attributes":{{"{claim}.sub":"t","{claim}.quota":4.5}}"#),
            )
        })
        .collect();
    let log = replay::parse_log(&log.join("\n"));
    let report = replay::replay(candidate.as_bytes(), &log, &SEED).unwrap();
    let allowed = outcomes(&report, "per-sub")
        .into_iter()
        .filter(|o| *o == "allowed");
    assert_eq!(allowed.count(), 4);
}

/// A request with an id the rules do not read (`x-id`), to follow it across logs.
fn tagged(user: &str, id: &str, at_us: u64) -> String {
    format!(r#"{{"start_us":"{at_us}","headers":{{"x-user":"{user}","x-id":"{id}"}}}}"#)
}

/// Each request's `per-user` decision, by its `x-id`.
fn by_id(report: &replay::Report, log: &replay::Log) -> Vec<(String, &'static str)> {
    let mut out: Vec<(String, &'static str)> = log
        .records
        .iter()
        .map(|r| {
            let decided = &report.decisions[&r.id];
            let (_, d) = decided.iter().find(|(rule, _)| rule == "per-user").unwrap();
            (r.headers["x-id"].clone(), d.name())
        })
        .collect();
    out.sort();
    out
}

#[test]
fn several_logs_are_replayed_as_their_concatenation_sorted_by_time() {
    // Two per user per second; users `a` and `b` on both Envoys. Each log is in the
    // order its Envoy wrote it (a request is logged when it ends), and the two share
    // instants: a tie goes to the first log given.
    let candidate = r#"{"rules":[{"name":"per-user","key":[{"header":"x-user"}],
        "limit":{"algorithm":"fixed_window","limit":2,"window":"1s"}}]}"#;
    // (user, id, instant) of each log's lines, in the order they were written.
    let first: &[(&str, &str, u64)] = &[
        ("a", "1a", 1_000_000),
        ("b", "1b", 1_000_300),
        ("a", "1c", 1_000_200),
        ("a", "1d", 1_000_500),
        ("a", "1e", 2_000_000),
        ("c", "1f", 3_000_000),
        ("c", "1g", 3_000_100),
    ];
    let second: &[(&str, &str, u64)] = &[
        ("c", "2g", 3_000_100),
        ("a", "2a", 1_000_100),
        ("b", "2b", 1_000_300),
        ("b", "2c", 1_000_400),
        ("a", "2d", 1_000_500),
        ("a", "2e", 2_000_000),
        ("a", "2f", 2_000_001),
    ];
    let to_lines = |log: &[(&str, &str, u64)]| -> Vec<String> {
        log.iter().map(|&(u, id, at)| tagged(u, id, at)).collect()
    };
    let (first, second) = (to_lines(first), to_lines(second));
    let merged = replay::Log::merge(vec![
        replay::parse_log(&first.join("\n")),
        replay::parse_log(&second.join("\n")),
    ]);
    let merged_report = replay::replay(candidate.as_bytes(), &merged, &SEED).unwrap();

    // The concatenation, sorted by time; `sort_by_key` is stable, so equal instants
    // keep the first log's lines first.
    let mut lines: Vec<(u64, &String)> = first
        .iter()
        .chain(&second)
        .map(|l| (replay::parse_record(1, l).unwrap().at_us(), l))
        .collect();
    lines.sort_by_key(|(at, _)| *at);
    let sorted: Vec<&str> = lines.iter().map(|(_, l)| l.as_str()).collect();
    let concatenated = replay::parse_log(&sorted.join("\n"));
    let concatenated_report = replay::replay(candidate.as_bytes(), &concatenated, &SEED).unwrap();

    assert_eq!(merged_report.rules, concatenated_report.rules);
    assert_eq!(merged_report.requests, 14);
    let decisions = by_id(&merged_report, &merged);
    assert_eq!(decisions, by_id(&concatenated_report, &concatenated));
    let limited: Vec<&str> = decisions
        .iter()
        .filter(|(_, d)| *d == "limited")
        .map(|(id, _)| id.as_str())
        .collect();
    // a: 1a, 2a allowed in second 1; 1c, 1d, 2d limited (1d before 2d: the tie).
    // b: 1b and 2b tie at 300 (both allowed), 2c limited. Second 2: 1e, 2e; 2f limited.
    // c: 1f, then 1g (line 7 of the first log) and 2g (line 1 of the second) tie: the
    // first log's goes first although its line number is higher.
    assert_eq!(limited, ["1c", "1d", "2c", "2d", "2f", "2g"]);
    // The records keep which log and line they came from.
    assert_eq!(merged.records[7].id, RecordId::new(1, 1));
}

#[test]
fn limited_requests_are_counted_in_buckets_of_the_width_asked() {
    // One a second for `a`: every request after the first of each second is limited.
    let candidate = r#"{"rules":[{"name":"per-user","key":[{"header":"x-user"}],
        "limit":{"algorithm":"fixed_window","limit":1,"window":"1s"}}]}"#;
    let at = [
        1_000_000, 1_050_000, 1_099_999, 1_100_000, 1_950_000, 2_000_000, 2_000_001,
    ];
    let log: Vec<String> = at.iter().map(|&t| line("a", t)).collect();
    let log = replay::parse_log(&log.join("\n"));
    let over = |bucket: &str| {
        let options = replay::Options {
            seed: SEED,
            bucket_us: replay::parse_bucket("--bucket", bucket).unwrap(),
        };
        let report = replay::replay_with(candidate.as_bytes(), &log, &options).unwrap();
        let rule = &report.rules[0];
        assert_eq!(
            rule.limited, 5,
            "the width changes the series, not the decisions"
        );
        let series: Vec<(u64, u64)> = rule.limited_over_time.clone().into_iter().collect();
        (report.bucket_us, series)
    };
    assert_eq!(
        over("1s"),
        (1_000_000, vec![(1_000_000, 4), (2_000_000, 1)])
    );
    assert_eq!(
        over("100ms"),
        (
            100_000,
            vec![
                (1_000_000, 2),
                (1_100_000, 1),
                (1_900_000, 1),
                (2_000_000, 1)
            ]
        )
    );
    assert_eq!(over("1m"), (60_000_000, vec![(0, 5)]));
    assert_eq!(
        replay::replay(candidate.as_bytes(), &log, &SEED)
            .unwrap()
            .bucket_us,
        1_000_000,
        "1 s by default"
    );
}

#[test]
fn a_bad_bucket_width_is_refused_naming_the_option_and_the_value() {
    for bad in ["0s", "1.5s", "abc", "", "31d", "100"] {
        let err = replay::parse_bucket("--bucket", bad).unwrap_err();
        assert!(
            err.starts_with(&format!("--bucket {bad:?}: not a duration")),
            "{err}"
        );
    }
    let config = file("bucket.json", PER_USER_1H);
    let log = file("bucket.jsonl", &line("a", 1));
    let (config, log) = (config.to_str().unwrap(), log.to_str().unwrap());
    let (code, stdout, stderr) = weir_check(&[
        "replay", "--config", config, "--log", log, "--bucket", "1.5s",
    ]);
    assert_eq!((code, stdout.as_str()), (2, ""));
    assert!(
        stderr.starts_with("error: --bucket \"1.5s\": not a duration: expected a whole number"),
        "{stderr}"
    );
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
    let log = replay::parse_log(&log.join("\n"));
    let report = replay::replay(candidate.as_bytes(), &log, &SEED).unwrap();
    assert_eq!(report.central, vec!["per-tenant".to_string()]);
    assert_eq!(
        outcomes(&report, "per-tenant"),
        ["allowed", "allowed", "allowed", "limited", "limited"]
    );
}

/// A request of `user` that started at `start_us` and lasted `duration_us` (`None`: not
/// logged), decided `decided_after_us` after its start (weir's logged decision, of a
/// rule the candidate does not have).
fn timed(user: &str, start_us: u64, duration_us: Option<u64>) -> String {
    let duration = duration_us.map_or("null".to_string(), |d| d.to_string());
    let decided = start_us + 20;
    format!(
        r#"{{"start_us":"{start_us}","duration_us":{duration},"decisions":"other:allowed:slot:1:{decided}","headers":{{"x-user":"{user}"}}}}"#
    )
}

const ONE_IN_FLIGHT: &str = r#"{"rules":[{"name":"in-flight","key":[{"header":"x-user"}],
    "limit":{"algorithm":"concurrency","max_in_flight":1}}]}"#;

#[test]
fn a_concurrency_rule_holds_a_place_from_its_decision_to_its_end() {
    let log = [
        // a: one place from 1.00002 s to 1.1 s; `b` is another key.
        timed("a", 1_000_000, Some(100_000)),
        timed("b", 1_010_000, Some(500_000)),
        timed("a", 1_050_000, Some(10)),
        // Decided at 1.1 s, when the first ends: it ends first.
        timed("a", 1_099_980, Some(100_000)),
        timed("a", 1_150_000, Some(1_000)),
        // Ten seconds, beyond the places' two epochs: still held at 11 s.
        timed("a", 2_000_000, Some(10_000_000)),
        timed("a", 11_000_000, Some(1_000)),
        timed("a", 12_000_100, Some(1_000)),
    ]
    .join("\n");
    let report = replay::replay(ONE_IN_FLIGHT.as_bytes(), &replay::parse_log(&log), &SEED).unwrap();
    assert!(report.not_replayed.is_empty(), "{:?}", report.not_replayed);
    assert_eq!(
        outcomes(&report, "in-flight"),
        ["allowed", "allowed", "limited", "allowed", "limited", "allowed", "limited", "allowed"]
    );
    assert_eq!(report.without_duration, 0);
    // A second place per key admits what the first refused.
    let two = ONE_IN_FLIGHT.replace(r#""max_in_flight":1"#, r#""max_in_flight":2"#);
    let report = replay::replay(two.as_bytes(), &replay::parse_log(&log), &SEED).unwrap();
    assert_eq!(report.rules[0].limited, 0);
}

#[test]
fn a_request_without_a_duration_holds_no_place_and_is_counted() {
    let log = [
        timed("a", 1_000_000, None),
        timed("a", 1_000_100, Some(1_000)),
        timed("a", 1_000_200, Some(1_000)),
    ]
    .join("\n");
    let report = replay::replay(ONE_IN_FLIGHT.as_bytes(), &replay::parse_log(&log), &SEED).unwrap();
    assert_eq!(
        outcomes(&report, "in-flight"),
        ["allowed", "allowed", "limited"]
    );
    assert_eq!(report.without_duration, 1);
}

#[test]
fn adaptive_concurrency_and_logs_without_durations_are_not_replayed() {
    let adaptive = r#"{"rules":[{"name":"adaptive","key":[{"header":"x-user"}],
        "limit":{"algorithm":"concurrency","max_in_flight":8,
                 "adaptive":{"latency":"p90","interval":"500ms"}}}]}"#;
    let log = replay::parse_log(&timed("a", 1_000_000, Some(1)));
    let report = replay::replay(adaptive.as_bytes(), &log, &SEED).unwrap();
    assert_eq!(report.not_replayed[0].0, "adaptive");
    assert!(report.not_replayed[0]
        .1
        .starts_with("adaptive concurrency rule: its limit follows"));
    let old = replay::parse_log(&line("a", 1_000_000));
    let report = replay::replay(ONE_IN_FLIGHT.as_bytes(), &old, &SEED).unwrap();
    assert_eq!(
        report.not_replayed,
        [(
            "in-flight".to_string(),
            "concurrency rule: the log records no duration_us (record it with the format \
             weir-check log-format prints)"
                .to_string()
        )]
    );
}

#[test]
fn a_rule_not_replayed_is_named_and_the_others_are_replayed() {
    // No duration_us in the log: the concurrency rule cannot be replayed.
    let candidate = r#"{"rules":[
        {"name":"in-flight","key":[{"header":"x-user"}],
         "limit":{"algorithm":"concurrency","max_in_flight":1}},
        {"name":"per-user","key":[{"header":"x-user"}],
         "limit":{"algorithm":"fixed_window","limit":1,"window":"1h"}}]}"#;
    let log = [line("a", 1_000_000), line("a", 1_000_001)].join("\n");
    let report = replay::replay(candidate.as_bytes(), &replay::parse_log(&log), &SEED).unwrap();
    let names: Vec<&str> = report
        .not_replayed
        .iter()
        .map(|(n, _)| n.as_str())
        .collect();
    assert_eq!(names, ["in-flight"]);
    assert_eq!(outcomes(&report, "per-user"), ["allowed", "limited"]);
}

/// One request per 100 ms per user, none in a burst; a request that would be limited
/// waits up to `max` for its slot, at most `queue` at once.
fn delaying(max: &str, queue: u32) -> String {
    format!(
        r#"{{"rules":[
        {{"name":"held","key":[{{"header":"x-user"}}],
         "limit":{{"algorithm":"gcra","rate":10,"period":"1s","burst":0}},
         "on_limit":{{"delay":{{"max":"{max}","queue":{queue}}}}}}},
        {{"name":"per-user","key":[{{"header":"x-user"}}],
         "limit":{{"algorithm":"fixed_window","limit":3,"window":"1h"}}}}]}}"#
    )
}

#[test]
fn a_delaying_rule_holds_requests_and_releases_them_when_due() {
    // Four requests of `a` within 30 µs, then one at 1.15 s.
    let at = [1_000_000, 1_000_010, 1_000_020, 1_000_030, 1_150_000];
    let log: Vec<String> = at.iter().map(|&t| line("a", t)).collect();
    let log = replay::parse_log(&log.join("\n"));
    let report = replay::replay(delaying("1s", 8).as_bytes(), &log, &SEED).unwrap();
    assert!(report.not_replayed.is_empty(), "{:?}", report.not_replayed);
    let held = &report.rules[0];
    // A held request is counted as if released `RELEASE_SLACK_US` (2 ms) late, so each
    // next slot is 102 ms on: due at 1.1, 1.202, 1.304 s; the one of 1.15 s at 1.406 s.
    // The filter releases them on its tick, every `RELEASE_TICK_MS` (1 ms) from when it
    // first held one (1.00001 s): 10 µs after each is due.
    assert_eq!(weir_core::delay::RELEASE_SLACK_US, 2_000);
    assert_eq!(weir_core::delay::RELEASE_TICK_MS, 1);
    assert_eq!((held.allowed, held.delayed, held.limited), (5, 4, 0));
    assert_eq!(
        held.delayed_us,
        (100_010 - 10) + (202_010 - 20) + (304_010 - 30) + 256_010
    );
    // The rule after it decides at the release, in release order: 3 an hour.
    let mut by_line: Vec<(usize, &str)> = report
        .decisions
        .iter()
        .filter_map(|(id, d)| {
            let (_, o) = d.iter().find(|(r, _)| r == "per-user")?;
            Some((id.line, o.name()))
        })
        .collect();
    by_line.sort();
    assert_eq!(
        by_line,
        [
            (1, "allowed"),
            (2, "allowed"),
            (3, "allowed"),
            (4, "limited"),
            (5, "limited")
        ]
    );
    // The command says so.
    let config = file("delaying.json", &delaying("1s", 8));
    let text: Vec<String> = at.iter().map(|&t| line("a", t)).collect();
    let logged = file("delaying.jsonl", &text.join("\n"));
    let (code, stdout, _) = weir_check(&[
        "replay",
        "--config",
        config.to_str().unwrap(),
        "--log",
        logged.to_str().unwrap(),
    ]);
    assert_eq!(code, 0);
    assert!(
        stdout.contains("rule held: 5 matched, 5 allowed, 0 limited (4 of the allowed delayed, 215 ms on average)\n"),
        "{stdout}"
    );
    // A shorter max: only what fits within 150 ms waits, the rest is limited.
    let report = replay::replay(delaying("150ms", 8).as_bytes(), &log, &SEED).unwrap();
    assert_eq!(
        outcomes(&report, "held")[..4],
        ["allowed", "allowed", "limited", "limited"]
    );
    assert_eq!(report.rules[0].delayed, 2);
    // A queue of one: a second request waiting at once is limited.
    let report = replay::replay(delaying("1s", 1).as_bytes(), &log, &SEED).unwrap();
    assert_eq!(
        outcomes(&report, "held")[..3],
        ["allowed", "allowed", "limited"]
    );
}

/// A request of `user` with a token estimate of 1, that lasted 10 ms and got `status`.
fn answered(user: &str, start_us: u64, status: u16) -> String {
    format!(
        r#"{{"start_us":"{start_us}","duration_us":"10000","status":{status},"headers":{{"x-user":"{user}","x-estimate":"1"}}}}"#
    )
}

#[test]
fn a_commit_rule_charges_a_logged_5xx_its_on_error_as_the_filter_does() {
    // The replay runs the filter's lifecycle: each request's response ends its stream
    // with the logged status, and the filter settles what it reserved. An upstream 5xx
    // costs `on_error` (10: the hour's whole limit); anything else keeps its estimate,
    // the log holding no usage.
    let candidate = r#"{"rules":[{"name":"tokens","key":[{"header":"x-user"}],
        "limit":{"algorithm":"fixed_window","limit":10,"window":"1h"},
        "cost":{"header":"x-estimate","max":10},
        "commit":{"header":"x-tokens","on_error":10}}]}"#;
    let log = [
        answered("a", 1_000_000, 503),
        answered("b", 1_000_001, 200),
        answered("a", 1_100_000, 200),
        answered("b", 1_100_001, 200),
        answered("a", 1_200_000, 200),
        answered("b", 1_200_001, 200),
    ]
    .join("\n");
    let report = replay::replay(candidate.as_bytes(), &replay::parse_log(&log), &SEED).unwrap();
    assert_eq!(
        outcomes(&report, "tokens"),
        ["allowed", "allowed", "limited", "allowed", "limited", "allowed"]
    );
}

#[test]
fn a_request_the_served_envoy_held_is_replayed_from_its_start() {
    let held = r#"{"start_us":"1000000","delay_ms":"100","decisions":"held:allowed:slot:1:1100000","headers":{"x-user":"a"}}"#;
    let record = replay::parse_record(1, held).unwrap();
    assert_eq!((record.delay_ms, record.at_us()), (Some(100), 1_000_000));
    let not_held = held.replace(r#""delay_ms":"100","#, "");
    assert_eq!(
        replay::parse_record(1, &not_held).unwrap().at_us(),
        1_100_000
    );
}

/// Runs `weir-check ARGS`: exit status, stdout, stderr.
pub(crate) fn weir_check(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_weir-check"))
        .args(args)
        .output()
        .unwrap();
    let text = |bytes: Vec<u8>| String::from_utf8(bytes).unwrap();
    (
        out.status.code().unwrap(),
        text(out.stdout),
        text(out.stderr),
    )
}

/// A file of this test's own in the temporary directory.
pub(crate) fn file(name: &str, text: &str) -> PathBuf {
    let path = std::env::temp_dir().join(format!("weir-replay-{}-{name}", std::process::id()));
    std::fs::write(&path, text).unwrap();
    path
}

const PER_USER_1H: &str = r#"{"rules":[{"name":"per-user","key":[{"header":"x-user"}],
    "limit":{"algorithm":"fixed_window","limit":1,"window":"1h"}}]}"#;

#[test]
fn cli_log_format_records_the_facts_the_rules_read() {
    let config = file(
        "log-format.json",
        r#"{"rules":[{"name":"per-ip","key":[{"client_ip":{}},{"header":"x-user"}],
            "match":{"path":{"prefix":"/api"}},
            "limit":{"algorithm":"fixed_window","limit":1,"window":"1h"}}]}"#,
    );
    let (code, stdout, stderr) = weir_check(&["log-format", config.to_str().unwrap()]);
    assert_eq!((code, stderr.as_str()), (0, ""));
    let format: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(
        format,
        serde_json::json!({
            "start_us": "%START_TIME(%s%6f)%",
            "duration_us": "%COMMON_DURATION(DS_RX_BEG:DS_TX_END:us)%",
            "status": "%RESPONSE_CODE%",
            "delay_ms": "%RESP(x-weir-delay-ms)%",
            "decisions": "%FILTER_STATE(wasm.weir.decisions:PLAIN)%",
            "headers": { ":path": "%REQ(:PATH)%", "x-user": "%REQ(x-user)%" },
            "attributes": { "source.address": "%DOWNSTREAM_REMOTE_ADDRESS%" },
        })
    );
}

#[test]
fn cli_replay_reports_rules_bad_lines_and_the_difference() {
    let config = file("replay.json", PER_USER_1H);
    // Served by a looser config: all three allowed; the candidate allows one an hour.
    let logged = |at: u64| {
        format!(
            r#"{{"start_us":"{at}","status":200,"decisions":"per-user:allowed:slot:1:{at}","headers":{{"x-user":"a"}},"attributes":{{}}}}"#
        )
    };
    let log = [
        logged(1_000_000),
        "{".into(),
        logged(2_000_000),
        logged(3_000_000),
    ]
    .join("\n");
    let log = file("replay.jsonl", &log);
    let args = [
        "replay",
        "--config",
        config.to_str().unwrap(),
        "--log",
        log.to_str().unwrap(),
        "--served",
        config.to_str().unwrap(),
    ];
    let (code, stdout, stderr) = weir_check(&args);
    assert_eq!((code, stderr.as_str()), (0, ""));
    for expected in [
        "3 requests replayed\n",
        "1 lines skipped:\n  line 2: not JSON",
        "rule per-user: 3 matched, 1 allowed, 2 limited\n",
        "(3 logged): 1 agree, 2 newly limited, 0 newly allowed\n",
        "         2  =a\n",
        "    2: 1\n    3: 1\n",
    ] {
        assert!(stdout.contains(expected), "{expected:?} not in:\n{stdout}");
    }

    let mut json_args = args.to_vec();
    json_args.push("--json");
    let (code, stdout, _) = weir_check(&json_args);
    assert_eq!(code, 0);
    let report: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(report["bad_lines"][0]["line"], 2);
    assert_eq!(report["rules"][0]["limited"], 2);
    assert_eq!(report["rules"][0]["served"]["newly_limited"], 2);
    assert_eq!(report["rules"][0]["top_keys"][0]["key"], "=a");

    assert_eq!(weir_check(&["replay", "--config", "x"]).0, 2, "no --log");
}

#[test]
fn cli_replay_merges_the_logs_of_several_envoys() {
    let config = file("fleet.json", PER_USER_1H);
    let one = file(
        "fleet-1.jsonl",
        &[line("a", 2_000_000), "{".into()].join("\n"),
    );
    let two = file("fleet-2.jsonl", &line("a", 1_000_000));
    let path = |p: &PathBuf| p.to_str().unwrap().to_string();
    let (config, one, two) = (path(&config), path(&one), path(&two));
    let args = [
        "replay", "--config", &config, "--log", &one, "--log", &two, "--json",
    ];
    let (code, stdout, stderr) = weir_check(&args);
    assert_eq!((code, stderr.as_str()), (0, ""));
    let report: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(report["requests"], 2);
    assert_eq!(report["rules"][0]["limited"], 1);
    // The second log's request came first: the first log's is the one limited.
    assert_eq!(
        report["rules"][0]["limited_over_time"][0]["start_us"],
        2_000_000
    );
    assert_eq!(report["bad_lines"][0]["log"], one.as_str());
    assert_eq!(report["bad_lines"][0]["line"], 2);
    let (_, text, _) = weir_check(&args[..args.len() - 1]);
    assert!(
        text.starts_with("2 requests replayed from 2 logs, merged by time\n"),
        "{text}"
    );
    assert!(
        text.contains(&format!("  {one}: line 2: not JSON")),
        "{text}"
    );
}

#[test]
fn cli_replay_names_rules_dropped_added_and_unknown_to_the_served_config() {
    let served = file(
        "served.json",
        r#"{"rules":[{"name":"per-user","key":[{"header":"x-user"}],
            "limit":{"algorithm":"fixed_window","limit":1,"window":"1h"}},
            {"name":"old","key":[{"header":"x-user"}],
            "limit":{"algorithm":"fixed_window","limit":1,"window":"1h"}}]}"#,
    );
    let candidate = file(
        "candidate.json",
        r#"{"rules":[{"name":"new","key":[{"header":"x-user"}],
            "limit":{"algorithm":"fixed_window","limit":1,"window":"1h"}}]}"#,
    );
    let log = file(
        "served.jsonl",
        &[
            r#"{"start_us":"1","decisions":"per-user:allowed:slot:1:1,old:allowed:slot:1:1","headers":{"x-user":"a"}}"#,
            r#"{"start_us":"2","decisions":"per-user:allowed:slot:1:2,old:limited:slot:1:2","headers":{"x-user":"a"}}"#,
            r#"{"start_us":"3","decisions":"gone:allowed:slot:1:3","headers":{"x-user":"a"}}"#,
        ]
        .join("\n"),
    );
    let path = |p: &PathBuf| p.to_str().unwrap().to_string();
    let (candidate, log, served) = (path(&candidate), path(&log), path(&served));
    let args = [
        "replay", "--config", &candidate, "--log", &log, "--served", &served,
    ];
    let (code, stdout, stderr) = weir_check(&args);
    assert_eq!((code, stderr.as_str()), (0, ""));
    for expected in [
        "rule per-user: served, not in the candidate: it limited 0 logged requests",
        "rule old: served, not in the candidate: it limited 1 logged requests",
        "rule new: not in the served config: nothing to compare\n",
        "warning: the log has decisions of rule gone, which the served config does not have",
    ] {
        assert!(stdout.contains(expected), "{expected:?} not in:\n{stdout}");
    }
    let mut json_args = args.to_vec();
    json_args.push("--json");
    let (_, stdout, _) = weir_check(&json_args);
    let report: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(report["served"]["dropped"][1]["rule"], "old");
    assert_eq!(report["served"]["dropped"][1]["limited_in_log"], 1);
    assert_eq!(report["served"]["added"][0], "new");
    assert_eq!(report["served"]["unknown"][0], "gone");
}
