//! Envoy stats for every decision, defined from their declarations in [`crate::stats`].
//!
//! Envoy shows them as `wasmcustom.weir.<plugin>.…` in `/stats` and without the
//! `wasmcustom.` prefix in `/stats/prometheus`; with the `stats_tags` weir ships
//! (envoy/envoy.yaml, docs/operations.md) the plugin and rule names become the labels
//! `weir_plugin` and `weir_rule`. `<plugin>` is Envoy's plugin name (characters other
//! than `A-Z a-z 0-9 _ -` become `_`), so two plugins sharing a VM count apart. Every
//! worker defines the same names, which Envoy maps to the same stats, so the counters
//! are process-wide.
//!
//! Per rule, `weir.<plugin>.rule.<name>.<stat>` ([`crate::stats::rule_stats`]: `allowed`,
//! `limited`, `store_errors`, `lease_hits`, `delayed`, `commit_usage_read`, …); for the
//! plugin, `weir.<plugin>.store.<stat>` (shared data: `cas_retries`, `cas_give_ups`,
//! `slot_takeovers`), `weir.<plugin>.bridge.<stat>` (the calls to weir-bridge: `calls`,
//! `joined`, `refused`, `resent`, `skipped`, `errors_*` and the histogram `latency_us`)
//! and `weir.<plugin>.vm.<stat>` (`buffer_full`, and what crossed the boundary between
//! the VM and Envoy, counted by every VM of the plugin: `host_calls`, `calls.<kind>`,
//! `entries`, `bytes_in`, `bytes_out`; with two plugins in one VM, each counts the VM's).
//! docs/operations.md has the table of them all, rendered from the declarations.
//!
//! Which are defined is decided here, once, where each is defined: a stat above the
//! level of its rule (or of the plugin, for plugin-wide ones) or declared for other
//! rules is never defined with Envoy, and its handle is off: recording it does nothing,
//! so the code that records a stat does not ask whether it exists. Recording a stat
//! declared for other rules is a mistake in the declarations, which debug builds (and
//! so the core's tests) assert.
//!
//! Counting a request costs no host call: increments are kept in the VM and sent every
//! [`FLUSH_INTERVAL`] — by the next request after that, or by the root context's tick
//! when the worker is idle — so stats lag traffic by at most about a tenth of a second.

/// What a decision, a bridge call, a held request or a settled commit records.
mod recording;

use super::host::{BoundaryCounts, CallKind, Host, HostResult, MetricType};
use crate::config::Config;
use crate::rules::{Rule, RuleId};
use crate::stats::{Applies, Group, StatKind, StatsLevel};
use crate::time::{Micros, Span};
use crate::usage::settlement::SettleReason;
use std::cell::Cell;

/// How often increments kept in the VM are sent to Envoy.
pub const FLUSH_INTERVAL: Span = Span::from_millis(100);

/// A worker records a bridge call's latency (`bridge.latency_us`) at most once in this
/// span: every call below 1,000 calls a second per worker, a sample of one a
/// millisecond above that (a host call saved on the others). Its quantiles are what the
/// alerts and the dashboard read; its count is not the calls' (`bridge.calls` is).
pub const LATENCY_RECORD_EVERY: Span = Span::from_millis(1);

/// A stat's handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stat {
    /// Defined with Envoy: its index among the VM's pending increments.
    On(usize),
    /// Above its rule's (or the plugin's) level: not defined, recording it does nothing.
    Off,
    /// Declared for other rules ([`Applies`]), or for a plugin without a bridge: not
    /// defined, and never recorded.
    NotDeclared,
}

