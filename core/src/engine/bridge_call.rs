//! An evaluation's call to the bridge: the items it asks about, the reply that completes
//! it, the failure modes when there is none, sending a call Envoy could not deliver once
//! more, and the backoff that spares a failed bridge a call per request. Also the
//! `/v3/commit` call settling global rules' commits.

use std::sync::atomic::Ordering;

use crate::algorithms::Decision;
use crate::rules::RuleId;
use crate::store::SharedStore;
use crate::time::Micros;
use crate::wire::v2::{self, Sent};
use crate::wire::{v3, ReplyError};
use crate::worker::Worker;

use super::evaluation::{BridgeError, CommitKey, Evaluation, PendingCommit, PendingItem};
use super::report::{RuleReport, Source};
use super::runtime::{Engine, RuleRuntime};

/// How long a failed bridge is left alone before it is tried again.
pub const BRIDGE_BACKOFF_US: u64 = 1_000_000;
/// Calls of one worker that fail in a row, with no answered call between them, before
/// the bridge is left alone for [`BRIDGE_BACKOFF_US`] — if they span at least
/// [`BRIDGE_FAILING_FOR_US`]. A call Envoy could not deliver was sent twice before it
/// counts (see [`Engine::resend_timeout_ms`]), so this is evidence that no host of the
/// cluster answers, not that one replica restarts while another answers the calls
/// between.
pub const BRIDGE_FAILURES_TO_SKIP: u32 = 3;
/// How long calls must have been failing in a row before the bridge is skipped (µs).
/// The calls waiting on one connection fail together when it cannot be made: a replica
/// that just went away fails a batch of them at once, and Envoy's outlier detection
/// ejects it after a second connection fails, a few milliseconds later. A bridge that is
/// down everywhere keeps failing past this and is skipped a tenth of a second after its
/// first failure (its timeout after that, for a bridge that hangs).
pub const BRIDGE_FAILING_FOR_US: u64 = 100_000;
/// How often a worker reads the bridge backoff other workers wrote (µs).
pub const BRIDGE_DOWN_READ_US: u64 = 10_000;

impl Engine {
    /// The bridge item settling a global rule's commit with its actual cost (capped at
    /// what one item may carry); `None` for a local rule's.
    pub(crate) fn global_commit(
        &self,
        commit: &PendingCommit,
        actual: u64,
    ) -> Option<v3::CommitItem> {
        let CommitKey::Global {
            descriptor,
            share_key,
        } = &commit.key
        else {
            return None;
        };
        let (rule, RuleRuntime::Global(global)) = self.rule(commit.rule)? else {
            return None;
        };
        let key = (descriptor.as_slice(), share_key.as_ref());
        Some(global.commit_item(rule, key, commit, actual))
    }

    /// The body of a `/v3/commit` call.
    pub(crate) fn commit_request(&self, items: Vec<v3::CommitItem>) -> Vec<u8> {
        let domain = self
            .config
            .bridge
            .as_ref()
            .map_or("weir", |b| b.domain.as_str())
            .to_string();
        serde_json::to_vec(&v3::CommitRequest { domain, items }).unwrap_or_default()
    }

    /// Looks again at the rules still waiting for the bridge, at `now`: another call
    /// for the same keys (single flight) may have left units or a denial since. Each rule
    /// served that way is decided; the others stay pending, asking for what their
    /// Envoy's demand now says, and at least for the `waiting` requests (this one
    /// included) that waited on that call and have not looked again yet: the first of
    /// them to miss makes the call the others join.
    pub fn revisit<S: SharedStore>(
        &self,
        eval: &mut Evaluation,
        store: &S,
        now: Micros,
        waiting: u64,
    ) {
        let now_us = now.us();
        let pending = std::mem::take(&mut eval.pending);
        for mut item in pending {
            if eval.denied() {
                break;
            }
            let Some((rule, RuleRuntime::Global(global))) = self.rule(item.rule) else {
                continue;
            };
            let applied = item.applied(rule, now_us);
            // A waiting request's denial is written: it has no worker here.
            let asking = self.asking_for(now_us, waiting.max(1).saturating_mul(item.cost));
            // What its first look changed stays counted, with this look's report.
            let carried = item.lookup.outstanding_units;
            match global.spend_or_ask(eval, store, &applied, (None, None), asking) {
                Some(asked) => {
                    if item.clamp_prompt.is_none() {
                        item.want = asked.want;
                    }
                    item.reserve = asked.reserve;
                    item.last_known = asked.last_known;
                    item.lookup = asked.lookup;
                    item.lookup.outstanding_units += carried;
                    eval.pending.push(item);
                }
                None => eval.carried.push((item.rule, carried)),
            }
        }
        self.after_local_decisions(eval, store, now_us);
    }

