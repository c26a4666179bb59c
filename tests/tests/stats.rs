//! What operators see: weir's stats on `/stats/prometheus` with the plugin and the rule as
//! labels (the `stats_config` shipped in `envoy/envoy.yaml`, read from that file), the
//! deciding rule in the access log (filter state `wasm.weir.rule`), and what each stats
//! level defines: the declarations' stats, counted in the docs.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use weir_core::stats::{self, Group, StatDecl, StatsLevel};
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

/// One rule of each kind (`LEVEL` replaced by the plugin's level), and how
/// docs/operations.md names each kind.
const EACH_KIND: &str = r#"{"bridge": {"cluster": "weir_bridge"}, "stats": "LEVEL", "rules": [
  {"name": "local", "key": [{"header": "x-user"}],
   "limit": {"algorithm": "token_bucket", "capacity": 10, "refill": 10, "period": "1s"}},
  {"name": "local-exact", "key": [{"header": "x-user"}], "reservoir": {"max": 1},
   "limit": {"algorithm": "token_bucket", "capacity": 10, "refill": 10, "period": "1s"}},
  {"name": "local-shadow", "key": [{"header": "x-user"}], "shadow": true,
   "limit": {"algorithm": "token_bucket", "capacity": 10, "refill": 10, "period": "1s"}},
  {"name": "local-delay", "key": [{"header": "x-user"}], "on_limit": {"delay": {"max": "1s"}},
   "limit": {"algorithm": "gcra", "rate": 10, "period": "1s", "burst": 9}},
  {"name": "local-commit", "key": [{"header": "x-user"}], "commit": {"header": "x-used"},
   "limit": {"algorithm": "token_bucket", "capacity": 1000, "refill": 1000, "period": "1m"}},
  {"name": "global-exact", "scope": "global", "key": [{"header": "x-user"}],
   "limit": {"algorithm": "gcra", "rate": 10, "period": "1s", "burst": 9}},
  {"name": "global-lease", "scope": "global", "key": [{"header": "x-user"}],
   "global": {"lease": {"max": 10}},
   "limit": {"algorithm": "gcra", "rate": 100, "period": "1s", "burst": 99}},
  {"name": "concurrency", "key": [{"header": "x-user"}],
   "limit": {"algorithm": "concurrency", "max_in_flight": 10}},
  {"name": "adaptive", "limit": {"algorithm": "concurrency", "max_in_flight": 100, "adaptive": {}}},
  {"name": "adaptive-per-key", "key": [{"header": "x-user"}],
   "limit": {"algorithm": "concurrency", "max_in_flight": 100, "adaptive": {"per_key": true}}}]}"#;

const KINDS: [(&str, &str); 10] = [
    ("local", "local (reservoirs: the default)"),
    ("local-exact", "local, `reservoir.max: 1`"),
    ("local-shadow", "local, `shadow`"),
    ("local-delay", "local, `on_limit.delay`"),
    ("local-commit", "local, `commit`"),
    ("global-exact", "global, exact"),
    ("global-lease", "global, `lease`"),
    ("concurrency", "`concurrency`"),
    ("adaptive", "`concurrency`, `adaptive`"),
    (
        "adaptive-per-key",
        "`concurrency`, `adaptive` with `per_key`",
    ),
];

/// Where a series belongs: its plugin, and its rule for a rule stat.
type Owner = (String, Option<String>);

/// The stat (Prometheus family) a sample belongs to: a histogram's `_bucket`, `_sum` and
/// `_count` samples belong to the histogram.
fn family(name: &str, types: &BTreeMap<String, String>) -> String {
    if types.contains_key(name) {
        return name.to_string();
    }
    ["_bucket", "_sum", "_count"]
        .iter()
        .filter_map(|suffix| name.strip_suffix(suffix))
        .find(|base| types.get(*base).map(String::as_str) == Some("histogram"))
        .unwrap_or(name)
        .to_string()
}

