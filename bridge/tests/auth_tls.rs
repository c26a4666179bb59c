//! Redis credentials and TLS, through the bridge binary: a password-protected cluster (with
//! an ACL user too), and a TLS-only cluster node with its own CA.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use serde_json::{json, Value as Json};
use std::process::Command;
use std::time::Duration;
use weir_e2e::{redis_cli_at, wait_until, Child, Process, RedisCluster, TestDir};
use weir_protocol::wire::v1::ACQUIRE_PATH;
use weir_protocol::wire::{v2, v3};

const BODY: &str = r#"{"domain":"weir","items":[{"rule":"r","descriptor":["=alice"],
    "limit":{"algorithm":"gcra","burst":9,"rate":10,"period_us":1000000},"cost":1,"want":3}]}"#;

/// Starts the bridge binary with `args` and `env`; waits until it serves HTTP (healthy or
/// not). Returns it and the status of `/healthz` and of one acquire.
fn bridge_outcome(args: &[&str], env: &[(&str, &str)]) -> (Process, u16, u16) {
    let (bridge, _port, health, acquire) = bridge_outcome_on(args, env);
    (bridge, health, acquire)
}

/// [`bridge_outcome`], and the port the bridge listens on.
fn bridge_outcome_on(args: &[&str], env: &[(&str, &str)]) -> (Process, u16, u16, u16) {
    let port = weir_e2e::free_port();
    let listen = format!("127.0.0.1:{port}");
    let mut all = vec![
        "--listen",
        listen.as_str(),
        "--redis-timeout",
        "500ms",
        "--drain-delay",
        "0s",
    ];
    all.extend_from_slice(args);
    let bridge = Process::spawn(env!("CARGO_BIN_EXE_weir-bridge"), all, env);
    // Healthy within a few seconds, or settle on what it answers.
    let mut health = 0;
    wait_until(Duration::from_secs(5), Duration::from_millis(50), || {
        health = weir_e2e::get(port, "/healthz", &[]).map_or(0, |r| r.status);
        health == 200
    });
    let acquire =
        weir_e2e::send(port, weir_e2e::Request::post(ACQUIRE_PATH, BODY)).map_or(0, |r| r.status);
    (bridge, port, health, acquire)
}

#[test]
fn passwords_and_acl_users() {
    let cluster = RedisCluster::start(3, 1);
    let ports: Vec<u16> = cluster.nodes().iter().map(|n| n.port).collect();
    for &p in &ports {
        // Replicas authenticate to their masters with masterauth.
        redis_cli_at(p, ["CONFIG", "SET", "masterauth", "cluster-pw"]).unwrap();
        let ok = redis_cli_at(
            p,
            [
                "ACL", "SETUSER", "weir", "on", ">user-pw", "~*", "&*", "+@all",
            ],
        )
        .unwrap();
        assert_eq!(ok, "OK");
    }
    for &p in &ports {
        redis_cli_at(p, ["CONFIG", "SET", "requirepass", "cluster-pw"]).unwrap();
    }
    let nodes = cluster.seed_nodes().join(",");
    let seeds = ("WEIR_BRIDGE_REDIS_NODES", nodes.as_str());

    let (_b, health, acquire) =
        bridge_outcome(&[], &[seeds, ("WEIR_BRIDGE_REDIS_PASSWORD", "cluster-pw")]);
    assert_eq!((health, acquire), (200, 200), "the default user's password");

    let (_b, health, acquire) = bridge_outcome(
        &["--redis-username", "weir"],
        &[seeds, ("WEIR_BRIDGE_REDIS_PASSWORD", "user-pw")],
    );
    assert_eq!((health, acquire), (200, 200), "an ACL user");

    // A wrong password: the client never connects, which looks like an unreachable
    // cluster (503); the log says why.
    let (b, health, acquire) =
        bridge_outcome(&[], &[seeds, ("WEIR_BRIDGE_REDIS_PASSWORD", "wrong")]);
    assert_eq!((health, acquire), (503, 503));
    let log = b.log();
    assert!(
        log.contains("WRONGPASS") || log.contains("AuthenticationFailed") || log.contains("auth"),
        "{log}"
    );
    assert!(!log.contains("cluster-pw"), "the password is never logged");
}