    /// Once every rule has been looked at: a denied request asks nobody; otherwise the
    /// pending rules go to the bridge, unless it failed a moment ago.
    pub(super) fn after_local_decisions<S: SharedStore>(
        &self,
        eval: &mut Evaluation,
        store: &S,
        now_us: u64,
    ) {
        if eval.denied() {
            eval.pending.clear();
        } else if !eval.pending.is_empty() && self.bridge_down(store, now_us) {
            self.fail_pending(eval, store, now_us, BridgeError::Skipped);
        }
    }

    /// The body of the `POST /v2/acquire` call for `pending`: one item per pending rule,
    /// with the rule's id.
    pub fn bridge_request(&self, pending: &[PendingItem]) -> Vec<u8> {
        let domain = self
            .config
            .bridge
            .as_ref()
            .map_or("weir", |b| b.domain.as_str());
        let items: Vec<v2::Item> = pending
            .iter()
            .filter_map(|item| match self.rule(item.rule)? {
                (rule, RuleRuntime::Global(global)) => {
                    Some(global.wire_item(rule, item, self.round_trip_us()))
                }
                (
                    _,
                    RuleRuntime::Local(_) | RuleRuntime::Share(_) | RuleRuntime::Concurrency(_),
                ) => None,
            })
            .collect();
        let request = v2::Request {
            domain: domain.to_string(),
            items,
        };
        serde_json::to_vec(&request).unwrap_or_default()
    }

    /// What a reply to `pending` is checked against (see [`v2::decode_reply`]).
    pub fn sent(&self, pending: &[PendingItem]) -> Vec<Sent> {
        pending
            .iter()
            .map(|item| Sent {
                id: item.rule.0,
                shadow: self.config.rule(item.rule).is_some_and(|r| r.shadow),
            })
            .collect()
    }

    /// Whether landing `reply` for `eval` needs the instant the answer came back: the
    /// round trip that sizes leased calls' holds, a grant anchored on it, a denial or
    /// what Redis said recorded, a failure's timing. Only an exact grant of what each
    /// request costs, for rules that record nothing of it, needs none of these: the
    /// filter then reads no clock for it ([`Engine::complete_unclocked`]).
    pub fn answer_needs_instant(
        &self,
        eval: &Evaluation,
        reply: &Result<v2::Reply, ReplyError>,
    ) -> bool {
        let Ok(reply) = reply else {
            return true;
        };
        eval.pending.is_empty()
            || eval.pending.iter().any(|item| {
                let Some((rule, RuleRuntime::Global(global))) = self.rule(item.rule) else {
                    return true;
                };
                let result = reply.items.iter().find(|r| r.id == item.rule.0);
                global.needs_instant(rule, item, result)
            })
    }

    /// Gives `worker` what Redis had left of the exact keys it answered for `eval` (see
    /// [`crate::worker::LastAnswers`]): the worker that made the call, after
    /// [`Engine::complete`].
    pub fn remember_answers(&self, worker: &mut Worker, eval: &Evaluation) {
        for (rule, hash, remaining) in &eval.answered {
            worker.last_answers.note(*rule, hash, *remaining);
        }
    }

    /// [`Engine::complete`] for an answer that needs no instant
    /// ([`Engine::answer_needs_instant`]): decided as at `sent_at`, and no round trip
    /// measured.
    pub fn complete_unclocked<S: SharedStore>(
        &self,
        eval: &mut Evaluation,
        store: &S,
        sent_at: Micros,
        reply: Result<v2::Reply, ReplyError>,
    ) {
        self.land(eval, store, (sent_at, None), reply);
    }

    /// Finishes an evaluation with the bridge's reply (or its failure), at `now`. The
    /// call left at `sent_at`: Redis decided between the two, and what it granted is
    /// anchored on both ([`crate::lease::Held::from_reply`]).
    pub fn complete<S: SharedStore>(
        &self,
        eval: &mut Evaluation,
        store: &S,
        sent_at: Micros,
        now: Micros,
        reply: Result<v2::Reply, ReplyError>,
    ) {
        self.land(eval, store, (sent_at, Some(now)), reply);
    }

