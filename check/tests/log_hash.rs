//! `weir_check::log_hash` and `weir-check log-hash`: logs with their values replaced by a
//! keyed hash, replayed as the raw ones for configs keyed the same way.

use std::path::PathBuf;

use weir_check::replay::{self, Replayed};
use weir_core::config;

use crate::replay::{file, weir_check, SEED};

use weir_check::log_hash::{self, Form, LogPlan, Plan, Salt};

fn salt() -> Salt {
    Salt::new(b"a salt of more than sixteen bytes\n".to_vec()).unwrap()
}

#[test]
fn hmac_sha256_is_rfc_4231() {
    let hex = |b: &[u8]| b.iter().map(|b| format!("{b:02x}")).collect::<String>();
    // Test cases 2 (a short key) and 6 (a key longer than the block).
    assert_eq!(
        hex(&log_hash::hmac_sha256(
            b"Jefe",
            b"what do ya want for nothing?"
        )),
        "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
    );
    assert_eq!(
        hex(&log_hash::hmac_sha256(
            &[0xaa; 131],
            b"Test Using Larger Than Block-Size Key - Hash Key First"
        )),
        "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"
    );
}

#[test]
fn a_short_salt_is_refused() {
    let err = Salt::new(b"short\n".to_vec()).err().unwrap();
    assert!(
        err.starts_with("5 bytes of salt: at least 16 are needed"),
        "{err}"
    );
}

/// Keyed on a user header, the client address without its port and the path without
/// its query; matching on the method.
const KEYED: &str = r#"{"rules":[
    {"name":"per-user","key":[{"header":"x-user"}],
     "limit":{"algorithm":"gcra","rate":2,"period":"1s","burst":1}},
    {"name":"per-ip-path","key":[{"client_ip":{}},{"path":{}}],
     "match":{"methods":["GET"]},
     "limit":{"algorithm":"fixed_window","limit":3,"window":"1s"}}]}"#;

#[test]
fn log_hash_hashes_what_keys_read_and_keeps_what_rules_match_on() {
    let config = config::parse(KEYED.as_bytes()).unwrap();
    let plan = LogPlan::new(&config);
    let plans: Vec<(String, Plan)> = plan
        .fields
        .iter()
        .map(|(s, f, p)| (format!("{s}.{f}"), p.clone()))
        .collect();
    assert_eq!(
        plans,
        [
            ("headers.x-user".into(), Plan::Hash(Form::Value)),
            (
                "headers.:method".into(),
                Plan::Clear("rule per-ip-path matches on it".into())
            ),
            (
                "attributes.source.address".into(),
                Plan::Hash(Form::ClientIp)
            ),
            ("headers.:path".into(), Plan::Hash(Form::Path)),
        ]
    );
    let raw = r#"{"start_us":"5","decisions":null,"headers":{"x-user":"alice","x-other":"o","x-empty":"",":method":"GET",":path":"/a?q=1"},"attributes":{"source.address":"10.0.0.1:5000","gone":null}}"#;
    let hashed: serde_json::Value =
        serde_json::from_str(&plan.hash_line(&salt(), raw).unwrap()).unwrap();
    let h = &hashed["headers"];
    assert_eq!(h[":method"], "GET");
    assert_eq!(
        h["x-empty"], "",
        "empty stays empty: a default applies to it"
    );
    assert_eq!(hashed["attributes"]["gone"], serde_json::Value::Null);
    assert_eq!(hashed["start_us"], "5");
    let form = |v: &serde_json::Value| Form::of(v.as_str().unwrap());
    assert_eq!(form(&h["x-user"]), Some(Form::Value));
    assert_eq!(
        form(&h["x-other"]),
        Some(Form::Value),
        "a field no rule reads"
    );
    assert_eq!(form(&h[":path"]), Some(Form::Path));
    assert_eq!(
        h[":path"].as_str().unwrap(),
        Form::Path.hash(&salt(), b"/a?q=2"),
        "the query is not hashed"
    );
    assert_eq!(
        form(&hashed["attributes"]["source.address"]),
        Some(Form::ClientIp)
    );
    let text = hashed.to_string();
    for secret in ["alice", "10.0.0.1", "/a"] {
        assert!(!text.contains(secret), "{secret} in {text}");
    }
    // A query parameter key reads what no hash keeps: :path stays in clear.
    let query = config::parse(
        br#"{"rules":[{"name":"per-q","key":[{"query_param":"q"},{"path":{}}],
        "limit":{"algorithm":"fixed_window","limit":3,"window":"1s"}}]}"#,
    )
    .unwrap();
    assert_eq!(
        LogPlan::new(&query).fields[0].2,
        Plan::Clear("rule per-q keys on a query parameter of it".into())
    );
    // A tenant's own limit is a number the rule reads: a hash would replay as no number
    // (the default), so it stays in clear.
    let tenant = config::parse(
        br#"{"trusted_headers":["x-quota"],"rules":[{"name":"per-tenant","key":[{"header":"x-t"}],
        "limit":{"algorithm":"fixed_window","window":"1s",
                 "limit":{"header":"x-quota","default":3,"max":30}}}]}"#,
    )
    .unwrap();
    assert_eq!(
        LogPlan::new(&tenant).fields[1],
        (
            "headers",
            "x-quota".to_string(),
            Plan::Clear("rule per-tenant reads its limit from it".into())
        )
    );
    // A shared limit's key within its parent is hashed like a key; a weight, a number
    // the rule reads, stays in clear.
    let shared = config::parse(
        br#"{"trusted_headers":["x-user","x-seats"],"rules":[{"name":"per-org","key":[{"header":"x-org"}],
        "limit":{"algorithm":"fixed_window","window":"1s","limit":10},
        "share":{"by":[{"header":"x-user"}],"weight":{"header":"x-seats","max":9}}}]}"#,
    )
    .unwrap();
    let fields = LogPlan::new(&shared).fields;
    let plan_of = |name: &str| fields.iter().find(|f| f.1 == name).map(|f| f.2.clone());
    assert!(
        matches!(plan_of("x-user"), Some(Plan::Hash(_))),
        "{fields:?}"
    );
    assert_eq!(
        plan_of("x-seats"),
        Some(Plan::Clear(
            "rule per-org reads a key's share weight from it".into()
        ))
    );
    assert_eq!(
        plan.hash_line(&salt(), "[1]").unwrap_err(),
        "not a JSON object"
    );
}

