//! The configuration contract: every fixture under `tests/config/good` compiles, every
//! fixture under `tests/config/bad` fails with exactly the one-line message in its
//! sibling `.expected` file. Adding a fixture adds a case.
//!
//! Then a few compiled configs are inspected field by field (defaults, lowercasing,
//! facts). The `weir-check check-config` binary runs on these fixtures in check/tests/cli.rs.

// Reads fixtures from disk: native only (the e2e suite runs the same
// parser inside Envoy). A test harness reports by panicking, helpers included.
#![cfg(not(target_arch = "wasm32"))]

use std::path::{Path, PathBuf};

use weir_core::algorithms::{AlgorithmKind, Limit};
use weir_core::config::{self, Config};
use weir_core::field_error::FieldError;
use weir_core::response::{CustomBody, FilterState, HeaderStyle, ResponseSettings};
use weir_core::rules::{
    Cost, Fact, FactId, HeaderTest, KeySource, RequestMatch, Scope, StringMatch,
};

fn fixtures(kind: &str) -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/config")
        .join(kind);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "json"))
        .collect();
    files.sort();
    files
}

fn fixture(kind: &str, name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/config")
        .join(kind)
        .join(format!("{name}.json"))
}

fn parse_fixture(name: &str) -> Config {
    let json = std::fs::read(fixture("good", name)).unwrap();
    config::parse(&json).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn parse_str(json: &str) -> Result<Config, FieldError> {
    config::parse(json.as_bytes())
}

fn fact(config: &Config, id: FactId) -> &Fact {
    config.facts.get(id).unwrap()
}

fn header(name: &str) -> Fact {
    Fact::Header(name.to_string())
}

fn property(path: &[&str]) -> Fact {
    Fact::Property(path.iter().map(ToString::to_string).collect())
}

#[test]
fn good_fixtures_compile() {
    let files = fixtures("good");
    assert!(files.len() >= 20, "only {} good fixtures", files.len());
    let failures: Vec<String> = files
        .iter()
        .filter_map(|path| {
            let json = std::fs::read(path).unwrap();
            config::parse(&json)
                .err()
                .map(|e| format!("{}: {e}", path.display()))
        })
        .collect();
    assert!(
        failures.is_empty(),
        "good fixtures refused:\n{}",
        failures.join("\n")
    );
}

#[test]
fn bad_fixtures_fail_with_their_expected_message() {
    let files = fixtures("bad");
    assert!(files.len() >= 40, "only {} bad fixtures", files.len());
    let mut failures = Vec::new();
    for path in &files {
        let expected_path = path.with_extension("expected");
        let Ok(expected) = std::fs::read_to_string(&expected_path) else {
            failures.push(format!("{}: no .expected file", path.display()));
            continue;
        };
        let expected = expected.strip_suffix('\n').unwrap_or(&expected);
        assert!(
            !expected.contains('\n'),
            "{}: more than one line",
            expected_path.display()
        );
        let json = std::fs::read(path).unwrap();
        match config::parse(&json) {
            Ok(_) => failures.push(format!("{}: accepted", path.display())),
            Err(e) if e.to_string() == expected => {}
            Err(e) => failures.push(format!(
                "{}:\n  expected: {expected}\n  actual:   {e}",
                path.display()
            )),
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} bad fixtures:\n{}",
        failures.len(),
        files.len(),
        failures.join("\n")
    );
}

#[test]
fn every_expected_file_has_a_fixture() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/config/bad");
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|ext| ext == "expected") {
            assert!(
                path.with_extension("json").exists(),
                "{}: orphan",
                path.display()
            );
        }
    }
}

#[test]
fn errors_carry_path_and_message_separately() {
    let e = parse_str(
        r#"{"rules": [{"name": "a", "limit": {"algorithm": "gcra", "rate": 1, "period": "5x"}}]}"#,
    )
    .unwrap_err();
    assert_eq!(e.path, "rules[0].limit.period");
    assert_eq!(
        e.message,
        r#"invalid duration "5x": expected a whole number followed by us, ms, s, m, h or d (e.g. "500ms")"#
    );
    let e = parse_str("{").unwrap_err();
    assert_eq!(
        (e.path.as_str(), e.to_string().as_str()),
        (
            "",
            "invalid JSON at line 1 column 1: EOF while parsing an object"
        )
    );
}

