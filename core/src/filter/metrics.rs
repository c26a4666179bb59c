//! Envoy stats for every decision.
//!
//! Envoy shows them as `wasmcustom.weir.<plugin>.…` in `/stats` and without the
//! `wasmcustom.` prefix in `/stats/prometheus`; with the `stats_tags` weir ships
//! (envoy/envoy.yaml, docs/operations.md) the plugin and rule names become the labels
//! `weir_plugin` and `weir_rule`. `<plugin>` is Envoy's plugin name (characters other
//! than `A-Z a-z 0-9 _ -` become `_`), so two plugins sharing a VM count apart. Every
//! worker defines the same names, which Envoy maps to the same stats, so the counters
//! are process-wide.
//!
//! Per rule (`weir.<plugin>.rule.<name>.<counter>`): `allowed`, `limited`, `shadow_limited`,
//! `key_missing` (a key source had no value: the rule did not apply), `store_errors`
//! (shared data failed or the CAS gave up: the rule let the request through), and the
//! gauges `slots_in_use` and `slots_capacity` of its slot table. Global rules also
//! count `lease_hits` (served from a lease), `denial_cache_hits` (denied by a cached
//! denial, no bridge call), `bridge_decisions` (decided by Redis), and what their failure
//! mode did: `failure_allowed`, `failure_denied`, `failure_local`; with leases, what
//! became of the units Redis granted ahead: `lease_units_granted`, `lease_units_late`
//! (came back with no time left to spend) and `lease_units_expired` (dropped unspent).
//! Every rule has the gauges `outstanding_units` (units counted in the store and not
//! admitted yet: see `weir_core::engine` `outstanding.rs`) and `limit_units` (its limit
//! for one key, set once). For the store
//! (`weir.<plugin>.store.<counter>`): `cas_retries`, `cas_give_ups`, `slot_takeovers`,
//! `slot_evictions`. For the bridge (`weir.<plugin>.bridge.<counter>`): `calls`, `joined`
//! (a request waited on another request's call for its keys), `refused` (Envoy refused
//! the call at once while it still takes the plugin's calls, a full circuit breaker: the
//! request was denied 429, not given the failure mode), `resent` (a call Envoy could not
//! deliver, sent once more: see `ReplyError::worth_resending`), `skipped` (not called:
//! calls failed [`BRIDGE_FAILURES_TO_SKIP`](crate::engine::BRIDGE_FAILURES_TO_SKIP) times in a row
//! less than a second ago),
//! `errors_timeout`, `errors_unavailable` (a 503, or no response at all),
//! `errors_status`, `errors_bad_body`, and the histogram `latency_us`.
//!
//! Local rules with reservoirs also count, per worker's reservoirs: `reservoir_hits`
//! (served from units the worker took ahead), `reservoir_units_taken`,
//! `reservoir_units_expired` (held past their time, never admitted),
//! `reservoir_evictions` (a key took another key's entry in a full worker table) and
//! `reservoir_units_evicted` (units such an entry still held); a local key denied from a
//! worker's cached denial counts in `denial_cache_hits`. Rules with `on_limit.delay`
//! count `delayed` (requests held instead of denied), `delay_waited_us` (the time they
//! waited, summed: divided by `delayed`, the mean wait), `delay_late` (released after
//! their slot: decided again), `delay_queue_full` (denied because the worker held
//! `queue` requests of the rule already), `delay_past_deadline` (denied because the
//! request's own deadline came before its slot, or its release after that deadline) and
//! `delay_abandoned` (the client left while its request was held). Rules with a `commit` count `committed` (costs settled after
//! the response) and, by why they settled as they did (`weir_core::usage::settlement`):
//! `commit_usage_read` (the response's usage), `commit_on_error` (the upstream's own 5xx:
//! the rule's `on_error`), and, each keeping the estimate, `commit_no_usage` (a response
//! without a readable usage), `commit_over_max_bytes` (a body or event over `max_bytes`),
//! `commit_compressed` (a compressed body), `commit_aborted` (cut before its usage came),
//! `commit_local_reply` (a reply Envoy made itself, such as a route timeout's 504);
//! `commit_not_forwarded` (a later rule denied the request: nothing);
//! `commit_units_refunded`, `commit_units_charged`
//! (the actual cost above the estimate), `commit_errors` (shared data failed: the
//! estimate stands) and `commit_clamped` (`commit.clamp`: requests reserved less than
//! their estimate, their body's output lowered to fit). Concurrency rules count `in_flight_released` (streams ended, their
//! places given back at once or, when shared data refused, on the worker's next tick),
//! `in_flight_release_errors` (shared data refused a give-back at the stream's end: the
//! tick retries it) and `in_flight_reclaimed` (units of places no live worker re-counted
//! for a whole epoch, dropped: a VM that died with requests in flight); adaptive ones have the gauges `concurrency_limit`, `latency_sample_us`
//! (the last interval's latency quantile) and `latency_baseline_us` — with `per_key`,
//! whose limits are one per key, none of these but the counter `keys_without_controller`
//! (requests whose key had no controller of its own: decided against `max_in_flight`).
//! What crossed the boundary between the VM and Envoy, counted by every VM of the plugin
//! (with two plugins in one VM, each counts the VM's): `weir.<plugin>.vm.host_calls`
//! (every call into Envoy), `vm.calls.<kind>` by kind (`clock`, `header`, `body`,
//! `shared_get`, `shared_set`, `property`, `dispatch`, `stream`, `stats`, `log`, `tick`),
//! `vm.entries` (every callback Envoy made into the VM) and `vm.bytes_in` / `vm.bytes_out`
//! (bytes copied in and handed out). Divided by requests, they are what a request costs
//! in units no machine changes; the benchmark reports them.
//!
//! Counting a request costs no host call: increments are kept in the VM and sent every
//! [`FLUSH_INTERVAL`] — by the next request after that, or by the root context's tick
//! when the worker is idle — so stats lag traffic by at most about a tenth of a second.

