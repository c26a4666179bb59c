//! The root context: configuration, the shared seed, slot tables and metrics.
//!
//! `on_configure` runs in every VM of the process (a base VM on the main thread, then
//! one per worker), so everything here is idempotent: the seed is whatever the first
//! VM stored, tables that exist keep their state, metrics map to the same stats.
//! Returning `false` makes Envoy refuse the configuration (a static bootstrap does not
//! start; an LDS update is rejected and the old config keeps serving); the log line
//! says which field was wrong and why.

use crate::filter::Filter;
use crate::host::{self, LogLevel};
use crate::metrics::Metrics;
use crate::store::SharedData;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::ContextType;
use std::rc::Rc;
use weir_core::config;
use weir_core::engine::Engine;
use weir_core::store::Seed;

/// Largest plugin configuration read from the host.
const MAX_CONFIG_BYTES: usize = 1 << 20;

/// What every HTTP context of a VM shares once configured.
pub struct Plugin {
    pub engine: Engine,
    pub seed: Seed,
    pub metrics: Metrics,
}

pub struct Root {
    context_id: u32,
    plugin: Option<Rc<Plugin>>,
}

impl Root {
    pub fn new(context_id: u32) -> Self {
        Root {
            context_id,
            plugin: None,
        }
    }

    fn configure(&self) -> Result<Plugin, String> {
        let json = host::plugin_configuration(MAX_CONFIG_BYTES)
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
        let seed = Seed::load_or_create(&SharedData, fresh_seed()?)
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
        let names: Vec<&str> = engine
            .config
            .rules
            .iter()
            .map(|r| r.name.as_str())
            .collect();
        let mut tables = Vec::with_capacity(names.len());
        for i in 0..names.len() {
            let Some(table) = engine.table(i) else {
                continue;
            };
            let in_use = table.slots_in_use(&SharedData).unwrap_or(0);
            tables.push((table.capacity(), in_use));
        }
        let metrics =
            Metrics::define(&names, &tables).map_err(|e| format!("cannot define metrics: {e}"))?;
        Ok(Plugin {
            engine,
            seed,
            metrics,
        })
    }
}

fn fresh_seed() -> Result<[u8; 16], String> {
    let mut seed = [0u8; 16];
    getrandom::fill(&mut seed).map_err(|e| format!("no entropy for the hashing seed: {e}"))?;
    Ok(seed)
}

impl Context for Root {}

impl RootContext for Root {
    fn on_configure(&mut self, _plugin_configuration_size: usize) -> bool {
        match self.configure() {
            Ok(plugin) => {
                if host::log_enabled(LogLevel::Info) {
                    let rules: Vec<String> = plugin
                        .engine
                        .config
                        .rules
                        .iter()
                        .map(|r| {
                            format!(
                                "{} ({} {}, max_keys {})",
                                r.name,
                                if r.is_global() { "global" } else { "local" },
                                r.kind(),
                                r.max_keys
                            )
                        })
                        .collect();
                    host::log(
                        LogLevel::Info,
                        &format!(
                            "weir #{}: configured {} rules: {}",
                            self.context_id,
                            rules.len(),
                            rules.join(", ")
                        ),
                    );
                }
                self.plugin = Some(Rc::new(plugin));
                // Idle workers send their pending metric increments on the tick.
                let period = (crate::metrics::FLUSH_INTERVAL_US / 1_000) as u32;
                if let Err(e) = host::set_tick_period_ms(period) {
                    host::log(
                        LogLevel::Warn,
                        &format!("weir: no tick ({e}); idle workers report stats late"),
                    );
                }
                true
            }
            Err(message) => {
                host::log(LogLevel::Error, &format!("weir: {message}"));
                false
            }
        }
    }

    fn on_tick(&mut self) {
        if let (Some(plugin), Ok(now_us)) = (&self.plugin, host::now_us()) {
            plugin.metrics.flush(now_us);
        }
    }

    fn create_http_context(&self, context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(Filter::new(context_id, self.plugin.clone())))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}
