//! The shared Envoy of a test binary (`Envoy::shared`): two tests whose plugins, rules, keys
//! and clusters are named alike share no bucket, stat or upstream; a listener leaves with its
//! test; a plugin config Envoy refuses fails that test and no other.

use std::io::{BufReader, Write};
use std::time::Duration;

use weir_e2e::loopback::{read_request, Loopback};
use weir_e2e::{get, wait_until, wasm_filter_yaml, weir_wasm, Bootstrap, Envoy};

const CONFIG: &str = r#"{"rules":[{"name":"per-user","key":[{"header":"x-user"}],
    "limit":{"algorithm":"token_bucket","capacity":2,"refill":1,"period":"1h"}}]}"#;

/// An upstream answering every request with `body`.
fn upstream(body: &'static str) -> Loopback {
    Loopback::serve("named upstream", move |conn| {
        let mut writer = conn.try_clone().expect("clone the connection");
        let mut reader = BufReader::new(conn);
        while read_request(&mut reader).is_some() {
            let response = format!(
                "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            );
            if writer.write_all(response.as_bytes()).is_err() {
                return;
            }
        }
    })
}

/// weir with [`CONFIG`] in front of a cluster named `up`, whichever upstream it points at.
fn limited(upstream: &Loopback) -> Bootstrap {
    Bootstrap::new()
        .http_filter(wasm_filter_yaml(CONFIG, &weir_wasm()))
        .routes("- match: { prefix: \"/\" }\n  route: { cluster: up }\n")
        .cluster(upstream.cluster_yaml("up", ""))
}

fn statuses_and_bodies(envoy: &Envoy, user: &str, n: usize) -> Vec<(u16, String)> {
    (0..n)
        .map(|_| {
            let r = get(envoy.http_port, "/", &[("x-user", user)]).unwrap();
            (
                r.status,
                if r.status == 200 {
                    r.text()
                } else {
                    String::new()
                },
            )
        })
        .collect()
}

#[test]
fn same_named_plugins_rules_keys_and_clusters_of_two_tests_are_kept_apart() {
    let (up_a, up_b) = (upstream("a"), upstream("b"));
    let a = Envoy::shared(&limited(&up_a), 1);
    let b = Envoy::shared(&limited(&up_b), 1);
    let admitted = |body: &str| vec![(200, body.to_string()), (200, body.to_string())];

    // alice spends her two on a's listener; b's bucket of the same plugin, rule and key
    // is whole, and each listener's cluster `up` is its own upstream.
    let on_a = statuses_and_bodies(&a, "alice", 3);
    assert_eq!(on_a[..2], admitted("a")[..], "{on_a:?}");
    assert_eq!(on_a[2].0, 429, "{on_a:?}");
    let on_b = statuses_and_bodies(&b, "alice", 2);
    assert_eq!(on_b, admitted("b"));

    // Stats under the bootstrap's names, each listener's own.
    assert_eq!(a.weir_stat("rule.per-user.allowed"), 2);
    assert_eq!(a.weir_stat("rule.per-user.limited"), 1);
    assert_eq!(b.weir_stat("rule.per-user.allowed"), 2);
    assert_eq!(b.plugin_stat("weir", "rule.per-user.limited"), 0);
    assert_eq!(a.stat("http.ingress.downstream_rq_2xx"), Some(2));
    assert_eq!(a.stat("http.ingress.downstream_rq_4xx"), Some(1));
    assert_eq!(b.stat("cluster.up.upstream_rq_total"), Some(2));
    let b_stats = b.stats();
    let served_name = regex::Regex::new(r"(^|[._])t[0-9]+\.").unwrap();
    let leaked: Vec<&String> = b_stats.keys().filter(|n| served_name.is_match(n)).collect();
    assert!(leaked.is_empty(), "served names leaked: {leaked:?}");
    assert_eq!(b_stats["http.ingress.downstream_rq_2xx"], 2);
    assert_eq!(b_stats["wasmcustom.weir.weir.rule.per-user.allowed"], 2);
    let listener = format!(
        "listener.127.0.0.1_{}.http.ingress.downstream_rq_2xx",
        b.http_port
    );
    assert_eq!(b.stat(&listener), Some(2));

    // a's listener leaves with it; b is served on.
    let a_port = a.http_port;
    drop(a);
    assert!(
        wait_until(Duration::from_secs(5), Duration::from_millis(50), || {
            get(a_port, "/", &[("x-user", "carol")]).is_err()
        }),
        "the dropped test's listener still answers on {a_port}"
    );
    assert_eq!(
        statuses_and_bodies(&b, "carol", 1),
        vec![(200, "b".to_string())]
    );
    b.assert_no_panic();
}

/// On the shared Envoy of 3 workers, which no other test uses: the refusal it logs ("Wasm VM
/// failed") would fail the `assert_no_panic` of any test reading the same log.
#[test]
fn a_config_envoy_refuses_fails_its_own_test_and_no_other() {
    const WORKERS: u32 = 3;
    let up = upstream("served");
    let served = Envoy::shared(&limited(&up), WORKERS);
    let refused = Bootstrap::new().http_filter(wasm_filter_yaml(
        r#"{"rules":[{"name":"per-user","limit":{"algorithm":"token_bucket","capacity":0}}]}"#,
        &weir_wasm(),
    ));
    let failure = std::panic::catch_unwind(|| Envoy::shared(&refused, WORKERS))
        .expect_err("Envoy served a plugin config weir refuses");
    let message = failure
        .downcast_ref::<String>()
        .cloned()
        .unwrap_or_default();
    assert!(message.contains("rejected"), "{message}");
    assert!(message.contains("invalid configuration"), "{message}");

    // The listener already served, and one added after, both still admit and limit.
    assert_eq!(statuses_and_bodies(&served, "dave", 3)[2].0, 429);
    let after = Envoy::shared(&limited(&up), WORKERS);
    let on_after = statuses_and_bodies(&after, "dave", 3);
    assert_eq!(on_after[0], (200, "served".to_string()), "{on_after:?}");
    assert_eq!(on_after[2].0, 429, "{on_after:?}");
}
