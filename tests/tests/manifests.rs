//! The Kubernetes package (`deploy/kubernetes/`) is real: every overlay renders with
//! `kubectl kustomize`, every object of a Kubernetes kind passes `kubernetes-validate
//! --strict`, and what ties the objects together holds: the Service is headless where
//! proxies resolve it by DNS and a ClusterIP in the mesh; every container runs unprivileged;
//! the probes are paths the real weir-bridge serves (liveness still 200 with Redis gone,
//! readiness not); the PodDisruptionBudget, the HorizontalPodAutoscaler and the
//! NetworkPolicy select what they should; the Istio plugins pass the filter's checker and load
//! in a real Envoy the way tests/tests/istio.rs renders them; the plain Envoy's bootstrap
//! loads in a real Envoy, points at the headless Service and, moved to loopback, serves its
//! global rule through the real bridge with the shared secret of its Secret.
//!
//! The rendering and validation are the harness's [`weir_e2e::manifests`]; the Istio
//! rendering is [`weir_e2e::istio`].

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::Value;
use weir_core::bounds::{BRIDGE_CALL_MARGIN_MS, BRIDGE_REDIS_TIMEOUT_MS};
use weir_core::wire::{FILTER_METHOD, FILTER_PATHS};
use weir_e2e::istio::{
    backend_routes, check_and_validate, plugins, stats_tags_override, Mesh, Resource,
};
use weir_e2e::manifests::{
    container_port, labels, named, overlays, pod_labels, render, selects, validate_core_kinds,
    Rendered,
};
use weir_e2e::{
    bridge_bin, free_port, get, repo_root, wait_until, weir_wasm, Bridge, Envoy, Process,
    RedisCluster, TestDir, WEIR_STATS_LAG,
};

mod plain_envoy;
use plain_envoy::plain_envoy_plugin;

/// The overlays docs/kubernetes.md describes.
const OVERLAYS: &[&str] = &["istio-gateway", "istio-sidecar", "plain-envoy"];
const ISTIO_OVERLAYS: &[&str] = &["istio-gateway", "istio-sidecar"];

fn all() -> Vec<Rendered> {
    overlays().iter().map(|o| render(o)).collect()
}

fn bridge_deployment(rendered: &Rendered) -> &Resource {
    rendered.one("Deployment", "weir-bridge")
}

fn bridge_container(rendered: &Rendered) -> &Value {
    &bridge_deployment(rendered).spec()["template"]["spec"]["containers"][0]
}

/// The shipped plain Envoy's `stats_config` (envoy/envoy.yaml).
fn envoy_yaml_stats_config() -> Value {
    let text = std::fs::read_to_string(repo_root().join("envoy/envoy.yaml")).unwrap();
    let envoy: Value = serde_yaml::from_str(&text).unwrap();
    envoy["stats_config"].clone()
}

#[test]
fn every_overlay_renders_and_its_kubernetes_kinds_pass_kubernetes_validate() {
    assert_eq!(
        overlays(),
        OVERLAYS,
        "docs/kubernetes.md lists these overlays"
    );
    for rendered in all() {
        let n = validate_core_kinds(&rendered);
        eprintln!("{}: {n} objects validated", rendered.overlay);
        // One label finds (and prunes) everything the package applied.
        for resource in &rendered.resources {
            assert_eq!(
                resource.value["metadata"]["labels"]["app.kubernetes.io/part-of"],
                "weir",
                "{}: {} {} has no app.kubernetes.io/part-of: weir",
                rendered.overlay,
                resource.kind(),
                resource.name()
            );
        }
        for kind in [
            "Namespace",
            "Secret",
            "Deployment",
            "Service",
            "PodDisruptionBudget",
            "HorizontalPodAutoscaler",
            "NetworkPolicy",
        ] {
            assert!(
                rendered.of_kind(kind).next().is_some(),
                "{}: no {kind}",
                rendered.overlay
            );
        }
    }
}

