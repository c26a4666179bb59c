//! Concurrency rules: requests in flight per key, counted in this Envoy's shared data
//! when admitted and given back when the stream ends; with `adaptive`, against the limit
//! a controller in shared data follows from the latencies the workers observe.

use crate::adaptive::{
    ControllerState, KeyedEntry, KeyedLatencies, SharedRecord, WorkerLatency, KEY_PROBES,
};
use crate::algorithms::SlotState;
use crate::concurrency::{place_epoch, KeyPlaces};
use crate::key::KeyHash;
use crate::rules::{Adaptive, Concurrency, Rule, RuleId};
use crate::store::slot_table::SlotTable;
use crate::store::{SharedStore, StoreError, UpdateError, Vacancy};
use crate::time::Micros;
use crate::worker::Worker;

use super::evaluation::{Applied, CommitKey, Evaluation, PendingCommit};
use super::report::{RuleOutcome, Source};

/// An adaptive concurrency rule's controller after a tick, for metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Adapted {
    pub rule: RuleId,
    pub controller: ControllerState,
    /// The limit this worker decides with now.
    pub limit: u64,
    /// With `per_key`: the fingerprint of the key whose controller this is.
    pub key: Option<u64>,
    /// The controller is in slow start and this worker's requests in flight reached its
    /// limit since its last merge: the worker should tick every
    /// [`LEARNING_TICK_MS`](crate::adaptive::LEARNING_TICK_MS).
    pub learning: bool,
}

/// What a worker's tick did to its places of concurrency rules, for metrics.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TendedPlaces {
    /// Units of ended requests given back on this tick (their give-back had failed).
    pub given_back: u64,
    /// Keys whose update failed again: tried on the next tick.
    pub failed: u64,
    /// Per rule, units of other places dropped (no live worker re-counted them).
    pub reclaimed: Vec<(RuleId, u64)>,
    /// More keys are due than one tick updates: tick again soon.
    pub more_due: bool,
}

/// A concurrency rule as the engine runs it: its limit, its slots, and with `adaptive`
/// the records of its controllers.
#[derive(Debug)]
pub(super) struct ConcurrencyRuntime {
    limit: Concurrency,
    slots: SlotTable,
    controllers: Option<Controllers>,
}

/// Where an adaptive rule's controllers live in shared data.
#[derive(Debug)]
struct Controllers {
    adaptive: Adaptive,
    /// The shared-data key of the rule's controller (with `per_key`: the prefix of its
    /// keys' records).
    base: String,
}

impl ConcurrencyRuntime {
    /// The rule's runtime, its slot table and records named after `owner`.
    pub(super) fn new(rule: &Rule, limit: &Concurrency, owner: &str) -> Self {
        ConcurrencyRuntime {
            limit: limit.clone(),
            slots: SlotTable::new(owner, "in-flight", rule.max_keys),
            controllers: limit.adaptive.map(|adaptive| Controllers {
                adaptive,
                base: format!("weir/v1/{owner}/adaptive"),
            }),
        }
    }

    pub(super) fn slots(&self) -> &SlotTable {
        &self.slots
    }

    /// Whether the rule is adaptive (its latencies are wanted).
    pub(super) fn is_adaptive(&self) -> bool {
        self.controllers.is_some()
    }

    /// Creates the records of the rule's controllers that do not exist yet; returns how
    /// many it created.
    pub(super) fn create_missing<S: SharedStore>(&self, store: &S) -> Result<u32, StoreError> {
        let Some(controllers) = &self.controllers else {
            return Ok(0);
        };
        let base = &controllers.base;
        let records: Vec<String> = match controllers.adaptive.key_controllers {
            Some(n) => (0..n).map(|i| key_record(base, i)).collect(),
            None => vec![base.clone()],
        };
        let mut created = 0;
        for key in records {
            if store.get(&key)?.1.is_none() {
                // Empty: the first merge (or a key's claim) starts the controller.
                store.create(&key, &[])?;
                created += 1;
            }
        }
        Ok(created)
    }

    /// The key's vacancy in the rule's slots at `now_us`.
    fn vacancy(now_us: u64) -> impl Fn(SlotState) -> Vacancy {
        move |state: SlotState| Vacancy {
            idle_at_us: Concurrency::idle_at_us(state),
            in_use: Concurrency::in_use(state, now_us),
        }
    }