use super::host::{BoundaryCounts, CallKind, Host, HostResult, MetricType};
use crate::engine::{
    Adapted, BridgeError, Delayed, Evaluation, Expired, FailureOutcome, RuleOutcome, Source,
};
use crate::rules::RuleId;
use crate::store::{Placement, UpdateError};
use crate::time::Micros;
use crate::usage::settlement::SettleReason;
use crate::wire::ReplyError;
use std::cell::Cell;

/// How often increments kept in the VM are sent to Envoy.
pub const FLUSH_INTERVAL: Micros = Micros::from_millis(100);

/// A counter or gauge: its index among the VM's pending increments.
#[derive(Debug, Clone, Copy)]
struct Stat(usize);

#[derive(Debug)]
struct RuleMetrics {
    allowed: Stat,
    limited: Stat,
    shadow_limited: Stat,
    key_missing: Stat,
    store_errors: Stat,
    slots_in_use: Stat,
    lease_hits: Stat,
    denial_cache_hits: Stat,
    bridge_decisions: Stat,
    failure_allowed: Stat,
    failure_denied: Stat,
    failure_local: Stat,
    reservoir_hits: Stat,
    reservoir_taken: Stat,
    reservoir_expired: Stat,
    reservoir_evictions: Stat,
    reservoir_lost: Stat,
    lease_units_granted: Stat,
    lease_units_late: Stat,
    lease_units_expired: Stat,
    delayed: Stat,
    delay_waited_us: Stat,
    delay_late: Stat,
    delay_queue_full: Stat,
    delay_past_deadline: Stat,
    delay_abandoned: Stat,
    committed: Stat,
    commit_reasons: CommitReasons,
    commit_units_refunded: Stat,
    commit_units_charged: Stat,
    commit_errors: Stat,
    commit_clamped: Stat,
    in_flight_released: Stat,
    in_flight_release_errors: Stat,
    in_flight_reclaimed: Stat,
    keys_without_controller: Stat,
    /// Gauge: units counted in the store and not admitted yet (`engine::outstanding`).
    outstanding_units: Stat,
    /// A global rule's: its outstanding units are in shared data, where other workers
    /// spend them (see [`Metrics::drain_outstanding`]).
    outstanding_shared: bool,
    /// Adaptive concurrency rules: the limit, the last interval's latency sample and
    /// the baseline, recorded when a worker merges.
    adaptive: Option<AdaptiveGauges>,
}