#[test]
fn serde_messages_do_not_depend_on_formatting() {
    let compact =
        r#"{"rules":[{"name":"a","limit":{"algorithm":"gcra","rate":"1","period":"1s"}}]}"#;
    let spread = "{\n  \"rules\": [\n    {\n      \"name\": \"a\",\n      \"limit\": {\"algorithm\": \"gcra\", \"rate\": \"1\", \"period\": \"1s\"}\n    }\n  ]\n}";
    let a = parse_str(compact).unwrap_err();
    assert_eq!(a, parse_str(spread).unwrap_err());
    assert_eq!(
        a.to_string(),
        r#"rules[0].limit.rate: invalid type: string "1", expected a whole number or {"jwt_claim" | "attribute" | "header": ..., "default": ..., "max": ...}"#
    );
}

#[test]
fn size_is_bounded_at_one_mebibyte() {
    let rule =
        r#"{"rules": [{"name": "a", "limit": {"algorithm": "gcra", "rate": 1, "period": "1s"}}]}"#;
    let mut json = rule.as_bytes().to_vec();
    json.resize(1 << 20, b' ');
    assert!(config::parse(&json).is_ok());
    json.push(b' ');
    assert_eq!(
        config::parse(&json).unwrap_err().to_string(),
        "the configuration is 1048577 bytes; at most 1048576 (1 MiB) are allowed"
    );
}

#[test]
fn defaults() {
    let config = parse_fixture("minimal");
    assert_eq!(config.response, ResponseSettings::default());
    let [rule] = config.rules.as_slice() else {
        panic!("one rule")
    };
    assert_eq!(rule.name, "global-cap");
    assert_eq!(rule.matcher, RequestMatch::default());
    assert!(rule.key.is_empty());
    assert_eq!(rule.cost, Cost::Fixed(1));
    assert!(matches!(rule.scope, Scope::Local(_)));
    assert!(!rule.shadow);
    assert_eq!(rule.max_keys, 10_000);
    assert_eq!(local(rule).kind(), AlgorithmKind::FixedWindow);
    assert_eq!(local(rule).max_cost(), 1000);
    assert!(
        config.facts.is_empty(),
        "a rule without match or key needs no facts"
    );
}

/// The limit of a local rule.
fn local(rule: &weir_core::rules::Rule) -> &Limit {
    match &rule.scope {
        Scope::Local(limit) => limit,
        Scope::Global(_) | Scope::Concurrency(_) => {
            panic!("{} is not a local rate limit", rule.name)
        }
    }
}

#[test]
fn concurrency_limits_get_their_fields_and_defaults() {
    let config = parse_fixture("concurrency");
    let Scope::Concurrency(fixed) = &config.rules[0].scope else {
        panic!("concurrency")
    };
    assert_eq!(fixed.max_in_flight, 20);
    assert_eq!(
        fixed.retry_after_us, 1_000_000,
        "retry_after defaults to 1s"
    );
    assert_eq!(fixed.adaptive, None);
    assert_eq!(config.rules[0].reservoir, None, "no reservoir in flight");
    let Scope::Concurrency(adaptive) = &config.rules[1].scope else {
        panic!("concurrency")
    };
    assert_eq!(adaptive.retry_after_us, 250_000);
    let a = adaptive.adaptive.unwrap();
    assert_eq!(
        (a.quantile_ppm, a.min_limit, a.initial_limit, a.interval_us),
        (990_000, 4, 16, 500_000)
    );
    assert_eq!((a.smoothing_ppm, a.tolerance_ppm), (300_000, 1_500_000));
    // Defaults: p90, from 1, starting there, 1 s, ½, 1.25.
    let config = weir_core::config::parse(
        br#"{"rules":[{"name":"a","limit":{"algorithm":"concurrency","max_in_flight":6,"adaptive":{}}}]}"#,
    )
    .unwrap();
    let Scope::Concurrency(c) = &config.rules[0].scope else {
        panic!("concurrency")
    };
    let a = c.adaptive.unwrap();
    assert_eq!(
        (a.quantile_ppm, a.min_limit, a.initial_limit, a.interval_us),
        (900_000, 1, 1, 1_000_000)
    );
    assert_eq!((a.smoothing_ppm, a.tolerance_ppm), (500_000, 1_250_000));
    assert_eq!(a.key_controllers, None, "one controller for the rule");
    // per_key: 64 keys with a controller of their own unless `keys` says otherwise.
    let keys = |rule: usize| match &parse_fixture("concurrency").rules[rule].scope {
        Scope::Concurrency(c) => c.adaptive.and_then(|a| a.key_controllers),
        _ => panic!("concurrency"),
    };
    assert_eq!((keys(1), keys(2), keys(3)), (None, Some(64), Some(256)));
}