    /// The key's count in flight against the rule's limit (the worker's adaptive limit
    /// of the moment, or `max_in_flight`). An admission is given back when the stream
    /// ends ([`PendingCommit`], given back by
    /// [`Engine::end_in_flight`](super::Engine::end_in_flight) on the worker that admitted
    /// it, which keeps its places in [`Worker::places`]).
    pub(super) fn decide<S: SharedStore>(
        &self,
        eval: &mut Evaluation,
        store: &S,
        applied: &Applied<'_>,
        worker: &mut Worker,
    ) {
        let limit = &self.limit;
        let mut report = applied.report();
        report.source = Some(Source::Slot);
        let now_limit = match (&self.controllers, worker.keyed(applied.rule.id)) {
            (Some(controllers), Some(keyed)) => {
                let found = KeyRecords {
                    store,
                    base: &controllers.base,
                    adaptive: &controllers.adaptive,
                    max_in_flight: limit.max_in_flight,
                }
                .entry(keyed, &applied.hash, applied.now_us);
                match found {
                    Some(entry) if entry.record.is_some() => entry.latency.limit,
                    _ => {
                        report.key_without_controller = true;
                        limit.max_in_flight
                    }
                }
            }
            _ => worker
                .latency(applied.rule.id)
                .map_or(limit.max_in_flight, |l| l.limit),
        };
        let now_us = applied.now_us;
        let id = (
            applied.rule.id.index(),
            applied.hash.set_hash,
            applied.hash.fingerprint,
        );
        let held = worker.places.get(id);
        let epoch = place_epoch(now_us);
        let updated = self.slots.update(
            store,
            &applied.hash,
            now_us,
            Self::vacancy(now_us),
            |state| limit.admit(state, held, epoch, now_limit, applied.cost),
        );
        report.add_update(&updated);
        match updated {
            Ok(updated) => {
                let admission = updated.result;
                let decision = admission.decision;
                report.in_flight_reclaimed = admission.dropped;
                if updated.placement.is_some() {
                    let admitted = if decision.allowed { applied.cost } else { 0 };
                    worker.places.set(id, held.wrote(admitted, admission.epoch));
                }
                let in_flight = decision.limit.saturating_sub(decision.remaining);
                if let Some(latency) = worker_latency(worker, applied.rule.id, &applied.hash) {
                    latency.peak_in_flight = latency.peak_in_flight.max(in_flight);
                }
                if decision.allowed && applied.cost > 0 {
                    eval.commits.push(PendingCommit {
                        rule: applied.rule.id,
                        key: CommitKey::Local(applied.hash),
                        reserved: applied.cost,
                        counted_at: Micros(applied.now_us),
                        limit: None,
                    });
                }
                eval.record(report, applied.rule, decision);
            }
            Err(error) => {
                report.outcome = RuleOutcome::StoreFailed(error);
                eval.reports.push(report);
            }
        }
    }

    /// Writes the worker's places of one key (ended ones given back, open ones re-counted
    /// in the current epoch); on success the worker's [`KeyPlaces`] say so. Returns whether
    /// the state was written and the units of other places dropped.
    pub(super) fn give_back<S: SharedStore>(
        &self,
        store: &S,
        worker: &mut Worker,
        id: (usize, u64, u64),
        now_us: u64,
    ) -> Result<(bool, u64), UpdateError> {
        let held = worker.places.get(id);
        let hash = KeyHash {
            set_hash: id.1,
            fingerprint: id.2,
        };
        let updated = self
            .slots
            .update(store, &hash, now_us, Self::vacancy(now_us), |state| {
                let (next, dropped) = self.limit.give_back(state, held, place_epoch(now_us));
                ((next.map(|s| s.b), dropped), next)
            })?;
        let (written, dropped) = updated.result;
        match written {
            Some(epoch) => worker.places.set(id, held.wrote(0, epoch)),
            // Nothing to write: the key lost its slot, or nothing was due.
            None if held.up_to_date_in(place_epoch(now_us)) => {}
            None => worker.places.set(id, KeyPlaces::default()),
        }
        Ok((written.is_some(), dropped))
    }

