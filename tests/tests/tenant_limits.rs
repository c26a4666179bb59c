//! A tenant's own limit from a trusted fact, in a real Envoy (issue 36): a numeric JWT
//! claim that `jwt_authn` verified and put in dynamic metadata, and a header that
//! `jwt_authn` writes from the claim (`claim_to_headers`) once the connection manager has
//! removed any a client sent (`early_header_mutation_extensions`), as
//! docs/configuration.md ("Limits from the request") tells operators to set it up. A
//! client that sends the header itself does not raise its limit; with nothing in front
//! of weir it would, which the second Envoy here shows.

use weir_core::algorithms::GlobalLimit;
use weir_core::conformance;
use weir_e2e::decisions::{now_us, with_decisions, Judge, Logged, Logs};
use weir_e2e::global::GlobalStack;
use weir_e2e::jwt::{hs256, jwt_authn_filter};
use weir_e2e::{send, wasm_filter_yaml, weir_wasm, Bootstrap, Envoy, Request};

const SECRET: &[u8] = b"weir-test-secret-of-32-bytes!!!!";

/// jwt_authn: tokens optional, verified claims in metadata (`jwt_payload`) and the
/// `quota` claim written to `x-tenant-limit`.
fn jwt_authn() -> String {
    let claim_to_headers =
        "        claim_to_headers:\n        - { header_name: x-tenant-limit, claim_name: quota }\n";
    jwt_authn_filter(SECRET, "tenants", claim_to_headers, true)
}

/// What docs/configuration.md tells operators to add to the connection manager: a header
/// clients may send is removed before any filter runs.
const REMOVE_CLIENTS_HEADER: &str = r#"early_header_mutation_extensions:
- name: envoy.http.early_header_mutation.header_mutation
  typed_config:
    "@type": type.googleapis.com/envoy.extensions.http.early_header_mutation.header_mutation.v3.HeaderMutation
    mutations:
    - remove: x-tenant-limit
"#;

/// Two rules keyed by the token's subject (`anonymous` without one): `/claim` reads the
/// limit from the claim in metadata, `/header` from the header jwt_authn writes. Token
/// buckets refilled hourly from their first request: no window boundary a run could cross.
const CONFIG: &str = r#"{"trusted_headers":["x-tenant-limit"],"rules":[
  {"name":"by-claim","match":{"path":{"prefix":"/claim"}},
   "key":[{"jwt_claim":"sub","default":"anonymous"}],
   "limit":{"algorithm":"token_bucket","refill":1,"period":"1h",
            "capacity":{"jwt_claim":"quota","default":1,"max":100}}},
  {"name":"by-header","match":{"path":{"prefix":"/header"}},
   "key":[{"jwt_claim":"sub","default":"anonymous"}],
   "limit":{"algorithm":"token_bucket","refill":1,"period":"1h",
            "capacity":{"header":"x-tenant-limit","default":1,"max":100}}}]}"#;

