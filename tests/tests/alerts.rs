//! Alerts and the dashboard as code (deploy/alerts, deploy/dashboards): the PrometheusRule
//! carries exactly the rules file's groups, every query is PromQL `promtool` accepts, and
//! every metric they read — with every label their matchers name — is one a real Envoy
//! with weir or weir-bridge exported in this run. `promtool test rules` (`just
//! test-alerts`) checks when the alerts fire.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use serde_yaml::{Mapping, Value};
use weir_core::stats::{self, StatDecl, StatKind, StatsLevel};
use weir_e2e::promql::{self, MetricName};
use weir_e2e::{
    bridge_cluster_yaml, get, prometheus, redis_cli_at, repo_root, send, shipped_stats_config,
    wait_for, wasm_filter_yaml, weir_wasm, Bootstrap, Bridge, Envoy, RedisCluster, Request,
};

const RULES: &str = "deploy/alerts/weir-rules.yaml";
const PROMETHEUS_RULE: &str = "deploy/alerts/prometheusrule.yaml";
const DASHBOARD: &str = "deploy/dashboards/weir.json";

/// Labels Prometheus adds when it scrapes (and Kubernetes service discovery's relabelling
/// usually does): a query may use them although no exporter writes them.
const SCRAPE_LABELS: &[&str] = &["job", "instance", "namespace", "pod"];