    /// The worker's tick for the rule, when adaptive: adds what it saw since its last
    /// merge into each controller's record (see [`Engine::adapt`](super::Engine::adapt)),
    /// and pushes each controller it merged into to `adapted`.
    pub(super) fn adapt<S: SharedStore>(
        &self,
        rule: RuleId,
        store: &S,
        worker: &mut Worker,
        now_us: u64,
        adapted: &mut Vec<Adapted>,
    ) {
        let Some(Controllers { adaptive, base }) = &self.controllers else {
            return;
        };
        let limit = &self.limit;
        if let Some(keyed) = worker.keyed(rule) {
            let records = KeyRecords {
                store,
                base,
                adaptive,
                max_in_flight: limit.max_in_flight,
            };
            // Keys not seen for a while are forgotten: their records go stale (a
            // while later) and can serve other keys.
            keyed.forget_idle(now_us.saturating_sub(adaptive.forget_after_us()));
            for (&(set_hash, fingerprint), entry) in keyed.entries.iter_mut() {
                let hash = KeyHash {
                    set_hash,
                    fingerprint,
                };
                let Some(index) = entry.record else {
                    // A key without a controller looks for one again.
                    if let Some((index, limit)) = records.find(&hash, now_us) {
                        entry.record = Some(index);
                        entry.latency.merged(limit);
                    }
                    continue;
                };
                let owner = fingerprint.max(1);
                let merged = merge_record(
                    store,
                    &key_record(base, index),
                    &entry.latency,
                    (adaptive, limit.max_in_flight),
                    Some(owner),
                    now_us,
                );
                match merged {
                    Merge::Done(controller, now_limit) => {
                        let reached = entry.latency.reached();
                        entry.latency.merged(now_limit);
                        adapted.push(Adapted {
                            rule,
                            controller,
                            limit: now_limit,
                            key: Some(owner),
                            learning: controller.slow_start && reached,
                        });
                    }
                    // Taken by another key while this one was idle: look again.
                    Merge::NotOwner => {
                        entry.record = None;
                        entry.latency.merged(limit.max_in_flight);
                    }
                    Merge::Failed => {}
                }
            }
            return;
        }
        let Some(latency) = worker.latency(rule) else {
            return;
        };
        let merged = merge_record(
            store,
            base,
            latency,
            (adaptive, limit.max_in_flight),
            None,
            now_us,
        );
        if let Merge::Done(controller, now_limit) = merged {
            let reached = latency.reached();
            latency.merged(now_limit);
            adapted.push(Adapted {
                rule,
                controller,
                limit: now_limit,
                key: None,
                learning: controller.slow_start && reached,
            });
        }
    }
}

/// What merging a worker's latencies into a controller's record came to.
enum Merge {
    /// The controller after the merge, and the limit to decide with.
    Done(ControllerState, u64),
    /// With `per_key`: the record belongs to another key now.
    NotOwner,
    /// Shared data failed, or CAS lost every race: the samples wait for the next tick.
    Failed,
}

/// Adds `latency` into the record at `key` with CAS (see [`SharedRecord::merge`]); with
/// `owner`, only while the record is that key's.
fn merge_record<S: SharedStore>(
    store: &S,
    key: &str,
    latency: &WorkerLatency,
    (adaptive, max_in_flight): (&Adaptive, u64),
    owner: Option<u64>,
    now_us: u64,
) -> Merge {
    for _ in 0..crate::store::MAX_CAS_ATTEMPTS {
        let Ok((value, Some(version))) = store.get(key) else {
            return Merge::Failed;
        };
        let current = value.as_deref().and_then(SharedRecord::decode);
        if owner.is_some() && current.as_ref().map(|r| r.owner) != owner {
            return Merge::NotOwner;
        }
        let record = SharedRecord::merge(current, latency, adaptive, max_in_flight, now_us);
        match store.compare_and_set(key, &record.encode(), version) {
            Ok(()) => {
                let now_limit = record
                    .controller
                    .limit()
                    .clamp(adaptive.min_limit, max_in_flight);
                return Merge::Done(record.controller, now_limit);
            }
            Err(StoreError::CasMismatch) => continue,
            Err(_) => return Merge::Failed,
        }
    }
    Merge::Failed
}