#[test]
fn algorithms_get_their_parameters() {
    let config = parse_fixture("algorithm_gcra");
    let Limit::Gcra(g) = local(&config.rules[0]) else {
        panic!("gcra")
    };
    assert_eq!((g.burst(), g.rate()), (5, 10));
    assert_eq!(local(&config.rules[0]).max_cost(), 6);
    let Limit::Gcra(g) = local(&config.rules[1]) else {
        panic!("gcra")
    };
    assert_eq!(g.burst(), 0, "burst defaults to 0");
    let config = parse_fixture("algorithm_token_bucket");
    let Limit::TokenBucket(t) = local(&config.rules[0]) else {
        panic!("token bucket")
    };
    assert_eq!(t.capacity(), 100);
    assert_eq!(
        local(&parse_fixture("algorithm_sliding_window").rules[0]).kind(),
        AlgorithmKind::SlidingWindow
    );
    let windows: Vec<u64> = parse_fixture("durations")
        .rules
        .iter()
        .map(|r| r.policy().window_ns / 1_000)
        .collect();
    assert_eq!(
        windows,
        [
            250,
            500_000,
            1_000_000,
            60_000_000,
            3_600_000_000,
            86_400_000_000,
            2_592_000_000_000
        ]
    );
}

#[test]
fn every_key_source_compiles_to_its_fact() {
    let config = parse_fixture("key_sources");
    let key = &config.rules[0].key;
    let facts: Vec<Option<&Fact>> = key
        .iter()
        .map(|part| match &part.source {
            KeySource::Header { fact }
            | KeySource::ClientIp { fact }
            | KeySource::Path { fact }
            | KeySource::Method { fact }
            | KeySource::QueryParam { fact, .. }
            | KeySource::Attribute { fact } => Some(config.facts.get(*fact).unwrap()),
            KeySource::Static { .. } => None,
        })
        .collect();
    let jwt = "envoy.filters.http.jwt_authn";
    assert_eq!(
        facts,
        [
            Some(&header("x-user")),
            Some(&property(&["source", "address"])),
            Some(&header(":path")),
            Some(&header(":method")),
            Some(&header(":path")),
            Some(&property(&[
                "metadata",
                "filter_metadata",
                jwt,
                "jwt_payload",
                "sub"
            ])),
            Some(&property(&[
                "metadata",
                "filter_metadata",
                jwt,
                "verified",
                "org",
                "id"
            ])),
            Some(&property(&["connection", "requested_server_name"])),
            None,
        ]
    );
    assert!(matches!(&key[1].source, KeySource::ClientIp { .. }));
    assert!(matches!(&key[2].source, KeySource::Path { .. }));
    assert!(matches!(&key[3].source, KeySource::Method { .. }));
    assert!(matches!(&key[4].source, KeySource::QueryParam { name, .. } if name == b"api_key"));
    assert!(matches!(&key[8].source, KeySource::Static { value } if value == b"v1"));
    assert!(key.iter().all(|part| part.default.is_none()));
    // `:path` is interned once for the path and the query parameter.
    assert_eq!(config.facts.len(), 7);

    let config = parse_fixture("key_defaults");
    let defaults: Vec<Option<&[u8]>> = config.rules[0]
        .key
        .iter()
        .map(|p| p.default.as_deref())
        .collect();
    assert_eq!(defaults, [Some(&b"anonymous"[..]), Some(&b"free"[..])]);
}