/// A rule's settlements, one counter per [`SettleReason`].
#[derive(Debug)]
struct CommitReasons {
    usage_read: Stat,
    on_error: Stat,
    no_usage: Stat,
    over_max_bytes: Stat,
    compressed: Stat,
    aborted: Stat,
    local_reply: Stat,
    not_forwarded: Stat,
}

impl CommitReasons {
    fn define<H: Host>(r: &mut Registry<'_, H>, prefix: &str) -> HostResult<CommitReasons> {
        let mut stat =
            |reason: SettleReason| r.counter(&format!("{prefix}.{}", reason.stat_name()));
        Ok(CommitReasons {
            usage_read: stat(SettleReason::Usage)?,
            on_error: stat(SettleReason::UpstreamError)?,
            no_usage: stat(SettleReason::NoUsage)?,
            over_max_bytes: stat(SettleReason::TooLarge)?,
            compressed: stat(SettleReason::Compressed)?,
            aborted: stat(SettleReason::Aborted)?,
            local_reply: stat(SettleReason::LocalReply)?,
            not_forwarded: stat(SettleReason::NotForwarded)?,
        })
    }

    fn of(&self, reason: SettleReason) -> Stat {
        match reason {
            SettleReason::Usage => self.usage_read,
            SettleReason::UpstreamError => self.on_error,
            SettleReason::NoUsage => self.no_usage,
            SettleReason::TooLarge => self.over_max_bytes,
            SettleReason::Compressed => self.compressed,
            SettleReason::Aborted => self.aborted,
            SettleReason::LocalReply => self.local_reply,
            SettleReason::NotForwarded => self.not_forwarded,
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct AdaptiveGauges {
    limit: u32,
    sample_us: u32,
    baseline_us: u32,
}

/// What [`Metrics::define`] needs to know of a rule.
pub struct RuleStats<'a> {
    pub name: &'a str,
    pub capacity: u64,
    /// Slots already in use (tables survive config reloads; an estimate for large ones).
    pub in_use: u64,
    /// An adaptive concurrency rule with one controller: its limit, latency sample and
    /// baseline as gauges.
    pub adaptive_gauges: bool,
    /// The rule's limit in units (`Engine::limit_units`), set once as a gauge.
    pub limit_units: u64,
    /// A global rule: its units outstanding are spent by every worker.
    pub global: bool,
}

#[derive(Debug)]
pub struct Metrics {
    /// Host metric id and the increment not yet sent, per stat.
    pending: Vec<(u32, Cell<i64>)>,
    last_flush: Cell<Micros>,
    rules: Vec<RuleMetrics>,
    cas_retries: Stat,
    cas_give_ups: Stat,
    slot_takeovers: Stat,
    slot_evictions: Stat,
    bridge_calls: Stat,
    bridge_joined: Stat,
    bridge_resent: Stat,
    bridge_refused: Stat,
    bridge_skipped: Stat,
    bridge_timeouts: Stat,
    bridge_unavailable: Stat,
    bridge_bad_status: Stat,
    bridge_bad_body: Stat,
    bridge_latency_us: u32,
    boundary: BoundaryStats,
    /// Bytes a request could not keep: the VM's `max_buffered_bytes` was full.
    buffer_full: Stat,
    /// [`Host::counts`] at the last flush.
    counted: Cell<BoundaryCounts>,
}

/// The `vm.*` counters of what crossed the VM's boundary.
#[derive(Debug)]
struct BoundaryStats {
    host_calls: Stat,
    calls: Vec<Stat>,
    entries: Stat,
    bytes_in: Stat,
    bytes_out: Stat,
}

impl BoundaryStats {
    fn define<H: Host>(r: &mut Registry<'_, H>, base: &str) -> HostResult<BoundaryStats> {
        let mut calls = Vec::with_capacity(CallKind::ALL.len());
        for kind in CallKind::ALL {
            calls.push(r.counter(&format!("{base}.vm.calls.{}", kind.stat_name()))?);
        }
        Ok(BoundaryStats {
            host_calls: r.counter(&format!("{base}.vm.host_calls"))?,
            calls,
            entries: r.counter(&format!("{base}.vm.entries"))?,
            bytes_in: r.counter(&format!("{base}.vm.bytes_in"))?,
            bytes_out: r.counter(&format!("{base}.vm.bytes_out"))?,
        })
    }
}

/// Defines host metrics and hands out their [`Stat`]s.
struct Registry<'h, H> {
    host: &'h H,
    pending: Vec<(u32, Cell<i64>)>,
}

impl<H: Host> Registry<'_, H> {
    fn define(&mut self, metric_type: MetricType, name: &str) -> HostResult<Stat> {
        let id = self.host.define_metric(metric_type, name)?;
        self.pending.push((id, Cell::new(0)));
        Ok(Stat(self.pending.len() - 1))
    }