/// Whether a stat of `level` that applies (or not) is defined at `at`.
fn presence(applies: bool, level: StatsLevel, at: StatsLevel) -> Presence {
    match (applies, at.includes(level)) {
        (false, _) => Presence::NotDeclared,
        (true, false) => Presence::Off,
        (true, true) => Presence::On,
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Presence {
    On,
    Off,
    NotDeclared,
}

/// A rule's stats: one handle per declaration of [`crate::stats::rule_stats`].
macro_rules! rule_stat_set {
    ($($field:ident $(= $name:literal)?: $kind:ident, $level:ident, $applies:ident, $doc:literal;)*) => {
        #[derive(Debug)]
        struct RuleStatSet {
            $(#[doc = $doc] $field: Stat,)*
        }

        impl RuleStatSet {
            fn define<H: Host>(
                r: &mut Registry<'_, H>,
                prefix: &str,
                rule: &Rule,
                level: StatsLevel,
            ) -> HostResult<RuleStatSet> {
                Ok(RuleStatSet {
                    $($field: r.define(
                        StatKind::$kind,
                        &format!("{prefix}.{}", crate::stats::stat_name!($field $($name)?)),
                        presence(rule.has_stats(Applies::$applies), StatsLevel::$level, level),
                    )?,)*
                })
            }
        }
    };
}
crate::stats::rule_stats!(rule_stat_set);

/// The plugin-wide stats: a struct per group (`Store`, `Bridge`, `Vm`), one handle per
/// declaration of [`crate::stats::plugin_stats`].
macro_rules! plugin_stat_sets {
    ($($group:ident($variant:ident) {
        $($field:ident $(= $name:literal)?: $kind:ident, $level:ident, $doc:literal;)*
    })*) => {
        $(
            #[derive(Debug)]
            struct $variant {
                $(#[doc = $doc] $field: Stat,)*
            }

            impl $variant {
                fn define<H: Host>(
                    r: &mut Registry<'_, H>,
                    base: &str,
                    level: StatsLevel,
                    declared: bool,
                ) -> HostResult<$variant> {
                    Ok($variant {
                        $($field: r.define(
                            StatKind::$kind,
                            &format!(
                                "{base}.{}.{}",
                                stringify!($group),
                                crate::stats::stat_name!($field $($name)?)
                            ),
                            presence(declared, StatsLevel::$level, level),
                        )?,)*
                    })
                }
            }
        )*

        #[derive(Debug)]
        struct PluginStats {
            $($group: $variant,)*
        }

        impl PluginStats {
            /// `declared`: whether the plugin has the stats of a group (the bridge's only
            /// with a bridge).
            fn define<H: Host>(
                r: &mut Registry<'_, H>,
                base: &str,
                level: StatsLevel,
                declared: impl Fn(Group) -> bool,
            ) -> HostResult<PluginStats> {
                Ok(PluginStats {
                    $($group: $variant::define(r, base, level, declared(Group::$variant))?,)*
                })
            }
        }
    };
}
crate::stats::plugin_stats!(plugin_stat_sets);

impl Vm {
    /// The `vm.calls.<kind>` counter of `kind`.
    fn calls(&self, kind: CallKind) -> Stat {
        match kind {
            CallKind::Clock => self.calls_clock,
            CallKind::Header => self.calls_header,
            CallKind::Body => self.calls_body,
            CallKind::SharedGet => self.calls_shared_get,
            CallKind::SharedSet => self.calls_shared_set,
            CallKind::Property => self.calls_property,
            CallKind::Dispatch => self.calls_dispatch,
            CallKind::Stream => self.calls_stream,
            CallKind::Stats => self.calls_stats,
            CallKind::Log => self.calls_log,
            CallKind::Tick => self.calls_tick,
        }
    }
}

impl RuleStatSet {
    /// The counter of settlements for `reason`.
    fn commit_reason(&self, reason: SettleReason) -> Stat {
        match reason {
            SettleReason::Usage => self.commit_usage_read,
            SettleReason::UpstreamError => self.commit_on_error,
            SettleReason::NoUsage => self.commit_no_usage,
            SettleReason::TooLarge => self.commit_over_max_bytes,
            SettleReason::Compressed => self.commit_compressed,
            SettleReason::Aborted => self.commit_aborted,
            SettleReason::LocalReply => self.commit_local_reply,
            SettleReason::NotForwarded => self.commit_not_forwarded,
        }
    }
}

#[derive(Debug)]
struct RuleMetrics {
    stats: RuleStatSet,
    /// A global rule's: its outstanding units are in shared data, where other workers
    /// spend them (see [`Metrics::drain_outstanding`]).
    outstanding_shared: bool,
}

/// What [`Metrics::define`] needs to know of a rule.
pub struct RuleStats<'a> {
    pub rule: &'a Rule,
    pub capacity: u64,
    /// Slots already in use (tables survive config reloads; an estimate for large ones).
    pub in_use: u64,
    /// The rule's limit in units (`Engine::limit_units`), set once as a gauge.
    pub limit_units: u64,
}

#[derive(Debug)]
pub struct Metrics {
    /// Host metric id and the increment not yet sent, per stat defined.
    pending: Vec<(u32, Cell<i64>)>,
    last_flush: Cell<Micros>,
    /// When this worker last recorded a bridge call's latency
    /// ([`LATENCY_RECORD_EVERY`] apart at the least).
    last_latency: Cell<Micros>,
    rules: Vec<RuleMetrics>,
    plugin: PluginStats,
    /// [`Host::counts`] at the last flush.
    counted: Cell<BoundaryCounts>,
}

/// Defines host metrics and hands out their [`Stat`]s.
struct Registry<'h, H> {
    host: &'h H,
    pending: Vec<(u32, Cell<i64>)>,
}

impl<H: Host> Registry<'_, H> {
    fn define(&mut self, kind: StatKind, name: &str, presence: Presence) -> HostResult<Stat> {
        match presence {
            Presence::Off => return Ok(Stat::Off),
            Presence::NotDeclared => return Ok(Stat::NotDeclared),
            Presence::On => {}
        }
        let metric_type = match kind {
            StatKind::Counter => MetricType::Counter,
            StatKind::Gauge => MetricType::Gauge,
            StatKind::Histogram => MetricType::Histogram,
        };
        let id = self.host.define_metric(metric_type, name)?;
        self.pending.push((id, Cell::new(0)));
        Ok(Stat::On(self.pending.len() - 1))
    }

    /// Sets a gauge (or records a histogram's value) now.
    fn record(&self, stat: Stat, value: u64) -> HostResult<()> {
        match stat {
            Stat::On(i) => match self.pending.get(i) {
                Some((id, _)) => self.host.record_metric(*id, value),
                None => Ok(()),
            },
            Stat::Off | Stat::NotDeclared => Ok(()),
        }
    }
}

impl Metrics {
    /// Defines the metrics of `plugin` that `config`'s levels hold, with `rules` in
    /// config order.
    pub fn define<H: Host>(
        host: &H,
        plugin: &str,
        config: &Config,
        rules: &[RuleStats<'_>],
    ) -> HostResult<Metrics> {
        let mut r = Registry {
            host,
            pending: Vec::new(),
        };
        let base = format!("weir.{}", stat_segment(plugin));
        let mut defined = Vec::with_capacity(rules.len());
        for rule in rules {
            let prefix = format!("{base}.rule.{}", rule.rule.name);
            let stats =
                RuleStatSet::define(&mut r, &prefix, rule.rule, config.stats_level(rule.rule))?;
            r.record(stats.limit_units, rule.limit_units)?;
            r.record(stats.slots_capacity, rule.capacity)?;
            r.record(stats.slots_in_use, rule.in_use)?;
            defined.push(RuleMetrics {
                stats,
                outstanding_shared: rule.rule.is_global(),
            });
        }
        let has_bridge = config.bridge.is_some();
        let plugin = PluginStats::define(&mut r, &base, config.stats, |group| {
            group != Group::Bridge || has_bridge
        })?;
        Ok(Metrics {
            pending: r.pending,
            last_flush: Cell::new(Micros::ZERO),
            last_latency: Cell::new(Micros::ZERO),
            rules: defined,
            plugin,
            counted: Cell::new(host.counts()),
        })
    }

    /// How many stats were defined with Envoy.
    pub fn defined(&self) -> usize {
        self.pending.len()
    }

    /// The stats of rule `id`.
    fn rule(&self, id: RuleId) -> Option<&RuleStatSet> {
        self.rules.get(id.index()).map(|r| &r.stats)
    }

    fn bump(&self, stat: Stat, by: i64) {
        match stat {
            Stat::On(i) => {
                if let Some((_, delta)) = self.pending.get(i) {
                    delta.set(delta.get().saturating_add(by));
                }
            }
            Stat::Off => {}
            Stat::NotDeclared => debug_assert!(
                by == 0,
                "a stat recorded where crate::stats does not declare it (its Applies)"
            ),
        }
    }

    /// Sets a gauge, or records a histogram's value, now.
    fn set<H: Host>(&self, host: &H, stat: Stat, value: u64) {
        match stat {
            Stat::On(i) => {
                if let Some((id, _)) = self.pending.get(i) {
                    // A stat that cannot be recorded is not worth failing anything for.
                    let _ = host.record_metric(*id, value);
                }
            }
            Stat::Off => {}
            Stat::NotDeclared => debug_assert!(
                false,
                "a stat recorded where crate::stats does not declare it (its Applies)"
            ),
        }
    }

    /// Sends the increments kept since the last flush.
    pub fn flush<H: Host>(&self, host: &H, now: Micros) {
        self.last_flush.set(now);
        let now_counted = host.counts();
        let before = self.counted.replace(now_counted);
        let delta = |now: u64, then: u64| i64::try_from(now.wrapping_sub(then)).unwrap_or(i64::MAX);
        let vm = &self.plugin.vm;
        self.bump(
            vm.host_calls,
            delta(now_counted.total_calls(), before.total_calls()),
        );
        for kind in CallKind::ALL {
            let (now, then) = (now_counted.calls, before.calls);
            if let (Some(now), Some(then)) = (now.get(kind.index()), then.get(kind.index())) {
                self.bump(vm.calls(kind), delta(*now, *then));
            }
        }
        self.bump(vm.entries, delta(now_counted.entries, before.entries));
        self.bump(vm.bytes_in, delta(now_counted.bytes_in, before.bytes_in));
        self.bump(vm.bytes_out, delta(now_counted.bytes_out, before.bytes_out));
        for stat in 0..self.pending.len() {
            // A stat that cannot be incremented is not worth failing anything for.
            self.send_now(host, Stat::On(stat));
        }
    }

    fn flush_if_due<H: Host>(&self, host: &H, now: Micros) {
        if now.saturating_sub(self.last_flush.get()) >= FLUSH_INTERVAL {
            self.flush(host, now);
        }
    }

    /// Sends one stat's pending increment now.
    fn send_now<H: Host>(&self, host: &H, stat: Stat) {
        let Stat::On(i) = stat else {
            return;
        };
        if let Some((id, delta)) = self.pending.get(i) {
            let by = delta.replace(0);
            if by != 0 {
                let _ = host.increment_metric(*id, by);
            }
        }
    }
}

/// A plugin name as one segment of a stat name: characters other than `A-Z a-z 0-9 _ -`
/// (an Istio WasmPlugin's `namespace.name` has a dot) become `_`; no name is `default`.
pub fn stat_segment(name: &str) -> String {
    if name.is_empty() {
        return "default".to_string();
    }
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
}