/// Plain Envoy resolves the Service by DNS and balances over what it resolves to: the name
/// must give every pod (headless). In the mesh, istiod builds an ORIGINAL_DST cluster for a
/// headless Service, which a callout cannot use: there it is a ClusterIP.
#[test]
fn the_bridge_service_is_headless_for_dns_and_a_cluster_ip_in_the_mesh() {
    for rendered in all() {
        let service = rendered.one("Service", "weir-bridge");
        let headless = service.spec()["clusterIP"] == "None";
        let in_mesh = ISTIO_OVERLAYS.contains(&rendered.overlay.as_str());
        assert_eq!(
            headless,
            !in_mesh,
            "{}: the bridge Service's clusterIP is {}",
            rendered.overlay,
            service.spec()["clusterIP"]
        );
        let deployment = bridge_deployment(&rendered);
        assert!(
            selects(
                &labels(&service.spec()["selector"]),
                &pod_labels(deployment)
            ),
            "{}: the Service selects the bridge pods",
            rendered.overlay
        );
        let port = &service.spec()["ports"][0];
        assert_eq!(
            container_port(bridge_container(&rendered), &port["targetPort"]),
            8081,
            "{}: the Service's targetPort is the bridge's port",
            rendered.overlay
        );
        assert_eq!(port["appProtocol"], "http", "{}", rendered.overlay);
    }
}