fn read(path: &str) -> String {
    let p = repo_root().join(path);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// The PrometheusRule made from the rules file: its whole content is the `spec`.
fn prometheus_rule(rules: &Value) -> Value {
    let mut labels = Mapping::new();
    labels.insert("app.kubernetes.io/name".into(), "weir".into());
    let mut metadata = Mapping::new();
    metadata.insert("name".into(), "weir".into());
    metadata.insert("labels".into(), Value::Mapping(labels));
    let mut cr = Mapping::new();
    cr.insert("apiVersion".into(), "monitoring.coreos.com/v1".into());
    cr.insert("kind".into(), "PrometheusRule".into());
    cr.insert("metadata".into(), Value::Mapping(metadata));
    cr.insert("spec".into(), rules.clone());
    Value::Mapping(cr)
}

/// prometheusrule.yaml is generated from weir-rules.yaml: a change to one without the other
/// fails here. `WEIR_WRITE_ALERTS=1` writes it anew.
#[test]
fn the_prometheus_rule_carries_the_rules_file() {
    let rules: Value = serde_yaml::from_str(&read(RULES)).unwrap();
    let want = prometheus_rule(&rules);
    if std::env::var_os("WEIR_WRITE_ALERTS").is_some() {
        let text = format!(
            "# Generated from weir-rules.yaml by tests/tests/alerts.rs (WEIR_WRITE_ALERTS=1 cargo test -p weir-e2e\n\
             # --test e2e alerts::): edit weir-rules.yaml, not this file. For the Prometheus Operator; its\n\
             # ruleSelector must match the labels below.\n{}",
            serde_yaml::to_string(&want).unwrap()
        );
        std::fs::write(repo_root().join(PROMETHEUS_RULE), text).unwrap();
    }
    let got: Value = serde_yaml::from_str(&read(PROMETHEUS_RULE)).unwrap();
    assert!(
        got == want,
        "{PROMETHEUS_RULE} is not {RULES} as a PrometheusRule: run WEIR_WRITE_ALERTS=1 cargo test -p weir-e2e --test e2e alerts::"
    );
}

/// The dashboard's queries: every panel's targets (rows' panels too) and the template
/// variables' `label_values(SELECTOR, LABEL)` selectors; Grafana's variables left in.
fn dashboard_queries() -> Vec<(String, String)> {
    let dash: serde_json::Value = serde_json::from_str(&read(DASHBOARD)).unwrap();
    let mut out = Vec::new();
    fn panels(list: &serde_json::Value, out: &mut Vec<(String, String)>) {
        for p in list.as_array().into_iter().flatten() {
            let title = p["title"].as_str().unwrap_or("?");
            for t in p["targets"].as_array().into_iter().flatten() {
                let expr = t["expr"]
                    .as_str()
                    .unwrap_or_else(|| panic!("{title}: no expr"));
                out.push((format!("panel {title:?}"), expr.to_string()));
            }
            panels(&p["panels"], out);
        }
    }
    panels(&dash["panels"], &mut out);
    for v in dash["templating"]["list"].as_array().into_iter().flatten() {
        if v["type"] != "query" {
            continue;
        }
        let query = v["query"]["query"].as_str().unwrap();
        let inner = query
            .strip_prefix("label_values(")
            .and_then(|q| q.strip_suffix(')'))
            .and_then(|q| q.rsplit_once(','))
            .map(|(selector, _label)| selector)
            .unwrap_or_else(|| panic!("variable {}: not label_values(…, label)", v["name"]));
        out.push((format!("variable {}", v["name"]), inner.to_string()));
    }
    assert!(out.len() >= 20, "only {} queries in {DASHBOARD}", out.len());
    out
}

/// The alerts' expressions.
fn alert_queries() -> Vec<(String, String)> {
    let rules: Value = serde_yaml::from_str(&read(RULES)).unwrap();
    let mut out = Vec::new();
    for group in rules["groups"].as_sequence().unwrap() {
        for rule in group["rules"].as_sequence().unwrap() {
            let name = rule["alert"].as_str().unwrap();
            out.push((
                format!("alert {name}"),
                rule["expr"].as_str().unwrap().to_string(),
            ));
        }
    }
    assert_eq!(out.len(), 14, "the alerts of docs/operations.md");
    out
}

/// The dashboard's template variables (`plugin`, `rule`, …).
fn dashboard_variables() -> Vec<String> {
    let dash: serde_json::Value = serde_json::from_str(&read(DASHBOARD)).unwrap();
    dash["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v["name"].as_str().map(String::from))
        .collect()
}

/// Grafana's variables replaced by what Prometheus would see: `$__rate_interval` by a
/// duration, the dashboard's own by a regex matching anything. A `$` left over is a
/// variable the dashboard does not define.
fn without_grafana_variables(expr: &str, variables: &[String]) -> Result<String, String> {
    let mut out = expr.replace("$__rate_interval", "1m");
    // Longest first: `$rule` must not eat the start of `$rules`.
    let mut names: Vec<&String> = variables.iter().collect();
    names.sort_by_key(|n| std::cmp::Reverse(n.len()));
    for name in names {
        out = out
            .replace(&format!("${{{name}}}"), ".*")
            .replace(&format!("${name}"), ".*");
    }
    match out.find('$') {
        Some(at) => Err(format!("an undefined variable at {:?}", &out[at..])),
        None => Ok(out),
    }
}

fn promtool() -> PathBuf {
    let bin = std::env::var_os("PROMTOOL").map_or_else(|| PathBuf::from("promtool"), PathBuf::from);
    match Command::new(&bin).arg("--version").output() {
        Ok(o) if o.status.success() => bin,
        _ => panic!(
            "promtool not found ({}): `apt-get install prometheus` (scripts/setup.sh does), or set PROMTOOL",
            bin.display()
        ),
    }
}

/// Every dashboard query, as a recording rule, through `promtool check rules`: the
/// dashboard holds PromQL Prometheus parses, with no variable it does not define (the
/// alerts are checked by `just test-alerts`).
#[test]
fn the_dashboard_queries_are_promql() {
    let dir = weir_e2e::TestDir::new("dashboard-promql");
    let mut rules = Vec::new();
    let variables = dashboard_variables();
    for (i, (what, expr)) in dashboard_queries().into_iter().enumerate() {
        let expr = without_grafana_variables(&expr, &variables)
            .unwrap_or_else(|e| panic!("{what}: {e}: {expr}"));
        let mut rule = Mapping::new();
        rule.insert("record".into(), format!("dashboard:query_{i}").into());
        rule.insert("expr".into(), expr.into());
        rule.insert("labels".into(), {
            let mut l = Mapping::new();
            l.insert("from".into(), what.into());
            Value::Mapping(l)
        });
        rules.push(Value::Mapping(rule));
    }
    let mut group = Mapping::new();
    group.insert("name".into(), "dashboard".into());
    group.insert("rules".into(), Value::Sequence(rules));
    let mut file = Mapping::new();
    file.insert(
        "groups".into(),
        Value::Sequence(vec![Value::Mapping(group)]),
    );
    let path = dir.join("dashboard-rules.yaml");
    std::fs::write(&path, serde_yaml::to_string(&file).unwrap()).unwrap();
    let out = Command::new(promtool())
        .args(["check", "rules"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "promtool check rules on the dashboard's queries:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// What the exporters showed: each sample name with the label names seen on it.
type Exported = BTreeMap<String, BTreeSet<String>>;

fn exported(texts: &[&str]) -> Exported {
    let mut out = Exported::new();
    for text in texts {
        let e = prometheus::parse(text).unwrap_or_else(|err| panic!("{err}\n{text}"));
        for s in e.samples {
            out.entry(s.name).or_default().extend(s.labels.into_keys());
        }
    }
    out
}

/// What `queries` read that `exported` lacks, one line each; empty when all was seen.
fn unseen(queries: &[(String, String)], exported: &Exported) -> Vec<String> {
    let mut missing = Vec::new();
    for (what, expr) in queries {
        let query = promql::read(expr).unwrap_or_else(|e| panic!("{what}: {e}: {expr}"));
        assert!(
            !query.selectors.is_empty(),
            "{what} reads no metric: {expr}"
        );
        // A label it groups or matches by must be on one of the metrics it reads (`sum by
        // (weir_rule)` over a plugin-wide stat would make one empty group).
        let mut read_labels: BTreeSet<&String> = BTreeSet::new();
        for s in &query.selectors {
            let names: Vec<&String> = match &s.name {
                MetricName::Exact(n) => exported
                    .get_key_value(n)
                    .map(|(k, _)| k)
                    .into_iter()
                    .collect(),
                MetricName::Regex(r) => {
                    let re = regex::Regex::new(&format!("^(?:{r})$"))
                        .unwrap_or_else(|e| panic!("{what}: {e}"));
                    exported.keys().filter(|n| re.is_match(n)).collect()
                }
            };
            if names.is_empty() {
                missing.push(format!("{what}: no metric {:?} was exported", s.name));
                continue;
            }
            read_labels.extend(names.iter().flat_map(|n| &exported[*n]));
            for label in &s.labels {
                let seen = SCRAPE_LABELS.contains(&label.as_str())
                    || names.iter().any(|n| exported[*n].contains(label));
                if !seen {
                    missing.push(format!(
                        "{what}: {:?} was never exported with label {label}",
                        s.name
                    ));
                }
            }
        }
        for label in &query.grouping {
            if !SCRAPE_LABELS.contains(&label.as_str()) && !read_labels.contains(label) {
                missing.push(format!(
                    "{what}: groups by {label}, which none of the metrics it reads was exported with"
                ));
            }
        }
    }
    missing
}

/// The filter's stats (`weir_core::stats`, every level) that `queries` read, by their
/// Prometheus names: a histogram read by its `_bucket` is the histogram. weir-bridge's
/// own metrics (`weir_bridge_*_total`, `weir_bridge_redis_call_duration_seconds`) are no
/// filter stat and are left out; that they exist is the end-to-end test's to check.
fn filter_stats_read(queries: &[(String, String)]) -> BTreeSet<String> {
    let declared: BTreeMap<String, &StatDecl> = stats::RULE_STATS
        .iter()
        .chain(stats::PLUGIN_STATS)
        .map(|s| (s.prometheus_name(), s))
        .collect();
    let mut read = BTreeSet::new();
    for (what, expr) in queries {
        let query = promql::read(expr).unwrap_or_else(|e| panic!("{what}: {e}: {expr}"));
        for selector in query.selectors {
            let name = match selector.name {
                MetricName::Exact(name) => name,
                MetricName::Regex(r) => {
                    assert!(
                        !r.starts_with("weir"),
                        "{what}: weir's stats are read by name, not by the regex {r:?}"
                    );
                    continue;
                }
            };
            let stat = ["", "_bucket", "_sum", "_count"].iter().find_map(|suffix| {
                let base = name.strip_suffix(suffix)?;
                declared
                    .get(base)
                    .filter(|s| suffix.is_empty() || s.kind == StatKind::Histogram)
                    .map(|_| base.to_string())
            });
            read.extend(stat);
        }
    }
    read
}

/// The default stats level holds exactly the filter's stats the shipped alerts and
/// dashboard read: nothing they read is left to an opt-in level, and nothing else is
/// defined by default (docs/operations.md, "Stats levels").
#[test]
fn the_default_stats_level_is_what_the_alerts_and_the_dashboard_read() {
    let mut queries = alert_queries();
    queries.extend(dashboard_queries());
    let read = filter_stats_read(&queries);
    let default: BTreeSet<String> = stats::RULE_STATS
        .iter()
        .chain(stats::PLUGIN_STATS)
        .filter(|s| s.level == StatsLevel::Default)
        .map(StatDecl::prometheus_name)
        .collect();
    let not_default: Vec<&String> = read.difference(&default).collect();
    let unread: Vec<&String> = default.difference(&read).collect();
    assert!(
        not_default.is_empty() && unread.is_empty(),
        "read by {RULES} or {DASHBOARD} but not in the default level (core/src/stats.rs): \
         {not_default:?}\nin the default level but read by neither: {unread:?}"
    );
}

#[test]
fn the_filter_stats_a_query_reads_are_found_by_name_and_histogram_series() {
    let q = |e: &str| vec![("q".to_string(), e.to_string())];
    let names = |e: &str| filter_stats_read(&q(e)).into_iter().collect::<Vec<_>>();
    assert_eq!(
        names("rate(weir_rule_allowed[1m]) + rate(weir_bridge_latency_us_bucket[1m])"),
        ["weir_bridge_latency_us", "weir_rule_allowed"]
    );
    // The bridge's own, a counter's made-up `_count`, another exporter's.
    assert!(names(
        "weir_bridge_requests_total + weir_rule_allowed_count + envoy_cluster_upstream_rq"
    )
    .is_empty());
}

#[test]
fn grafana_variables_are_replaced_and_undefined_ones_reported() {
    let vars = ["rule".to_string(), "rules".to_string()];
    assert_eq!(
        without_grafana_variables(
            r#"rate(m{a=~"$rules",b=~"${rule}"}[$__rate_interval])"#,
            &vars
        ),
        Ok(r#"rate(m{a=~".*",b=~".*"}[1m])"#.to_string())
    );
    assert!(without_grafana_variables(r#"m{a=~"$tenant"}"#, &vars).is_err());
}

#[test]
fn a_made_up_metric_or_label_is_reported() {
    let seen = exported(&[
        "weir_rule_allowed{weir_plugin=\"p\",weir_rule=\"r\"} 1\nenvoy_wasm_weir_vm_reload 0\n",
    ]);
    let q = |e: &str| vec![("q".to_string(), e.to_string())];
    assert!(unseen(&q(r#"rate(weir_rule_allowed{weir_rule="r"}[1m])"#), &seen).is_empty());
    assert!(unseen(
        &q(r#"increase({__name__=~"envoy_wasm_.+_vm_reload"}[1m])"#),
        &seen
    )
    .is_empty());
    assert_eq!(
        unseen(&q("rate(weir_rule_allowed_total[1m])"), &seen),
        ["q: no metric Exact(\"weir_rule_allowed_total\") was exported"]
    );
    assert_eq!(
        unseen(&q(r#"weir_rule_allowed{weir_route="x"}"#), &seen),
        ["q: Exact(\"weir_rule_allowed\") was never exported with label weir_route"]
    );
    assert_eq!(
        unseen(&q(r#"{__name__=~"envoy_wasm_.+_vm_reloads"}"#), &seen).len(),
        1
    );
    assert_eq!(
        unseen(&q("sum by (weir_rule) (envoy_wasm_weir_vm_reload)"), &seen),
        ["q: groups by weir_rule, which none of the metrics it reads was exported with"]
    );
    assert!(unseen(&q("sum by (job, weir_rule) (weir_rule_allowed)"), &seen).is_empty());
}

/// A generous bridge timeout: a slow CI machine must not turn a limited request into a
/// failure-mode 200. Only the first call to the stopped bridge waits for it.
const CONFIG: &str = r#"{"bridge": {"cluster": "weir_bridge", "timeout": "1s"},
 "trusted_headers": ["x-user-limit"],
 "rules": [
  {"name": "own", "match": {"path": {"prefix": "/own/"}}, "key": [{"header": "x-user"}],
   "limit": {"algorithm": "fixed_window", "window": "1h",
             "limit": {"header": "x-user-limit", "default": 2, "max": 10}}},
  {"name": "per-user", "match": {"path": {"prefix": "/local/"}}, "key": [{"header": "x-user"}],
   "limit": {"algorithm": "token_bucket", "capacity": 2, "refill": 1, "period": "1h"}},
  {"name": "tenant", "match": {"path": {"prefix": "/global/"}}, "scope": "global",
   "key": [{"header": "x-user"}], "limit": {"algorithm": "token_bucket", "capacity": 2, "refill": 1, "period": "1h"},
   "global": {"failure_mode": "allow"}},
  {"name": "trial", "match": {"path": {"prefix": "/local/"}}, "key": [{"header": "x-user"}],
   "shadow": true, "limit": {"algorithm": "token_bucket", "capacity": 1, "refill": 1, "period": "1h"}},
  {"name": "service", "match": {"path": {"prefix": "/conc/"}},
   "limit": {"algorithm": "concurrency", "max_in_flight": 10, "adaptive": {"interval": "100ms"}}}]}"#;

fn statuses(port: u16, path: &str, user: &str, n: usize) -> Vec<u16> {
    (0..n)
        .map(|_| get(port, path, &[("x-user", user)]).unwrap().status)
        .collect()
}

/// A real stack (Redis Cluster, weir-bridge, Envoy with weir's shipped stats tags and a
/// local, a global and an adaptive concurrency rule, and one whose limit each request
/// gives) driven through allowed, limited and
/// failed requests, a failover's NOSCRIPT and a refused bridge call; then every metric the
/// alerts and the dashboard read must be among the names Envoy's `/stats/prometheus` and
/// the bridge's `/metrics` answered with samples.
#[test]
fn every_metric_the_alerts_and_the_dashboard_read_is_exported() {
    let redis = RedisCluster::start(3, 1);
    let mut bridge = Bridge::start(&redis, &[]);
    let bootstrap = Bootstrap::new()
        .stats_config(shipped_stats_config())
        .http_filter(wasm_filter_yaml(CONFIG, &weir_wasm()))
        .cluster(bridge_cluster_yaml(bridge.port));
    let envoy = Envoy::start(&bootstrap, 2);
    let port = envoy.http_port;

    // Allowed and limited, local and global; the concurrency rule's places.
    assert_eq!(statuses(port, "/local/a", "alice", 4), [200, 200, 429, 429]);
    assert_eq!(statuses(port, "/global/a", "bob", 4), [200, 200, 429, 429]);
    assert_eq!(statuses(port, "/conc/a", "carol", 3), [200, 200, 200]);
    // A failover's promoted master has no scripts: flushed, the bridge falls back to EVAL.
    for master in redis.masters() {
        let master_port: u16 = master.rsplit(':').next().unwrap().parse().unwrap();
        redis_cli_at(master_port, ["SCRIPT", "FLUSH"]).unwrap();
    }
    assert_eq!(statuses(port, "/global/a", "dave", 1), [200]);
    // A call the bridge refuses (400: an error class, a 4xx code).
    let refused = send(bridge.port, Request::post("/v2/acquire", "not json")).unwrap();
    assert!(
        refused.status >= 400,
        "the bridge took a bad body: {}",
        refused.status
    );
    // The bridge stops answering: global rules fall to their failure mode, then skip it.
    bridge.signal(libc::SIGSTOP);
    let failed = statuses(port, "/global/a", "erin", 3);
    bridge.signal(libc::SIGCONT);
    assert_eq!(failed, [200, 200, 200], "failure_mode allow");

    // weir hands its counters to Envoy within WEIR_STATS_LAG; Envoy's histograms appear
    // after its 5 s stats flush.
    std::thread::sleep(weir_e2e::WEIR_STATS_LAG);
    let envoy_text = wait_for(Duration::from_secs(15), Duration::from_millis(250), || {
        let text = envoy.admin("GET", "/stats/prometheus").text();
        text.lines()
            .any(|l| l.starts_with("weir_bridge_latency_us_count{") && !l.ends_with(" 0"))
            .then_some(text)
    })
    .expect("weir_bridge_latency_us had no sample after 15 s");
    let bridge_text = bridge.metrics();
    if std::env::var_os("WEIR_E2E_SHOW").is_some() {
        eprintln!("{envoy_text}\n{bridge_text}");
    }

    // The traffic did what it was meant to.
    let e = prometheus::parse(&envoy_text).unwrap();
    fn rule(r: &str) -> [(&str, &str); 2] {
        [("weir_plugin", "weir"), ("weir_rule", r)]
    }
    assert_eq!(e.value("weir_rule_limited", &rule("per-user")), 2.0);
    assert!(e.value("weir_rule_limited", &rule("tenant")) >= 2.0);
    assert!(e.value("weir_rule_failure_allowed", &rule("tenant")) >= 1.0);
    assert!(e.value("weir_bridge_errors_timeout", &[("weir_plugin", "weir")]) >= 1.0);
    let b = prometheus::parse(&bridge_text).unwrap();
    assert!(b
        .find("weir_bridge_script_fallbacks_total", &[])
        .any(|s| s.value >= 1.0));
    assert!(b
        .find("weir_bridge_errors_total", &[])
        .any(|s| s.value >= 1.0));

    let exported = exported(&[&envoy_text, &bridge_text]);
    let mut queries = alert_queries();
    queries.extend(dashboard_queries());
    let missing = unseen(&queries, &exported);
    assert!(
        missing.is_empty(),
        "read by {RULES} or {DASHBOARD} but not exported:\n{}\n(WEIR_E2E_SHOW=1 prints what was)",
        missing.join("\n")
    );
    envoy.assert_no_panic();
}