/// A day of traffic: users, addresses with changing ports, paths with queries.
fn traffic() -> Vec<String> {
    let users = ["alice", "bob", "carol", ""];
    let paths = ["/a?x=1", "/a?x=2", "/b", "/a"];
    (0..400u64)
        .map(|i| {
            let at = 1_000_000 + i * 37_000 + (i * i) % 5_000;
            let user = users[(i * 7 % 11 % 4) as usize];
            let path = paths[(i % 4) as usize];
            let method = if i % 5 == 0 { "POST" } else { "GET" };
            let address = format!("10.0.0.{}:{}", i % 3, 40_000 + i);
            format!(
                r#"{{"start_us":"{at}","headers":{{"x-user":"{user}",":method":"{method}",":path":"{path}"}},"attributes":{{"source.address":"{address}"}}}}"#
            )
        })
        .collect()
}

fn hash_log(config: &str, lines: &[String]) -> replay::Log {
    let plan = LogPlan::new(&config::parse(config.as_bytes()).unwrap());
    let hashed: Vec<String> = lines
        .iter()
        .map(|l| plan.hash_line(&salt(), l).unwrap())
        .collect();
    replay::parse_log(&hashed.join("\n"))
}

/// Each request's decisions (rule, outcome), in the order of the log.
type Decisions = Vec<Vec<(String, Replayed)>>;

/// The decisions by record, and the figures but for the keys' names.
fn decided(report: &replay::Report) -> (Decisions, Vec<[u64; 4]>) {
    let figures = report
        .rules
        .iter()
        .map(|r| [r.matched, r.allowed, r.limited, r.top_keys.len() as u64])
        .collect();
    (report.decisions.values().cloned().collect(), figures)
}

