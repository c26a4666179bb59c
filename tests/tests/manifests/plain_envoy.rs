//! The plain-Envoy overlay: its bootstrap, mounted from the package's ConfigMaps, loads in
//! a real Envoy, calls the headless bridge Service, and serves its global rule through a
//! real bridge with the shared secret.

use super::*;

fn envoy_container(rendered: &Rendered) -> &Value {
    &rendered.one("Deployment", "weir-envoy").spec()["template"]["spec"]["containers"][0]
}

/// The volume `name` of the plain Envoy's pod and where the container mounts it.
fn envoy_mount<'a>(rendered: &'a Rendered, name: &str) -> (&'a Value, String) {
    let pod = &rendered.one("Deployment", "weir-envoy").spec()["template"]["spec"];
    let volume = named(&pod["volumes"], name).unwrap_or_else(|| panic!("no volume {name}"));
    let mount = named(&envoy_container(rendered)["volumeMounts"], name)
        .unwrap_or_else(|| panic!("volume {name} not mounted"));
    (volume, mount["mountPath"].as_str().unwrap().to_string())
}

/// The bootstrap the plain Envoy's pod reads: the file its `--config-path` names, in the
/// ConfigMap mounted there.
fn plain_envoy_bootstrap(rendered: &Rendered) -> Value {
    let (config_volume, config_dir) = envoy_mount(rendered, "config");
    let config_map = rendered.one(
        "ConfigMap",
        config_volume["configMap"]["name"].as_str().unwrap(),
    );
    let args: Vec<&str> = envoy_container(rendered)["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    let config_path = args
        .windows(2)
        .find(|w| w[0] == "--config-path" || w[0] == "-c")
        .map(|w| w[1])
        .expect("envoy --config-path");
    let file = config_path
        .strip_prefix(&format!("{config_dir}/"))
        .unwrap_or_else(|| panic!("{config_path} is not in the config volume {config_dir}"));
    let text = config_map.value["data"][file]
        .as_str()
        .unwrap_or_else(|| panic!("the ConfigMap has no {file}"));
    serde_yaml::from_str(text).unwrap()
}

/// The weir filter's `config` (its configuration and `vm_config`) in a bootstrap's first
/// listener.
fn weir_filter_config(bootstrap: &Value) -> &Value {
    let listener = &bootstrap["static_resources"]["listeners"][0];
    let hcm = &listener["filter_chains"][0]["filters"][0]["typed_config"];
    let weir = hcm["http_filters"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["name"] == "envoy.filters.http.wasm")
        .expect("the weir filter");
    &weir["typed_config"]["config"]
}

/// The plugin configuration of the plain Envoy's weir filter.
pub(super) fn plain_envoy_plugin(rendered: &Rendered) -> Value {
    let bootstrap = plain_envoy_bootstrap(rendered);
    let json = weir_filter_config(&bootstrap)["configuration"]["value"]
        .as_str()
        .unwrap();
    serde_json::from_str(json).unwrap()
}

/// The plain-envoy overlay's bootstrap is the one the Envoy pod reads, loads in a real
/// Envoy (weir.wasm and its configuration included), calls the bridge through the
/// headless Service by STRICT_DNS, and takes the shared secret from the Secret the bridge
/// reads it from.
#[test]
fn the_plain_envoy_bootstrap_loads_in_envoy_and_calls_the_headless_service() {
    let rendered = render("plain-envoy");
    let mut bootstrap = plain_envoy_bootstrap(&rendered);

    assert_eq!(bootstrap["stats_config"], envoy_yaml_stats_config());
    let clusters = bootstrap["static_resources"]["clusters"]
        .as_array()
        .unwrap();
    let bridge = clusters
        .iter()
        .find(|c| c["name"] == "weir_bridge")
        .expect("a weir_bridge cluster");
    assert_eq!(bridge["type"], "STRICT_DNS", "resolve every bridge pod");
    let address = &bridge["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]
        ["address"]["socket_address"];
    let service = rendered.one("Service", "weir-bridge");
    assert_eq!(
        address["address"],
        format!(
            "{}.{}.svc.cluster.local",
            service.name(),
            service.namespace()
        )
    );
    assert_eq!(address["port_value"], service.spec()["ports"][0]["port"]);
    assert_eq!(service.spec()["clusterIP"], "None", "DNS gives every pod");
    // A draining bridge (/healthz 503 while it still serves) leaves the calls by the
    // health check, as envoy/envoy.yaml's cluster does.
    let check = &bridge["health_checks"][0];
    assert_eq!(check["http_health_check"]["path"], "/healthz");
    assert!(bridge["outlier_detection"].is_object());

    // The weir filter: its configuration, its code in the wasm volume, its secret.
    let config = weir_filter_config(&bootstrap);
    let json = config["configuration"]["value"].as_str().unwrap();
    weir_core::config::parse(json.as_bytes())
        .unwrap_or_else(|e| panic!("weir-check refuses the plugin config: {e}"));
    let plugin: Value = serde_json::from_str(json).unwrap();
    assert_eq!(plugin["bridge"]["cluster"], "weir_bridge");
    let (wasm_volume, wasm_dir) = envoy_mount(&rendered, "wasm");
    let filename = config["vm_config"]["code"]["local"]["filename"]
        .as_str()
        .unwrap();
    let key = filename
        .strip_prefix(&format!("{wasm_dir}/"))
        .unwrap_or_else(|| panic!("{filename} is not in the wasm volume {wasm_dir}"));
    assert_eq!(wasm_volume["configMap"]["name"], "weir-wasm");
    assert_eq!(
        key, "weir.wasm",
        "docs/kubernetes.md creates weir-wasm with this key"
    );
    let secret_env = plugin["bridge"]["secret_env"].as_str().expect("secret_env");
    assert_eq!(
        config["vm_config"]["environment_variables"]["host_env_keys"],
        serde_json::json!([secret_env])
    );
    let from = named(&envoy_container(&rendered)["env"], secret_env)
        .unwrap_or_else(|| panic!("the Envoy container does not set {secret_env}"))["valueFrom"]
        ["secretKeyRef"]
        .clone();
    let bridge_pod = &bridge_deployment(&rendered).spec()["template"]["spec"];
    let secret_file = named(
        &bridge_container(&rendered)["env"],
        "WEIR_BRIDGE_SECRET_FILE",
    )
    .and_then(|e| e["value"].as_str())
    .expect("the bridge reads a secret file");
    let mount = bridge_container(&rendered)["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| secret_file.starts_with(&format!("{}/", m["mountPath"].as_str().unwrap())))
        .expect("the secret file is in a mounted volume");
    let volume = named(&bridge_pod["volumes"], mount["name"].as_str().unwrap()).unwrap();
    assert_eq!(volume["secret"]["secretName"], from["name"], "one Secret");
    assert_eq!(
        secret_file.rsplit('/').next(),
        from["key"].as_str(),
        "the same key of it"
    );
    rendered.one("Secret", from["name"].as_str().unwrap());

    // A real Envoy loads it, with the module built here and the secret in its environment.
    bootstrap["static_resources"]["listeners"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .for_each(|l| {
            let filters = &mut l["filter_chains"][0]["filters"][0]["typed_config"]["http_filters"];
            for f in filters.as_array_mut().unwrap() {
                if f["name"] == "envoy.filters.http.wasm" {
                    f["typed_config"]["config"]["vm_config"]["code"]["local"]["filename"] =
                        Value::String(weir_wasm().to_string_lossy().into_owned());
                }
            }
        });
    let dir = TestDir::new("plain-envoy-validate");
    let path = dir.write("envoy.yaml", serde_yaml::to_string(&bootstrap).unwrap());
    if let Err(out) = Envoy::validate_with_env(&path, &[(secret_env, "s3cret")]) {
        panic!("envoy --mode validate refused the plain-envoy bootstrap:\n{out}");
    }
}

/// The listener of the bootstrap called `name`.
fn listener<'a>(bootstrap: &'a mut Value, name: &str) -> &'a mut Value {
    bootstrap["static_resources"]["listeners"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .find(|l| l["name"] == name)
        .unwrap_or_else(|| panic!("no listener {name}"))
}

/// The plain-envoy overlay running on loopback: its bootstrap with the addresses moved to
/// free ports on 127.0.0.1, the bridge's name (`localhost`, still resolved by STRICT_DNS)
/// and a direct response for the backend; its Envoy with the shared secret of its Secret in
/// the environment, the real bridge with the same Secret as its file. The container's
/// ports are the bootstrap's listeners, the readiness probe answers on the health listener,
/// the global rule's calls are accepted by the bridge (no 401), and the stats have weir's
/// labels.
#[test]
fn the_plain_envoy_overlay_serves_its_global_rule_through_the_bridge_with_the_shared_secret() {
    let rendered = render("plain-envoy");
    let mut bootstrap = plain_envoy_bootstrap(&rendered);
    let container = envoy_container(&rendered);
    let listener_port = |bootstrap: &mut Value, name: &str| {
        listener(bootstrap, name)["address"]["socket_address"]["port_value"]
            .as_u64()
            .unwrap()
    };
    assert_eq!(
        container_port(container, &Value::from("http")),
        listener_port(&mut bootstrap, "ingress"),
        "the container's http port is the ingress listener's"
    );
    let readiness = &container["readinessProbe"]["httpGet"];
    assert_eq!(
        container_port(container, &readiness["port"]),
        listener_port(&mut bootstrap, "health"),
        "the readiness probe goes to the health listener"
    );
    let service = rendered.one("Service", "weir-envoy");
    assert_eq!(
        container_port(container, &service.spec()["ports"][0]["targetPort"]),
        listener_port(&mut bootstrap, "ingress")
    );

    let secret = rendered.one("Secret", "weir-bridge-secret").value["stringData"]["secret"]
        .as_str()
        .unwrap()
        .to_string();
    let redis = RedisCluster::start(3, 0);
    let dir = TestDir::new("plain-envoy-secret");
    let secret_file = dir.write("secret", &secret);
    let bridge = Bridge::start(&redis, &["--secret-file", secret_file.to_str().unwrap()]);

    let (admin_port, http_port, health_port) = (free_port(), free_port(), free_port());
    bootstrap["admin"]["address"]["socket_address"]["port_value"] = admin_port.into();
    for (name, port) in [("ingress", http_port), ("health", health_port)] {
        listener(&mut bootstrap, name)["address"]["socket_address"] =
            serde_json::json!({ "address": "127.0.0.1", "port_value": port });
    }
    let ingress = listener(&mut bootstrap, "ingress");
    let hcm = &mut ingress["filter_chains"][0]["filters"][0]["typed_config"];
    hcm["route_config"]["virtual_hosts"][0]["routes"] = backend_routes();
    for filter in hcm["http_filters"].as_array_mut().unwrap() {
        if filter["name"] == "envoy.filters.http.wasm" {
            filter["typed_config"]["config"]["vm_config"]["code"]["local"]["filename"] =
                Value::String(weir_wasm().to_string_lossy().into_owned());
        }
    }
    let clusters = bootstrap["static_resources"]["clusters"]
        .as_array_mut()
        .unwrap();
    clusters.retain(|c| c["name"] != "backend");
    for cluster in clusters.iter_mut() {
        let name = cluster["name"].as_str().unwrap().to_string();
        let address = &mut cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]
            ["endpoint"]["address"]["socket_address"];
        match name.as_str() {
            "weir_bridge" => {
                *address = serde_json::json!({ "address": "localhost", "port_value": bridge.port })
            }
            "admin" => address["port_value"] = admin_port.into(),
            other => panic!("unexpected cluster {other}"),
        }
    }
    let yaml = serde_yaml::to_string(&bootstrap).unwrap();
    let envoy = Envoy::start_yaml_with_env(
        &yaml,
        admin_port,
        http_port,
        1,
        &[("WEIR_BRIDGE_SECRET", &secret)],
    );

    let probe = get(health_port, readiness["path"].as_str().unwrap(), &[]).unwrap();
    assert_eq!(probe.status, 200, "readiness on the health listener");
    for i in 0..30 {
        let r = get(envoy.http_port, "/api/items", &[("x-api-key", "k1")]).unwrap();
        assert_eq!(r.status, 200, "request {i}: {}", r.text());
    }
    let accepted = wait_until(Duration::from_secs(5), Duration::from_millis(100), || {
        bridge.metric_sum("weir_bridge_decisions_total", &[("rule", "api-key-hourly")]) > 0.0
    });
    assert!(
        accepted,
        "the bridge decided nothing for api-key-hourly; bridge metrics:\n{}\nenvoy log:\n{}",
        bridge.metrics(),
        envoy.log_tail(30)
    );
    assert_eq!(
        bridge.metric_sum("weir_bridge_requests_total", &[("code", "401")]),
        0.0,
        "the bridge refused the secret Envoy sent"
    );
    std::thread::sleep(WEIR_STATS_LAG);
    let stats = get(health_port, "/stats/prometheus", &[]).unwrap().text();
    assert!(
        stats.contains("weir_rule=\"api-key-hourly\""),
        "weir's rule label on the health listener's /stats/prometheus"
    );
}