fn token(sub: &str, quota: impl std::fmt::Display) -> String {
    let payload =
        format!(r#"{{"iss":"weir-test","sub":"{sub}","quota":{quota},"exp":4102444800}}"#);
    format!("Bearer {}", hs256(SECRET, &payload))
}

/// How many of `n` requests to `path` Envoy answers 200, with these headers.
fn admitted(envoy: &Envoy, path: &str, headers: &[(&str, &str)], n: usize) -> usize {
    (0..n)
        .filter(|_| {
            let mut request = Request::get(path);
            for (name, value) in headers {
                request = request.header(name, value);
            }
            let status = send(envoy.http_port, request).unwrap().status;
            assert!(status == 200 || status == 429, "{path}: {status}");
            status == 200
        })
        .count()
}

#[test]
fn each_tenant_gets_the_limit_its_verified_claim_says() {
    // Decisions in the access log, keyed by `x-k` (the tenant, sent beside its token).
    let config = with_decisions(CONFIG);
    let dir = tempfile::tempdir().unwrap();
    let logs = Logs::new(dir.path(), 1, "x-k");
    let bootstrap = Bootstrap::new()
        .connection_manager(REMOVE_CLIENTS_HEADER)
        .http_filter(jwt_authn())
        .http_filter(wasm_filter_yaml(&config, &weir_wasm()));
    let envoy = Envoy::start(&logs.add_to(0, bootstrap), 1);
    let (alice, bob) = (token("alice", 3), token("bob", 7));
    let as_alice = [("authorization", alice.as_str()), ("x-k", "alice")];
    let as_bob = [("authorization", bob.as_str()), ("x-k", "bob")];
    // The claim from metadata: a JSON number, which Envoy hands the filter encoded.
    assert_eq!(admitted(&envoy, "/claim", &as_alice, 6), 3);
    assert_eq!(admitted(&envoy, "/claim", &as_bob, 10), 7);
    assert_eq!(
        admitted(&envoy, "/claim", &[("x-k", "anonymous")], 3),
        1,
        "no token: the default"
    );
    // The header jwt_authn writes from the claim.
    assert_eq!(admitted(&envoy, "/header", &as_alice, 6), 3);
    assert_eq!(admitted(&envoy, "/header", &as_bob, 10), 7);
    assert_eq!(envoy.weir_stat("rule.by-claim.limit_invalid"), 0);
    assert_eq!(envoy.weir_stat("rule.by-header.limit_invalid"), 0);
    // Every admission, tenant by tenant, keeps the bound of the limit its claim gave.
    let lines = logs.read(6 + 10 + 3 + 6 + 10);
    let tenants = [("alice", 3), ("bob", 7)];
    assert_each_tenant_keeps_its_bound(&config, &lines, "by-claim", &tenants);
    assert_each_tenant_keeps_its_bound(&config, &lines, "by-header", &tenants);
    envoy.assert_no_panic();
}

#[test]
fn a_client_that_sets_the_trusted_header_itself_does_not_raise_its_limit() {
    let forged = [("x-tenant-limit", "100")];
    let bootstrap = Bootstrap::new()
        .connection_manager(REMOVE_CLIENTS_HEADER)
        .http_filter(jwt_authn())
        .http_filter(wasm_filter_yaml(CONFIG, &weir_wasm()));
    let envoy = Envoy::shared(&bootstrap, 1);
    assert_eq!(
        admitted(&envoy, "/header", &forged, 5),
        1,
        "no token, a forged header: removed, the default"
    );
    let carol = token("carol", 2);
    assert_eq!(
        admitted(
            &envoy,
            "/header",
            &[("authorization", &carol), forged[0]],
            5
        ),
        2,
        "a token and a forged header: the claim's"
    );
    envoy.assert_no_panic();

    // The witness: with nothing in front of weir that removes or writes the header, the
    // header is the client's and raises its limit (weir trusts what `trusted_headers`
    // lists): what keeps the limit is the Envoy config the docs ask for.
    let unguarded = Bootstrap::new().http_filter(wasm_filter_yaml(CONFIG, &weir_wasm()));
    let envoy = Envoy::shared(&unguarded, 1);
    assert_eq!(admitted(&envoy, "/header", &forged, 5), 5);
}

/// The same claim on a global rule, through weir-bridge and a Redis Cluster, with two
/// Envoys sharing each tenant's quota: every call carries the request's own limit, so
/// each tenant gets exactly what its claim says across both Envoys (exactly, without
/// leases; at most, with them). A sliding log and a token bucket, whose quotas have no
/// window boundary a run could cross.
#[test]
fn a_global_rule_gives_each_tenant_its_claims_quota_across_two_envoys() {
    let config = r#"{"bridge":{"cluster":"weir_bridge","timeout":"500ms"},"rules":[
      {"name":"exact","match":{"path":{"prefix":"/exact"}},"scope":"global",
       "key":[{"jwt_claim":"sub","default":"anonymous"}],
       "limit":{"algorithm":"sliding_log","window":"1d",
                "limit":{"jwt_claim":"quota","default":1,"max":1000}}},
      {"name":"leased","match":{"path":{"prefix":"/leased"}},"scope":"global",
       "global":{"lease":{"max":8,"ttl":"10s"},"expected_instances":2},
       "key":[{"jwt_claim":"sub","default":"anonymous"}],
       "limit":{"algorithm":"token_bucket","refill":1,"period":"1h",
                "capacity":{"jwt_claim":"quota","default":1,"max":1000}}}]}"#;
    // Decisions in the access log, keyed by `x-k` (the tenant, sent beside its token).
    let config = with_decisions(config);
    let filters = format!("{}{}", jwt_authn(), wasm_filter_yaml(&config, &weir_wasm()));
    let stack = GlobalStack::start_filters(&[filters.clone(), filters], &[], "x-k");
    let ports = stack.ports();
    let tenants = [("alice", 30u64), ("bob", 5), ("carol", 120)];
    for path in ["/exact", "/leased"] {
        for (sub, quota) in tenants {
            let auth = token(sub, quota);
            // Twice the quota, alternating between the Envoys.
            let admitted = (0..2 * quota as usize)
                .filter(|i| {
                    let request = Request::get(path)
                        .header("authorization", &auth)
                        .header("x-k", sub);
                    let status = send(ports[i % 2], request).unwrap().status;
                    assert!(status == 200 || status == 429, "{path} {sub}: {status}");
                    status == 200
                })
                .count() as u64;
            eprintln!("{path} {sub} (quota {quota}): {admitted} admitted");
            if path == "/exact" {
                assert_eq!(admitted, quota, "{path} {sub}");
            } else {
                // Leases strand at most what the two Envoys still hold.
                assert!(
                    admitted <= quota && admitted + 16 >= quota,
                    "{path} {sub}: {admitted}"
                );
            }
        }
    }
    // A tenant whose claim changes keeps its one state in Redis: 5 taken under a quota of
    // 10, none more under 3, 3 more under 8 (the sliding log holds the 5).
    let dave = |quota: u64, n: usize| {
        let auth = token("dave", quota);
        (0..n)
            .filter(|i| {
                let request = Request::get("/exact").header("authorization", &auth);
                send(ports[i % 2], request).unwrap().status == 200
            })
            .count()
    };
    assert_eq!(dave(10, 5), 5);
    assert_eq!(dave(3, 4), 0, "a lowered quota: the log already holds more");
    assert_eq!(dave(8, 6), 3, "raised: what the log holds counts");
    // Every admission of both Envoys, tenant by tenant, keeps the bound of the limit its
    // claim gave (the checker's rule: one limit per stretch, here one per tenant).
    let logs = stack.logs.read(2 * 2 * 155 + 15);
    for rule in ["exact", "leased"] {
        assert_each_tenant_keeps_its_bound(&config, &logs, rule, &tenants);
    }
    assert_eq!(stack.weir_stat("rule.exact.limit_invalid"), 0);
    stack.assert_no_panic();
}

