//! The root context of one plugin: configuration, the tick, and the plugin every HTTP
//! context of the plugin shares.
//!
//! Returning `false` from `on_configure` makes Envoy refuse the configuration (a static
//! bootstrap does not start; an LDS update is rejected and the old config keeps serving);
//! the log line says which field was wrong and why. Envoy prefixes every line with the
//! plugin's name, so ours carry only the context.

use crate::filter::Filter;
use crate::host::{self, LogLevel};
use crate::plugin::Plugin;
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

    fn log(&self, level: LogLevel, message: &str) {
        if host::log_enabled(level) {
            host::log(level, &format!("#{}: {message}", self.context_id));
        }
    }
}

impl Root {
    pub fn on_configure(&mut self) -> bool {
        host::refresh_log_level();
        match Plugin::configure() {
            Ok(plugin) => {
                self.log(LogLevel::Info, &plugin.summary());
                self.plugin = Some(Rc::new(plugin));
                // Idle workers send their pending metric increments on the tick, and
                // every VM checks that it hashes with the stored seed.
                if let Err(e) = host::set_tick_period_ms(crate::plugin::SLOW_TICK_MS) {
                    self.log(
                        LogLevel::Warn,
                        &format!("no tick ({e}); idle workers report stats late"),
                    );
                }
                true
            }
            Err(message) => {
                self.log(LogLevel::Error, &message);
                false
            }
        }
    }

    pub fn on_tick(&mut self) {
        host::refresh_log_level();
        if let (Some(plugin), Ok(now_us)) = (&self.plugin, host::now_us()) {
            if plugin.on_tick(now_us) {
                self.log(
                    LogLevel::Warn,
                    "another VM's hashing seed is the stored one; using it from now on",
                );
            }
        }
    }

    /// A new request's context.
    pub fn new_filter(&self, context_id: u32) -> Filter {
        Filter::new(context_id, self.plugin.clone())
    }

    pub fn plugin(&self) -> Option<&Rc<Plugin>> {
        self.plugin.as_ref()
    }
}
