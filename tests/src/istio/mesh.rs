//! What istiod knows about the mesh: the resources it sees, and the conventions a shipped
//! plugin follows.

use serde_json::Value;

use super::{Phase, Plugin, Resource, ISTIO_JWT_METADATA_KEY};

/// The resources istiod would see: the shipped ones, plus those of the text under test.
pub struct Mesh {
    pub resources: Vec<Resource>,
}

impl Mesh {
    /// The Istio outbound cluster names of every shipped Service port.
    pub fn outbound_clusters(&self) -> Vec<String> {
        let mut out = Vec::new();
        for r in self.resources.iter().filter(|r| r.kind() == "Service") {
            for port in r.spec()["ports"].as_array().into_iter().flatten() {
                out.push(format!(
                    "outbound|{}||{}.{}.svc.cluster.local",
                    port["port"],
                    r.name(),
                    r.namespace()
                ));
            }
        }
        out
    }

    /// The `trafficPolicy.outlierDetection` of the DestinationRule for an outbound
    /// cluster's host, set on `cluster` as istiod translates it (pilot's
    /// `applyOutlierDetection`): success-rate ejection off, a count of 0 turns its
    /// ejection off, local-origin failures counted apart when split, and the panic
    /// threshold at `minHealthPercent` (0 unless set). Other traffic policies are not
    /// rendered.
    pub fn apply_destination_rule(&self, cluster: &mut Value) {
        let host = cluster["name"]
            .as_str()
            .and_then(|name| name.rsplit("||").next())
            .unwrap_or("")
            .to_string();
        let Some(rule) = self
            .resources
            .iter()
            .find(|r| r.kind() == "DestinationRule" && r.spec()["host"] == host.as_str())
        else {
            return;
        };
        let outlier = &rule.spec()["trafficPolicy"]["outlierDetection"];
        if outlier.is_null() {
            return;
        }
        let mut out = serde_json::json!({ "enforcing_success_rate": 0 });
        let count = |name: &str, count_field: &str, enforcing_field: &str, out: &mut Value| {
            if let Some(n) = outlier[name].as_u64() {
                out[count_field] = n.into();
                out[enforcing_field] = (if n > 0 { 100 } else { 0 }).into();
            }
        };
        count(
            "consecutive5xxErrors",
            "consecutive_5xx",
            "enforcing_consecutive_5xx",
            &mut out,
        );
        count(
            "consecutiveGatewayErrors",
            "consecutive_gateway_failure",
            "enforcing_consecutive_gateway_failure",
            &mut out,
        );
        for (from, to) in [
            ("interval", "interval"),
            ("baseEjectionTime", "base_ejection_time"),
            ("maxEjectionPercent", "max_ejection_percent"),
        ] {
            if !outlier[from].is_null() {
                out[to] = outlier[from].clone();
            }
        }
        if outlier["splitExternalLocalOriginErrors"] == true {
            out["split_external_local_origin_errors"] = true.into();
            if let Some(n) = outlier["consecutiveLocalOriginFailures"]
                .as_u64()
                .filter(|&n| n > 0)
            {
                out["consecutive_local_origin_failure"] = n.into();
                out["enforcing_consecutive_local_origin_failure"] = 100.into();
            }
            out["enforcing_local_origin_success_rate"] = 0.into();
        }
        cluster["outlier_detection"] = out;
        let min_health = outlier["minHealthPercent"].as_u64().unwrap_or(0);
        cluster["common_lb_config"] =
            serde_json::json!({ "healthy_panic_threshold": { "value": min_health } });
    }

    /// The RequestAuthentications that select the plugin's workload (same namespace, or
    /// mesh-wide in istio-system without a selector; selector labels all present).
    pub fn request_authentications(&self, plugin: &Plugin) -> Vec<&Resource> {
        self.resources
            .iter()
            .filter(|r| r.kind() == "RequestAuthentication")
            .filter(|r| {
                let selector = r.selector();
                let same_ns = r.namespace() == plugin.namespace;
                let mesh_wide = r.namespace() == "istio-system" && selector.is_empty();
                (same_ns || mesh_wide)
                    && selector
                        .iter()
                        .all(|(k, v)| plugin.selector.get(k) == Some(v))
            })
            .collect()
    }
}

/// The Istio conventions a shipped plugin must follow beyond the filter's own checks.
pub fn check_istio_conventions(plugin: &Plugin, mesh: &Mesh) {
    let at = &plugin.label;
    let config = plugin.json_value();
    if let Some(bridge) = config.get("bridge") {
        let cluster = bridge["cluster"].as_str().unwrap_or("");
        let known = mesh.outbound_clusters();
        assert!(
            known.iter().any(|c| c == cluster),
            "{at}: bridge.cluster {cluster:?} is not the outbound cluster of a shipped Service \
             (Istio names them outbound|PORT||NAME.NAMESPACE.svc.cluster.local): {known:?}"
        );
        // Without `authority` the filter uses HOST:PORT of the outbound cluster.
        if let Some(authority) = bridge["authority"].as_str() {
            let host = cluster.rsplit("||").next().unwrap_or("");
            assert_eq!(authority, host, "{at}: bridge.authority");
        }
    }
    let uses_jwt = config["rules"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|rule| rule["key"].as_array().into_iter().flatten())
        .filter(|part| part.get("jwt_claim").is_some())
        .inspect(|part| {
            assert_eq!(
                part["jwt_metadata_key"], ISTIO_JWT_METADATA_KEY,
                "{at}: Istio 1.21+ writes verified JWT payloads under \"payload\""
            )
        })
        .count()
        > 0;
    if uses_jwt {
        assert!(
            !mesh.request_authentications(plugin).is_empty(),
            "{at}: keys on a JWT claim but no shipped RequestAuthentication selects {:?} in {}",
            plugin.selector,
            plugin.namespace
        );
        assert_ne!(
            plugin.phase,
            Phase::Authn,
            "{at}: phase AUTHN runs before jwt_authn: the claims are not there yet"
        );
    }
}
