//! The root context of one plugin: configuration, the tick, and the plugin every request
//! context of the plugin shares.
//!
//! A configuration that fails makes Envoy refuse it (a static bootstrap does not start;
//! an LDS update is rejected and the old config keeps serving); the log line says which
//! field was wrong and why. Envoy prefixes every line with the plugin's name, so ours
//! carry only the context.

use super::host::{self, Host, LogLevel};
use super::plugin::{Plugin, SLOW_TICK_MS};
use super::request::Request;
use std::rc::Rc;

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

    fn log<H: Host>(&self, host: &H, level: LogLevel, message: &str) {
        host::log(host, self.context_id, level, || message.to_string());
    }

    /// Compiles the plugin configuration; false when Envoy should refuse it.
    pub fn on_configure<H: Host>(&mut self, host: &H) -> bool {
        host.refresh_log_level();
        match Plugin::configure(host) {
            Ok(plugin) => {
                self.log(host, LogLevel::Info, &plugin.summary());
                // What loads but is likely wrong: as `weir-check` warns of it.
                if let Some(warning) = plugin
                    .engine
                    .config
                    .bridge
                    .as_ref()
                    .and_then(|b| b.timeout_warning())
                {
                    self.log(host, LogLevel::Warn, &warning);
                }
                if let Some(old) = &self.plugin {
                    old.retire(host);
                }
                self.plugin = Some(Rc::new(plugin));
                // Idle workers send their pending metric increments on the tick, and
                // every VM checks that it hashes with the stored seed.
                if let Err(e) = host.set_tick_period_ms(SLOW_TICK_MS) {
                    self.log(
                        host,
                        LogLevel::Warn,
                        &format!("no tick ({e}); idle workers report stats late"),
                    );
                }
                true
            }
            Err(message) => {
                self.log(host, LogLevel::Error, &message);
                false
            }
        }
    }

    /// The plugin's periodic work: stats, the seed, places of concurrency rules.
    pub fn on_tick<H: Host>(&self, host: &H) {
        host.refresh_log_level();
        if let (Some(plugin), Ok(now)) = (&self.plugin, host.now()) {
            if plugin.on_tick(host, now) {
                self.log(
                    host,
                    LogLevel::Warn,
                    "another VM's hashing seed is the stored one; using it from now on",
                );
            }
        }
    }

    /// A new request's context.
    pub fn new_request(&self, context_id: u32) -> Request {
        Request::new(context_id, self.plugin.clone())
    }

    pub fn plugin(&self) -> Option<&Rc<Plugin>> {
        self.plugin.as_ref()
    }
}
