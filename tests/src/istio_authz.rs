//! Istio's AuthorizationPolicy, as far as weir's shipped policies use it: the policies
//! that apply to a workload ([`policies_for`]), whether they admit a request
//! ([`admits`]), every operation their ALLOW rules list ([`listed_operations`]), and the
//! `envoy.filters.http.rbac` filters istiod renders from them into the workload's
//! inbound listener ([`rbac_filters`]).
//!
//! What "as istiod renders them" means here (its `pilot/pkg/security/authz/builder`):
//! DENY policies become one RBAC filter with action DENY, before one with action ALLOW
//! for the ALLOW policies (none when there are none: everything is allowed); each rule
//! is a policy named `ns[NS]-policy[NAME]-rule[I]`; each `to` entry is one permission
//! (alternatives) of `and_rules` over its fields, each field an `or_rules` of its values
//! (`methods` → `:method` header, `paths` → `url_path`; `notX` → `not_rule`); each `from`
//! entry is one principal of `and_ids` (`principals` → the mTLS peer's SPIFFE id,
//! `namespaces` → a regex on it). Istio's string forms: `exact`, `prefix*`, `*suffix`,
//! `*` (present). Anything else a policy may hold (`when`, `hosts`, `ports`,
//! `ipBlocks`, CUSTOM and AUDIT actions, path templates) panics: the rendering does not
//! cover it, and a silent guess would make a test pass for the wrong reason.
//!
//! ```no_run
//! use weir_e2e::istio::{shipped, Mesh};
//! use weir_e2e::istio_authz::{admits, policies_for};
//!
//! let mesh = Mesh { resources: shipped() };
//! let labels = [("app".to_string(), "weir-bridge".to_string())].into();
//! let policies = policies_for(&mesh, "weir-system", &labels);
//! assert!(admits(&policies, "POST", "/v2/acquire"));
//! ```

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{json, Map, Value};

use crate::istio::{Mesh, Resource};

/// Istio's root namespace: its policies without a selector apply to every workload.
pub const ROOT_NAMESPACE: &str = "istio-system";

/// The AuthorizationPolicies that apply to the workload with these labels in
/// `namespace`: those of its namespace whose selector's labels it all has (no selector:
/// every workload there), and those of [`ROOT_NAMESPACE`] without a selector.
pub fn policies_for<'a>(
    mesh: &'a Mesh,
    namespace: &str,
    labels: &BTreeMap<String, String>,
) -> Vec<&'a Resource> {
    mesh.resources
        .iter()
        .filter(|r| r.kind() == "AuthorizationPolicy")
        .filter(|r| {
            let selector = r.selector();
            let selects = selector.iter().all(|(k, v)| labels.get(k) == Some(v));
            (r.namespace() == namespace && selects)
                || (r.namespace() == ROOT_NAMESPACE && selector.is_empty())
        })
        .collect()
}

/// The labels of a Deployment's pods (`spec.template.metadata.labels`): what a
/// policy's selector is matched against.
pub fn pod_labels(deployment: &Resource) -> BTreeMap<String, String> {
    deployment.spec()["template"]["metadata"]["labels"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_string()))
        .collect()
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Action {
    Allow,
    Deny,
}

fn action(policy: &Resource) -> Action {
    match policy.spec()["action"].as_str().unwrap_or("ALLOW") {
        "ALLOW" => Action::Allow,
        "DENY" => Action::Deny,
        other => panic!(
            "{}: action {other} is not rendered here (ALLOW and DENY are)",
            policy.source
        ),
    }
}