    /// The reply landed at `now` (`None`: not read, see
    /// [`Engine::complete_unclocked`]).
    fn land<S: SharedStore>(
        &self,
        eval: &mut Evaluation,
        store: &S,
        (sent_at, now): (Micros, Option<Micros>),
        reply: Result<v2::Reply, ReplyError>,
    ) {
        let sent_at_us = sent_at.us();
        let now_us = now.map_or(sent_at_us, |n| n.us());
        let reply = match reply {
            Ok(reply) => reply,
            // Envoy took calls of this plugin a moment ago, so the bridge cluster has
            // hosts: it refused this one for its circuit breaker, full of calls in
            // flight. A crowd of requests can fill it; only the bridge may take a rule
            // into its failure mode, so the request is denied until the calls in flight
            // are answered.
            Err(ReplyError::Refused) if self.calls_in_flight(store, now_us) => {
                self.deny_refused(eval, store, now_us);
                return;
            }
            Err(error) => {
                if self.failed_again(now_us) {
                    self.note_bridge_down(store, now_us.saturating_add(BRIDGE_BACKOFF_US));
                }
                self.fail_pending(eval, store, now_us, BridgeError::Reply(error));
                return;
            }
        };
        self.failed_in_a_row.store(0, Ordering::Relaxed);
        if now.is_some() {
            self.note_round_trip(now_us.saturating_sub(sent_at_us));
        }
        let mut pending = std::mem::take(&mut eval.pending);
        // Each result names its item by rule id; items after the bridge stopped were not
        // decided, and are not charged.
        for result in &reply.items {
            let Some(item) = pending.iter_mut().find(|item| item.rule.0 == result.id) else {
                continue;
            };
            self.record_reply(eval, store, item, result, (sent_at_us, now_us));
            item.asking_until_us = 0;
        }
        self.stop_asking(&mut pending, store, now_us);
    }

    /// Counts a call of this worker that failed at `now_us`; whether calls have now
    /// failed enough, and long enough, in a row to skip the bridge
    /// ([`BRIDGE_FAILURES_TO_SKIP`], [`BRIDGE_FAILING_FOR_US`]).
    fn failed_again(&self, now_us: u64) -> bool {
        let failed = self.failed_in_a_row.fetch_add(1, Ordering::Relaxed) + 1;
        if failed == 1 {
            self.failing_since_us.store(now_us, Ordering::Relaxed);
        }
        let since_us = self.failing_since_us.load(Ordering::Relaxed);
        failed >= BRIDGE_FAILURES_TO_SKIP
            && now_us.saturating_sub(since_us) >= BRIDGE_FAILING_FOR_US
    }

    /// Whether a call that left at `sent_at` and failed with `error` at `now` is sent
    /// once more, and with what timeout (ms): when Envoy could not deliver it (no healthy
    /// host, refused, reset before an answer), it was not `resent` already, and at least a
    /// millisecond of the bridge's timeout is left. The second call gets what is left, so
    /// a request never waits longer than the timeout for both.
    pub fn resend_timeout_ms(
        &self,
        error: &ReplyError,
        resent: bool,
        sent_at: Micros,
        now: Micros,
    ) -> Option<u64> {
        let bridge = self.config.bridge.as_ref()?;
        if resent || !error.worth_resending() {
            return None;
        }
        let spent_ms = now.saturating_sub(sent_at).us() / 1_000;
        Some(bridge.timeout_ms.saturating_sub(spent_ms)).filter(|&left| left > 0)
    }

    /// Records the bridge's answer for one pending rule in the rule's runtime.
    fn record_reply<S: SharedStore>(
        &self,
        eval: &mut Evaluation,
        store: &S,
        item: &PendingItem,
        result: &v2::Granted,
        (sent_at_us, now_us): (u64, u64),
    ) {
        let Some((rule, RuleRuntime::Global(global))) = self.rule(item.rule) else {
            return;
        };
        global.record_reply(eval, store, rule, item, result, (sent_at_us, now_us));
    }

