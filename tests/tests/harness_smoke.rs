//! The harness itself works: Envoy starts, answers, reports stats and dies by PID; bootstraps
//! validate; the client sends what browsers would not; a Redis Cluster forms and fails over.
//! None of these need `weir.wasm`.

use std::time::{Duration, Instant};

use weir_e2e::{
    get, key_slot, pid_exists, run_clients, send, wait_until, Bootstrap, Client, Envoy,
    RedisCluster, Request, TestDir,
};

fn assert_gone(pid: u32, what: &str) {
    assert!(
        wait_until(Duration::from_secs(2), Duration::from_millis(20), || {
            !pid_exists(pid)
        }),
        "{what} (pid {pid}) still exists after its guard was dropped"
    );
}

#[test]
fn envoy_without_filters_serves_reports_stats_and_dies_by_pid() {
    let envoy = Envoy::start(&Bootstrap::new(), 2);
    eprintln!("envoy (concurrency 2) LIVE after {:?}", envoy.startup);
    let pid = envoy.pid();
    assert!(pid_exists(pid));

    let r = get(envoy.http_port, "/anything", &[("x-user", "alice")]).unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.text(), weir_e2e::bootstrap::DEFAULT_BODY);

    // Keep-alive: three requests, one connection.
    let mut c = Client::connect(envoy.http_port).unwrap();
    for _ in 0..3 {
        assert_eq!(c.request(Request::get("/")).unwrap().status, 200);
    }
    assert_eq!(c.connects, 1);

    // Parallel clients, each on its own connection.
    let report = run_clients(4, 200, envoy.http_port, |t, i| {
        Request::get("/load")
            .header("x-thread", t.to_string())
            .header("x-i", i.to_string())
    });
    report.assert_no_errors();
    assert_eq!(report.count(200), 200, "{:?}", report.status_counts());

    let stats = envoy.stats();
    let rq_2xx = stats["http.ingress.downstream_rq_2xx"];
    assert!(rq_2xx >= 204, "downstream_rq_2xx = {rq_2xx}");
    assert_eq!(envoy.stat("http.ingress.downstream_rq_2xx"), Some(rq_2xx));
    assert_eq!(envoy.stat("no.such.stat"), None);
    assert!(stats.contains_key("server.live"), "gauges are parsed too");

    let rss = envoy.memory_rss();
    assert!(rss > 10 << 20, "Envoy RSS {rss} bytes looks wrong");
    eprintln!("envoy RSS {} MiB", rss >> 20);
    assert!(envoy.log().contains("starting main dispatch loop"));

    drop(envoy);
    assert_gone(pid, "envoy");
}

#[test]
fn envoy_kill_on_demand_keeps_the_log() {
    let mut envoy = Envoy::start(&Bootstrap::new(), 1);
    let pid = envoy.pid();
    envoy.kill();
    assert!(!envoy.is_running());
    assert_gone(pid, "envoy");
    assert!(
        envoy.log().contains("caught ENVOY_SIGTERM"),
        "{}",
        envoy.log_tail(10)
    );
    assert!(
        get(envoy.http_port, "/", &[]).is_err(),
        "nobody listens after kill"
    );
}

#[test]
fn validate_accepts_a_rendered_bootstrap_and_rejects_a_broken_one() {
    let dir = TestDir::new("validate");
    let good = dir.write("good.yaml", Bootstrap::new().render());
    Envoy::validate(&good).unwrap_or_else(|e| panic!("rendered bootstrap rejected: {e}"));

    let broken = Bootstrap::new().http_filter(
        "- name: bogus\n  typed_config:\n    \"@type\": type.googleapis.com/envoy.extensions.filters.http.no_such.v3.Thing\n",
    );
    let bad = dir.write("bad.yaml", broken.render());
    let err = Envoy::validate(&bad).expect_err("a filter of an unknown type must be rejected");
    assert!(err.contains("no_such"), "{err}");

    let log = Envoy::start_expect_failure(&broken);
    assert!(log.contains("no_such"), "{log}");
}

#[test]
fn client_sends_60kb_and_non_utf8_header_values() {
    let big = vec![b'a'; 60 * 1024];
    let high: Vec<u8> = (0x80..=0xFF).collect();

    // Envoy's default max_request_headers_kb is 60 for the whole header block: a 60 KiB value
    // does not fit and Envoy answers 431 itself.
    let default_limit = Envoy::start(&Bootstrap::new().max_request_headers_kb(60), 1);
    let r = send(
        default_limit.http_port,
        Request::get("/").header("x-big", &big),
    )
    .unwrap();
    assert_eq!(r.status, 431, "{r:?}");

    // Our builder's default (96 KiB) lets it through.
    let envoy = Envoy::start(&Bootstrap::new(), 1);
    let mut c = Client::connect(envoy.http_port).unwrap();
    let r = c.request(Request::get("/").header("x-big", &big)).unwrap();
    assert_eq!(r.status, 200);

    // obs-text (0x80–0xFF) is legal in a field value (RFC 9110 §5.5); Envoy passes it.
    let r = c
        .request(Request::get("/").header("x-high", &high))
        .unwrap();
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(c.connects, 1);
}

#[test]
fn redis_cluster_forms_serves_and_fails_over() {
    let mut cluster = RedisCluster::start(3, 1);
    eprintln!("redis cluster 3+3 ready after {:?}", cluster.startup);
    let pids: Vec<u32> = cluster.nodes().iter().map(|n| n.pid()).collect();
    assert_eq!(pids.len(), 6);
    assert_eq!(cluster.masters().len(), 3);
    assert_eq!(cluster.seed_nodes().len(), 6);

    assert_eq!(cluster.redis_cli(["-c", "SET", "k", "v"]), "OK");
    assert_eq!(cluster.redis_cli(["GET", "k"]), "v");
    for key in ["k", "foo", "{user1000}.following", "a{}b", "{}{x}"] {
        let theirs = cluster.redis_cli(["CLUSTER", "KEYSLOT", key]);
        assert_eq!(
            key_slot(key.as_bytes()).to_string(),
            theirs,
            "slot of {key:?}"
        );
    }

    let slot = key_slot(b"k");
    let old = cluster.kill_master_of_slot(slot);
    let killed_at = Instant::now();
    let new = cluster.wait_for_failover(slot, Duration::from_secs(10));
    let promoted = killed_at.elapsed();
    assert_ne!(old, new);
    assert!(wait_until(
        Duration::from_secs(5),
        Duration::from_millis(20),
        || { cluster.redis_cli(["SET", "k", "v2"]) == "OK" }
    ));
    let writable = killed_at.elapsed();
    eprintln!("failover: {old} -> {new}; promoted after {promoted:?}, writable after {writable:?}");
    assert_eq!(cluster.redis_cli(["GET", "k"]), "v2");
    assert_eq!(cluster.masters().len(), 3);

    drop(cluster);
    for pid in pids {
        assert_gone(pid, "redis-server");
    }
}