#[test]
fn a_hashed_log_replays_as_the_raw_one_for_configs_keyed_the_same_way() {
    let lines = traffic();
    let raw = replay::parse_log(&lines.join("\n"));
    let hashed = hash_log(KEYED, &lines);
    assert!(hashed.bad_lines.is_empty());
    // The config it was hashed for, and a candidate with other limits, the same keys.
    let tighter = KEYED
        .replace(r#""rate":2"#, r#""rate":1"#)
        .replace(r#""limit":3"#, r#""limit":2"#);
    for candidate in [KEYED, tighter.as_str()] {
        let on_raw = replay::replay(candidate.as_bytes(), &raw, &SEED).unwrap();
        let on_hashed = replay::replay(candidate.as_bytes(), &hashed, &SEED).unwrap();
        let (raw_decisions, raw_figures) = decided(&on_raw);
        assert!(raw_figures.iter().all(|f| f[2] > 0), "{raw_figures:?}");
        assert_eq!((raw_decisions, raw_figures), decided(&on_hashed));
        assert!(on_hashed.rules[0].top_keys[0].0.starts_with("=hmac-v-"));
    }
}

#[test]
fn a_candidate_reading_a_hashed_fact_otherwise_is_refused() {
    let hashed = hash_log(KEYED, &traffic());
    let refused = |candidate: &str| {
        replay::replay(candidate.as_bytes(), &hashed, &SEED)
            .err()
            .unwrap_or_else(|| panic!("replayed: {candidate}"))
    };
    let limit = r#""limit":{"algorithm":"fixed_window","limit":3,"window":"1s"}"#;
    let matching = format!(
        r#"{{"rules":[{{"name":"vip","match":{{"headers":[{{"name":"x-user","exact":"alice"}}]}},
        "key":[{{"static":"all"}}],{limit}}}]}}"#
    );
    assert!(
        refused(&matching).starts_with(
            "rule vip matches on it (headers.x-user), which the log holds hashed whole: \
             a replay cannot evaluate that"
        ),
        "{}",
        refused(&matching)
    );
    let query = format!(r#"{{"rules":[{{"name":"q","key":[{{"query_param":"x"}}],{limit}}}]}}"#);
    assert!(refused(&query).starts_with(
        "rule q keys on a query parameter of it (headers.:path), which the log holds hashed \
         without its query"
    ));
    let whole_address = format!(
        r#"{{"rules":[{{"name":"conn","key":[{{"attribute":["source","address"]}}],{limit}}}]}}"#
    );
    assert!(refused(&whole_address).starts_with(
        "rule conn keys on it (attributes.source.address), which the log holds hashed \
         without its port"
    ));
    // Hashed whole, with the port: a client_ip key would see every connection apart.
    let by_connection = format!(
        r#"{{"rules":[{{"name":"conn","key":[{{"attribute":["source","address"]}}],{limit}}}]}}"#
    );
    let hashed_whole = hash_log(&by_connection, &traffic());
    let client_ip =
        format!(r#"{{"rules":[{{"name":"ip","key":[{{"client_ip":{{}}}}],{limit}}}]}}"#);
    let err = replay::replay(client_ip.as_bytes(), &hashed_whole, &SEED).unwrap_err();
    assert!(
        err.starts_with(
            "rule ip keys on it as client_ip (without its port) (attributes.source.address), \
             which the log holds hashed whole"
        ),
        "{err}"
    );
    // A raw and a hashed log merged: refused too.
    let mixed = replay::Log::merge(vec![
        replay::parse_log(&traffic().join("\n")),
        hash_log(KEYED, &traffic()),
    ]);
    let err = replay::replay(KEYED.as_bytes(), &mixed, &SEED).unwrap_err();
    assert!(err.contains("both in clear and hashed"), "{err}");
}

#[test]
fn cli_log_hash_rewrites_a_log_and_leaves_out_what_is_not_a_record() {
    let config = file("hash.json", KEYED);
    let salt = file("hash.salt", "a salt of more than sixteen bytes\n");
    let mut lines = traffic();
    lines.insert(1, "{ not json".into());
    let log = file("hash-raw.jsonl", &lines.join("\n"));
    let out = std::env::temp_dir().join(format!("weir-replay-{}-hashed", std::process::id()));
    let path = |p: &PathBuf| p.to_str().unwrap().to_string();
    let (config, salt, log, out) = (path(&config), path(&salt), path(&log), path(&out));
    let (code, stdout, stderr) = weir_check(&[
        "log-hash",
        "--config",
        &config,
        "--salt-file",
        &salt,
        "--log",
        &log,
        "--out",
        &out,
    ]);
    assert_eq!((code, stdout.as_str()), (0, ""), "{stderr}");
    for expected in [
        "hashed: headers.x-user (whole)\n",
        "hashed: attributes.source.address (without its port)\n",
        "in clear: headers.:method: rule per-ip-path matches on it\n",
        "line 2: left out: not JSON",
        "1 lines left out (not records; never written in clear)\n",
    ] {
        assert!(stderr.contains(expected), "{expected:?} not in:\n{stderr}");
    }
    let hashed = std::fs::read_to_string(&out).unwrap();
    assert_eq!(hashed.lines().count(), 400);
    assert!(!hashed.contains("alice"));
    let hashed = replay::parse_log(&hashed);
    let raw = replay::parse_log(&traffic().join("\n"));
    assert_eq!(
        decided(&replay::replay(KEYED.as_bytes(), &raw, &SEED).unwrap()),
        decided(&replay::replay(KEYED.as_bytes(), &hashed, &SEED).unwrap())
    );
    let short = file("short.salt", "short");
    let (code, _, stderr) = weir_check(&[
        "log-hash",
        "--config",
        &config,
        "--salt-file",
        &path(&short),
        "--log",
        &log,
    ]);
    assert_eq!(code, 1);
    assert!(
        stderr.starts_with(&format!(
            "error: --salt-file {}: 5 bytes of salt: at least 16",
            path(&short)
        )),
        "{stderr}"
    );
}