    /// Counts one answered call's round trip into the plugin's estimate: a high quantile
    /// of recent round trips, since a hold that covers only the typical one loses the
    /// units of every slower call. A slower call raises it at once; faster ones lower it
    /// by a sixteenth of the difference each (about 11 calls to halve it), so one fast
    /// answer does not undo a slow bridge. At most the bridge's timeout: no answer is
    /// slower.
    pub fn note_round_trip(&self, sample_us: u64) {
        let cap_us = self
            .config
            .bridge
            .as_ref()
            .map_or(u64::MAX, |b| b.timeout_ms.saturating_mul(1_000));
        // At least 1 µs: 0 is the estimate of a plugin that has no answer yet.
        let sample_us = sample_us.min(cap_us).max(1);
        let _ = self
            .round_trip_us
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |estimate| {
                Some(if sample_us >= estimate {
                    sample_us
                } else {
                    estimate - (estimate - sample_us).div_ceil(16)
                })
            });
    }

    /// What a global rule's ask is sized by besides its demand rate, with `waiting` units
    /// of requests queued on its key.
    pub(super) fn asking_for(&self, now_us: u64, waiting: u64) -> super::asking::AskingFor {
        super::asking::AskingFor {
            now_us,
            round_trip_us: self.round_trip_us(),
            waiting,
        }
    }

    /// The bridge's round trip as this plugin measured it, µs (0 before its first answer,
    /// and only then).
    pub fn round_trip_us(&self) -> u64 {
        self.round_trip_us.load(Ordering::Relaxed)
    }

    /// Envoy took a call of this plugin at `now_us` (an acquire, its second send, a
    /// commit): the cluster had a host. Written to shared data for every worker (at most
    /// every [`BRIDGE_DOWN_READ_US`] per worker), where [`Engine::calls_in_flight`] reads
    /// it.
    pub(crate) fn note_call_made<S: SharedStore>(&self, store: &S, now_us: u64) {
        let written = self.bridge_called_written_us.load(Ordering::Relaxed);
        if written > 0 && now_us >= written && now_us - written < BRIDGE_DOWN_READ_US {
            return;
        }
        self.bridge_called_written_us
            .store(now_us, Ordering::Relaxed);
        // One unconditional write, no read first: racing workers each write an instant
        // of about now, and whichever lands says the same.
        let _ = store.create(&self.bridge_called_key, &now_us.to_le_bytes());
    }

    /// Whether calls of this plugin may be in flight: Envoy took one, from any worker of
    /// this Envoy, less than the bridge's timeout (and at least
    /// [`BRIDGE_FAILING_FOR_US`]) ago. A call Envoy refuses at once is refused for its
    /// circuit breaker, full of calls in flight, or because the cluster has no host.
    /// Only the first needs calls in flight, and a call is in flight no longer than the
    /// timeout: one taken within it says the cluster has a host. Read from shared data
    /// on each refusal only.
    fn calls_in_flight<S: SharedStore>(&self, store: &S, now_us: u64) -> bool {
        let timeout_us = self
            .config
            .bridge
            .as_ref()
            .map_or(0, |b| b.timeout_ms.saturating_mul(1_000));
        // A worker writes the instant at most every BRIDGE_DOWN_READ_US.
        let span_us = timeout_us
            .max(BRIDGE_FAILING_FOR_US)
            .saturating_add(BRIDGE_DOWN_READ_US);
        let made_us = read_instant(store, &self.bridge_called_key)
            .max(self.bridge_called_written_us.load(Ordering::Relaxed));
        made_us > 0 && now_us.saturating_sub(made_us) <= span_us
    }

    /// Denies the pending rules of a request whose call Envoy refused for its circuit
    /// breaker (see [`Engine::complete`]): each is limited, to be retried when a call
    /// sent now would have reached its timeout; a shadow rule only says it would have.
    fn deny_refused<S: SharedStore>(&self, eval: &mut Evaluation, store: &S, now_us: u64) {
        let retry_after_ns = self
            .config
            .bridge
            .as_ref()
            .map_or(0, |b| b.timeout_ms.saturating_mul(1_000_000))
            .max(1);
        let mut pending = std::mem::take(&mut eval.pending);
        self.stop_asking(&mut pending, store, now_us);
        for item in pending {
            let Some((rule, RuleRuntime::Global(global))) = self.rule(item.rule) else {
                continue;
            };
            let report = RuleReport {
                source: Some(Source::Refused),
                decided_at_us: now_us,
                ..item.lookup
            };
            let policy = item.limit.as_ref().unwrap_or(&global.global.limit).policy();
            let decision = Decision {
                allowed: false,
                limit: policy.quota,
                remaining: 0,
                retry_after_ns: Some(retry_after_ns),
                reset_after_ns: retry_after_ns,
            };
            eval.record(report, rule, decision);
            if eval.denied() {
                break;
            }
        }
    }

    /// Applies each pending rule's failure mode.
    fn fail_pending<S: SharedStore>(
        &self,
        eval: &mut Evaluation,
        store: &S,
        now_us: u64,
        error: BridgeError,
    ) {
        eval.bridge_error = Some(error);
        let mut pending = std::mem::take(&mut eval.pending);
        self.stop_asking(&mut pending, store, now_us);
        for item in pending {
            if eval.denied() {
                break;
            }
            let Some((rule, RuleRuntime::Global(global))) = self.rule(item.rule) else {
                continue;
            };
            global.fail(eval, store, rule, item, now_us);
        }
    }

    /// The call for `eval`'s pending rules has left at `now`: leased keys' demand counts
    /// are halved, and the slots of saturated keys deny their other requests until it
    /// lands, fails or times out (see `GlobalRuntime::asking`).
    pub fn note_call_sent<S: SharedStore>(&self, eval: &mut Evaluation, store: &S, now: Micros) {
        let Some(bridge) = &self.config.bridge else {
            return;
        };
        let now_us = now.us();
        let deadline_us = now_us.saturating_add(bridge.timeout_ms.saturating_mul(1_000));
        for item in &mut eval.pending {
            if let Some((_, RuleRuntime::Global(global))) = self.rule(item.rule) {
                global.asking(store, item, now_us, deadline_us);
            }
        }
    }

    /// Ends the denials the call about `pending` set in their slots, if still there.
    fn stop_asking<S: SharedStore>(&self, pending: &mut [PendingItem], store: &S, now_us: u64) {
        for item in pending {
            if let Some((_, RuleRuntime::Global(global))) = self.rule(item.rule) {
                global.stop_asking(store, item, now_us);
            }
        }
    }

    /// Whether calls for `rule` may be shared between requests (see `crate::flight`): a
    /// global rule with leases, whose answers serve whoever comes next.
    pub fn shares_calls(&self, rule: RuleId) -> bool {
        matches!(
            self.rule(rule),
            Some((_, RuleRuntime::Global(global))) if global.global.lease.is_some()
        )
    }

    /// Whether the bridge failed calls in a row (see [`BRIDGE_FAILURES_TO_SKIP`]) less
    /// than [`BRIDGE_BACKOFF_US`] ago, as this worker saw it or another worker wrote it in
    /// shared data. Shared data is read at most every
    /// [`BRIDGE_DOWN_READ_US`]: a busy worker's calls then cost no read each, and it
    /// learns of another worker's failure that much later (its own failures at once).
    fn bridge_down<S: SharedStore>(&self, store: &S, now_us: u64) -> bool {
        let read_us = self.bridge_down_read_us.load(Ordering::Relaxed);
        let fresh = read_us > 0 && now_us >= read_us && now_us - read_us < BRIDGE_DOWN_READ_US;
        if !fresh {
            let until = read_instant(store, &self.bridge_down_key);
            self.bridge_down_until_us.store(until, Ordering::Relaxed);
            self.bridge_down_read_us.store(now_us, Ordering::Relaxed);
        }
        now_us < self.bridge_down_until_us.load(Ordering::Relaxed)
    }

    /// Remembers that the bridge failed: calls are skipped until `until_us`. The calls
    /// after that count on from the failures before: the first to fail skips again, so a
    /// dead bridge is tried once per backoff. Racing
    /// writers each write a time about a second ahead; whichever lands is good enough.
    fn note_bridge_down<S: SharedStore>(&self, store: &S, until_us: u64) {
        self.bridge_down_until_us
            .fetch_max(until_us, Ordering::Relaxed);
        write_instant(store, &self.bridge_down_key, until_us);
    }
}

/// Writes an instant (µs, little-endian) to `key`. Racing writers each write an instant
/// of about the same moment; whichever lands is good enough, so a lost race is not
/// retried.
fn write_instant<S: SharedStore>(store: &S, key: &str, us: u64) {
    let value = us.to_le_bytes();
    let _ = match store.get(key) {
        Ok((_, Some(version))) => store.compare_and_set(key, &value, version),
        Ok((_, None)) => store.create(key, &value),
        Err(e) => Err(e),
    };
}

/// The instant [`write_instant`] wrote to `key`; 0 when none is there.
fn read_instant<S: SharedStore>(store: &S, key: &str) -> u64 {
    match store.get(key) {
        Ok((Some(value), _)) => <[u8; 8]>::try_from(value.as_slice()).map_or(0, u64::from_le_bytes),
        _ => 0,
    }
}
