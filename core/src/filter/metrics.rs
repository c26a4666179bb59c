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

use super::host::{BoundaryCounts, CallKind, Host, HostResult, MetricType};
use crate::config::Config;
use crate::engine::{
    Adapted, BridgeError, Delayed, Evaluation, Expired, FailureOutcome, RuleOutcome, Source,
};
use crate::rules::{Rule, RuleId};
use crate::stats::{Applies, Group, StatKind, StatsLevel};
use crate::store::{Placement, UpdateError};
use crate::time::Micros;
use crate::usage::settlement::SettleReason;
use crate::wire::ReplyError;
use std::cell::Cell;

/// How often increments kept in the VM are sent to Envoy.
pub const FLUSH_INTERVAL: Micros = Micros::from_millis(100);

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

    /// A body (or more of one) did not fit in the VM's `max_buffered_bytes`.
    pub fn buffer_full(&self) {
        self.bump(self.plugin.vm.buffer_full, 1);
    }

    pub fn bridge_call(&self) {
        self.bump(self.plugin.bridge.calls, 1);
    }

    /// A request waited on another request's call.
    pub fn bridge_joined(&self) {
        self.bump(self.plugin.bridge.joined, 1);
    }

    /// Envoy refused a call at once (its circuit breaker, or a cluster without hosts):
    /// not counted in `calls`.
    pub fn bridge_refused(&self) {
        self.bump(self.plugin.bridge.refused, 1);
    }

    /// A call Envoy could not deliver was sent once more (also counted in `calls`).
    pub fn bridge_resent(&self) {
        self.bump(self.plugin.bridge.resent, 1);
    }

    pub fn bridge_latency<H: Host>(&self, host: &H, latency: Micros) {
        self.set(host, self.plugin.bridge.latency_us, latency.us());
    }

    /// A rule held a request instead of denying it.
    pub fn delay_held(&self, rule: RuleId) {
        if let Some(rule) = self.rule(rule) {
            self.bump(rule.delayed, 1);
        }
    }

    /// A held request was released (on time or late).
    pub fn delay_released(&self, delayed: &Delayed) {
        if let Some(rule) = self.rule(delayed.rule) {
            let waited = i64::try_from(delayed.waited.us()).unwrap_or(i64::MAX);
            self.bump(rule.delay_waited_us, waited);
            if delayed.late {
                self.bump(rule.delay_late, 1);
            }
        }
    }

    /// A held request went away (the client left, or the plugin shut down) before its
    /// release; its place in the schedule is not given back.
    pub fn delay_abandoned(&self, rule: RuleId) {
        if let Some(rule) = self.rule(rule) {
            self.bump(rule.delay_abandoned, 1);
        }
    }

    /// A rule's cost settled after the response (or, for a global rule, sent to the
    /// bridge to be), and why at that cost.
    pub fn committed(&self, rule: RuleId, reason: SettleReason) {
        let Some(rule) = self.rule(rule) else {
            return;
        };
        self.bump(rule.committed, 1);
        self.bump(rule.commit_reason(reason), 1);
    }

    /// The key's state took the settlement: the units given back or charged.
    pub fn commit_settled(&self, rule: RuleId, reserved: u64, actual: u64) {
        let Some(rule) = self.rule(rule) else {
            return;
        };
        let units = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        if actual < reserved {
            self.bump(rule.commit_units_refunded, units(reserved - actual));
        } else if actual > reserved {
            self.bump(rule.commit_units_charged, units(actual - reserved));
        }
    }

    /// An admitted request's clamps: each rule that reserved less than its estimate.
    pub fn clamped(&self, eval: &Evaluation) {
        for clamped in eval.clamped.iter().filter(|c| c.lowered) {
            if let Some(rule) = self.rule(clamped.rule) {
                self.bump(rule.commit_clamped, 1);
            }
        }
    }

    /// Settling failed (shared data, or the bridge): the estimate stands.
    pub fn commit_failed(&self, rule: RuleId) {
        if let Some(rule) = self.rule(rule) {
            self.bump(rule.commit_errors, 1);
        }
    }

    /// A concurrency rule's stream ended: its place is given back now (`ok`), or on
    /// the worker's next tick (shared data refused now).
    pub fn in_flight_released(&self, rule: RuleId, ok: bool) {
        if let Some(rule) = self.rule(rule) {
            self.bump(rule.in_flight_released, 1);
            if !ok {
                self.bump(rule.in_flight_release_errors, 1);
            }
        }
    }

    /// Units of a concurrency rule's places dropped because no live worker re-counted
    /// them for a whole epoch.
    pub fn in_flight_reclaimed(&self, rule: RuleId, units: u64) {
        if let Some(rule) = self.rule(rule) {
            self.bump(
                rule.in_flight_reclaimed,
                i64::try_from(units).unwrap_or(i64::MAX),
            );
        }
    }

    /// A change to a rule's units outstanding.
    pub fn outstanding(&self, rule: RuleId, units: i64) {
        if let Some(rule) = self.rule(rule) {
            self.bump(rule.outstanding_units, units);
        }
    }

    /// Counts the changes to units outstanding an evaluation made since its last step,
    /// and forgets them (see `Evaluation::drain_outstanding`).
    pub fn drain_outstanding<H: Host>(&self, host: &H, eval: &mut Evaluation) {
        eval.drain_outstanding(|rule, units| self.outstanding_sent(host, rule, units));
    }

    /// A change to a rule's units outstanding. A global rule's units are in shared data:
    /// another worker may spend them a moment later and send its decrement first, so
    /// what adds to them is sent at once, and the gauge Envoy keeps (unsigned) never goes
    /// below 0. A local rule's units (reservoirs, held requests) are spent by the worker
    /// that holds them, whose increments net out in its VM before they are sent. Either
    /// way the gauge reads at most what was spent in the last [`FLUSH_INTERVAL`] above
    /// the truth, never below it.
    fn outstanding_sent<H: Host>(&self, host: &H, rule: RuleId, units: i64) {
        let Some(metrics) = self.rules.get(rule.index()) else {
            return;
        };
        self.bump(metrics.stats.outstanding_units, units);
        if units > 0 && metrics.outstanding_shared {
            self.send_now(host, metrics.stats.outstanding_units);
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

    /// Units a worker's reservoirs held when it forgot every key (a new hashing seed, its
    /// plugin replaced): no longer outstanding, never admitted (`reservoir_units_evicted`).
    pub fn reservoirs_dropped(&self, rule: RuleId, units: u64) {
        let Some(rule) = self.rule(rule) else {
            return;
        };
        let units = i64::try_from(units).unwrap_or(i64::MAX);
        self.bump(rule.outstanding_units, -units);
        self.bump(rule.reservoir_units_evicted, units);
    }

    /// Units a sweep dropped unspent: no longer outstanding, and under-admission.
    pub fn expired(&self, expired: &Expired) {
        let Some(rule) = self.rule(expired.rule) else {
            return;
        };
        let units = i64::try_from(expired.units).unwrap_or(i64::MAX);
        self.bump(rule.outstanding_units, -units);
        let counter = if expired.lease {
            rule.lease_units_expired
        } else {
            rule.reservoir_units_expired
        };
        self.bump(counter, units);
    }

    /// An adaptive rule's controller as a worker merged it.
    pub fn adapted<H: Host>(&self, host: &H, adapted: &Adapted) {
        // A key's controller: a gauge holds one value, and a rule has a limit per key.
        if adapted.key.is_some() {
            return;
        }
        let Some(rule) = self.rule(adapted.rule) else {
            return;
        };
        self.set(host, rule.concurrency_limit, adapted.limit);
        if adapted.controller.last_sample_us > 0 {
            let controller = &adapted.controller;
            self.set(host, rule.latency_sample_us, controller.last_sample_us);
            self.set(host, rule.latency_baseline_us, controller.baseline_us);
        }
    }

    fn bridge_error(&self, error: &ReplyError) {
        let bridge = &self.plugin.bridge;
        let stat = match error {
            ReplyError::Timeout => bridge.errors_timeout,
            ReplyError::Unavailable
            | ReplyError::Unreachable
            | ReplyError::NoResponse
            | ReplyError::Refused => bridge.errors_unavailable,
            ReplyError::Status(..) => bridge.errors_status,
            ReplyError::BadBody(_) => bridge.errors_bad_body,
        };
        self.bump(stat, 1);
    }

    /// Counts one request's evaluation, finished at `now`.
    pub fn record<H: Host>(&self, host: &H, eval: &Evaluation, now: Micros) {
        match &eval.bridge_error {
            Some(BridgeError::Skipped) => self.bump(self.plugin.bridge.skipped, 1),
            Some(BridgeError::Reply(error)) => self.bridge_error(error),
            None => {}
        }
        // What the evaluation's steps have not drained (a request gone while waiting on
        // its own call, a denied held request).
        for (rule, units) in eval.outstanding_changes() {
            self.outstanding_sent(host, rule, units);
        }
        for report in &eval.reports {
            let Some(rule) = self.rule(report.rule) else {
                continue;
            };
            match report.outcome {
                RuleOutcome::NotMatched => continue,
                RuleOutcome::KeyMissing => self.bump(rule.key_missing, 1),
                RuleOutcome::Allowed => self.bump(rule.allowed, 1),
                RuleOutcome::Limited => self.bump(rule.limited, 1),
                RuleOutcome::ShadowLimited => self.bump(rule.shadow_limited, 1),
                RuleOutcome::StoreFailed(_) => {}
                RuleOutcome::BridgeFailed(FailureOutcome::Allowed) => {
                    self.bump(rule.failure_allowed, 1)
                }
                RuleOutcome::BridgeFailed(FailureOutcome::Denied) => {
                    self.bump(rule.failure_denied, 1)
                }
                RuleOutcome::BridgeFailed(FailureOutcome::Local { allowed }) => {
                    self.bump(rule.failure_local, 1);
                    self.bump(if allowed { rule.allowed } else { rule.limited }, 1);
                }
            }
            let store_error = match report.outcome {
                RuleOutcome::StoreFailed(error) => Some(error),
                _ => report.lease_store_error,
            };
            if let Some(error) = store_error {
                self.bump(rule.store_errors, 1);
                if let UpdateError::GaveUp { .. } = error {
                    self.bump(self.plugin.store.cas_give_ups, 1);
                }
            }
            match report.source {
                Some(Source::Lease) => self.bump(rule.lease_hits, 1),
                Some(Source::DenialCache) => self.bump(rule.denial_cache_hits, 1),
                Some(Source::Bridge) => self.bump(rule.bridge_decisions, 1),
                Some(Source::Reservoir) => self.bump(rule.reservoir_hits, 1),
                Some(Source::Slot | Source::Fallback | Source::Refused) | None => {}
            }
            let taken = report.reservoir_taken;
            let expired = report.reservoir_expired;
            if taken > 0 {
                self.bump(
                    rule.reservoir_units_taken,
                    i64::try_from(taken).unwrap_or(i64::MAX),
                );
            }
            if expired > 0 {
                self.bump(
                    rule.reservoir_units_expired,
                    i64::try_from(expired).unwrap_or(i64::MAX),
                );
            }
            for (units, stat) in [
                (report.lease_units_granted, rule.lease_units_granted),
                (report.lease_units_late, rule.lease_units_late),
                (report.lease_units_expired, rule.lease_units_expired),
            ] {
                if units > 0 {
                    self.bump(stat, i64::try_from(units).unwrap_or(i64::MAX));
                }
            }
            if let Some(lost) = report.reservoir_lost {
                self.bump(rule.reservoir_evictions, 1);
                self.bump(
                    rule.reservoir_units_evicted,
                    i64::try_from(lost).unwrap_or(i64::MAX),
                );
            }
            if report.delay_past_deadline {
                self.bump(rule.delay_past_deadline, 1);
            }
            if report.delay_queue_full {
                self.bump(rule.delay_queue_full, 1);
            }
            if report.key_without_controller {
                self.bump(rule.keys_without_controller, 1);
            }
            if report.in_flight_reclaimed > 0 {
                self.bump(
                    rule.in_flight_reclaimed,
                    i64::try_from(report.in_flight_reclaimed).unwrap_or(i64::MAX),
                );
            }
            if report.cas_retries > 0 {
                self.bump(self.plugin.store.cas_retries, i64::from(report.cas_retries));
            }
            match report.placement {
                Some(Placement::Empty) => self.bump(rule.slots_in_use, 1),
                Some(Placement::Takeover) => self.bump(self.plugin.store.slot_takeovers, 1),
                Some(Placement::Eviction) => self.bump(rule.slot_evictions, 1),
                Some(Placement::Existing) | None => {}
            }
        }
        self.flush_if_due(host, now);
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