/// A global `gcra` rule whose rate a tenant's claim gives, across two Envoys: Redis
/// keeps the interval each key's TAT was counted in, so a tenant whose rate drops after
/// it took its burst owes the same units at the new rate, and takes no second burst at
/// once (read as it was, the TAT of 5 units at 1 a second would leave 4 of the 5 units
/// at 1 every 100 s free); raised again, what it owes is back to 5 s.
#[test]
fn a_global_gcra_keeps_what_a_tenant_owes_when_its_rate_changes() {
    let config = r#"{"bridge":{"cluster":"weir_bridge","timeout":"500ms"},"rules":[
      {"name":"paced","scope":"global","key":[{"jwt_claim":"sub","default":"anonymous"}],
       "limit":{"algorithm":"gcra","period":"1h","burst":4,
                "rate":{"jwt_claim":"quota","default":1,"max":3600}}}]}"#;
    let config = with_decisions(config);
    let filters = format!("{}{}", jwt_authn(), wasm_filter_yaml(&config, &weir_wasm()));
    let stack = GlobalStack::start_filters(&[filters.clone(), filters], &[], "x-k");
    let ports = stack.ports();
    // When each rate started to be carried, and the rate.
    let mut carried = Vec::new();
    let mut erin = |rate: u64, n: usize| {
        carried.push((now_us(), rate));
        let auth = token("erin", rate);
        (0..n)
            .filter(|i| {
                let request = Request::get("/")
                    .header("authorization", &auth)
                    .header("x-k", "erin");
                send(ports[i % 2], request).unwrap().status == 200
            })
            .count()
    };
    assert_eq!(erin(3600, 8), 5, "a burst of 5 at 1 a second");
    let lowered = erin(36, 4);
    assert_eq!(lowered, 0, "at 1 every 100 s it owes 500 s: nothing more");
    assert_eq!(erin(3600, 4), 0, "back at 1 a second it still owes its 5 s");
    // What reached the route, each admission by the limit its request carried (the
    // checker's rule for changing limits).
    let logs = stack.logs.read(16);
    let refs: Vec<&[Logged]> = logs.iter().map(Vec::as_slice).collect();
    let judge = Judge::configured(&config, "paced");
    let mut admitted = judge.admissions(&refs).per_key;
    let admitted = admitted.remove("erin").unwrap_or_default();
    assert_eq!(admitted.len(), 5);
    let with_limits: Vec<_> = admitted
        .into_iter()
        .map(|a| {
            let rate = carried.iter().rev().find(|(from, _)| *from <= a.at_us);
            let rate = rate.map_or(3600, |(_, rate)| *rate);
            let limit = GlobalLimit::build(judge.limit.kind(), &[rate, 3_600_000_000, 4]);
            (limit.unwrap(), a)
        })
        .collect();
    conformance::check_each_limit(&with_limits).unwrap_or_else(|v| panic!("erin: {v:?}"));
    assert_eq!(stack.weir_stat("rule.paced.failure_allowed"), 0);
    stack.assert_no_panic();
}

