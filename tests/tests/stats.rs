//! What operators see: weir's stats on `/stats/prometheus` with the plugin and the rule as
//! labels (the `stats_config` shipped in `envoy/envoy.yaml`, read from that file), and the
//! deciding rule in the access log (filter state `wasm.weir.rule`).

use weir_e2e::prometheus;
use weir_e2e::{get, shipped_stats_config, wasm_filter_yaml, weir_wasm, Bootstrap, Envoy, TestDir};

const CONFIG: &str = r#"{"rules": [
  {"name": "per-user", "match": {"path": {"prefix": "/api/"}}, "key": [{"header": "x-user"}],
   "limit": {"algorithm": "token_bucket", "capacity": 2, "refill": 1, "period": "1h"}},
  {"name": "per_route", "key": [{"path": {}}],
   "limit": {"algorithm": "gcra", "rate": 100, "period": "1s", "burst": 9}}]}"#;

#[test]
fn prometheus_shows_plugin_and_rule_as_labels_and_the_access_log_names_the_rule() {
    let dir = TestDir::new("stats");
    let log = dir.join("access.log");
    let bootstrap = Bootstrap::new()
        .stats_config(shipped_stats_config())
        .http_filter(wasm_filter_yaml(CONFIG, &weir_wasm()))
        .access_log(
            &log,
            "%RESPONSE_CODE% rule=%FILTER_STATE(wasm.weir.rule:PLAIN)%",
        );
    let envoy = Envoy::start(&bootstrap, 2);
    let statuses: Vec<u16> = (0..4)
        .map(|_| {
            get(envoy.http_port, "/api/orders", &[("x-user", "alice")])
                .unwrap()
                .status
        })
        .collect();
    assert_eq!(statuses, [200, 200, 429, 429]);
    assert_eq!(get(envoy.http_port, "/other", &[]).unwrap().status, 200);
    std::thread::sleep(weir_e2e::WEIR_STATS_LAG);

    let r = envoy.admin("GET", "/stats/prometheus");
    assert_eq!(r.status, 200);
    let text = r.text();
    if std::env::var_os("WEIR_E2E_SHOW").is_some() {
        eprintln!("{text}");
    }
    let e = prometheus::parse(&text).unwrap_or_else(|err| panic!("{err}\n{text}"));
    let per_user = [("weir_plugin", "weir"), ("weir_rule", "per-user")];
    assert_eq!(e.value("weir_rule_allowed", &per_user), 2.0);
    assert_eq!(e.value("weir_rule_limited", &per_user), 2.0);
    assert_eq!(
        e.types.get("weir_rule_allowed").map(String::as_str),
        Some("counter")
    );
    let per_route = [("weir_plugin", "weir"), ("weir_rule", "per_route")];
    assert_eq!(e.value("weir_rule_allowed", &per_route), 3.0);
    assert_eq!(e.value("weir_rule_slots_capacity", &per_route), 10_000.0);
    assert_eq!(
        e.types.get("weir_rule_slots_capacity").map(String::as_str),
        Some("gauge")
    );
    // Plugin-wide stats carry the plugin only.
    let store = e
        .find("weir_store_cas_retries", &[("weir_plugin", "weir")])
        .next()
        .unwrap_or_else(|| panic!("no weir_store_cas_retries in\n{text}"));
    assert!(!store.labels.contains_key("weir_rule"));
    // No rule or plugin name is left inside a metric name.
    for s in e.samples.iter().filter(|s| s.name.starts_with("weir_")) {
        assert!(
            !s.name.contains("per_user")
                && !s.name.contains("per_route")
                && !s.name.starts_with("weir_weir"),
            "a name kept a label: {}",
            s.name
        );
    }

    let lines = weir_e2e::wait_for(
        std::time::Duration::from_secs(5),
        std::time::Duration::from_millis(50),
        || {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            (text.lines().count() >= 5).then_some(text)
        },
    )
    .unwrap_or_else(|| panic!("the access log did not get 5 lines"));
    let lines: Vec<&str> = lines.lines().collect();
    assert_eq!(
        lines,
        [
            "200 rule=-",
            "200 rule=-",
            "429 rule=per-user",
            "429 rule=per-user",
            "200 rule=-"
        ]
    );
    envoy.assert_no_panic();
}