/// The rules of the shipped ACL (`deploy/redis/weir-bridge.acl`), comments dropped.
fn shipped_acl_rules() -> Vec<String> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../deploy/redis/weir-bridge.acl"
    );
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    text.lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .flat_map(str::split_whitespace)
        .map(str::to_string)
        .collect()
}

/// `redis-cli` as the `weir-bridge` user on one node.
fn as_bridge_user(port: u16, args: &[&str]) -> String {
    let out = Command::new(weir_e2e::redis_cli_bin())
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args([
            "-c",
            "--user",
            "weir-bridge",
            "--pass",
            "acl-pw",
            "--no-auth-warning",
        ])
        .args(args)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// The bridge connects as a user with only the shipped ACL, and serves every algorithm
/// and both settle scripts; the user cannot run anything else, nor touch other keys.
#[test]
fn the_shipped_least_privilege_acl_serves_every_script() {
    let cluster = RedisCluster::start(3, 1);
    let rules = shipped_acl_rules();
    assert!(rules.contains(&"-@all".to_string()), "{rules:?}");
    for node in cluster.nodes() {
        let mut args = vec!["ACL", "SETUSER", "weir-bridge", "reset", ">acl-pw"];
        args.extend(rules.iter().map(String::as_str));
        assert_eq!(redis_cli_at(node.port, &args).unwrap(), "OK");
    }
    let nodes = cluster.seed_nodes().join(",");
    let (bridge, port, health, acquire) = bridge_outcome_on(
        &["--redis-username", "weir-bridge"],
        &[
            ("WEIR_BRIDGE_REDIS_NODES", nodes.as_str()),
            ("WEIR_BRIDGE_REDIS_PASSWORD", "acl-pw"),
        ],
    );
    assert_eq!((health, acquire), (200, 200), "{}", bridge.log());

    // Every script: an acquire per algorithm, then a refund per settle script.
    let limits = [
        json!({"algorithm": "token_bucket", "capacity": 10, "refill": 1, "period_us": 60_000_000}),
        json!({"algorithm": "gcra", "burst": 9, "rate": 10, "period_us": 1_000_000}),
        json!({"algorithm": "fixed_window", "limit": 10, "window_us": 60_000_000}),
        json!({"algorithm": "sliding_window", "limit": 10, "window_us": 60_000_000}),
        json!({"algorithm": "sliding_log", "limit": 10, "window_us": 60_000_000}),
    ];
    let items: Vec<Json> = limits
        .iter()
        .enumerate()
        .map(|(id, limit)| {
            json!({"id": id, "rule": "acl", "descriptor": ["=alice"],
            "limit": limit, "cost": 2, "want": 2})
        })
        .collect();
    let acquire = json!({"domain": "weir", "items": items}).to_string();
    let r = weir_e2e::send(port, weir_e2e::Request::post(v2::ACQUIRE_PATH, acquire)).unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let reply: Json = serde_json::from_slice(&r.body).unwrap();
    for (id, granted) in reply["items"].as_array().unwrap().iter().enumerate() {
        assert_eq!(granted["allowed"], true, "{}: {granted}", limits[id]);
        assert_eq!(granted["granted"], 2, "{}: {granted}", limits[id]);
    }
    assert_eq!(reply["items"].as_array().unwrap().len(), limits.len());
    let counted_at = reply["items"][0]["now_us"].as_u64().unwrap();
    let commits: Vec<Json> = [0, 2]
        .iter()
        .map(|&id| {
            json!({"id": id, "rule": "acl", "descriptor": ["=alice"],
            "limit": limits[id], "counted_at_us": counted_at, "reserved": 2, "actual": 1})
        })
        .collect();
    let commit = json!({"domain": "weir", "items": commits}).to_string();
    let r = weir_e2e::send(port, weir_e2e::Request::post(v3::COMMIT_PATH, commit)).unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        serde_json::from_slice::<Json>(&r.body).unwrap(),
        json!({"items": [{"id": 0, "settled": true}, {"id": 2, "settled": true}]})
    );

    // Outside the list, refused to that user: other commands, and other keys, also from
    // a script.
    let master = cluster.masters()[0].clone();
    let node: u16 = master.rsplit(':').next().unwrap().parse().unwrap();
    assert_eq!(as_bridge_user(node, &["PING"]), "PONG");
    for refused in [
        &["FLUSHALL"][..],
        &["KEYS", "*"],
        &["CONFIG", "GET", "maxmemory"],
        &["DEL", "weir:{x}:gcra"],
        &["INFO"],
        &["SCRIPT", "FLUSH"],
        &["GET", "not-weir"],
        &["EVAL", "return redis.call('GET', KEYS[1])", "1", "not-weir"],
        &[
            "EVAL",
            "return redis.call('DEL', KEYS[1])",
            "1",
            "weir:{x}:gcra",
        ],
    ] {
        let reply = as_bridge_user(node, refused);
        // A command a script calls is refused with its own words.
        let script_refused = "ERR The user executing the script can't run this command";
        assert!(
            reply.contains("NOPERM") || reply.starts_with(script_refused),
            "{refused:?}: {reply}"
        );
    }
}