fn rules(policy: &Resource) -> &[Value] {
    policy.spec()["rules"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or(&[])
}

fn strings(value: &Value) -> Vec<&str> {
    value
        .as_array()
        .into_iter()
        .flatten()
        .map(|v| v.as_str().unwrap_or_else(|| panic!("not a string: {v}")))
        .collect()
}

/// The fields of `object` (a rule, a source, an operation) outside `known`.
fn check_fields(policy: &Resource, what: &str, object: &Value, known: &[&str]) {
    for key in object.as_object().into_iter().flat_map(|m| m.keys()) {
        assert!(
            known.contains(&key.as_str()),
            "{}: {what}.{key} is not rendered here (only {known:?})",
            policy.source
        );
    }
}

/// Every rule's and operation's fields are ones this module renders.
fn check_policy(policy: &Resource) {
    action(policy);
    for rule in rules(policy) {
        check_fields(policy, "rule", rule, &["from", "to"]);
        for from in rule["from"].as_array().into_iter().flatten() {
            check_fields(
                policy,
                "from.source",
                &from["source"],
                &["principals", "namespaces"],
            );
        }
        for to in rule["to"].as_array().into_iter().flatten() {
            check_fields(
                policy,
                "to.operation",
                &to["operation"],
                &["methods", "notMethods", "paths", "notPaths"],
            );
        }
    }
}

/// An Istio string form: exact, `prefix*`, `*suffix`, or `*` (any non-empty value).
#[derive(Clone, Debug, PartialEq, Eq)]
enum Pattern {
    Exact(String),
    Prefix(String),
    Suffix(String),
    Present,
}

impl Pattern {
    fn parse(text: &str) -> Pattern {
        assert!(
            !text.contains('{'),
            "{text}: path templates are not rendered here"
        );
        if text == "*" {
            Pattern::Present
        } else if let Some(prefix) = text.strip_suffix('*') {
            Pattern::Prefix(prefix.to_string())
        } else if let Some(suffix) = text.strip_prefix('*') {
            Pattern::Suffix(suffix.to_string())
        } else {
            Pattern::Exact(text.to_string())
        }
    }

    fn matches(&self, value: &str) -> bool {
        match self {
            Pattern::Exact(e) => value == e,
            Pattern::Prefix(p) => value.starts_with(p.as_str()),
            Pattern::Suffix(s) => value.ends_with(s.as_str()),
            Pattern::Present => !value.is_empty(),
        }
    }

    /// Envoy's `StringMatcher` for it.
    fn string_matcher(&self) -> Value {
        match self {
            Pattern::Exact(e) => json!({ "exact": e }),
            Pattern::Prefix(p) => json!({ "prefix": p }),
            Pattern::Suffix(s) => json!({ "suffix": s }),
            Pattern::Present => json!({ "safe_regex": { "regex": ".+" } }),
        }
    }
}

/// Whether one `to.operation` admits `method path` (an absent field admits anything).
fn operation_admits(operation: &Value, method: &str, path: &str) -> bool {
    let any = |field: &str, value: &str| {
        strings(&operation[field])
            .iter()
            .any(|p| Pattern::parse(p).matches(value))
    };
    let listed = |field: &str| operation.get(field).is_some();
    (!listed("methods") || any("methods", method))
        && (!listed("paths") || any("paths", path))
        && !any("notMethods", method)
        && !any("notPaths", path)
}

/// Whether a rule admits `method path` from a caller its `from` names: `from` is not
/// evaluated (callers are authenticated by mTLS, which [`rbac_filters`] renders).
fn rule_admits(rule: &Value, method: &str, path: &str) -> bool {
    match rule["to"].as_array() {
        None => true,
        Some(to) => to
            .iter()
            .any(|t| operation_admits(&t["operation"], method, path)),
    }
}

/// Whether the policies let `method path` through, for a caller their `from` clauses
/// name, as Istio decides: a matching DENY rule refuses; then, if any ALLOW policy
/// applies, only a matching ALLOW rule admits; with none, everything is admitted.
pub fn admits(policies: &[&Resource], method: &str, path: &str) -> bool {
    for p in policies {
        check_policy(p);
    }
    let matching = |a: Action| {
        policies
            .iter()
            .filter(|p| action(p) == a)
            .any(|p| rules(p).iter().any(|r| rule_admits(r, method, path)))
    };
    if matching(Action::Deny) {
        return false;
    }
    let any_allow = policies.iter().any(|p| action(p) == Action::Allow);
    !any_allow || matching(Action::Allow)
}

/// Every `(method, path)` the ALLOW rules list. `Err` says which rule admits more than a
/// list can say: no `to`, an operation without `methods` or `paths`, a wildcard, or a
/// `notX` field (each admits requests no one listed).
pub fn listed_operations(policies: &[&Resource]) -> Result<BTreeSet<(String, String)>, String> {
    let mut out = BTreeSet::new();
    for policy in policies.iter().filter(|p| action(p) == Action::Allow) {
        check_policy(policy);
        for (i, rule) in rules(policy).iter().enumerate() {
            let at = format!("{} rules[{i}]", policy.source);
            let Some(to) = rule["to"].as_array() else {
                return Err(format!("{at}: no `to`, so every method and path"));
            };
            for (j, t) in to.iter().enumerate() {
                let operation = &t["operation"];
                for not in ["notMethods", "notPaths"] {
                    if operation.get(not).is_some() {
                        return Err(format!("{at}.to[{j}]: {not} admits what it does not name"));
                    }
                }
                let exact = |field: &str| -> Result<Vec<String>, String> {
                    let values = strings(&operation[field]);
                    if values.is_empty() {
                        return Err(format!("{at}.to[{j}]: no {field}, so every one"));
                    }
                    values
                        .iter()
                        .map(|v| match Pattern::parse(v) {
                            Pattern::Exact(e) => Ok(e),
                            _ => Err(format!("{at}.to[{j}]: {field} {v:?} is a wildcard")),
                        })
                        .collect()
                };
                for method in exact("methods")? {
                    for path in exact("paths")? {
                        out.insert((method.clone(), path));
                    }
                }
            }
        }
    }
    Ok(out)
}

/// How a rule's `from` is rendered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Peers {
    /// As istiod does: the mTLS peer's SPIFFE id (`authenticated.principal_name`).
    Authenticated,
    /// Every peer matches: for a listener without mTLS, where an `authenticated`
    /// principal never matches. What is then tested is methods and paths only.
    Any,
}

