//! Logs to stderr, text or JSON, with warnings and errors rate-limited.
//!
//! When Redis is down every request fails, and the cluster client logs each of its
//! reconnect attempts (dozens per request): thousands of lines a second that say the same
//! thing. Warnings and errors are therefore let through at most [`BURST`] per second per
//! target (module); the first ones, which carry the cause (connection refused, a bad
//! certificate), always show. Info and below are not limited.

use std::collections::HashMap;
use std::io::IsTerminal;
use std::sync::{Mutex, PoisonError};
use std::time::Instant;
use tracing::{Event, Level, Metadata};
use tracing_subscriber::filter::{EnvFilter, FilterExt};
use tracing_subscriber::layer::{Context, Filter, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::Layer;

use crate::settings::LogFormat;

/// Warnings and errors let through per second and target.
pub const BURST: u32 = 5;

/// Counts warnings per target in one-second buckets.
#[derive(Debug, Default)]
pub struct WarnLimiter {
    seen: Mutex<HashMap<String, (u64, u32)>>,
}

impl WarnLimiter {
    /// Whether an event of `level` from `target` in second `second` may be logged.
    pub fn allow(&self, target: &str, level: Level, second: u64) -> bool {
        if level > Level::WARN {
            return true;
        }
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        let entry = match seen.get_mut(target) {
            Some(entry) => entry,
            None => seen.entry(target.to_string()).or_insert((second, 0)),
        };
        if entry.0 != second {
            *entry = (second, 0);
        }
        entry.1 += 1;
        entry.1 <= BURST
    }
}

/// The limiter as a per-layer filter. Decided per event (`event_enabled`), so that the
/// interest tracing caches per callsite does not bypass it.
struct LimitWarnings {
    limiter: WarnLimiter,
    started: Instant,
}

impl<S> Filter<S> for LimitWarnings {
    fn enabled(&self, _meta: &Metadata<'_>, _cx: &Context<'_, S>) -> bool {
        true
    }

    fn event_enabled(&self, event: &Event<'_>, _cx: &Context<'_, S>) -> bool {
        let meta = event.metadata();
        self.limiter.allow(
            meta.target(),
            *meta.level(),
            self.started.elapsed().as_secs(),
        )
    }
}

/// Installs the global subscriber. `filter` is `EnvFilter` syntax (`info,redis=warn`).
pub fn init(format: LogFormat, filter: &str) {
    let env_filter = EnvFilter::try_new(filter).unwrap_or_else(|_| EnvFilter::new("info"));
    let filter = env_filter.and(LimitWarnings {
        limiter: WarnLimiter::default(),
        started: Instant::now(),
    });
    let ansi = std::io::stderr().is_terminal();
    let layer = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(ansi);
    let layer = match format {
        LogFormat::Text => layer.with_filter(filter).boxed(),
        LogFormat::Json => layer.json().with_filter(filter).boxed(),
    };
    tracing_subscriber::registry().with(layer).init();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warnings_are_limited_per_target_and_second() {
        let l = WarnLimiter::default();
        let allowed = (0..20).filter(|_| l.allow("redis", Level::WARN, 7)).count();
        assert_eq!(allowed, BURST as usize);
        assert!(
            l.allow("weir_bridge::app", Level::ERROR, 7),
            "another target"
        );
        assert!(l.allow("redis", Level::INFO, 7), "info is not limited");
        assert!(l.allow("redis", Level::ERROR, 8), "a new second");
    }
}