#[test]
fn every_container_runs_unprivileged_from_an_image_pinned_by_digest() {
    let image_uid: u64 = std::fs::read_to_string(repo_root().join("scripts/oci-bridge.py"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("UID = "))
        .expect("scripts/oci-bridge.py sets UID")
        .trim()
        .parse()
        .unwrap();
    let mut containers = 0;
    for rendered in all() {
        for deployment in rendered.of_kind("Deployment") {
            let at = format!("{} Deployment {}", rendered.overlay, deployment.name());
            let pod = &deployment.spec()["template"]["spec"];
            assert!(
                deployment.spec()["replicas"].as_u64().unwrap_or(1) >= 2,
                "{at}: at least 2 replicas"
            );
            assert_eq!(pod["automountServiceAccountToken"], false, "{at}");
            for container in pod["containers"].as_array().unwrap() {
                let at = format!("{at} container {}", container["name"]);
                let sc = &container["securityContext"];
                let either = |field: &str| {
                    if sc[field].is_null() {
                        pod["securityContext"][field].clone()
                    } else {
                        sc[field].clone()
                    }
                };
                assert_eq!(either("runAsNonRoot"), true, "{at}: runAsNonRoot");
                let uid = either("runAsUser").as_u64().unwrap_or(0);
                assert_ne!(uid, 0, "{at}: runAsUser");
                if deployment.name() == "weir-bridge" {
                    assert_eq!(uid, image_uid, "{at}: the bridge image's user");
                }
                assert_eq!(
                    either("seccompProfile")["type"],
                    "RuntimeDefault",
                    "{at}: seccomp"
                );
                assert_eq!(sc["readOnlyRootFilesystem"], true, "{at}");
                assert_eq!(sc["allowPrivilegeEscalation"], false, "{at}");
                assert_eq!(
                    sc["capabilities"]["drop"],
                    serde_json::json!(["ALL"]),
                    "{at}"
                );
                assert!(
                    sc["capabilities"]["add"].is_null(),
                    "{at}: no capability added"
                );
                let resources = &container["resources"];
                assert!(
                    resources["requests"]["cpu"].is_string()
                        && resources["requests"]["memory"].is_string()
                        && resources["limits"]["memory"].is_string(),
                    "{at}: cpu and memory requests and a memory limit: {resources}"
                );
                let image = container["image"].as_str().unwrap();
                let digest = image
                    .split_once("@sha256:")
                    .unwrap_or_else(|| panic!("{at}: {image} is not pinned by digest"))
                    .1;
                assert!(
                    digest.len() == 64 && digest.bytes().all(|b| b.is_ascii_hexdigit()),
                    "{at}: {image}"
                );
                assert!(
                    !container["readinessProbe"].is_null() && !container["livenessProbe"].is_null(),
                    "{at}: readiness and liveness probes"
                );
                containers += 1;
            }
        }
    }
    assert!(containers >= 4, "only {containers} containers checked");
}

/// The PodDisruptionBudgets and the HorizontalPodAutoscaler act on the Deployments they are
/// named after, and leave room to drain a node.
#[test]
fn the_disruption_budgets_and_the_autoscaler_act_on_their_deployments() {
    for rendered in all() {
        for pdb in rendered.of_kind("PodDisruptionBudget") {
            let at = format!("{} PodDisruptionBudget {}", rendered.overlay, pdb.name());
            let deployment = rendered.one("Deployment", pdb.name());
            assert_eq!(pdb.namespace(), deployment.namespace(), "{at}");
            assert!(
                selects(
                    &labels(&pdb.spec()["selector"]["matchLabels"]),
                    &pod_labels(deployment)
                ),
                "{at}: selects the Deployment's pods"
            );
            let min_available = pdb.spec()["minAvailable"].as_u64().expect("minAvailable");
            let replicas = deployment.spec()["replicas"].as_u64().unwrap_or(1);
            assert!(
                min_available >= 1 && min_available < replicas,
                "{at}: minAvailable {min_available} with {replicas} replicas: a drain could never evict"
            );
        }
        let hpa = rendered.one("HorizontalPodAutoscaler", "weir-bridge");
        let at = format!("{} HorizontalPodAutoscaler", rendered.overlay);
        let target = &hpa.spec()["scaleTargetRef"];
        assert_eq!(target["apiVersion"], "apps/v1", "{at}");
        assert_eq!(target["kind"], "Deployment", "{at}");
        let deployment = rendered.one("Deployment", target["name"].as_str().unwrap());
        assert_eq!(hpa.namespace(), deployment.namespace(), "{at}");
        let min = hpa.spec()["minReplicas"].as_u64().unwrap();
        let max = hpa.spec()["maxReplicas"].as_u64().unwrap();
        let pdb = rendered.one("PodDisruptionBudget", deployment.name());
        assert!(
            min > pdb.spec()["minAvailable"].as_u64().unwrap() && min <= max,
            "{at}: minReplicas {min} must stay above the PDB's minAvailable"
        );
        assert_eq!(
            deployment.spec()["replicas"].as_u64(),
            Some(min),
            "{at}: the Deployment starts where the autoscaler's floor is"
        );
        // Utilization is measured against the request: the container it names must have one.
        for metric in hpa.spec()["metrics"].as_array().unwrap() {
            let resource = &metric["containerResource"];
            let name = resource["container"].as_str().unwrap_or_else(|| {
                panic!("{at}: {metric}: scale on the bridge container (ContainerResource)")
            });
            let container = named(&deployment.spec()["template"]["spec"]["containers"], name)
                .unwrap_or_else(|| panic!("{at}: no container {name}"));
            let unit = resource["name"].as_str().unwrap();
            assert!(
                container["resources"]["requests"][unit].is_string(),
                "{at}: utilization of {unit} needs a {unit} request"
            );
        }
    }
}

/// A duration as the bridge's settings write it (`5s`, `100ms`), in ms.
fn ms(text: &str) -> u64 {
    match text.strip_suffix("ms") {
        Some(n) => n.parse().unwrap(),
        None => text.strip_suffix('s').unwrap().parse::<u64>().unwrap() * 1_000,
    }
}

/// Every plugin of every overlay waits for the bridge at least as long as the bridge
/// waits for Redis plus the call's margin: else the filter gives up on calls Redis still
/// answers, and the units it grants are lost (docs/operations.md, "Timeouts").
#[test]
fn the_plugins_wait_longer_than_the_bridge_waits_for_redis() {
    for rendered in all() {
        let env = &bridge_container(&rendered)["env"];
        let redis_ms = named(env, "WEIR_BRIDGE_REDIS_TIMEOUT")
            .and_then(|e| e["value"].as_str())
            .map_or(BRIDGE_REDIS_TIMEOUT_MS, ms);
        let mut configs: Vec<(String, Value)> = rendered
            .resources
            .iter()
            .flat_map(plugins)
            .map(|p| (p.label.clone(), p.json_value()))
            .collect();
        if rendered
            .of_kind("Deployment")
            .any(|d| d.name() == "weir-envoy")
        {
            configs.push((
                "plain-envoy bootstrap".into(),
                plain_envoy_plugin(&rendered),
            ));
        }
        assert!(!configs.is_empty());
        for (label, config) in configs {
            let json = config.to_string();
            let parsed = weir_core::config::parse(json.as_bytes()).unwrap();
            let bridge_ms = parsed.bridge.expect("a bridge").timeout_ms;
            assert!(
                bridge_ms >= redis_ms + BRIDGE_CALL_MARGIN_MS,
                "{label}: bridge.timeout {bridge_ms}ms < the bridge's Redis timeout \
                 {redis_ms}ms + {BRIDGE_CALL_MARGIN_MS}ms"
            );
        }
    }
}

/// The kubelet waits for the bridge's drain and its shutdown grace before SIGKILL, and
/// the drain is long enough for a health check 1 s apart to fail twice.
#[test]
fn the_grace_period_covers_the_bridges_drain_and_shutdown() {
    for rendered in all() {
        let env = &bridge_container(&rendered)["env"];
        let setting = |name: &str, default: &str| {
            named(env, name)
                .and_then(|e| e["value"].as_str())
                .map_or_else(|| ms(default), ms)
        };
        let drain = setting("WEIR_BRIDGE_DRAIN_DELAY", "5s");
        let grace = setting("WEIR_BRIDGE_SHUTDOWN_GRACE", "10s");
        let deployment = bridge_deployment(&rendered);
        let period = deployment.spec()["template"]["spec"]["terminationGracePeriodSeconds"]
            .as_u64()
            .expect("terminationGracePeriodSeconds")
            * 1_000;
        assert!(
            period > drain + grace,
            "{}: {period} ms of grace for a {drain} ms drain and {grace} ms of shutdown",
            rendered.overlay
        );
        assert!(drain >= 3_000, "{}: a {drain} ms drain", rendered.overlay);
    }
}

/// `host:port` of the first Redis seed, split; `NAME.NAMESPACE.svc...` gives the namespace.
fn redis_seed(rendered: &Rendered) -> (String, u64) {
    let nodes = named(
        &bridge_container(rendered)["env"],
        "WEIR_BRIDGE_REDIS_NODES",
    )
    .and_then(|e| e["value"].as_str())
    .expect("WEIR_BRIDGE_REDIS_NODES");
    let first = nodes.split(',').next().unwrap();
    let first = first.split_once("://").map_or(first, |(_, rest)| rest);
    let (host, port) = first.rsplit_once(':').expect("host:port");
    let namespace = host
        .split('.')
        .nth(1)
        .unwrap_or_else(|| panic!("{host}: not NAME.NAMESPACE.svc..."));
    (namespace.to_string(), port.parse().unwrap())
}

/// Does one `from`/`to` peer admit pods with `pod` labels in namespace `ns` (whose
/// `kubernetes.io/metadata.name` label is its name)? A peer without a namespaceSelector
/// means the policy's own namespace.
fn peer_admits(peer: &Value, policy_ns: &str, ns: &str, pod: &BTreeMap<String, String>) -> bool {
    let ns_ok = match peer.get("namespaceSelector") {
        None => ns == policy_ns,
        Some(sel) => {
            let want = labels(&sel["matchLabels"]);
            want.iter()
                .all(|(k, v)| k == "kubernetes.io/metadata.name" && v == ns)
        }
    };
    let pod_ok = match peer.get("podSelector") {
        None => true,
        Some(sel) => labels(&sel["matchLabels"])
            .iter()
            .all(|(k, v)| pod.get(k) == Some(v)),
    };
    ns_ok && pod_ok
}

/// The bridge's NetworkPolicy: ingress from exactly the proxies that run weir (the plugins'
/// workloads, or the plain Envoy's pods) on the bridge's port; egress to DNS and to the
/// Redis namespace and port of WEIR_BRIDGE_REDIS_NODES, and to istiod in the mesh.
#[test]
fn the_network_policy_admits_the_proxies_and_lets_the_bridge_reach_redis() {
    for rendered in all() {
        let at = format!("{} NetworkPolicy", rendered.overlay);
        let policy = rendered.one("NetworkPolicy", "weir-bridge");
        let spec = policy.spec();
        let deployment = bridge_deployment(&rendered);
        assert!(
            selects(
                &labels(&spec["podSelector"]["matchLabels"]),
                &pod_labels(deployment)
            ),
            "{at}: selects the bridge pods"
        );
        assert_eq!(
            spec["policyTypes"],
            serde_json::json!(["Ingress", "Egress"])
        );
        let ns = policy.namespace();
        // The proxies: the workloads the plugins select, or the plain Envoy's pods.
        let mut proxies: Vec<(String, BTreeMap<String, String>)> = rendered
            .resources
            .iter()
            .flat_map(plugins)
            .map(|p| (p.namespace, p.selector))
            .collect();
        if !ISTIO_OVERLAYS.contains(&rendered.overlay.as_str()) {
            proxies = vec![(
                ns.to_string(),
                pod_labels(rendered.one("Deployment", "weir-envoy")),
            )];
        }
        assert!(!proxies.is_empty(), "{at}: no proxy found");
        let callers = &spec["ingress"][0];
        assert_eq!(
            callers["ports"],
            serde_json::json!([{ "protocol": "TCP", "port": 8081 }]),
            "{at}: the callers reach the bridge's port only"
        );
        for (proxy_ns, proxy_labels) in &proxies {
            assert!(
                callers["from"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|peer| peer_admits(peer, ns, proxy_ns, proxy_labels)),
                "{at}: ingress rule 0 does not admit the proxies {proxy_labels:?} in {proxy_ns}"
            );
        }
        // Nobody else: a pod with none of the proxies' labels, in another namespace.
        let stranger = BTreeMap::from([("app".to_string(), "stranger".to_string())]);
        for peer in callers["from"].as_array().unwrap() {
            assert!(
                !peer_admits(peer, ns, "elsewhere", &stranger),
                "{at}: admits any pod: {peer}"
            );
        }
        let (redis_ns, redis_port) = redis_seed(&rendered);
        let egress = spec["egress"].as_array().unwrap();
        let reaches = |ns: &str, pod: &BTreeMap<String, String>, protocol: &str, port: u64| {
            egress.iter().any(|rule| {
                rule["to"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|peer| peer_admits(peer, policy.namespace(), ns, pod))
                    && rule["ports"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .any(|p| p["protocol"] == protocol && p["port"] == port)
            })
        };
        let redis_pod = BTreeMap::from([("app".to_string(), "redis".to_string())]);
        assert!(
            reaches(&redis_ns, &redis_pod, "TCP", redis_port),
            "{at}: the bridge cannot reach Redis in {redis_ns}:{redis_port}"
        );
        let dns = BTreeMap::from([("k8s-app".to_string(), "kube-dns".to_string())]);
        assert!(reaches("kube-system", &dns, "UDP", 53), "{at}: DNS");
        let istiod = BTreeMap::from([("app".to_string(), "istiod".to_string())]);
        assert_eq!(
            reaches("istio-system", &istiod, "TCP", 15012),
            ISTIO_OVERLAYS.contains(&rendered.overlay.as_str()),
            "{at}: istiod is reachable in the mesh only"
        );
    }
}

/// The probes as the kubelet would run them, against the real weir-bridge started with the
/// Deployment's own environment: both 200 with Redis up; with Redis gone, readiness turns
/// (the pod leaves the endpoints) and liveness stays 200 (the bridge is not restarted for
/// Redis's trouble).
#[test]
fn the_probes_are_paths_the_real_bridge_serves_and_only_readiness_follows_redis() {
    let rendered = all();
    let probes = |r: &Rendered| {
        let c = bridge_container(r);
        (c["readinessProbe"].clone(), c["livenessProbe"].clone())
    };
    for r in &rendered[1..] {
        assert_eq!(
            probes(r),
            probes(&rendered[0]),
            "{}: the same probes",
            r.overlay
        );
    }
    let container = bridge_container(&rendered[0]);
    let path_of = |probe: &Value| {
        let get = &probe["httpGet"];
        assert_eq!(
            container_port(container, &get["port"]),
            8081,
            "probes go to the bridge's port"
        );
        get["path"].as_str().expect("an httpGet probe").to_string()
    };
    let (readiness, liveness) = probes(&rendered[0]);
    let (readiness, liveness) = (path_of(&readiness), path_of(&liveness));

    // Every variable the Deployment sets is one the bridge reads.
    let help = std::process::Command::new(bridge_bin())
        .arg("--help")
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&help.stdout).to_string();
    let mut env: Vec<(String, String)> = Vec::new();
    for r in &rendered {
        for var in bridge_container(r)["env"].as_array().unwrap() {
            let name = var["name"].as_str().unwrap();
            assert!(
                help.contains(&format!("[env: {name}")),
                "{}: {name} is not a variable weir-bridge reads (--help)",
                r.overlay
            );
            if let Some(value) = var["value"].as_str() {
                env.push((name.to_string(), value.to_string()));
            }
        }
    }
    // Here: its own port on loopback, the test's Redis, no secret file (the overlay mounts
    // one); the rest as the Deployment sets it.
    let port = free_port();
    let redis = RedisCluster::start(3, 0);
    let listen = format!("127.0.0.1:{port}");
    let nodes = redis.seed_nodes().join(",");
    env.retain(|(k, _)| k != "WEIR_BRIDGE_SECRET_FILE");
    env.retain(|(k, _)| k != "WEIR_BRIDGE_LISTEN" && k != "WEIR_BRIDGE_REDIS_NODES");
    env.push(("WEIR_BRIDGE_LISTEN".into(), listen));
    env.push(("WEIR_BRIDGE_REDIS_NODES".into(), nodes));
    let env_refs: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let bridge = Process::spawn(bridge_bin(), Vec::<&str>::new(), &env_refs);
    let status = |path: &str| get(port, path, &[]).map(|r| r.status).unwrap_or(0);
    assert!(
        wait_until(Duration::from_secs(20), Duration::from_millis(50), || {
            status(&readiness) == 200
        }),
        "readiness {readiness} never 200 with Redis up; log:\n{}",
        bridge.log()
    );
    assert_eq!(status(&liveness), 200, "liveness {liveness} with Redis up");
    drop(redis);
    assert!(
        wait_until(Duration::from_secs(15), Duration::from_millis(100), || {
            status(&readiness) != 200
        }),
        "readiness {readiness} still 200 with Redis gone"
    );
    for _ in 0..3 {
        assert_eq!(
            status(&liveness),
            200,
            "liveness {liveness} must not fail with Redis gone: the kubelet would restart the bridge"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The Istio overlays' plugins: the filter's checker, the Istio conventions (the bridge
/// cluster is the outbound cluster of the rendered Service), and the bootstrap istiod would
/// give the proxy through `envoy --mode validate`, as tests/tests/istio.rs does for the
/// examples. The module is pulled by digest, the stats tags are envoy/envoy.yaml's and sit in
/// the proxies' namespace, and the AuthorizationPolicy admits exactly the filter's calls.
#[test]
fn the_istio_overlays_plugins_pass_weir_check_and_load_in_envoy() {
    for overlay in ISTIO_OVERLAYS {
        let rendered = render(overlay);
        let mesh = Mesh {
            resources: rendered.resources.clone(),
        };
        let n = check_and_validate(&rendered.resources, &mesh);
        assert!(n >= 1, "{overlay}: no weir plugin");
        let found: Vec<_> = rendered.resources.iter().flat_map(plugins).collect();
        for plugin in &found {
            assert!(
                plugin.json_value().get("bridge").is_some(),
                "{}: the package is for global limits",
                plugin.label
            );
        }
        for wasm_plugin in rendered.of_kind("WasmPlugin") {
            let url = wasm_plugin.spec()["url"].as_str().unwrap();
            assert!(
                url.starts_with("oci://") && url.contains("@sha256:"),
                "{overlay}: {url}: pull the module by digest"
            );
            assert!(
                wasm_plugin.spec()["sha256"].is_string(),
                "{overlay}: sha256"
            );
        }
        let tags = rendered.one("ConfigMap", "weir-stats-tags");
        assert_eq!(
            stats_tags_override(&mesh)["stats_config"],
            envoy_yaml_stats_config(),
            "{overlay}: the stats tags of envoy/envoy.yaml"
        );
        for plugin in &found {
            assert_eq!(
                tags.namespace(),
                plugin.namespace,
                "{overlay}: istio-agent reads the bootstrap override from the proxy's namespace"
            );
        }
        let policy = rendered.one("AuthorizationPolicy", "weir-bridge");
        assert!(selects(
            &labels(&policy.spec()["selector"]["matchLabels"]),
            &pod_labels(bridge_deployment(&rendered))
        ));
        let operation = &policy.spec()["rules"][0]["to"][0]["operation"];
        assert_eq!(operation["methods"], serde_json::json!([FILTER_METHOD]));
        assert_eq!(operation["paths"], serde_json::json!(FILTER_PATHS));
        assert_eq!(
            rendered.one("PeerAuthentication", "default").spec()["mtls"]["mode"],
            "STRICT"
        );
        assert_eq!(
            rendered.one("Namespace", "weir-system").value["metadata"]["labels"]["istio-injection"],
            "enabled",
            "{overlay}: the bridge gets a sidecar"
        );
    }
}

/// envoy/istio/bridge.yaml is the bridge's deployment for a reader who does not use
/// kustomize; the package is the source. What the two share must agree: the
/// DestinationRule (outlier detection, the circuit breaker of "What a crowd gets"), and the
/// bridge container's probes (liveness on `/metrics`, which answers whatever Redis does).
#[test]
fn the_istio_example_bridge_agrees_with_the_package() {
    let text = std::fs::read_to_string(repo_root().join("envoy/istio/bridge.yaml")).unwrap();
    let example = weir_e2e::istio::parse_yaml_docs(&text, "envoy/istio/bridge.yaml");
    let of = |kind: &str| {
        example
            .iter()
            .find(|r| r.kind() == kind && r.name() == "weir-bridge")
            .unwrap_or_else(|| panic!("envoy/istio/bridge.yaml has no {kind} weir-bridge"))
    };
    // A probe as the port is named: the package names it `http`, the example says 8081.
    let probe = |container: &Value, which: &str| {
        let mut probe = container[which].clone();
        for get in ["httpGet", "tcpSocket"] {
            if probe[get]["port"] == "http" {
                probe[get]["port"] = serde_json::json!(8081);
            }
        }
        probe
    };
    let example_container = &of("Deployment").spec()["template"]["spec"]["containers"][0];
    for overlay in ISTIO_OVERLAYS {
        let rendered = render(overlay);
        let rule = rendered.one("DestinationRule", "weir-bridge");
        assert_eq!(
            rule.spec(),
            of("DestinationRule").spec(),
            "{overlay}: the DestinationRule differs from envoy/istio/bridge.yaml's"
        );
        assert_eq!(rule.namespace(), of("DestinationRule").namespace());
        for which in ["livenessProbe", "readinessProbe"] {
            assert_eq!(
                probe(bridge_container(&rendered), which),
                probe(example_container, which),
                "{overlay}: the bridge's {which} differs from envoy/istio/bridge.yaml's"
            );
        }
    }
}