    fn counter(&mut self, name: &str) -> HostResult<Stat> {
        self.define(MetricType::Counter, name)
    }
}

impl Metrics {
    /// Defines every metric of `plugin`, with `rules` in config order.
    pub fn define<H: Host>(
        host: &H,
        plugin: &str,
        rules_and_tables: &[RuleStats<'_>],
    ) -> HostResult<Metrics> {
        let mut r = Registry {
            host,
            pending: Vec::new(),
        };
        let mut rules = Vec::with_capacity(rules_and_tables.len());
        let base = format!("weir.{}", stat_segment(plugin));
        for rule in rules_and_tables {
            let (name, capacity, in_use) = (rule.name, rule.capacity, rule.in_use);
            let adaptive = if rule.adaptive_gauges {
                let gauge = |what: &str| {
                    host.define_metric(MetricType::Gauge, &format!("{base}.rule.{name}.{what}"))
                };
                Some(AdaptiveGauges {
                    limit: gauge("concurrency_limit")?,
                    sample_us: gauge("latency_sample_us")?,
                    baseline_us: gauge("latency_baseline_us")?,
                })
            } else {
                None
            };
            let prefix = format!("{base}.rule.{name}");
            let limit_id =
                host.define_metric(MetricType::Gauge, &format!("{prefix}.limit_units"))?;
            host.record_metric(limit_id, rule.limit_units)?;
            let slots_in_use = r.define(MetricType::Gauge, &format!("{prefix}.slots_in_use"))?;
            let capacity_id =
                host.define_metric(MetricType::Gauge, &format!("{prefix}.slots_capacity"))?;
            host.record_metric(capacity_id, capacity)?;
            if let Some((id, _)) = r.pending.get(slots_in_use.0) {
                host.record_metric(*id, in_use)?;
            }
            rules.push(RuleMetrics {
                allowed: r.counter(&format!("{prefix}.allowed"))?,
                limited: r.counter(&format!("{prefix}.limited"))?,
                shadow_limited: r.counter(&format!("{prefix}.shadow_limited"))?,
                key_missing: r.counter(&format!("{prefix}.key_missing"))?,
                store_errors: r.counter(&format!("{prefix}.store_errors"))?,
                slots_in_use,
                lease_hits: r.counter(&format!("{prefix}.lease_hits"))?,
                denial_cache_hits: r.counter(&format!("{prefix}.denial_cache_hits"))?,
                bridge_decisions: r.counter(&format!("{prefix}.bridge_decisions"))?,
                failure_allowed: r.counter(&format!("{prefix}.failure_allowed"))?,
                failure_denied: r.counter(&format!("{prefix}.failure_denied"))?,
                failure_local: r.counter(&format!("{prefix}.failure_local"))?,
                reservoir_hits: r.counter(&format!("{prefix}.reservoir_hits"))?,
                reservoir_taken: r.counter(&format!("{prefix}.reservoir_units_taken"))?,
                reservoir_expired: r.counter(&format!("{prefix}.reservoir_units_expired"))?,
                reservoir_evictions: r.counter(&format!("{prefix}.reservoir_evictions"))?,
                reservoir_lost: r.counter(&format!("{prefix}.reservoir_units_evicted"))?,
                lease_units_granted: r.counter(&format!("{prefix}.lease_units_granted"))?,
                lease_units_late: r.counter(&format!("{prefix}.lease_units_late"))?,
                lease_units_expired: r.counter(&format!("{prefix}.lease_units_expired"))?,
                delayed: r.counter(&format!("{prefix}.delayed"))?,
                delay_waited_us: r.counter(&format!("{prefix}.delay_waited_us"))?,
                delay_late: r.counter(&format!("{prefix}.delay_late"))?,
                delay_queue_full: r.counter(&format!("{prefix}.delay_queue_full"))?,
                delay_past_deadline: r.counter(&format!("{prefix}.delay_past_deadline"))?,
                delay_abandoned: r.counter(&format!("{prefix}.delay_abandoned"))?,
                committed: r.counter(&format!("{prefix}.committed"))?,
                commit_reasons: CommitReasons::define(&mut r, &prefix)?,
                commit_units_refunded: r.counter(&format!("{prefix}.commit_units_refunded"))?,
                commit_units_charged: r.counter(&format!("{prefix}.commit_units_charged"))?,
                commit_errors: r.counter(&format!("{prefix}.commit_errors"))?,
                commit_clamped: r.counter(&format!("{prefix}.commit_clamped"))?,
                in_flight_released: r.counter(&format!("{prefix}.in_flight_released"))?,
                in_flight_release_errors: r
                    .counter(&format!("{prefix}.in_flight_release_errors"))?,
                in_flight_reclaimed: r.counter(&format!("{prefix}.in_flight_reclaimed"))?,
                keys_without_controller: r.counter(&format!("{prefix}.keys_without_controller"))?,
                outstanding_units: r
                    .define(MetricType::Gauge, &format!("{prefix}.outstanding_units"))?,
                outstanding_shared: rule.global,
                adaptive,
            });
        }
        let cas_retries = r.counter(&format!("{base}.store.cas_retries"))?;
        let cas_give_ups = r.counter(&format!("{base}.store.cas_give_ups"))?;
        let slot_takeovers = r.counter(&format!("{base}.store.slot_takeovers"))?;
        let slot_evictions = r.counter(&format!("{base}.store.slot_evictions"))?;
        let bridge_calls = r.counter(&format!("{base}.bridge.calls"))?;
        let bridge_joined = r.counter(&format!("{base}.bridge.joined"))?;
        let bridge_resent = r.counter(&format!("{base}.bridge.resent"))?;
        let bridge_refused = r.counter(&format!("{base}.bridge.refused"))?;
        let bridge_skipped = r.counter(&format!("{base}.bridge.skipped"))?;
        let bridge_timeouts = r.counter(&format!("{base}.bridge.errors_timeout"))?;
        let bridge_unavailable = r.counter(&format!("{base}.bridge.errors_unavailable"))?;
        let bridge_bad_status = r.counter(&format!("{base}.bridge.errors_status"))?;
        let bridge_bad_body = r.counter(&format!("{base}.bridge.errors_bad_body"))?;
        let bridge_latency_us =
            host.define_metric(MetricType::Histogram, &format!("{base}.bridge.latency_us"))?;
        let boundary = BoundaryStats::define(&mut r, &base)?;
        let buffer_full = r.counter(&format!("{base}.vm.buffer_full"))?;
        Ok(Metrics {
            pending: r.pending,
            last_flush: Cell::new(Micros::ZERO),
            rules,
            cas_retries,
            cas_give_ups,
            slot_takeovers,
            slot_evictions,
            bridge_calls,
            bridge_joined,
            bridge_resent,
            bridge_refused,
            bridge_skipped,
            bridge_timeouts,
            bridge_unavailable,
            bridge_bad_status,
            bridge_bad_body,
            bridge_latency_us,
            boundary,
            buffer_full,
            counted: Cell::new(host.counts()),
        })
    }

    fn bump(&self, stat: Stat, by: i64) {
        if let Some((_, delta)) = self.pending.get(stat.0) {
            delta.set(delta.get().saturating_add(by));
        }
    }

    /// Sends the increments kept since the last flush.
    pub fn flush<H: Host>(&self, host: &H, now: Micros) {
        self.last_flush.set(now);
        let now_counted = host.counts();
        let before = self.counted.replace(now_counted);
        let delta = |now: u64, then: u64| i64::try_from(now.wrapping_sub(then)).unwrap_or(i64::MAX);
        let b = &self.boundary;
        self.bump(
            b.host_calls,
            delta(now_counted.total_calls(), before.total_calls()),
        );
        for ((stat, now), then) in b.calls.iter().zip(now_counted.calls).zip(before.calls) {
            self.bump(*stat, delta(now, then));
        }
        self.bump(b.entries, delta(now_counted.entries, before.entries));
        self.bump(b.bytes_in, delta(now_counted.bytes_in, before.bytes_in));
        self.bump(b.bytes_out, delta(now_counted.bytes_out, before.bytes_out));
        for stat in 0..self.pending.len() {
            // A stat that cannot be incremented is not worth failing anything for.
            self.send_now(host, Stat(stat));
        }
    }

    fn flush_if_due<H: Host>(&self, host: &H, now: Micros) {
        if now.saturating_sub(self.last_flush.get()) >= FLUSH_INTERVAL {
            self.flush(host, now);
        }
    }

    /// A body (or more of one) did not fit in the VM's `max_buffered_bytes`.
    pub fn buffer_full(&self) {
        self.bump(self.buffer_full, 1);
    }

    pub fn bridge_call(&self) {
        self.bump(self.bridge_calls, 1);
    }

    /// A request waited on another request's call.
    pub fn bridge_joined(&self) {
        self.bump(self.bridge_joined, 1);
    }

    /// Envoy refused a call at once (its circuit breaker, or a cluster without hosts):
    /// not counted in `calls`.
    pub fn bridge_refused(&self) {
        self.bump(self.bridge_refused, 1);
    }

    /// A call Envoy could not deliver was sent once more (also counted in `calls`).
    pub fn bridge_resent(&self) {
        self.bump(self.bridge_resent, 1);
    }

    pub fn bridge_latency<H: Host>(&self, host: &H, latency: Micros) {
        let _ = host.record_metric(self.bridge_latency_us, latency.us());
    }

    /// A rule held a request instead of denying it.
    pub fn delay_held(&self, rule: RuleId) {
        if let Some(rule) = self.rules.get(rule.index()) {
            self.bump(rule.delayed, 1);
        }
    }

    /// A held request was released (on time or late).
    pub fn delay_released(&self, delayed: &Delayed) {
        if let Some(rule) = self.rules.get(delayed.rule.index()) {
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
        if let Some(rule) = self.rules.get(rule.index()) {
            self.bump(rule.delay_abandoned, 1);
        }
    }

    /// A rule's cost settled after the response (or, for a global rule, sent to the
    /// bridge to be), and why at that cost.
    pub fn committed(&self, rule: RuleId, reason: SettleReason) {
        let Some(rule) = self.rules.get(rule.index()) else {
            return;
        };
        self.bump(rule.committed, 1);
        self.bump(rule.commit_reasons.of(reason), 1);
    }

    /// The key's state took the settlement: the units given back or charged.
    pub fn commit_settled(&self, rule: RuleId, reserved: u64, actual: u64) {
        let Some(rule) = self.rules.get(rule.index()) else {
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
            if let Some(rule) = self.rules.get(clamped.rule.index()) {
                self.bump(rule.commit_clamped, 1);
            }
        }
    }

    /// Settling failed (shared data, or the bridge): the estimate stands.
    pub fn commit_failed(&self, rule: RuleId) {
        if let Some(rule) = self.rules.get(rule.index()) {
            self.bump(rule.commit_errors, 1);
        }
    }

    /// A concurrency rule's stream ended: its place is given back now (`ok`), or on
    /// the worker's next tick (shared data refused now).
    pub fn in_flight_released(&self, rule: RuleId, ok: bool) {
        if let Some(rule) = self.rules.get(rule.index()) {
            self.bump(rule.in_flight_released, 1);
            if !ok {
                self.bump(rule.in_flight_release_errors, 1);
            }
        }
    }

    /// Units of a concurrency rule's places dropped because no live worker re-counted
    /// them for a whole epoch.
    pub fn in_flight_reclaimed(&self, rule: RuleId, units: u64) {
        if let Some(rule) = self.rules.get(rule.index()) {
            self.bump(
                rule.in_flight_reclaimed,
                i64::try_from(units).unwrap_or(i64::MAX),
            );
        }
    }

    /// A change to a rule's units outstanding.
    pub fn outstanding(&self, rule: RuleId, units: i64) {
        if let Some(rule) = self.rules.get(rule.index()) {
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
        self.bump(metrics.outstanding_units, units);
        if units > 0 && metrics.outstanding_shared {
            self.send_now(host, metrics.outstanding_units);
        }
    }

    /// Sends one stat's pending increment now.
    fn send_now<H: Host>(&self, host: &H, stat: Stat) {
        if let Some((id, delta)) = self.pending.get(stat.0) {
            let by = delta.replace(0);
            if by != 0 {
                let _ = host.increment_metric(*id, by);
            }
        }
    }

    /// Units a worker's reservoirs held when it forgot every key (a new hashing seed, its
    /// plugin replaced): no longer outstanding, never admitted (`reservoir_units_evicted`).
    pub fn reservoirs_dropped(&self, rule: RuleId, units: u64) {
        let Some(rule) = self.rules.get(rule.index()) else {
            return;
        };
        let units = i64::try_from(units).unwrap_or(i64::MAX);
        self.bump(rule.outstanding_units, -units);
        self.bump(rule.reservoir_lost, units);
    }

    /// Units a sweep dropped unspent: no longer outstanding, and under-admission.
    pub fn expired(&self, expired: &Expired) {
        let Some(rule) = self.rules.get(expired.rule.index()) else {
            return;
        };
        let units = i64::try_from(expired.units).unwrap_or(i64::MAX);
        self.bump(rule.outstanding_units, -units);
        let counter = if expired.lease {
            rule.lease_units_expired
        } else {
            rule.reservoir_expired
        };
        self.bump(counter, units);
    }

    /// An adaptive rule's controller as a worker merged it.
    pub fn adapted<H: Host>(&self, host: &H, adapted: &Adapted) {
        // A key's controller: a gauge holds one value, and a rule has a limit per key.
        if adapted.key.is_some() {
            return;
        }
        let Some(gauges) = self
            .rules
            .get(adapted.rule.index())
            .and_then(|r| r.adaptive)
        else {
            return;
        };
        let _ = host.record_metric(gauges.limit, adapted.limit);
        if adapted.controller.last_sample_us > 0 {
            let _ = host.record_metric(gauges.sample_us, adapted.controller.last_sample_us);
            let _ = host.record_metric(gauges.baseline_us, adapted.controller.baseline_us);
        }
    }

    fn bridge_error(&self, error: &ReplyError) {
        let stat = match error {
            ReplyError::Timeout => self.bridge_timeouts,
            ReplyError::Unavailable
            | ReplyError::Unreachable
            | ReplyError::NoResponse
            | ReplyError::Refused => self.bridge_unavailable,
            ReplyError::Status(..) => self.bridge_bad_status,
            ReplyError::BadBody(_) => self.bridge_bad_body,
        };
        self.bump(stat, 1);
    }

    /// Counts one request's evaluation, finished at `now`.
    pub fn record<H: Host>(&self, host: &H, eval: &Evaluation, now: Micros) {
        match &eval.bridge_error {
            Some(BridgeError::Skipped) => self.bump(self.bridge_skipped, 1),
            Some(BridgeError::Reply(error)) => self.bridge_error(error),
            None => {}
        }
        // What the evaluation's steps have not drained (a request gone while waiting on
        // its own call, a denied held request).
        for (rule, units) in eval.outstanding_changes() {
            self.outstanding_sent(host, rule, units);
        }
        for report in &eval.reports {
            let Some(rule) = self.rules.get(report.rule.index()) else {
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
                    self.bump(self.cas_give_ups, 1);
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
                    rule.reservoir_taken,
                    i64::try_from(taken).unwrap_or(i64::MAX),
                );
            }
            if expired > 0 {
                self.bump(
                    rule.reservoir_expired,
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
                self.bump(rule.reservoir_lost, i64::try_from(lost).unwrap_or(i64::MAX));
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
                self.bump(self.cas_retries, i64::from(report.cas_retries));
            }
            match report.placement {
                Some(Placement::Empty) => self.bump(rule.slots_in_use, 1),
                Some(Placement::Takeover) => self.bump(self.slot_takeovers, 1),
                Some(Placement::Eviction) => self.bump(self.slot_evictions, 1),
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