/// The RBAC filters istiod puts in the inbound listener of a workload these policies
/// apply to, in order (DENY, then ALLOW), as HTTP filter list items.
pub fn rbac_filters(policies: &[&Resource], peers: Peers) -> Vec<Value> {
    for p in policies {
        check_policy(p);
    }
    let mut filters = Vec::new();
    for (act, name) in [(Action::Deny, "DENY"), (Action::Allow, "ALLOW")] {
        let chosen: Vec<&&Resource> = policies.iter().filter(|p| action(p) == act).collect();
        if chosen.is_empty() {
            continue;
        }
        let mut rendered = Map::new();
        for policy in chosen {
            for (i, rule) in rules(policy).iter().enumerate() {
                rendered.insert(
                    format!(
                        "ns[{}]-policy[{}]-rule[{i}]",
                        policy.namespace(),
                        policy.name()
                    ),
                    json!({ "permissions": permissions(rule), "principals": principals(rule, peers) }),
                );
            }
        }
        filters.push(json!({
            "name": "envoy.filters.http.rbac",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.rbac.v3.RBAC",
                "rules": { "action": name, "policies": rendered },
            },
        }));
    }
    filters
}

fn permissions(rule: &Value) -> Value {
    let Some(to) = rule["to"].as_array() else {
        return json!([{ "and_rules": { "rules": [{ "any": true }] } }]);
    };
    let permission = |operation: &Value| {
        let mut all = Vec::new();
        for (field, negated) in [
            ("methods", false),
            ("paths", false),
            ("notMethods", true),
            ("notPaths", true),
        ] {
            let values = strings(&operation[field]);
            if values.is_empty() {
                continue;
            }
            let one: Vec<Value> = values
                .iter()
                .map(|v| {
                    let m = Pattern::parse(v).string_matcher();
                    if field.ends_with("ethods") {
                        json!({ "header": { "name": ":method", "string_match": m } })
                    } else {
                        json!({ "url_path": { "path": m } })
                    }
                })
                .collect();
            let or = json!({ "or_rules": { "rules": one } });
            all.push(if negated {
                json!({ "not_rule": or })
            } else {
                or
            });
        }
        if all.is_empty() {
            all.push(json!({ "any": true }));
        }
        json!({ "and_rules": { "rules": all } })
    };
    Value::Array(to.iter().map(|t| permission(&t["operation"])).collect())
}