#[test]
fn matches_compile_with_their_facts() {
    let config = parse_fixture("match_all");
    let m = &config.rules[0].matcher;
    let (path_fact, path) = m.path.as_ref().unwrap();
    assert_eq!(
        (fact(&config, *path_fact), path),
        (&header(":path"), &StringMatch::Exact(b"/login".to_vec()))
    );
    assert_eq!(m.methods, [b"POST".to_vec()]);
    assert_eq!(fact(&config, m.method_fact.unwrap()), &header(":method"));
    let (authority_fact, authority) = m.authority.as_ref().unwrap();
    assert_eq!(fact(&config, *authority_fact), &header(":authority"));
    assert_eq!(authority, &StringMatch::Suffix(b".example.com".to_vec()));
    assert_eq!(fact(&config, m.headers[0].fact), &header("content-type"));

    let config = parse_fixture("match_headers");
    let tests: Vec<(&str, &HeaderTest)> = config.rules[0]
        .matcher
        .headers
        .iter()
        .map(|h| (h.name.as_str(), &h.test))
        .collect();
    assert_eq!(
        tests,
        [
            (
                "x-tier",
                &HeaderTest::Is(StringMatch::Exact(b"free".to_vec()))
            ),
            (
                "user-agent",
                &HeaderTest::Is(StringMatch::Prefix(b"curl/".to_vec()))
            ),
            (
                "x-client",
                &HeaderTest::Is(StringMatch::Suffix(b"-beta".to_vec()))
            ),
            ("authorization", &HeaderTest::Present),
            ("x-internal", &HeaderTest::Absent),
        ]
    );

    let config = parse_fixture("match_authority");
    let exact = &config.rules[0].matcher.authority.as_ref().unwrap().1;
    assert_eq!(
        exact,
        &StringMatch::Exact(b"api.example.com".to_vec()),
        "lowercased like the request side"
    );

    let config = parse_fixture("match_methods");
    assert!(config.rules[0].matcher.path.is_none());
    assert_eq!(config.rules[0].matcher.methods.len(), 4);
}

#[test]
fn methods_are_deduplicated() {
    let config = parse_str(
        r#"{"rules": [{"name": "a", "match": {"methods": ["GET", "GET"]}, "limit": {"algorithm": "gcra", "rate": 1, "period": "1s"}}]}"#,
    )
    .unwrap();
    assert_eq!(config.rules[0].matcher.methods, [b"GET".to_vec()]);
}

#[test]
fn costs() {
    let config = parse_fixture("cost_fixed");
    assert_eq!(config.rules[0].cost, Cost::Fixed(10));
    assert_eq!(config.rules[1].cost, Cost::Fixed(1));
    let config = parse_fixture("cost_header");
    let header_cost = |i: usize| match config.rules[i].cost {
        Cost::FromRequest {
            fact,
            default,
            min,
            max,
        } => (fact, default, min, max),
        Cost::Fixed(_) => panic!("header cost"),
    };
    let (id, default, min, max) = header_cost(0);
    assert_eq!(
        (fact(&config, id), default, min, max),
        (&header("x-cost"), 1, 1, 10)
    );
    assert_eq!(
        header_cost(1),
        (id, 1, 1, 50),
        "min defaults to 1, max to what the limit can admit"
    );
    assert_eq!(header_cost(2), (id, 5, 5, 20), "default defaults to min");
}

#[test]
fn response_settings() {
    let config = parse_fixture("response_settings");
    assert_eq!(
        config.response,
        ResponseSettings {
            status: 503,
            header_style: HeaderStyle::Legacy,
            headers_on_allowed: true,
            body: Some(CustomBody {
                content_type: "text/plain".into(),
                text: "slow down".into()
            }),
            shadow_header: Some("x-weir-shadow".into()),
            filter_state: FilterState::All,
        }
    );
    assert_eq!(
        parse_fixture("response_defaults").response,
        ResponseSettings::default()
    );
    assert_eq!(
        parse_fixture("response_header_style_none")
            .response
            .header_style,
        HeaderStyle::None
    );
}

#[test]
fn shadow_and_max_keys() {
    let config = parse_fixture("shadow");
    assert!(config.rules[0].shadow);
    let config = parse_fixture("scope_local_max_keys");
    let max_keys: Vec<u32> = config.rules.iter().map(|r| r.max_keys).collect();
    assert_eq!(max_keys, [1, 1_000_000]);
}

#[test]
fn the_bridge_authority_defaults_to_the_istio_host() {
    let config = parse_fixture("bridge_istio_cluster");
    let bridge = config.bridge.expect("bridge settings");
    assert_eq!(
        bridge.authority,
        "weir-bridge.weir-system.svc.cluster.local:8081"
    );
    assert_eq!(bridge.secret_env.as_deref(), Some("WEIR_BRIDGE_SECRET"));
    assert_eq!(bridge.timeout_ms, 50);
    let plain = parse_fixture("global_rules")
        .bridge
        .expect("bridge settings");
    assert_eq!(plain.authority, "bridge.internal");
}
