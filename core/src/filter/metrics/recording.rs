//! What each event of the filter records: a request's decision, a bridge call and its
//! errors, a held request, a settled commit, an adaptive limit's change. The handles and
//! how increments reach Envoy are the module above's.

use super::Metrics;
use crate::engine::{
    Adapted, BridgeError, Delayed, Evaluation, Expired, FailureOutcome, RuleOutcome, Source,
};
use crate::filter::host::Host;
use crate::rules::RuleId;
use crate::store::{Placement, UpdateError};
use crate::time::{Micros, Span};
use crate::usage::settlement::SettleReason;
use crate::wire::ReplyError;

impl Metrics {
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

    /// Whether a bridge call's latency at `at` would be recorded: this worker recorded
    /// none in the last [`super::LATENCY_RECORD_EVERY`].
    pub fn bridge_latency_due(&self, at: Micros) -> bool {
        let last = self.last_latency.get();
        at < last || at.saturating_sub(last) >= super::LATENCY_RECORD_EVERY
    }

    /// A bridge call answered at `now` after `latency`: recorded unless this worker
    /// recorded one less than [`super::LATENCY_RECORD_EVERY`] ago.
    pub fn bridge_latency<H: Host>(&self, host: &H, latency: Span, now: Micros) {
        if !self.bridge_latency_due(now) {
            return;
        }
        self.last_latency.set(now);
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
            if report.limit_invalid {
                self.bump(rule.limit_invalid, 1);
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
            if let Some(share) = report.share {
                self.set(host, rule.share_keys, u64::from(share.keys));
                self.set(host, rule.share_units, share.share);
                if share.untracked {
                    self.bump(rule.share_untracked, 1);
                }
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