fn principals(rule: &Value, peers: Peers) -> Value {
    let any = json!([{ "and_ids": { "ids": [{ "any": true }] } }]);
    let Some(from) = rule["from"].as_array() else {
        return any;
    };
    if peers == Peers::Any {
        return any;
    }
    let principal = |source: &Value| {
        let mut ids = Vec::new();
        let authenticated = |m: Value| json!({ "authenticated": { "principal_name": m } });
        let principals = strings(&source["principals"]);
        if !principals.is_empty() {
            let one: Vec<Value> = principals
                .iter()
                .map(|p| {
                    let m = match Pattern::parse(p) {
                        Pattern::Exact(e) => json!({ "exact": format!("spiffe://{e}") }),
                        other => panic!("principal {p:?} ({other:?}) is not rendered here"),
                    };
                    authenticated(m)
                })
                .collect();
            ids.push(json!({ "or_ids": { "ids": one } }));
        }
        let namespaces = strings(&source["namespaces"]);
        if !namespaces.is_empty() {
            let one: Vec<Value> = namespaces
                .iter()
                .map(|ns| {
                    assert!(
                        !ns.contains('*'),
                        "namespace {ns:?}: wildcards are not rendered here"
                    );
                    authenticated(json!({ "safe_regex": { "regex": format!(".*/ns/{ns}/.*") } }))
                })
                .collect();
            ids.push(json!({ "or_ids": { "ids": one } }));
        }
        json!({ "and_ids": { "ids": ids } })
    };
    Value::Array(from.iter().map(|f| principal(&f["source"])).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::istio::parse_yaml_docs;

    const POLICY: &str = r#"
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: { name: p, namespace: ns }
spec:
  selector: { matchLabels: { app: a } }
  rules:
  - from: [ { source: { namespaces: [shop] } } ]
    to:
    - operation: { methods: [POST], paths: [/x, /y] }
    - operation: { methods: [GET], paths: ["/static/*"] }
"#;

    #[test]
    fn admits_follows_istios_string_forms() {
        let resources = parse_yaml_docs(POLICY, "inline");
        let p: Vec<&Resource> = resources.iter().collect();
        assert!(admits(&p, "POST", "/x"));
        assert!(admits(&p, "POST", "/y"));
        assert!(!admits(&p, "GET", "/x"));
        assert!(!admits(&p, "POST", "/z"));
        assert!(admits(&p, "GET", "/static/app.js"));
        assert!(admits(&[], "DELETE", "/anything"), "no policy: all allowed");
        assert_eq!(
            listed_operations(&p).unwrap_err(),
            "inline#0 rules[0].to[1]: paths \"/static/*\" is a wildcard"
        );
    }

    #[test]
    fn a_rule_renders_as_istiod_renders_it() {
        let resources = parse_yaml_docs(POLICY, "inline");
        let p: Vec<&Resource> = resources.iter().collect();
        let filters = rbac_filters(&p, Peers::Authenticated);
        assert_eq!(filters.len(), 1);
        let rule = &filters[0]["typed_config"]["rules"];
        assert_eq!(rule["action"], "ALLOW");
        let policy = &rule["policies"]["ns[ns]-policy[p]-rule[0]"];
        assert_eq!(
            policy["permissions"][0]["and_rules"]["rules"][1]["or_rules"]["rules"][1],
            json!({ "url_path": { "path": { "exact": "/y" } } })
        );
        assert_eq!(
            policy["permissions"][1]["and_rules"]["rules"][1]["or_rules"]["rules"][0],
            json!({ "url_path": { "path": { "prefix": "/static/" } } })
        );
        assert_eq!(
            policy["principals"][0]["and_ids"]["ids"][0]["or_ids"]["ids"][0],
            json!({ "authenticated": { "principal_name": { "safe_regex": { "regex": ".*/ns/shop/.*" } } } })
        );
        let any = rbac_filters(&p, Peers::Any);
        assert_eq!(
            any[0]["typed_config"]["rules"]["policies"]["ns[ns]-policy[p]-rule[0]"]["principals"],
            json!([{ "and_ids": { "ids": [{ "any": true }] } }])
        );
    }
}