/// A tenant's limit from metadata an `ext_authz` server returned: the server (a listener
/// of the same Envoy answering by tenant) sends `x-tenant-rate`, which `ext_authz` puts in
/// its dynamic metadata (`dynamic_metadata_from_headers`), and the rule reads it as an
/// attribute. A client cannot write dynamic metadata: the header it sends itself is not
/// what the rule reads.
#[test]
fn a_limit_from_ext_authz_metadata() {
    let authz_port = weir_e2e::free_port();
    let authz_listener = format!(
        r#"- name: authz
  address:
    socket_address: {{ address: 127.0.0.1, port_value: {authz_port} }}
  filter_chains:
  - filters:
    - name: envoy.filters.network.http_connection_manager
      typed_config:
        "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
        stat_prefix: authz
        route_config:
          virtual_hosts:
          - name: all
            domains: ["*"]
            routes:
            - match: {{ prefix: "/", headers: [ {{ name: x-tenant, string_match: {{ exact: acme }} }} ] }}
              direct_response: {{ status: 200 }}
              response_headers_to_add: [ {{ header: {{ key: x-tenant-rate, value: "6" }} }} ]
            - match: {{ prefix: "/", headers: [ {{ name: x-tenant, string_match: {{ exact: globex }} }} ] }}
              direct_response: {{ status: 200 }}
              response_headers_to_add: [ {{ header: {{ key: x-tenant-rate, value: "2" }} }} ]
            - match: {{ prefix: "/" }}
              direct_response: {{ status: 200 }}
        http_filters:
        - name: envoy.filters.http.router
          typed_config:
            "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
"#
    );
    let authz_cluster = format!(
        r#"- name: authz
  connect_timeout: 1s
  type: STATIC
  load_assignment:
    cluster_name: authz
    endpoints:
    - lb_endpoints:
      - endpoint: {{ address: {{ socket_address: {{ address: 127.0.0.1, port_value: {authz_port} }} }} }}
"#
    );
    let ext_authz = format!(
        r#"- name: envoy.filters.http.ext_authz
  typed_config:
    "@type": type.googleapis.com/envoy.extensions.filters.http.ext_authz.v3.ExtAuthz
    transport_api_version: V3
    http_service:
      server_uri: {{ uri: "http://127.0.0.1:{authz_port}", cluster: authz, timeout: 1s }}
      authorization_request:
        allowed_headers: {{ patterns: [ {{ exact: x-tenant }} ] }}
      authorization_response:
        dynamic_metadata_from_headers: {{ patterns: [ {{ exact: x-tenant-rate }} ] }}
"#
    );
    let config = r#"{"rules":[{"name":"by-authz","key":[{"header":"x-tenant"}],
      "limit":{"algorithm":"token_bucket","refill":1,"period":"1h",
               "capacity":{"attribute":["metadata","filter_metadata","envoy.filters.http.ext_authz","x-tenant-rate"],
                        "default":1,"max":50}}}]}"#;
    let bootstrap = Bootstrap::new()
        .listener(authz_listener)
        .cluster(authz_cluster)
        .http_filter(ext_authz)
        .http_filter(wasm_filter_yaml(config, &weir_wasm()));
    let envoy = Envoy::start(&bootstrap, 1);
    assert_eq!(admitted(&envoy, "/", &[("x-tenant", "acme")], 9), 6);
    assert_eq!(admitted(&envoy, "/", &[("x-tenant", "globex")], 5), 2);
    assert_eq!(
        admitted(
            &envoy,
            "/",
            &[("x-tenant", "initech"), ("x-tenant-rate", "40")],
            5
        ),
        1,
        "no metadata from the server: the default, whatever the client sends"
    );
    assert_eq!(envoy.weir_stat("rule.by-authz.limit_invalid"), 0);
    envoy.assert_no_panic();
}

/// Judges rule `rule`'s admissions in `logs`, tenant by tenant (the log's key), each by
/// the bound of the limit its claim gave (the checker's rule: one limit per stretch, here
/// one per tenant): the configured limit with its count parameter at the tenant's quota.
fn assert_each_tenant_keeps_its_bound(
    config: &str,
    logs: &[Vec<Logged>],
    rule: &str,
    tenants: &[(&str, u64)],
) {
    let refs: Vec<&[Logged]> = logs.iter().map(Vec::as_slice).collect();
    let judge = Judge::configured(config, rule);
    let admitted = judge.admissions(&refs);
    for (sub, quota) in tenants {
        let mut values = judge.limit.algorithm().parameters();
        let spec = judge.limit.kind().spec();
        let at = spec
            .parameters
            .iter()
            .position(|p| p.name == spec.limit_parameter.name);
        values[at.unwrap()] = *quota;
        let own = GlobalLimit::build(judge.limit.kind(), &values).unwrap();
        let admissions = &admitted.per_key[*sub];
        assert!(admissions.len() as u64 <= *quota, "{rule} {sub}");
        conformance::check(&own, admissions).unwrap_or_else(|v| panic!("{rule} {sub}: {v}"));
    }
}
