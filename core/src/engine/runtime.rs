//! Each rule as the engine runs it — its scope's parameters with the tables it decides
//! in, built once per config — and the engine that holds them.

use std::sync::atomic::{AtomicU32, AtomicU64};

use crate::config::Config;
use crate::rules::{Rule, RuleId, Scope};
use crate::store::{SharedStore, StoreError};

use super::fair_share::ShareRuntime;
use super::global::GlobalRuntime;
use super::in_flight::ConcurrencyRuntime;
use super::local::LocalRuntime;

/// One rule's runtime: what its scope decides with, and the tables it owns.
#[derive(Debug)]
pub(super) enum RuleRuntime {
    /// Its slots in shared data (and the worker's reservoir and delay settings).
    Local(LocalRuntime),
    /// Its table of parents, each with the keys sharing its limit.
    Share(ShareRuntime),
    /// Its slots of requests in flight, and an adaptive rule's controllers.
    Concurrency(ConcurrencyRuntime),
    /// Its lease table, and the local share's slots with `failure_mode: local`.
    Global(GlobalRuntime),
}

impl RuleRuntime {
    /// The runtime of `rule`, its tables named after `owner`.
    fn new(rule: &Rule, owner: &str) -> Self {
        match (&rule.scope, &rule.share) {
            (Scope::Local(_), Some(share)) => {
                RuleRuntime::Share(ShareRuntime::new(rule, share, owner))
            }
            (Scope::Local(limit), None) => {
                RuleRuntime::Local(LocalRuntime::new(rule, limit, owner))
            }
            (Scope::Concurrency(limit), _) => {
                RuleRuntime::Concurrency(ConcurrencyRuntime::new(rule, limit, owner))
            }
            (Scope::Global(global), _) => {
                RuleRuntime::Global(GlobalRuntime::new(rule, global, owner))
            }
        }
    }

    /// Keys the table the rule counts them in holds at once: its slots, or its lease table.
    pub(super) fn capacity(&self) -> u64 {
        match self {
            RuleRuntime::Local(local) => local.slots.table.capacity(),
            RuleRuntime::Share(share) => share.table.capacity(),
            RuleRuntime::Concurrency(c) => c.slots().capacity(),
            RuleRuntime::Global(global) => global.leases().capacity(),
        }
    }

    /// See [`crate::store::slot_table::SlotTable::estimate_slots_in_use`], for the table whose keys the rule counts.
    pub(super) fn estimate_slots_in_use<S: SharedStore>(
        &self,
        store: &S,
        max_sets_read: u32,
    ) -> Result<u64, StoreError> {
        match self {
            RuleRuntime::Local(local) => local
                .slots
                .table
                .estimate_slots_in_use(store, max_sets_read),
            // A parent's sets are read whole; their count is small (`max_keys / 4`).
            RuleRuntime::Share(share) => share.table.parents_in_use(store),
            RuleRuntime::Concurrency(c) => c.slots().estimate_slots_in_use(store, max_sets_read),
            RuleRuntime::Global(global) => {
                global.leases().estimate_slots_in_use(store, max_sets_read)
            }
        }
    }

    /// Creates the rule's tables and records that do not exist yet; returns how many.
    pub(super) fn create_missing<S: SharedStore>(&self, store: &S) -> Result<u32, StoreError> {
        let created = match self {
            RuleRuntime::Local(local) => local.slots.table.create_missing(store)?,
            RuleRuntime::Share(share) => share.table.create_missing(store)?,
            RuleRuntime::Concurrency(c) => {
                c.create_missing(store)? + c.slots().create_missing(store)?
            }
            RuleRuntime::Global(global) => {
                let fallback = match global.fallback() {
                    Some(slots) => slots.table.create_missing(store)?,
                    None => 0,
                };
                global.leases().create_missing(store)? + fallback
            }
        };
        Ok(created)
    }
}

/// A compiled config with each rule's runtime.
#[derive(Debug)]
pub struct Engine {
    pub config: Config,
    /// One per rule of `config`, at its id's index: read through [`Engine::rule`].
    runtimes: Vec<RuleRuntime>,
    /// The shared-data key holding the instant (µs, little-endian) until which this
    /// plugin's bridge is left alone.
    pub(super) bridge_down_key: String,
    /// The shared-data key holding the instant (µs, little-endian) Envoy last took a
    /// call of this plugin's, from any worker: see [`Engine::calls_in_flight`].
    pub(super) bridge_called_key: String,
    /// When this worker last wrote [`Engine::bridge_called_key`] (µs).
    pub(super) bridge_called_written_us: AtomicU64,
    /// The bridge's round trip as this plugin's calls measured it (µs, see
    /// [`Engine::note_round_trip`]): what a leased call adds to its `ttl`.
    pub(super) round_trip_us: AtomicU64,
    /// The bridge backoff as this worker last read it from shared data: until when
    /// (µs), and when it read it (see [`Engine::bridge_down`]).
    pub(super) bridge_down_until_us: AtomicU64,
    pub(super) bridge_down_read_us: AtomicU64,
    /// This worker's calls that failed since its last answered one, and when the first
    /// of them failed (µs; see [`super::BRIDGE_FAILURES_TO_SKIP`]).
    pub(super) failed_in_a_row: AtomicU32,
    pub(super) failing_since_us: AtomicU64,
}

impl Engine {
    pub fn new(config: Config) -> Self {
        Self::with_namespace(config, "")
    }

    /// An engine whose tables and bridge backoff are prefixed by `namespace` (the filter
    /// uses Envoy's plugin name), so that two plugins sharing one Wasm VM's shared data —
    /// Istio gives every WasmPlugin the same `vm_id` — never share counters, even with
    /// equal rule names, nor skip each other's bridge.
    pub fn with_namespace(config: Config, namespace: &str) -> Self {
        let owner = |rule: &Rule| {
            if namespace.is_empty() {
                rule.name.clone()
            } else {
                format!("{namespace}/{}", rule.name)
            }
        };
        let runtimes = config
            .rules
            .iter()
            .map(|rule| RuleRuntime::new(rule, &owner(rule)))
            .collect();
        let cluster = config.bridge.as_ref().map_or("", |b| b.cluster.as_str());
        let bridge_key = |name: &str| {
            if namespace.is_empty() {
                format!("weir/v1/bridge/{cluster}/{name}")
            } else {
                format!("weir/v1/{namespace}/bridge/{cluster}/{name}")
            }
        };
        let bridge_down_key = bridge_key("down_until");
        let bridge_called_key = bridge_key("called_at");
        Engine {
            config,
            runtimes,
            bridge_down_key,
            bridge_called_key,
            bridge_called_written_us: AtomicU64::new(0),
            round_trip_us: AtomicU64::new(0),
            bridge_down_until_us: AtomicU64::new(0),
            bridge_down_read_us: AtomicU64::new(0),
            failed_in_a_row: AtomicU32::new(0),
            failing_since_us: AtomicU64::new(0),
        }
    }

    /// A rule of this config and its runtime.
    pub(super) fn rule(&self, id: RuleId) -> Option<(&Rule, &RuleRuntime)> {
        Some((self.config.rule(id)?, self.runtimes.get(id.index())?))
    }

    /// Every rule of this config with its runtime, in config order.
    pub(super) fn rules(&self) -> impl Iterator<Item = (&Rule, &RuleRuntime)> {
        self.config.rules.iter().zip(&self.runtimes)
    }
}