/// Three plugins in one Envoy, each with a rule of every kind, at `default`, `detailed`
/// and `all`: each defines exactly the stats `weir_core::stats` declares for its level
/// and its rules (by name, nothing more or less), and the series it exports are the ones
/// docs/operations.md counts (`WEIR_WRITE_DOCS=1` writes its table anew).
#[test]
fn each_level_defines_its_declared_stats_and_the_docs_count_their_series() {
    let mut bootstrap = Bootstrap::new()
        .stats_config(shipped_stats_config())
        .cluster(weir_e2e::bridge_cluster_yaml(weir_e2e::free_port()));
    let mut expected: BTreeMap<Owner, BTreeSet<String>> = BTreeMap::new();
    for level in StatsLevel::ALL {
        let plugin = level.name();
        let json = EACH_KIND.replace("LEVEL", plugin);
        let config = weir_core::config::parse(json.as_bytes()).unwrap();
        assert_eq!(config.stats, level);
        for rule in &config.rules {
            let rule_level = config.stats_level(rule);
            let names = stats::RULE_STATS
                .iter()
                .filter(|s| {
                    let Group::Rule(applies) = s.group else {
                        return false;
                    };
                    rule.has_stats(applies) && rule_level.includes(s.level)
                })
                .map(StatDecl::prometheus_name);
            expected
                .entry((plugin.to_string(), Some(rule.name.clone())))
                .or_default()
                .extend(names);
        }
        let names = stats::PLUGIN_STATS
            .iter()
            .filter(|s| config.stats.includes(s.level))
            .map(StatDecl::prometheus_name);
        expected
            .entry((plugin.to_string(), None))
            .or_default()
            .extend(names);
        // The filter's config name is the plugin's name in its stats.
        bootstrap = bootstrap.http_filter(wasm_filter_yaml(&json, &weir_wasm()).replacen(
            "name: weir\n",
            &format!("name: {plugin}\n"),
            1,
        ));
    }
    let envoy = Envoy::start(&bootstrap, 2);
    // Histograms appear at Envoy's 5 s stats flush.
    let text = weir_e2e::wait_for(Duration::from_secs(15), Duration::from_millis(250), || {
        let text = envoy.admin("GET", "/stats/prometheus").text();
        text.contains("weir_bridge_latency_us_count{weir_plugin=\"all\"}")
            .then_some(text)
    })
    .expect("no weir_bridge_latency_us after 15 s");
    let e = prometheus::parse(&text).unwrap_or_else(|err| panic!("{err}\n{text}"));

    let mut families: BTreeMap<Owner, BTreeSet<String>> = BTreeMap::new();
    let mut series: BTreeMap<Owner, usize> = BTreeMap::new();
    for s in e.samples.iter().filter(|s| s.name.starts_with("weir_")) {
        let plugin = s.labels.get("weir_plugin").cloned().unwrap_or_default();
        let owner = (plugin, s.labels.get("weir_rule").cloned());
        families
            .entry(owner.clone())
            .or_default()
            .insert(family(&s.name, &e.types));
        *series.entry(owner).or_default() += 1;
    }
    assert_eq!(
        families, expected,
        "what Envoy exported, and what the declarations hold"
    );
    let histogram = e
        .samples
        .iter()
        .filter(|s| {
            s.name.starts_with("weir_bridge_latency_us")
                && s.labels.get("weir_plugin").map(String::as_str) == Some("default")
        })
        .count();
    assert_eq!(histogram, stats::HISTOGRAM_SERIES);

    // The measured table of docs/operations.md.
    let count = |level: StatsLevel, rule: Option<&str>| {
        series
            .get(&(level.name().to_string(), rule.map(String::from)))
            .copied()
            .unwrap_or(0)
    };
    let mut table = String::from(
        "| Prometheus series | `default` | `detailed` | `all` |\n|---|---:|---:|---:|\n",
    );
    for (rule, kind) in KINDS {
        table.push_str(&format!("| a rule: {kind} |"));
        for level in StatsLevel::ALL {
            table.push_str(&format!(" {} |", count(level, Some(rule))));
        }
        table.push('\n');
    }
    table.push_str("| the plugin-wide stats, with a `bridge` |");
    for level in StatsLevel::ALL {
        table.push_str(&format!(" {} |", count(level, None)));
    }
    table.push_str("\n| the plugin above: these ten rules and a `bridge` |");
    for level in StatsLevel::ALL {
        let total: usize = series
            .iter()
            .filter(|((plugin, _), _)| plugin == level.name())
            .map(|(_, n)| n)
            .sum();
        table.push_str(&format!(" **{total}** |"));
    }
    table.push('\n');
    weir_e2e::generated_doc_block("docs/operations.md", "stats-measured", &table);
    envoy.assert_no_panic();
}