/// `openssl` in `dir`: a CA, and a server certificate for 127.0.0.1 signed by it.
fn make_certs(dir: &TestDir) {
    let run = |args: &[&str]| {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(dir.path())
            .output()
            .unwrap_or_else(|e| panic!("cannot run openssl ({e}): apt-get install -y openssl"));
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    dir.write(
        "san.ext",
        "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n",
    );
    run(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "2",
        "-subj",
        "/CN=weir test CA",
    ]);
    run(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        "-subj",
        "/CN=127.0.0.1",
    ]);
    run(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "server.pem",
        "-days",
        "2",
        "-extfile",
        "san.ext",
    ]);
}

#[test]
fn tls_with_a_private_ca() {
    let dir = TestDir::new("bridge-tls");
    make_certs(&dir);
    let path = |name: &str| dir.join(name).to_string_lossy().into_owned();
    let port = weir_e2e::free_port();
    let p = port.to_string();
    // One TLS-only node owning every slot: a cluster as far as the client can tell.
    let _node = Child::spawn(
        "redis-tls",
        weir_e2e::redis_server_bin(),
        [
            "--port",
            "0",
            "--tls-port",
            &p,
            "--bind",
            "127.0.0.1",
            "--tls-cert-file",
            &path("server.pem"),
            "--tls-key-file",
            &path("server.key"),
            "--tls-ca-cert-file",
            &path("ca.pem"),
            "--tls-auth-clients",
            "no",
            "--tls-cluster",
            "yes",
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            &path("nodes.conf"),
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            &path(""),
        ],
        &[],
        &dir.join("redis.log"),
    )
    .with_grace(Duration::ZERO);
    let cli = |args: &[&str]| {
        Command::new(weir_e2e::redis_cli_bin())
            .args([
                "--tls",
                "--cacert",
                &path("ca.pem"),
                "-h",
                "127.0.0.1",
                "-p",
                &p,
            ])
            .args(args)
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
    };
    assert!(wait_until(
        Duration::from_secs(10),
        Duration::from_millis(50),
        || cli(&["PING"]).trim() == "PONG"
    ));
    assert_eq!(
        cli(&["CLUSTER", "ADDSLOTSRANGE", "0", "16383"]).trim(),
        "OK"
    );
    assert!(wait_until(
        Duration::from_secs(10),
        Duration::from_millis(50),
        || { cli(&["CLUSTER", "INFO"]).contains("cluster_state:ok") }
    ));

    let seed = format!("127.0.0.1:{port}");
    let ca = path("ca.pem");
    let (_b, health, acquire) = bridge_outcome(
        &["--redis-ca-file", &ca],
        &[("WEIR_BRIDGE_REDIS_NODES", seed.as_str())],
    );
    assert_eq!((health, acquire), (200, 200), "TLS with our CA");

    // Without the CA the server's certificate is not trusted: never connected.
    let (b, health, acquire) = bridge_outcome(
        &["--redis-tls"],
        &[("WEIR_BRIDGE_REDIS_NODES", seed.as_str())],
    );
    assert_eq!((health, acquire), (503, 503));
    assert!(b.log().contains("certificate"), "{}", b.log());

    // And plain TCP to a TLS port does not work either.
    let (_b, health, _) = bridge_outcome(&[], &[("WEIR_BRIDGE_REDIS_NODES", seed.as_str())]);
    assert_eq!(health, 503);
}