/// The latencies a worker gathers for `rule` — for the key `hash` with `per_key`.
pub(super) fn worker_latency<'w>(
    worker: &'w mut Worker,
    rule: RuleId,
    hash: &KeyHash,
) -> Option<&'w mut WorkerLatency> {
    if worker.keyed(rule).is_some() {
        return worker
            .keyed(rule)?
            .entries
            .get_mut(&(hash.set_hash, hash.fingerprint))
            .map(|e| &mut e.latency);
    }
    worker.latency(rule)
}

/// The shared-data key of record `index` of a `per_key` rule whose records start with
/// `base`.
fn key_record(base: &str, index: u32) -> String {
    format!("{base}/{index}")
}

/// The records of a `per_key` rule's controllers in shared data.
struct KeyRecords<'a, S> {
    store: &'a S,
    base: &'a str,
    adaptive: &'a Adaptive,
    /// The rule's ceiling now: a record's limit from before a reload that lowered it
    /// is clamped to it.
    max_in_flight: u64,
}

impl<S: SharedStore> KeyRecords<'_, S> {
    /// The worker's entry for the key `hash`, made the first time the worker sees the key
    /// (finding or claiming its controller's record); `None` when the worker's table is
    /// full of keys with samples waiting.
    fn entry<'k>(
        &self,
        keyed: &'k mut KeyedLatencies,
        hash: &KeyHash,
        now_us: u64,
    ) -> Option<&'k mut KeyedEntry> {
        let id = (hash.set_hash, hash.fingerprint);
        if !keyed.entries.contains_key(&id) {
            if !keyed.make_room() {
                return None;
            }
            let mut latency = WorkerLatency::new(self.adaptive);
            let record = self.find(hash, now_us).map(|(index, limit)| {
                latency.limit = limit;
                index
            });
            keyed.entries.insert(
                id,
                KeyedEntry {
                    latency,
                    record,
                    last_seen_us: now_us,
                },
            );
        }
        let entry = keyed.entries.get_mut(&id)?;
        entry.last_seen_us = now_us;
        Some(entry)
    }

    /// The record holding the key's controller and its limit: the key's own among the
    /// [`KEY_PROBES`] records from the one its hash names, else the first of them that is
    /// free, claimed with a fresh controller. `None` when all belong to active keys. A
    /// claim lost to another worker is looked for again: that worker may have claimed
    /// the record for this very key (two workers' first requests of a key at once).
    fn find(&self, hash: &KeyHash, now_us: u64) -> Option<(u32, u64)> {
        match self.find_once(hash, now_us) {
            Err(ClaimLost) => self.find_once(hash, now_us).ok().flatten(),
            Ok(found) => found,
        }
    }

    /// One look at the key's records; `Err` when its claim of a free one lost its CAS.
    fn find_once(&self, hash: &KeyHash, now_us: u64) -> Result<Option<(u32, u64)>, ClaimLost> {
        let Some(records) = self.adaptive.key_controllers else {
            return Ok(None);
        };
        let owner = hash.fingerprint.max(1);
        let first = hash.set_hash % u64::from(records);
        let mut free = None;
        for probe in 0..u64::from(KEY_PROBES.min(records)) {
            let Ok(index) = u32::try_from((first + probe) % u64::from(records)) else {
                return Ok(None);
            };
            let Ok((value, Some(version))) = self.store.get(&key_record(self.base, index)) else {
                continue;
            };
            match value.as_deref().and_then(SharedRecord::decode) {
                Some(r) if r.owner == owner => {
                    let limit = r
                        .controller
                        .limit()
                        .clamp(self.adaptive.min_limit, self.max_in_flight);
                    return Ok(Some((index, limit)));
                }
                Some(r) if !r.free_for(owner, self.adaptive, now_us) => {}
                _ => {
                    free = free.or(Some((index, version)));
                }
            }
        }
        let Some((index, version)) = free else {
            return Ok(None);
        };
        let claimed = SharedRecord::claimed(owner, self.adaptive, now_us);
        match self
            .store
            .compare_and_set(&key_record(self.base, index), &claimed.encode(), version)
        {
            Ok(_) => Ok(Some((index, claimed.controller.limit()))),
            Err(_) => Err(ClaimLost),
        }
    }
}

/// A claim of a free controller record lost its compare-and-swap to another worker.
struct ClaimLost;
