//! What a VM holds once configured: the compiled engine, the hashing seed and the metrics,
//! shared by every HTTP context of the VM.
//!
//! `configure` runs in every VM of the process (a base VM on the main thread, then one
//! per worker), so everything here is idempotent: the seed is whatever the first VM
//! stored, tables that exist keep their state, metrics map to the same stats.

use crate::host;
use crate::metrics::Metrics;
use crate::store::SharedData;
use std::cell::Cell;
use weir_core::bounds::MAX_CONFIG_BYTES;
use weir_core::config;
use weir_core::engine::Engine;
use weir_core::key::Seed;
use weir_core::rules::Rule;
use weir_core::store::seed;

/// The most sets of a table read at configure time to estimate its `slots_in_use`
/// gauge: a table of a million keys costs this many host calls, not 250,000.
const GAUGE_SAMPLE_SETS: u32 = 256;

pub struct Plugin {
    pub engine: Engine,
    /// The process's hashing seed; replaced if a racing VM's seed is the one stored
    /// (see `weir_core::store::seed`).
    pub seed: Cell<Seed>,
    pub metrics: Metrics,
}

impl Plugin {
    /// Reads, compiles and prepares the plugin configuration. The error is the line to
    /// log: it names the field and the value that were wrong.
    pub fn configure() -> Result<Plugin, String> {
        // One byte more than allowed, so that a config that is too large gets the size
        // message, not a parse error at the cut.
        let json = host::plugin_configuration(MAX_CONFIG_BYTES + 1)
            .map_err(|e| format!("cannot read the plugin configuration: {e}"))?
            .unwrap_or_default();
        let mut config = config::parse(&json).map_err(|e| format!("invalid configuration: {e}"))?;
        if let Some(bridge) = config.bridge.as_mut() {
            if let Some(name) = &bridge.secret_env {
                // WASI's environment: Envoy's `vm_config.environment_variables`.
                match std::env::var(name) {
                    Ok(secret) if !secret.is_empty() => bridge.secret = Some(secret),
                    _ => {
                        return Err(format!(
                            "invalid configuration: bridge.secret_env: the environment variable {name:?} is \
                             not set in the Wasm VM (set it in vm_config.environment_variables)"
                        ))
                    }
                }
            }
        }
        let seed = seed::load_or_create(&SharedData, fresh_seed()?)
            .map_err(|e| format!("cannot share the hashing seed: {e}"))?;
        // Envoy's plugin name (the filter's `config.name`; in Istio the WasmPlugin's
        // namespace.name) keeps the tables of two plugins in one VM apart.
        let plugin_name = host::property(&["plugin_name".to_string()])
            .ok()
            .flatten()
            .and_then(|name| String::from_utf8(name).ok())
            .unwrap_or_default();
        let engine = Engine::with_namespace(config, &plugin_name);
        engine
            .prepare(&SharedData)
            .map_err(|e| format!("cannot create the slot tables: {e}"))?;
        let rules: Vec<(&str, u64, u64)> = engine
            .config
            .rules
            .iter()
            .map(|rule| {
                let in_use = engine
                    .estimate_slots_in_use(rule.id, &SharedData, GAUGE_SAMPLE_SETS)
                    .unwrap_or(0);
                (rule.name.as_str(), engine.capacity(rule.id), in_use)
            })
            .collect();
        let metrics = Metrics::define(&rules).map_err(|e| format!("cannot define metrics: {e}"))?;
        Ok(Plugin {
            engine,
            seed: Cell::new(seed),
            metrics,
        })
    }

    /// The rules as the configure log line lists them.
    pub fn summary(&self) -> String {
        let describe = |r: &Rule| {
            format!(
                "{} ({} {}, max_keys {})",
                r.name,
                if r.is_global() { "global" } else { "local" },
                r.kind(),
                r.max_keys
            )
        };
        let rules: Vec<String> = self.engine.config.rules.iter().map(describe).collect();
        format!("configured {} rules: {}", rules.len(), rules.join(", "))
    }

    /// Periodic work of the VM: send pending metrics, adopt the stored seed if a racing
    /// VM's replaced ours. Returns whether the seed changed.
    pub fn on_tick(&self, now_us: u64) -> bool {
        self.metrics.flush(now_us);
        match seed::reload(&SharedData, self.seed.get()) {
            Ok(Some(stored)) => {
                self.seed.set(stored);
                true
            }
            _ => false,
        }
    }
}

fn fresh_seed() -> Result<[u8; 16], String> {
    let mut seed = [0u8; 16];
    getrandom::fill(&mut seed).map_err(|e| format!("no entropy for the hashing seed: {e}"))?;
    Ok(seed)
}
